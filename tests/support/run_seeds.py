"""Run many simulation seeds outside pytest, on several processes; print every failing
seed with its fault log and a summary. The long run recorded in docs/simulation.md:

    .venv/bin/python -m tests.support.run_seeds --jobs 2 failure=0:6000 handoff=0:4000 \\
        split=0:4000 restart=0:3000 shed=0:2000 slow=0:1000 durable=0:3000 cluster=0:2000
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

from tests import test_partitions as partitions
from tests import test_simulation as scenarios

KINDS = {"failure": scenarios.run_seed, "handoff": scenarios.run_handoff_seed,
         "split": scenarios.run_split_seed, "restart": scenarios.run_restart_seed,
         "shed": scenarios.run_shed_seed, "slow": scenarios.run_slow_seed,
         "forged": scenarios.run_forged_seed, "durable": scenarios.run_durable_seed,
         "cluster": scenarios.run_cluster_crash_seed, "balancer": scenarios.run_balancer_seed,
         "storm": scenarios.run_storm_seed, "fold": scenarios.run_fold_seed,
         "combine": scenarios.run_combine_seed, "starved": scenarios.run_starved_chain_seed,
         "partition": partitions.run_partition_seed}


def run_one(job: tuple[str, int]) -> tuple[str, int, str]:
    kind, seed = job
    try:
        KINDS[kind](seed)
    except AssertionError as exc:
        return kind, seed, str(exc)
    return kind, seed, ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ranges", nargs="+", help="kind=first:end, kinds: " + ", ".join(KINDS))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    jobs = []
    for spec in args.ranges:
        kind, _, span = spec.partition("=")
        first, _, end = span.partition(":")
        if kind not in KINDS:
            parser.error(f"unknown kind {kind!r}")
        jobs += [(kind, seed) for seed in range(int(first), int(end))]
    started = time.monotonic()
    failed = []
    with multiprocessing.Pool(args.jobs) as pool:
        for done, (kind, seed, error) in enumerate(pool.imap_unordered(run_one, jobs, 8), 1):
            if error:
                failed.append((kind, seed))
                print(f"FAILED {kind} seed {seed}: {error[-2000:]}", flush=True)
            if done % 1000 == 0:
                print(f"{done}/{len(jobs)} done, {len(failed)} failed, "
                      f"{time.monotonic() - started:.0f} s", flush=True)
    print(f"{len(jobs) - len(failed)} passed, {len(failed)} failed in "
          f"{time.monotonic() - started:.0f} s: {sorted(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
