"""Draws timestamps from the embedded allocator and records each call.

Usage: python -m tests.transactions._ts_worker DB_PATH OUT THREADS COUNT [transactions]
Each line of OUT: ``thread invoke_ns return_ns timestamp`` (CLOCK_MONOTONIC is
system-wide on Linux, so calls of different processes can be ordered).
COUNT 0 means: until killed. With ``transactions``, each of COUNT steps begins a
transaction (a call returning its start timestamp) and commits a write of its own
row in one phase (a call returning its commit timestamp), with a gap of two start
timestamps below each commit, so that draws both use gaps and wait for commits.
"""

from __future__ import annotations

import sys
import threading
import time

import percolator
from percolator._timestamps import HostTimestamps
from percolator.stores.sqlite import SqliteStore


def main() -> None:
    path, out, threads, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if sys.argv[5:] == ["transactions"]:
        transactions(path, out, threads, count)
        return
    store = SqliteStore(path)
    source = HostTimestamps(store, path + "-ts")
    lock = threading.Lock()
    with open(out, "a", buffering=1) as f:

        def draw(tid: int) -> None:
            i = 0
            while count == 0 or i < count:
                t0 = time.monotonic_ns()
                ts = source.get_timestamp()
                t1 = time.monotonic_ns()
                with lock:
                    f.write(f"{tid} {t0} {t1} {ts}\n")
                i += 1

        workers = [threading.Thread(target=draw, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()


def transactions(path: str, out: str, threads: int, count: int) -> None:
    HostTimestamps.GAP = 2
    lock = threading.Lock()
    with percolator.connect(f"sqlite://{path}") as cluster, open(out, "a", buffering=1) as f:
        cluster.create_table("t")

        def step(tid: int) -> None:
            for i in range(count):
                t0 = time.monotonic_ns()
                txn = percolator.Transaction(cluster)
                t1 = time.monotonic_ns()
                txn.set("t", f"{out}-{tid}-{i}".encode(), "c:v", b"1")
                t2 = time.monotonic_ns()
                txn.commit()
                t3 = time.monotonic_ns()
                with lock:
                    f.write(f"{tid} {t0} {t1} {txn.start_ts}\n{tid} {t2} {t3} {txn.commit_ts}\n")

        workers = [threading.Thread(target=step, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()


if __name__ == "__main__":
    main()
