"""Garbage collection: space, foreground cost, speed (embedded store, or real HBase).

    python bench/gc.py                 # the three measurements below
    python bench/gc.py --soak          # also the soak test (tests/gc/test_gc_soak.py)
    python bench/gc.py --backend hbase # on a standalone HBase 2.6 (or the one at
                                       # PERCOLATOR_HBASE_THRIFT, with
                                       # PERCOLATOR_HBASE_THRIFT2 its Thrift2 server)

Measured in one run, as ratios:

* **storage**: bytes of the SQLite file per live cell after ``--updates`` updates of
  each of ``--cells`` cells (a 100-byte value), with a pass every tenth round of
  updates, against without; both against the file holding one version per cell (the
  live data). Target: with GC at most 2x the live data plus a constant;
* **foreground cost**: single-cell transactions per second while another process
  runs passes back to back over a table of ``--rows`` rows (at ``--gc-rate`` rows/s,
  the workers' default), against while it is
  idle (alternating windows, each idle one starting once the last pass has ended;
  the median of the per-window-pair ratios). Target: at least 0.9;
* **GC speed**: versions removed per second by a pass, against raw store deletes
  of the same versions (one range delete per cell, batched the same way).

On HBase, storage is not a file to weigh: the first measurement is instead the
**residue** of cells written and then deleted, after one pass, through Thrift1 alone
(whose ``checkAndPut`` cannot delete, so each cell's FREE lock stays) against with the
Thrift2 server (``thrift2=`` store option: one ``checkAndMutate`` per lock), and what
the pass cost in each case.

Every client here uses a safe-point refresh of 10 ms, so a pass waits 20 ms of
grace rather than the default 2 s: the numbers are the work, not the wait.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import percolator
from bench._common import cpu_model, write_section
from percolator.ext import Mutation, Read, internals

ROOT = Path(__file__).resolve().parent.parent
REFRESH = 0.01
VALUE = b"v" * 100
GC_LOOP = """
import os, sys, time, percolator
cluster = percolator.connect(sys.argv[1], safe_point_refresh=float(sys.argv[2]))
run, state = sys.argv[3], sys.argv[4]
rate = float(sys.argv[5]) or None
while True:
    running = os.path.exists(run)
    with open(state + ".tmp", "w") as f:
        f.write("running" if running else "idle")
    os.replace(state + ".tmp", state)
    if running:
        cluster.gc(retention=0, rows_per_second=rate)
    else:
        time.sleep(0.005)
"""


def _switch(run: Path, state: Path, running: bool) -> None:
    """Turn the collector on or off and wait until it says so (an idle window starts
    only once its last pass has ended)."""
    if running:
        run.touch()
    else:
        run.unlink(missing_ok=True)
    want = "running" if running else "idle"
    while not (state.exists() and state.read_text() == want):
        time.sleep(0.002)


def file_size(path: Path) -> int:
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return path.stat().st_size


def used_size(path: Path) -> int:
    """Bytes of the file's pages in use (not on its free list)."""
    db = sqlite3.connect(path)
    pages, free, size = (db.execute(f"PRAGMA {p}").fetchone()[0]
                         for p in ("page_count", "freelist_count", "page_size"))
    db.close()
    return int((pages - free) * size)


def update_rounds(cluster: percolator.Cluster, table: str, cells: int, rounds: int,
                  gc_every: int | None) -> None:
    for r in range(rounds):
        with percolator.Transaction(cluster) as txn:
            for c in range(cells):
                txn.set(table, b"cell%06d" % c, "c:v", VALUE + b"%06d" % r)
        if gc_every and (r + 1) % gc_every == 0:
            cluster.gc(retention=0)


