"""A local Spark Connect server (``local[2]``, pyspark's own jars) for the tests'
Connect session, in a process of its own: a Python process holding a classic
SparkSession cannot start one (pyspark's SESSION_OR_CONTEXT_EXISTS).

``python -m tests._spark_connect_server PORT`` serves until killed; it prints
``ready`` once the server listens.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings


def main(port: str) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spark = (SparkSession.builder.master("local[2]").appName("percolator-connect-tests")
                 .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
                 .config("spark.connect.grpc.binding.address", "127.0.0.1")
                 .config("spark.connect.grpc.binding.port", port)
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.default.parallelism", "2")
                 .config("spark.driver.memory", "1g")
                 .config("spark.python.worker.reuse", "true")
                 .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1])
