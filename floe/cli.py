"""The `floe` command: run a local ring and talk to it.

    floe up --nodes 4 --replicas 1      start a local durable cluster (recorded in
                                        ./floe-cluster.json, data in ./floe-cluster/data)
    floe status [--json]                every member's state, then a one-line verdict
    floe ring | floe locate KEY         the ranges and their holders; where a key lives
    floe feed FILE...                   stream the words of text files in (.gz too), once
    floe get KEY | floe top K           query state (--json on every read)
    floe move NODE --to POSITION        NODE takes over the range holding POSITION, live
    floe split POSITION [--to NODE]     cut the range holding POSITION there; NODE takes the tail
    floe scale --add N | --remove NODE  add nodes (they take ranges) or remove one
    floe scale --auto SECONDS           add/remove nodes by load, within --min/--max-nodes
    floe restart NODE... | --rolling    restart nodes one at a time, losing nothing
    floe up                             after `floe down`: the same cluster, as it was;
                                        while it runs: starts only the nodes that are gone
    floe up --memory                    nodes without a data directory: state in memory only
    floe up --data-dir DIR              keep the data in DIR instead
    floe down [--kill] [--wipe]         stop exactly the processes `up` started
                                        (--wipe: then delete the cluster's data)
    floe ui [--port P]                  a live page of the ring (floe/webui.py)
    floe chaos list | run SCENARIO      chaos scenarios (python -m floering.chaos.chaos_cli)
    floe node --node-id n0 ...          one node in this process (python -m floering.node)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# gRPC's own log lines (a refused handshake's, per attempt) on a command's stderr
# would bury its one-line error; set before grpc loads; GRPC_VERBOSITY=INFO shows them
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from floering.floe.cluster import (DEFAULT_STATE_FILE, LayoutMismatch, LocalCluster, describe_layout,
                           kept_layout, wipe)
from floering.mapper.admin import hex_position, parse_position, position_format
from floering.wire.balancers import BALANCERS, described
from floering.wire.errors import FloeError


def _seeds(args) -> list[str]:
    if args.ring:
        return [s for s in args.ring.split(",") if s]
    return LocalCluster.load(args.cluster_file).seeds


def _tls(args, name: str):
    """`name`'s credentials (client or operator), found as every client finds them
    (mapper/credentials.py): --tls-dir, FLOE_TLS_DIR, then the cluster's own
    floe-cluster/tls, with or without --ring; None for a plain ring."""
    from floering.mapper.credentials import FIND, find_tls
    return find_tls(name, args.tls_dir or FIND, cluster_file=args.cluster_file)


def _client(args, **kwargs):
    from floering.mapper import RingClient
    return RingClient(_seeds(args), timeout=args.timeout, tls=_tls(args, "client"), **kwargs)


def _workdir(args) -> Path:
    """Where `up` keeps the cluster: beside the cluster file."""
    return Path(args.cluster_file).resolve().parent


def default_data_dir(args) -> Path:
    return _workdir(args) / "floe-cluster" / "data"


def _wipe_command(args) -> str:
    where = "" if Path(args.data_dir or default_data_dir(args)).resolve() == \
        default_data_dir(args) else f" --data-dir {args.data_dir}"
    return f"floe down --wipe{where}"


def cmd_up(args) -> int:
    running = _running(args)
    if running is not None:
        return _up_missing(args, running)
    extra = []
    if args.checkpoint_interval:
        extra += ["--checkpoint-interval", str(args.checkpoint_interval)]
    data_dir = None if args.memory else Path(args.data_dir or default_data_dir(args)).resolve()
    kept = kept_layout(data_dir) if data_dir is not None else None
    from floering.floe import metrics_targets
    metrics_targets.refuse_shared_port(args.node_flags, args.nodes)
    if args.metrics_port is not None:             # node i: BASE+i, each checked free
        metrics_targets.metrics_ports(args.metrics_port, args.nodes or (
            len(kept["nodes"]) if kept else 4))
    try:
        cluster = LocalCluster.up(args.nodes, args.replicas, base_port=args.base_port,
                                  workdir=_workdir(args), reducer=args.reducer,
                                  tokens_per_node=args.tokens_per_node, extra_args=extra,
                                  tls=not args.insecure, data_dir=data_dir,
                                  balancer=args.balancer, node_args=args.node_flags or None,
                                  metrics_port=args.metrics_port)
    except LayoutMismatch as exc:
        raise ValueError(f"{exc}. Run `floe up` without {' or '.join(exc.flags)} to "
                         f"bring it back as it was, or `{_wipe_command(args)}` to delete "
                         f"it (every node's data) and start fresh; `floe up --memory` "
                         f"starts a cluster without a data directory") from None
    for node in cluster.nodes:
        metrics = metrics_targets.metrics_address(node)
        print(f"{node.node_id}  {node.address}  pid {node.pid}"
              + (f"  metrics http://{metrics}/metrics" if metrics else ""))
    if args.metrics_port is not None:
        print(f"Prometheus targets (file_sd): {metrics_targets.write_targets(cluster)}")
    if data_dir is None:
        how = "in memory only (--memory)"
    elif kept is not None:
        how = f"durable, brought back from {data_dir}"
    else:
        how = f"durable in {data_dir}"
    tls = cluster.tls()
    print(f"{len(cluster.nodes)} nodes serving, r={cluster.replicas}, "
          f"balancer {cluster.balancer}, "
          + ("no TLS" if tls is None else f"mutual TLS ({tls.ca.parent})")
          + f"; {how}; recorded in {cluster.state_file}")
    return 0


def _running(args) -> LocalCluster | None:
    """The cluster the cluster file records, if any of its nodes is running."""
    if not Path(args.cluster_file).exists():
        return None
    cluster = LocalCluster.load(args.cluster_file)
    return cluster if any(n.alive() for n in cluster.nodes) else None


# `floe up`'s settings, which a running cluster's missing members cannot take
UP_SETTINGS = {"nodes": "--nodes", "replicas": "--replicas", "base_port": "--base-port",
               "reducer": "--reducer", "tokens_per_node": "--tokens-per-node",
               "balancer": "--balancer", "checkpoint_interval": "--checkpoint-interval",
               "metrics_port": "--metrics-port", "insecure": "--insecure",
               "memory": "--memory", "node_flags": "--"}


def _up_missing(args, cluster: LocalCluster) -> int:
    """`floe up` while the recorded cluster runs: start again, each on its own data
    directory, only the nodes whose process is gone (floe.restart.start_missing)."""
    where = Path(args.cluster_file).resolve()
    alive = sorted(n.node_id for n in cluster.nodes if n.alive())
    missing = sorted(n.node_id for n in cluster.nodes if not n.alive())
    if not missing:
        raise RuntimeError(f"the cluster recorded in {where} is still running, every node "
                           f"of it ({', '.join(alive)}): nothing to start; `floe status` "
                           f"shows it, `floe down` stops it")
    given = [flag for key, flag in UP_SETTINGS.items() if getattr(args, key, None)]
    if args.data_dir and (cluster.data_dir is None or
                          Path(args.data_dir).resolve() != Path(cluster.data_dir)):
        given.append("--data-dir")
    if given:
        raise ValueError(f"the cluster recorded in {where} is running ({', '.join(alive)}); "
                         f"`floe up` starts its missing members ({', '.join(missing)}) as "
                         f"they were, without {', '.join(given)} (`floe scale --add` adds "
                         f"nodes)")
    from floering.floe.restart import start_missing
    start_missing(cluster, timeout=args.timeout)
    print(f"started {', '.join(missing)} again; {', '.join(alive)} "
          f"{'was' if len(alive) == 1 else 'were'} running and left alone; "
          f"{sum(n.alive() for n in cluster.nodes)} nodes running")
    return 0


def cmd_down(args) -> int:
    recorded = Path(args.cluster_file).exists()
    if not recorded and not args.wipe:
        LocalCluster.load(args.cluster_file)            # says there is no cluster
    cluster = LocalCluster.load(args.cluster_file) if recorded else None
    if cluster is not None:
        running = sum(n.alive() for n in cluster.nodes)
        cluster.down(kill=args.kill)
        idle = len(cluster.nodes) - running
        print(f"{'killed' if args.kill else 'stopped'} {running} nodes"
              + (f" ({idle} recorded were not running)" if idle else ""))
    if args.wipe:
        data_dir = Path(args.data_dir or (cluster and cluster.data_dir)
                        or default_data_dir(args)).resolve()
        layout = kept_layout(data_dir)
        if layout is None:
            print(f"no cluster kept in {data_dir}: nothing to wipe")
            return 0
        described = describe_layout(layout)
        wipe(data_dir)
        print(f"wiped the cluster kept in {data_dir}: {described}; the next `floe up` "
              f"starts a new one")
    return 0


def _recorded(args) -> dict[str, dict]:
    """The processes `floe up` recorded (none with --ring): {node: address, pid, alive}."""
    if args.ring or not Path(args.cluster_file).exists():
        return {}
    from floering.floe.metrics_targets import metrics_address
    return {n.node_id: {"address": n.address, "pid": n.pid, "alive": n.alive(),
                        "metrics": metrics_address(n)}
            for n in LocalCluster.load(args.cluster_file).nodes}


def budget_cell(row: dict) -> str:
    """Bytes of requests held / the bound (MiB), and the calls refused for want of
    room if any: the node's budgets of request bytes (request_budget_*)."""
    if not row.get("request_budget_limit_bytes"):
        return "-"
    cell = (f"{row.get('request_budget_bytes', 0) / (1 << 20):.0f}/"
            f"{row['request_budget_limit_bytes'] >> 20} MiB")
    refused = row.get("request_budget_refused", 0)
    return f"{cell} {refused:,} refused" if refused else cell


