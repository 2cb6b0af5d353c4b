"""End to end on Spark: JSON files landing in a directory -> ``writeStream.format(
"percolator")`` (exactly once) -> an observer (uppercases ``e:text`` into ``e:upper``) ->
``readStream.format("percolator")``, the change feed of ``e:upper`` -> Parquet; with the
latency from a file landing to its rows being in the feed's Parquet output.

    python examples/spark_pipeline.py [--files 5] [--rows 100] [--keep DIR]

Everything runs locally: an embedded (SQLite) cluster in a temporary directory, Spark
``local[2]``, the observer in a worker thread. Lands a first file to warm up (the
queries' first batches start Spark's Python workers; its time is printed apart), then
prints one line per file (its latency), checks that the output holds every row once,
uppercased, and prints a summary. Exit status 0 when the output is right, 1 if not.
Needs ``pip install 'percolator-txn[spark]'`` and Java.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import percolator
from observers import Observer, Worker

FEED = "row string, column string, value string, commit_ts long"
TRIGGER = "200 milliseconds"


class Upper(Observer):
    """What the pipeline computes: e:upper from each e:text written by the stream."""

    table, column = "events", "e:text"

    def process(self, txn: Any, row: bytes, column: str) -> None:
        text = txn.get(self.table, row, column)
        if text is not None:
            txn.set(self.table, row, "e:upper", text.upper())


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _text(f: int | str, i: int) -> str:
    return f"event {i} of file {f}"


def _land(landing: str, name: str, rows: int) -> float:
    """Write file *name* of *rows* rows beside the landing directory and move it in
    whole (a file source must not see it half written); return when it landed."""
    tmp = os.path.join(os.path.dirname(landing), name + ".tmp")
    with open(tmp, "w") as out:
        out.writelines(json.dumps({"row": f"{name}-{i:05d}", "e:text": _text(name, i)}) + "\n"
                       for i in range(rows))
    landed = time.monotonic()
    os.rename(tmp, os.path.join(landing, name + ".json"))
    return landed


def _delivered(query: Any, seen: dict[int, int]) -> int:
    """Rows the feed's query has written to its sink: its progress reports, one per
    finished batch (kept by batch id: a report may be read twice, or skipped by
    lastProgress, not by recentProgress's last 100)."""
    for progress in query.recentProgress:
        seen[progress["batchId"]] = progress["numInputRows"]
    return sum(seen.values())


def run(work: str, files: int, rows: int) -> int:
    url = f"sqlite://{os.path.abspath(work)}/repo.db"
    landing, output = os.path.join(work, "landing"), os.path.join(work, "upper.parquet")
    os.makedirs(landing, exist_ok=True)
    cluster = percolator.connect(url)
    cluster.create_table("events")
    cluster.observe("events", "e:text")
    # An idle worker backs off up to idle_max between scans: short, for latency.
    worker = Worker(cluster, [Upper], idle_max=0.2)
    worker.start()

    # format("percolator") is found by name: Spark starts that source's workers with
    # PYSPARK_PYTHON as the session starts (python3 from PATH without it), not with
    # this interpreter (docs/spark.md, "The Python of Spark's workers").
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spark = (SparkSession.builder.master("local[2]").appName("percolator-pipeline")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    source = (spark.readStream.schema("row string, `e:text` string")
              .option("maxFilesPerTrigger", 1).json(landing))
    into = (source.writeStream.format("percolator").option("url", url)
            .option("table", "events").option("checkpointLocation", os.path.join(work, "cp-in"))
            .trigger(processingTime=TRIGGER).start())
    feed = (spark.readStream.format("percolator").option("url", url).option("table", "events")
            .option("readChangeFeed", "true").option("columns", "e:upper")
            .schema(FEED).load()
            .writeStream.format("parquet")
            .option("checkpointLocation", os.path.join(work, "cp-out"))
            .trigger(processingTime=TRIGGER).start(output))
    latencies: list[float] = []
    seen: dict[int, int] = {}
    try:
        for f in range(-1, files):  # -1: the warm-up file
            name = "warmup" if f < 0 else f"f{f}"
            landed = _land(landing, name, rows)
            while _delivered(feed, seen) < (f + 2) * rows:
                for query in (into, feed):
                    if query.exception() is not None:
                        raise RuntimeError(f"query {query.name or query.id} failed") \
                            from query.exception()
                time.sleep(0.02)
            took = time.monotonic() - landed
            if f < 0:
                print(f"warm-up file: {rows} rows in the change feed's output {took:.2f} s "
                      "after landing (queries starting)", flush=True)
            else:
                latencies.append(took)
                print(f"file {f}: {rows} rows in the change feed's output {took:.2f} s "
                      "after landing", flush=True)
    finally:
        # Stopping interrupts a trigger under way, which Spark logs as errors.
        spark.sparkContext.setLogLevel("OFF")
        into.stop()
        feed.stop()
        worker.stop()
    got = {(r["row"], r["value"]) for r in
           spark.read.schema(FEED).parquet(output).select("row", "value").collect()}
    count = spark.read.schema(FEED).parquet(output).count()
    spark.stop()
    cluster.close()
    want = {(f"{name}-{i:05d}", _text(name, i).upper())
            for name in ["warmup", *(f"f{f}" for f in range(files))] for i in range(rows)}
    if got != want or count != len(want):
        print(f"WRONG: {count} records, {len(got - want)} unexpected, {len(want - got)} "
              "missing", file=sys.stderr)
        return 1
    print(f"{count} e:upper changes in {output}, each row once, uppercased; latency from "
          f"landing over {files} files: median {statistics.median(latencies):.2f} s, "
          f"max {max(latencies):.2f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=_positive, default=5,
                        help="files to land after the warm-up one (default 5)")
    parser.add_argument("--rows", type=_positive, default=100,
                        help="rows per file (default 100)")
    parser.add_argument("--keep", help="work in this directory (kept) instead of a temporary one")
    args = parser.parse_args(argv)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        return run(args.keep, args.files, args.rows)
    with tempfile.TemporaryDirectory(prefix="percolator-spark-") as work:
        return run(work, args.files, args.rows)


if __name__ == "__main__":
    sys.exit(main())
