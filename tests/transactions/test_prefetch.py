"""Reads prefetched by prediction (Percolator §2.5): once transactions have read column
B of a row after column A, a first read of A in another row fetches B in the same
store call. A prediction never makes a read wait on a lock it did not ask about, and
never stands in for a read that must wait."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import percolator
from percolator import Cluster, LockedError, RetryPolicy, Transaction
from percolator._internals import internals
from percolator._transaction import PREDICTED_MAX
from percolator.testing import client_of
from tests._concurrency import hold_locks

T = "t"


class CountingReads:
    def __init__(self, store: Any) -> None:
        self._store = store
        self.reads = 0
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_rows(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.reads += 1
        return self._store.read_rows(*args, **kwargs)

    def newest_at(self, *args: Any) -> Any:  # the embedded store's read of one cell
        with self.lock:
            self.reads += 1
        return self._store.newest_at(*args)


@pytest.fixture
def rows(cluster: Cluster) -> Cluster:
    cluster.create_table(T)
    with Transaction(cluster) as txn:
        for i in range(3):
            txn.set(T, b"r%d" % i, "c:a", b"a%d" % i)
            txn.set(T, b"r%d" % i, "c:b", b"b%d" % i)
    return cluster


def _reads_of(cluster: Cluster, row: bytes) -> tuple[int, tuple[bytes | None, ...]]:
    counting = CountingReads(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        snap = percolator.Snapshot(cluster)
        values = (snap.get(T, row, "c:a"), snap.get(T, row, "c:b"))
    finally:
        internals(cluster).store = counting._store
    return counting.reads, values


def test_a_column_read_after_another_comes_with_it_next_time(rows: Cluster) -> None:
    assert _reads_of(rows, b"r0") == (2, (b"a0", b"b0"))  # nothing learned yet
    assert internals(rows).read_predictions[(T, "c:a")] == ("c:b",)
    assert _reads_of(rows, b"r1") == (1, (b"a1", b"b1"))  # b came with a
    assert internals(rows).read_predictions[(T, "c:a")] == ("c:b",)  # not learned twice
    # A transaction's own write of the predicted column wins over the prefetch.
    with Transaction(rows) as txn:
        txn.set(T, b"r2", "c:b", b"mine")
        assert (txn.get(T, b"r2", "c:a"), txn.get(T, b"r2", "c:b")) == (b"a2", b"mine")


def _learn_then_hold_r1_cb(rows: Cluster) -> None:
    """The prediction learns from r0 that c:b follows c:a; then a live writer (a
    two-phase commit stopped after its prewrite) holds r1/c:b."""
    _reads_of(rows, b"r0")
    writer = client_of(rows)
    writer.one_phase_commit = False
    txn = Transaction(writer)
    txn.set(T, b"r1", "c:b", b"new")
    hold_locks(txn)


def test_a_lock_on_a_predicted_column_is_not_waited_for(rows: Cluster) -> None:
    """A live writer holds r1/c:b. Reading r1/c:a returns at once (the prediction
    leaves c:b out); reading r1/c:b itself waits and, the writer being alive, fails
    with LockedError. (Caching the left-out c:b would return b1 without waiting.)"""
    _learn_then_hold_r1_cb(rows)
    internals(rows).lock_wait_policy = RetryPolicy(max_tries=2, delay=0.01, max_delay=0.01,
                                        deadline=None)
    snap = percolator.Snapshot(rows)
    assert snap.get(T, b"r1", "c:a") == b"a1"
    with pytest.raises(LockedError):
        snap.get(T, b"r1", "c:b")


def test_a_predicted_column_left_out_for_its_lock_is_not_read_further(rows: Cluster) -> None:
    """As above, with r1/c:b's value committed below the lock a large one (its write
    record points to a data cell): the left-out column leaves the row read whole, so
    reading r1/c:a makes the one row read, and fetches nothing of c:b's."""
    with Transaction(rows) as txn:
        txn.set(T, b"r1", "c:b", b"B" * 2048)
    _learn_then_hold_r1_cb(rows)
    counting = CountingReads(internals(rows).store)
    internals(rows).store = counting  # type: ignore[assignment]
    try:
        assert percolator.Snapshot(rows).get(T, b"r1", "c:a") == b"a1"
    finally:
        internals(rows).store = counting._store
    assert counting.reads == 1


