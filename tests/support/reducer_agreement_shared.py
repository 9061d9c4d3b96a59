"""Helpers of tests/unit/test_reducer_agreement.py that other test files use too: COUNT.
"""

from __future__ import annotations

from floering.node.core.reducers import reducer_identity


COUNT = reducer_identity("count", {})
