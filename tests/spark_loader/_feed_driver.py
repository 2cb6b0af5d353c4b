"""A change-feed query for the exactly-once tests, run as its own driver process:
``readStream.format("percolator")`` (the change feed of a table, from the earliest
commit) -> Parquet, with a checkpoint. ``processingTime`` runs until killed;
``availableNow`` ends once every commit up to its start is written.

``python -m tests.spark_loader._feed_driver URL TABLE OUTPUT CHECKPOINT MODE``
"""

from __future__ import annotations

import sys

from tests.spark_loader._stream_driver import driver_session


def main(url: str, table: str, output: str, checkpoint: str, mode: str) -> None:
    spark = driver_session("percolator-feed-test")
    try:
        feed = (spark.readStream.format("percolator").option("url", url).option("table", table)
                .option("readChangeFeed", "true").option("startingTs", "earliest")
                .option("numPartitions", "2").load())
        writer = feed.writeStream.format("parquet").option("checkpointLocation", checkpoint)
        if mode == "availableNow":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime="500 milliseconds")
        writer.start(output).awaitTermination()
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
