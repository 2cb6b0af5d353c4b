"""A two-phase commit whose cells share the primary's row (an observer's output and its
acknowledgement, say) locks them in one conditional mutation where the store tests
conflict conditions itself (Bigtable's ``set_unless``), and releases them in the
commit point's own compare-and-set where the store writes other cells of the row with
it (``atomic_row_cas``). Every conflict the cell-by-cell path finds is still found,
and a crash anywhere leaves the transaction wholly visible or wholly invisible."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import percolator
from percolator import Cluster, Transaction
from percolator._commit import CrashPoint
from percolator._encoding import (
    INLINE_MAX_BYTES,
    LOCK,
    WRITE,
    Free,
    WriteKind,
    decode_lock,
    decode_write,
)
from percolator._internals import internals
from percolator._notifications import pending_notifications
from percolator._store import GuardedSet, Read
from percolator.testing import Interleaving, client_of, crash_commit

T, ROW = "t", b"r"


class Counting:
    """The cluster's store, counting calls by name."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


@pytest.fixture
def two_phase(cluster: Cluster) -> Cluster:
    cluster.create_table(T)
    cluster.one_phase_commit = False  # the embedded store too takes the two-phase path
    return cluster


def _locks(cluster: Cluster) -> dict[str, Any]:
    cells = internals(cluster).store.read_rows(T, [ROW], [Read(LOCK)]).get(ROW, {})
    return {name: decode_lock(versions[0][1]) for name, versions in cells.items() if versions}


@pytest.mark.parametrize("columns", [("c:a", "c:b"), ("c:a", "c:b", "c:c")],
                         ids=["two-cells", "three-cells"])
def test_one_row_is_locked_and_committed_in_one_step_each(
    two_phase: Cluster, columns: tuple[str, ...]
) -> None:
    # A value of its own per cell: each cell's lock (which carries it) is its own.
    values = {column: column.encode() for column in columns}
    counting = Counting(internals(two_phase).store)
    internals(two_phase).store = counting  # type: ignore[assignment]
    with Transaction(two_phase) as txn:
        for column, value in values.items():
            txn.set(T, ROW, column, value)
    internals(two_phase).store = counting._store
    guarded = isinstance(counting._store, GuardedSet)
    if guarded:
        assert counting.calls["set_unless"] == 1  # every lock of the row at once
    prewrites = 0 if guarded else len(columns)  # else one compare-and-set per lock
    # The commit point, which releases the row's secondaries with the primary; on a
    # store whose compare-and-set cannot write other cells, the commit point, the
    # primary's release and one release per secondary.
    releases = 1 if counting._store.atomic_row_cas else 1 + len(columns)
    assert counting.calls["check_and_set"] == prewrites + releases
    # Released by the commit itself, not left for readers to roll forward, each lock
    # recording its holder's outcome.
    assert set(_locks(two_phase).values()) == {Free(txn.start_ts, True)}
    with percolator.Snapshot(two_phase) as snap:
        assert snap.get_row(T, ROW, list(columns)) == values


def test_large_values_locked_with_the_row_are_written_with_their_locks(
    two_phase: Cluster
) -> None:
    """Values too large to travel in their locks go to data cells in the same step as
    the locks: the cells locked with the primary, and a cell locked on its own."""
    large = {"c:a": b"a" * (INLINE_MAX_BYTES + 1), "c:b": b"b" * (INLINE_MAX_BYTES + 1)}
    with Transaction(two_phase) as txn:
        for column, value in large.items():
            txn.set(T, ROW, column, value)
        txn.set(T, b"elsewhere", "c:a", large["c:a"])
    with percolator.Snapshot(two_phase) as snap:
        assert snap.get_row(T, ROW, list(large)) == large
        assert snap.get(T, b"elsewhere", "c:a") == large["c:a"]


def test_a_newer_write_to_a_cell_in_the_primarys_row_is_a_conflict(two_phase: Cluster) -> None:
    """First committer wins on every cell of the row, not only on the primary."""
    late = Transaction(two_phase)
    with Transaction(two_phase) as first:
        first.set(T, ROW, "c:b", b"first")
    late.set(T, ROW, "c:a", b"late")
    late.set(T, ROW, "c:b", b"late")
    with pytest.raises(percolator.ConflictError):
        late.commit()
    with percolator.Snapshot(two_phase) as snap:
        assert snap.get_row(T, ROW, ["c:a", "c:b"]) == {"c:b": b"first"}
    assert all(isinstance(lock, Free) for lock in _locks(two_phase).values())


