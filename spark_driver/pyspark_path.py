"""Import the installed pyspark and py4j rather than Spark's zips of them, when they are
the same version.

Spark puts $SPARK_HOME/python/lib/pyspark.zip and py4j-*-src.zip at the head of the
Python path of a spark-submit driver and of its Python daemon (so of every worker),
ahead of PYTHONPATH and site-packages. Python compiles a module read from a zip on
every import and caches no bytecode: pyspark.sql and pyspark.sql.streaming took 1.4-1.6
s of CPU from the zip against 0.4-0.5 s from the pip-installed copy, the daemon's
pyspark.daemon 1.6 s against 0.3 s, each forked worker's pyspark.worker 0.23-0.26 s
against 0.02-0.03 s (docs/spark.md). Where the installed package (with its bytecode)
has the zip's version, moving the zip to the end of the path changes which copy of the
same files is read, not what runs. A different version, or none installed: the zip
stays where Spark put it, as it matches Spark's JVM.

Only the process's own sys.path changes, before pyspark's first import; Spark's
workers inherit it, forked from the daemon (spark_driver.daemon).
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

# (package, how Spark's zip of it is named)
ZIPS = (("pyspark", re.compile(r"pyspark\.zip")), ("py4j", re.compile(r"py4j-.*-src\.zip")))
_VERSION = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", re.M)


def prefer_installed(path: list[str] | None = None) -> str:
    """Move Spark's pyspark and py4j zips behind the installed packages of the same
    version, in `path` (default sys.path); returns what it did, for a log line."""
    path = sys.path if path is None else path
    if "pyspark" in sys.modules and path is sys.path:
        return "already imported"
    said = []
    for package, name in ZIPS:
        zips = [e for e in path if isinstance(e, str) and name.fullmatch(Path(e).name)
                and Path(e).is_file()]
        if not zips:
            continue
        have = _installed_version(path, package)
        moved = [z for z in zips if have is not None and _zip_version(z, package) == have]
        for z in moved:
            path.remove(z)
            path.append(z)
        if package == "pyspark":
            said.append("the installed copy, Spark's pyspark.zip (no bytecode) moved behind it"
                        if moved else
                        f"Spark's pyspark.zip: the installed pyspark is "
                        f"{have or 'missing'}, the zip {_zip_version(zips[0], package)}")
    return "; ".join(said) or "no pyspark.zip on the path"


def _installed_version(path: list[str], package: str) -> str | None:
    """The version of the first directory on `path` holding the package (not a zip),
    None if there is none or it does not say."""
    for entry in path:
        if not isinstance(entry, str):
            continue
        folder = Path(entry or ".") / package
        if (folder / "__init__.py").is_file():
            try:
                return _version((folder / "version.py").read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                return None
    return None


def _zip_version(zip_path: str, package: str) -> str | None:
    try:
        with zipfile.ZipFile(zip_path) as z:
            return _version(z.read(f"{package}/version.py").decode("utf-8", "replace"))
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def _version(text: str) -> str | None:
    found = _VERSION.search(text)
    return found.group(1) if found else None
