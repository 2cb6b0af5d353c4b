"""Does prewriting the rows of a transaction in parallel pay on Bigtable (issue 37)?

Bigtable has no conditional ``MutateRows``: each row's prewrite is its own
``CheckAndMutateRow`` (``set_unless``). This locks the K rows of a transaction (one
cell each) one after another, and then with the same K calls issued at once from a
thread pool, alternating, on the emulator; it reports the median wall time and the
client CPU time per transaction's prewrites. Nothing is committed (fresh rows each
time).

    python bench/parallel_prewrite.py [--reps 100] [--rows 2,4,8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import percolator
    from bench.observers_remote import _url
    from percolator.ext import GuardedSet, TwoPhaseCommit, internals
    from tests._bigtable import start_emulator

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--rows", default="2,4,8")
    args = parser.parse_args()
    emulator, hostport = start_emulator()
    try:
        with percolator.connect(_url("bigtable", hostport, "pp")) as cluster, \
                ThreadPoolExecutor(8) as pool:
            cluster.create_table("b")
            store = internals(cluster).store
            assert isinstance(store, GuardedSet)
            print("| rows | sequential: wall ms | parallel: wall ms | sequential: CPU ms "
                  "| parallel: CPU ms |\n|---:|---:|---:|---:|---:|")
            for k in (int(x) for x in args.rows.split(",")):
                found: dict[str, list[tuple[float, float]]] = {"seq": [], "par": []}
                for rep in range(args.reps):
                    for mode in ("seq", "par") if rep % 2 else ("par", "seq"):
                        txn = percolator.Transaction(cluster)
                        for i in range(k):
                            txn.set("b", b"%s-%d-%d-%d" % (mode.encode(), k, rep, i), "c:v",
                                    b"x")
                        committer = TwoPhaseCommit.of(txn)
                        t0, c0 = time.perf_counter(), time.process_time()
                        if mode == "seq":
                            done = [committer.prewrite_guarded(store, c)
                                    for c in committer.cells]
                        else:
                            done = list(pool.map(
                                lambda c: committer.prewrite_guarded(store, c),  # noqa: B023
                                committer.cells))
                        found[mode].append((time.perf_counter() - t0, time.process_time() - c0))
                        assert all(done)
                        txn.close()

                def med(mode: str, i: int) -> float:
                    return 1000 * statistics.median(x[i] for x in found[mode])  # noqa: B023

                print(f"| {k} | {med('seq', 0):.2f} | {med('par', 0):.2f} | "
                      f"{med('seq', 1):.2f} | {med('par', 1):.2f} |", flush=True)
    finally:
        emulator.kill()
        emulator.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
