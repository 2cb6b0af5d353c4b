"""Write records that carry their value (TiKV's "short value"): a read needs the lock
and the write record only. Two-phase commits inline values up to INLINE_MAX_BYTES on
every backend; the embedded store's one-phase commit inlines every value and writes
no data cell. Records written by lock resolution, or for large values, still point at
the data cell. Also: a one-phase commit leaves an existing FREE lock as it was, so a
two-phase prewriter (or a bulk load) that read the lock before such a commit must
check the cell again once locked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator import Cluster, Transaction
from percolator._bulk import BulkLoad, LoadTxn, prewrite_rows
from percolator._encoding import (
    DATA,
    INLINE_MAX_BYTES,
    LOCK,
    WRITE,
    Free,
    encode_lock,
    inline_value,
)
from percolator._internals import internals
from percolator._store import Mutation, Read
from percolator.testing import CrashPoint, client_of, crash_commit

T, C = "accounts", "bal:amount"


def _newest(cluster: Cluster, row: bytes, family: str) -> tuple[int, bytes] | None:
    found = internals(cluster).store.read_rows(T, [row], [Read(family, (C,))]).get(row, {})
    versions = found.get(f"{family}:{C}")
    return versions[0] if versions else None


@pytest.fixture
def two_phase(cluster: Cluster) -> Cluster:
    cluster.one_phase_commit = False
    cluster.create_table(T)
    return cluster


def test_a_small_put_travels_in_its_lock_and_record_with_no_data_cell(
    two_phase: Cluster,
) -> None:
    with Transaction(two_phase) as txn:
        txn.set(T, b"alice", C, b"10")
        txn.set(T, b"bob", C, b"x" * INLINE_MAX_BYTES)
    for row, value in ((b"alice", b"10"), (b"bob", b"x" * INLINE_MAX_BYTES)):
        record = _newest(two_phase, row, WRITE)
        assert record is not None and inline_value(record[1]) == value
        assert _newest(two_phase, row, DATA) is None
        assert Transaction(two_phase).get(T, row, C) == value
        assert dict(Transaction(two_phase).scan(T, columns=[C]))[row] == {C: value}


def test_a_large_put_points_at_its_data_cell(two_phase: Cluster) -> None:
    big = b"y" * (INLINE_MAX_BYTES + 1)
    with Transaction(two_phase) as txn:
        txn.set(T, b"alice", C, big)
        txn.set(T, b"bob", C, b"small")
    record = _newest(two_phase, b"alice", WRITE)
    assert record is not None and inline_value(record[1]) is None
    assert _newest(two_phase, b"alice", DATA) is not None
    reader = Transaction(two_phase)
    assert reader.get_row(T, b"alice", [C]) == {C: big}
    assert dict(reader.scan(T, columns=[C])) == {b"alice": {C: big}, b"bob": {C: b"small"}}


@pytest.mark.parametrize("point", [CrashPoint("commit_point"), CrashPoint("commit", 0)])
def test_lock_resolution_rolls_a_small_put_forward_from_its_lock(
    two_phase: Cluster, point: CrashPoint,
) -> None:
    big = b"z" * (INLINE_MAX_BYTES + 1)
    dying = Transaction(client_of(two_phase))
    dying.set(T, b"alice", C, b"primary")
    dying.set(T, b"bob", C, b"secondary")
    dying.set(T, b"carol", C, big)
    assert crash_commit(dying, point) is True
    reader = Transaction(two_phase)
    assert reader.get(T, b"bob", C) == b"secondary"  # rolls it forward
    assert reader.get(T, b"carol", C) == big
    small, large = _newest(two_phase, b"bob", WRITE), _newest(two_phase, b"carol", WRITE)
    assert small is not None and inline_value(small[1]) == b"secondary"
    assert _newest(two_phase, b"bob", DATA) is None
    assert large is not None and inline_value(large[1]) is None  # points at its data cell
    assert Transaction(two_phase).get_row(T, b"bob", [C]) == {C: b"secondary"}
    # the primary too (on HBase it was left COMMITTED, carrying its value)
    assert Transaction(two_phase).get(T, b"alice", C) == b"primary"
    primary = _newest(two_phase, b"alice", WRITE)
    assert primary is not None and inline_value(primary[1]) == b"primary"


def test_a_delete_after_an_inlined_put_hides_it(two_phase: Cluster) -> None:
    with Transaction(two_phase) as txn:
        txn.set(T, b"alice", C, b"10")
    with Transaction(two_phase) as txn:
        txn.delete(T, b"alice", C)
    assert Transaction(two_phase).get(T, b"alice", C) is None
    assert list(Transaction(two_phase).scan(T)) == []


# --- the embedded store's one-phase commit ------------------------------------------------


@pytest.fixture
def embedded(sqlite_cluster: Cluster) -> Cluster:
    sqlite_cluster.create_table(T)
    return sqlite_cluster


@pytest.mark.parametrize("size", [3, INLINE_MAX_BYTES + 1, 2 * 1024 * 1024])
def test_one_phase_commit_writes_the_record_and_no_data_cell(embedded: Cluster, size: int) -> None:
    value = b"v" * size
    with Transaction(embedded) as txn:
        txn.set(T, b"alice", C, value)
    record = _newest(embedded, b"alice", WRITE)
    assert record is not None and inline_value(record[1]) == value
    assert _newest(embedded, b"alice", DATA) is None
    assert Transaction(embedded).get(T, b"alice", C) == value


def test_one_phase_commit_creates_a_missing_lock_and_keeps_an_existing_one(
    embedded: Cluster,
) -> None:
    with Transaction(embedded) as txn:
        txn.set(T, b"alice", C, b"1")
    first = _newest(embedded, b"alice", LOCK)
    assert first is not None  # a lock cell wherever a write record is (the loader needs it)
    with Transaction(embedded) as txn:
        txn.set(T, b"alice", C, b"2")
    assert _newest(embedded, b"alice", LOCK) == first
    assert Transaction(embedded).get(T, b"alice", C) == b"2"


def test_one_phase_commit_keeps_a_free_lock_that_outlived_the_cells_records(
    embedded: Cluster,
) -> None:
    """Whether a lock cell exists is the lock's own answer, not the write records':
    a FREE lock with no record beside it (as garbage collection may leave one where it
    cannot remove it) is kept as it was, as a prewriter that read it expects."""
    free = encode_lock(Free(7, True))
    internals(embedded).store.mutate_rows(T, [Mutation(b"bob", [(f"{LOCK}:{C}", 0, free)])])
    assert _newest(embedded, b"bob", WRITE) is None
    with Transaction(embedded) as txn:
        txn.set(T, b"bob", C, b"1")
    assert _newest(embedded, b"bob", LOCK) == (0, free)
    assert Transaction(embedded).get(T, b"bob", C) == b"1"


class _CommitAfterFirstRead:
    """A store proxy that lets another client commit right after the first read of
    the lock family: between a prewriter's read and its compare-and-set."""

    def __init__(self, store: Any, commit: Any) -> None:
        self._store, self._commit = store, commit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_rows(self, table: str, rows: Any, reads: Any) -> Any:
        found = self._store.read_rows(table, rows, reads)
        if self._commit is not None and any(r.family == LOCK for r in reads):
            commit, self._commit = self._commit, None
            commit()
        return found


