"""The flat one-phase commit of the embedded store (``percolator._one_phase._commit_one_phase``,
issue 33) against the other writers of its cells, one store call at a time
(``percolator.testing.Interleaving``: the one-phase commit is one atomic step).

Each test names the check it guards: with that check removed, the test fails (checked
by hand, one mutation at a time). The flat path's other checks are guarded elsewhere:
first committer wins by ``test_basics.py::test_conflict_first_committer_wins_and_leaves_nothing``,
the write records hidden under a rollback record by
``test_basics.py::test_a_rollback_record_does_not_hide_a_conflicting_commit``, the
safe-point check inside the atomic step by
``tests/gc/test_gc.py::test_a_writer_parked_before_its_prewrite_while_a_pass_removes_its_conflict``,
the gap and the in-flight slot by ``test_timestamps.py``, the notification an
observer run serves by
``tests/observers/test_settle.py::test_an_observer_commit_of_its_own_deletes_its_notification``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import Observer, Worker
from percolator import Cluster, ConflictError, Snapshot, Transaction, TransactionBase
from percolator._commit import commit_group, commits_in_one_phase
from percolator._encoding import (
    LOCK,
    WRITE,
    Free,
    WriteKind,
    decode_write,
    encode_lock,
    inline_value,
)
from percolator._internals import internals
from percolator._notifications import pending_notifications
from percolator._one_phase import one_phase_steps
from percolator._store import Read
from percolator.testing import CrashPoint, Interleaving, Step, client_of, crash_commit

T, COL = "cells", "c:v"
ROW = b"r"


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Cluster]:
    with percolator.connect(f"sqlite:///{tmp_path}/one-phase.db") as cluster:
        cluster.create_table(T)
        with Transaction(cluster) as txn:
            txn.set(T, ROW, COL, b"0")
        yield cluster


def two_phase(cluster: Cluster) -> Cluster:
    """Another client, committing in two phases (one store call per step)."""
    client = client_of(cluster)
    client.one_phase_commit = False
    return client


def write(client: Cluster, value: bytes) -> Transaction:
    txn = Transaction(client)
    txn.set(T, ROW, COL, value)
    return txn


def is_timestamp(step: Step) -> bool:
    return step.matches("timestamp")


def value(cluster: Cluster) -> bytes | None:
    with Snapshot(cluster) as snap:
        return snap.get(T, ROW, COL)


def test_a_flat_commit_gives_way_to_a_live_two_phase_lock(embedded: Cluster) -> None:
    """T1 (two-phase) has locked the cell and is about to draw its commit timestamp;
    T2 began after T1 and commits the cell in one phase; T1 then commits.

    Guards the lock test of ``_one_phase_cell_ok`` (a lock that is not FREE sends the
    commit to the two-phase path, which finds its holder alive): without it T2 writes
    its record beside T1's lock and both commit, a lost update."""
    with Interleaving(embedded) as world:
        client = two_phase(embedded)
        t1 = world.actor("T1", write(client, b"T1").commit, clients=[client])
        t1.run_until(is_timestamp)  # locked; its commit timestamp is next
        t2 = write(embedded, b"T2")  # the test's thread: not an actor, runs straight
        with pytest.raises(ConflictError, match="locked by live transaction"):
            t2.commit()
        t1.finish()
    assert value(embedded) == b"T1"


def test_a_flat_commit_of_a_new_cell_leaves_a_free_lock_that_a_prewriter_rechecks(
    embedded: Cluster,
) -> None:
    """T1 (two-phase) has read a new cell's lock and write records (none) and is
    about to lock it; T2, begun after T1, writes the cell in one phase and commits;
    T1 then locks.

    T1 must see T2's commit after its start and give up, leaving T2's value. Either
    of two lines makes it so: the FREE lock that ``_one_phase_puts`` writes where a
    cell had none (T1's compare-and-set from no lock fails, and its read again finds
    the commit), and the prewriter's check of the write records after a
    compare-and-set (``recheck_after_lock``). With both removed T1 commits over T2;
    with either one alone removed the test passes (checked by hand)."""
    new = b"new"
    with Interleaving(embedded) as world:
        client = two_phase(embedded)
        txn = Transaction(client)
        txn.set(T, new, COL, b"T1")
        t1 = world.actor("T1", txn.commit, clients=[client])
        t1.run_until(lambda step: step.matches("check_and_set", row=new))
        with Transaction(embedded) as t2:
            t2.set(T, new, COL, b"T2")
        with pytest.raises(ConflictError):
            t1.finish()
    with Snapshot(embedded) as snap:
        assert snap.get(T, new, COL) == b"T2"


