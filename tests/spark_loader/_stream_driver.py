"""A streaming query for the exactly-once tests, run as its own driver process:
JSON files in a directory (one per micro-batch) -> ``writeStream.format("percolator")``,
``trigger(availableNow=True)``: it ends when every file is written.

``python -m tests.spark_loader._stream_driver URL TABLE INPUT_DIR CHECKPOINT [MASTER]``

Without MASTER the session is ``local[2]``; with one (``spark://host:port``), an
application of the standalone cluster of ``tests/_spark_cluster.py``.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any


def driver_session(app: str, master: str | None = None, executors: int = 2) -> Any:
    """A small SparkSession for a test's own driver process (this one's,
    ``_feed_driver``'s and ``_cluster_driver``'s): ``local[2]``, or an application of
    the standalone cluster at *master* with *executors* executors of one core each (at
    most one per worker), compiled as the suite's other JVMs are
    (``PERCOLATOR_JVM_OPTS``, C1 only: the driver gets them through
    ``PYSPARK_SUBMIT_ARGS``, tests/conftest.py). Its jobs wait for all of them: up
    to 240 s, for executor JVMs starting on a loaded machine."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master or "local[2]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "512m"))
    if master:
        builder = (builder.config("spark.executor.memory", "512m")
                   .config("spark.executor.cores", "1")
                   .config("spark.cores.max", str(executors))
                   # jobs wait for every executor (Spark's default: 30 s at most), so
                   # that tasks run on as many JVMs as asked
                   .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
                   .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "240s")
                   .config("spark.executor.extraJavaOptions",
                           os.environ.get("PERCOLATOR_JVM_OPTS", ""))
                   .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", "")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stream_into(spark: Any, url: str, table: str, source: str, checkpoint: str) -> None:
    """Write every file of *source* not yet written (by the query of *checkpoint*)
    into *table*, a micro-batch per file, two tasks per batch; return when done."""
    rows = (spark.readStream.schema("row string, `v:n` long").option("maxFilesPerTrigger", 1)
            .json(source).repartition(2))
    query = (rows.writeStream.format("percolator").option("url", url)
             .option("table", table).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()


def main(url: str, table: str, source: str, checkpoint: str, master: str | None = None) -> None:
    spark = driver_session("percolator-stream-test", master)
    try:
        stream_into(spark, url, table, source, checkpoint)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