class AskedColumns(CountingReads):
    """A store that also notes the columns each row read asks for."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.asked: list[tuple[str, ...] | None] = []

    def read_rows(self, table: str, rows: Any, reads: Any) -> Any:
        self.asked += [read.qualifiers for read in reads]
        return super().read_rows(table, rows, reads)


def test_a_row_read_by_get_row_first_learns_and_fetches_the_predicted_columns(
    rows: Cluster,
) -> None:
    """A ``get_row`` of c:a then c:b teaches that c:b follows c:a (the first column it
    names is the row's first read); then a ``get_row`` of c:a in another row brings
    c:b with it, which a ``get`` of it answers without a store call."""
    assert percolator.Snapshot(rows).get_row(T, b"r0", ["c:a", "c:b"]) == {
        "c:a": b"a0", "c:b": b"b0"}
    assert internals(rows).read_predictions == {(T, "c:a"): ("c:b",)}
    counting = CountingReads(internals(rows).store)
    internals(rows).store = counting  # type: ignore[assignment]
    try:
        snap = percolator.Snapshot(rows)
        assert snap.get_row(T, b"r1", ["c:a"]) == {"c:a": b"a1"}
        assert snap.get(T, b"r1", "c:b") == b"b1"
    finally:
        internals(rows).store = counting._store
    assert counting.reads == 1


def test_a_prediction_leaves_out_the_columns_the_transaction_knows(rows: Cluster) -> None:
    """c:b follows c:a; a transaction that wrote r1/c:b, and one that read r2/c:b
    already, each read c:a there (``get``, ``get_row``) without asking the store for
    c:b: their own write or what they read answers it."""
    _reads_of(rows, b"r0")  # learn: c:b follows c:a
    asked = AskedColumns(internals(rows).store)
    internals(rows).store = asked  # type: ignore[assignment]
    try:
        for read in ("get", "get_row"):
            txn = Transaction(rows)
            txn.set(T, b"r1", "c:b", b"mine")
            assert (txn.get(T, b"r1", "c:a") if read == "get"
                    else txn.get_row(T, b"r1", ["c:a"])["c:a"]) == b"a1"
            assert txn.get(T, b"r1", "c:b") == b"mine"
            txn.rollback()
        snap = percolator.Snapshot(rows)
        assert snap.get_row(T, b"r2", ["c:b"]) == {"c:b": b"b2"}
        assert snap.get(T, b"r2", "c:a") == b"a2"
    finally:
        internals(rows).store = asked._store
    assert asked.asked and {q for q in asked.asked if q != ("c:b",)} == {("c:a",)}


def test_predictions_keep_each_column_once_in_the_order_read_up_to_their_bound(
    rows: Cluster,
) -> None:
    """After c:a, a snapshot reads PREDICTED_MAX + 2 other columns of r0: the first
    PREDICTED_MAX are predicted, in the order read; reading them again in r1 adds none
    twice."""
    others = [f"c:k{i:02d}" for i in range(PREDICTED_MAX + 2)]
    with Transaction(rows) as txn:
        for row in (b"r0", b"r1"):
            for column in others:
                txn.set(T, row, column, column.encode())
    for row in (b"r0", b"r1"):
        snap = percolator.Snapshot(rows)
        assert snap.get(T, row, "c:a") == b"a" + row[1:]
        assert [snap.get(T, row, c) for c in others] == [c.encode() for c in others]
        assert internals(rows).read_predictions[(T, "c:a")] == tuple(others[:PREDICTED_MAX])


def test_a_snapshot_remembers_seen_max_cells_and_reads_the_others_again(
    rows: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``_SEEN_MAX`` cells read (two here), a snapshot reads a cell again from the
    store when asked again (``get`` and ``get_row`` alike), where it answers the cells
    it remembers without a store call."""
    monkeypatch.setattr("percolator._transaction._SEEN_MAX", 2)
    counting = CountingReads(internals(rows).store)
    internals(rows).store = counting  # type: ignore[assignment]
    try:
        snap = percolator.Snapshot(rows)
        assert [snap.get(T, row, "c:a") for row in (b"r0", b"r1")] == [b"a0", b"a1"]
        assert (snap.get(T, b"r2", "c:a"), snap.get_row(T, b"r2", ["c:b"])) == (
            b"a2", {"c:b": b"b2"})
        assert counting.reads == 4
        assert snap.get(T, b"r0", "c:a") == b"a0"  # remembered
        assert counting.reads == 4
        assert (snap.get(T, b"r2", "c:a"), snap.get_row(T, b"r2", ["c:b"])) == (
            b"a2", {"c:b": b"b2"})
        assert counting.reads == 6
    finally:
        internals(rows).store = counting._store
