"""The driver of the Spark-cluster test (tests/hbase/test_hbase_multi_server.py), run as
its own process: one application of the standalone cluster does all three parts, so
that the executors' JVMs and Python workers start once.

``python -m tests.spark_loader._cluster_driver CONFIG`` (CONFIG: JSON, below)

1. **The loader**: ``python -m spark_loader`` with the arguments ``load`` (a list), run
   in this process, where it finds this application's session and uses it.
2. **Snapshot reads**: once the file ``transfers`` (the committed log of the test's
   transfer processes) is not empty, table ``accounts`` is read with
   ``format("percolator")`` at one snapshot, one partition per account (``accounts``
   of them), three times. OUT (``out``) gets JSON: the loader's exit status, the totals
   read, the number of executors, and the pids of the Python workers that ran tasks.
3. **A streaming write**: ``stream`` = {table, source, checkpoint}, the query of
   ``tests/spark_loader/_stream_driver.py``; the test kills this driver where the
   writer parks (``_PERCOLATOR_TEST_PARK_AFTER_PREWRITE``) and restarts the query with
   that module.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.spark_loader._stream_driver import driver_session, stream_into


def read_totals(spark: Any, url: str, accounts: int, times: int) -> list[list[int]]:
    """[rows, sum of ``bal:v``] of each of *times* snapshot reads of ``accounts``."""
    totals = []
    for _ in range(times):
        df = (spark.read.format("percolator").option("url", url)
              .option("table", "accounts").schema("row string, `bal:v` string")
              .option("numPartitions", accounts).load())
        rows = df.collect()
        totals.append([len(rows), sum(int(r[1]) for r in rows)])
    return totals


def _took(what: str, since: float) -> float:
    print(f"cluster driver: {what} in {time.monotonic() - since:.1f} s", flush=True)
    return time.monotonic()


def main(config: dict[str, Any]) -> None:
    from spark_loader.__main__ import main as loader

    began = time.monotonic()
    spark = driver_session("percolator-cluster-test", config["master"])
    began = _took("session", began)
    try:
        loaded = loader(config["load"])
        began = _took("load", began)
        transfers = Path(config["transfers"])
        deadline = time.monotonic() + 300
        while not (transfers.exists() and transfers.stat().st_size > 0):
            if time.monotonic() > deadline:
                raise SystemExit("no transfer committed in 300 s")
            time.sleep(0.1)
        began = _took("first transfer", began)
        totals = read_totals(spark, config["url"], config["accounts"], 3)
        began = _took("reads", began)
        pids = (spark.sparkContext.parallelize(range(8), 8)
                .map(lambda _: os.getpid()).distinct().collect())
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        out = Path(config["out"])
        partial = out.with_suffix(".partial")
        partial.write_text(json.dumps({"loaded": loaded, "totals": totals,
                                       "python_pids": pids, "executors": executors,
                                       "driver_pid": os.getpid()}))
        partial.rename(out)
        stream = config["stream"]
        stream_into(spark, config["url"], stream["table"], stream["source"],
                    stream["checkpoint"])
    finally:
        spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
