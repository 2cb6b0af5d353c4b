"""The checks and reads of a commit, and what it writes besides its cells, shared by
both commit paths (:mod:`percolator._commit`): the conflict checks (first committer
wins) and the reads of a prewrite they look at, the notifications a commit writes, the
crash points of the tests, and the commit-latency record."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from percolator import metrics as _metrics
from percolator._encoding import (
    LOCK,
    NOTIFY,
    WRITE,
    WriteKind,
    decode_write,
    inlined,
)
from percolator._errors import (
    ConflictError,
)
from percolator._notify_index import write_entries
from percolator._store import (
    Cell,
    Guard,
    Mutation,
    Read,
)
from percolator.metrics import inc as _inc
from percolator.metrics import observe as _observe

if TYPE_CHECKING:
    from percolator._cluster import Cluster
    from percolator._internals import Internals
    from percolator._observer_hooks import Settlement
    from percolator._timestamps import NextStart
    from percolator._transaction import TransactionBase

WriteKey = tuple[str, bytes, str]
"""A cell: ``(table, row, column)``."""


class WriteSet(NamedTuple):
    """What a transaction hands its commit, once, as the commit begins
    (``TransactionBase._write_set``, which closes the transaction: none of this changes
    while the commit runs). The commit reads nothing else of the transaction; it gives
    back the commit timestamp (``txn.commit_ts``) and reads the start timestamp
    (``txn.start_ts``, public, drawn at first use: a commit that writes no cell need not
    draw one)."""

    txn: TransactionBase
    cluster: Cluster
    parts: Internals
    """The cluster's parts, looked up once when the transaction began."""
    kind: str
    """The ``kind`` label of the transaction's metrics."""
    writes: Mapping[WriteKey, bytes | None]
    """The buffered writes, in the order first written (None: a delete)."""
    weak: Mapping[WriteKey, None]
    """The cells of its weak notifications."""
    settlement: Settlement | None
    """The notification an observer run's commit serves (:mod:`percolator._observer_hooks`)."""
    next_start: NextStart | None
    """Where an observer run's two-phase commit leaves the start timestamp it draws with
    its commit timestamp."""
    read_state: Mapping[WriteKey, tuple[bytes | None, list[Cell]]] | None = None
    """What the transaction's reads saw of the cells they read: each one's lock value and
    write records at or after start_ts, as the prewrite's own read would give them
    (``TransactionBase._remember``; None: not kept)."""

log = logging.getLogger("percolator._commit")


NOTIFY_WEAK = b"w"


_LOCK_PREFIX, _WRITE_PREFIX = f"{LOCK}:", f"{WRITE}:"


_ROLLBACK_TAG = WriteKind.ROLLBACK.value


"""First byte of every rollback write record."""


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """Where a test harness abandons a commit, as if the committer died there.

    ``phase`` is one of ``"prewrite"`` (after ``index + 1`` cells are locked, the
    primary first), ``"commit_point"`` (right after the primary's commit CAS) or
    ``"commit"`` (after ``index`` secondaries are released).
    """

    phase: str
    index: int = 0


class SimulatedCrash(BaseException):
    """Raised at a :class:`CrashPoint`; leaves the store exactly as a dead process would."""


@dataclass(slots=True)
class _Cell:
    table: str
    row: bytes
    column: str
    value: bytes | None
    notify: bool
    held: bytes = b""

    @property
    def inline(self) -> bytes | None:
        """A small put's value: carried by the lock, then by the write record, with no
        data cell."""
        return inlined(self.value)


def _conflict(start_ts: int, table: str, row: bytes, column: str, why: str,
              ts: int | None) -> ConflictError:
    return ConflictError(
        f"write-write conflict on {table}/{row!r}/{column}: {why} (transaction {start_ts})",
        start_ts=start_ts, conflict_ts=ts, table=table, row=row, column=column,
    )


def _check_writes(start_ts: int, table: str, row: bytes, column: str,
                  writes: Sequence[Cell]) -> None:
    """First committer wins: a change committed after *start_ts* is a conflict, and so
    is a rollback record at it (the transaction was rolled back by a cleaner)."""
    for ts, value in writes:
        kind, _ = decode_write(value)
        if kind is WriteKind.ROLLBACK:
            if ts == start_ts:
                raise _conflict(start_ts, table, row, column, "this transaction was rolled back",
                                ts)
            continue
        if ts > start_ts:
            raise _conflict(start_ts, table, row, column, f"committed at {ts} after our start",
                            ts)


def _successor(tag: bytes) -> bytes:
    """The smallest value above every value starting with the one-byte *tag*."""
    return bytes([tag[0] + 1])


def _not_starting_with(
    tag: bytes, column: str, *, min_ts: int = 0, latest: bool = False
) -> list[Guard]:
    """Guards matching a value of *column* whose first byte is not the one-byte *tag*."""
    return [Guard(column, min_ts=min_ts, latest=latest, value_to=tag),
            Guard(column, min_ts=min_ts, latest=latest, value_from=_successor(tag))]


def _write_weak_notifications(ws: WriteSet, commit_ts: int) -> None:
    # At commit_ts, drawn before this write: it may land under a worker's deletion of a
    # newer notification of the cell, whose run served it (percolator/_store.py).
    by_table: dict[str, list[Mutation]] = {}
    for table, row, column in ws.weak:
        by_table.setdefault(table, []).append(
            Mutation(row, [(f"{NOTIFY}:{column}", commit_ts, NOTIFY_WEAK)])
        )
    for table, mutations in by_table.items():
        ws.parts.store.mutate_rows(table, mutations)