def test_a_flat_commit_of_an_observed_column_makes_its_notification(
    embedded: Cluster,
) -> None:
    """A one-phase commit of an observed column marks the cell dirty (a strong
    notification at the commit timestamp); one of another column does not.

    Guards ``notify`` in ``_commit_one_phase`` (computed from the observed columns):
    without it the change is committed but no observer ever runs for it."""

    class Copy(Observer):
        table, column = T, COL

        def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
            txn.set(T, row, "out:v", txn.get(T, row, column) or b"")

    embedded.create_table("other")
    Worker(embedded, [Copy]).register()
    client = client_of(embedded)  # made after: reads the observed columns afresh
    with Transaction(client) as txn:
        txn.set(T, ROW, COL, b"1")
        txn.set("other", ROW, COL, b"1")
    found = [(p.table, p.row, p.column, p.strong, p.timestamps)
             for p in pending_notifications(embedded)]
    assert found == [(T, ROW, COL, True, (txn.commit_ts,))]


def test_a_group_commit_of_an_observed_column_makes_its_notification(
    embedded: Cluster,
) -> None:
    """As the flat commits of an observed column and of a weak notification, for
    members of a group commit (``_one_phase_write``)."""

    class Copy(Observer):
        table, column = T, COL

        def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
            txn.set(T, row, "out:v", txn.get(T, row, column) or b"")

    embedded.create_table("other")
    Worker(embedded, [Copy]).register()
    client = client_of(embedded)
    observed, other = Transaction(client), Transaction(client)
    observed.set(T, ROW, COL, b"1")
    other.set("other", ROW, COL, b"1")
    other.notify(T, b"weak", COL)  # and a weak notification, at its commit timestamp
    outcomes = commit_group([observed, other])
    assert all(isinstance(o, int) for o in outcomes)
    found = sorted((p.table, p.row, p.column, p.strong, p.weak, p.timestamps)
                   for p in pending_notifications(embedded))
    assert found == [(T, ROW, COL, True, False, (outcomes[0],)),
                     (T, b"weak", COL, False, True, (outcomes[1],))]


def test_an_observer_runs_one_phase_commit_writes_a_row_of_another_table(
    embedded: Cluster,
) -> None:
    """An observer run's one-phase commit (the one that deletes the notification it
    served, batched by table) writes one row of another table, its own mutation of
    that table, with its acknowledgement and the deletion in the notification's."""

    class Index(Observer):
        table, column = T, COL

        def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
            txn.set("index", txn.get(T, row, column) or b"", "by:row", row)

    embedded.create_table("index")
    worker = Worker(embedded, [Index])
    worker.register()
    client = client_of(embedded)  # made after: reads the observed columns afresh
    with Transaction(client) as txn:
        txn.set(T, ROW, COL, b"1")
    worker._scanner.serve_row(T, ROW)
    assert list(pending_notifications(embedded)) == []
    with Snapshot(embedded) as snap:
        assert snap.get("index", b"1", "by:row") == ROW


def test_a_flat_commit_with_a_weak_notification_makes_it(embedded: Cluster) -> None:
    """A one-phase commit that writes a cell and weakly notifies another (of a column
    nobody observes) marks the other dirty, weakly, at its commit timestamp.

    Guards ``txn._weak`` in ``_commit_one_phase``'s ``notifies``: without it the weak
    notification is dropped (the write commits, nothing is marked)."""
    with Transaction(embedded) as txn:
        txn.set(T, ROW, COL, b"1")
        txn.notify(T, b"other", COL)
    found = [(p.table, p.row, p.column, p.weak, p.timestamps)
             for p in pending_notifications(embedded)]
    assert found == [(T, b"other", COL, True, (txn.commit_ts,))]


