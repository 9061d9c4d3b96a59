"""Pruning the routing plans kept for replayable sources (mapper/plans.py), so that
their directories stay bounded: a plan goes once no attempt can replay what it routed.

- A Spark micro-batch's plan (`<checkpoint>/floe-plans/<batch id>`): Spark replays
  only the batch after the last one its commit log holds (`<checkpoint>/commits/<id>`),
  never an earlier one, so once batch N is planned every plan of a batch below N that
  is committed goes (`prune_batches`); and whatever is committed or not, none more
  than `keep` batches behind N stays.
- A file's plan under `floe feed` (`feed-plans/<source>.plan`): a rerun of the same
  file replays its seqs until the nodes forget the source, idle for --source-expiry
  (7 days by default); a rerun after that counts anew, whatever plan it takes. Reading
  a plan marks it used (its mtime), and plans unused for that long go
  (`prune_idle`); past `most` plans, the least recently used go first (a rerun of
  such a file within the expiry would then draw pieces by a new plan and could count
  a word it had sent before twice: the bound is set far above the files a cluster is
  fed in a week).

Temporary files a crash left behind (`.<name>...tmp`) go with them once an hour old.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STALE_TMP = 3600.0          # seconds: a temporary file this old is a crash's leftover


def _stale_tmp(entry: Path, now: float) -> bool:
    if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
        return False
    try:
        return now - entry.stat().st_mtime > STALE_TMP
    except FileNotFoundError:
        return False


def prune_batches(directory: Path, current: int, commits: Path | None, keep: int,
                  now: float | None = None) -> list[int]:
    """Remove the plans of batches below `current` that `commits` (a Spark commit log
    directory) holds, and of any batch `keep` or more behind `current`; returns the
    batch ids removed."""
    now = time.time() if now is None else now
    removed: list = []
    for entry in _entries(directory, now):
        if not entry.name.isdigit():
            continue
        batch = int(entry.name)
        committed = commits is not None and (commits / entry.name).exists()
        if (batch < current and committed) or batch <= current - keep:
            entry.unlink(missing_ok=True)
            removed.append(batch)
    return sorted(removed)


def _entries(directory: Path, now: float) -> list[Path]:
    """The directory's entries, once temporary files a crash left are removed."""
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return []
    for entry in entries:
        if _stale_tmp(entry, now):
            entry.unlink(missing_ok=True)
    return [e for e in entries if e.exists()]


def mark_used(path: Path) -> None:
    """A plan was read for a rerun: its source is live again at the nodes."""
    try:
        os.utime(path)
    except OSError:
        pass                 # a plan on a read-only copy: kept as it is


def prune_idle(directory: Path, idle: float, most: int, suffix: str = ".plan",
               now: float | None = None) -> list[str]:
    """Remove the plans (`*suffix`) unused for `idle` seconds, then the least recently
    used beyond `most`; returns the names removed."""
    now = time.time() if now is None else now
    kept, removed = [], []
    for entry in _entries(directory, now):
        if not entry.name.endswith(suffix) or entry.name.startswith("."):
            continue
        try:
            used = entry.stat().st_mtime
        except FileNotFoundError:
            continue
        if now - used > idle:
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
        else:
            kept.append((used, entry.name, entry))
    kept.sort(reverse=True)                     # the most recently used first
    for _, name, entry in kept[most:]:
        entry.unlink(missing_ok=True)
        removed.append(name)
    return sorted(removed)
