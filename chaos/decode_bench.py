"""Decode and apply of one node's batches, payload format 1 against format 2, in one run.

    python -m floering.chaos.decode_bench [--tuples 1000000] [--batch 1000] [--rounds 3]

The same Zipf words (50,000 distinct, counted 1 each) are encoded both ways; each
round times, per format: the mapper's encode, decode alone, decode + apply to the dict state a range keeps
today (format 2 through Columns.to_tuples), and, for format 2, decode + apply to the
compiled state table (floering.node.core.columnar.StateTable) straight from the columns.
The best round of each is printed in M tuples/s, with the payload bytes per tuple.
"""

from __future__ import annotations

import argparse
import time

from floering.chaos.bench import zipf_words
from floering.node.core.batch import decode_batch, encode_batch, encode_payload
from floering.node.core.columnar import KERNEL, StateTable
from floering.node.core.reducers import Count
from floering.node.core.state_store import LayeredState


def timed(fn, payloads) -> float:
    started = time.perf_counter()
    fn(payloads)
    return time.perf_counter() - started


def encoder(encode):
    def run(chunks) -> None:
        for keys in chunks:
            encode(keys, [1] * len(keys))
    return run


def decode_only(payloads) -> None:
    for payload, count in payloads:
        decode_batch(payload, count)


def apply_dict(payloads) -> None:
    state = LayeredState(Count())
    for payload, count in payloads:
        decoded = decode_batch(payload, count)
        keys, values = decoded if type(decoded) is tuple else decoded.to_tuples()
        state.apply(keys, values)


def apply_table(payloads) -> None:
    table = StateTable("count")
    for payload, count in payloads:
        c = decode_batch(payload, count)
        table.apply(c.table_kinds(), c.key_data, c.offsets, c.positions, c.values)


def run(tuples: int, batch: int, rounds: int) -> dict[str, float]:
    words = zipf_words(tuples)
    chunks = [words[i:i + batch] for i in range(0, len(words), batch)]
    formats = {
        "format 1": [(encode_payload(c, [1] * len(c)), len(c)) for c in chunks],
        "format 2": [(encode_batch(c, [1] * len(c)), len(c)) for c in chunks],
    }
    cases = [(f"{name} encode", encoder(encode), chunks)
             for name, encode in (("format 1", encode_payload), ("format 2", encode_batch))]
    cases += [(f"{name} {what}", fn, payloads) for name, payloads in formats.items()
              for what, fn in (("decode", decode_only), ("decode+apply dict", apply_dict))]
    cases.append(("format 2 decode+apply table", apply_table, formats["format 2"]))
    best: dict[str, float] = {}
    for _ in range(rounds):                   # interleaved: load drifts hit every case
        for name, fn, payloads in cases:
            best[name] = min(best.get(name, float("inf")), timed(fn, payloads))
    for name, payloads in formats.items():
        size = sum(len(p) for p, _ in payloads) / tuples
        print(f"{name}: {size:.1f} payload bytes a tuple")
    rates = {name: tuples / seconds / 1e6 for name, seconds in best.items()}
    for name, rate in rates.items():
        print(f"{name:32s} {rate:7.2f} M tuples/s")
    print(f"(table kernel: {KERNEL}; {tuples:,} tuples in batches of {batch:,}, best of "
          f"{rounds})")
    return rates


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tuples", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    run(args.tuples, args.batch, args.rounds)


if __name__ == "__main__":
    main()