def _commit_elsewhere(tmp_path: Path, value: bytes) -> Any:
    def commit() -> None:
        with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as other, Transaction(
            other
        ) as txn:
            txn.set(T, b"alice", C, value)
    return commit


def test_a_one_phase_commit_between_a_prewriters_read_and_lock_is_a_conflict(
    embedded: Cluster, tmp_path: Path,
) -> None:
    with Transaction(embedded) as txn:
        txn.set(T, b"alice", C, b"0")  # a FREE lock that the next commit leaves as it is
    embedded.one_phase_commit = False
    mine = Transaction(embedded)
    mine.set(T, b"alice", C, b"mine")
    parts = internals(embedded)
    parts.store = _CommitAfterFirstRead(  # type: ignore[assignment]
        parts.store, _commit_elsewhere(tmp_path, b"theirs"))
    with pytest.raises(percolator.ConflictError, match="after our start"):
        mine.commit()
    assert Transaction(embedded).get(T, b"alice", C) == b"theirs"
    with Transaction(embedded) as txn:  # and our lock was released
        txn.set(T, b"alice", C, b"next")


def test_a_one_phase_commit_between_a_loads_read_and_lock_fails_the_load(
    embedded: Cluster, tmp_path: Path,
) -> None:
    with Transaction(embedded) as txn:
        txn.set(T, b"alice", C, b"0")  # a lock cell exists: the load takes its careful path
    load = BulkLoad(embedded, T, "race")
    txn = load.begin({})
    assert isinstance(txn, LoadTxn)
    parts = internals(embedded)
    parts.store = _CommitAfterFirstRead(  # type: ignore[assignment]
        parts.store, _commit_elsewhere(tmp_path, b"theirs"))
    with pytest.raises(percolator.ConflictError, match="after the load started"):
        list(prewrite_rows(embedded, txn, [(b"alice", {C: b"loaded"})]))
    load.abort()
    assert Transaction(embedded).get(T, b"alice", C) == b"theirs"


def test_a_bulk_load_inlines_small_values(cluster: Cluster) -> None:
    from percolator._bulk import finish_rows

    cluster.create_table(T)
    big = b"z" * (INLINE_MAX_BYTES + 1)
    load = BulkLoad(cluster, T, "inline")
    txn = load.begin({})
    assert isinstance(txn, LoadTxn)
    locked = list(prewrite_rows(cluster, txn, [(b"alice", {C: b"small"}), (b"bob", {C: big})]))
    commit_ts = load.commit({})
    assert finish_rows(cluster, txn, locked, commit_ts) == 2
    small, large = _newest(cluster, b"alice", WRITE), _newest(cluster, b"bob", WRITE)
    assert small is not None and inline_value(small[1]) == b"small"
    assert large is not None and inline_value(large[1]) is None
    reader = Transaction(cluster)
    assert reader.get(T, b"alice", C) == b"small" and reader.get(T, b"bob", C) == big
