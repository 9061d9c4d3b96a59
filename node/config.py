"""The node's one frozen config object.

Precedence, lowest first: defaults below < TOML file (--config) < FLOE_* environment
variables < command-line flags. Nothing else in the node reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
from dataclasses import dataclass, fields
from typing import Mapping, Sequence

from floering.wire.balancers import BALANCERS, described
from floering.node.core.batch import Limits
from floering.node.core.detector import DetectorConfig
from floering.node.core.machine import REPAIR_DELAY
from floering.node.core.reducers import parse_reducer_args, reducer_identity
from floering.node.core.shares import PULL_GRACE, PULL_INTERVAL

# The protocol's defaults live with the code that runs them; the flags start from them.
_DETECTOR = DetectorConfig()

LOG_FORMATS = ("text", "json")
# The shortest --source-expiry: a source's watermarks must outlast its resends
# (a mapper's timeout: 60 s by default, shorter where its operator sets it).
MIN_SOURCE_EXPIRY = 10.0
# A node id names files (its data directory, certificate, key and log): letters,
# digits, _ and -, up to 64; a member that came back new carries `#k` after it.
NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}(#[0-9]{1,9})?")


def check_node_id(node_id: object, *, incarnation: bool = True) -> str:
    """`node_id` if it is one (ValueError in one line otherwise); `incarnation=False`
    refuses the `#k` suffix too, where an id is a founder's or a file's name."""
    if not isinstance(node_id, str) or not NODE_ID.fullmatch(node_id) or (
            not incarnation and "#" in node_id):
        shown = repr(node_id)[:80]
        raise ValueError(f"bad node id {shown}: use 1 to 64 letters, digits, _ or -"
                         + (" (and #N after a restart)" if incarnation else ""))
    return node_id


@dataclass(frozen=True)
class NodeConfig:
    node_id: str
    listen: str                                  # host:port this node serves on (binds)
    peers: tuple[tuple[str, str], ...]           # (node_id, host:port) of every initial member, self included
    replication: int = 1                         # r: each range lives on r+1 nodes
    tokens_per_node: int = 8                     # ranges per founder: finer units to move, split and take over
    reducer: str = "count"                       # alias or package.module:Class
    reducer_args: tuple[tuple[str, str], ...] = ()
    checkpoint_interval: float = 0.2             # seconds; short keeps backups and replay small
    queue_batches: int = 256                     # inbound queue bound; full queue slows senders
    max_inbound_bytes: int = 256 << 20           # bytes of batches queued to apply, at most
    max_batch_bytes: int = 4 << 20               # larger batches are refused RESOURCE_EXHAUSTED
    max_message_bytes: int = 64 << 20            # gRPC message limit (scan chunks, full checkpoints)
    checkpoint_chunk_entries: int = 16_384       # a larger full checkpoint goes in chunks of this many
    max_source_bytes: int = 256                  # a longer source id is refused RESOURCE_EXHAUSTED
    max_top: int = 10_000                        # Top(k) above this is refused RESOURCE_EXHAUSTED
    max_scan_chunk: int = 50_000                 # keys per Scan chunk asked for, at most
    stream_window: int = 64                      # Push requests read ahead of the acks sent back
    max_concurrent_rpcs: int = 1000              # more at once are refused RESOURCE_EXHAUSTED
    max_request_bytes: int = 0                   # requests read at once for non-members; 0: 16 messages
    request_wait: float = 30.0                   # a call waits this long for room to read its request
    max_tokens: int = 4096                       # splits stop when the ring has this many tokens
    max_splits_per_minute: int = 60              # splits a node makes in a minute, at most
    max_handoff_timeout: float = 600.0           # a move, split or leave asks at most this long
    # Batches held for other primaries, at most: a takeover replays them all before the
    # node answers again (~14 MB/s checked), so this bounds that pause to ~0.6 s.
    max_backup_bytes: int = 8 << 20
    backup_expiry: float = 300.0                 # a backed-up batch its primary never applied is dropped
    max_sources_per_range: int = 4096            # dedup watermarks per range; more sources refused
    source_expiry: float = 7 * 86400.0           # a source idle this long loses its watermark
    piece_idle: float = 10.0                     # a shared key's piece unchanged this long is merged back
    max_stream_ahead: float = 3600.0             # a stream numbered this far past our clock is refused
    max_sources_per_node: int = 65536            # sources streaming to a node; more refused until idle ones expire
    rpc_timeout: float = 2.0                     # deadline on every outbound call, seconds
    shutdown_grace: float = 2.0                  # seconds in-flight RPCs get on SIGTERM
    leave_on_sigterm: bool = False               # SIGTERM hands every range over, then exits
    verify_keys: bool = False                    # hash every key of a batch to check its range
    heartbeat_interval: float = 0.05             # primary -> replicas; checkpoints count too
    suspect_min: float = _DETECTOR.min_timeout   # silence never suspected sooner (seconds)
    suspect_max: float = _DETECTOR.max_timeout   # silence always suspected after this
    probe_timeout: float = _DETECTOR.probe_timeout # first probe deadline of a suspicion (then doubled)
    suspicion: float = _DETECTOR.suspicion       # a suspect whose probes only time out is declared after this
    repair_delay: float = REPAIR_DELAY           # seconds after a member left before new replicas get full copies
    lossy_suspicion: float = _DETECTOR.lossy_suspicion # ... after this when declaring it would lose ranges
    share_pull_grace: float = PULL_GRACE         # a member short of its share waits this long before pulling
    share_pull_interval: float = PULL_INTERVAL   # seconds between two pulls of one member
    balance: bool = False                        # given: balancer = "floe"; then: whether ranges move
    balancer: str = "none"                       # the ring's load-balancing policy, chosen at founding
    high_queue: float = 8.0                      # overloaded: queue above this AND cpu above high_cpu
    high_cpu: float = 0.8
    low_queue: float = 2.0                       # relieved: queue below this AND cpu below low_cpu
    low_cpu: float = 0.5
    balance_cooldown: float = 2.0                # seconds between two moves of one node
    balance_reach: int = 2                       # a shed range may go this many nodes clockwise
    join: str = ""                               # seed host:port,...: join a running ring with no tokens
    startup_grace: float = 10.0                  # a starting node suspects a peer it never heard from only after this
    log_level: str = "INFO"
    tls_dir: str = ""                            # ca.pem, <node-id>.pem/.key: mutual TLS on every call
    insecure: bool = False                       # no TLS: allowed on a loopback address only
    events_file: str = ""                        # JSON lines of protocol events (node.runtime.events)
    log_format: str = "text"                     # "json": one object per log line, for collectors
    metrics_port: int = 0                        # Prometheus /metrics on the listen host; 0: off
    data_dir: str = ""                           # durable mode: log and copies here; a restart comes back as itself
    fsync_interval: float = 0.002                # durable mode: group commit, seconds between fsyncs
    advertise: str = ""                          # host:port peers and clients reach it at; "": listen

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("node_id is required")
        _check_address(self.listen)
        self._check_advertise()
        self._check_peers()
        if self.replication < 0:
            raise ValueError("replication must be >= 0")
        if self.tokens_per_node < 1:
            raise ValueError("tokens_per_node must be >= 1")
        if self.balance_reach < 1:
            raise ValueError("balance_reach must be >= 1")
        if self.balancer not in BALANCERS:
            raise ValueError(f"unknown balancer {self.balancer!r:.40}: one of "
                             f"{', '.join(sorted(BALANCERS))}")
        if self.balance and self.balancer not in ("none", "floe"):
            raise ValueError(f"--balance means --balancer floe, not {self.balancer}")
        if self.balance:
            object.__setattr__(self, "balancer", "floe")
        # what the node machine reads: whether this policy moves ranges
        object.__setattr__(self, "balance", BALANCERS[self.balancer].moves_ranges)
        for name in ("checkpoint_interval", "rpc_timeout", "heartbeat_interval", "suspect_min",
                     "probe_timeout", "suspicion"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.startup_grace < 0:
            raise ValueError("startup_grace must be >= 0")
        if not 0 <= self.repair_delay <= 60:
            raise ValueError("repair_delay must be 0 to 60 seconds")
        if not 0 <= self.lossy_suspicion <= 3600:      # the detector waits at least `suspicion`
            raise ValueError("lossy_suspicion must be 0 to 3600 seconds")
        if not 0 <= self.share_pull_grace <= 3600 or not 0.05 <= self.share_pull_interval <= 3600:
            raise ValueError("share_pull_grace must be 0 to 3600 seconds, "
                             "share_pull_interval 0.05 to 3600")
        if self.queue_batches < 1 or self.max_batch_bytes < 1:
            raise ValueError("queue_batches and max_batch_bytes must be >= 1")
        if self.max_inbound_bytes < self.max_batch_bytes:
            raise ValueError("max_inbound_bytes must be at least max_batch_bytes")
        if self.max_backup_bytes < self.max_batch_bytes:
            # a batch larger than the whole store could never be backed up
            raise ValueError("max_backup_bytes must be at least max_batch_bytes")
        if "{node}" in self.data_dir:         # one flag for a whole local cluster
            object.__setattr__(self, "data_dir", self.data_dir.replace("{node}", self.node_id))
        self._check_observability()
        if not 0 <= self.fsync_interval <= 1:
            raise ValueError("fsync_interval must be 0 to 1 second")
        if self.max_request_bytes < 0:
            raise ValueError("max_request_bytes must be >= 0 (0: sixteen messages)")
        if not 0 < self.request_wait <= 600:        # NaN fails too
            raise ValueError("request_wait must be above 0 and at most 600 seconds")
        for name in ("max_splits_per_minute", "max_sources_per_node", "max_sources_per_range",
                     "checkpoint_chunk_entries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not self.max_stream_ahead >= 60:
            raise ValueError("max_stream_ahead must be at least 60 seconds (clocks drift)")
        if not self.piece_idle >= 0.5:
            raise ValueError("piece_idle must be at least 0.5 seconds")
        # Both must outlast any resend and any queue: an expiry cut short drops or
        # double-counts what a slow sender still holds. A backed-up batch waits in its
        # primary's queue; a source's resends last its mapper's timeout (60 s by
        # default), which its operator knows and may set shorter.
        for name, least in (("backup_expiry", 60), ("source_expiry", MIN_SOURCE_EXPIRY)):
            if not getattr(self, name) >= least:       # NaN fails too
                raise ValueError(f"{name} must be at least {least:g} seconds")

    def _check_peers(self) -> None:
        """Every id names files (check_node_id), once; this node among them."""
        check_node_id(self.node_id)
        ids = [check_node_id(node) for node, _ in self.peers]
        if self.node_id not in ids:
            raise ValueError(f"peers must include this node ({self.node_id}); got {ids}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate node ids in peers: {ids}")
        for _, address in self.peers:
            _check_address(address)

    def _check_advertise(self) -> None:
        """The address the ring records for this node: what it was told to advertise,
        else its listen address, which must then be one others can dial."""
        if not self.advertise:
            if is_unspecified(self.listen):
                raise ValueError(
                    f"listen address {self.listen!r} is unspecified (every interface): give "
                    f"--advertise host:port, the address peers and clients reach this node at")
            object.__setattr__(self, "advertise", self.listen)
        _check_address(self.advertise)
        if is_unspecified(self.advertise):
            raise ValueError(f"cannot advertise {self.advertise!r}: nobody can dial an "
                             f"unspecified address; advertise this host's own address or name")
        mine = dict(self.peers).get(self.node_id)
        if self.advertise != self.listen and mine not in (None, self.advertise):
            raise ValueError(f"--peers gives {self.node_id} the address {mine}, but it "
                             f"advertises {self.advertise}: the ring records one address "
                             f"per node, name the advertised one in --peers")

    def _check_observability(self) -> None:
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}")
        if not 0 <= self.metrics_port < 65536:
            raise ValueError("metrics_port must be 0 (off) to 65535")

    def limits(self) -> Limits:
        """The bounds the protocol core enforces, as configured."""
        return Limits(**{f.name: getattr(self, f.name) for f in fields(Limits)
                         if hasattr(self, f.name)})

    @property
    def reducer_identity(self) -> str:
        """The reducer and its arguments, as the ring records them for every member."""
        return reducer_identity(self.reducer, parse_reducer_args(
            f"{k}={v}" for k, v in self.reducer_args))


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"address must be host:port, got {address!r}")


def is_unspecified(address: str) -> bool:
    """Whether host:port names no host but every interface: 0.0.0.0, [::], ::, or an
    empty host."""
    host = address.rpartition(":")[0].strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def parse_peers(text: str) -> tuple[tuple[str, str], ...]:
    """'n0=127.0.0.1:7000,n1=127.0.0.1:7001' -> (('n0', '127.0.0.1:7000'), ...)"""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        node, sep, address = item.partition("=")
        if not sep:
            raise ValueError(f"peer must be id=host:port, got {item!r}")
        pairs.append((node.strip(), address.strip()))
    return tuple(pairs)


_FIELDS = {f.name: f for f in dataclasses.fields(NodeConfig)}


def _coerce(name: str, value):
    if name == "peers":
        return parse_peers(value) if isinstance(value, str) else tuple(
            (k, v) for k, v in (value.items() if isinstance(value, Mapping) else value))
    if name == "reducer_args":
        if isinstance(value, str):
            value = [value]
        if isinstance(value, Mapping):
            return tuple((str(k), str(v)) for k, v in value.items())
        return tuple(tuple(item.split("=", 1)) if isinstance(item, str) else tuple(item)
                     for item in value)
    kind = _FIELDS[name].type
    if kind == "bool" and isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    if kind in ("int", "float") and isinstance(value, str):
        return int(value) if kind == "int" else float(value)
    return value


def build_parser() -> argparse.ArgumentParser:
    # `floe node` is the documented way to start one (python -m floering.node takes the same)
    p = argparse.ArgumentParser(prog="floe node", description="Run one floe-ring reducer node.")
    p.add_argument("--config", help="TOML file with any of the settings below")
    p.add_argument("--node-id")
    p.add_argument("--listen", help="host:port to serve on (bind); 0.0.0.0 or [::] (every "
                                    "interface) needs --advertise")
    p.add_argument("--advertise",
                   help="host:port peers and clients reach this node at, as the ring "
                        "records it (default: the --listen address); never 0.0.0.0 or [::]")
    p.add_argument("--peers", help="every initial member as id=host:port,... (self included)")
    p.add_argument("--replication", type=int, help="r: replicas per range (default 1)")
    p.add_argument("--tokens-per-node", type=int)
    p.add_argument("--reducer", help="count, sum, min, max, topk, window or package.module:Class")
    p.add_argument("--reducer-arg", action="append", dest="reducer_args",
                   help="name=value passed to the reducer's constructor (repeatable)")
    p.add_argument("--checkpoint-interval", type=float)
    p.add_argument("--queue-batches", type=int)
    p.add_argument("--max-batch-bytes", type=int)
    p.add_argument("--rpc-timeout", type=float)
    p.add_argument("--shutdown-grace", type=float)
    p.add_argument("--leave-on-sigterm", action="store_true", default=None,
                   help="on SIGTERM, leave the ring gracefully (hand every range to its "
                        "first replica) before exiting; without it the node stops and its "
                        "ranges are taken over as after a crash")
    p.add_argument("--verify-keys", action="store_true", default=None)
    p.add_argument("--heartbeat-interval", type=float)
    p.add_argument("--suspect-min", type=float, help="seconds of silence before suspecting")
    p.add_argument("--suspect-max", type=float)
    p.add_argument("--probe-timeout", type=float)
    p.add_argument("--suspicion", type=float,
                   help="seconds a node whose probes time out (paused or slow, not refusing "
                        "connections) stays suspected before it is declared dead")
    p.add_argument("--repair-delay", type=float,
                   help="seconds after a member leaves the ring (or is declared dead) before "
                        "this node sends new replicas their full copies: the takeover and "
                        "the reads it redirects get the cores first (0: at once)")
    p.add_argument("--lossy-suspicion", type=float,
                   help="seconds (default 30) a suspect stays suspected when declaring it dead "
                        "would lose ranges (this node holds no complete copy of one it would "
                        "take over): it may be starved, not gone; never less than --suspicion")
    p.add_argument("--share-pull-grace", type=float,
                   help="seconds (default 3) a member short of its share of the ring waits "
                        "before it pulls ranges from a donor (an operator adding it moves "
                        "ranges first)")
    p.add_argument("--share-pull-interval", type=float,
                   help="seconds (default 2) between two pulls of one member")
    _add_balancing(p)
    p.add_argument("--join", help="seed addresses host:port,... of a running ring to join "
                                  "(as a member with no ranges; --peers names only this node)")
    p.add_argument("--startup-grace", type=float,
                   help="seconds before a starting node suspects a peer it has not heard from")
    _add_limits(p)
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    p.add_argument("--tls-dir",
                   help="directory holding ca.pem and <node-id>.pem/.key (floe up --tls "
                        "writes one): every call is mutual TLS, callers are authorised by "
                        "their certificate's role")
    p.add_argument("--insecure", action="store_true", default=None,
                   help="serve without TLS; only on a loopback address (beyond loopback a "
                        "node always needs --tls-dir)")
    p.add_argument("--events-file",
                   help="append structured protocol events (detected, taken_over, handoff_*, "
                        "...) to this file as JSON lines")
    _add_durability(p)
    _add_observability(p)
    return p


def _add_observability(p: argparse.ArgumentParser) -> None:
    """What operators' tools read (docs/operations.md)."""
    p.add_argument("--log-format", choices=LOG_FORMATS,
                   help="text (default) or json: one JSON object per line with time, "
                        "level, logger, message and node id")
    p.add_argument("--metrics-port", type=int,
                   help="serve Prometheus metrics over HTTP at /metrics on this port of "
                        "the listen host (default 0: off)")