def storage(directory: Path, cells: int, updates: int) -> dict[str, float]:
    sizes = {}
    for name, rounds, gc_every in (("live", 1, None), ("without", updates, None),
                                   ("with", updates, max(updates // 10, 1))):
        path = directory / f"storage-{name}.db"
        with percolator.connect(f"sqlite:///{path}", safe_point_refresh=REFRESH) as c:
            c.create_table("t")
            update_rounds(c, "t", cells, rounds, gc_every)
        sizes[name] = file_size(path) / cells
        sizes[name + " used"] = used_size(path) / cells
    return sizes


def foreground(url: str, directory: Path, rows: int, windows: int, window: float,
               rate: float) -> tuple[float, float, float]:
    with percolator.connect(url, safe_point_refresh=REFRESH) as c:
        c.create_table("t")
        c.create_table("big")
        for start in range(0, rows, 1000):
            with percolator.Transaction(c) as txn:
                for i in range(start, min(start + 1000, rows)):
                    txn.set("big", b"row%08d" % i, "c:v", VALUE)
        run, state = directory / "gc.run", directory / "gc.state"
        gc = subprocess.Popen([sys.executable, "-c", GC_LOOP, url, str(REFRESH), str(run),
                               str(state), str(rate)], cwd=ROOT)
        try:
            rates: dict[bool, list[float]] = {True: [], False: []}
            n = 0
            for w in range(2 * windows):
                running = w % 2 == 1
                _switch(run, state, running)
                end = time.perf_counter() + window
                done = 0
                t0 = time.perf_counter()
                while time.perf_counter() < end:
                    with percolator.Transaction(c) as txn:
                        txn.set("t", b"hot%d" % (n % 100), "c:v", VALUE)
                    n += 1
                    done += 1
                rates[running].append(done / (time.perf_counter() - t0))
        finally:
            gc.kill()
            gc.wait()
    ratios = [a / b for a, b in zip(rates[True], rates[False], strict=True)]
    return statistics.median(rates[False]), statistics.median(rates[True]), \
        statistics.median(ratios)


def speed(urls: Callable[[str], str], cells: int, versions: int) -> tuple[float, float]:
    """Versions removed per second by a pass vs by raw deletes of the same cells."""
    rates = []
    for mode in ("gc", "raw"):
        with percolator.connect(urls(f"speed-{mode}"), safe_point_refresh=REFRESH) as c:
            c.create_table("t")
            update_rounds(c, "t", cells, versions, None)
            if mode == "gc":
                t0 = time.perf_counter()
                summary = c.gc(retention=0)
                elapsed = time.perf_counter() - t0 - 2 * REFRESH  # less the grace wait
                removed = summary.versions_removed
            else:
                rows = [r for r, _ in internals(c).store.scan("t", None, None, [Read("w")])]
                t0 = time.perf_counter()
                newest = {}
                for start in range(0, len(rows), 200):  # read and delete as a pass does
                    chunk = rows[start:start + 200]
                    cells_read = internals(c).store.read_rows(
                        "t", chunk, [Read("w", versions=None)])
                    muts = []
                    for row in chunk:
                        kept = cells_read[row]["w:c:v"][0][0]
                        newest[row] = kept
                        muts.append(Mutation(row, deletes=[("w:c:v", kept - 1)]))
                    internals(c).store.mutate_rows("t", muts)
                elapsed = time.perf_counter() - t0
                removed = cells * (versions - 1)
            rates.append(removed / elapsed)
    return rates[0], rates[1]


def residue(urls: Callable[[str], str], thrift2: str | None, cells: int) -> dict[str, float]:
    """Cells left after *cells* cells were written, deleted and collected, and the
    pass's seconds, through Thrift1 alone and with the Thrift2 server."""
    found: dict[str, float] = {}
    for mode in ("thrift1", "thrift2"):
        if mode == "thrift2" and thrift2 is None:
            continue
        url = urls(f"residue-{mode}") + (f"&thrift2={thrift2}" if mode == "thrift2" else "")
        with percolator.connect(url, safe_point_refresh=REFRESH) as c:
            c.create_table("t")
            for start in range(0, cells, 500):
                batch = range(start, min(start + 500, cells))
                for delete in (False, True):
                    with percolator.Transaction(c) as txn:
                        for i in batch:
                            if delete:
                                txn.delete("t", b"cell%06d" % i, "c:v")
                            else:
                                txn.set("t", b"cell%06d" % i, "c:v", VALUE)
            t0 = time.perf_counter()
            c.gc(retention=0)
            found[mode + " seconds"] = time.perf_counter() - t0 - 2 * REFRESH
            scan = internals(c).store.scan("t", None, None, [Read("l"), Read("w")])
            found[mode + " cells"] = sum(len(cols) for _, cols in scan)
    return found


@contextlib.contextmanager
def _hbase() -> Iterator[tuple[str, str | None]]:
    """A real HBase's Thrift1 and (if it has one) Thrift2 ``host:port``."""
    from tests._hbase import hbase_for_bench

    with hbase_for_bench("hbase") as hostport:
        yield hostport, os.environ.get("PERCOLATOR_HBASE_THRIFT2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=50, help="updates per cell")
    parser.add_argument("--rows", type=int, default=20000,
                        help="rows of the table a pass scans in the foreground measurement")
    parser.add_argument("--gc-rate", type=float, default=5000.0,
                        help="rows/s of the passes in the foreground measurement, as "
                             "workers run them (python -m observers --gc-rate); 0: no limit")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window", type=float, default=1.0, help="seconds per window")
    parser.add_argument("--soak", action="store_true", help="also run the soak test")
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--backend", choices=("sqlite", "hbase"), default="sqlite")
    args = parser.parse_args(argv)
    command = "python bench/gc.py" + (f" {' '.join(argv)}" if argv else
                                      " " + " ".join(sys.argv[1:])).rstrip()
    if args.backend == "hbase":
        return main_hbase(args, command)
    directory = Path(tempfile.mkdtemp(prefix="percolator-bench-gc-"))
    try:
        sizes = storage(directory, args.cells, args.updates)
        idle, busy, ratio = foreground(f"sqlite:///{directory / 'foreground.db'}", directory,
                                       args.rows, args.windows, args.window, args.gc_rate)
        gc_rate, raw_rate = speed(lambda name: f"sqlite:///{directory / name}.db",
                                  args.cells, args.updates)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    text = f"""## Garbage collection, sqlite (bench/gc.py)

- machine: {os.cpu_count()} cores, {cpu_model()}, CPython {sys.version.split()[0]}
- date: {datetime.now(UTC).strftime("%Y-%m-%d %H:%M")} UTC
- command: `{command.strip()}`

| measurement | value |
|---|---:|
| file bytes per live cell, one version each (live data) | {sizes['live']:,.0f} |
| after {args.updates} updates/cell, no GC | {sizes['without']:,.0f} |
| after {args.updates} updates/cell, a pass every {max(args.updates // 10, 1)} rounds \
| {sizes['with']:,.0f} |
| the same, pages in use (not on the free list) just after the last pass \
| {sizes['with used']:,.0f} |
| **with GC, pages in use / live data** (target <= 2 + a constant) \
| **{sizes['with used'] / sizes['live used']:.2f}** |
| with GC, file size / live data (the file keeps its high-water mark: versions \
written between passes) | {sizes['with'] / sizes['live']:.2f} |
| without GC / live data | {sizes['without'] / sizes['live']:.2f} |
{_cost_rows(args, idle, busy, ratio, gc_rate, raw_rate)}"""
    print(text)
    if not args.no_write:
        write_section("## Garbage collection, sqlite", text)
    if args.soak:
        return subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "--run-slow", "-p", "no:cacheprovider",
             "tests/gc/test_gc_soak.py"], cwd=ROOT)
    return 0


def _cost_rows(args: argparse.Namespace, idle: float, busy: float, ratio: float,
               gc_rate: float, raw_rate: float) -> str:
    """The table rows of the foreground and speed measurements (every backend)."""
    pace = f"{args.gc_rate:,.0f} rows/s" if args.gc_rate else "no rate limit"
    return f"""| single-cell txn/s, no pass running | {idle:,.1f} |
| single-cell txn/s, passes back to back over {args.rows:,} rows in another process, \
{pace} | {busy:,.1f} |
| **txn/s while GC runs / without** (median of {args.windows} window pairs; target >= 0.9) \
| **{ratio:.2f}** |
| versions removed/s by a pass | {gc_rate:,.0f} |
| versions removed/s by raw store deletes of the same cells | {raw_rate:,.0f} |
| **pass / raw deletes** | **{gc_rate / raw_rate:.2f}** |
"""


def main_hbase(args: argparse.Namespace, command: str) -> int:
    from tests._hbase import hbase_store_url

    directory = Path(tempfile.mkdtemp(prefix="percolator-bench-gc-"))
    try:
        with _hbase() as (hostport, thrift2):
            def urls(name: str) -> str:
                return hbase_store_url(hostport, f"gc_{name}")
            left = residue(urls, thrift2, args.cells)
            idle, busy, ratio = foreground(urls("foreground"), directory, args.rows,
                                           args.windows, args.window, args.gc_rate)
            gc_rate, raw_rate = speed(urls, args.cells, args.updates)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    with_thrift2 = (
        f"| cells left, with the Thrift2 server (`thrift2=`) | {left['thrift2 cells']:,.0f} |\n"
        f"| the pass, with it (s) | {left['thrift2 seconds']:.2f} |\n"
        if "thrift2 cells" in left else "| with the Thrift2 server | not run (no Thrift2) |\n"
    )
    text = f"""## Garbage collection, real HBase (bench/gc.py --backend hbase)

- machine: {os.cpu_count()} cores, {cpu_model()}, CPython {sys.version.split()[0]}, \
load average {os.getloadavg()[0]:.1f} at the end
- date: {datetime.now(UTC).strftime("%Y-%m-%d %H:%M")} UTC
- command: `{command.strip()}`

| measurement | value |
|---|---:|
| cells written then deleted, then one pass | {args.cells:,} |
| cells left, Thrift1 alone (each cell's FREE lock) | {left['thrift1 cells']:,.0f} |
| the pass, Thrift1 alone (s) | {left['thrift1 seconds']:.2f} |
{with_thrift2}{_cost_rows(args, idle, busy, ratio, gc_rate, raw_rate)}"""
    print(text)
    if not args.no_write:
        write_section("## Garbage collection, real HBase", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
