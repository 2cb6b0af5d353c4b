"""Where the time of one transaction goes on the embedded store (issue 33): each cost on
the path of a single-cell transaction, a transactional read and a raw write, measured
alone, in microseconds of CPU time (``time.process_time``: the machine is shared).

    python bench/txn_path.py [--n 20000] [--rounds 5]

Each line runs the piece of the path by itself *n* times (median of *rounds*); the
totals are the whole operations, and "the rest" is the total less the pieces: the
calls, attribute lookups and small objects between them. The pieces use the library's
own objects (a cluster on a fresh file, its statements), so they cost what they cost
inside a transaction, give or take the cache.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import percolator
from percolator import metrics
from percolator._encoding import check_column, check_row
from percolator._internals import internals
from percolator._store import Mutation, Read
from percolator._transaction import _read_began
from percolator.stores import REQUESTS


def cpu_us(fn: Callable[[int], object], n: int, rounds: int) -> float:
    for i in range(min(n, 200)):
        fn(i)
    samples = []
    for _ in range(rounds):
        began = time.process_time()
        for i in range(n):
            fn(i)
        samples.append((time.process_time() - began) / n * 1e6)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    n, rounds = args.n, args.rounds
    with tempfile.TemporaryDirectory(prefix="percolator-path-") as tmp, \
            percolator.connect(f"sqlite:///{tmp}/path.db") as cluster:
        cluster.create_table("bench")
        store = internals(cluster).store
        store.create_table("raw", {"d": 0})
        rows = [b"row%06d" % i for i in range(1000)]
        with percolator.Transaction(cluster) as txn:
            for row in rows:
                txn.set("bench", row, "c:value", b"x" * 100)
        store.mutate_rows("raw", [Mutation(r, [("d:c:value", 1, b"x" * 100)]) for r in rows])
        time.sleep(1.1)  # the lock census's first sweep may clear the flag
        percolator.Transaction(cluster).get("bench", rows[0], "c:value")
        census = internals(cluster).lock_census
        clean = census is not None and census.clean()
        value = b"y" * 100
        stamps = iter(range(10, 10**12))
        db = store._db()  # type: ignore[attr-defined]
        select, _ = store._plan_newest(  # type: ignore[attr-defined]
            "bench", [Read("l", ("c:value",)), Read("w", ("c:value",))])
        insert = store._put_sql("bench", "w")  # type: ignore[attr-defined]
        timestamps = internals(cluster).timestamps
        safe_point = internals(cluster).safe_point
        turn = store._turn  # type: ignore[attr-defined]
        fd = os.open(f"{tmp}/probe.lock", os.O_RDWR | os.O_CREAT)
        reader = [percolator.Transaction(cluster)]
        counter = REQUESTS.read_rows

        import fcntl

        class Running:
            start_ts = 0
            _began = 0.0
            _closed = True

        def txn_write(i: int) -> None:
            with percolator.Transaction(cluster) as txn:
                txn.set("bench", rows[i % 1000], "c:value", value)

        def raw_write(i: int) -> None:
            store.mutate_rows("raw", [Mutation(rows[i % 1000], [("d:c:value", next(stamps),
                                                                   value)])])

        def raw_read(i: int) -> None:
            store.read_rows("raw", [rows[i % 1000]], [Read("d", ("c:value",))])

        def txn_read(i: int) -> None:
            if i % 100 == 0:
                reader[0] = percolator.Transaction(cluster)
            reader[0].get("bench", rows[i % 1000], "c:value")

        def sql_commit(i: int) -> None:
            db.execute("BEGIN IMMEDIATE")
            row = rows[i % 1000]
            db.execute(select, (row, 0, 2**62, 0, 2**62, "c:value", "c:value")).fetchone()
            db.execute(insert, (rows[i % 1000], "c:value", next(stamps) + 2**40, value))
            db.execute("COMMIT")

        def sql_raw_write(i: int) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.execute(store._put_sql("raw", "d"),  # type: ignore[attr-defined]
                       (rows[i % 1000], "c:value", next(stamps), value))
            db.execute("COMMIT")

        def both_draws(i: int) -> None:
            # a start draw too: commit draws alone never persist a new ceiling (they
            # must not write the store), so the first one past the refill mark would
            # read the ceiling every time, as no transaction's commit draw does
            timestamps.get_timestamp()
            # no store step around it (nullcontext): the draws alone
            with timestamps.in_flight(contextlib.nullcontext) as draw:  # type: ignore[attr-defined]
                draw(1)

        def flock_pair(i: int) -> None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            fcntl.flock(fd, fcntl.LOCK_UN)

        def wrapper_call(i: int) -> None:  # what CountingStore added to each store call
            def counted(*args: object, **kwargs: object) -> None:
                return None
            counted(i)

        def counter_step(i: int) -> None:
            if metrics._enabled:
                next(counter)

        def validate(i: int) -> None:
            internals(cluster).require_table("bench")
            check_row(rows[i % 1000])
            check_column("c:value")

        pieces: list[tuple[str, str, Callable[[int], object]]] = [
            ("single-cell txn, total", "", txn_write),
            ("SQL: BEGIN IMMEDIATE, conflict SELECT, INSERT record, COMMIT", "the write "
             "itself, its conflict check, atomic", sql_commit),
            ("start timestamp (sidecar: 1 flock pair)", "snapshot isolation across "
             "processes", lambda i: timestamps.get_timestamp()),
            ("start and commit timestamps (4 flock pairs: start draw; commit draw "
             "and in-flight publication; closing the gap before the COMMIT; clearing "
             "the slot after it)", "commit draw in "
             "flight: start timestamps drawn meanwhile need not wait (issue 15)",
             both_draws),
            ("safe point: register the transaction", "GC never removes what it reads "
             "(issue 14)", lambda i: safe_point.begin(Running(), lambda: 1)),  # type: ignore[arg-type]
            ("safe point: 2 checks", "same", lambda i: (safe_point.check(10**12),
                                                         safe_point.check(10**12))),
            ("validation of table, row, column", "clear errors", validate),
            ("histogram (commit duration)", "metrics", lambda i: metrics.observe(
                "percolator_commit_duration_seconds", 0.001, "user")),
            ("counters: begun, committed, 2 store calls (4 steps)", "metrics",
             lambda i: (counter_step(i), counter_step(i), counter_step(i),
                        counter_step(i))),
            ("writers' turn when alone: presence check (was: 1 flock pair)", "order "
             "between processes' writers", lambda i: turn.others_present()),
            ("raw write, total", "", raw_write),
            ("SQL: BEGIN IMMEDIATE, INSERT, COMMIT", "", sql_raw_write),
            ("raw read, total", "", raw_read),
            ("txn read, total (a transaction per 100 reads)", "", txn_read),
            ("lock census check", "reads skip the lock family while no lock is held",
             lambda i: internals(cluster).lock_census.clean()),  # type: ignore[union-attr]
            ("histogram (read duration) + 2 clock reads, paid by 1 read in "
             f"{metrics.READ_SAMPLE}", "metrics", lambda i: (
                time.perf_counter(), time.perf_counter(),
                metrics.observe("percolator_read_duration_seconds", 0.001))),
            ("read counter step and sample choice (every read)", "metrics: exact read "
             "count", lambda i: _read_began()),
            ("one flock pair (for scale)", "", flock_pair),
            ("one wrapper call (for scale: CountingStore's per store call)", "",
             wrapper_call),
        ]
        results = {name: cpu_us(fn, n if "total" not in name and "SQL" not in name
                                else max(n // 10, 100), rounds)
                   for name, _, fn in pieces}
        os.close(fd)
    print(f"- lock census clean: {clean}; n = {n}, rounds = {rounds}, CPU microseconds "
          "(median of rounds)\n")
    print("| piece of the path | what it buys | us CPU |")
    print("|---|---|---:|")
    for name, why, _ in pieces:
        print(f"| {name} | {why} | {results[name]:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
