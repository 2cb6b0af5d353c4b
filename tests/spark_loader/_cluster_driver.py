"""The driver of the Spark-standalone test, run as its own process (a SparkContext
per process: the suite's local one may live in the test's process):

``python -m tests.spark_loader._cluster_driver MASTER URL ACCOUNTS OUT``

Reads table ``accounts`` with ``format("percolator")`` at one snapshot, one partition
per account, three times, and writes JSON to OUT: the totals read, the number of
executors, and the pids of the Python workers that ran the partitions.
"""

from __future__ import annotations

import json
import os
import sys
import warnings


def main(master: str, url: str, accounts: int, out: str) -> None:
    from pyspark.sql import SparkSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spark = (SparkSession.builder.master(master).appName("percolator-cluster-test")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.executor.memory", "512m")
                 .config("spark.executor.cores", "1")
                 .config("spark.cores.max", "2")
                 .config("spark.driver.memory", "512m")
                 .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
                 .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        totals = []
        for _ in range(3):
            df = (spark.read.format("percolator").option("url", url)
                  .option("table", "accounts").schema("row string, `bal:v` string")
                  .option("numPartitions", accounts).load())
            rows = df.collect()
            totals.append([len(rows), sum(int(r[1]) for r in rows)])
        pids = (spark.sparkContext.parallelize(range(8), 8)
                .map(lambda _: os.getpid()).distinct().collect())
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        with open(out, "w") as f:
            json.dump({"totals": totals, "python_pids": pids, "executors": executors,
                       "driver_pid": os.getpid()}, f)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
