"""End to end on Spark: JSON files landing in a directory -> ``writeStream.format(
"percolator")`` (exactly once) -> an observer (uppercases ``e:text`` into ``e:upper``) ->
``readStream.format("percolator")``, the change feed of ``e:upper`` -> Parquet; with the
latency from a file landing to its rows being in the feed's Parquet output.

    python examples/spark_pipeline.py [--files 5] [--rows 100] [--keep DIR]

Everything runs locally: an embedded (SQLite) cluster in a temporary directory, Spark
``local[2]``, the observer in a worker thread. Prints one line per file (its latency) and
a summary. Needs ``pip install 'percolator-txn[spark]'`` and Java.
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


class Upper(Observer):
    """What the pipeline computes: e:upper from each e:text written by the stream."""

    table, column = "events", "e:text"

    def process(self, txn: Any, row: bytes, column: str) -> None:
        text = txn.get(self.table, row, column)
        if text is not None:
            txn.set(self.table, row, "e:upper", text.upper())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=5, help="files to land (default 5)")
    parser.add_argument("--rows", type=int, default=100, help="rows per file (default 100)")
    parser.add_argument("--keep", help="work in this directory (kept) instead of a temporary one")
    args = parser.parse_args(argv)
    work = args.keep or tempfile.mkdtemp(prefix="percolator-spark-")
    os.makedirs(work, exist_ok=True)
    url = f"sqlite://{os.path.abspath(work)}/repo.db"
    landing, output = os.path.join(work, "landing"), os.path.join(work, "upper.parquet")
    os.makedirs(landing, exist_ok=True)
    cluster = percolator.connect(url)
    cluster.create_table("events")
    cluster.observe("events", "e:text")
    worker = Worker(cluster, [Upper], threads=2)
    worker.start()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers: this interpreter
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spark = (SparkSession.builder.master("local[2]").appName("percolator-pipeline")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    source = (spark.readStream.schema("row string, `e:text` string")
              .option("maxFilesPerTrigger", 1).json(landing))
    into = (source.writeStream.format("percolator").option("url", url)
            .option("table", "events").option("checkpointLocation", os.path.join(work, "cp-in"))
            .trigger(processingTime="200 milliseconds").start())
    feed = (spark.readStream.format("percolator").option("url", url).option("table", "events")
            .option("readChangeFeed", "true").option("columns", "e:upper")
            .schema("row string, column string, value string, commit_ts long").load()
            .writeStream.format("parquet")
            .option("checkpointLocation", os.path.join(work, "cp-out"))
            .trigger(processingTime="200 milliseconds").start(output))
    latencies = []
    try:
        for f in range(args.files):
            rows = [{"row": f"f{f}-{i:05d}", "e:text": f"event {i} of file {f}"}
                    for i in range(args.rows)]
            tmp = os.path.join(work, f"f{f}.json.tmp")
            with open(tmp, "w") as out:
                out.writelines(json.dumps(r) + "\n" for r in rows)
            landed = time.monotonic()
            os.rename(tmp, os.path.join(landing, f"f{f}.json"))  # lands whole
            last = f"f{f}-{args.rows - 1:05d}"
            while True:  # the file's last row in the feed's output
                time.sleep(0.1)
                if os.path.isdir(os.path.join(output, "_spark_metadata")) and spark.read.parquet(
                        output).where(f"row = '{last}'").count():
                    break
            latencies.append(time.monotonic() - landed)
            print(f"file {f}: {args.rows} rows in the change feed's output "
                  f"{latencies[-1]:.2f} s after landing", flush=True)
    finally:
        into.stop()
        feed.stop()
        worker.stop()
    got = spark.read.parquet(output)
    print(f"{got.count()} e:upper changes in {output}; latency from landing: median "
          f"{statistics.median(latencies):.2f} s, max {max(latencies):.2f} s")
    spark.stop()
    cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
