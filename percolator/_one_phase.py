"""The one-phase commit of the embedded store: a transaction's checks and writes in
one atomic step of the store (one SQLite write transaction), flat for a single
transaction (:func:`_commit_one_phase`) and batched for a scanner's group of observer
runs (:func:`commit_group`); docs/timestamps.md argues why one phase is safe there."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple

from percolator._commit_checks import (
    _LOCK_PREFIX,
    WriteSet,
    _Cell,
    _check_writes,
    _write_notifications,
    _write_notifications_of,
    _writes_from,
    cells_of,
)
from percolator._encoding import (
    FREE_TAG,
    LOCK,
    WRITE,
    Free,
    encode_lock,
)
from percolator._internals import internals
from percolator._lock_resolver import write_cells
from percolator._store import (
    ATOMICALLY,
    NEWEST_OF_ROW,
    PUT_ROW,
    Cell,
    Mutation,
    offered,
)

if TYPE_CHECKING:
    from percolator._cluster import Cluster
    from percolator._internals import Internals
    from percolator._observer_hooks import Settlement

log = logging.getLogger("percolator._commit")


def _commit_one_phase(ws: WriteSet, steps: _OnePhaseSteps) -> tuple[int, bool] | None:
    """Commit the write set *ws* in one atomic store step (the embedded store,
    :func:`one_phase_steps`).

    One SQLite write transaction checks every cell for conflicts, then writes the
    write records, each carrying its value (no data cell), at a commit timestamp drawn
    inside it, a FREE lock where a cell had no lock cell yet (so a lock cell exists
    wherever a write record does), the notification an observer run served, and the
    weak notifications. An existing FREE lock is left as it was: a two-phase prewriter
    that read it before this commit checks the cell again once it has locked it.
    The commit timestamp is published as in flight from its draw until after the
    COMMIT (:meth:`~percolator._timestamps.HostTimestamps.in_flight`): a start
    timestamp drawn meanwhile is below the commit (from the gap left below it) or is
    handed out once the commit is visible (see docs/timestamps.md).

    The path every application transaction takes, so it is flat: the buffered writes
    as they are, one store read per row, no committer or per-cell objects (those are
    made only for the two-phase path). The checks and the writes are the group
    commit's (:func:`_one_phase_cell_ok`, :func:`_one_phase_puts`). Returns the commit
    timestamp and whether the commit made notifications, or None, having written
    nothing, when a cell is locked by another transaction (the two-phase path
    resolves it) or the persisted block of timestamps has no room.

    :raises ConflictError: a cell was written since the transaction's start.
    """
    start_ts, parts = ws.txn.start_ts, ws.parts
    in_flight, atomically, newest_of_row, put_row = steps
    rows: dict[tuple[str, bytes], list[tuple[str, bytes | None]]] = {}
    for (table, row, column), value in ws.writes.items():
        cells = rows.get((table, row))
        if cells is None:
            rows[(table, row)] = [(column, value)]
        else:
            cells.append((column, value))
    with in_flight(atomically) as draw:
        # Per row, one prepared SELECT of what the checks need of each cell
        # (:data:`_CONFLICT_FIELDS`): for n cells, n lock values, then the n newest
        # write records' timestamps.
        found = [newest_of_row(table, row, _CONFLICT_FIELDS,
                               (cells[0][0],) if len(cells) == 1 else tuple(c for c, _ in cells))
                 for (table, row), cells in rows.items()]
        # Inside the atomic step, after its reads: no GC deletion can fall between
        # this check and the writes (see percolator._safe_point).
        parts.safe_point.check(start_ts)
        for ((table, row), cells), newest in zip(rows.items(), found, strict=True):
            n = len(cells)
            for i, (column, _) in enumerate(cells):
                lock_raw, write_ts = newest[i], newest[n + i]
                # The usual cell passes here, in line: no write record at or above the
                # start (none of them can conflict), no lock or a FREE one.
                if (write_ts is None or write_ts < start_ts) and (
                        lock_raw is None or lock_raw[:1] == FREE_TAG):
                    continue
                if not _one_phase_cell_ok(
                        start_ts, table, row, column, lock_raw,
                        _writes_from(parts.store, table, row, column, start_ts)
                        if write_ts is not None and write_ts >= start_ts else ()):
                    return None
        taken = draw(1)
        if taken is None:
            return None
        commit_ts = taken[0]
        observed = ws.cluster.observed_columns()
        strong: list[tuple[str, bytes, str]] = []
        settles = ws.settlement
        # Each row's puts straight to put_row (no Mutation objects, no grouping by
        # table) unless the commit serves an observer run's notification, whose
        # deletion is batched with the puts of its table.
        row_put = put_row if settles is None else None
        by_table: dict[str, list[Mutation]] = {}
        for ((table, row), cells), newest in zip(rows.items(), found, strict=True):
            puts: list[tuple[str, int, bytes]] = []
            for i, (column, value) in enumerate(cells):
                notify = (table, column) in observed if observed else False
                if notify:
                    strong.append((table, row, column))
                puts += _one_phase_puts(start_ts, commit_ts, column, value, notify,
                                        newest[i] is not None)
            if row_put is not None:
                row_put(table, row, puts)
            else:
                by_table.setdefault(table, []).append(Mutation(row, puts))
        if settles is not None:
            _settles_mutation(ws, by_table)
        for table, mutations in by_table.items():
            if put_row is not None and len(mutations) == 1 and not mutations[0].deletes:
                put_row(table, mutations[0].row, mutations[0].puts)  # no batching
            else:
                parts.store.mutate_rows(table, mutations)
        notifies = bool(ws.weak or strong)
        if notifies:
            _write_notifications_of(ws, strong, commit_ts)
        if settles is not None:
            settles.done = True
        return commit_ts, notifies


_CONFLICT_FIELDS = ((LOCK, "value"), (WRITE, "ts"))
"""What a one-phase commit's conflict read asks of each cell, in the order of its
result: its lock's value (None: no lock cell; a lock cell's value is never empty),
and its newest write record's timestamp (the records themselves only when that is at
or above the start: :func:`percolator._commit_checks._writes_from`)."""


class _OnePhaseSteps(NamedTuple):
    """What a one-phase commit calls on its cluster's store and timestamp source,
    looked up once per cluster (:func:`one_phase_steps`)."""

    in_flight: Callable[[Callable[[], AbstractContextManager[None]]],
                        AbstractContextManager[Callable[[int], range | None]]]
    atomically: Callable[[], AbstractContextManager[None]]
    newest_of_row: Callable[[str, bytes, tuple[tuple[str, str], ...], tuple[str, ...]],
                            tuple[Any, ...]]
    put_row: Callable[[str, bytes, Sequence[tuple[str, int, bytes]]], None] | None


def one_phase_steps(cluster: Cluster, parts: Internals | None = None) -> _OnePhaseSteps | None:
    """Where *cluster* commits in one phase (the embedded store): the timestamp
    source's publication of commit timestamps in flight (``in_flight``, which enters
    the atomic step), the store's atomic step (``atomically``) and the store's row
    read and write the commit makes; None elsewhere. *parts*: the cluster's
    internals where the caller holds them (a transaction, since it began).

    Looked up once per store and timestamp source (kept on the internals, keyed on
    both objects, which tests swap), not per commit."""
    if not cluster.one_phase_commit:
        return None
    if parts is None:
        parts = internals(cluster)
    store, timestamps = parts.store, parts.timestamps
    known = parts.one_phase
    if known is not None and known[0] is store and known[1] is timestamps:
        return known[2]
    atomic = offered(store, ATOMICALLY)
    in_flight = getattr(timestamps, "in_flight", None)
    row_newest = offered(store, NEWEST_OF_ROW)
    steps = None
    if atomic is not None and in_flight is not None and row_newest is not None:
        row_put = offered(store, PUT_ROW)
        steps = _OnePhaseSteps(in_flight, atomic.atomically, row_newest.newest_of_row,
                               row_put.put_row if row_put is not None else None)
    # Holding both objects (not their ids): neither's id can pass to another while kept.
    parts.one_phase = (store, timestamps, steps)
    return steps


def _one_phase_cell_ok(start_ts: int, table: str, row: bytes, column: str,
                       lock_raw: bytes | None, writes: Sequence[Cell]) -> bool:
    """The one-phase checks of one cell, given its newest lock value and its write
    records at or above *start_ts* (inside the atomic step, after the safe-point
    check): False when another transaction holds its lock (or its primary is being
    decided), which the two-phase path resolves.

    :raises ConflictError: first committer wins (:func:`_check_writes`).
    """
    if writes:
        _check_writes(start_ts, table, row, column, writes)
    return lock_raw is None or lock_raw[:1] == FREE_TAG  # else held, or being decided


def _one_phase_puts(start_ts: int, commit_ts: int, column: str, value: bytes | None,
                    notify: bool, has_lock: bool) -> list[tuple[str, int, bytes]]:
    """A one-phase commit's puts for one cell: its write record carrying the value (and
    its notify cell), and a FREE lock where the cell had no lock cell."""
    puts = write_cells(column, start_ts, commit_ts, value is None, notify, value)
    if not has_lock:
        puts.append((_LOCK_PREFIX + column, 0, encode_lock(Free(start_ts, True))))
    return puts


def _settles_mutation(
    ws: WriteSet, by_table: dict[str, list[Mutation]]
) -> Settlement | None:
    """Add to *by_table* the deletion of the notification an observer run serves, if
    *ws* is such a run's (its settlement, returned): its one-phase commit serves it in
    the same atomic step."""
    settlement = ws.settlement  # see percolator._observer_hooks
    if settlement is not None:
        by_table.setdefault(settlement.table, []).append(Mutation(
            settlement.row, deletes=[(settlement.notify_column, settlement.newest)]))
    return settlement


class GroupMember(NamedTuple):
    """A transaction of a group commit (:func:`percolator._commit.commit_group`): its
    write set and the cells of it (:func:`cells_of`), made once; a member the group
    cannot commit goes on as a :class:`~percolator._two_phase.TwoPhaseCommit` of
    them."""

    write_set: WriteSet
    cells: list[_Cell]
    notifies: bool
    """Whether its commit makes notifications (weak ones, or of observed columns)."""

    @classmethod
    def of(cls, ws: WriteSet) -> GroupMember:
        """The member committing *ws*."""
        return cls(ws, *cells_of(ws))


def _one_phase_check(
    member: GroupMember, found: dict[int, tuple[bytes | None, list[Cell]]],
) -> bool:
    """A group member's checks inside the atomic step (see :func:`_one_phase_cell_ok`),
    given what :func:`_read_prewrite_state` read for the whole group. False when a
    cell is locked by another transaction.

    :raises ConflictError: a cell was written since the transaction's start.
    """
    start_ts = member.write_set.txn.start_ts
    # Inside the atomic step, after its reads: no GC deletion can fall between
    # this check and the writes (see percolator._safe_point).
    member.write_set.parts.safe_point.check(start_ts)
    for cell in member.cells:
        lock_raw, writes = found[id(cell)]
        if not _one_phase_cell_ok(start_ts, cell.table, cell.row, cell.column,
                                  lock_raw, writes):
            return False
    return True


def _one_phase_write(member: GroupMember, found: dict[int, tuple[bytes | None, list[Cell]]],
                     commit_ts: int, batch: dict[str, list[Mutation]]) -> None:
    """A group member's writes (:func:`_one_phase_puts`, and the notification an
    observer run served), added to *batch* for the caller to write (a group writes all
    of its members' at once), then its notifications."""
    ws = member.write_set
    start_ts = ws.txn.start_ts
    for cell in member.cells:
        batch.setdefault(cell.table, []).append(Mutation(cell.row, _one_phase_puts(
            start_ts, commit_ts, cell.column, cell.value, cell.notify,
            found[id(cell)][0] is not None)))
    settles = _settles_mutation(ws, batch)
    if member.notifies:
        _write_notifications(ws, member.cells, commit_ts)
    if settles is not None:
        settles.done = True
