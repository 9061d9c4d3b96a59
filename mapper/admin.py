"""Admin operations, as client-library calls: ask nodes to hand ranges over (move,
split, leave), plan who takes what when nodes are added, carry a plan out. What
`floe move`, `floe split`, `floe scale` and `floe restart` do, usable from any program."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.wire.errors import InvalidArgument
from floering.wire.hashing import HASH_SPACE
from floering.wire.ring import Ring
from floering.wire.status import error_from_rpc
from floering.wire.channels import server_options
from floering.mapper.credentials import FIND, TlsChoice, find_tls
from floering.wire.tls import server_name


def request_handoff(address: str, tokens, target: str = "", *, leave: bool = False,
                    timeout: float = 30.0, split_at: int | None = None,
                    tls: TlsChoice = FIND, node: str | None = None
                    ) -> floe_pb2.HandoffReply:
    """Ask the node at `address` to hand `tokens` to `target` (or to leave, or to split
    its range at `split_at` and hand the tail to `target`); returns once the handoff
    committed or was aborted. `tls`: an operator's certificate, on a TLS ring; the
    server must then present `node`'s certificate (default: any node's). Without
    `tls`, the operator's certificate is found as `mapper/credentials.py` says."""
    tls = find_tls("operator", tls)
    with (grpc.secure_channel(address, tls.channel_credentials(),
                              options=server_options(node and server_name(node))) if tls
          else grpc.insecure_channel(address)) as channel:
        stub = floe_pb2_grpc.ControlPlaneStub(channel)
        try:
            if leave:
                return stub.Leave(floe_pb2.LeaveRequest(sender="operator", timeout=timeout),
                                  timeout=timeout + 5)
            if split_at is not None:
                return stub.Split(floe_pb2.SplitRequest(sender="operator", at=split_at,
                                                        target=target, timeout=timeout),
                                  timeout=timeout + 5)
            return stub.Move(floe_pb2.MoveRequest(sender="operator", tokens=list(tokens),
                                                  target=target, timeout=timeout),
                             timeout=timeout + 5)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None


def hex_position(pos: int) -> str:
    return f"{pos:#x}"


def position_format(text: str) -> Callable[[int], str]:
    """How to print positions for someone who wrote one as `text`: hex for 0x..., else
    decimal."""
    return hex_position if text.strip().lower().startswith("0x") else str


def parse_position(text: str) -> int:
    try:
        pos = int(text, 0)
    except ValueError:
        raise InvalidArgument(f"position must be an integer (0x... allowed), got {text!r}") from None
    if not 0 <= pos < HASH_SPACE:
        raise InvalidArgument(f"position {pos} is outside the hash space [0, 2^64)")
    return pos


def move(ring: Ring, node: str, pos: int, timeout: float = 30.0,
         tls: TlsChoice = FIND, show: Callable[[int], str] = hex_position) -> str:
    """`node` takes over the range containing `pos` from its current owner."""
    if node not in ring.nodes:
        raise InvalidArgument(f"{node!r} is not a member of ring v{ring.version}: "
                              f"{', '.join(ring.nodes)}")
    token = ring.token_for_position(pos)
    owner = ring.owner_of_token(token)
    if owner == node:
        return f"{node} already owns the range of token {show(token)}"
    reply = request_handoff(ring.address(owner), [token], node, timeout=timeout, tls=tls,
                            node=owner)
    if not reply.accepted:
        raise InvalidArgument(f"{owner} did not hand token {show(token)} to {node}: {reply.detail}")
    return (f"{owner} handed the range ending at token {show(token)} to {node} "
            f"(ring v{reply.ring_version})")


def split(ring: Ring, pos: int, node: str | None = None, timeout: float = 30.0,
          tls: TlsChoice = FIND, show: Callable[[int], str] = hex_position) -> str:
    """Cut the range holding `pos` at `pos`: its owner keeps (lo, pos] under the new
    token `pos`, the tail (pos, token] keeps the token; with `node`, the tail then goes
    to `node` live (to the owner's clockwise neighbour: "move my token back to pos")."""
    if node is not None and node not in ring.nodes:
        raise InvalidArgument(f"{node!r} is not a member of ring v{ring.version}: "
                              f"{', '.join(ring.nodes)}")
    if ring.has_token(pos):
        raise InvalidArgument(f"{show(pos)} is already a range boundary")
    token = ring.token_for_position(pos)
    owner = ring.owner_of_token(token)
    if node == owner:
        raise InvalidArgument(f"{owner} owns the range already; give --to another node")
    reply = request_handoff(ring.address(owner), [], node or "", timeout=timeout, split_at=pos,
                            tls=tls, node=owner)
    if not reply.accepted:
        raise InvalidArgument(f"{owner} split at {show(pos)} but did not hand the tail to "
                              f"{node}: {reply.detail}")
    if node is None:
        return f"{owner} split the range of token {show(token)} at {show(pos)} (ring v{reply.ring_version})"
    return (f"{owner} split the range of token {show(token)} at {show(pos)} and handed the tail "
            f"to {node} (ring v{reply.ring_version})")


def plan_scale_out(ring: Ring, newcomers: list[str],
                   load: dict[str, dict[int, float]] | None = None) -> dict[str, dict[int, str]]:
    """Give each newcomer tokens until every member owns about the same number; each
    time from the member owning the most, its busiest (else widest) range.
    Returns {donor: {token: newcomer}}."""
    load = load or {}
    owned = {n: list(ring.tokens_of(n)) for n in ring.nodes}
    fair = len(ring.tokens) // len(ring.nodes)
    plan: dict[str, dict[int, str]] = {}
    for newcomer in newcomers:
        while len(owned[newcomer]) < fair:
            donor = max((n for n in owned if n not in newcomers),
                        key=lambda n: (len(owned[n]), n))
            if len(owned[donor]) <= fair:
                break
            rates = load.get(donor, {})
            token = max(owned[donor], key=lambda t: (rates.get(t, 0.0),
                                                     Ring.range_size(ring.range_of_token(t))))
            owned[donor].remove(token)
            owned[newcomer].append(token)
            plan.setdefault(donor, {})[token] = newcomer
    return plan


def carry_out(ring: Ring, plan: dict[str, dict[int, str]], timeout: float = 60.0,
              tls: TlsChoice = FIND) -> list[str]:
    """Every donor hands its share at once (donors in parallel, one handoff each per
    target). Raises if any was aborted."""
    calls = []
    for donor, moves in plan.items():
        by_target: dict[str, list[int]] = {}
        for token, target in moves.items():
            by_target.setdefault(target, []).append(token)
        calls.append((donor, by_target))

    def run(call):
        donor, by_target = call
        out = []
        for target, tokens in sorted(by_target.items()):
            reply = request_handoff(ring.address(donor), tokens, target, timeout=timeout,
                                    tls=tls, node=donor)
            if not reply.accepted:
                raise InvalidArgument(f"{donor} -> {target}: {reply.detail}")
            out.append(f"{donor} handed {len(tokens)} ranges to {target}")
        return out

    with ThreadPoolExecutor(max(1, len(calls))) as pool:
        return [line for lines in pool.map(run, calls) for line in lines]
