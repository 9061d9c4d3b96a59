"""Helpers of tests/unit/test_segment_size.py that other test files use too: GiB, MiB.
"""

from __future__ import annotations


MiB, GiB = 1 << 20, 1 << 30
