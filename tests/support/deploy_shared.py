"""Helpers of tests/unit/test_deploy.py that other test files use too: DEPLOY, EXAMPLE, PYTHON,
UNIT, unit.
"""

from __future__ import annotations

import configparser
from pathlib import Path


DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "systemd"


UNIT = DEPLOY / "floe-node@.service"


EXAMPLE = DEPLOY / "node.toml.example"


PYTHON = "/opt/floe-ring/.venv/bin/python"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str                      # systemd keys are case-sensitive
    parser.read(UNIT)
    return parser
