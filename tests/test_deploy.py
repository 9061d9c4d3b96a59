"""The systemd unit and the example node settings in deploy/systemd: valid for systemd
and for the node, and a restart the way the unit does it (its KillSignal, then its
ExecStart again on the same data directory) brings the node back as the same member
with every acknowledged count."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from floering.floe.cluster import _free_ports, node_env, serving
from floering.mapper import RingClient
from floering.node.config import load_config
from floering.wire.tls import TlsFiles
from floering.node.transport.tls import generate

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "systemd"
UNIT = DEPLOY / "floe-node@.service"
EXAMPLE = DEPLOY / "node.toml.example"
PYTHON = "/opt/floe-ring/.venv/bin/python"
WORDS = "in the beginning god created the heaven and the earth and the earth".split()


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str                      # systemd keys are case-sensitive
    parser.read(UNIT)
    return parser


def exec_start(instance: str, config_path: Path) -> list[str]:
    """The unit's ExecStart for `instance`, run by this interpreter on `config_path`."""
    line = unit()["Service"]["ExecStart"].replace("%i", instance)
    argv = shlex.split(line)
    assert argv[:3] == [PYTHON, "-m", "floering.node"], argv    # the node's own entry
    argv[0] = sys.executable
    at = argv.index("--config")
    assert argv[at + 1] == f"/etc/floe-ring/{instance}.toml", argv
    argv[at + 1] = str(config_path)
    return argv


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


def node_settings(tmp_path: Path, node_id: str, addresses: dict, tls_dir: Path) -> Path:
    """The example's settings for `node_id` of a ring on loopback."""
    settings = EXAMPLE.read_text()
    peers = ",".join(f"{n}={a}" for n, a in addresses.items())
    for old, new in (('node_id = "n0"', f'node_id = "{node_id}"'),
                     ("n0=10.0.0.1:7000,n1=10.0.0.2:7000,n2=10.0.0.3:7000", peers),
                     ("10.0.0.1:7000", addresses[node_id]),
                     ("/var/lib/floe-ring/n0", str(tmp_path / "data" / node_id)),
                     ("/etc/floe-ring/tls", str(tls_dir))):
        assert old in settings, old
        settings = settings.replace(old, new)
    path = tmp_path / f"{node_id}.toml"
    path.write_text(settings)
    return path


def start_unit(tmp_path: Path, node_id: str, run: int) -> subprocess.Popen:
    with open(tmp_path / f"{node_id}.{run}.log", "w") as log:
        return subprocess.Popen(exec_start(node_id, tmp_path / f"{node_id}.toml"),
                                stdout=log, stderr=subprocess.STDOUT, env=node_env(),
                                cwd=tmp_path)


def stop_unit(process: subprocess.Popen) -> int:
    """What systemd does on stop: the unit's KillSignal, then up to TimeoutStopSec."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=float(unit()["Service"]["TimeoutStopSec"]))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def wait_serving(process, address: str, tls: TlsFiles, log: Path) -> None:
    deadline = time.monotonic() + 60
    while not serving(address, tls):
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"not serving: {log.read_text()[-2000:]}"
        time.sleep(0.1)


@pytest.mark.multiprocess
def test_a_restart_as_the_unit_does_it_hands_over_first_and_loses_nothing(tmp_path):
    ports = _free_ports("127.0.0.1", 2, None)
    addresses = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    tls_dir = generate(tmp_path / "tls", list(addresses))
    for node_id in addresses:
        node_settings(tmp_path, node_id, addresses, tls_dir)
    client_tls = TlsFiles.in_dir(tls_dir, "client")
    processes = {n: start_unit(tmp_path, n, 0) for n in addresses}
    try:
        for n, process in processes.items():
            wait_serving(process, addresses[n], client_tls, tmp_path / f"{n}.0.log")
        with RingClient(list(addresses.values()), tls=client_tls) as client:
            client.emit_many(WORDS)
            client.flush()
            assert set(client.ring.tokens_of("n0"))          # n0 owns ranges
        code = stop_unit(processes["n0"])                    # systemctl restart: stop...
        assert code == 0, (tmp_path / "n0.0.log").read_text()   # a clean stop
        assert "n0 left the ring" in (tmp_path / "n0.0.log").read_text()
        with RingClient([addresses["n1"]], tls=client_tls) as client:
            assert "n0" not in client.ring.nodes             # its ranges were handed over
            assert dict(client.scan()) == Counter(WORDS)     # before it exited
        processes["n0"] = start_unit(tmp_path, "n0", 1)      # ... and start
        wait_serving(processes["n0"], addresses["n0"], client_tls, tmp_path / "n0.1.log")
        with RingClient(list(addresses.values()), tls=client_tls) as client:
            assert any(n.startswith("n0#") for n in client.ring.nodes), client.ring.nodes
            client.emit_many(WORDS)
            client.flush()
            assert dict(client.scan()) == Counter(WORDS * 2)
    finally:
        for process in processes.values():
            if process.poll() is None:
                stop_unit(process)


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
