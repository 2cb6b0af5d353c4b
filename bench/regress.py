"""The performance guard: this checkout's hot paths against a base commit's, alternated
in one run, each as a ratio to the base; exits 1 when one falls past the tolerance.

    python bench/regress.py --base b858a95                 # 5 rounds, the defaults
    python bench/regress.py --base main --rounds 7 --tolerance 0.05

What runs, on the embedded store (a fresh file per run), or with ``--url`` the Figure 8
operations alone on that store (its tables made for the run and dropped after it;
``--oracle`` draws the timestamps from a ``python -m oracle`` of the run's own, as the
cluster stores do in production)::

    python bench/regress.py --base main --ops 400 --oracle \
        --url 'hbase://127.0.0.1:9091?api=thrift2&table_prefix=regress'


* the operations of Figure 8 (``bench/overhead.py``): raw read, transactional read (one
  start timestamp per 100 reads) and in a transaction of its own, raw write,
  single-cell transaction, transfer (two reads, two writes), in operations per second
  of the process's CPU time (``time.process_time``: on a machine shared with other
  work, wall time mostly measures the others);
* CPU per observer notification: one worker thread drains notifications served by a
  one-cell copier (``time.process_time`` of the process, per notification);
* a group-commit drain: the same with four scanner threads (the worker commits the
  runs of a scan in groups), in CPU per notification too (its wall-clock rate, on a
  machine shared with other work, says more about the others than about the drain).

The base is checked out with ``git worktree add`` in a temporary directory (removed
at the end). Each side runs in its own interpreter (``python -P`` with ``PYTHONPATH``
at its tree: each imports its own code, which the child checks), round after round,
the two sides taking turns at going first, so that the shared machine's noise falls on
both alike; a ratio is the median over rounds of this checkout's figure over the
base's (for CPU, the base's over this checkout's: above 1 is faster either way). The
child uses only what every commit since the Figure 8 tables has (``connect``,
``Transaction``, the store's ``read_rows``/``mutate_rows``, ``observers.Worker``).

This is a benchmark, not a test: it belongs to no test run. Run it before you stop
whenever ``percolator/`` or the observer worker (``observers/_worker.py`` and
its parts) changed (CONTRIBUTING.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

RATES = ("raw read", "txn read", "txn read, own txn", "raw write", "txn write", "transfer txn")
"""Figures where more is better (per second)."""
COSTS = ("CPU per notification", "CPU per notification, 4 threads")
"""Figures where less is better (microseconds)."""
UNITS = {**dict.fromkeys(RATES, "/s"), **dict.fromkeys(COSTS, " us")}


# --- the child: measures the checkout on its PYTHONPATH ------------------------------


def _extension_module(private: str) -> Any:
    """:mod:`percolator.ext`, in whichever checkout is measured: a base from before
    issue 49 has its names in the private module *private* instead (looked up by name,
    so that this file imports nothing private; ``tests/test_imports.py``)."""
    import importlib

    try:
        return importlib.import_module("percolator.ext")
    except ImportError:
        return importlib.import_module(private)


def _raw_store(cluster: Any) -> Any:
    """The cluster's raw store, in whichever checkout is measured: a base from before
    issue 34 has ``cluster.store``, not :func:`percolator.ext.internals`."""
    try:
        internals = _extension_module("percolator._internals").internals
    except ImportError:
        return cluster.store
    return internals(cluster).store


def _figure8(ops: int, url: str | None = None, oracle: str | None = None
             ) -> dict[str, float]:
    """The Figure 8 operations, in operations per second of CPU time, on a fresh SQLite
    file, or on the store of *url* (timestamps from *oracle* if given) in tables made
    for the run and dropped after it."""
    import percolator

    with tempfile.TemporaryDirectory(prefix="percolator-regress-") as tmp, \
            percolator.connect(url or f"sqlite:///{tmp}/bench.db", oracle=oracle) as cluster:
        try:
            return _figure8_on(cluster, ops)
        finally:
            if url:
                cluster.drop_table("bench")
                _raw_store(cluster).drop_table("raw")


def _figure8_on(cluster: Any, ops: int) -> dict[str, float]:
    import percolator

    contract = _extension_module("percolator._store")
    Mutation, Read = contract.Mutation, contract.Read

    results: dict[str, float] = {}
    cluster.create_table("bench")
    store = _raw_store(cluster)
    store.create_table("raw", {"d": 0})
    rows = [b"row%06d" % i for i in range(1000)]
    with percolator.Transaction(cluster) as txn:
        for row in rows:
            txn.set("bench", row, "c:value", b"x" * 100)
    store.mutate_rows("raw", [Mutation(row, [("d:c:value", 1, b"x" * 100)]) for row in rows])
    reader = [percolator.Transaction(cluster)]
    stamps = iter(range(10, 10**12))
    value = b"y" * 100

    def raw_read(i: int) -> None:
        store.read_rows("raw", [rows[i % 1000]], [Read("d", ("c:value",))])

    def txn_read(i: int) -> None:
        if i % 100 == 0:
            reader[0] = percolator.Transaction(cluster)
        reader[0].get("bench", rows[i % 1000], "c:value")

    def txn_read_fresh(i: int) -> None:
        percolator.Transaction(cluster).get("bench", rows[i % 1000], "c:value")

    def raw_write(i: int) -> None:
        store.mutate_rows("raw", [Mutation(rows[i % 1000], [("d:c:value", next(stamps),
                                                             value)])])

    def txn_write(i: int) -> None:
        with percolator.Transaction(cluster) as txn:
            txn.set("bench", rows[i % 1000], "c:value", value)

    def transfer(i: int) -> None:
        a, b = rows[(2 * i) % 1000], rows[(2 * i + 1) % 1000]
        with percolator.Transaction(cluster) as txn:
            va = txn.get("bench", a, "c:value") or b""
            vb = txn.get("bench", b, "c:value") or b""
            txn.set("bench", a, "c:value", vb)
            txn.set("bench", b, "c:value", va)

    for name, op, n in (("raw read", raw_read, ops), ("txn read", txn_read, ops),
                        ("txn read, own txn", txn_read_fresh, ops),
                        ("raw write", raw_write, ops), ("txn write", txn_write, ops),
                        ("transfer txn", transfer, ops // 2)):
        for i in range(min(n, 100)):  # warm: statement caches, predictions
            op(i)
        began = time.process_time()
        for i in range(n):
            op(i)
        results[name] = n / (time.process_time() - began)
    return results


def _drain(notifications: int, threads: int) -> float:
    """CPU microseconds per notification of one worker with *threads* scanner threads
    draining *notifications* (one cell each)."""
    import percolator
    from observers import Observer, Worker

    class Copier(Observer):  # bench/observers.py's, spelled out: old bases lack it
        table, column = "bench", "in:v"

        def process(self, txn: Any, row: bytes, column: str) -> None:
            txn.set(self.table, row, "out:v", txn.get(self.table, row, column) or b"")

    with tempfile.TemporaryDirectory(prefix="percolator-regress-") as tmp, \
            percolator.connect(f"sqlite:///{tmp}/drain.db") as cluster:
        cluster.create_table("bench")
        cluster.observe("bench", "in:v")
        for start in range(0, notifications, 500):
            with percolator.Transaction(cluster) as txn:
                for i in range(start, min(start + 500, notifications)):
                    txn.set("bench", b"r%08d" % i, "in:v", b"a")
        worker = Worker(cluster, [Copier], threads=threads)
        cpu = time.process_time()
        worker.start()
        try:
            while worker.stats["committed"] < notifications:
                time.sleep(0.005)
            cpu = time.process_time() - cpu
        finally:
            worker.stop()
    return 1e6 * cpu / notifications


def child(ops: int, notifications: int, url: str | None, oracle: str | None) -> None:
    import percolator

    results = _figure8(ops, url, oracle)
    if url is None:
        results["CPU per notification"] = _drain(notifications, 1)
        results["CPU per notification, 4 threads"] = _drain(notifications, 4)
    print(json.dumps({"imported": percolator.__file__, **results}))


# --- the parent ------------------------------------------------------------------------


def run_side(tree: Path, ops: int, notifications: int, store: Sequence[str] = ()
             ) -> dict[str, float]:
    """One child's figures, on the checkout *tree*; *store*: the child's ``--url`` and
    ``--oracle`` options, if any."""
    out = subprocess.run(
        [sys.executable, "-P", str(ROOT / "bench" / "regress.py"), "--child",
         "--ops", str(ops), "--notifications", str(notifications), *store],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        check=True, capture_output=True, text=True).stdout
    found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    imported = found.pop("imported")
    if not Path(imported).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the run of {tree} imported percolator from {imported}")
    return {k: float(v) for k, v in found.items()}


def compare(base: list[dict[str, float]], new: list[dict[str, float]], tolerance: float
            ) -> tuple[list[str], list[str]]:
    """The table's lines and the figures past *tolerance*: per figure, the medians of
    each side and the median of the per-round ratios (above 1: this checkout faster)."""
    lines = ["| figure | base | this checkout | ratio (median of rounds) |",
             "|---|---:|---:|---:|"]
    failed = []
    for name in (n for n in (*RATES, *COSTS) if n in base[0]):
        ratios = [(n[name] / b[name]) if name in RATES else (b[name] / n[name])
                  for b, n in zip(base, new, strict=True)]
        ratio = statistics.median(ratios)
        unit = UNITS[name]
        lines.append(f"| {name} | {statistics.median(b[name] for b in base):,.1f}{unit} | "
                     f"{statistics.median(n[name] for n in new):,.1f}{unit} | {ratio:.2f} |")
        if ratio < 1 - tolerance:
            failed.append(f"{name}: {ratio:.2f}")
    for label, side in (("base", base), ("this checkout", new)):
        single = statistics.median(s["txn write"] / s["raw write"] for s in side)
        read = statistics.median(s["txn read"] / s["raw read"] for s in side)
        transfer = statistics.median(s["transfer txn"] / s["raw write"] for s in side)
        lines.append(f"\n{label}: txn read / raw read {read:.2f}, single-cell txn / raw write "
                     f"{single:.2f}, transfer / raw write {transfer:.2f}")
    return lines, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the commit to compare with (required)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=3000,
                        help="operations per Figure 8 figure per round")
    parser.add_argument("--notifications", type=int, default=3000,
                        help="notifications per drain per round")
    parser.add_argument("--tolerance", type=float, default=0.10,
                        help="fail when a ratio is below 1 - this (default 0.10)")
    parser.add_argument("--url", help="the Figure 8 operations alone, on this store (a "
                        "table prefix of the run's own: they make and drop their tables)")
    parser.add_argument("--oracle", nargs="?", const="start", default=None,
                        help="with --url: timestamps from a python -m oracle started for "
                        "the run, or from the oracle TARGET given (grpc://host:port)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.ops, args.notifications, args.url, args.oracle)
        return 0
    if args.oracle and not args.url:
        parser.error("--oracle goes with --url (the embedded store draws its own)")
    if not args.base:
        parser.error("--base COMMIT is required")
    if args.rounds < 1 or args.ops < 2 or args.notifications < 1 or args.tolerance < 0:
        parser.error("--rounds, --ops (>= 2), --notifications must be positive and "
                     "--tolerance >= 0")
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{args.base}^{{commit}}"],
                            cwd=ROOT, capture_output=True, text=True)
    if commit.returncode:
        parser.error(f"--base {args.base!r} is not a commit of this repository")
    sha = commit.stdout.strip()
    with tempfile.TemporaryDirectory(prefix="percolator-regress-base-") as tmp, \
            contextlib.ExitStack() as stack:
        store = [] if not args.url else ["--url", args.url]
        if args.oracle == "start":
            sys.path.insert(0, str(ROOT))
            from bench.overhead import standalone_oracle

            store += ["--oracle", stack.enter_context(standalone_oracle())]
        elif args.oracle:
            store += ["--oracle", args.oracle]
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT,
                       check=True, capture_output=True)
        print(f"base {sha[:7]} checked out in {tree}", file=sys.stderr, flush=True)
        try:
            base: list[dict[str, float]] = []
            new: list[dict[str, float]] = []
            for r in range(args.rounds):
                sides = ((tree, base), (ROOT, new))
                for side, results in (sides if r % 2 == 0 else sides[::-1]):
                    results.append(run_side(side, args.ops, args.notifications, store))
                print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=False, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"## bench/regress.py: {head}{' (with uncommitted changes)' if dirty else ''} "
          f"against {sha[:7]}\n")
    print(f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} "
          f"cores, load average {os.getloadavg()[0]:.1f}")
    print(f"- command: `python bench/regress.py --base {args.base} --rounds {args.rounds} "
          f"--ops {args.ops} --notifications {args.notifications} "
          f"--tolerance {args.tolerance}"
          + (f" --url '{args.url}'" if args.url else "")
          + (" --oracle" if args.oracle else "") + "`\n")
    lines, failed = compare(base, new, args.tolerance)
    print("\n".join(lines))
    if failed:
        print(f"\nslower than the base past the tolerance ({args.tolerance:.0%}): "
              + ", ".join(failed))
        return 1
    print(f"\nno figure slower than the base past the tolerance ({args.tolerance:.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
