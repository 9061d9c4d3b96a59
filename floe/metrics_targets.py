"""`floe up --metrics-port BASE`: node i serves its metrics on BASE+i, and the cluster's
scrape targets are written for Prometheus' file-based discovery (file_sd_configs):

    floe-cluster/prometheus-targets.json
    [{"targets": ["127.0.0.1:9400"], "labels": {"floe_node": "n0", "floe_cluster": DIR}}, ...]

Prometheus re-reads the file when it changes; `floe up` and `floe scale` rewrite it
(nodes `floe scale --add` starts take the first free ports after the cluster's
highest; a node without metrics is left out)."""

from __future__ import annotations

import json
from pathlib import Path

from floering.floe.cluster import port_free

TARGETS_FILE = Path("floe-cluster") / "prometheus-targets.json"
METRICS_FLAG = "--metrics-port"


def metrics_ports(base: int, count: int, host: str = "127.0.0.1") -> list[int]:
    """BASE .. BASE+count-1, each checked free on `host` (OSError naming the first that
    is not, or that is past 65535)."""
    ports = list(range(base, base + count))
    if base < 1 or ports[-1] > 65535:
        raise ValueError(f"--metrics-port {base}: node ports {base}..{ports[-1]} must lie "
                         f"in 1..65535")
    for port in ports:
        if not port_free(host, port):
            raise OSError(f"metrics port {port} on {host} is in use; pick another "
                          f"--metrics-port (node i gets BASE+i)")
    return ports


def refuse_shared_port(node_flags: list[str], nodes: int | None) -> None:
    """`floe up -- --metrics-port P` would give every node the same port."""
    if METRICS_FLAG in node_flags or any(f.startswith(METRICS_FLAG + "=") for f in node_flags):
        raise ValueError("--metrics-port after `--` would give every node the same port: "
                         "use `floe up --metrics-port BASE` (node i gets BASE+i)")


def metrics_port(cmd: list[str]) -> int | None:
    """The metrics port a node's command line gives it, if any."""
    for flag, value in zip(cmd, cmd[1:]):
        if flag == METRICS_FLAG and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def metrics_address(node) -> str | None:
    """host:port of a NodeProcess's metrics, on its listen host."""
    port = metrics_port(node.cmd)
    return None if port is None else f"{node.address.rpartition(':')[0]}:{port}"


def write_targets(cluster) -> Path:
    """The file_sd target file beside the cluster file, one target per node."""
    workdir = Path(cluster.state_file).resolve().parent
    path = workdir / TARGETS_FILE
    groups = [{"targets": [address], "labels": {"floe_node": n.node_id,
                                                "floe_cluster": str(workdir)}}
              for n in cluster.nodes if (address := metrics_address(n)) is not None]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=2) + "\n")
    tmp.replace(path)
    return path


def next_metrics_ports(cluster, count: int, host: str = "127.0.0.1") -> list[int] | None:
    """Metrics ports for `count` nodes `floe scale --add` starts: the first free ones
    after the cluster's highest, or None when its nodes serve no metrics."""
    used = [p for n in cluster.nodes if (p := metrics_port(n.cmd)) is not None]
    if not used:
        return None
    ports: list[int] = []
    port = max(used)
    while len(ports) < count:
        port += 1
        if port > 65535:
            raise OSError("no free metrics port left after the cluster's")
        if port_free(host, port):
            ports.append(port)
    return ports
