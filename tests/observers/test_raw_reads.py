"""A worker reads notifications raw, outside any snapshot, and then begins the run
that serves them: the run's snapshot must hold what the scan read, or the run sees no
change, skips, and deletes the notification of a change that no observer ever saw.

The embedded store's one-phase commit is the case: its commit is readable from its
COMMIT on, a moment before its in-flight slot is cleared (docs/timestamps.md)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import percolator
from observers import Observer, Worker
from percolator import TransactionBase
from percolator._internals import internals
from percolator._notifications import pending_notifications
from tests._concurrency import ParkedAfterCommit


class Copy(Observer):
    table, column = "t", "in:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, "out:v", txn.get(self.table, row, column) or b"")


class Drawing:
    """The cluster's timestamp source; *drawing* is set when a thread other than
    *writer* draws."""

    def __init__(self, source: Any, writer: threading.Thread) -> None:
        self._source = source
        self.writer = writer
        self.drawing = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def get_timestamp(self) -> int:
        if threading.current_thread() is not self.writer:
            self.drawing.set()
        return int(self._source.get_timestamp())


def _out(cluster: percolator.Cluster) -> bytes | None:
    with percolator.Snapshot(cluster) as snap:
        return snap.get("t", b"r", "out:v")


def test_a_run_begun_between_a_commits_COMMIT_and_its_slot_clearing_serves_it(
    tmp_path: Path,
) -> None:
    """The writer's one-phase commit is parked after its COMMIT, its slot still set.
    The worker reads the notification (raw) and begins its run: the run's start
    timestamp is above the commit (it waits for the slot), so the run copies the new
    value. With the gap left open until the slot is cleared, the run's snapshot is
    below the commit: it sees no change, skips, deletes the notification, and the
    value is never copied."""
    with percolator.connect(f"sqlite://{tmp_path}/db") as cluster:
        cluster.create_table("t")
        worker = Worker(cluster, [Copy()], threads=1)
        worker.register()

        def write() -> None:
            with percolator.Transaction(cluster) as txn:
                txn.set("t", b"r", "in:v", b"new")

        writer = threading.Thread(target=write)
        parked = ParkedAfterCommit(internals(cluster).store)
        parked.thread = writer
        drawing = Drawing(internals(cluster).timestamps, writer)
        internals(cluster).store, internals(cluster).timestamps = parked, drawing  # type: ignore[assignment]
        writer.start()
        assert parked.committed.wait(10)
        assert list(pending_notifications(cluster)), "the scan can read the notification"
        run = threading.Thread(target=worker._scanner.serve_row, args=("t", b"r"))
        run.start()
        assert drawing.drawing.wait(10)  # the run is drawing its start timestamp
        parked.proceed.set()
        run.join(10)
        writer.join(10)
        internals(cluster).store, internals(cluster).timestamps = parked._store, drawing._source
        assert _out(cluster) == b"new"
        assert not list(pending_notifications(cluster))


class Below:
    """The cluster's timestamp source, handing out *start* for the next draw: a start
    timestamp below a commit that is already visible, as a faulty source would."""

    def __init__(self, source: Any, start: int) -> None:
        self._source = source
        self.start: int | None = start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def get_timestamp(self) -> int:
        start, self.start = self.start, None
        return start if start is not None else int(self._source.get_timestamp())


def test_a_run_whose_snapshot_is_below_the_notification_leaves_it(tmp_path: Path) -> None:
    """A run whose start timestamp is below the newest notification version it read
    cannot see that change: it leaves the notification for a later pass (which copies
    the value) instead of skipping it and deleting the notification."""
    with percolator.connect(f"sqlite://{tmp_path}/db") as cluster:
        cluster.create_table("t")
        worker = Worker(cluster, [Copy()], threads=1)
        worker.register()
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"r", "in:v", b"new")
        assert txn.commit_ts is not None
        internals(cluster).timestamps = Below(internals(cluster).timestamps, txn.commit_ts - 1)  # type: ignore[assignment]
        worker._scanner.serve_row("t", b"r")
        assert _out(cluster) is None
        assert list(pending_notifications(cluster)), "the notification was deleted unserved"
        worker._scanner.serve_row("t", b"r")
        assert _out(cluster) == b"new"
        assert not list(pending_notifications(cluster))
