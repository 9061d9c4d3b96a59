"""Helpers of tests/simulation/test_durable.py that other test files use too: durable_cluster,
restart_all.
"""

from floering.floe.cluster import LocalCluster
from floering.chaos.durable_faults import kill_all, start_again


def durable_cluster(tmp_path, nodes=3, **kw) -> LocalCluster:
    return LocalCluster.up(nodes, 1, workdir=tmp_path, extra_args=[
        "--data-dir", str(tmp_path / "data" / "{node}")], **kw)


def restart_all(cluster: LocalCluster, before_start=None) -> None:
    """SIGKILL every node at once, then start each again with its command line."""
    kill_all(cluster)
    if before_start is not None:
        before_start()
    start_again(cluster, [n.node_id for n in cluster.nodes])
    cluster.wait_ready(60)
