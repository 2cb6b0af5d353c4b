"""A streaming query for the exactly-once tests, run as its own driver process:
JSON files in a directory (one per micro-batch) -> ``writeStream.format("percolator")``,
``trigger(availableNow=True)``: it ends when every file is written.

``python -m tests.spark_loader._stream_driver URL TABLE INPUT_DIR CHECKPOINT``
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any


def driver_session(app: str) -> Any:
    """A small local SparkSession for a test's own driver process (this one's and
    ``_feed_driver``'s)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spark = (SparkSession.builder.master("local[2]").appName(app)
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.memory", "512m").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(url: str, table: str, source: str, checkpoint: str) -> None:
    spark = driver_session("percolator-stream-test")
    try:
        rows = (spark.readStream.schema("row string, `v:n` long").option("maxFilesPerTrigger", 1)
                .json(source).repartition(2))
        query = (rows.writeStream.format("percolator").option("url", url)
                 .option("table", table).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
