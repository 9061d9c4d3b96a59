"""What reads cost when keys are shared: get, top and scan on a ring whose hot keys
are spread over pieces, against the same data on a ring that shares nothing.

One run, one fresh local ring per policy (4 nodes, r=1, mutual TLS, 8 tokens per
node): the same Zipf 1.1 stream over 10,000 keys is fed tuple by tuple, so that the
sharing policies spread its hot keys (under `dkg` and `wchoices` its hottest key
lands on every node; under `pkg` every key has two pieces), then, with the feed over
and the nodes idle, each read is timed one call after another:

- `get` of the hottest key (shared by every sharing policy) and of a cold one (on
  one node under `dkg`, but asked for at each of the pieces the policy may use:
  2 for `pkg`, 16 for the others);
- `top(10)`: under `none` each node's own top 10, merged; under a sharing policy a
  whole streamed scan, merged and ranked, since a key's pieces rank apart;
- a whole `scan()`.

The nodes run with a long `--piece-idle`, so no piece is merged back into its key
while the reads are timed: the cost measured is that of keys spread as the feed
left them. Every read is checked against a Counter of the stream. Printed: the
median and p99 of each read per policy, and each median over `none`'s.

    python -m floering.chaos.read_cost
    python -m floering.chaos.read_cost --policies none,dkg --gets 100 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter

from floering.floe.cluster import LocalCluster
from floering.chaos.skew import TOKENS_PER_NODE, raw_holders, workload
from floering.mapper import RingClient
from floering.wire.balancers import BALANCERS

READS = ("get hot", "get cold", "top 10", "scan")


def _timed(call, times: int) -> tuple[list[float], object]:
    call()                                    # channels open, reducer loaded: not timed
    spent, result = [], None
    for _ in range(times):
        started = time.perf_counter()
        result = call()
        spent.append(time.perf_counter() - started)
    return sorted(spent), result


def _ms(spent: list[float], q: float) -> float:
    return round(1000 * spent[min(len(spent) - 1, int(q * len(spent)))], 2)


def run_policy(policy: str, nodes: int, tuples: int, gets: int, scans: int,
               seed: int = 1) -> dict:
    keys = workload("zipf-1.1", tuples, seed)
    expect = Counter(keys)
    ranked = expect.most_common()
    hot, cold = ranked[0][0], ranked[len(ranked) // 2][0]
    with tempfile.TemporaryDirectory(prefix="floe-reads-") as tmp, \
            LocalCluster.up(nodes, 1, workdir=tmp, balancer=policy,
                            tokens_per_node=TOKENS_PER_NODE,
                            extra_args=["--piece-idle", "3600"]) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls("client"), combine=False) as client:
            for at in range(0, len(keys), 10_000):
                client.emit_many(keys[at:at + 10_000])
            client.flush()
            holders = raw_holders(cluster)
            spent = {}
            spent["get hot"], got_hot = _timed(lambda: client.get(hot), gets)
            spent["get cold"], got_cold = _timed(lambda: client.get(cold), gets)
            spent["top 10"], top = _timed(lambda: client.top(10), scans)
            spent["scan"], scanned = _timed(client.scan_all, scans)
    best = [n for _, n in ranked[:10]]
    exact = (got_hot == expect[hot] and got_cold == expect[cold] and scanned == dict(expect)
             and [state for _, state in top] == best
             and all(expect[k] == state for k, state in top))
    row = {"policy": policy, "nodes": nodes, "tuples": len(keys), "keys": len(expect),
           "hot_key": hot, "hot_share": round(expect[hot] / len(keys), 3),
           "hot_nodes": len(holders.get(hot, ())), "cold_nodes": len(holders.get(cold, ())),
           "shared_keys": sum(len(v) > 1 for v in holders.values()),
           "pieces_asked": BALANCERS[policy].pieces, "exact": exact}
    for read in READS:
        row[f"{read} p50 ms"] = _ms(spent[read], 0.5)
        row[f"{read} p99 ms"] = _ms(spent[read], 0.99)
    return row


def print_rows(rows: list[dict]) -> None:
    base = next((r for r in rows if r["policy"] == "none"), None)
    print(f"{'policy':9} {'hot on':>6} {'shared':>6} " + " ".join(
        f"{read + ' p50/p99 ms':>22}" for read in READS) + "  exact")
    for r in rows:
        print(f"{r['policy']:9} {r['hot_nodes']:>6} {r['shared_keys']:>6} " + " ".join(
            f"{r[read + ' p50 ms']:>10.2f} / {r[read + ' p99 ms']:>9.2f}" for read in READS)
            + f"  {r['exact']}")
    if base is None:
        return
    print("\nmedian over none's:")
    print(f"{'policy':9} " + " ".join(f"{read:>10}" for read in READS))
    for r in rows:
        print(f"{r['policy']:9} " + " ".join(
            f"{r[read + ' p50 ms'] / base[read + ' p50 ms']:>9.1f}x" for read in READS))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m floering.chaos.read_cost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="none,pkg,dkg,wchoices",
                   help="comma-separated balancers, none first for the ratios "
                        "(default: none,pkg,dkg,wchoices)")
    p.add_argument("--nodes", type=int, default=4, help="nodes per ring (default 4)")
    p.add_argument("--tuples", type=int, default=200_000,
                   help="tuples of Zipf 1.1 over 10,000 keys fed (default 200000)")
    p.add_argument("--gets", type=int, default=200, help="timed gets of each key (default 200)")
    p.add_argument("--scans", type=int, default=10,
                   help="timed top(10)s and scans each (default 10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    policies = [x for x in args.policies.split(",") if x]
    for x in policies:
        if x not in BALANCERS:
            p.error(f"unknown policy {x!r}: one of {', '.join(sorted(BALANCERS))}")
    rows = []
    for policy in policies:
        rows.append(run_policy(policy, args.nodes, args.tuples, args.gets, args.scans,
                               args.seed))
        r = rows[-1]
        print(f"# {policy}: hottest key on {r['hot_nodes']} nodes, {r['shared_keys']} keys "
              f"shared, exact {r['exact']}", flush=True)
    print()
    print_rows(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
