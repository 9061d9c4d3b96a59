"""Measure recovery latency on a real local cluster under a steady feed.

    python -m floering.chaos.recovery [--nodes 4] [--replicas 1] [--trials 10] [--kill 1] [--seed 1]

A shortcut to the chaos harness (chaos.harness): each trial is a round on a fresh
cluster under a Zipf load, with `--kill` non-adjacent nodes SIGKILLed at once. It
prints, per trial, the time from the kill to the last heir taking the ranges over
("takeover") and to the last range applying new tuples again ("applying"), and whether
the counts matched exactly what the mappers had acknowledged. The full result (JSON,
plots) goes to --out.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from floering.floe.cluster import LocalCluster
from floering.chaos.corpus import kjv_lines
from floering.chaos.harness import Progress, run_scenario
from floering.chaos.scenarios import Fault, Load, Round, Scenario
from floering.mapper import RingClient, split_words


def recovery_scenario(nodes: int, replicas: int, kill: int, trials: int,
                      rate: float = 5000.0) -> Scenario:
    target = "one" if kill == 1 else "non-adjacent"
    rounds = tuple(Round((Fault("kill", target, at=1.5, count=kill),), f"{kill} at once")
                   for _ in range(trials))
    return Scenario(f"recovery-n{nodes}-r{replicas}-k{kill}",
                    f"{kill} non-adjacent SIGKILLs at once, {trials} trials", nodes, replicas,
                    rounds, Load("zipf", rate=rate, chunk=max(100, int(rate / 20))),
                    duration=3.0)


def false_positives(nodes: int, replicas: int, seconds: float, words: list[str]) -> tuple[int, int]:
    """Run a healthy cluster busy (full-speed feed) then idle; return how many nodes
    were wrongly declared dead in each phase."""
    with tempfile.TemporaryDirectory(prefix="floe-fp-") as workdir:
        with LocalCluster.up(nodes, replicas, workdir=workdir) as cluster:
            with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    client.emit_many(words[:50_000])
                client.flush()
                busy = len(client.refresh_ring().removed)
                time.sleep(seconds)
                idle = len(client.refresh_ring().removed) - busy
    return busy, idle


def _worst(timelines: list[dict], key: str) -> str:
    values = [t[key] for t in timelines]
    if not values or None in values:
        return "never"
    return f"{max(values):.0f} ms"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kill", type=int, default=1, help="non-adjacent nodes killed at once")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="where the JSON result and plots go (default: a new "
                                      "temporary directory)")
    parser.add_argument("--false-positives", type=float, metavar="SECONDS",
                        help="instead: run a healthy cluster busy, then idle, this long each, "
                             "and count wrong declarations")
    args = parser.parse_args(argv)
    words = [w for line in kjv_lines(5000) for w in split_words(line)]
    if args.false_positives:
        busy, idle = false_positives(args.nodes, args.replicas, args.false_positives, words)
        print(f"false declarations: {busy} in {args.false_positives:.0f}s at full load, "
              f"{idle} in {args.false_positives:.0f}s idle")
        return 0 if busy == idle == 0 else 1
    scenario = recovery_scenario(args.nodes, args.replicas, args.kill, args.trials)
    out = args.out or tempfile.mkdtemp(prefix="floe-recovery-")
    result = run_scenario(scenario, args.seed, out, progress=Progress(), plots=True)
    for r in result["rounds"]:
        tls = r["timelines"]
        print(f"trial {r['index']}: killed {','.join(t['victim'] for t in tls)}  takeover "
              f"{_worst(tls, 'taken_over_ms')}  applying {_worst(tls, 'applying_ms')}  "
              f"exact={r['ok']}"
              + (f"  ({'; '.join(r['errors'])})" if r["errors"] else ""), flush=True)
    s = result["summary"]
    print(f"n={args.nodes} r={args.replicas} kill={args.kill}: takeover p50 "
          f"{s['taken_over']['p50']} ms max {s['taken_over']['max']} ms; applying again p50 "
          f"{s['applying']['p50']} ms max {s['applying']['max']} ms; all exact: "
          f"{result['ok']}; results in {out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