def test_a_live_lock_on_a_cell_in_the_primarys_row_is_respected(two_phase: Cluster) -> None:
    """A live transaction's lock on a secondary of the row (its commit paused after its
    prewrite) makes the commit give way, leaving that lock as it was; the paused
    transaction then commits."""
    with Interleaving(two_phase) as world:
        other = client_of(two_phase)
        holder = Transaction(other)
        holder.set(T, ROW, "c:b", b"holder")
        holder.set(T, b"elsewhere", "c:x", b"holder")
        actor = world.actor("holder", holder.commit, clients=[other])
        actor.run_until(lambda s: s.matches("timestamp"))  # prewritten; commit ts next
        held = _locks(two_phase)[f"{LOCK}:c:b"]
        mine = Transaction(two_phase)
        mine.set(T, ROW, "c:a", b"mine")
        mine.set(T, ROW, "c:b", b"mine")
        with pytest.raises(percolator.ConflictError):
            mine.commit()
        assert _locks(two_phase)[f"{LOCK}:c:b"] == held
        assert isinstance(_locks(two_phase).get(f"{LOCK}:c:a", Free(0, False)), Free)
        actor.finish()
    with percolator.Snapshot(two_phase) as snap:
        assert snap.get_row(T, ROW, ["c:a", "c:b"]) == {"c:b": b"holder"}


@pytest.mark.parametrize("point", [CrashPoint("prewrite", 0), CrashPoint("prewrite", 2),
                                   CrashPoint("commit_point", 0), CrashPoint("commit", 0)])
def test_a_crash_leaves_one_row_wholly_visible_or_wholly_invisible(
    two_phase: Cluster, point: CrashPoint
) -> None:
    client = client_of(two_phase)
    txn = Transaction(client)
    for column in ("c:a", "c:b", "c:c"):
        txn.set(T, ROW, column, b"new")
    txn.set(T, b"other", "c:a", b"new")
    committed = crash_commit(txn, point)
    assert committed == (point.phase != "prewrite")
    with percolator.Snapshot(two_phase) as snap:  # resolves what the crash left
        values = snap.get_row(T, ROW, ["c:a", "c:b", "c:c"])
        other = snap.get(T, b"other", "c:a")
    expected = b"new" if committed else None
    assert values == ({} if expected is None else dict.fromkeys(("c:a", "c:b", "c:c"), expected))
    assert other == expected


def test_every_cell_locked_with_the_primary_holds_off_other_writers(two_phase: Cluster) -> None:
    """While a commit of two cells of one row (both released by a commit before) is
    paused after its prewrite, a transaction writing the second cell gives way (the
    cell is locked, not only the primary), and the paused commit then commits both."""
    with Transaction(two_phase) as before:
        before.set(T, ROW, "c:a", b"before")
        before.set(T, ROW, "c:b", b"before")
    with Interleaving(two_phase) as world:
        other = client_of(two_phase)
        paused = Transaction(other)
        paused.set(T, ROW, "c:a", b"paused")
        paused.set(T, ROW, "c:b", b"paused")
        actor = world.actor("paused", paused.commit, clients=[other])
        actor.run_until(lambda s: s.matches("timestamp"))  # prewritten; commit ts next
        rival = Transaction(two_phase)
        rival.set(T, ROW, "c:b", b"rival")
        with pytest.raises(percolator.ConflictError):
            rival.commit()
        actor.finish()
    with percolator.Snapshot(two_phase) as snap:
        assert snap.get_row(T, ROW, ["c:a", "c:b"]) == {"c:a": b"paused", "c:b": b"paused"}


def test_the_cells_released_with_the_primary_keep_their_kind_and_notifications(
    two_phase: Cluster
) -> None:
    """The primary and the secondaries of its row, released by the commit point itself
    where the store writes other cells with a compare-and-set: a delete is recorded as
    one (garbage collection drops the cell under it), and an observed cell is notified."""
    two_phase.observe(T, "c:c")
    with Transaction(two_phase) as before:
        before.set(T, ROW, "c:b", b"old")
        before.set(T, ROW, "c:d", b"old")
    client = client_of(two_phase)  # made after: reads the observed columns afresh
    with Transaction(client) as txn:
        txn.delete(T, ROW, "c:b")  # the primary
        txn.set(T, ROW, "c:a", b"new")
        txn.delete(T, ROW, "c:d")
        txn.set(T, ROW, "c:c", b"new")
    store = internals(two_phase).store
    records = store.read_rows(T, [ROW], [Read(WRITE, ("c:b", "c:d"))])[ROW]
    assert {name: (versions[0][0], decode_write(versions[0][1])[0])
            for name, versions in records.items()} == {
        f"{WRITE}:{column}": (txn.commit_ts, WriteKind.DELETE) for column in ("c:b", "c:d")}
    assert [(n.row, n.column, n.timestamps) for n in pending_notifications(two_phase)] == [
        (ROW, "c:c", (txn.commit_ts,))]
    with percolator.Snapshot(two_phase) as snap:
        assert snap.get_row(T, ROW, ["c:a", "c:b", "c:c", "c:d"]) == {
            "c:a": b"new", "c:c": b"new"}