def cmd_status(args) -> int:
    from floering.floe.ringview import (check_exit, describe_ring, member_rows, table,
                                         unlisted_processes, verdict)
    recorded = _recorded(args)
    with _client(args) as client:
        ring = client.refresh_ring()
        rows = member_rows(ring, client.stats(also=unlisted_processes(ring, recorded)),
                           recorded)
    line = verdict(ring, rows)
    for row in rows:            # where Prometheus scrapes it (floe up --metrics-port)
        metrics = recorded.get(row["node_id"].partition("#")[0], {}).get("metrics")
        if metrics:
            row["metrics"] = metrics
    for row in rows:
        row.pop("load", None)   # per-token rates: bytes, summed up in apply_rate
    if args.json:
        print(json.dumps({"ring_version": ring.version, "replication": ring.replication,
                          "reducer": ring.reducer, "balancer": ring.balancer,
                          "verdict": line, "nodes": rows}, indent=2))
        return check_exit(line) if args.check else 0
    cells = [("node", "state", "address", "pid", "share", "tokens", "rate/s", "busy", "load",
              "keys", "queue", "backup", "under", "lost", "kernel", "lag", "requests", "ring")]
    for r in rows:
        if "ring_share" not in r:
            cells.append((r["node_id"], r["state"], r["address"], str(r.get("pid", "-")),
                          *["-"] * 13, r.get("error", "")))
            continue
        cells.append((r["node_id"], r["state"], r["address"], str(r["pid"]),
                      f"{r['ring_share']:.1%}", str(r["tokens"]), f"{r['apply_rate']:,.0f}",
                      f"{r['busy']:.0%}", "HIGH" if r["overloaded"] else "ok", str(r["keys"]),
                      str(r["queue_length"]), str(r["backup_tuples"]),
                      str(r["under_replicated"]), str(r["lost_ranges"]),
                      r.get("state_kernel") or "-", f"{r.get('loop_lag_ms', 0):.0f} ms",
                      budget_cell(r), f"v{r['ring_version']}"))
    print(describe_ring(ring))
    print("\n".join(table(cells)))
    print(line)
    return check_exit(line) if args.check else 0


