"""On Bigtable an observer run committed in two phases deletes the notification it
served in its commit point's own ``CheckAndMutateRow`` when the notification lies in
the primary's row (the Copier's case: output and acknowledgement in the notified
row), instead of the worker deleting it in a call of its own afterwards. Only the
versions the run read go: a change committed during the run notifies again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import percolator
from observers import Observer, Worker, wait_for_observers
from percolator import Cluster, TransactionBase
from percolator._internals import internals
from percolator._notifications import pending_notifications
from percolator._notify_index import INDEX_TABLE
from percolator._store import CAS_DELETES, Mutation, declares
from tests.observers.test_settle import Copy, Held


class NotifyDeletes:
    """The cluster's store, counting the worker's own deletions of notify cells (not of
    their index entries)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.deletions = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def mutate_rows(self, table: str, mutations: Sequence[Mutation]) -> None:
        if table != INDEX_TABLE and any(
                c.startswith("n:") for m in mutations for c, _ in m.deletes):
            self.deletions += 1
        self._store.mutate_rows(table, mutations)


@pytest.fixture
def cas_deletes(cluster: Cluster) -> Cluster:
    if not declares(internals(cluster).store, CAS_DELETES):
        pytest.skip("the store's compare-and-set deletes no other cell")
    cluster.create_table("t")
    cluster.observe("t", "in:v")
    return cluster


def test_the_commit_point_deletes_the_served_notification(cas_deletes: Cluster) -> None:
    cluster = cas_deletes
    with percolator.Transaction(cluster) as txn:
        for i in range(10):
            txn.set("t", b"r%02d" % i, "in:v", b"v%d" % i)
    counting = NotifyDeletes(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        with Worker(cluster, [Copy], threads=1) as worker:
            wait_for_observers(cluster, 60)
    finally:
        internals(cluster).store = counting._store
    assert not list(pending_notifications(cluster))
    assert counting.deletions == 0  # every one deleted by its run's commit point
    # ... and each run's commit returned: the worker counts ten runs committed (an
    # error raised after the commit point is no failure of the observer's, but ends the
    # scanner's pass with the run uncounted).
    assert worker.stats["committed"] == 10
    rows = dict(percolator.Transaction(cluster).scan("t"))
    assert {r: v["out:v"] for r, v in rows.items()} == {
        b"r%02d" % i: b"v%d" % i for i in range(10)}


class Elsewhere(Observer):
    """Writes its output in another row first: the primary is not the notified row."""

    table, column = "t", "in:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set("t", b"out-" + row, "out:v", txn.get(self.table, row, column) or b"")


def test_a_run_whose_primary_is_another_row_leaves_the_deletion_to_the_worker(
    cas_deletes: Cluster
) -> None:
    cluster = cas_deletes
    with percolator.Transaction(cluster) as txn:
        txn.set("t", b"r", "in:v", b"v")
    counting = NotifyDeletes(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        with Worker(cluster, [Elsewhere], threads=1):
            wait_for_observers(cluster, 60)
    finally:
        internals(cluster).store = counting._store
    assert not list(pending_notifications(cluster))
    assert counting.deletions == 1
    assert percolator.Transaction(cluster).get("t", b"out-r", "out:v") == b"v"


def test_a_change_made_during_a_run_outlives_the_commit_points_deletion(
    cas_deletes: Cluster
) -> None:
    """A change committed while the run is parked inside the observer (a newer
    notification version) is still pending after the run's commit point, and a second
    run copies it (fails if the commit point deletes every version)."""
    cluster = cas_deletes
    with percolator.Transaction(cluster) as txn:
        txn.set("t", b"r", "in:v", b"first")
    held = Held()
    with Worker(cluster, [held], threads=1):
        assert held.entered.wait(30)
        with percolator.Transaction(cluster) as txn:  # while the run is parked
            txn.set("t", b"r", "in:v", b"second")
        held.go.set()
        wait_for_observers(cluster, 60)
    assert percolator.Transaction(cluster).get("t", b"r", "out:v") == b"second"
    assert held.runs == 2
