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
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import percolator
from percolator import metrics
from percolator.ext import (
    FREE_TAG,
    Mutation,
    Read,
    WriteKind,
    check_column,
    check_row,
    encode_write,
    inline_value,
    internals,
)
from percolator.stores import REQUESTS

_reads = metrics.counter("percolator_reads_total")


def read_began() -> float:
    """A transactional read's first metrics step, as percolator's read path takes it
    (``percolator/_transaction.py``): count the read, and take the clock for one read
    in ``READ_SAMPLE``."""
    if metrics._enabled and next(_reads) % metrics.READ_SAMPLE == 1:
        return time.perf_counter()
    return 0.0


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


def alternated_ratios(base: Callable[[int], object],
                      ops: dict[str, Callable[[int], object]], n: int,
                      rounds: int) -> dict[str, float]:
    """The median over *rounds* of ``base``'s CPU per operation over each op's, every
    round timing *base* and then each op in turn, *n* operations each, so that the
    shared machine's load falls on all of them alike."""
    for fn in (base, *ops.values()):
        for i in range(min(n, 200)):
            fn(i)
    samples: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(rounds):
        times = []
        for fn in (base, *ops.values()):
            began = time.process_time()
            for i in range(n):
                fn(i)
            times.append(time.process_time() - began)
        for name, spent in zip(ops, times[1:], strict=True):
            samples[name].append(times[0] / spent)
    return {name: statistics.median(ratios) for name, ratios in samples.items()}


