"""A commit writes the notification index's entries (``percolator/_notify_index.py``)
for every notification it makes, on a store that keeps the index, whichever way it
commits.

Bigtable keeps the index (``tests/observers/test_notify_index.py``). Here the
embedded store declares it too: its runs are the ones ``scripts/mutation`` makes, and
only it commits in one phase, so only here can a one-phase commit meet the index."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import percolator
from percolator import Cluster, Transaction
from percolator._internals import internals
from percolator._notifications import pending_notifications
from percolator._notify_index import INDEX_FAMILIES, INDEX_TABLE, scan_index, uses_index
from percolator._store import NOTIFY_INDEX

T, OBSERVED = "docs", "raw:v"


@pytest.fixture
def indexed(tmp_path: Path) -> Iterator[Cluster]:
    """The embedded store, declaring the notification index (as Bigtable does)."""
    with percolator.connect(f"sqlite:///{tmp_path}/indexed.db") as cluster:
        store = internals(cluster).store
        store.capabilities = store.capabilities | {NOTIFY_INDEX}
        store.create_table(INDEX_TABLE, INDEX_FAMILIES)  # as connect() does for such a store
        assert uses_index(store)
        cluster.create_table(T)
        cluster.observe(T, OBSERVED)
        yield cluster


def entries(cluster: Cluster) -> dict[tuple[str, bytes], dict[str, int]]:
    return {(t, r): cols for t, r, cols in scan_index(internals(cluster), None, None)}


@pytest.mark.parametrize("one_phase", [True, False], ids=["one-phase", "two-phase"])
def test_every_notification_of_a_commit_has_an_index_entry(
        indexed: Cluster, one_phase: bool) -> None:
    indexed.one_phase_commit = one_phase
    txn = Transaction(indexed)
    txn.set(T, b"a", OBSERVED, b"strong")  # an observed column: a strong notification
    txn.set(T, b"a", "other:v", b"not observed")
    txn.notify(T, b"b", OBSERVED)  # a weak one
    if not one_phase:
        txn.set(T, b"c", OBSERVED, b"strong")  # a second row: a primary and a secondary
    txn.commit()
    assert txn.commit_ts is not None
    rows = {b"a", b"b"} | (set() if one_phase else {b"c"})
    found = entries(indexed)
    assert set(found) == {(T, row) for row in rows}
    for (_, row), columns in found.items():
        assert list(columns) == [OBSERVED], row
        # a write of the index made by this commit, before its commit point
        assert txn.start_ts < columns[OBSERVED] <= txn.commit_ts, row
    # What workers and wait_for_observers() look for, they find through the entries.
    assert {(p.table, p.row, p.column) for p in pending_notifications(indexed)} == {
        (T, row, OBSERVED) for row in rows}
