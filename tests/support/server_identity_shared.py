"""Helpers of tests/unit/test_server_identity.py that other test files use too: ROOT, mode.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)
