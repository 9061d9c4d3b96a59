"""Helpers of tests/unit/test_hostile_restore.py that other test files use too: snapshot.
"""


def snapshot(core):
    return ({t: dict(r.state.snapshot()) for t, r in core.primaries.items()},
            {t: dict(r.watermarks) for t, r in core.primaries.items()},
            set(core.lost_tokens), core.ring.stamp)
