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
from percolator._commit import SimulatedCrash, commit_transaction
from percolator._internals import internals
from percolator.testing import CrashPoint, client_of

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
    # A transaction's own write of the predicted column wins over the prefetch.
    with Transaction(rows) as txn:
        txn.set(T, b"r2", "c:b", b"mine")
        assert (txn.get(T, b"r2", "c:a"), txn.get(T, b"r2", "c:b")) == (b"a2", b"mine")


def test_a_lock_on_a_predicted_column_is_not_waited_for(rows: Cluster) -> None:
    """A live writer holds r1/c:b. Reading r1/c:a returns at once (the prediction
    leaves c:b out); reading r1/c:b itself waits and, the writer being alive, fails
    with LockedError. (Caching the left-out c:b would return b1 without waiting.)"""
    _reads_of(rows, b"r0")  # learn: c:b follows c:a
    writer = client_of(rows)
    writer.one_phase_commit = False
    txn = Transaction(writer)
    txn.set(T, b"r1", "c:b", b"new")
    with pytest.raises(SimulatedCrash):  # stopped after locking; its owner lives on
        commit_transaction(txn, CrashPoint("prewrite", 0))
    internals(rows).lock_wait_policy = RetryPolicy(max_tries=2, delay=0.01, max_delay=0.01,
                                        deadline=None)
    snap = percolator.Snapshot(rows)
    assert snap.get(T, b"r1", "c:a") == b"a1"
    with pytest.raises(LockedError):
        snap.get(T, b"r1", "c:b")
