"""read_table against a raw store scan of the same rows, in the same Spark session.

    python bench/spark_read.py                     # 200,000 rows x 2 columns
    python bench/spark_read.py --rows 50000 --partitions 1,4

Seeds an embedded SQLite store with the bulk loader, then for each partition count
runs, alternating and ``--repeat`` times each: *read_table* (``spark_loader.read_table``
with ``splits=N``: key sampling on the driver, one snapshot, lock checks, decoding)
and *raw* (the same row ranges, each partition a plain ``store.scan`` of the newest
write-family cell of the two columns, which holds the value after a load: no
timestamp, no lock family, no decoding), both as a DataFrame of the same schema
forced by ``count()``. Prints rows/s of each, their ratio (target: read_table >= 0.5x
raw) and writes the section of BENCHMARKS.md (unless ``--no-write``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import percolator  # noqa: E402
from bench._common import cpu_model, write_section  # noqa: E402
from percolator.ext import (  # noqa: E402
    WRITE,
    Read,
    internals,
)

SECTION = "## Spark reads (bench/spark_read.py)"
COLUMNS = ("c:a", "c:b")


def raw_frame(spark: Any, url: str, table: str, ranges: list[Any]) -> Any:
    from pyspark.sql.types import BinaryType, StructField, StructType

    qualifiers = COLUMNS

    def scan(bounds: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        from spark_loader import executor_cluster

        store = internals(executor_cluster(url, ())).store
        reads = [Read(WRITE, qualifiers)]
        for start, stop in bounds:
            for row, cells in store.scan(table, start, stop, reads):
                yield (row, *[cells[f"{WRITE}:{c}"][0][1] if f"{WRITE}:{c}" in cells else None
                              for c in qualifiers])

    schema = StructType([StructField("row", BinaryType(), False),
                         *[StructField(c, BinaryType(), True) for c in qualifiers]])
    rdd = spark.sparkContext.parallelize(ranges, len(ranges)).mapPartitions(scan)
    return spark.createDataFrame(rdd, schema, verifySchema=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--partitions", default="1,2,4,8,16")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    parts = [int(x) for x in args.partitions.split(",")]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_loader import load_dataframe, plan_ranges, read_table

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="percolator-bench-read-") as tmp:
        url = f"sqlite://{tmp}/repo.db"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spark = (SparkSession.builder.master("local[2]").appName("bench-spark-read")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.driver.memory", "2g")
                     .config("spark.python.worker.reuse", "true")
                     .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        results: dict[int, dict[str, list[float]]] = {}
        try:
            from pyspark.sql import functions as F

            seed = spark.range(args.rows).select(
                F.format_string("row%09d", "id").alias("key"),
                F.format_string("value-a-%d-xxxxxxxxxxxxxxxx", "id").alias("a"),
                F.format_string("value-b-%d-xxxxxxxxxxxxxxxx", "id").alias("b"))
            loaded = load_dataframe(seed, url, "bench", "key", {"a": "c:a", "b": "c:b"})
            print(loaded.summary(), flush=True)
            for n in parts:
                results[n] = {"read_table": [], "raw": []}
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    df = read_table(spark, url, "bench", list(COLUMNS), splits=n)
                    got = df.count()
                    results[n]["read_table"].append(time.perf_counter() - t0)
                    with percolator.connect(url) as cluster:
                        ranges = plan_ranges(cluster, "bench", n, default_parts=n)
                    t0 = time.perf_counter()
                    raw = raw_frame(spark, url, "bench", ranges).count()
                    results[n]["raw"].append(time.perf_counter() - t0)
                    assert got == raw == args.rows, (got, raw)
                r, w = (statistics.median(results[n][k]) for k in ("read_table", "raw"))
                print(f"partitions {n}: read_table {args.rows / r:,.0f} rows/s, raw "
                      f"{args.rows / w:,.0f} rows/s, ratio {w / r:.2f}x", flush=True)
        finally:
            spark.stop()
    command = "python bench/spark_read.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        SECTION, "",
        f"- Machine: nproc={os.cpu_count()}, CPU \"{cpu_model()}\" (shared with other agents), "
        f"Python {platform.python_version()}, embedded SQLite store, Spark `local[2]`.",
        f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC. Command: "
        f"`{command.strip()}` (whole run {(time.perf_counter() - began) / 60:.1f} min).",
        f"- {args.rows:,} rows x {len(COLUMNS)} columns (~30-byte values) seeded by the bulk "
        "loader. *read_table*: `read_table(spark, url, 'bench', columns, splits=N).count()`, "
        "timed from the call (key sampling on the driver, a probe read, one snapshot, lock "
        "checks, decoding). *raw*: the same ranges, each partition a plain `store.scan` of "
        "the newest write-family cell of both columns (where a loaded value lives), same "
        "DataFrame schema, `count()`. Median of "
        f"{args.repeat} alternating runs each.",
        "",
        "| partitions | read_table rows/s | raw scan rows/s | ratio |",
        "|---:|---:|---:|---:|",
    ]
    for n, res in results.items():
        r, w = (statistics.median(res[k]) for k in ("read_table", "raw"))
        lines.append(f"| {n} | {args.rows / r:,.0f} | {args.rows / w:,.0f} | {w / r:.2f}x |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
