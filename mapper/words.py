"""The default map step: lower-cased words (letters and apostrophes inside words)."""

from __future__ import annotations

import re
from typing import Iterable, Iterator

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")


def split_words(line: str) -> list[str]:
    return _WORD.findall(line.lower())


def words_of_lines(lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        yield from _WORD.findall(line.lower())
