"""The paper's Figure 8 on our stores: the cost of transactions over the raw store.

    python bench/overhead.py                      # embedded SQLite store
    python bench/overhead.py --backend bigtable   # starts the cbtemulator itself
    python bench/overhead.py --backend hbase      # starts a standalone HBase 2.6 (or
                                                  # PERCOLATOR_HBASE_THRIFT=host:port and
                                                  # PERCOLATOR_HBASE_THRIFT2=host:port);
                                                  # over Thrift2, then Thrift1 (--api)
    python bench/overhead.py --backend hbase-test-server   # the Python Thrift test server

Measured in one run: each transactional operation is paired with its raw
counterpart and the two run in alternating chunks of 50 operations, so that the
shared machine's noise hits both alike; a ratio is the median over rounds of the
pair's rate ratio:

* reads: raw latest-version read of one cell vs ``txn.get`` (a transaction reads
  many cells, as in the paper; one start timestamp per 100 reads), and vs a fresh
  transaction per read;
* writes: raw write of one cell vs a transaction that writes one cell and commits;
* a transfer: a transaction that reads two rows and writes both.

Store round trips per operation are counted by a proxy around the store.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import percolator
from bench._common import cpu_model
from percolator.ext import SET_UNLESS, Guard, Mutation, Read, StoreTimestamps, declares, internals

TABLE = "bench"
COLUMN = "c:value"
ROWS = 1000


class CountingStore:
    """Counts the calls (round trips) made to the wrapped store."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name in ("read_rows", "mutate_rows", "check_and_set", "scan", "increment",
                    "set_unless", "put_row", "newest_of_row", "newest_at"):
            # put_row, newest_of_row and newest_at: the embedded store's mutate_rows and
            # read_rows of one row (the one-phase commit's write and conflict read) and
            # of one cell (a transaction's read while no lock is held)
            counted_as = {"put_row": "mutate_rows", "newest_of_row": "read_rows",
                          "newest_at": "read_rows"}.get(name, name)

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls[counted_as] += 1
                return attr(*args, **kwargs)

            return counted
        return attr


