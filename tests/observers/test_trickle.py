"""Observers at a trickle (issue 47): changes that arrive one at a time while a worker
runs are found by its lookout's look and handed to one sleeping scanner, which serves
the row without a scan pass of its own; on Bigtable the index entries of rows so
served are settled together. What is checked is counted (store calls, passes), never
timed: the latency is measured by ``bench/per_notification.py --trickle``."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import observers._scanner
import percolator
from observers import Observer, Worker
from percolator import Snapshot, Transaction, TransactionBase, metrics
from percolator._encoding import META_TABLE
from percolator._internals import internals
from percolator._notify_index import scan_index
from tests._backends import make_store_url


class Copy(Observer):
    table, column = "docs", "raw:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, "out:v", txn.get(self.table, row, column) or b"")


def write(cluster: percolator.Cluster, row: bytes, value: bytes) -> None:
    with Transaction(cluster) as txn:
        txn.set("docs", row, "raw:v", value)


class CountingStore:
    """The worker's store, counting calls by operation, but those on the meta table:
    the observed-columns registry and the safe point are read at most every half
    second and second of the process, not per notification."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            table = args[0] if args else kwargs.get("table")
            if table != META_TABLE:
                self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


class CountingTimestamps:
    """The worker's timestamp source, counting requests (a store ``increment`` each on
    a store without an oracle)."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.requests = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def get_timestamp(self) -> int:
        self.requests += 1
        return int(self._source.get_timestamp())

    def get_timestamps(self, n: int) -> range:
        self.requests += 1
        drawn: range = self._source.get_timestamps(n)
        return drawn


def absent_runs() -> float:
    values, _ = metrics.snapshot()
    return values.get(("percolator_observer_runs_total", ("Copy", "absent")), 0)


@pytest.fixture
def bigtable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return make_store_url("bigtable", request, tmp_path)


@pytest.mark.bigtable
def test_a_notification_at_a_trickle_costs_at_most_six_store_calls_on_bigtable(
    bigtable_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twenty changes committed one at a time by another client, the worker's lookout
    looking once per two of them (20 changes a second, a look every 100 ms): each look
    hands the new rows over and a scanner serves each alone. Per notification: the
    look's index scan (1/2), the run's read of the row with its notification (1), its
    start and commit timestamps (2, or 1 for the second row of a look, which begins at
    the start the first one's commit drew after the look), its prewrite and commit
    mutations (2), and the served rows' index entries settled together (a deletion
    and a re-check read per batch): 5.1 store calls, against 12.7 when every look rang
    every scanner for passes of two index scans each and each pass settled its row
    alone. No run finds its notification above its snapshot (an absent run). The
    batch is settled at the end here (SETTLE_DELAY set to an hour: the count does not
    depend on how long the test takes); at 20 changes a second a worker settles one
    of about 20 rows each second.

    Fails with one call per notification more than six: a scanner pass per hand-off
    (two scans), each row's entries settled alone (a deletion and a read), the
    notification read apart from the run's read (``Scanner.serve_row``), or a start held
    from a commit before the look used for the newer notification (an absent run, then
    a fresh draw and a second read: caught by the absent count)."""
    n = 20
    monkeypatch.setattr(observers._scanner, "SETTLE_DELAY", 3600.0)
    with percolator.connect(bigtable_url) as cluster, \
            percolator.connect(bigtable_url) as writer:
        cluster.create_table("docs")
        worker = Worker(cluster, [Copy], threads=1)
        worker.register()
        host = internals(cluster)
        store, timestamps = CountingStore(host.store), CountingTimestamps(host.timestamps)
        host.store, host.timestamps = store, timestamps  # type: ignore[assignment]
        absent = absent_runs()
        try:
            seen: frozenset[tuple[str, bytes, str, int]] = frozenset()
            for i in range(0, n, 2):
                write(writer, b"r%02d" % i, b"%d" % i)
                write(writer, b"r%02d" % (i + 1), b"%d" % (i + 1))
                seen = worker._scanner.look(seen)
                served = 0
                while (handed := worker._scanner.bell.take()) is not None:  # as two scanners would
                    worker._scanner.serve_handed(*handed)
                    served += 1
                assert served == 2  # both new rows, each handed over once
            worker._scanner.settle_deferred(force=True)
        finally:
            host.store, host.timestamps = store._store, timestamps._source
        assert worker.stats["committed"] == n
        assert absent_runs() == absent
        assert worker.stats["passes"] == 0  # served without a pass
        assert list(scan_index(host, None, None)) == []  # every entry settled
        with Snapshot(cluster) as snap:
            assert all(snap.get("docs", b"r%02d" % i, "out:v") == b"%d" % i for i in range(n))
    calls = {**store.calls, "timestamp requests": timestamps.requests}
    per_notification = sum(calls.values()) / n
    print(f"{per_notification:.2f} store calls per notification: {calls}")
    assert per_notification <= 6, calls
    assert store.calls["scan"] == n // 2, calls  # the looks' scans, and no pass's


