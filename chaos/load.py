"""The keys a mapper sends, chunk by chunk, as a pure function of the seed.

Chunk `i` of mapper `m` is always the same list of keys, so the harness rebuilds what a
mapper emitted from the chunk numbers in its journal, without shipping the keys back.

- zipf: ranks drawn with P(k) ~ 1 / (v + k)^s over a fixed vocabulary (s=1.1, v=2.72
  by default), keys "w<rank>";
- corpus: the bundled King James Bible, word after word, from a seeded offset;
- burst: a few words, repeated over and over (one hot range).
"""

from __future__ import annotations

import bisect
import itertools
import random
from functools import lru_cache

from floering.chaos.corpus import kjv_lines
from floering.chaos.scenarios import Load


@lru_cache(maxsize=1)
def corpus_words() -> tuple[str, ...]:
    from floering.mapper import split_words
    return tuple(w for line in kjv_lines() for w in split_words(line))


@lru_cache(maxsize=8)
def zipf_cumulative(s: float, v: float, vocabulary: int) -> tuple[float, ...]:
    return tuple(itertools.accumulate((v + k) ** -s for k in range(1, vocabulary + 1)))


def zipf_probability(load: Load, rank: int) -> float:
    cum = zipf_cumulative(load.zipf_s, load.zipf_v, load.vocabulary)
    return (cum[rank] - (cum[rank - 1] if rank else 0.0)) / cum[-1]


def burst_vocabulary(load: Load, seed: int) -> list[str]:
    """`burst_words` common words of the corpus, chosen by the seed."""
    common = ["lord", "god", "israel", "king", "people", "house", "children", "land",
              "son", "man", "day", "hand", "earth", "name", "heart", "city"]
    return random.Random(f"burst/{seed}").sample(common, min(load.burst_words, len(common)))


def hottest_key(load: Load, seed: int) -> str:
    if load.keys == "zipf":
        return "w0"
    if load.keys == "burst":
        return burst_vocabulary(load, seed)[0]
    return "the"


def chunk_keys(load: Load, seed: int, mapper: int, index: int) -> list[str]:
    rng = random.Random(f"{load.keys}/{seed}/{mapper}/{index}")
    n = load.chunk
    if load.keys == "zipf":
        cum = zipf_cumulative(load.zipf_s, load.zipf_v, load.vocabulary)
        top = cum[-1]
        rnd, find = rng.random, bisect.bisect_right
        return [f"w{min(find(cum, rnd() * top), len(cum) - 1)}" for _ in range(n)]
    if load.keys == "burst":
        return rng.choices(burst_vocabulary(load, seed), k=n)
    words = corpus_words()
    start = (random.Random(f"corpus/{seed}/{mapper}").randrange(len(words)) + index * n) \
        % len(words)
    out = list(words[start:start + n])
    while len(out) < n:                  # wrap around the end of the corpus
        out += words[:n - len(out)]
    return out


def tuple_id(mapper: int, index: int, position: int) -> int:
    """A tuple's unique id (Load.ids): mapper, chunk number, position in the chunk."""
    return (mapper << 48) | (index << 16) | position


def chunk_ids(mapper: int, index: int, size: int) -> list[int]:
    base = (mapper << 48) | (index << 16)
    return [base | position for position in range(size)]