class CountingTimestamps:
    def __init__(self, source: Any, calls: Counter[str]) -> None:
        self._source = source
        self._calls = calls

    def get_timestamp(self) -> int:
        self._calls["timestamp"] += 1
        return int(self._source.get_timestamp())

    def get_timestamps(self, n: int) -> range:
        self._calls["timestamp"] += 1
        return self._source.get_timestamps(n)  # type: ignore[no-any-return]

    def close(self) -> None:
        self._source.close()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._source, name)
        if name != "exclusive":
            return attr

        @contextmanager
        def exclusive(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with attr(*args, **kwargs) as draw:

                def counted() -> int:
                    self._calls["timestamp"] += 1
                    return int(draw())

                yield counted

        return exclusive


@contextmanager
def open_backend(backend: str, api: str = "both") -> Iterator[dict[str, str]]:
    """The store URLs to measure, by the label their table's heading gets."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if backend == "sqlite":
        directory = tempfile.mkdtemp(prefix="percolator-bench-")
        try:
            yield {backend: f"sqlite:///{directory}/bench.db"}
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    elif backend == "bigtable":
        sys.path.insert(0, root)
        from tests._bigtable import bigtable_store_url, start_emulator

        proc, hostport = start_emulator()
        try:
            yield {backend: bigtable_store_url(hostport, "overhead")}
        finally:
            proc.kill()
            proc.wait()
    elif backend == "hbase-test-server":
        sys.path.insert(0, root)
        from tests._hbase import hbase_for_bench, hbase_store_url

        with hbase_for_bench("test-server") as hostport:
            yield {backend: hbase_store_url(hostport, "overhead")}
    elif backend == "hbase":
        sys.path.insert(0, root)
        from tests._hbase import hbase_servers_for_bench, hbase_store_url

        with hbase_servers_for_bench() as (thrift1, thrift2):
            urls = {"hbase over Thrift2": hbase_store_url(thrift2, "overhead", api="thrift2"),
                    "hbase over Thrift1": hbase_store_url(thrift1, "overhead")}
            yield {label: url for label, url in urls.items()
                   if api == "both" or label.endswith(api.title())}
    else:
        raise SystemExit(f"unknown backend {backend!r}")


def paired_rates(
    op: Callable[[int], None], base: Callable[[int], None], n: int, chunk: int = 50,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """Rates of *op* and *base* over *n* operations each, run in alternating chunks so
    that the shared machine's noise falls on both alike, timed by *clock*."""
    spent = [0.0, 0.0]
    for first in range(0, n, chunk):
        for side, fn in enumerate((op, base)):
            start = clock()
            for i in range(first, min(first + chunk, n)):
                fn(i)
            spent[side] += clock() - start
    return n / spent[0], n / spent[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend", choices=["sqlite", "bigtable", "hbase", "hbase-test-server"], default="sqlite"
    )
    parser.add_argument(
        "--api", choices=["both", "thrift2", "thrift1"], default="both",
        help="--backend hbase: the store over HBase's Thrift2 server, its Thrift1 server, "
             "or both one after the other on the same HBase (the default)",
    )
    parser.add_argument("--ops", type=int, default=2000, help="operations per side per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall",
        help="time operations by the wall clock (default) or by this process's CPU time "
             "(time.process_time: on a machine busy with other work, wall time mostly "
             "measures the others; the embedded store's work is all in this process)",
    )
    parser.add_argument(
        "--calls", action="store_true",
        help="also time each kind of store call (and a timestamp draw) alone: client "
             "CPU and wall time per call, and the ratios they allow (issue 37)",
    )
    parser.add_argument(
        "--oracle", action="store_true",
        help="draw timestamps from a standalone gRPC oracle process (the production "
             "choice on remote stores) instead of the store's own source",
    )
    args = parser.parse_args(argv)

    with ExitStack() as stack:
        urls = stack.enter_context(open_backend(args.backend, args.api))
        options: dict[str, Any] = {}
        if args.oracle:
            options["oracle"] = stack.enter_context(standalone_oracle())
        failed = 0
        for label, url in urls.items():
            with percolator.connect(url, **options) as cluster:
                failed |= measure(args, cluster, label)
        return failed


@contextmanager
def standalone_oracle() -> Iterator[str]:
    """A ``python -m oracle`` process with its state in a temporary file."""
    from bench.oracle import Server

    with tempfile.TemporaryDirectory(prefix="percolator-bench-oracle-") as tmp:
        server = Server(["--state-file", os.path.join(tmp, "oracle.state")], tmp)
        try:
            server.wait()
            yield f"grpc://{server.address}"
        finally:
            server.kill()


def measure(args: argparse.Namespace, cluster: percolator.Cluster, label: str) -> int:
    store = CountingStore(internals(cluster).store)
    internals(cluster).store = store  # type: ignore[assignment]
    timestamps = internals(cluster).timestamps
    # Timestamps drawn from the store (no oracle) go through the counting proxy
    # too, so that their round trips (increment, or read + check_and_set) are
    # counted; "timestamp" counts the draws themselves.
    counted_source: Any = (
        StoreTimestamps(store) if isinstance(timestamps, StoreTimestamps) else timestamps  # type: ignore[arg-type]
    )
    internals(cluster).timestamps = CountingTimestamps(counted_source, store.calls)
    cluster.create_table(TABLE)
    # the raw side goes through the same counting proxy as the transactions, so that
    # its round trips are counted too (the timing below runs without the proxies)
    raw = store
    raw.create_table("raw", {"d": 0})
    rows = [b"row%06d" % i for i in range(ROWS)]
    with percolator.Transaction(cluster) as txn:
        for row in rows:
            txn.set(TABLE, row, COLUMN, b"x" * 100)
    raw.mutate_rows("raw", [Mutation(row, [("d:" + COLUMN, 1, b"x" * 100)]) for row in rows])

    reader: list[percolator.Transaction] = [percolator.Transaction(cluster)]
    ts = iter(range(10, 10**12))

    def raw_read(i: int) -> None:
        raw.read_rows("raw", [rows[i % ROWS]], [Read("d", (COLUMN,))])

    def txn_read(i: int) -> None:
        if i % 100 == 0:
            reader[0] = percolator.Transaction(cluster)
        reader[0].get(TABLE, rows[i % ROWS], COLUMN)

    def txn_read_fresh(i: int) -> None:
        percolator.Transaction(cluster).get(TABLE, rows[i % ROWS], COLUMN)

    def raw_write(i: int) -> None:
        raw.mutate_rows(
            "raw", [Mutation(rows[i % ROWS], [("d:" + COLUMN, next(ts), b"y" * 100)])]
        )

    def txn_write(i: int) -> None:
        with percolator.Transaction(cluster) as txn:
            txn.set(TABLE, rows[i % ROWS], COLUMN, b"y" * 100)

    def transfer(i: int) -> None:
        a, b = rows[(2 * i) % ROWS], rows[(2 * i + 1) % ROWS]
        with percolator.Transaction(cluster) as txn:
            va = txn.get(TABLE, a, COLUMN) or b""
            vb = txn.get(TABLE, b, COLUMN) or b""
            txn.set(TABLE, a, COLUMN, vb)
            txn.set(TABLE, b, COLUMN, va)

    def transfer_read_together(i: int) -> None:
        # The two rows' snapshot reads in one ReadRows (get_rows): 7 round trips, not 8.
        a, b = rows[(2 * i) % ROWS], rows[(2 * i + 1) % ROWS]
        with percolator.Transaction(cluster) as txn:
            found = txn.get_rows(TABLE, [a, b], [COLUMN])
            txn.set(TABLE, a, COLUMN, found[b].get(COLUMN, b""))
            txn.set(TABLE, b, COLUMN, found[a].get(COLUMN, b""))

    ops = {
        "raw read": raw_read,
        "txn read": txn_read,
        "txn read, own txn": txn_read_fresh,
        "raw write": raw_write,
        "txn write": txn_write,
        "transfer txn": transfer,
        "transfer txn, rows read together": transfer_read_together,
    }
    trips: dict[str, str] = {}
    for name, op in ops.items():
        store.calls.clear()
        for i in range(100):
            op(i)
        trips[name] = ", ".join(f"{k} {v / 100:g}" for k, v in sorted(store.calls.items()))
    # Timed without the counting proxies: their cost, the same on both sides, would
    # pull every ratio towards 1.
    internals(cluster).store, internals(cluster).timestamps = store._store, timestamps
    raw = internals(cluster).store
    pairs = {
        "txn read": "raw read",
        "txn read, own txn": "raw read",
        "txn write": "raw write",
        "transfer txn": "raw write",
        "transfer txn, rows read together": "raw write",
    }
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rates: dict[str, list[float]] = {name: [] for name in ops}
    ratios: dict[str, list[float]] = {name: [] for name in pairs}
    for _ in range(args.rounds):
        for name, base in pairs.items():
            n = args.ops if "transfer" not in name else args.ops // 2
            op_rate, base_rate = paired_rates(ops[name], ops[base], n, clock=clock)
            rates[name].append(op_rate)
            rates[base].append(base_rate)
            ratios[name].append(op_rate / base_rate)

    def ratio(a: str, b: str) -> float:
        assert pairs[a] == b
        return statistics.median(ratios[a])

    source = ", timestamps from a gRPC oracle" if args.oracle else ""
    print(f"## Transaction overhead, {label}{source} (bench/overhead.py)\n")
    print(
        f"- machine: {os.cpu_count()} cores, {cpu_model()}, {platform.python_implementation()} "
        f"{platform.python_version()}"
    )
    print(f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(
        f"- command: `python bench/overhead.py --backend {args.backend}"
        f"{' --api ' + args.api if args.backend == 'hbase' else ''} --ops {args.ops} "
        f"--rounds {args.rounds}{' --oracle' if args.oracle else ''}"
        f"{' --calls' if args.calls else ''}"
        f"{' --clock cpu' if args.clock == 'cpu' else ''}`\n"
    )
    per = "s of CPU time" if args.clock == "cpu" else "s"
    print(f"| operation | ops/{per} (median of rounds) | store calls per op |")
    print("|---|---:|---|")
    for name in ops:
        print(f"| {name} | {statistics.median(rates[name]):,.0f} | {trips[name]} |")
    print()
    print("| ratio (same run, median of per-round ratios) | measured | target | paper |")
    print("|---|---:|---:|---:|")
    # targets: issue 33's (earlier tables of BENCHMARKS.md carry 0.95 and 0.5)
    print(f"| txn read / raw read | {ratio('txn read', 'raw read'):.2f} | 0.90 | 0.94 |")
    print(
        f"| txn read in its own txn / raw read | {ratio('txn read, own txn', 'raw read'):.2f} | | |"
    )
    print(f"| single-cell txn / raw write | {ratio('txn write', 'raw write'):.2f} | 0.45 | 0.23 |")
    print(f"| transfer txn / raw write | {ratio('transfer txn', 'raw write'):.2f} | 0.30 | |")
    print("| transfer txn, rows read together / raw write | "
          f"{ratio('transfer txn, rows read together', 'raw write'):.2f} | 0.30 | |")
    if args.calls:
        per_call(args, raw, internals(cluster).timestamps, rows)
    return 0


def plus(*counts: dict[str, int]) -> dict[str, int]:
    """Round trips by kind of call, summed."""
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    return dict(total)


def per_call(args: argparse.Namespace, store: Any, timestamps: Any, rows: list[bytes]) -> None:
    """Each round trip a transaction makes, alone: client CPU and wall time per call
    (median over rounds of *args.ops* calls), and the ratio to a raw write that those
    costs allow a transaction if its own Python work cost nothing."""
    store.create_table("calls", {"d": 0, "l": 1})
    value = b"y" * 100
    lock = "l:" + COLUMN
    # A prewrite's guards: a lock, or a write newer than the start timestamp (none here).
    guards = [Guard(lock, value_from=b"L"), Guard("d:" + COLUMN, min_ts=10**15)]
    ts = iter(range(10, 10**12))
    held: dict[bytes, bytes | None] = {}

    def cas(i: int) -> None:
        row = rows[i % ROWS]
        new = b"L%d" % i
        assert store.check_and_set("calls", row, lock, held.get(row), new,
                                   [("d:" + COLUMN, next(ts), value)])
        held[row] = new

    calls: dict[str, Callable[[int], None]] = {
        "read_rows (one row)": lambda i: store.read_rows("raw", [rows[i % ROWS]],
                                                          [Read("d", (COLUMN,))]),
        "read_rows (two rows)": lambda i: store.read_rows(
            "raw", [rows[(2 * i) % ROWS], rows[(2 * i + 1) % ROWS]], [Read("d", (COLUMN,))]),
        "mutate_rows (raw write)": lambda i: store.mutate_rows(
            "raw", [Mutation(rows[i % ROWS], [("d:" + COLUMN, next(ts), value)])]),
        "check_and_set (commit point, release)": cas,
        "timestamp draw": lambda i: timestamps.get_timestamp(),
    }
    # A prewrite is one guarded set where the store offers it (Bigtable); elsewhere
    # (HBase: checkAndMutate compares one cell) a read of the row's write and lock
    # columns, then a compare-and-set of the lock that writes the data.
    if declares(store, SET_UNLESS):
        calls["set_unless (prewrite)"] = lambda i: store.set_unless(  # lock and data
            "calls", b"s" + rows[i % ROWS], lock, b"F%d" % i, guards,
            [("d:" + COLUMN, next(ts), value)])
        prewrite = {"set_unless (prewrite)": 1}
    else:
        calls["check_and_set (prewrite)"] = lambda i: store.check_and_set(
            "calls", b"s%d" % i, lock, None, b"F%d" % i, [("d:" + COLUMN, next(ts), value)])
        prewrite = {"read_rows (one row)": 1, "check_and_set (prewrite)": 1}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    wall: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for i in range(args.ops):
                call(i)
            cpu[name].append((time.process_time() - cpu0) / args.ops * 1e6)
            wall[name].append((time.perf_counter() - wall0) / args.ops * 1e6)
    print("\n| store call | client CPU us per call | wall us per call |")
    print("|---|---:|---:|")
    for name in calls:
        print(f"| {name} | {statistics.median(cpu[name]):,.0f} | "
              f"{statistics.median(wall[name]):,.0f} |")
    # A transaction's round trips, by the kind of call each is.
    trips = {
        # A write-only transaction commits at the start timestamp its thread's
        # previous commit drew: one timestamp request (docs/timestamps.md).
        "single-cell txn": ("1 timestamp request, prewrite, commit point",
                            plus({"timestamp draw": 1,
                                  "check_and_set (commit point, release)": 1}, prewrite)),
        "transfer txn": ("2 reads, 2 timestamps, 2 prewrites, commit point, release",
                         plus({"read_rows (one row)": 2, "timestamp draw": 2,
                               "check_and_set (commit point, release)": 2},
                              prewrite, prewrite)),
        "transfer txn, rows read together": (
            "1 read, 2 timestamps, 2 prewrites, commit point, release",
            plus({"read_rows (two rows)": 1, "timestamp draw": 2,
                  "check_and_set (commit point, release)": 2}, prewrite, prewrite)),
    }
    print("\n| operation | its round trips | their client CPU, us | ceiling / raw write, "
          "by CPU | their wall, us | ceiling / raw write, by wall |")
    print("|---|---|---:|---:|---:|---:|")
    write = "mutate_rows (raw write)"
    for op, (what, counts) in trips.items():
        costs = []
        for per in (cpu, wall):
            spent = sum(k * statistics.median(per[name]) for name, k in counts.items())
            costs.append((spent, statistics.median(per[write]) / spent))
        print(f"| {op} | {what} | {costs[0][0]:,.0f} | {costs[0][1]:.2f} | "
              f"{costs[1][0]:,.0f} | {costs[1][1]:.2f} |")

if __name__ == "__main__":
    raise SystemExit(main())