def cmd_ring(args) -> int:
    from floering.floe.ringview import describe_ring, range_rows, table
    with _client(args) as client:
        ring = client.refresh_ring()
    rows = range_rows(ring, hex_position if args.hex else str)
    if args.json:
        print(json.dumps({"ring_version": ring.version, "replication": ring.replication,
                          "reducer": ring.reducer, "balancer": ring.balancer,
                          "ranges": rows}, indent=2))
        return 0
    cells = [("token", "range (start, token]", "share", "primary", "replicas", "extras")]
    for r in rows:
        cells.append((r["token"], f"({r['start']}, {r['end']}]", f"{r['share']:.1%}",
                      r["primary"] + (" LOST" if r["lost"] else ""),
                      ",".join(r["replicas"]) or "-", ",".join(r["extras"]) or "-"))
    print(describe_ring(ring))
    print("\n".join(table(cells)))
    return 0


def cmd_locate(args) -> int:
    from floering.floe.ringview import locate
    key: object = int(args.key) if args.int_key else args.key
    with _client(args) as client:
        ring = client.refresh_ring()
    where = locate(ring, key, hex_position if args.hex else str)
    if args.json:
        print(json.dumps(where, indent=2))
        return 0
    replicas = ", ".join(where["replicas"]) or "none"
    extras = f"; also sent to {', '.join(where['extras'])}" if where["extras"] else ""
    print(f"key {key!r} at position {where['position']}: range ({where['start']}, "
          f"{where['end']}] of token {where['token']}; primary {where['primary']}, "
          f"replicas {replicas}{extras}" + ("; LOST" if where["lost"] else ""))
    return 0


