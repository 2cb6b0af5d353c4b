"""The two-phase prewrite on every backend: each conflict condition, checked either
by a read and a compare-and-set or, where the store offers ``set_unless``
(Bigtable), by the guards of one conditional mutation; and the store calls a commit
takes on the remote backends."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import percolator
from percolator import Cluster, Transaction
from percolator._commit import commit_transaction
from percolator._encoding import META_TABLE
from percolator._internals import internals
from percolator._timestamps import StoreTimestamps
from percolator.testing import CrashPoint, SimulatedCrash, client_of, crash_commit

T, C = "accounts", "bal:amount"


@pytest.fixture
def accounts(cluster: Cluster) -> Cluster:
    cluster.one_phase_commit = False  # the two-phase path on every backend
    cluster.create_table(T)
    return cluster


def test_a_rollback_record_at_our_start_is_a_conflict(accounts: Cluster) -> None:
    # A transaction rolled back by a cleaner must not commit later (a zombie client
    # that still believes in it): the rollback record sits at its start_ts.
    dying = Transaction(client_of(accounts))
    dying.set(T, b"alice", C, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert Transaction(accounts).get(T, b"alice", C) is None  # rolls it back
    zombie = Transaction(accounts, start_ts=dying.start_ts)
    zombie.set(T, b"alice", C, b"never")
    with pytest.raises(percolator.ConflictError, match="rolled back"):
        zombie.commit()
    assert Transaction(accounts).get(T, b"alice", C) is None


def test_a_later_rollback_record_does_not_block_a_writer(accounts: Cluster) -> None:
    mine = Transaction(accounts)
    dying = Transaction(client_of(accounts))
    dying.set(T, b"alice", C, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert Transaction(accounts).get(T, b"alice", C) is None  # rolls it back
    mine.set(T, b"alice", C, b"mine")
    mine.commit()
    assert Transaction(accounts).get(T, b"alice", C) == b"mine"


def test_an_older_commit_and_a_free_lock_do_not_block_a_writer(accounts: Cluster) -> None:
    for value in (b"1", b"2", b"3"):
        with Transaction(accounts) as txn:
            txn.set(T, b"alice", C, value)
    with Transaction(accounts) as txn:
        txn.delete(T, b"alice", C)
    with Transaction(accounts) as txn:
        txn.set(T, b"alice", C, b"4")
    assert Transaction(accounts).get(T, b"alice", C) == b"4"


def test_a_newer_commit_is_a_conflict_and_leaves_nothing(accounts: Cluster) -> None:
    mine = Transaction(accounts)
    with Transaction(accounts) as winner:
        winner.set(T, b"alice", C, b"winner")
    mine.set(T, b"bob", C, b"mine")  # the primary: locked, then released
    mine.set(T, b"alice", C, b"mine")
    with pytest.raises(percolator.ConflictError, match="after our start") as info:
        mine.commit()
    assert info.value.conflict_ts == winner.commit_ts
    reader = Transaction(accounts)
    assert reader.get(T, b"alice", C) == b"winner" and reader.get(T, b"bob", C) is None
    with Transaction(accounts) as txn:  # no lock left behind
        txn.set(T, b"bob", C, b"next")


def test_a_live_lock_is_a_conflict(accounts: Cluster) -> None:
    holder = Transaction(accounts)
    holder.set(T, b"alice", C, b"held")
    with pytest.raises(SimulatedCrash):  # stops after its prewrite; its owner lives on
        commit_transaction(holder, CrashPoint("prewrite", 0))
    mine = Transaction(accounts)
    mine.set(T, b"alice", C, b"mine")
    with pytest.raises(percolator.ConflictError, match="locked by live transaction"):
        mine.commit()


class _Counted:
    """The cluster's real store behind a proxy that records ``(method, table)`` calls."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: Counter[tuple[str, str]] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in ("read_rows", "mutate_rows", "check_and_set", "set_unless", "increment"):
            return attr

        def counted(table: str, *args: Any, **kwargs: Any) -> Any:
            self.calls[(name, table)] += 1
            return attr(table, *args, **kwargs)

        return counted


# Store calls of a commit of one cell, and of two cells in two rows, after the start
# timestamp (reads of the observed-columns registry left out).
CALLS = {
    # set_unless: the conflict check folded into the lock's conditional mutation
    "bigtable": (
        {("set_unless", T): 1, ("check_and_set", T): 1, ("increment", META_TABLE): 1},
        {("set_unless", T): 2, ("check_and_set", T): 2, ("increment", META_TABLE): 1},
    ),
    # Thrift2: one read of every cell, then checkAndMutate with the data; the commit
    # point writes the primary's record and frees its lock; a secondary's release does
    # the same
    "hbase": (
        {("read_rows", T): 1, ("check_and_set", T): 2, ("increment", META_TABLE): 1},
        {("read_rows", T): 1, ("check_and_set", T): 4, ("increment", META_TABLE): 1},
    ),
    # Thrift1: one read of every cell, then checkAndPut (data written first); commit
    # point, write record, release
    "hbase-thrift1": (
        {("read_rows", T): 1, ("check_and_set", T): 3, ("mutate_rows", T): 1,
         ("increment", META_TABLE): 1},
        {("read_rows", T): 1, ("check_and_set", T): 5, ("mutate_rows", T): 2,
         ("increment", META_TABLE): 1},
    ),
}


@pytest.mark.parametrize("cells", [1, 2], ids=["one-cell", "two-cells"])
def test_store_calls_of_a_commit(accounts: Cluster, backend: str, cells: int) -> None:
    if backend not in CALLS:
        pytest.skip("the embedded store commits in one phase (its own tests count it)")
    counted = _Counted(internals(accounts).store)
    internals(accounts).store = counted  # type: ignore[assignment]
    internals(accounts).timestamps = StoreTimestamps(counted)  # type: ignore[arg-type]
    for _ in range(2):  # the second time over existing cells, FREE locks, older records
        txn = Transaction(accounts)
        for i in range(cells):
            txn.set(T, b"row%d" % i, C, b"v")
        counted.calls.clear()
        txn.commit()
        calls = {k: v for k, v in counted.calls.items() if k != ("read_rows", META_TABLE)}
        assert calls == CALLS[backend][cells - 1]
