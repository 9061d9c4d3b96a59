"""How node.app wires a node's parts together, on a node started in this process."""

from floering.node.app import start_node
from floering.node.config import NodeConfig


async def test_a_node_on_an_ephemeral_port_asks_about_retired_ranges_over_its_peer_pool():
    # Bound to port 0, the node publishes its real address in its peers' list; the
    # calls about retired ranges must still go through its pool of peer channels.
    node = await start_node(NodeConfig(node_id="n0", listen="127.0.0.1:0",
                                       peers=(("n0", "127.0.0.1:0"),), replication=0,
                                       tokens_per_node=1))
    try:
        assert node.retiring is not None
        ring = node.runtime.core.ring
        token = ring.tokens_of("n0")[0]
        held = await node.retiring.calls.held(node.address, token, ring.stamp, {})
        assert (held.role, held.holds, held.lost) == ("primary", True, False)
    finally:
        await node.stop()