def cmd_feed(args) -> int:
    from floering.floe.feed import Progress, check_inputs, feed, feed_key
    inputs = check_inputs(args.files, force=args.force, again=args.again,   # before sending
                          key=feed_key(_workdir(args) / "floe-cluster"))
    started = time.perf_counter()
    with _client(args, batch_size=args.batch_size, source=inputs[0].source) as client:
        show = sys.stderr.isatty() if args.progress is None else args.progress
        total = feed(client, inputs, Progress(sum(i.size for i in inputs), show=show),
                     plans=_workdir(args) / "floe-cluster" / "feed-plans")
    elapsed = time.perf_counter() - started
    print(f"fed {total} words in {elapsed:.2f}s ({total / elapsed:,.0f} tuples/s), "
          f"all acknowledged by r+1 nodes; fed again unchanged, they are not counted "
          f"again")
    return 0


def cmd_get(args) -> int:
    key: object = int(args.key) if args.int_key else args.key
    with _client(args) as client:
        state = client.get(key)
    if args.json:
        print(json.dumps({"key": key, "state": state}, default=repr))
    elif state is not None:
        print(json.dumps(state, default=repr))
    else:
        print(f"floe get: no state for key {key!r}", file=sys.stderr)
    return 0 if state is not None else 1


def cmd_top(args) -> int:
    with _client(args) as client:
        ranked = client.top(args.k)
    if args.json:
        print(json.dumps([{"key": k, "state": v} for k, v in ranked], default=repr))
        return 0
    for key, state in ranked:
        print(f"{state}\t{key}")
    return 0


def cmd_move(args) -> int:
    from floering.mapper.admin import move
    with _client(args) as client:
        ring = client.refresh_ring()
    from floering.floe.ringview import member_named
    print(move(ring, member_named(ring, args.node), parse_position(args.to), timeout=args.timeout,
               tls=_tls(args, "operator"), show=position_format(args.to)))
    return 0


def cmd_split(args) -> int:
    from floering.mapper.admin import split
    with _client(args) as client:
        ring = client.refresh_ring()
    from floering.floe.ringview import member_named
    print(split(ring, parse_position(args.position), args.to and member_named(ring, args.to),
                timeout=args.timeout,
                tls=_tls(args, "operator"), show=position_format(args.position)))
    return 0


def _range_loads(rows) -> dict[str, dict[int, float]]:
    """Per node, the tuples/s of each range it owns (from its stats)."""
    import msgpack
    return {r["node_id"]: {int(t): v for t, v in msgpack.unpackb(
                r["load"], strict_map_key=False).items()} if r.get("load") else {}
            for r in rows if "error" not in r}


def cmd_scale(args) -> int:
    from floering.mapper.admin import carry_out, plan_scale_out
    cluster = LocalCluster.load(args.cluster_file)
    if args.auto:
        from floering.floe.elastic import autoscale_loop
        autoscale_loop(cluster, seconds=args.auto, min_nodes=args.min_nodes,
                       max_nodes=args.max_nodes)
        print(f"{len(cluster.nodes)} nodes")
        return 0
    if args.remove:
        cluster.node(args.remove)       # an unknown name fails before anything is asked
        cluster.remove(args.remove, timeout=args.timeout)
        _rewrite_targets(cluster)
        print(f"{args.remove} handed its ranges to its neighbours and exited; "
              f"{sum(n.alive() for n in cluster.nodes)} nodes running")
        return 0
    from floering.floe.metrics_targets import next_metrics_ports
    added = cluster.add_nodes(args.add, base_port=args.base_port,
                              metrics_ports=next_metrics_ports(cluster, args.add))
    _rewrite_targets(cluster)
    names = [n.node_id for n in added]
    deadline = time.monotonic() + args.timeout
    with _client(args) as client:
        while not set(names) <= set(client.refresh_ring().nodes):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{', '.join(names)} did not join in {args.timeout}s")
            time.sleep(0.05)
        ring = client.ring
        load = _range_loads(client.stats())
    for line in carry_out(ring, plan_scale_out(ring, names, load), timeout=args.timeout,
                          tls=_tls(args, "operator")):
        print(line)
    print(f"added {', '.join(names)}; {sum(n.alive() for n in cluster.nodes)} nodes running")
    return 0


