"""Observer throughput against threads and processes (issue 15), this checkout against a
base commit, alternated in one run: the embedded store with 1 worker process x 1, 2 and 4
scanner threads and 2 processes x 1 thread, and the latency from a write's commit to
its observer's commit with the default worker.

    python bench/scaling.py [--base 13d1422] [--rounds 3] [--notifications 20000] [--write]

Each measurement runs in a fresh child interpreter whose ``sys.path`` starts at the
checkout measured (the base is checked out with ``git worktree`` in a temporary
directory). Worker processes are ``python -m observers`` of that checkout. The clock
starts when one transaction has written all the notifications (the workers idle
before it) and stops when the notify family is empty, which the parent reads with a
raw ``SELECT count(*)`` every 5 ms (``wait_for_observers`` scans every pending
notification, and on 2 cores its polling took half a core from the workers).
CPU per notification is that of the worker processes. ``--write`` replaces the section
``## Throughput against threads and processes (bench/scaling.py)`` of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
SECTION = "## Throughput against threads and processes (bench/scaling.py)"
SHAPES = ((1, 1), (1, 2), (1, 4), (2, 1))  # (worker processes, threads each)
WAITING_SHAPES = ((1, 1), (1, 4))
WAITING_MS = 1
_WAITING_MODULE = f"""
import time
from observers import Observer


class WaitingCopier(Observer):
    \"\"\"bench/observers.py's Copier after a {WAITING_MS} ms wait (a call to another
    service, say).\"\"\"
    table, column = "bench", "in:v"

    def process(self, txn, row, column):
        time.sleep({WAITING_MS / 1000})
        txn.set(self.table, row, "out:v", txn.get(self.table, row, column) or b"")


