"""Files private from birth: directories 0700, files 0600, whatever the umask.

What a node or `floe up` writes (data directories, logs, segment logs, the cluster's
records) holds keys, source ids and counts: it is created private rather than
chmod-ed after writing, so it is never readable by others, not even for an instant.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE, FILE_MODE = 0o700, 0o600


def private_dir(path: str | os.PathLike) -> Path:
    """`path` and every missing parent, created 0700 (an existing one is left as it
    is: it is not ours to change)."""
    path = Path(path)
    missing = []
    for parent in (path, *path.parents):
        if parent.exists():
            break
        missing.append(parent)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            pass                       # made meanwhile by another process
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    return path


def open_private(path: str | os.PathLike, mode: str = "ab", **kwargs):
    """open(path, mode), a file it creates being 0600 (`mode`: "w", "a", with "b"
    or not)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def write_private(path: str | os.PathLike, text: str, *, sync: bool = False) -> None:
    """Write `text` to `path` whole (created 0600), synced if asked."""
    with open_private(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())


def exposed(root: str | os.PathLike[str]) -> list[str]:
    """Everything under `root` (itself included) that its group or others may
    read, write or enter, with its mode: what should never be there."""
    found = []
    for top, dirs, files in os.walk(root):
        for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
            try:
                mode = os.lstat(name).st_mode
            except FileNotFoundError:
                continue               # deleted meanwhile (a compacted segment)
            if mode & 0o077 and not os.path.islink(name):
                found.append(f"{name} {oct(mode & 0o777)}")
    return sorted(set(found))