def _rewrite_targets(cluster) -> None:
    """Keep the Prometheus target file in step, for a cluster that serves metrics."""
    from floering.floe.metrics_targets import TARGETS_FILE, write_targets
    if (Path(cluster.state_file).resolve().parent / TARGETS_FILE).exists():
        write_targets(cluster)


def cmd_restart(args) -> int:
    from floering.floe.restart import rolling_restart
    cluster = LocalCluster.load(args.cluster_file)
    if bool(args.nodes) == args.rolling:
        raise ValueError("name the nodes to restart, or give --rolling for all of them")
    for node_id in args.nodes:
        cluster.node(node_id)     # unknown names fail before anything is stopped
    rolling_restart(cluster, args.nodes or None, graceful=not args.kill, timeout=args.timeout)
    print(f"restarted {len(args.nodes) or len(cluster.nodes)} nodes; every range is on "
          f"r+1 nodes")
    return 0


def _global_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """The options every command takes, before or after its name (after it, they are
    left unset unless given, so those given before it stand)."""
    def default(value):
        return value if defaults else argparse.SUPPRESS
    parser.add_argument("--cluster-file", default=default(DEFAULT_STATE_FILE),
                        help="where `up` records the cluster (default: ./floe-cluster.json)")
    parser.add_argument("--ring", default=default(None), metavar="HOST:PORT,...",
                        help="seed addresses of a ring (default: the recorded cluster's)")
    parser.add_argument("--tls-dir", default=default(None),
                        help="ca.pem, client.pem/.key and operator.pem/.key of a TLS ring "
                             "(default: $FLOE_TLS_DIR, else the cluster's own floe-cluster/tls "
                             "beside the cluster file, if any)")
    parser.add_argument("--timeout", type=float, default=default(60.0),
                        help="seconds per operation (default: 60)")


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line, saying where the help is, and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class DefaultsHelp(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it names one already or has
    none worth saying (unset, off)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" in text or not action.option_strings
                or any(action.default is v for v in (None, False, True, argparse.SUPPRESS))):
            return text
        return f"{text} (default: %(default)s)"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _key_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key")
    parser.add_argument("--int-key", action="store_true", help="the key is an integer")


