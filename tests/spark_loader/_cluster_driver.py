"""The driver of the Spark-cluster test (tests/hbase/test_hbase_multi_server.py), run as
its own process: one application of the standalone cluster does all three parts, so
that the executors' JVMs and Python workers start once.

``python -m tests.spark_loader._cluster_driver CONFIG`` (CONFIG: JSON, below)

1. **The loader**: ``python -m spark_loader`` with the arguments ``load`` (a list), run
   in this process, where it finds this application's session and uses it.
2. **A snapshot read under transfers**: table ``accounts`` (``accounts`` accounts) is
   read once with ``format("percolator")`` at one snapshot, one partition per
   account, while ``transfer_threads`` threads of this process make transfers between
   the accounts; they start when the loader is done and stop after the read (beside
   the other parts, they would only slow them down). The read's DataFrame is built
   while the loader runs. OUT (``out``) gets JSON: the loader's exit status, what the
   read saw, whether the transfers ran all through it, the number of executors and
   the pids of the Python workers that ran tasks.
3. **A streaming write**: ``stream`` = {table, source, checkpoint}, the query of
   ``tests/spark_loader/_stream_driver.py``; the test kills this driver where the
   writer parks (``_PERCOLATOR_TEST_PARK_AFTER_PREWRITE``).

With ``"restart": true``, the driver only restarts that query from its checkpoint, in
an application of one executor: a new driver and a new executor are what the restart
needs, and an executor JVM is the costliest part of an application to start.

Each part prints how long it took (``cluster driver: ... in N s``): the test's output
says where its time went, and a driver that overran its deadline, where it was.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.spark_loader._stream_driver import driver_session, stream_into

FIRST_TRANSFER_SECONDS = 120.0


def accounts_read(spark: Any, url: str, accounts: int) -> Any:
    """The DataFrame of one read of ``accounts``, one partition per account, at one
    snapshot (drawn when it is collected). Building it starts the data source's
    Python workers on the driver (Spark's look-up of sources by name, the source's
    creation), which :func:`main` lets run beside the loader."""
    return (spark.read.format("percolator").option("url", url)
            .option("table", "accounts").schema("row string, `bal:v` string")
            .option("numPartitions", accounts).load())


class Transfers:
    """*workers* threads of this process making random transfers between the
    *accounts* accounts (``percolator.conformance``'s bank transfer: each one records
    itself in table ``transfers``) until :meth:`stop`. Threads, not processes: a
    process would import percolator and connect first, on the read's critical path."""

    def __init__(self, url: str, accounts: int, workers: int) -> None:
        import percolator

        self.cluster = percolator.connect(url, lock_ttl=30)
        self.accounts = accounts
        self.committed = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(seed,), daemon=True,
                                          name=f"transfers-{seed}")
                         for seed in range(1, workers + 1)]
        for t in self._threads:
            t.start()

    def _run(self, seed: int) -> None:
        import percolator
        from percolator.conformance._bank import transfer

        rng = random.Random(seed)
        move = percolator.transactional(retries=1000)(transfer)
        seq = 0
        try:
            while not self._stop.is_set():
                src, dst = rng.sample(range(self.accounts), 2)
                move(self.cluster, "accounts", "transfers", b"%d-%d" % (seed, seq), src, dst,
                     rng.randint(1, 50))
                self.committed += 1
                seq += 1
                # a transfer each 50 ms a thread is concurrency enough for a read that
                # takes seconds; at full speed they were 877 in one read, each one
                # CPU of this process and of HBase's that the read waited for
                self._stop.wait(0.05)
        except BaseException as e:  # reported by the read
            self.errors.append(e)

    def running(self) -> bool:
        return not self.errors and all(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)
        self.cluster.close()


def read_under_transfers(df: Any, transfers: Transfers) -> dict[str, Any]:
    """Collect *df* (:func:`accounts_read`) once a transfer has committed: its rows,
    their sum, and whether the transfers ran all through the read."""
    deadline = time.monotonic() + FIRST_TRANSFER_SECONDS
    while transfers.committed == 0:
        if not transfers.running():
            raise SystemExit(f"the transfers stopped before any committed: {transfers.errors}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no transfer committed in {FIRST_TRANSFER_SECONDS:.0f} s")
        time.sleep(0.05)
    before = transfers.committed
    rows = df.collect()
    return {"rows": len(rows), "total": sum(int(r[1]) for r in rows),
            "committed_before": before, "committed_after": transfers.committed,
            "transfers_ran_throughout": transfers.running()}


def _took(what: str, since: float) -> float:
    print(f"cluster driver: {what} in {time.monotonic() - since:.1f} s", flush=True)
    return time.monotonic()


def main(config: dict[str, Any]) -> None:
    from spark_loader.__main__ import main as loader

    began = time.monotonic()
    restart = bool(config.get("restart"))
    spark = driver_session("percolator-cluster-test" + ("-restart" if restart else ""),
                           config["master"], executors=1 if restart else 2)
    began = _took("session", began)
    stream = config["stream"]
    try:
        if not restart:
            # The read's DataFrame is built while the loader runs: both start Python
            # processes (the source's on the driver, the loader's on the executors).
            with ThreadPoolExecutor(1) as pool:
                building = pool.submit(accounts_read, spark, config["url"],
                                       config["accounts"])
                loaded = loader(config["load"])
                began = _took("load", began)
                df = building.result()
            transfers = Transfers(config["url"], config["accounts"],
                                  config["transfer_threads"])
            try:
                read = read_under_transfers(df, transfers)
            finally:
                transfers.stop()
            began = _took("read under transfers", began)
            pids = sorted(set(spark.sparkContext.parallelize(range(8), 8)
                              .mapPartitions(lambda _: [os.getpid()]).collect()))
            executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
            out = Path(config["out"])
            partial = out.with_suffix(".partial")
            partial.write_text(json.dumps({"loaded": loaded, "read": read,
                                           "python_pids": pids, "executors": executors,
                                           "driver_pid": os.getpid()}))
            partial.rename(out)
            began = _took("executors' pids", began)
        stream_into(spark, config["url"], stream["table"], stream["source"],
                    stream["checkpoint"])
        _took("stream", began)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
