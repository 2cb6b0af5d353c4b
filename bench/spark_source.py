"""The Spark data source (issue 36) against what it replaces or is measured by, each
ratio within one run, one Spark session (``local[2]``, embedded SQLite store).

    python bench/spark_source.py                  # 50,000 rows; 8 files x 2,000 streamed
    python bench/spark_source.py --rows 20000 --repeat 3 --no-write

1. *read*: ``spark.read.format("percolator")`` (``numPartitions`` N) against
   ``spark_loader.read_table`` (``splits=N``) and against a raw store scan of the same
   ranges (bench/spark_read.py's), all ``count()``, alternating.
2. *batch write*: ``df.write.format("percolator").mode("append")`` (one transaction)
   against ``load_dataframe`` of the same cached DataFrame, each into a fresh table.
3. *streaming write*: a file stream of JSON files, ``maxFilesPerTrigger`` 1 and
   ``trigger(availableNow=True)``, into ``writeStream.format("percolator")`` (a bulk
   load per micro-batch, exactly once) against a plain Parquet sink; rows/s from
   ``start()`` to the query's end.
4. *end to end*: ``examples/spark_pipeline.py`` run as a subprocess (after the
   session stopped): latency from a file landing to its rows in the change feed's
   Parquet output.

Prints every number and writes the section of BENCHMARKS.md (unless ``--no-write``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import percolator  # noqa: E402
from bench._common import header, write_section  # noqa: E402
from bench.spark_read import COLUMNS, raw_frame  # noqa: E402

SECTION = "## Spark data source (bench/spark_source.py)"


def _alternate(runs: dict[str, Callable[[int], Any]], repeat: int) -> dict[str, float]:
    """Median seconds of each run, the runs taking turns *repeat* times (so a change
    of the machine's load falls on all of them)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(repeat):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn(i)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def _stream(spark: Any, landing: str, start: Callable[[Any], Any]) -> None:
    source = (spark.readStream.schema("row string, `c:a` string, `c:b` string")
              .option("maxFilesPerTrigger", 1).json(landing))
    query = start(source.writeStream.trigger(availableNow=True))
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError("streaming query failed") from query.exception()


def _example(files: int, rows: int) -> tuple[list[float], str]:
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "spark_pipeline.py"),
         "--files", str(files), "--rows", str(rows)],
        capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError("examples/spark_pipeline.py failed:\n" + done.stderr[-3000:])
    per_file = [float(s) for s in re.findall(r"^file \d+: .* ([\d.]+) s after landing$",
                                             done.stdout, re.M)]
    warmup = re.search(r"^warm-up file: .* ([\d.]+) s after landing", done.stdout, re.M)
    return per_file, warmup.group(1) if warmup else "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=50_000, help="rows read and batch-written")
    p.add_argument("--partitions", type=int, default=4, help="input partitions of reads")
    p.add_argument("--files", type=int, default=8, help="files streamed")
    p.add_argument("--file-rows", type=int, default=2_000, help="rows per streamed file")
    p.add_argument("--example-files", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    for name in ("rows", "partitions", "files", "file_rows", "example_files", "repeat"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # format() found by name
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_loader import load_dataframe, plan_ranges, read_table

    loads = [os.getloadavg()[0]]
    began = time.perf_counter()
    n, rows = args.partitions, args.rows
    streamed = args.files * args.file_rows
    with tempfile.TemporaryDirectory(prefix="percolator-bench-source-") as tmp:
        url = f"sqlite://{tmp}/repo.db"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spark = (SparkSession.builder.master("local[2]").appName("bench-spark-source")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.sql.shuffle.partitions", "2")
                     .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            seed = spark.range(rows).select(
                F.format_string("row%09d", "id").alias("key"),
                F.format_string("value-a-%d-xxxxxxxxxxxxxxxx", "id").alias("a"),
                F.format_string("value-b-%d-xxxxxxxxxxxxxxxx", "id").alias("b")).cache()
            seed.count()
            load_dataframe(seed, url, "bench", "key", {"a": "c:a", "b": "c:b"})
            with percolator.connect(url) as cluster:
                ranges = plan_ranges(cluster, "bench", n, default_parts=n)

            def source_read(_: int) -> None:
                got = (spark.read.format("percolator").option("url", url)
                       .option("columns", ",".join(COLUMNS)).option("numPartitions", n)
                       .load("bench").count())
                assert got == rows, got

            def table_read(_: int) -> None:
                assert read_table(spark, url, "bench", list(COLUMNS), splits=n).count() == rows

            def raw_read(_: int) -> None:
                assert raw_frame(spark, url, "bench", ranges).count() == rows

            read = _alternate({"source": source_read, "read_table": table_read,
                               "raw": raw_read}, args.repeat)
            print("read s:", read, flush=True)
            loads.append(os.getloadavg()[0])

            as_source = seed.select(F.col("key").alias("row"), F.col("a").alias("c:a"),
                                    F.col("b").alias("c:b"))

            def source_write(i: int) -> None:
                (as_source.write.format("percolator").mode("append").option("url", url)
                 .option("table", f"ws{i}").save())

            def loader_write(i: int) -> None:
                load_dataframe(seed, url, f"wl{i}", "key", {"a": "c:a", "b": "c:b"})

            write = _alternate({"source": source_write, "load_dataframe": loader_write},
                               args.repeat)
            print("write s:", write, flush=True)
            loads.append(os.getloadavg()[0])

            with percolator.connect(url) as cluster:  # the stream sink creates none
                for i in range(args.repeat):
                    cluster.create_table(f"ss{i}")
            landing = os.path.join(tmp, "landing")
            os.makedirs(landing)
            for f in range(args.files):
                with open(os.path.join(landing, f"f{f}.json"), "w") as out:
                    out.writelines(json.dumps({"row": f"f{f}-{i:06d}", "c:a": f"a{i}",
                                               "c:b": f"b{i}"}) + "\n"
                                   for i in range(args.file_rows))

            def source_stream(i: int) -> None:
                _stream(spark, landing, lambda w: w.format("percolator").option("url", url)
                        .option("table", f"ss{i}")
                        .option("checkpointLocation", os.path.join(tmp, f"cp-ss{i}")).start())

            def parquet_stream(i: int) -> None:
                _stream(spark, landing, lambda w: w.format("parquet")
                        .option("checkpointLocation", os.path.join(tmp, f"cp-pq{i}"))
                        .start(os.path.join(tmp, f"pq{i}")))

            stream = _alternate({"source": source_stream, "parquet": parquet_stream},
                                args.repeat)
            print("stream s:", stream, flush=True)
            with percolator.connect(url) as cluster, percolator.Snapshot(cluster) as snap:
                assert sum(1 for _ in snap.scan("ss0", columns=["c:a"])) == streamed
            loads.append(os.getloadavg()[0])
        finally:
            spark.stop()
    latencies, warmup = _example(args.example_files, 100)
    loads.append(os.getloadavg()[0])
    command = "python bench/spark_source.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    lines = header(
        SECTION, command.strip(),
        f"commit {_commit()}; Spark `local[2]`, embedded SQLite store; whole run "
        f"{(time.perf_counter() - began) / 60:.1f} min; 1-minute load average at its "
        f"stages {', '.join(f'{x:.1f}' for x in loads)} (2 cores shared with other agents: "
        "compare the ratios, measured side by side, not the absolute rates)",
        f"median of {args.repeat} alternating runs per line")
    lines += [
        "",
        "| what | rows | ours | against | ours rows/s | theirs rows/s | ours / theirs |",
        "|---|---:|---|---|---:|---:|---:|",
    ]

    def row(what: str, count: int, ours: str, theirs: str, t: dict[str, float]) -> None:
        lines.append(f"| {what} | {count:,} | {ours} | {theirs} | {count / t[ours]:,.0f} | "
                     f"{count / t[theirs]:,.0f} | {t[theirs] / t[ours]:.2f}x |")

    row(f"batch read, {n} partitions", rows, "source", "read_table", read)
    row(f"batch read, {n} partitions", rows, "source", "raw", read)
    row("batch write", rows, "source", "load_dataframe", write)
    row(f"streaming write, {args.files} batches", streamed, "source", "parquet", stream)
    lines += [
        "",
        f"End to end (`examples/spark_pipeline.py --files {args.example_files} --rows 100`, "
        "200 ms triggers): from a file landing to its rows in the change feed's Parquet "
        f"output, median {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s "
        f"over {len(latencies)} files (warm-up file, the queries starting: {warmup} s).",
    ]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


def _commit() -> str:
    done = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