def floe_version() -> str:
    """The installed package's version, else the one in this checkout's pyproject."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("floe-ring")
    except PackageNotFoundError:
        import tomllib
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="floe", description=__doc__.splitlines()[0],
                           formatter_class=DefaultsHelp)
    parser.add_argument("--version", action="version", version=f"floe {floe_version()}")
    _global_options(parser, defaults=True)
    common = OneLineParser(add_help=False)
    _global_options(common, defaults=False)
    commands = parser.add_subparsers(dest="command", required=True)
    sub = _Commands(commands, common)   # every command takes the global options too
    _up_command(sub)
    _cluster_commands(sub)
    _query_commands(sub)
    _admin_commands(sub)
    _cert_command(sub)
    from floering.floe.snapshot import add_snapshot_commands
    add_snapshot_commands(sub, _seeds, _tls)
    from floering.floe.webui import add_ui_command
    add_ui_command(sub, _seeds, _tls)
    # listed for --help only: main() hands `floe chaos ...` to the chaos harness's own
    # command (it lives in floering.chaos, which this package never imports) and
    # `floe node ...` to the node's own parser
    commands.add_parser("chaos", help="kill nodes under load, measure recovery, check nothing "
                            "is lost (floe chaos --help)", add_help=False)
    commands.add_parser("node", help="run one node in this process, with the flags of `python -m "
                            "node` (floe node --help)", add_help=False)
    return parser


class _Commands:
    """Adds the `floe` commands, each with the global options and the defaults shown."""

    def __init__(self, commands: argparse._SubParsersAction,
                 common: argparse.ArgumentParser) -> None:
        self._commands, self._common = commands, common

    def add_parser(self, name: str, **kw) -> argparse.ArgumentParser:
        return self._commands.add_parser(name, parents=[self._common],
                                         formatter_class=DefaultsHelp, **kw)


def _up_command(sub) -> None:
    up = sub.add_parser(
        "up", help="start a local cluster, durable: after `floe down`, `floe up` brings "
                   "the same one back",
        usage="floe up [options] [-- NODE_FLAG ...]",
        description="Start a local cluster. Its nodes are durable: each keeps its log and "
                    "copies in floe-cluster/data/<node-id> beside the cluster file "
                    "(--data-dir to choose), and the cluster's layout is kept there, so "
                    "`floe up` after `floe down` (or a crash, or `floe down --kill`) brings "
                    "the same nodes back with what they held. While the recorded "
                    "cluster runs, `floe up` starts again only its nodes whose process is "
                    "gone, each on its own data directory, leaves the others alone and "
                    "waits until each has its share of the ring back. Against a kept "
                    "cluster, "
                    "--nodes, --replicas, --reducer, --tokens-per-node, --balancer and "
                    "--base-port "
                    "may be left out; given and different, they are refused: "
                    "`floe down --wipe` deletes the kept cluster first. --memory: no data "
                    "directory, state in memory only (docs/durability.md). Everything "
                    "after `--` is given to every node as it is, e.g. `-- --reducer-arg "
                    "k=5 --balance` (python -m floering.node --help lists the flags); nodes "
                    "`floe scale --add` starts get it too.")
    up.add_argument("--nodes", type=int, help="how many nodes (default: 4 for a new cluster)")
    up.add_argument("--replicas", type=int, help="r, copies besides the primary (default: "
                                                 "1 for a new cluster)")
    up.add_argument("--base-port", type=int,
                    help="first port; nodes get consecutive ones, and `floe scale --add` "
                         "the next free ones (default: any free ports)")
    up.add_argument("--reducer", help="the reducer every node runs: count, sum, min, max, "
                                      "topk, window or package.module:Class; its arguments "
                                      "after `--` as --reducer-arg NAME=VALUE (default: "
                                      "count for a new cluster)")
    up.add_argument("--tokens-per-node", type=int, help="default: 8 for a new cluster")
    up.add_argument("--balancer", choices=sorted(BALANCERS),
                    help="a new cluster's load-balancing policy, for good: " + described()
                         + ". A policy that shares keys merges their pieces on reads and "
                         "needs a reducer with merge (default: none)")
    up.add_argument("--insecure", action="store_true",
                    help="no TLS (default: a throwaway CA and certificates in "
                         "floe-cluster/tls/, mutual TLS on every call; the other commands "
                         "find them there)")
    up.add_argument("--checkpoint-interval", type=float,
                    help="seconds between a node's checkpoints (default: the node's own)")
    up.add_argument("--metrics-port", type=int, metavar="BASE",
                    help="node i serves Prometheus metrics on BASE+i (each checked free "
                         "first), listed by `floe status --json`; the scrape targets go to "
                         "floe-cluster/prometheus-targets.json for file_sd_configs")
    where = up.add_mutually_exclusive_group()
    where.add_argument("--data-dir",
                       help="where the nodes keep their data (default: floe-cluster/data "
                            "beside the cluster file): each its log and copies in "
                            "DATA_DIR/<node-id>, acknowledging only what is synced; `floe "
                            "up` on the same directory brings the same cluster back")
    where.add_argument("--memory", action="store_true",
                       help="no data directory: state in memory only (a restarted node "
                            "comes back empty, a whole-cluster stop loses everything)")
    up.set_defaults(func=cmd_up)


def _cluster_commands(sub) -> None:
    down = sub.add_parser("down", help="stop the local cluster")
    down.add_argument("--kill", action="store_true",
                      help="SIGKILL every node at once instead of stopping them gracefully")
    down.add_argument("--wipe", action="store_true",
                      help="then delete the cluster's data (every node's data directory "
                           "and the kept layout), so the next `floe up` starts a new "
                           "cluster; works on a cluster already stopped too")
    down.add_argument("--data-dir",
                      help="with --wipe: the data directory `floe up` was given (default: "
                           "the recorded cluster's, else floe-cluster/data)")
    down.set_defaults(func=cmd_down)

    scale = sub.add_parser("scale", help="add nodes or remove one, live")
    how = scale.add_mutually_exclusive_group(required=True)
    how.add_argument("--add", type=_positive, metavar="N", help="start N nodes; they take ranges")
    how.add_argument("--remove", metavar="NODE", help="hand NODE's ranges over, then stop it")
    how.add_argument("--auto", type=float, metavar="SECONDS",
                     help="for SECONDS, add a node when all are overloaded, remove one when it "
                          "and its neighbour are idle")
    scale.add_argument("--base-port", type=int,
                       help="with --add: the new nodes take the first free ports from here, "
                            "skipping the cluster's (default: `floe up`'s --base-port, else "
                            "any free ports)")
    scale.add_argument("--min-nodes", type=int, default=1, help="with --auto: fewest nodes")
    scale.add_argument("--max-nodes", type=int, default=8, help="with --auto: most nodes")
    scale.set_defaults(func=cmd_scale)

    restart = sub.add_parser(
        "restart", help="restart nodes one at a time: each leaves the ring (its ranges go "
                        "over the other members), starts again as a new empty member and "
                        "takes its share back; the next waits until every range is on r+1 "
                        "nodes. A node whose process is gone starts again on its data "
                        "directory: the same member if the ring has not declared it dead")
    restart.add_argument("nodes", nargs="*", metavar="NODE", help="node ids, as `floe up` named them")
    restart.add_argument("--rolling", action="store_true", help="restart every node in turn")
    restart.add_argument("--kill", action="store_true",
                         help="SIGKILL instead of leaving: the ranges are taken over as "
                              "after a crash; a durable node back before the ring declares "
                              "it dead is the same member")
    restart.set_defaults(func=cmd_restart)

    feed = sub.add_parser("feed", help="stream the words of text files, exactly once")
    feed.add_argument("files", nargs="+",
                      help="text files (.gz allowed, - for stdin); every one is checked "
                           "before anything is sent, and a rerun (after a failure or "
                           "Ctrl-C) counts nothing twice")
    feed.add_argument("--batch-size", type=_positive, default=1000, help="tuples per batch")
    feed.add_argument("--force", action="store_true",
                      help="feed files that look binary too")
    feed.add_argument("--again", action="store_true",
                      help="count files fed before once more (a new source for each)")
    feed.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="a progress line on stderr every second: words, rate, time left "
                           "(default: when stderr is a terminal)")
    feed.set_defaults(func=cmd_feed)


def _query_commands(sub) -> None:
    status = sub.add_parser("status", help="every member's state and load, and a verdict")
    _json_option(status)
    status.add_argument("--check", action="store_true",
                        help="exit 3 unless HEALTHY (4 on DATA LOST), for scripts and probes")
    status.set_defaults(func=cmd_status)

    get = sub.add_parser("get", help="state of one key (exit 1 if it has none)")
    _key_options(get)
    _json_option(get)
    get.set_defaults(func=cmd_get)

    top = sub.add_parser("top", help="the K keys ranked highest")
    top.add_argument("k", type=_positive, help="how many keys, at least 1")
    _json_option(top)
    top.set_defaults(func=cmd_top)

    ring = sub.add_parser("ring", help="every range (start, token] with its primary and "
                                       "replicas")
    ring.add_argument("--hex", action="store_true", help="positions in hex (default: decimal)")
    _json_option(ring)
    ring.set_defaults(func=cmd_ring)

    loc = sub.add_parser("locate", help="a key's ring position, its range and the nodes "
                                        "holding it")
    _key_options(loc)
    loc.add_argument("--hex", action="store_true", help="positions in hex (default: decimal)")
    _json_option(loc)
    loc.set_defaults(func=cmd_locate)


def _admin_commands(sub) -> None:
    mv = sub.add_parser("move", help="NODE takes over the range holding POSITION, live")
    mv.add_argument("node")
    mv.add_argument("--to", required=True, metavar="POSITION",
                    help="a ring position, 0 .. 2^64-1, decimal or 0x...; answered the same way")
    mv.set_defaults(func=cmd_move)

    sp = sub.add_parser("split", help="cut the range holding POSITION at it (a new boundary); "
                                      "with --to, NODE takes the tail, live")
    sp.add_argument("position", help="a ring position, 0 .. 2^64-1, decimal or 0x...; "
                                     "answered the same way")
    sp.add_argument("--to", metavar="NODE",
                    help="hand the tail (POSITION, token] to NODE, e.g. the clockwise neighbour")
    sp.set_defaults(func=cmd_split)


def _cert_command(sub) -> None:
    cert = sub.add_parser(
        "cert", help="a certificate with an identity of its own for one client or operator",
        description="Issue a client (or operator) certificate named NAME from the ring's "
                    "CA (found as --tls-dir, $FLOE_TLS_DIR or the cluster's floe-cluster/tls; "
                    "it must hold the CA's key) into a new directory OUT, with the CA "
                    "certificates: give OUT as that caller's --tls-dir (tls= in the API). "
                    "Nodes share call slots and source tables out per identity, so callers "
                    "holding floe up's one client certificate share one share; each with its "
                    "own cannot crowd out the others (docs/security.md).")
    cert.add_argument("name", help="the identity (CN): 1-64 letters, digits, '.', '_', '-'")
    cert.add_argument("--out", required=True, help="a new (or empty) directory, made 0700")
    cert.add_argument("--role", choices=("client", "operator"), default="client",
                      help="operator: may also move, split, export and import")
    cert.set_defaults(func=cmd_cert)


def cmd_cert(args) -> int:
    from floering.mapper.credentials import FIND, find_tls_dir
    from floering.node.transport.tls import issue_identity
    ca_dir = find_tls_dir(args.tls_dir or FIND, cluster_file=args.cluster_file)
    if ca_dir is None:
        raise ValueError("no certificate directory found: give --tls-dir (the ring's CA), "
                         "or run beside a cluster `floe up` started with TLS")
    files = issue_identity(ca_dir, args.out, args.name, args.role)
    print(f"{args.role} {args.name}: {files.cert} (use --tls-dir {files.ca.parent})")
    return 0


def one_line(exc: BaseException) -> str:
    """An error as one line: its first line, plus its last (e.g. the end of a log)
    when it has more."""
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    else:
        text = str(exc) or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0].rstrip(':')}: {lines[-1]}"
    # gRPC's transport wording, for a node that does not answer
    return text.replace("UNAVAILABLE: failed to connect to all addresses; last error: "
                        "UNKNOWN: ", "cannot connect: ")


def run_chaos(argv: list[str]) -> int:
    """`floe chaos ...`: `python -m floering.chaos.chaos_cli ...` with this interpreter,
    its exit code returned (130 on an interrupt, which the child gets too)."""
    import subprocess
    try:
        return subprocess.call([sys.executable, "-m", "floering.chaos.chaos_cli", *argv])
    except KeyboardInterrupt:
        return 130


def main(argv=None) -> int:
    os.umask(0o077)     # the cluster's files (records, TLS, data, logs): the owner's only
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["node"]:        # every flag is the node's own, --help included
        from floering.node.__main__ import main as node_main
        return node_main(argv[1:])
    if argv[:1] == ["chaos"]:       # the chaos harness's command, in a process of its own
        return run_chaos(argv[1:])
    node_flags: list[str] = []
    if "--" in argv:
        node_flags = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    args = build_parser().parse_args(argv)
    args.node_flags = node_flags
    from floering.floe.ringview import process_ids
    process_ids(args)           # n1#1 is n1's process
    if node_flags and args.command != "up":
        print(f"floe {args.command}: only `floe up` takes node flags after `--`",
              file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"floe {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:         # e.g. `floe ring | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (FloeError, OSError, RuntimeError, ValueError, TimeoutError, KeyError) as exc:
        print(f"floe {args.command}: {one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:      # a bug: still one line; FLOE_DEBUG=1 shows the traceback
        if os.environ.get("FLOE_DEBUG"):
            raise
        print(f"floe {args.command}: unexpected {type(exc).__name__}: {one_line(exc)} "
              f"(FLOE_DEBUG=1 shows where)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
