"""What the node machine (`floering.node.core.machine`) takes in and gives out: frozen values.

Events say what happened to a node (a message arrived, a timer fired, a call it made
finished); effects say what the node does about it (send, probe, hand off, record).
The asyncio runtime turns I/O into events and effects into I/O; the simulation does
the same over its in-memory network, so both run one protocol.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from floering.node.core.detector import Probe
from floering.node.core.node_core import Shipment
from floering.wire.ring import Ring

# ------------------------------------------------------------------- events


@dataclass(frozen=True)
class RingSeen:
    """A ring view from anywhere (a peer's exchange, an answer, a refusal). `pulled`:
    the answer of a member we called at its address (only such views may remove us).
    `sender`: the member that pushed it (its certificate's name) or that we called;
    a pulled view without one is our own start-up decision."""

    ring: Ring
    pulled: bool = False
    sender: str = ""


@dataclass(frozen=True)
class HeardFrom:
    """A message or an answer from `node` carrying its ring stamp and incarnation
    (0: the message does not say). `address` is where to reach it, if known."""

    node: str
    ring_stamp: int
    incarnation: int = 0
    address: str | None = None


@dataclass(frozen=True)
class SignOfLife:
    """Something from `node` that carries no ring stamp."""

    node: str


@dataclass(frozen=True)
class HeartbeatFailed:
    """A heartbeat to `address` ended with `failure` (a node.core.calls.Failure)."""

    address: str
    failure: str


@dataclass(frozen=True)
class HeartbeatDue:
    pass


@dataclass(frozen=True)
class MonitorDue:
    scheduled: float         # when the monitor meant to wake (its lag makes it lenient)


@dataclass(frozen=True)
class ProbeFinished:
    """One probe round ended. `direct` is how the suspect's address answered (ALIVE,
    REFUSED or TIMED_OUT) and with which incarnation; `indirect` what each member
    asked said, in the order of StartProbe.vias (ALIVE, TIMED_OUT: it cannot reach
    the suspect either, UNASKED: no answer from it). `epoch` is the machine's when the
    round began: a round begun before this process rejoined under a new name is
    discarded. `member`: the member the process at the address answered as (empty:
    not known, or it answered with an error)."""

    probe: Probe
    direct: str
    indirect: tuple[str, ...]
    epoch: int
    incarnation: int = 0
    failure: str = ""
    member: str = ""


@dataclass(frozen=True)
class ProbeAnswered:
    """One probe round ended, as the calls did (node.core.calls): `direct` how the call
    to the suspect's address failed (None: it answered, as member `member` with
    `incarnation`; `why`: the error's text), `vias` per member of StartProbe.vias how
    the call asking it failed and, if it answered, whether it reached the suspect. The
    machine judges what that means (a ProbeFinished)."""

    probe: Probe
    direct: str | None
    vias: tuple[tuple[str | None, bool], ...]
    epoch: int
    incarnation: int = 0
    why: str = ""
    member: str = ""


@dataclass(frozen=True)
class ProbedFor:
    """A peer asked us whether we reach `node` (an indirect probe): we did not."""

    node: str


@dataclass(frozen=True)
class ProbeAbandoned:
    probe: Probe


@dataclass(frozen=True)
class CheckpointDue:
    pass


@dataclass(frozen=True)
class CheckpointAcked:
    token: int
    replica: str
    seq: int
    need_full: bool
    epoch: int


@dataclass(frozen=True)
class CheckpointFailed:
    token: int
    replica: str
    refresh: bool
    epoch: int
    why: str = ""


@dataclass(frozen=True)
class CheckpointRoundDone:
    """Every shipment of a round was answered or timed out."""

    tokens: tuple[int, ...]
    behind_before: bool      # some range lacked a replica when the round began
    epoch: int


@dataclass(frozen=True)
class RoundEnded:
    """A checkpoint round, begun at `started`, is over (answered, failed or timed out):
    the machine says when the next one starts (`NextRound`)."""

    started: float


@dataclass(frozen=True)
class MapperAhead:
    """A batch was refused as stale: its sender may know a newer ring than ours."""

    ring_stamp: int


@dataclass(frozen=True)
class BatchApplied:
    token: int


@dataclass(frozen=True)
class ShedMoved:
    """A shedding round's handoff ended: the load's cool-down counts from now."""


@dataclass(frozen=True)
class LoadSampled:
    queued: int              # batches received, not applied yet
    busy_seconds: float      # the applier's busy time so far
    cpu_seconds: float       # the process's CPU time so far (reported only)


@dataclass(frozen=True)
class FoldAnswered:
    """A fold sent (`SendFolds`) was taken by every destination (`ok`), or not."""

    out_key: bytes
    seq: int
    ok: bool
    epoch: int


@dataclass(frozen=True)
class HandoffRequested:
    """Hand `moves` away within `timeout` seconds of its start (0: the default), now or
    once the running handoff ended. `request`: the executor's id for whoever waits for
    it, told in the `HandoffEnded` (0: nobody waits). `still_ours`: the node's own
    round asks (shed, leave, share pull): when its turn comes, the tokens no longer ours
    are left out (handoff_driver.Request)."""

    moves: dict = field(hash=False)    # token -> target
    timeout: float
    request: int = 0
    still_ours: bool = False


@dataclass(frozen=True)
class HandoffAbandoned:
    """Whoever waited for handoff `request` went away (cancelled): drop it, or end it if
    it runs. `request` 0: the running one, whoever asked."""

    reason: str
    request: int = 0


@dataclass(frozen=True)
class SplitRequested:
    position: int


@dataclass(frozen=True)
class LeaveRing:
    """This node's ranges are handed away: remove it from the ring for good."""


@dataclass(frozen=True)
class Requested:
    """A caller asks the node something (a kind of node.core.requests, with its
    fields): answered by one `Reply` carrying `request_id`."""

    kind: str
    fields: dict = field(default_factory=dict, hash=False)
    request_id: int = 0


# ------------------------------------------------------------------ effects


@dataclass(frozen=True)
class Record:
    """A structured event `kind` about member `node` with `fields`, and a line for the
    human log. `text` may hold `{t}`: the wall time the event is recorded at.
    `stimulus` names the event that caused it (`<member>:<n>:<event type>`): every
    record one stimulus caused carries the same."""

    kind: str
    node: str
    fields: tuple = ()
    level: int = logging.INFO
    text: str = ""
    stimulus: str = ""


@dataclass(frozen=True)
class Reply:
    """The answer to `Requested` `request_id`: its value, or the FloeError refusing it."""

    request_id: int
    value: object = None
    error: Exception | None = None


@dataclass(frozen=True)
class Note:
    """A line for the human log only."""

    text: str
    level: int = logging.INFO


@dataclass(frozen=True)
class Gossip:
    """Exchange ring views with the peer at `address`, or with every peer (None)."""

    address: str | None = None


@dataclass(frozen=True)
class SendHeartbeat:
    node: str
    address: str
    ring_stamp: int


@dataclass(frozen=True)
class StartProbe:
    """Probe `probe.node` at `address` directly and through each of `vias` (at
    `via_addresses`) at once; report a ProbeFinished carrying `epoch` once every
    answer is in or timed out."""

    probe: Probe
    address: str
    vias: tuple[str, ...]
    via_addresses: tuple[str, ...]
    ring_stamp: int
    epoch: int


@dataclass(frozen=True)
class ShipCheckpoints:
    """Ship every shipment (to `addresses[i]`) concurrently, report each answer, then
    a CheckpointRoundDone with `tokens`, `behind_before` and `epoch`."""

    shipments: tuple[Shipment, ...]
    addresses: tuple[str, ...]
    ring_stamp: int
    tokens: tuple[int, ...]
    behind_before: bool
    epoch: int


@dataclass(frozen=True)
class SendFolds:
    """Push each fold (`node.core.folding.FoldSend`) as a one-tuple batch for the range
    of `tokens[i]` to every address of `addresses[i]`; report each as a FoldAnswered."""

    folds: tuple
    tokens: tuple[int, ...]
    addresses: tuple[tuple[str, ...], ...]
    ring_stamp: int
    epoch: int


@dataclass(frozen=True)
class HandoffEnded:
    """The handoff of `request` is over: committed or aborted (see its state), or
    `refused` as it was to start (its waiter hears InvalidArgument with the reason)."""

    handoff: object
    request: int = 0
    refused: bool = False


@dataclass(frozen=True)
class RoundNow:
    """Start a checkpoint round now unless one is under way (a handoff started)."""


@dataclass(frozen=True)
class NextRound:
    """Start the next checkpoint round `after` seconds from now."""

    after: float


@dataclass(frozen=True)
class Split:
    """The range of `token` was cut at `position` (the head's new token)."""

    token: int
    position: int


@dataclass(frozen=True)
class StartShed:
    reason: str


@dataclass(frozen=True)
class Farewell:
    """Tell every member of `ring` (the one without us) before exiting."""

    ring: Ring


@dataclass(frozen=True)
class Exit:
    """This node left the ring: the process stops."""