def _write_notifications(ws: WriteSet, cells: list[_Cell], commit_ts: int) -> None:
    """Before the commit point: the weak notify cells, then the index entries of every
    notification the commit makes (``percolator/_notify_index.py``, stores that have
    it), so that whatever writes the strong notify cells later (this committer, or a
    cleaner rolling it forward) finds their entries there."""
    _write_notifications_of(ws, [(c.table, c.row, c.column) for c in cells if c.notify],
                            commit_ts)


def _write_notifications_of(ws: WriteSet, strong: list[tuple[str, bytes, str]],
                            commit_ts: int) -> None:
    """:func:`_write_notifications`, given the cells of the *strong* notifications."""
    if ws.weak:
        _write_weak_notifications(ws, commit_ts)
    write_entries(ws.parts, [*ws.weak, *strong], commit_ts)


def cells_of(ws: WriteSet) -> tuple[list[_Cell], bool]:
    """The cells a commit of *ws* writes, in the order first written (the first is the
    two-phase commit's primary), and whether the commit makes notifications (weak ones,
    or of observed columns)."""
    observed = ws.cluster.observed_columns()
    cells = [_Cell(t, r, c, v, (t, c) in observed) for (t, r, c), v in ws.writes.items()]
    return cells, bool(ws.weak) or (bool(observed) and any(c.notify for c in cells))


_PREWRITE_READS: dict[tuple[str, ...], list[Read]] = {}


"""The reads of :func:`_read_prewrite_state` by columns (the same for every start)."""


def _prewrite_reads(columns: tuple[str, ...]) -> list[Read]:
    """The newest lock and the newest write record of each of *columns* (at any
    timestamp: the same reads for every start, cached)."""
    reads = _PREWRITE_READS.get(columns)
    if reads is None:
        reads = [Read(LOCK, columns), Read(WRITE, columns)]
        if len(_PREWRITE_READS) < 1024:
            _PREWRITE_READS[columns] = reads
    return reads


def _writes_since(store: Any, table: str, row: bytes, column: str, start_ts: int,
                  newest: list[Cell]) -> list[Cell]:
    """A cell's write records at or above *start_ts*, given the *newest* one read: it,
    if at or above the start; only when it is a rollback above the start, which may
    hide an older commit after the start, are all of them read."""
    writes = [w for w in newest if w[0] >= start_ts]
    if writes and writes[0][0] > start_ts and writes[0][1][:1] == _ROLLBACK_TAG:
        writes = _writes_from(store, table, row, column, start_ts)
    return writes


def _writes_from(store: Any, table: str, row: bytes, column: str, start_ts: int) -> list[Cell]:
    """All of a cell's write records at or above *start_ts*, newest first."""
    return store.read_rows(  # type: ignore[no-any-return]
        table, [row], [Read(WRITE, (column,), min_ts=start_ts, versions=None)],
    ).get(row, {}).get(f"{WRITE}:{column}", [])


def _read_prewrite_state(
    store: Any, members: Sequence[tuple[int, list[_Cell]]],
) -> dict[int, tuple[bytes | None, list[Cell]]]:
    """For each cell of each ``(start_ts, cells)`` (keyed by ``id(cell)``): its lock and
    its write records at or above that start_ts (:func:`_writes_since`), read from
    *store* with one call per table for all of them (a group commit checks its members
    at once)."""
    by_table: dict[str, list[tuple[int, _Cell]]] = {}
    for start_ts, cells in members:
        for cell in cells:
            by_table.setdefault(cell.table, []).append((start_ts, cell))
    found: dict[int, tuple[bytes | None, list[Cell]]] = {}
    for table, group in by_table.items():
        columns: tuple[str, ...]
        if len(group) == 1:  # a single-cell transaction: no duplicates to drop
            rows, columns = [group[0][1].row], (group[0][1].column,)
        else:
            rows = list(dict.fromkeys(c.row for _, c in group))
            columns = tuple(dict.fromkeys(c.column for _, c in group))
        # The newest record is, for each member, its newest at or above its own start
        # when it is at or above that start at all.
        result = store.read_rows(table, rows, _prewrite_reads(columns))
        for start_ts, cell in group:
            row_cells = result.get(cell.row, {})
            lock = row_cells.get(f"{LOCK}:{cell.column}")
            writes = _writes_since(store, table, cell.row, cell.column, start_ts,
                                   row_cells.get(f"{WRITE}:{cell.column}", []))
            found[id(cell)] = (lock[0][1] if lock else None, writes)
    return found


class _CounterByKind(dict[str, Iterator[int]]):
    """A counter of *name* per ``kind`` label, made at the kind's first step: read with
    ``next(counters[kind])``, a lookup and one C call (no call of ours)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __missing__(self, kind: str) -> Iterator[int]:
        counter = self[kind] = _metrics.counter(self.name, kind)
        return counter


_COMMITTED = _CounterByKind("percolator_transactions_committed_total")
"""Committed transactions by kind, stepped in line by the commits."""


def _record(kind: str, began: float, error: BaseException | None) -> None:
    """The metrics of one commit that ended (with *error*, or committed; a single
    transaction's commit that committed records them in line, as this does)."""
    if not _metrics._enabled:
        return  # every commit asks: no calls, no clock read when recording is off
    if error is None:
        next(_COMMITTED[kind])
    elif isinstance(error, ConflictError):
        _inc("percolator_transactions_conflicted_total", kind)
    else:
        _inc("percolator_transactions_failed_total", kind)
    _observe("percolator_commit_duration_seconds", time.perf_counter() - began, kind)
