"""Weak notifications against a worker's deletion of processed notify versions, with
the steps interleaved deterministically (threads parked on events), on every backend.

A weak notification is written at the commit timestamp of its transaction, drawn
*before* the write. A worker deletes the notify versions at or below the newest one
it processed. So a weak notification can land below such a deletion (the store
contract's second latitude: HBase's delete marker hides it, SQLite and Bigtable keep
it), and it must not matter: the run that processed the newer version started after
that newer version, hence after the weak notification's timestamp, and its reads of
the notifying transaction's cells waited for it (its locks predate its commit
timestamp). What must never happen is a deletion above what the worker processed,
which would swallow a notification that no run has served.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

import percolator
from observers import Observer, Worker
from percolator import Transaction, TransactionBase
from percolator._internals import internals
from percolator._notifications import NOTIFY_WEAK, pending_notifications
from percolator._store import Mutation

ROW = b"r"
OTHER = b"other"


class Recorder(Observer):
    """Records the start timestamp of each run and what it read of ``other/c:x``;
    a run may be held inside ``process`` until the test lets it go."""

    table, column = "docs", "c:n"

    def __init__(self, reads_other: bool) -> None:
        self.reads_other = reads_other
        self.runs: list[tuple[int, bytes | None]] = []
        self.entered = threading.Event()
        self.resume = threading.Event()
        self.resume.set()

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        self.entered.set()
        self.resume.wait(60)
        seen = txn.get(self.table, OTHER, "c:x") if self.reads_other else None
        self.runs.append((txn.start_ts, seen))


@pytest.fixture
def clusters(store_url: str) -> Iterator[tuple[percolator.Cluster, percolator.Cluster]]:
    """The worker's cluster and the notifier's, which commits in two phases on every
    backend (the embedded store's one-phase commit writes weak notifications inside
    its atomic step, where nothing can come between)."""
    with percolator.connect(store_url) as worker, percolator.connect(store_url) as notifier:
        notifier.one_phase_commit = False
        yield worker, notifier
        for table in worker.tables():
            worker.drop_table(table)


def _park_weak_writes(cluster: percolator.Cluster) -> tuple[threading.Event, threading.Event]:
    """Make *cluster*'s store stop before writing a weak notification until released."""
    arrived, go = threading.Event(), threading.Event()
    store = internals(cluster).store
    mutate_rows = store.mutate_rows

    def parked(table: str, mutations: Sequence[Mutation]) -> None:
        if any(value == NOTIFY_WEAK for m in mutations for _, _, value in m.puts):
            arrived.set()
            assert go.wait(60), "the test never released the parked weak write"
        mutate_rows(table, mutations)

    store.mutate_rows = parked  # type: ignore[method-assign]
    return arrived, go


def _notify(cluster: percolator.Cluster) -> Transaction:
    txn = Transaction(cluster)
    txn.set("docs", OTHER, "c:x", b"new")
    txn.notify("docs", ROW, "c:n")
    txn.commit()
    return txn


def _change(cluster: percolator.Cluster) -> int:
    with Transaction(cluster) as txn:
        txn.set("docs", ROW, "c:n", b"changed")
    assert txn.commit_ts is not None
    return txn.commit_ts


def _drain(worker: Worker, cluster: percolator.Cluster) -> None:
    for _ in range(5):
        if not list(pending_notifications(cluster, ["docs"])):
            return
        worker._scanner.serve_row("docs", ROW)
    raise AssertionError("notifications still pending after five passes")


def test_weak_notification_landing_below_a_processed_one_was_served_by_that_run(
    clusters: tuple[percolator.Cluster, percolator.Cluster], backend: str
) -> None:
    cluster, notifier = clusters
    observer = Recorder(reads_other=False)
    worker = Worker(cluster, [observer], threads=1)
    worker.register()
    arrived, go = _park_weak_writes(notifier)
    done: list[Transaction] = []
    thread = threading.Thread(target=lambda: done.append(_notify(notifier)))
    thread.start()
    try:
        assert arrived.wait(60)  # locked, commit timestamp drawn, weak write not yet made
        changed_at = _change(cluster)  # a later change of the notified cell
        worker._scanner.serve_row("docs", ROW)  # processed; notify versions <= it deleted
        assert [start > changed_at for start, _ in observer.runs] == [True]
    finally:
        go.set()
        thread.join()
    weak_at = done[0].commit_ts
    assert weak_at is not None and weak_at < changed_at  # it landed below the deletion
    _drain(worker, cluster)
    # The run that deleted it started after it was asked for; HBase's delete marker
    # hides the late put (one run), the other stores keep it (one more run).
    assert observer.runs[0][0] > weak_at
    assert len(observer.runs) == (1 if backend == "hbase" else 2)


def test_weak_notification_above_what_a_run_processed_survives_its_deletion(
    clusters: tuple[percolator.Cluster, percolator.Cluster],
) -> None:
    cluster, notifier = clusters
    observer = Recorder(reads_other=True)
    worker = Worker(cluster, [observer], threads=1)
    worker.register()
    _change(cluster)
    observer.resume.clear()
    thread = threading.Thread(target=worker._scanner.serve_row, args=("docs", ROW))
    thread.start()
    try:
        assert observer.entered.wait(60)  # the run has started (and read the notify cell)
        weak_at = _notify(notifier).commit_ts  # after the run's start
    finally:
        observer.resume.set()
        thread.join()
    assert weak_at is not None
    assert [seen for _, seen in observer.runs] == [None]  # it did not see the change
    _drain(worker, cluster)
    # The weak notification outlived the first run's deletion: a second run, started
    # after it, saw the notifier's write.
    assert len(observer.runs) == 2
    assert observer.runs[1][0] > weak_at and observer.runs[1][1] == b"new"