OBSERVERS = [WaitingCopier]
"""


def _drain(root: str, tmp: str, procs: int, threads: int, n: int,
           waiting: bool = False) -> dict[str, float]:
    """In the child: N notifications drained by *procs* worker processes, with the
    observer Copier of bench/observers.py, or (*waiting*) one that waits first."""
    import percolator
    from observers import wait_for_observers

    path = f"{tmp}/d{procs}x{threads}-{time.monotonic_ns()}.db"
    url = f"sqlite://{path}"
    env = dict(os.environ, PYTHONPATH=root)
    spec = "bench.observers:OBSERVERS"
    if waiting:  # a module of its own: the base checkout's bench/ lacks it
        Path(tmp, "bench_waiting.py").write_text(_WAITING_MODULE)
        env["PYTHONPATH"] = f"{root}{os.pathsep}{tmp}"
        spec = "bench_waiting:OBSERVERS"
    with percolator.connect(url) as cluster:
        cluster.create_table("bench")
        cluster.observe("bench", "in:v")
        workers = [subprocess.Popen(
            [sys.executable, "-P", "-m", "observers", "--cluster", url, "--observers",
             spec, "--threads", str(threads), "--log-level",
             "WARNING"], cwd=root, env=env) for _ in range(procs)]
        try:
            time.sleep(3)  # the workers start and go idle
            with percolator.Transaction(cluster) as txn:
                for j in range(n):
                    txn.set("bench", b"r%07d" % j, "in:v", b"a%d" % j)
            t0 = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            raw = sqlite3.connect(path)
            while raw.execute('SELECT count(*) FROM "bench#n"').fetchone()[0]:
                time.sleep(0.005)
            elapsed = time.perf_counter() - t0
            raw.close()
            wait_for_observers(cluster, 120)
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(60)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"per_s": n / elapsed, "cpu_us": 1e6 * cpu / n}


def commit_latency(tmp: str, writes: int, threads: int | None = None) -> dict[str, float]:
    """A write every ~20 ms, each to its observer's commit (milliseconds), with a worker
    of *threads* scanner threads (None: its default); the code measured is whichever
    ``percolator`` comes first on ``sys.path`` (bench/observers.py uses it too)."""
    import percolator
    from bench.observers import OBSERVERS
    from observers import Observer, Worker, wait_for_observers

    committed: dict[int, float] = {}
    observed: dict[int, float] = {}

    def on_commit(observer: Observer, table: str, row: bytes, column: str,
                  change_ts: int, commit_ts: int) -> None:
        observed[change_ts] = time.perf_counter()

    with percolator.connect(f"sqlite://{tmp}/lat-{time.monotonic_ns()}.db") as cluster:
        cluster.create_table("bench")
        cluster.observe("bench", "in:v")
        chosen = {} if threads is None else {"threads": threads}  # older Workers lack None
        worker = Worker(cluster, OBSERVERS, on_commit=on_commit, **chosen)
        worker.start()
        time.sleep(0.5)
        for i in range(writes):
            with percolator.Transaction(cluster) as txn:
                txn.set("bench", b"l%05d" % i, "in:v", b"x")
            assert txn.commit_ts is not None
            committed[txn.commit_ts] = time.perf_counter()
            time.sleep(0.02)
        wait_for_observers(cluster, 60)
        worker.stop()
    lat = sorted(1000 * (observed[ts] - t) for ts, t in committed.items() if ts in observed)
    return {"n": len(lat), "p50_ms": lat[len(lat) // 2], "p90_ms": lat[int(len(lat) * 0.9)],
            "p95_ms": lat[int(len(lat) * 0.95)], "max_ms": lat[-1]}


def _child(args: argparse.Namespace) -> None:
    sys.path.insert(0, args.root)
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        if args.child == "latency":
            result: dict[str, Any] = commit_latency(tmp, args.writes)
        else:
            waiting = args.child.endswith("w")
            procs, threads = (int(x) for x in args.child.rstrip("w").split("x"))
            result = _drain(args.root, tmp, procs, threads,
                            args.notifications // 10 if waiting else args.notifications,
                            waiting)
    print(json.dumps(result))


def _measure(root: str, what: str, args: argparse.Namespace) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-P", str(HERE / "bench" / "scaling.py"), "--child", what,
         "--root", root, "--notifications", str(args.notifications),
         "--writes", str(args.writes)],
        check=True, capture_output=True, text=True, cwd=root,
        env=dict(os.environ, PYTHONPATH=root))
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", default="13d1422")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--notifications", type=int, default=20000)
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return 0
    sys.path.insert(0, str(HERE))
    from bench._common import header, publish

    base_dir = tempfile.mkdtemp(prefix="bench-base-")
    subprocess.run(["git", "worktree", "add", "-q", "--detach", base_dir, args.base],
                   check=True, cwd=HERE)
    found: dict[tuple[str, str], list[dict[str, float]]] = {}
    whats = ([f"{p}x{t}" for p, t in SHAPES] + [f"{p}x{t}w" for p, t in WAITING_SHAPES]
             + ["latency"])
    try:
        for r in range(args.rounds):
            for what in whats:
                for name, root in (("base", base_dir), ("this", str(HERE)))[::1 - 2 * (r % 2)]:
                    result = _measure(root, what, args)
                    found.setdefault((name, what), []).append(result)
                    print(r, name, what, result, flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", base_dir], cwd=HERE)

    def med(name: str, what: str, key: str) -> float:
        return statistics.median(x[key] for x in found[(name, what)])

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=HERE).stdout.strip()
    lines = [*header(SECTION, f"python bench/scaling.py --base {args.base} --rounds "
                     f"{args.rounds} --notifications {args.notifications}",
                     f"this checkout ({head}) against {args.base}, alternated, median of "
                     f"{args.rounds} rounds; embedded store, observer `Copier` of "
                     "bench/observers.py; notifications/s from one transaction's "
                     f"{args.notifications:,} notifications to an empty notify family"), "",
             "| worker processes x threads | base notifications/s | this | this/base | "
             "base CPU us/notification | this |", "|---|---|---|---|---|---|"]
    for p, t in SHAPES:
        what = f"{p}x{t}"
        lines.append(
            f"| {p} x {t} | {med('base', what, 'per_s'):,.0f} | {med('this', what, 'per_s'):,.0f}"
            f" | {med('this', what, 'per_s') / med('base', what, 'per_s'):.2f}x | "
            f"{med('base', what, 'cpu_us'):.0f} | {med('this', what, 'cpu_us'):.0f} |")
    for p, t in WAITING_SHAPES:
        what = f"{p}x{t}w"
        lines.append(
            f"| {p} x {t}, observer waiting {WAITING_MS} ms | {med('base', what, 'per_s'):,.0f}"
            f" | {med('this', what, 'per_s'):,.0f} | "
            f"{med('this', what, 'per_s') / med('base', what, 'per_s'):.2f}x | "
            f"{med('base', what, 'cpu_us'):.0f} | {med('this', what, 'cpu_us'):.0f} |")

    def best(name: str) -> float:
        return max(med(name, f"{p}x{t}", "per_s") for p, t in SHAPES)

    one = {n: med(n, "1x1", "per_s") for n in ("base", "this")}
    lines += ["", "| ratio | base | this | target |", "|---|---|---|---|",
              *(f"| {label} | {med('base', w, 'per_s') / one['base']:.2f}x | "
                f"{med('this', w, 'per_s') / one['this']:.2f}x | {target} |"
                for label, w, target in (("1 x 4 threads / 1 x 1", "1x4", ">= 1.3x"),
                                         ("2 processes x 1 / 1 x 1", "2x1", ">= 1.6x"))),
              f"| 1 x 4 threads / 1 x 1, observer waiting {WAITING_MS} ms | "
              f"{med('base', '1x4w', 'per_s') / med('base', '1x1w', 'per_s'):.2f}x | "
              f"{med('this', '1x4w', 'per_s') / med('this', '1x1w', 'per_s'):.2f}x | - |",
              f"| best of this / best of base | - | {best('this') / best('base'):.2f}x | >= 2x |",
              "", "| commit-to-observer latency, default worker | base | this |",
              "|---|---|---|",
              f"| p50 | {med('base', 'latency', 'p50_ms'):.1f} ms | "
              f"{med('this', 'latency', 'p50_ms'):.1f} ms |",
              f"| p95 | {med('base', 'latency', 'p95_ms'):.1f} ms | "
              f"{med('this', 'latency', 'p95_ms'):.1f} ms |", "",
              "What changed since the base: start timestamps no longer wait for commits "
              "(a commit leaves a gap of timestamps below its own for the start timestamps "
              "drawn while it is in flight; docs/timestamps.md), writers of all processes "
              "take turns on a lock file instead of SQLite's sleeping busy handler, an "
              "observer's commit deletes its notification, a scanner commits up to 32 runs "
              "in one SQLite write (`commit_group`, one conflict-check read and a few "
              "statements for all of them), and the scanner threads of a process take turns "
              "at the store work.", "",
              "Threads of one process cannot beat one thread with an observer that only uses "
              "the store. `perf record` of one scanner thread (2026-11-26, 20,000 "
              "notifications) put 64% of its CPU in the Python interpreter, 7% in libc "
              "(allocations and copies, with the GIL held), 13% in SQLite and 13% in the "
              "kernel; only the last two run without the GIL, so even with perfect overlap N "
              "threads reach at most 1 / 0.74 = 1.35x. And those parts come in about twenty "
              "pieces per notification of a microsecond or two each, shorter than a GIL "
              "hand-off (a futex wake and a context switch): before the scanners took turns, "
              "4 threads spent 30% of their CPU in the kernel's futex wake and wait and "
              "drained at 0.42x one thread. Taking turns (the scanners let go of the turn "
              "only around observer code that waits) brings them back to about one thread's "
              "rate, and an observer that waits gains from threads as before (the rows with "
              "a waiting observer). Worker processes do not share a GIL: they are the way to "
              "use more cores.", "",
              f"Two processes on one SQLite file: CPU per notification rises from "
              f"{med('this', '1x1', 'cpu_us'):.0f} to {med('this', '2x1', 'cpu_us'):.0f} us "
              "(each connection's page cache is invalidated by the other's commits, SQLite's "
              "WAL locks and the rows' advisory locks are fcntl locks of files both share, "
              "and the two take turns on the sidecar's lock and the write lock; strace, "
              "2026-11-26: pread64 2.4 -> 2.7 and fcntl 6.6 -> 7.5 calls per notification, "
              "and perf puts the kernel's posix_lock_inode at twice the share; the same pure-"
              "Python loop in two processes costs no more CPU than in one), so even with no "
              "serialisation two processes on two cores reach at most "
              f"2 x {med('this', '1x1', 'cpu_us'):.0f} / {med('this', '2x1', 'cpu_us'):.0f} = "
              f"{2 * med('this', '1x1', 'cpu_us') / med('this', '2x1', 'cpu_us'):.2f}x one "
              "process; SQLite's single writer serialises the write step of both (about a "
              "third of a run: conflict checks, writes and COMMIT), and the parent's "
              "polling for the end takes some of the two cores.", ""]
    publish(SECTION, lines, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
