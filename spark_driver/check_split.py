"""Check that Spark SQL splits lines into words exactly as the Python map step does.

    spark-submit [--master ...] spark_driver/check_split.py FILE...

The driver splits words in Spark SQL (spark_driver.maps.sql_word_arrays: lower-case,
then `[a-z]+(?:'[a-z]+)*`) instead of mapper.words.split_words whenever the map step is
the default. This runs both on every line of the files, on the executors, and prints
the lines where they differ (exit 1) or how many lines agree (exit 0). Run it on a
cluster whose executors' Java locale or version differ from what was tested.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if (_ROOT / "proto" / "floering").is_dir():
    if str(_ROOT / "proto") not in sys.path:      # floering; it finds the rest
        sys.path.insert(0, str(_ROOT / "proto"))

from floering.mapper.words import split_words  # noqa: E402
from floering.spark_driver.maps import sql_word_arrays  # noqa: E402
from floering.spark_driver.pyspark_path import prefer_installed  # noqa: E402
from floering.spark_driver.sink import session_builder  # noqa: E402


def main(argv=None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: check_split.py FILE...", file=sys.stderr)
        return 2
    prefer_installed()            # before pyspark's first import (pyspark_path)
    spark = session_builder("floe-ring word split check").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        lines = spark.read.text(paths)
        rows = lines.select("value", sql_word_arrays(lines["value"]).alias("words")).collect()
    finally:
        spark.stop()
    bad = [(row["value"], row["words"], split_words(row["value"])) for row in rows
           if (row["words"] or []) != split_words(row["value"] or "")]
    for value, sql, python in bad[:20]:
        print(f"differ: {value!r}: spark sql {sql} != python {python}")
    if bad:
        print(f"{len(bad)} of {len(rows)} lines split differently")
        return 1
    print(f"agree: {len(rows)} lines, {sum(len(split_words(r['value'] or '')) for r in rows)} "
          f"words split alike by Spark SQL and split_words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
