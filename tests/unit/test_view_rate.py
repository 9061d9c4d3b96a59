"""Ring views one member may push (node.core.slots.ViewRate): a token bucket per
caller identity (a large view costs more), refused Busy past it, counted in floe_calls_refused_busy_total.
Pure rules, and a real TLS ring a member floods with views."""


import pytest


from floering.wire.errors import Busy
from floering.node.core.slots import ViewRate


def test_a_member_pushes_its_burst_then_its_rate():
    rate = ViewRate(rate=10.0, burst=5)
    for _ in range(5):
        rate.take("node:n2", 0.0)
    with pytest.raises(Busy):
        rate.take("node:n2", 0.0)
    rate.take("node:n1", 0.0)                 # another member has its own share
    rate.take("node:n2", 0.1)                 # a tenth of a second: one more view
    with pytest.raises(Busy):
        rate.take("node:n2", 0.1)
    assert rate.refused == 2
    for _ in range(5):                        # refilled, up to the burst
        rate.take("node:n2", 10.0)
    with pytest.raises(Busy):
        rate.take("node:n2", 10.0)


def test_a_large_view_costs_more():
    from floering.node.core.slots import VIEW_BYTES
    rate = ViewRate(rate=10.0, burst=8)
    rate.take("node:n2", 0.0, 3 * VIEW_BYTES)          # four tokens
    rate.take("node:n2", 0.0, VIEW_BYTES - 1)          # one
    with pytest.raises(Busy):
        rate.take("node:n2", 0.0, 3 * VIEW_BYTES)
    rate.take("node:n2", 0.0)
    rate.take("node:n1", 0.0, 1 << 30)                 # the most: the whole burst
    with pytest.raises(Busy):
        rate.take("node:n1", 0.0)


def test_the_identities_tracked_are_bounded():
    rate = ViewRate(rate=1.0, burst=2, max_callers=8)
    for i in range(100):
        rate.take(f"node:x{i}", float(i))
    assert len(rate.buckets) <= 8
    # a caller whose bucket is not full is kept while full ones are forgotten
    rate.take("node:flood", 200.0)
    rate.take("node:flood", 200.0)
    rate.take("node:other", 200.0)
    assert "node:flood" in rate.buckets
    with pytest.raises(Busy):
        rate.take("node:flood", 200.0)
