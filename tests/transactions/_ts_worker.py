"""Draws timestamps from the embedded allocator and records each call.

Usage: python -m tests.transactions._ts_worker DB_PATH OUT THREADS COUNT
Each line of OUT: ``thread invoke_ns return_ns timestamp`` (CLOCK_MONOTONIC is
system-wide on Linux, so calls of different processes can be ordered).
COUNT 0 means: until killed.
"""

from __future__ import annotations

import sys
import threading
import time

from percolator._timestamps import HostTimestamps
from percolator.stores.sqlite import SqliteStore


def main() -> None:
    path, out, threads, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
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


if __name__ == "__main__":
    main()
