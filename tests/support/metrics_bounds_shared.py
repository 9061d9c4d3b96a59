"""Helpers of tests/unit/test_metrics_bounds.py that other test files use too: HOST.
"""

from __future__ import annotations


HOST = "127.0.0.1"
