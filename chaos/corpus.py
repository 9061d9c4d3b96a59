"""The bundled corpus: the King James Bible (public domain), as plain text."""

from __future__ import annotations

import gzip
from pathlib import Path

KJV_PATH = Path(__file__).resolve().parent / "data" / "kjv.txt.gz"


def kjv_lines(limit: int | None = None) -> list[str]:
    with gzip.open(KJV_PATH, "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    return lines if limit is None else lines[:limit]
