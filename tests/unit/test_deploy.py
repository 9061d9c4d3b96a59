"""The systemd unit and the example node settings in deploy/systemd: valid for systemd
and for the node, and a restart the way the unit does it (its KillSignal, then its
ExecStart again on the same data directory) brings the node back as the same member
with every acknowledged count."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib

import pytest

from floering.node.config import load_config
from tests.support.deploy_shared import DEPLOY, EXAMPLE, PYTHON, UNIT, unit


def test_the_example_settings_load_as_a_node_configuration():
    config = load_config(["--config", str(EXAMPLE)], environ={})
    assert config.node_id == "n0" and config.data_dir and config.tls_dir
    assert dict(config.peers)["n0"] == config.listen
    assert config.leave_on_sigterm              # a stop hands every range over first


def test_the_unit_stops_with_sigterm_and_does_not_retry_a_refused_configuration():
    service = unit()["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert service["RestartPreventExitStatus"] == "2"      # what `floe node` exits with
    assert float(service["TimeoutStopSec"]) >= 60


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path):
    text = UNIT.read_text().replace(PYTHON, sys.executable)
    (tmp_path / "floe-node@n0.service").write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", "floe-node@n0.service"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


CONTAINER = DEPLOY.parent / "container"


def test_the_container_settings_bind_every_interface_and_advertise_the_host():
    config = load_config(["--config", str(CONTAINER / "node.toml.example")], environ={})
    assert config.listen.startswith("0.0.0.0:")
    assert dict(config.peers)["n0"] == config.advertise != config.listen
    assert config.data_dir.startswith("/var/lib/floe-ring/") and config.tls_dir


def test_the_container_image_copies_every_package_and_runs_the_node():
    root = DEPLOY.parent.parent
    lines = (CONTAINER / "Containerfile").read_text().splitlines()
    copied = [word for line in lines if line.startswith("COPY ")
              for word in line.split()[1:-1]]
    assert all((root / path).exists() for path in copied), copied
    packages = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    tops = {p.split(".")[0] for p in packages["packages"]}
    sources = {packages["package-dir"].get(t, t).split("/")[0] for t in tops}
    assert sources <= set(copied), sources - set(copied)
    assert 'ENTRYPOINT ["python", "-m", "floering.node"]' in lines
    assert "STOPSIGNAL SIGTERM" in lines


# Flags of other programs the deployment guide runs (useradd, systemctl, docker).
OTHER_FLAGS = {"--home-dir", "--system", "--now", "--name", "--stop-timeout"}


def option_strings(parser) -> set[str]:
    """Every option of `parser` and of its subcommands."""
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(getattr(action, "choices", None), dict):
            for sub in action.choices.values():
                if hasattr(sub, "_actions"):
                    found |= option_strings(sub)
    return found


def test_every_flag_the_deployment_guide_names_exists():
    from floering.floe.cli import build_parser as floe_parser
    from floering.node.config import build_parser as node_parser
    text = (DEPLOY.parent.parent / "docs" / "deploy.md").read_text()
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))
    known = option_strings(node_parser()) | option_strings(floe_parser()) | OTHER_FLAGS
    assert named - known == set()
    assert {"--listen", "--advertise", "--peers", "--join", "--tls-dir",
            "--data-dir", "--leave-on-sigterm"} <= named
