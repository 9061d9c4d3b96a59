"""Structured events: one JSON line per protocol event, beside the human log.

What measurements and tests read (the chaos timeline, the handoff and balance
benchmarks), so they never depend on the wording of a log line. Each line holds the
wall-clock time `t` (seconds, `time.time()`), the `kind`, the member name the process
runs as (`node`), the id it was started with (`process`), the `stimulus` that caused
it (the node machine's name for the event it handled; every record of one stimulus
carries the same) and the event's own fields.

Kinds: started, stopped, left, suspected, detected, taken_over, applying_again,
re_replicated, fenced, lost, handoff_prepared, handoff_committed, handoff_aborted, split,
overloaded, relieved, checkpoints_failing, checkpoints_resumed, view_absorbed,
removal_refused (node.core.evidence: ring views a member forged, or could have),
retired, retired_handed_over, retired_deleted (node.runtime.retiring: what a removed
member held, kept until r+1 others hold it).
"""

from __future__ import annotations

import json
import time
from collections import Counter


class EventLog:
    def __init__(self, path: str = "", process: str = "") -> None:
        self.process = process
        self.counts: Counter[str] = Counter()   # events recorded per kind (/metrics)
        # Line-buffered append: a restarted process continues the same file, and a
        # line is on disk when the event is (readers poll it during a run).
        self._file = open(path, "a", buffering=1, encoding="utf-8") if path else None

    def record(self, kind: str, node: str, **fields) -> float:
        """Write one event now; returns its time (what the human log line quotes)."""
        t = time.time()
        self.counts[kind] += 1
        if self._file is not None:
            self._file.write(json.dumps({"t": t, "kind": kind, "node": node,
                                         "process": self.process, **fields},
                                        default=_plain) + "\n")
        return t

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _plain(value):
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value)
    return str(value)
