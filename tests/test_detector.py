"""The failure detector's timing rules, with an explicit clock."""

from node.core.detector import DetectorConfig, FailureDetector


def test_silent_primary_is_suspected_after_min_timeout():
    d = FailureDetector(DetectorConfig(min_timeout=0.2))
    d.watch({"a"}, now=0.0)
    assert d.suspects(0.19) == []
    assert d.suspects(0.21) == ["a"]
    assert d.suspects(0.3) == []          # already being probed


def test_startup_grace_covers_a_peer_never_heard_from():
    d = FailureDetector(DetectorConfig(min_timeout=0.2))
    d.watch({"slow", "fast"}, now=0.0, grace=5.0)
    assert d.suspects(4.0) == []          # "slow" may still be starting
    d.heard("fast", 1.0)                  # the grace ends at the first heartbeat
    assert d.suspects(1.25) == ["fast"]
    assert d.suspects(5.1) == []
    assert d.suspects(5.25) == ["slow"]   # never came up: suspected after the grace


def test_grace_applies_only_to_nodes_new_to_the_watch():
    d = FailureDetector(DetectorConfig(min_timeout=0.2))
    d.watch({"a"}, now=0.0)
    d.watch({"a", "b"}, now=0.1, grace=5.0)
    assert d.suspects(0.25) == ["a"]
