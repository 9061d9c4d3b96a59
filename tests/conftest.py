"""Suite-wide checks. Helpers live in tests/support/helpers.py.

Every process a test starts, it stops by its own PID: when the session ends, a child of
the test process that is still running (not a reaped or zombie exit) is a stray. The
run fails and names it; it is then stopped by its PID so it cannot outlive the run.
"""

from __future__ import annotations

import os
import signal

import psutil


def running_children(parent: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live, non-zombie process whose parent is `parent`."""
    out = []
    try:
        children = psutil.Process(parent).children()
    except psutil.Error:
        return out
    for child in children:
        try:
            if child.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                continue
            out.append((child.pid, " ".join(child.cmdline())))
        except psutil.Error:
            continue
    return out


def pytest_sessionfinish(session, exitstatus):
    strays = [(pid, cmd) for pid, cmd in running_children(os.getpid())
              if " -m floering.node " in f" {cmd} " or "mapper_proc" in cmd]
    if not strays:
        return
    for pid, _ in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    session.config.pluginmanager.get_plugin("terminalreporter").write_line(
        "stray processes left running by the tests (now killed): "
        + "; ".join(f"{pid}: {cmd[:120]}" for pid, cmd in strays), red=True)
    session.exitstatus = 1


# ------------------------------------------------------------------- test tiers
#
# The fast tier (`./scripts/test.sh`, `-m fast`): every in-process test (unit,
# property, the simulation) with a rotating share of the seeded simulation runs, plus
# a few real-cluster smoke tests. The whole suite (`./scripts/test-all.sh`, what CI
# runs) is everything but the long variants marked `slow`.

# One seeded run in SEED_SHARE runs in the fast tier: those whose seed is the day's
# rotation modulo SEED_SHARE, so every seed runs within SEED_SHARE days. FLOE_ROTATION
# picks a rotation (to re-run a failure the tier found on another day).
SEED_SHARE = 4
# Real processes, real TLS, real Spark: one test of each path a user takes first.
SMOKE = (
    "tests/cluster/test_cluster.py::test_corpus_counts_are_exact_and_resends_are_not_counted",
    "tests/cluster/test_cluster.py::test_cli_up_feed_query_status_down",
    "tests/cluster/test_failover.py::test_sigkill_one_node_under_load",
    "tests/cluster/test_restart.py::test_a_leave_from_a_pair_hands_its_ranges_over_once_under_load",
    "tests/spark/test_spark_driver.py::test_a_node_killed_mid_stream_loses_and_doubles_nothing",
    # and the short real-process tests beside in-process ones (a few seconds each)
    "tests/cluster/test_channels_live.py::test_a_mapper_closes_its_channel_to_a_killed_node_and_counts_stay_exact",
    "tests/cluster/test_metrics_bounds_live.py::"
    "test_a_flood_of_idle_connections_grows_no_threads_and_a_scrape_is_answered",
    "tests/cluster/test_private_files_live.py::test_everything_the_cluster_writes_is_private_from_birth",
    "tests/cluster/test_private_files_live.py::test_restart_runs_no_recorded_command_and_signals_no_stranger",
    "tests/cluster/test_private_files_live.py::test_no_node_serves_in_the_clear_unless_told_so",
    "tests/cluster/test_server_identity_live.py::"
    "test_a_second_node_on_a_bound_port_exits_naming_it_and_the_first_serves_on",
    "tests/cluster/test_server_identity_live.py::"
    "test_an_impostor_on_a_dead_nodes_address_is_refused_by_peers_and_mappers",
    "tests/cluster/test_server_identity_live.py::"
    "test_floe_up_on_a_durable_cluster_keeps_its_ca_and_every_certificate_handed_out",
    "tests/cluster/test_snapshot_live.py::test_export_then_import_into_a_ring_of_another_size",
    "tests/cluster/test_snapshot_live.py::test_an_import_is_durable_and_replicated",
    "tests/cluster/test_snapshot_live.py::"
    "test_an_export_under_a_running_feed_replays_exactly_into_a_ring_of_another_size",
)


# Multi-process tests that expect no other test running beside them, marked `alone`
# (scripts/pytest-split.sh runs them one at a time even when the others share
# workers): failure-detection windows and kills timed against them, decisions taken on
# measured load (shedding, autoscale, the balancers' skew, a caller's share of a
# node), timings of their own (view rates, ack sealing), and machine-wide checks
# (network namespaces).
ALONE = (
    "tests/chaos/",
    "tests/cluster/test_bounds_live.py",
    "tests/cluster/test_byte_bounds_live.py",
    "tests/cluster/test_durable_live.py",
    "tests/cluster/test_elastic.py",
    "tests/cluster/test_failover.py",
    "tests/cluster/test_fairness_live.py",
    "tests/cluster/test_hostile_inflight.py",
    "tests/cluster/test_hostile_limits.py",
    "tests/cluster/test_hostile_live.py",
    "tests/cluster/test_hostile_push.py",
    "tests/cluster/test_hostile_streams.py",
    "tests/cluster/test_mapper_ack_sealing_live.py",
    "tests/cluster/test_member_attacks_live.py",
    "tests/cluster/test_restart.py",
    "tests/cluster/test_restart_up.py",
    "tests/cluster/test_share_return.py",
    "tests/cluster/test_skew_live.py",
    "tests/cluster/test_split_live.py",
    "tests/cluster/test_status_verdict.py",
    "tests/cluster/test_view_rate_live.py",
)


def rotation() -> int:
    import time
    chosen = os.environ.get("FLOE_ROTATION")
    return int(chosen) % SEED_SHARE if chosen else int(time.time() // 86400) % SEED_SHARE


def in_fast_tier(item, turn: int) -> bool:
    if item.nodeid.split("[")[0] in SMOKE:
        return True
    if any(item.get_closest_marker(m) for m in ("multiprocess", "spark", "chaos", "slow")):
        return False
    seed = getattr(getattr(item, "callspec", None), "params", {}).get("seed")
    return not isinstance(seed, int) or seed % SEED_SHARE == turn


def pytest_configure(config):
    # pytest-xdist's workers collect on their own and inherit this environment: every
    # one takes the rotation the run started with, so they collect the same tests
    # (the same fast tier) even across midnight.
    os.environ.setdefault("FLOE_ROTATION", str(rotation()))


def pytest_collection_modifyitems(config, items):
    import pytest
    turn = rotation()
    for item in items:
        if in_fast_tier(item, turn):
            item.add_marker(pytest.mark.fast)
        if item.nodeid.startswith(ALONE) and item.get_closest_marker("multiprocess"):
            item.add_marker(pytest.mark.alone)


def pytest_report_header(config):
    return (f"fast tier: seeded simulation runs with seed % {SEED_SHARE} == {rotation()} "
            f"(FLOE_ROTATION picks another)")
