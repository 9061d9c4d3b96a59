"""`floe ui` on real processes, seen in a real headless Chromium: a 4-node cluster's ring and
members show; a member SIGKILLed turns dead on the page within 2 s and its ranges are drawn
under other owners. The server's connections are bounded.

The tests here start real node processes; the in-process ones are in
tests/unit/test_webui.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.devtools import Browser, chromium
from tests.support.helpers import ROOT, floe, floe_run
from tests.support.webui_shared import stop, until


MEMBERS = """Array.from(document.querySelectorAll('#members tr.member'))
                .map(r => [r.dataset.node, r.dataset.state])"""


OWNERS = """Array.from(document.querySelectorAll('#ranges path.range'))
               .map(p => [p.dataset.token, p.dataset.owner, p.dataset.lost])"""


# A snapshot as /api/state gives it: n0 hands the first range to n2; the second is lost,
# and n0 keeps its former copy of it until n3's replicas are filled.
DRAWN = {"t": 0, "verdict": "DATA LOST: x", "error": None,
         "ring": {"version": 9, "replication": 1, "reducer": "count", "balancer": "none"},
         "ranges": [{"token": "0x7fffffffffffffff", "start": 0.5, "end": 0.5, "share": 0.5,
                     "primary": "n0", "replicas": ["n3"], "extras": ["n2"], "lost": False},
                    {"token": "0xffffffffffffffff", "start": 0.5, "end": 1.0, "share": 0.5,
                     "primary": "n3", "replicas": ["n0"], "extras": ["n0"], "keeping": ["n0"],
                     "lost": True}],
         "members": [{"node_id": "n0", "state": "serving"},
                     {"node_id": "n3", "state": "leaving"}],
         "events": [{"t": 0, "kind": "handoff_prepared", "node": "n0", "text": "x"}]}


def start_ui(cwd) -> tuple[subprocess.Popen, str]:
    ui = subprocess.Popen([sys.executable, "-m", "floering.floe.cli", "ui", "--port", "0"],
                          cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'proto'}"))
    line = ui.stdout.readline()
    if not line.startswith("floe ui: http://127.0.0.1:"):
        ui.kill()
        raise AssertionError(line + ui.stderr.read())
    return ui, line.split()[2]


@pytest.mark.multiprocess
@pytest.mark.skipif(chromium() is None, reason="chromium is not installed "
                                              "(scripts/setup.sh installs it, as root)")
def test_the_page_shows_the_ring_and_a_killed_member_turning_dead(tmp_path):
    ui = browser = None
    try:
        floe(tmp_path, "up", "--nodes", "4", "--memory")
        pids = {n["node_id"]: n["pid"] for n in json.loads(
            floe(tmp_path, "status", "--json"))["nodes"]}
        ui, url = start_ui(tmp_path)
        browser = Browser(url, tmp_path / "chromium")
        until(lambda: browser.evaluate(MEMBERS) == [[f"n{i}", "serving"] for i in range(4)],
              20, "4 serving members on the page")
        ranges = until(lambda: browser.evaluate(OWNERS), 10, "the ranges drawn")
        assert len(ranges) == 32 and {o for _, o, _ in ranges} == {"n0", "n1", "n2", "n3"}
        assert browser.evaluate("document.querySelectorAll('#tokens circle').length") == 32
        assert browser.evaluate("document.querySelectorAll('#replicas path').length") == 32
        assert browser.evaluate("document.getElementById('verdict').textContent") \
            .startswith("HEALTHY: 4 of 4")
        victims = {t for t, o, _ in ranges if o == "n1"}

        os.kill(pids["n1"], signal.SIGKILL)
        killed = time.monotonic()
        until(lambda: ["n1", "dead"] in browser.evaluate(MEMBERS), 5, "n1 dead on the page",
              every=0.02)
        shown_dead = time.monotonic() - killed
        assert shown_dead < 2.0, f"n1 turned dead on the page after {shown_dead:.2f}s"

        def moved():
            now = {t: (o, lost) for t, o, lost in browser.evaluate(OWNERS)}
            return all(t in now and now[t][0] in ("n0", "n2", "n3") and now[t][1] == "0"
                       for t in victims) and "n1" not in {o for o, _ in now.values()}
        until(moved, 20, "n1's ranges drawn under the other members", every=0.1)
        kinds = until(lambda: {"detected", "taken_over"} <= set(browser.evaluate(
            "Array.from(document.querySelectorAll('#events li')).map(l => l.dataset.kind)"))
            and browser.evaluate("document.querySelectorAll('#timeline rect.mark').length"),
            10, "the detection and takeover on the timeline")
        assert kinds >= 2
        assert browser.evaluate(MEMBERS).count(["n1", "dead"]) == 1
        # the page's own drawing of a handoff in flight and of a lost range, rendered
        # and read at once (the next read of the ring redraws the real one)
        drawn = browser.evaluate(f"""(render({json.dumps(DRAWN)}),
            [document.querySelectorAll('#extras path.handoff').length,
             document.querySelector('#extras path.handoff').dataset.node,
             document.querySelector('#extras path.keeping').dataset.node,
             document.querySelector('#ranges path[data-lost="1"]').getAttribute('stroke'),
             document.querySelectorAll('#replicas path').length,
             document.querySelector('#members tr[data-node="n3"]').dataset.state])""")
        assert drawn == [1, "n2", "n0", "#000", 2, "leaving"]
        print(f"n1 dead on the page {shown_dead * 1000:.0f} ms after its SIGKILL")
    finally:
        if browser is not None:
            browser.close()
        if ui is not None:
            stop(ui)
        floe_run(tmp_path, "down", "--kill")
    assert ui.returncode == 0, ui.stderr.read()


KEYS = 1_200_000        # n2 holds a third


# The compiled table hands a third of 1,200,000 counts over in ~100 ms, within one read of
# the page, which may never see them in flight; a top-k state per key takes the dict
# path, and its handoff lasts ~0.5 s, several reads.
SLOW_STATE = ("--reducer", "topk")


# Every drawing of a handoff in flight the page makes, recorded by the page itself as
# it draws (a handoff may last between two looks of the test): [arcs, their
# receivers, the leaving member's state on the page].
WATCH_HANDOFFS = """(window.handoffs = [], new MutationObserver(() => {
    const arcs = Array.from(document.querySelectorAll('#extras path.handoff'));
    const row = document.querySelector('#members tr[data-node="n2"]');
    if (arcs.length) window.handoffs.push([arcs.length,
        [...new Set(arcs.map(a => a.dataset.node))].sort().join(','),
        row ? row.dataset.state : '']);
}).observe(document.getElementById('extras'), {childList: true}), true)"""


@pytest.mark.multiprocess
@pytest.mark.skipif(chromium() is None, reason="chromium is not installed "
                                              "(scripts/setup.sh installs it, as root)")
def test_the_page_shows_a_real_leave_handing_its_ranges_over(tmp_path):
    """`floe scale --remove n2` on a ring holding 1,200,000 keys: while n2 hands its
    ranges over, the page draws the handoff in flight (dashed arcs outside the ranges,
    to the members taking them) and n2 as leaving; afterwards no arc is left and n2's
    ranges are drawn under the others."""
    from floering.floe.cluster import LocalCluster
    from floering.mapper import RingClient
    ui = browser = None
    try:
        floe(tmp_path, "up", "--nodes", "3", "--memory", *SLOW_STATE)
        cluster = LocalCluster.load(tmp_path / "floe-cluster.json")
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            client.emit_many(f"key{i}" for i in range(KEYS))
            client.flush(timeout=120)
        ui = subprocess.Popen([sys.executable, "-m", "floering.floe.cli", "ui", "--port",
                               "0", "--interval", "0.1"], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'proto'}"))
        url = ui.stdout.readline().split()[2]
        browser = Browser(url, tmp_path / "chromium")
        until(lambda: browser.evaluate(MEMBERS) == [[f"n{i}", "serving"] for i in range(3)],
              20, "3 serving members on the page")
        assert browser.evaluate(WATCH_HANDOFFS) is True
        floe(tmp_path, "scale", "--remove", "n2")
        seen = browser.evaluate("window.handoffs")
        assert seen, "no handoff was drawn while n2 left"
        assert any(receivers and "n2" not in receivers.split(",")
                   and state == "leaving" for _, receivers, state in seen), seen

        def gone():
            owners = {o for _, o, _ in browser.evaluate(OWNERS)}
            return owners == {"n0", "n1"} and not browser.evaluate(
                "document.querySelectorAll('#extras path.handoff').length")
        until(gone, 20, "n2's ranges under n0 and n1, no handoff left", every=0.1)
        print(f"{len(seen)} drawings of the handoff in flight, e.g. {seen[0]}")
    finally:
        if browser is not None:
            browser.close()
        if ui is not None:
            stop(ui)
        floe_run(tmp_path, "down", "--kill")
    assert ui.returncode == 0, ui.stderr.read()
