"""`floe feed`: the words of text files into the ring, exactly once across reruns.

Every input is checked before anything is sent: a missing or unreadable file, a
directory, or one that looks binary (a NUL byte in its first 8 KiB, or a .gz that
does not decompress) is refused, naming it (`force` feeds a binary-looking file
anyway). Each file is then its own source, named after what it is where it lies
(absolute path, size, modification time) by a keyed hash: the key is a secret made
once and kept (0600) in the cluster's directory (`feed.key`), so nobody without it can
predict a file's source id and pre-empt its seqs, while a rerun finds the same id. Its
words go out with seqs 1, 2, ... in
order, so a rerun after a failure or an interrupt sends the same (source, seq) pairs
again and every range drops what it applied before. The same file fed again,
unchanged, is therefore not counted again (`again` names a fresh source instead).
A node forgets a source idle for `--source-expiry` (7 days by default); a rerun after
that counts again. Standard input cannot be read twice: it is a fresh source each
time.

On a ring whose balancer shares keys, a file's words go to pieces by a routing plan
(floering.mapper.plans) made from its first chunk and kept beside the key
(`feed-plans/<source>.plan`, 0600) before its first word goes out: a rerun reads it,
so every seq goes to the piece it first went to, whatever the ring became meanwhile.
A plan unused for the nodes' default --source-expiry goes (a rerun then counts anew),
and past MAX_PLANS the least recently used (floering.mapper.kept_plans).

A word longer than MAX_WORD_BYTES (no word of any language; a run of letters in a
file that is not text) is refused alone, named on standard error, and the rest of the
file is fed: skipped the same way on every rerun, it moves no other word's seq.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import os
import secrets
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from floering.mapper import words_of_lines

SNIFF_BYTES = 8192
CHUNK_WORDS = 65536
MAX_WORD_BYTES = 1024      # a batch of --batch-size such words stays far below 4 MiB
KEY_FILE = "feed.key"
KEY_BYTES = 32
SHOWN_REFUSALS = 10        # refused words named one by one; past that, counted
PLAN_IDLE = 7 * 86400.0    # a file's plan unused this long goes (the nodes' --source-expiry)
MAX_PLANS = 10_000         # and past this many, the least recently used


class FeedRefused(ValueError):
    """An input that cannot be fed as it is: what and why."""


@dataclass(frozen=True)
class Input:
    path: str            # as given; "-" for standard input
    size: int            # bytes on disk (0 for standard input)
    source: str


def feed_key(directory: str | Path) -> bytes:
    """The secret that names a cluster's feed sources: read from `directory`/feed.key,
    or made there (0600, in a 0700 directory made if missing) the first time."""
    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = d / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) != KEY_BYTES:
            raise FeedRefused(f"{path} is not a feed key ({len(key)} bytes, not "
                              f"{KEY_BYTES}); remove it to make a new one") from None
        return key
    key = secrets.token_bytes(KEY_BYTES)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    return key


def check_inputs(paths: list[str], force: bool = False, again: bool = False,
                 key: bytes | None = None) -> list[Input]:
    """Every input, checked and named (by a hash keyed with `key`, see feed_key; None:
    a fresh random key, so nothing deduplicates across runs), or FeedRefused for the
    first bad one."""
    key = key if key is not None else secrets.token_bytes(KEY_BYTES)
    return [_checked(p, force, again, key) for p in paths]


def _checked(path: str, force: bool, again: bool, key: bytes) -> Input:
    if path == "-":
        return Input(path, 0, f"feed-stdin-{uuid.uuid4().hex}")
    try:
        st = os.stat(path)
        if Path(path).is_dir():
            raise FeedRefused(f"{path} is a directory, not a text file")
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                head = fh.read(SNIFF_BYTES)
    except FeedRefused:
        raise
    except (OSError, EOFError) as exc:
        raise FeedRefused(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    if b"\0" in head and not force:
        raise FeedRefused(f"{path} looks binary (a NUL byte in its first {SNIFF_BYTES} "
                          f"bytes); --force feeds it anyway")
    identity = f"{Path(path).resolve()}|{st.st_size}|{st.st_mtime_ns}"
    if again:
        identity += f"|{uuid.uuid4().hex}"
    digest = hmac.new(key, identity.encode(), hashlib.sha256).hexdigest()[:32]
    return Input(path, st.st_size, f"feed-{digest}")


def _open_text(path: str):
    if path == "-":
        return sys.stdin
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


class Progress:
    """A line on standard error every `every` seconds: words, rate, share of the
    inputs' bytes read, and the time left at that pace."""

    def __init__(self, total_bytes: int, every: float = 1.0, out=sys.stderr,
                 show: bool = True) -> None:
        self.total, self.every, self.out, self.show = total_bytes, every, out, show
        self.started = self.shown = time.monotonic()
        self.words = 0
        self.done_bytes = 0          # of the files finished
        self.refused = 0             # words over MAX_WORD_BYTES, not sent

    def refuse(self, path: str, size: int) -> None:
        self.refused += 1
        if self.refused <= SHOWN_REFUSALS:
            print(f"floe feed: {path}: a word of {size:,} bytes refused (a word is at "
                  f"most {MAX_WORD_BYTES:,} bytes); the rest is fed", file=self.out,
                  flush=True)

    def update(self, words: int, at_bytes: int) -> None:
        self.words += words
        now = time.monotonic()
        if not self.show or now - self.shown < self.every:
            return
        self.shown = now
        rate = self.words / (now - self.started)
        read = self.done_bytes + at_bytes
        line = f"floe feed: {self.words:,} words, {rate:,.0f}/s"
        if self.total:
            share = min(1.0, read / self.total)
            left = (now - self.started) * (1 - share) / share if share else 0.0
            line += f", {share:.0%} of the input read, about {left:.0f}s left"
        print(line, file=self.out, flush=True)


