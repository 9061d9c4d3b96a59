import subprocess
import sys

import pytest

from floering.node.config import NodeConfig, load_config, parse_peers

PEERS = "n0=127.0.0.1:7000,n1=127.0.0.1:7001"


def test_flags_override_env_override_file(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text('[node]\nnode_id = "n0"\nlisten = "127.0.0.1:7000"\n'
                    f'peers = "{PEERS}"\nreplication = 2\ncheckpoint_interval = 1.5\n'
                    'reducer = "sum"\n')
    env = {"FLOE_REPLICATION": "1", "FLOE_VERIFY_KEYS": "true"}
    config = load_config(["--config", str(toml), "--reducer", "max"], environ=env)
    assert (config.replication, config.checkpoint_interval, config.reducer, config.verify_keys) \
        == (1, 1.5, "max", True)
    assert config.peers == (("n0", "127.0.0.1:7000"), ("n1", "127.0.0.1:7001"))


def test_suspicion_period_is_a_setting():
    argv = ["--node-id", "n0", "--listen", "127.0.0.1:7000", "--peers", PEERS]
    assert load_config(argv, environ={}).suspicion == 1.0
    assert load_config(argv, environ={"FLOE_SUSPICION": "2.5"}).suspicion == 2.5
    assert load_config([*argv, "--suspicion", "0.5"], environ={}).suspicion == 0.5
    assert load_config(argv, environ={}).repair_delay == 0.5
    assert load_config([*argv, "--repair-delay", "0"], environ={}).repair_delay == 0.0


def test_config_is_frozen():
    config = NodeConfig(node_id="n0", listen="127.0.0.1:1", peers=(("n0", "127.0.0.1:1"),))
    with pytest.raises(AttributeError):
        config.replication = 3


@pytest.mark.parametrize("argv, message", [
    (["--node-id", "n0", "--listen", "127.0.0.1:7000"], "missing required settings: peers"),
    (["--node-id", "n9", "--listen", "127.0.0.1:7000", "--peers", PEERS], "must include this node"),
    (["--node-id", "n0", "--listen", "nowhere", "--peers", PEERS], "host:port"),
    (["--node-id", "n0", "--listen", "127.0.0.1:7000", "--peers", PEERS,
      "--replication", "-1"], "replication"),
    (["--node-id", "n0", "--listen", "127.0.0.1:7000", "--peers", PEERS,
      "--balance-reach", "0"], "balance_reach"),
    (["--node-id", "n0", "--listen", "127.0.0.1:7000", "--peers", PEERS,
      "--suspicion", "0"], "suspicion must be > 0"),
    (["--node-id", "n0", "--listen", "127.0.0.1:7000", "--peers", PEERS,
      "--repair-delay", "-1"], "repair_delay must be 0 to 60"),
    # a batch larger than the whole backup store could never be acknowledged
    (["--node-id", "n0", "--listen", "127.0.0.1:7000", "--peers", PEERS,
      "--max-backup-bytes", str(1 << 20)], "max_backup_bytes must be at least max_batch_bytes"),
    (["--node-id", "n0", "--listen", "127.0.0.1:7000", "--peers", PEERS,
      "--metrics-port", "70000"], "metrics_port must be 0"),
])
def test_bad_settings_are_refused_clearly(argv, message):
    with pytest.raises(ValueError, match=message):
        load_config(argv, environ={})


def test_unknown_setting_in_file_is_refused(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text("replicaton = 2\n")
    with pytest.raises(ValueError, match="replicaton"):
        load_config(["--config", str(toml)], environ={})


def test_parse_peers_rejects_garbage():
    with pytest.raises(ValueError):
        parse_peers("n0:127.0.0.1:7000")


@pytest.mark.parametrize("extra, message", [
    (["--reducer", "no.such.module:Thing"], "cannot import"),
    (["--listen", "bad"], "host:port"),
])
def test_node_process_exits_2_with_a_message(extra, message):
    argv = ["--node-id", "n0", "--listen", "127.0.0.1:0", "--peers", "n0=127.0.0.1:0",
            "--insecure", *extra]
    result = subprocess.run([sys.executable, "-m", "floering.node", *argv], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr


def test_metrics_and_log_format_settings():
    base = ["--node-id", "n0", "--listen", "127.0.0.1:7000", "--peers", PEERS]
    default = load_config(base, environ={})
    assert default.metrics_port == 0 and default.log_format == "text"      # off, as before
    config = load_config(base + ["--metrics-port", "9400"],
                         environ={"FLOE_LOG_FORMAT": "json"})
    assert config.metrics_port == 9400 and config.log_format == "json"
    with pytest.raises(ValueError, match="log_format must be one of text, json"):
        load_config(base, environ={"FLOE_LOG_FORMAT": "xml"})


def test_advertise_defaults_to_the_listen_address():
    argv = ["--node-id", "n0", "--listen", "127.0.0.1:7000", "--peers", PEERS]
    assert load_config(argv, environ={}).advertise == "127.0.0.1:7000"
    wild = ["--node-id", "n0", "--listen", "0.0.0.0:7000", "--advertise", "10.0.0.1:7000",
            "--peers", "n0=10.0.0.1:7000,n1=10.0.0.2:7000"]
    config = load_config(wild, environ={})
    assert (config.listen, config.advertise) == ("0.0.0.0:7000", "10.0.0.1:7000")
    assert load_config(wild, environ={"FLOE_ADVERTISE": "x"}).advertise == "10.0.0.1:7000"


@pytest.mark.parametrize("listen, advertise, message", [
    ("0.0.0.0:7000", None, "unspecified .*give --advertise"),
    ("[::]:7000", None, "unspecified .*give --advertise"),
    ("127.0.0.1:7000", "0.0.0.0:7000", "cannot advertise"),
    ("0.0.0.0:7000", "[::]:7000", "cannot advertise"),
    ("0.0.0.0:7000", "10.0.0.1", "host:port"),
    # the ring records one address per node: --peers must name the advertised one
    ("0.0.0.0:7000", "10.0.0.9:7000", "advertises 10.0.0.9:7000"),
])
def test_an_address_nobody_can_dial_is_never_advertised(listen, advertise, message):
    argv = ["--node-id", "n0", "--listen", listen, "--peers", "n0=10.0.0.1:7000"]
    if advertise is not None:
        argv += ["--advertise", advertise]
    with pytest.raises(ValueError, match=message):
        load_config(argv, environ={})