def _add_balancing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--balance", action="store_true", default=None,
                   help="the same as --balancer floe")
    p.add_argument("--balancer", choices=sorted(BALANCERS),
                   help="the ring's load-balancing policy, fixed when it is founded (every "
                        "member must say the same): " + described() + ". A policy that "
                        "shares keys merges their pieces on reads and needs a reducer "
                        "with merge (default none)")
    p.add_argument("--high-queue", type=float)
    p.add_argument("--high-cpu", type=float)
    p.add_argument("--low-queue", type=float)
    p.add_argument("--low-cpu", type=float)
    p.add_argument("--balance-cooldown", type=float)
    p.add_argument("--balance-reach", type=int,
                   help="how many distinct nodes clockwise a shed range may go (1: only "
                        "the neighbour holding it)")


def _add_durability(p: argparse.ArgumentParser) -> None:
    """Durable mode (docs/durability.md)."""
    p.add_argument("--data-dir",
                   help="durable mode: keep a log of accepted batches and checkpointed copies "
                        "here, acknowledge only what is synced, and come back as the same "
                        "member after a restart; {node} in it is replaced by the node id "
                        "(docs/durability.md)")
    p.add_argument("--fsync-interval", type=float,
                   help="durable mode: seconds a group commit waits for more batches before "
                        "its fsync (default 0.002)")