def feed(client, inputs: list[Input], progress: Progress, plans: Path | None = None) -> int:
    """Send every input's words, each file as its source; returns the words sent.
    Each file is flushed (acknowledged by r+1) before the next begins. On a ring
    whose balancer shares keys, a file's words go to pieces by a routing plan made
    from its first chunk and kept in `plans` (see `file_plan`)."""
    total = 0
    for item in inputs:
        bound = False
        with _open_text(item.path) as fh:
            raw = getattr(fh, "buffer", None) if item.path != "-" else None
            chunk: list[str] = []
            for word in words_of_lines(fh):
                if len(word) > MAX_WORD_BYTES:        # letters: one byte each
                    progress.refuse(item.path, len(word))
                    continue
                chunk.append(word)
                if len(chunk) >= CHUNK_WORDS:
                    if not bound:
                        client.rebind(item.source, 1, file_plan(client, item, chunk, plans))
                        bound = True
                    client.emit_many(chunk)
                    total += len(chunk)
                    progress.update(len(chunk), raw.tell() if raw is not None else 0)
                    chunk = []
            if not bound:
                client.rebind(item.source, 1, file_plan(client, item, chunk, plans))
            client.emit_many(chunk)
            total += len(chunk)
            progress.update(len(chunk), item.size)
        client.flush()
        progress.done_bytes += item.size
    if progress.refused > SHOWN_REFUSALS:
        print(f"floe feed: {progress.refused:,} words refused in all as longer than "
              f"{MAX_WORD_BYTES:,} bytes", file=progress.out, flush=True)
    return total


def file_plan(client, item: Input, first: list[str], plans: Path | None):
    """The routing plan of a file (mapper/plans.py): the one kept for its source in
    `plans`, or one made from its first chunk of words `first` on the client's ring and
    kept there (0600, whole or not at all) before any word goes out. A rerun of the
    same file therefore sends every seq to the piece it went to, whatever the ring
    became meanwhile. Without `plans` a plan kept nowhere could not be found again:
    pieces 0 and 1 evenly, which needs none (standard input, a fresh source each time,
    keeps none). None when the ring's balancer shares no keys."""
    from floering.mapper.plans import Plan, plan_of_keys
    from floering.wire.balancers import balancer
    ring = client.ring
    policy = balancer(ring.balancer)
    if policy.pieces == 1:
        return None
    if item.path == "-":                  # a fresh source each time: never sent again
        return plan_of_keys(policy, ring, first)
    if plans is None:
        return None
    from floering.mapper.kept_plans import mark_used, prune_idle
    path = Path(plans) / f"{item.source}.plan"
    try:
        plan = Plan.decode(path.read_bytes())
        mark_used(path)
        return plan
    except FileNotFoundError:
        pass
    plan = plan_of_keys(policy, ring, first)
    _keep(path, plan.encode())
    prune_idle(Path(plans), PLAN_IDLE, MAX_PLANS)
    return plan


def _keep(path: Path, data: bytes) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