def test_a_flat_commit_of_several_cells_of_a_row_checks_and_locks_each(
    embedded: Cluster,
) -> None:
    """One transaction writes three cells of one row: one written before its start,
    one written after it (by another transaction), one new. It conflicts on the
    second; without that cell, it commits and leaves a lock cell beside every record,
    a FREE one for the new cell.

    Guards the positions in ``_commit_one_phase`` of each cell's lock and write record
    in the row's one conflict read (``newest_of_row``: the locks of the n cells, then
    their records' timestamps): read from another cell's position, the conflict is missed, or the
    new cell is left without its lock."""
    later, new = "c:later", "c:new"
    with Transaction(embedded) as before:
        before.set(T, ROW, later, b"before")
    txn = Transaction(embedded)
    with Transaction(embedded) as other:
        other.set(T, ROW, later, b"other")
    txn.set(T, ROW, COL, b"1")
    txn.set(T, ROW, later, b"1")
    txn.set(T, ROW, new, b"1")
    with pytest.raises(ConflictError, match=later) as conflict:
        txn.commit()
    assert (conflict.value.table, conflict.value.row, conflict.value.column) == (T, ROW, later)
    with Transaction(embedded) as txn:
        txn.set(T, ROW, COL, b"2")
        txn.set(T, ROW, new, b"2")
    store = internals(embedded).store
    found = store.read_rows(T, [ROW], [Read(LOCK, (COL, later, new))])[ROW]
    assert sorted(found) == [f"{LOCK}:{c}" for c in sorted((COL, later, new))]
    with Snapshot(embedded) as snap:
        assert snap.get_row(T, ROW, [COL, later, new]) == {
            COL: b"2", later: b"other", new: b"2"}


@pytest.mark.parametrize("grouped", [False, True], ids=["flat", "group"])
def test_a_one_phase_commit_of_a_new_cell_leaves_a_free_lock_naming_it_committed(
    embedded: Cluster, grouped: bool
) -> None:
    """Where a cell had no lock cell, a one-phase commit (flat, or a group's member)
    leaves one, as every lock cell of the embedded store (at timestamp 0): FREE, naming
    its transaction, committed, the outcome its last holder had (``_one_phase_puts``).
    A cell that had a FREE lock keeps it as it was."""
    new = b"new"
    before = internals(embedded).store.read_rows(T, [ROW], [Read(LOCK, (COL,))])[ROW]
    txn = Transaction(embedded)
    txn.set(T, ROW, COL, b"1")
    txn.set(T, new, COL, b"1")
    if grouped:
        assert isinstance(commit_group([txn])[0], int)
    else:
        txn.commit()
    found = internals(embedded).store.read_rows(T, [ROW, new], [Read(LOCK, (COL,))])
    assert found[new] == {f"{LOCK}:{COL}": [(0, encode_lock(Free(txn.start_ts, True)))]}
    assert found[ROW] == before


@pytest.mark.parametrize("grouped", [False, True], ids=["flat", "group"])
def test_a_one_phase_delete_writes_a_delete_record(embedded: Cluster, grouped: bool) -> None:
    """A delete committed in one phase (flat, or a group's member) is a DELETE write
    record, a put a PUT carrying its value: garbage collection drops a cell's history
    below a DELETE, and the change feed tells a deletion from a write of nothing."""
    with Transaction(embedded) as first:
        first.set(T, ROW, COL, b"v")
    txn = Transaction(embedded)
    txn.delete(T, ROW, COL)
    txn.set(T, b"other", COL, b"w")
    if grouped:
        assert isinstance(commit_group([txn])[0], int)
    else:
        txn.commit()
    found = internals(embedded).store.read_rows(T, [ROW, b"other"], [Read(WRITE, (COL,))])
    deleted, put = found[ROW][f"{WRITE}:{COL}"][0][1], found[b"other"][f"{WRITE}:{COL}"][0][1]
    assert decode_write(deleted) == (WriteKind.DELETE, txn.start_ts)
    assert (decode_write(put), inline_value(put)) == ((WriteKind.PUT, txn.start_ts), b"w")