def _add_limits(p: argparse.ArgumentParser) -> None:
    """What a caller may ask of a node (docs/security.md)."""
    p.add_argument("--max-source-bytes", type=int,
                   help="longest source id a batch may carry (default 256)")
    p.add_argument("--max-top", type=int, help="largest k a Top query may ask (default 10000)")
    p.add_argument("--max-scan-chunk", type=int,
                   help="most keys per Scan chunk a client may ask (default 50000)")
    p.add_argument("--max-concurrent-rpcs", type=int,
                   help="calls served at once; more are refused RESOURCE_EXHAUSTED (default 1000)")
    p.add_argument("--max-request-bytes", type=int,
                   help="bytes of requests read at once for all callers but members, "
                        "at least four of the largest messages (default 0: sixteen)")
    p.add_argument("--request-wait", type=float,
                   help="seconds a call waits for room to read its request before it "
                        "is refused RESOURCE_EXHAUSTED (default 30)")
    p.add_argument("--max-tokens", type=int,
                   help="no split once the ring has this many tokens (default 4096)")
    p.add_argument("--max-splits-per-minute", type=int,
                   help="splits a node makes in any minute, asked for or to shed load; more "
                        "are refused RESOURCE_EXHAUSTED (default 60)")
    p.add_argument("--checkpoint-chunk-entries", type=int,
                   help="a full checkpoint (a new replica's or holder's copy of a range) with "
                        "more keys goes in chunks of this many, each with a deadline for its "
                        "own bytes, a failed one sent again alone (default 16384)")
    p.add_argument("--max-backup-bytes", type=int,
                   help="bytes of batches a replica holds until checkpoints cover them; "
                        "past it, batches are refused RESOURCE_EXHAUSTED; a takeover replays them "
                        "all at once, so this bounds its pause (default 8 MiB)")
    p.add_argument("--max-handoff-timeout", type=float,
                   help="longest timeout a move, split or leave may ask, seconds (default 600)")
    p.add_argument("--max-inbound-bytes", type=int,
                   help="bytes of batches queued to apply; a full queue stops reading the "
                        "senders' streams (backpressure) (default 256 MiB)")
    p.add_argument("--max-sources-per-range", type=int,
                   help="sources whose dedup watermark a range keeps; a new one past it is "
                        "refused RESOURCE_EXHAUSTED (default 4096)")
    p.add_argument("--max-sources-per-node", type=int,
                   help="sources whose current stream a node tracks; a new one past it is "
                        "refused RESOURCE_EXHAUSTED until idle ones expire (default 65536)")
    p.add_argument("--max-stream-ahead", type=float,
                   help="seconds a stream number (the sender's wall clock) may run ahead "
                        "of this node's clock; past it a batch is refused (default 3600)")
    p.add_argument("--source-expiry", type=float,
                   help="seconds a source may stay idle before its watermarks are dropped; "
                        "it must outlast any resend: the mappers' timeout, 60 s by default "
                        "(at least 10; default 604800, a week)")
    p.add_argument("--piece-idle", type=float,
                   help="seconds a piece of a shared key (dkg, dchoices, wchoices, "
                        "smalops) must stay unchanged before its owner merges it back "
                        "into the key (default 10)")
    p.add_argument("--backup-expiry", type=float,
                   help="seconds after which a backed-up batch its primary still has not "
                        "applied is dropped (default 300)")
    p.add_argument("--stream-window", type=int,
                   help="Push requests read ahead of the acknowledgements sent back; a "
                        "client that does not read its acks is not read either (default 64)")


def load_config(argv: Sequence[str] | None = None,
                environ: Mapping[str, str] | None = None) -> NodeConfig:
    args = build_parser().parse_args(argv)
    environ = os.environ if environ is None else environ
    values: dict = {}
    config_path = args.config or environ.get("FLOE_CONFIG")
    if config_path:
        import tomllib              # only a node given a settings file reads TOML
        with open(config_path, "rb") as fh:
            table = tomllib.load(fh)
        table = table.get("node", table)
        unknown = set(table) - set(_FIELDS)
        if unknown:
            raise ValueError(f"unknown settings in {config_path}: {sorted(unknown)}")
        values.update({k: _coerce(k, v) for k, v in table.items()})
    for name in _FIELDS:
        env = environ.get("FLOE_" + name.upper())
        if env is not None:
            values[name] = _coerce(name, env)
    for name, value in vars(args).items():
        if name != "config" and value is not None:
            values[name] = _coerce(name, value)
    missing = [n for n in ("node_id", "listen", "peers") if n not in values]
    if missing:
        raise ValueError("missing required settings: " + ", ".join(missing))
    return NodeConfig(**values)