def profile(pieces: list[tuple[str, str, Callable[[int], object]]], prefix: str,
            n: int) -> int:
    chosen = [(name, fn) for name, _, fn in pieces if name.startswith(prefix)]
    if len(chosen) != 1:
        raise SystemExit(f"--profile {prefix!r} matches {len(chosen)} pieces: "
                         + "; ".join(name for name, _, _ in pieces))
    name, fn = chosen[0]
    for i in range(min(n, 200)):
        fn(i)
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(n):
        fn(i)
    profiler.disable()
    stats = pstats.Stats(profiler)
    calls = sum(entry[1] for entry in stats.stats.values())  # type: ignore[attr-defined]
    print(f"{name}: {calls / n:.1f} calls per operation (cProfile, n = {n})")
    stats.sort_stats("tottime").print_stats(25)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", metavar="PIECE", help="instead of timing, run the "
                        "piece whose name starts with PIECE n times under cProfile and "
                        "print its calls per operation and where its time goes")
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
        # the one-phase commit's conflict read: the lock's value, the newest record's ts
        select, _ = store._plan_fields(  # type: ignore[attr-defined]
            "bench", (("l", "value"), ("w", "ts")), ("c:value",))
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
            db.execute(select, (row, "c:value")).fetchone()
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

        # The CPython floor: the leanest straight-line Python doing exactly what an
        # embedded one-phase transaction must do, on the real store, sidecar, safe point
        # and metrics objects, with no Transaction or commit layers: what the path could
        # cost if every call between the pieces were gone.
        store.newest_at("bench", rows[0], "w", "c:value", 1)  # type: ignore[attr-defined]
        read_select = store._cell_plans[("bench", "w")]  # type: ignore[attr-defined]
        draw_start = timestamps.get_timestamp
        in_flight = timestamps.in_flight  # type: ignore[attr-defined]
        atomically = store.atomically  # type: ignore[attr-defined]
        require_table = internals(cluster).require_table
        begun = metrics.counter("percolator_transactions_begun_total", "user")
        committed = metrics.counter("percolator_transactions_committed_total", "user")
        mutated = REQUESTS.mutate_rows
        perf_counter = time.perf_counter

        def floor_begin() -> Running:
            txn = Running()
            txn._closed = False
            safe_point.begin(txn, draw_start)  # type: ignore[arg-type]
            if metrics._enabled:
                next(begun)
            return txn

        def floor_get(txn: Running, row: bytes) -> bytes | None:
            # the lean read: census clean, so the write record at or below start_ts only
            require_table("bench")
            check_row(row)
            check_column("c:value")
            read_began()
            census.clean()  # type: ignore[union-attr]
            if metrics._enabled:
                next(counter)
            found = db.execute(read_select, (row, "c:value", 0, txn.start_ts)).fetchone()
            safe_point.check(txn.start_ts)
            return inline_value(found[1]) if found is not None else None

        def floor_set(writes: dict[bytes, bytes], row: bytes, cell: bytes) -> None:
            require_table("bench")
            check_row(row)
            check_column("c:value")
            if type(cell) is not bytes or len(cell) > 4 << 20:
                raise TypeError("value")
            writes[row] = cell

        def floor_commit(txn: Running, writes: dict[bytes, bytes]) -> None:
            began = perf_counter()
            start_ts = txn.start_ts
            with in_flight(atomically) as draw:
                found = []
                for row in writes:
                    if metrics._enabled:
                        next(counter)
                    lock, write_ts = db.execute(select, (row, "c:value")).fetchone()
                    if write_ts is not None and write_ts >= start_ts:
                        raise RuntimeError("written since start")
                    if lock is not None and lock[:1] != FREE_TAG:
                        raise RuntimeError("locked")
                    found.append(lock is not None)
                safe_point.check(start_ts)
                commit_ts = draw(1)[0]
                for (row, cell), has_lock in zip(writes.items(), found, strict=True):
                    if metrics._enabled:
                        next(mutated)
                    db.execute(insert, (row, "c:value", commit_ts,
                                        encode_write(WriteKind.PUT, start_ts, cell)))
                    if not has_lock:
                        raise RuntimeError("the bench's cells all have lock cells")
            txn._closed = True
            if metrics._enabled:
                next(committed)
                metrics.observe("percolator_commit_duration_seconds",
                                perf_counter() - began, "user")

        def floor_write(i: int) -> None:
            txn = floor_begin()
            writes: dict[bytes, bytes] = {}
            floor_set(writes, rows[i % 1000], value)
            floor_commit(txn, writes)

        def floor_transfer(i: int) -> None:
            a, b = rows[(2 * i) % 1000], rows[(2 * i + 1) % 1000]
            txn = floor_begin()
            va = floor_get(txn, a) or b""
            vb = floor_get(txn, b) or b""
            writes: dict[bytes, bytes] = {}
            floor_set(writes, a, vb)
            floor_set(writes, b, va)
            floor_commit(txn, writes)

        def txn_transfer(i: int) -> None:  # bench/overhead.py's transfer
            a, b = rows[(2 * i) % 1000], rows[(2 * i + 1) % 1000]
            with percolator.Transaction(cluster) as txn:
                va = txn.get("bench", a, "c:value") or b""
                vb = txn.get("bench", b, "c:value") or b""
                txn.set("bench", a, "c:value", vb)
                txn.set("bench", b, "c:value", va)

        pieces: list[tuple[str, str, Callable[[int], object]]] = [
            ("single-cell txn, total", "", txn_write),
            ("CPython floor: single-cell txn, total", "every step the transaction must "
             "take, straight-line", floor_write),
            ("transfer txn (2 reads, 2 writes), total", "", txn_transfer),
            ("CPython floor: transfer txn, total", "same", floor_transfer),
            ("SQL: BEGIN IMMEDIATE, conflict SELECT, INSERT record, COMMIT", "the write "
             "itself, its conflict check, atomic", sql_commit),
            ("start timestamp (a sidecar section: no flock while alone and drawing "
             "often, else a flock pair)", "snapshot isolation across "
             "processes", lambda i: timestamps.get_timestamp()),
            ("start and commit timestamps (4 sidecar sections: start draw; commit draw "
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
             "count", lambda i: read_began()),
            ("one flock pair (for scale)", "", flock_pair),
            ("one wrapper call (for scale: CountingStore's per store call)", "",
             wrapper_call),
        ]
        if args.profile is not None:
            return profile(pieces, args.profile, n)
        # First: the pieces below write records of their own above every commit
        by_name = {name: fn for name, _, fn in pieces}
        ratios = alternated_ratios(raw_write, {name: by_name[name] for name in (
            "single-cell txn, total", "CPython floor: single-cell txn, total",
            "transfer txn (2 reads, 2 writes), total", "CPython floor: transfer txn, total")},
            max(n // 10, 100), rounds)
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
    print("\n| Figure 8 ratio (raw write CPU / transaction CPU; alternated, median of "
          "rounds) | real path | CPython floor | target |")
    print("|---|---:|---:|---:|")
    for label, real, floor, target in (
            ("single-cell txn / raw write", "single-cell txn, total",
             "CPython floor: single-cell txn, total", 0.45),
            ("transfer txn / raw write", "transfer txn (2 reads, 2 writes), total",
             "CPython floor: transfer txn, total", 0.30)):
        print(f"| {label} | {ratios[real]:.2f} | {ratios[floor]:.2f} | {target:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
