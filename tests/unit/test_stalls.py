"""The stall probe (chaos.stalls) names an event-loop step over its bound, in CPU time."""

import subprocess
import sys

from floering.chaos.stalls import report
from floering.floe.cluster import node_env

SCRIPT = """
import asyncio, time
from floering.chaos.stalls import install_probe
install_probe()

async def holds_the_loop():
    t = time.thread_time()
    while time.thread_time() - t < 0.03:
        pass

async def yields():
    for _ in range(50):
        await asyncio.sleep(0)

async def main():
    await asyncio.gather(holds_the_loop(), yields())

asyncio.run(main())
"""


def test_a_step_over_the_bound_is_logged_with_its_task_and_reported(tmp_path):
    env = dict(node_env(), FLOE_STALL_MS="5")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stderr.splitlines() if line.startswith("SLOWSTEP")]
    assert len(steps) == 1 and steps[0].endswith(" holds_the_loop"), done.stderr
    log = tmp_path / "n0.log"
    log.write_text(done.stderr)
    lines = report([log])
    assert lines[0].startswith("n0: 1 steps over the bound, longest ")
    assert float(lines[0].split("longest ")[1].split()[0]) >= 30.0
    assert any(line.strip().endswith("holds_the_loop") for line in lines[2:])
    assert "once serving 1, longest " in lines[0]       # no READY line: it counts


def test_steps_before_a_node_is_ready_are_told_apart(tmp_path):
    log = tmp_path / "n1.log"
    log.write_text("SLOWSTEP 1.00 cpu=14.0 wall=20.0 gc=0.1 serve\n"
                   "READY n1 127.0.0.1:1\n"
                   "SLOWSTEP 2.00 cpu=6.5 wall=7.0 gc=0.0 _apply_loop\n")
    lines = report([log])
    assert lines[0] == ("n1: 2 steps over the bound, longest 14.0 ms CPU; once serving 1, "
                        "longest 6.5 ms")
    assert lines[1] == "once serving, every node: 1 steps over the bound, longest 6.5 ms CPU"