@pytest.fixture
def clusters(store_url: str) -> Iterator[tuple[percolator.Cluster, percolator.Cluster]]:
    """The worker's cluster and another client's: a commit through another Cluster
    object does not ring the worker's bell, as one in another process would not."""
    with percolator.connect(store_url) as cluster, percolator.connect(store_url) as other:
        cluster.create_table("docs")
        yield cluster, other


def test_changes_one_at_a_time_are_served_without_scan_passes(
    clusters: tuple[percolator.Cluster, percolator.Cluster],
) -> None:
    """A worker of two scanner threads goes idle (each made its first pass; idle_max of
    an hour: no timed pass); five changes then arrive one at a time from another client.
    The lookout hands each new row to one scanner, which serves it without a pass: the
    pass count stays where it was, each change is observed once. Fails if the lookout
    rings every scanner for passes of their own (as it did: two passes per change,
    each a scan of the index or of the notify family)."""
    cluster, other = clusters
    observed: Counter[bytes] = Counter()
    arrived = threading.Condition()

    def on_commit(observer: Observer, table: str, row: bytes, column: str, change: int,
                  commit: int) -> None:
        with arrived:
            observed[row] += 1
            arrived.notify_all()

    def observed_rows(count: int) -> Callable[[], bool]:
        return lambda: len(observed) >= count

    worker = Worker(cluster, [Copy], threads=2, idle_max=3600, poll_interval=0.01,
                    on_commit=on_commit)
    with worker:
        deadline = time.monotonic() + 60
        while worker.stats["idle"] < 2:  # both scanners went to sleep
            assert time.monotonic() < deadline
            time.sleep(0.01)
        passes = worker.stats["passes"]
        for i in range(5):
            write(other, b"t%d" % i, b"v%d" % i)
            with arrived:
                assert arrived.wait_for(observed_rows(i + 1), 60), i
        assert worker.stats["passes"] == passes
        assert worker.stats["wakeups"] >= 5
    assert observed == {b"t%d" % i: 1 for i in range(5)}
    with Snapshot(cluster) as snap:
        assert [snap.get("docs", b"t%d" % i, "out:v") for i in range(5)] == [
            b"v%d" % i for i in range(5)]


def test_a_handed_row_whose_run_began_below_its_notification_runs_again(
    clusters: tuple[percolator.Cluster, percolator.Cluster],
) -> None:
    """A look reads a row's notification; the scanner it is handed to holds a start
    timestamp from after the look began but below the notifying commit (as when the
    look read a writer's index entry before its commit point, and the scanner's
    previous commit drew its next start meanwhile). Its run finds the notification
    above its snapshot (an absent run) and leaves it; the scanner runs the row again at
    a fresh start, which serves it. Fails without the second run: the change is left
    for a later pass (the look saw it, so no other look hands it over again)."""
    cluster, _ = clusters
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    below = internals(cluster).timestamps.get_timestamp()
    write(cluster, b"r", b"late")
    worker._scanner.look(frozenset())
    handed = worker._scanner.bell.take()
    assert handed is not None and handed[1] == b"r"
    worker._runner.next_start().fill(below)  # drawn after the look began, below the commit
    absent = absent_runs()
    worker._scanner.serve_handed(*handed)
    assert absent_runs() == absent + 1  # the first run, at the held start
    assert worker.stats["committed"] == 1
    with Snapshot(cluster) as snap:
        assert snap.get("docs", b"r", "out:v") == b"late"