def test_a_group_commit_reads_only_the_columns_its_members_write(
    embedded: Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A group commit checks its members' cells in one read per table, of the lock and
    write record of the columns they write and no other (a row's other columns may hold
    much more)."""
    with Transaction(embedded) as first:
        for row in (ROW, b"other"):
            first.set(T, row, COL, b"v")
            first.set(T, row, "c:unwritten", b"x" * 1000)
    members = [Transaction(embedded), Transaction(embedded)]
    members[0].set(T, ROW, COL, b"1")
    members[1].set(T, b"other", COL, b"2")
    store = internals(embedded).store
    read_rows, asked = store.read_rows, []

    def spied(table: str, rows: Any, reads: Any, *args: Any, **kwargs: Any) -> Any:
        if table == T:
            asked.append([read.qualifiers for read in reads])
        return read_rows(table, rows, reads, *args, **kwargs)

    monkeypatch.setattr(store, "read_rows", spied)
    assert all(isinstance(ts, int) for ts in commit_group(members))
    assert asked == [[(COL,), (COL,)]]


class _CountedInFlight:
    """A cluster's timestamp source, counting the publications of one-phase commit
    timestamps in flight (``in_flight``)."""

    def __init__(self, source: Any) -> None:
        self._source, self.calls = source, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def in_flight(self, atomically: Any) -> Any:
        self.calls += 1
        return self._source.in_flight(atomically)


def test_a_one_phase_commit_takes_the_clusters_timestamp_source_as_it_is_now(
    embedded: Cluster,
) -> None:
    """The one-phase steps are looked up once per store and timestamp source, and again
    when either is another object: a commit after the cluster's timestamp source was
    replaced (the fixture's commit looked the steps up with the old one) publishes its
    commit timestamp in flight through the new one."""
    parts = internals(embedded)
    counted = _CountedInFlight(parts.timestamps)
    parts.timestamps = counted
    with Transaction(embedded) as txn:
        txn.set(T, ROW, COL, b"1")
    assert counted.calls == 1
    assert value(embedded) == b"1"


def test_a_one_phase_commit_whose_gap_cannot_be_closed_is_rolled_back_and_raises(
    embedded: Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gap below a one-phase commit's timestamp is closed just before its COMMIT.
    If that fails (here interrupted, as by Ctrl-C), the write transaction is rolled
    back and the commit raises: committed with the gap still open, a start timestamp
    drawn afterwards could be below it; reported committed after a rollback, its
    write would be lost."""
    source = internals(embedded).timestamps

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(source, "_close_gap", interrupted)
    with pytest.raises(KeyboardInterrupt), Transaction(embedded) as txn:
        txn.set(T, ROW, COL, b"1")
    monkeypatch.undo()
    assert value(embedded) == b"0"
    with Transaction(embedded) as txn:  # nothing of it left in flight
        txn.set(T, ROW, COL, b"2")
    assert value(embedded) == b"2"


class _SecondRowFails:
    """The embedded store, whose write of a one-phase commit's second row fails (the
    first is written by then, inside the commit's write transaction)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.rows_put = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def put_row(self, table: str, row: bytes, puts: Any) -> None:
        self.rows_put += 1
        if self.rows_put == 2:
            raise percolator.StoreUnavailable("the second row's write failed (test)")
        self._store.put_row(table, row, puts)


def test_a_one_phase_commit_failing_after_its_first_write_leaves_nothing(
    embedded: Cluster,
) -> None:
    """A one-phase commit whose second row's write fails raises, and its write
    transaction is rolled back: the first row, written by then, is not committed."""
    parts = internals(embedded)
    failing = _SecondRowFails(parts.store)
    parts.store = failing  # type: ignore[assignment]
    txn = Transaction(embedded)
    txn.set(T, b"first", COL, b"1")
    txn.set(T, b"second", COL, b"1")
    with pytest.raises(percolator.StoreUnavailable, match="second row"):
        txn.commit()
    parts.store = failing._store
    assert failing.rows_put == 2
    with Snapshot(embedded) as snap:
        assert (snap.get(T, b"first", COL), snap.get(T, b"second", COL)) == (None, None)
def test_the_one_phase_steps_are_looked_up_once_per_store_and_timestamp_source(
    embedded: Cluster,
) -> None:
    """Commits after the first take the steps the first looked up (the very object),
    not a lookup of their own each; a new lookup once the timestamp source is another
    object, or the store (another client's of the same file), which the commits after
    it take in turn."""
    with Transaction(embedded) as txn:
        txn.set(T, ROW, COL, b"1")
    first = one_phase_steps(embedded)
    assert first is not None and one_phase_steps(embedded) is first
    with Transaction(embedded) as txn:
        txn.set(T, ROW, COL, b"2")
    assert one_phase_steps(embedded) is first
    internals(embedded).timestamps = _CountedInFlight(internals(embedded).timestamps)
    again = one_phase_steps(embedded)
    assert again is not None and again is not first
    with Transaction(embedded) as txn:
        txn.set(T, ROW, COL, b"3")
    assert one_phase_steps(embedded) is again
    own_store = internals(embedded).store
    with percolator.connect(embedded.url) as twin:
        internals(embedded).store = internals(twin).store
        try:
            third = one_phase_steps(embedded)
            assert third is not None and third is not again
            with Transaction(embedded) as txn:
                txn.set(T, ROW, COL, b"4")
            assert one_phase_steps(embedded) is third
        finally:
            internals(embedded).store = own_store
    assert value(embedded) == b"4"


class _NoInFlight:
    """A timestamp source without ``in_flight`` (it cannot publish a commit timestamp
    in flight from inside the store's atomic step)."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def __getattr__(self, name: str) -> Any:
        if name == "in_flight":
            raise AttributeError(name)
        return getattr(self._source, name)


@pytest.mark.parametrize("lacking", ["ATOMICALLY", "NEWEST_OF_ROW", "in_flight", "PUT_ROW"])
def test_a_commit_takes_one_phase_only_where_the_store_and_timestamps_offer_its_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lacking: str,
) -> None:
    """One phase needs the store's atomic step and its read of a row's newest cells,
    and the timestamp source's publication in flight: without any one of them the
    commit takes two phases. The store's row write (PUT_ROW) is not needed: without it
    the one phase writes through ``mutate_rows``."""
    if lacking != "in_flight":
        from percolator import _store
        from percolator.stores.sqlite import SqliteStore

        monkeypatch.setattr(SqliteStore, "capabilities",
                            SqliteStore.capabilities - {getattr(_store, lacking)})
    with percolator.connect(f"sqlite:///{tmp_path}/steps.db") as cluster:
        if lacking == "in_flight":
            internals(cluster).timestamps = _NoInFlight(internals(cluster).timestamps)
        cluster.create_table(T)
        assert commits_in_one_phase(cluster) is (lacking == "PUT_ROW")
        with Transaction(cluster) as txn:
            txn.set(T, ROW, COL, b"1")
        assert value(cluster) == b"1"


def test_a_flat_commit_gives_way_to_a_live_lock_on_its_rows_second_cell(
    embedded: Cluster,
) -> None:
    """As the first test, with the live two-phase lock on the second of the two cells
    the flat commit writes in one row: the commit gives way, and T1's value stays.

    Guards the position of each cell's lock in the row's one conflict read: with the
    first cell's lock (FREE) taken for the second's, T2 writes beside T1's lock."""
    later = "c:later"
    with Interleaving(embedded) as world:
        client = two_phase(embedded)
        txn = Transaction(client)
        txn.set(T, ROW, later, b"T1")
        t1 = world.actor("T1", txn.commit, clients=[client])
        t1.run_until(is_timestamp)  # locked; its commit timestamp is next
        t2 = Transaction(embedded)
        t2.set(T, ROW, COL, b"T2")
        t2.set(T, ROW, later, b"T2")
        with pytest.raises(ConflictError, match="locked by live transaction"):
            t2.commit()
        t1.finish()
    with Snapshot(embedded) as snap:
        assert snap.get_row(T, ROW, [COL, later]) == {COL: b"0", later: b"T1"}


def test_a_flat_commit_meets_the_rollback_record_at_its_own_start(embedded: Cluster) -> None:
    """A transaction rolled back by a cleaner (its two-phase prewrite died) is
    committed again at its start timestamp by a zombie client, in one phase: the
    rollback record at that very timestamp is a conflict, and nothing is written.

    Guards the in-line test of ``_commit_one_phase`` that lets the usual cell skip
    ``_one_phase_cell_ok`` (no write record *at or above* the start): with ``<=`` for
    ``<`` there, the record at the start is skipped and the zombie commits."""
    dying = Transaction(two_phase(embedded))
    dying.set(T, ROW, COL, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert value(embedded) == b"0"  # rolls it back: a rollback record at its start
    zombie = Transaction(embedded, start_ts=dying.start_ts)
    zombie.set(T, ROW, COL, b"never")
    with pytest.raises(ConflictError, match="rolled back"):
        zombie.commit()
    assert value(embedded) == b"0"
