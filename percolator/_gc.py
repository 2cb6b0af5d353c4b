"""Garbage collection below the safe point: one implementation over the store contract.

A pass (:func:`collect`, ``Cluster.gc``, ``percolator gc``):

1. **Safe point.** ``P = min(start of every transaction running in a live client
   that is younger than max_txn_age, the timestamp that was current retention
   seconds ago)``, persisted only if it moves forward (:mod:`percolator._safe_point`).
   Then the pass waits twice the largest safe-point refresh of a live client, so that
   every reader or writer that could still use a version below ``P`` finds out before
   it returns or commits.
2. **Locks.** Every held lock of a transaction that started below ``P`` is resolved
   as a reader would (:func:`percolator._lock_resolver.resolve_lock`: roll forward,
   roll back, or leave a live one). All of them, over every table, before anything is
   removed, because resolving a secondary asks its primary's write records: once
   those may go, no lock that needs them may remain. A lock that stays (its owner is
   alive and within its ttl) lowers the bound of this pass to its start timestamp:
   ``P' = min(P, those)``, so none of its transaction's records can go.
3. **Versions.** For each cell of each user column (observer acknowledgements
   included), whose lock is FREE or absent: keep the newest PUT record below ``P'``
   (*k*, the one a reader at ``P'`` sees) and remove every older write record (PUTs,
   DELETEs, ROLLBACKs) and every data version older than *k*'s data (the older
   values and the data of rolled-back transactions), with two range deletes, one
   per family. Where the newest record below ``P'`` is a DELETE (or there is none),
   every record and data version below ``P'`` goes; with nothing at or above
   ``P'`` the cell goes entirely: its records and data first, then its FREE lock
   cell, with a conditional delete that only succeeds if the lock still holds the
   value read (stores with :class:`percolator._store.ConditionalDelete`; HBase
   keeps it). Rollback records and rolled-back data *newer* than *k* stay until a
   newer version is kept: the store contract deletes by timestamp range.

Why each removal is safe for everyone who can still read or commit (the safe point
rules out the rest, see :mod:`percolator._safe_point`):

* readers at ``S >= P`` see exactly what they saw: versions they would pick are newer
  than *k* or *k* itself; a removed DELETE reads as absent, the same answer;
* a transaction with ``S >= P`` that prewrites a cell during the pass: its data is at
  ``S``, its record at a commit timestamp above ``S``, both above every removed
  version; its conflict checks look at records above ``S``, never removed;
* removing a lock cell: a compare-and-set from the FREE value read cannot succeed any
  more (the cell is absent), so the prewriter that read it reads again. A prewriter
  that read the cell *absent* before it was first written and locks it from absent
  afterwards missed the commits in between: all at or below ``P`` (they were removed),
  hence after its start, so its start is below ``P`` and its check before the commit
  point refuses it. A FREE token is never reused: the next lock written is a new
  transaction's, with a token made of its own start timestamp. On the embedded store,
  whose one-phase commit leaves an existing FREE lock as it was, each batch reads and
  removes inside one atomic step, so no commit falls between;
* notify cells are left to the observers, which remove a notification's versions
  once processed (a notification not yet processed must survive, and only the
  observer knows which are); acknowledgements are ordinary columns, so each keeps its
  newest version (one per row and observer);
* a pass killed anywhere has only removed versions that nothing can need, each step
  on its own (records of a cell are removed before its lock; a cell's kept record is
  removed only with everything below it); a rerun finds what is left and removes it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from percolator._encoding import (
    DATA,
    FREE_TAG,
    LOCK,
    WRITE,
    Committed,
    Lock,
    RolledBack,
    WriteKind,
    decode_lock,
    decode_write,
    split_column,
)
from percolator._errors import InvalidArgument
from percolator._internals import internals
from percolator._lock_resolver import resolve_lock
from percolator._safe_point import oldest_since
from percolator._store import (
    ATOMICALLY,
    DELETE_IF,
    EMBEDDED_FILE,
    VACUUM,
    Cell,
    Mutation,
    Read,
    RowCells,
    Store,
    offered,
)

if TYPE_CHECKING:
    from percolator._cluster import Cluster

__all__ = ["GcSummary", "collect"]

log = logging.getLogger(__name__)

DEFAULT_RETENTION = 600.0
"""Seconds of history kept by default (TiKV's ``gc_life_time`` is ten minutes)."""
DEFAULT_MAX_TXN_AGE = 86400.0
"""A transaction older than this (seconds) stops holding the safe point back."""

_ROLLBACK = WriteKind.ROLLBACK.value
_DELETE = WriteKind.DELETE.value
_POINTER = WriteKind.PUT.value
"""First byte of a PUT record whose value is in a data cell (not inlined)."""
_BATCH_ROWS = 200
_CELL_OVERHEAD = 8
"""Bytes counted per removed version besides its row, column and value (its timestamp)."""


@dataclass(frozen=True, slots=True)
class GcSummary:
    """What a garbage-collection pass did (or, with ``dry_run``, would do)."""

    safe_point: int
    """The safe point of the pass (persisted unless ``dry_run``)."""
    previous_safe_point: int
    collected_below: int
    """The bound actually used: the safe point, or lower while a live transaction
    that started below it holds locks."""
    held_back_by: str
    """What set the safe point: ``"retention"``, ``"client <owner>"`` or ``"this
    process"``; ``"unchanged (...)"`` when that is not above the previous one."""
    rows_scanned: int
    versions_removed: int
    """Write records, data versions and lock cells removed."""
    cells_removed: int
    """Cells removed entirely (deleted cells with nothing newer)."""
    locks_resolved: int
    locks_left: int
    """Locks below the safe point left alone because their transaction is alive."""
    bytes_removed: int
    """Row, column, timestamp and value bytes of the removed versions."""
    bytes_freed: int | None
    """Bytes returned to the file system by ``vacuum`` (None: not asked, or the store
    cannot tell)."""
    dry_run: bool
    seconds: float
    removed_by_table: dict[str, int] = field(default_factory=dict)
    """``versions_removed`` per table (for the ``percolator_gc_versions_deleted_total``
    metric)."""


def _safe_point_bound(
    cluster: Cluster, retention: float, max_txn_age: float, now_ts: int, prune: bool
) -> tuple[int | None, str]:
    """The candidate safe point and what set it (None: nothing allows a move yet)."""
    sp = internals(cluster).safe_point
    candidate = now_ts if retention == 0 else sp.timestamp_before(retention)
    why = "retention"
    if candidate is None:
        return None, "retention (no timestamp logged that long ago yet)"
    since = time.time() - max_txn_age
    me = internals(cluster).coordination.current_owner()
    clients = [(f"client {h.owner}", h.steps) for h in sp.holders(prune=prune) if h.owner != me]
    # This process's own publication lags: its count taken now stands in for it.
    for who, steps in [*clients, ("this process", sp.running())]:
        held = oldest_since(steps, since)
        if steps and (held is None or steps[0][0] < held):
            log.warning("transaction %d of %s is older than max_txn_age (%.0fs): no longer "
                        "holding the safe point back", steps[0][0], who, max_txn_age)
        if held is not None and held < candidate:
            candidate, why = held, who
    return candidate, why


def _resolve_locks(
    cluster: Cluster, tables: Sequence[str], below: int, dry_run: bool, step: Callable[[], None]
) -> tuple[int, int, int | None]:
    """Resolve every held lock of a transaction that started below *below*; returns
    (resolved, left, lowest start_ts of those left)."""
    resolved = left = 0
    lowest: int | None = None
    for table in tables:
        for row, cells in internals(cluster).store.scan(
            table, None, None, [Read(LOCK, skip_tag=FREE_TAG)]
        ):
            for name, versions in cells.items():
                raw = versions[0][1]
                state = decode_lock(raw)
                start = state.start_ts
                if isinstance(state, Lock) and start >= below:
                    continue
                if not dry_run:
                    step()
                    if resolve_lock(internals(cluster), table, row, name[len(LOCK) + 1:], raw):
                        resolved += 1
                        continue
                elif isinstance(state, Committed | RolledBack):
                    resolved += 1
                    continue
                left += 1
                lowest = start if lowest is None else min(lowest, start)
    if resolved:
        internals(cluster).sweep_locks()
    return resolved, left, lowest


@dataclass(slots=True)
class _Plan:
    mutation: Mutation | None = None
    locks: list[tuple[str, bytes]] | None = None
    """Lock cells to remove if they still hold the value read: (column, value)."""
    versions: int = 0
    cells: int = 0
    bytes: int = 0


def _size(row: bytes, column: str, cells: Sequence[Cell]) -> int:
    return sum(len(row) + len(column) + _CELL_OVERHEAD + len(value) for _, value in cells)


def plan_row(row: bytes, cells: RowCells, below: int, can_delete_locks: bool) -> _Plan:
    """What to remove from one row read with every version of its lock, write and
    data families (see the module docstring)."""
    plan = _Plan()
    deletes: list[tuple[str, int]] = []
    locks: list[tuple[str, bytes]] = []
    columns = {split_column(name)[1] for name in cells}
    for column in sorted(columns):
        lock = cells.get(f"{LOCK}:{column}")
        if lock and lock[0][1][:1] != FREE_TAG:
            continue  # held: its transaction may still need anything here
        w_name, d_name = f"{WRITE}:{column}", f"{DATA}:{column}"
        writes = cells.get(w_name, [])
        data = cells.get(d_name, [])
        above = [c for c in writes if c[0] >= below]
        kept = next((c for c in writes if c[0] < below and c[1][:1] != _ROLLBACK), None)
        entire = False
        if kept is None or kept[1][:1] == _DELETE:
            # Nothing visible at `below`: every record and data version under it goes
            # (a reader at or above it finds no record, which reads as absent, as
            # the DELETE did); with nothing at or above it either, so does the cell.
            record_max = data_max = below - 1
            entire = not above and all(ts < below for ts, _ in data)
        else:
            record_max = kept[0] - 1
            data_ts = decode_write(kept[1])[1]
            data_max = data_ts - 1 if kept[1][:1] == _POINTER else kept[0]
        for _, record in above:
            if record[:1] == _POINTER:  # its data is needed, wherever it lies
                data_max = min(data_max, decode_write(record)[1] - 1)
        gone_writes = [c for c in writes if c[0] <= record_max]
        gone_data = [c for c in data if c[0] <= data_max]
        if gone_writes:
            deletes.append((w_name, record_max))
        if gone_data:
            deletes.append((d_name, data_max))
        plan.versions += len(gone_writes) + len(gone_data)
        plan.bytes += _size(row, w_name, gone_writes) + _size(row, d_name, gone_data)
        if entire:
            plan.cells += 1
            if lock and can_delete_locks:
                locks.append((f"{LOCK}:{column}", lock[0][1]))
                plan.versions += 1
                plan.bytes += _size(row, f"{LOCK}:{column}", lock)
    if deletes:
        plan.mutation = Mutation(row, deletes=deletes)
    plan.locks = locks
    return plan


_ALL_VERSIONS = [Read(LOCK), Read(WRITE, versions=None), Read(DATA, versions=None)]


def _chunks(
    rows: Iterator[tuple[bytes, RowCells]], size: int
) -> Iterator[list[tuple[bytes, RowCells]]]:
    chunk: list[tuple[bytes, RowCells]] = []
    for item in rows:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def collect(
    cluster: Cluster,
    *,
    retention: float = DEFAULT_RETENTION,
    max_txn_age: float = DEFAULT_MAX_TXN_AGE,
    dry_run: bool = False,
    vacuum: bool = False,
    progress: Callable[[int], None] | None = None,
    rows_per_second: float | None = None,
    before_step: Callable[[], None] | None = None,
    tables: Sequence[str] | None = None,
) -> GcSummary:
    """One garbage-collection pass over every user table (see the module docstring).

    *progress* is called with the number of rows just scanned (for a progress bar);
    *rows_per_second* limits the pace so that foreground work is not starved;
    *before_step* is called before every change the pass makes to the store (test
    harnesses raise from it to abandon the pass there). *tables* restricts the pass to
    some user tables (default: all); only for tables that no transaction spans with
    others, since a lock's primary may lie in another table (test harnesses).
    """
    if not isinstance(retention, int | float) or retention < 0:
        raise InvalidArgument(f"retention must be a number of seconds >= 0, got {retention!r}")
    if not isinstance(max_txn_age, int | float) or max_txn_age <= 0:
        raise InvalidArgument(f"max_txn_age must be a positive number of seconds, "
                              f"got {max_txn_age!r}")
    if rows_per_second is not None and rows_per_second <= 0:
        raise InvalidArgument(f"rows_per_second must be positive or None, got {rows_per_second!r}")
    began = time.monotonic()
    step = before_step or (lambda: None)
    sp = internals(cluster).safe_point
    store = internals(cluster).store
    now_ts = internals(cluster).timestamps.get_timestamp()
    previous = sp.fetch()
    if not dry_run:
        step()
        sp.note_time(now_ts)
    candidate, why = _safe_point_bound(cluster, retention, max_txn_age, now_ts, not dry_run)
    if candidate is None or candidate <= previous:
        safe_point = previous
        why = f"unchanged ({why})" if candidate is not None else why
    elif dry_run:
        safe_point = candidate
    else:
        step()
        safe_point = sp.advance(candidate)
    if not dry_run:
        # Whoever persisted the safe point (we or another pass), every client's cache
        # holds it, or will fetch it before trusting a read, once this has passed.
        time.sleep(sp.grace())
    tables = cluster.tables() if tables is None else list(tables)
    resolved = left = 0
    below = safe_point
    if safe_point:
        resolved, left, lowest = _resolve_locks(cluster, tables, safe_point, dry_run, step)
        if lowest is not None:
            below = min(below, lowest)
    rows = versions = cells_removed = removed_bytes = 0
    deleting = offered(store, DELETE_IF)
    can_delete_locks = deleting is not None
    atomic = offered(store, ATOMICALLY)
    atomically: Callable[[], AbstractContextManager[None]] | None = (
        atomic.atomically if atomic is not None else None)
    pace_start = time.monotonic()
    removed_by_table: dict[str, int] = {}
    for table in tables if below else ():
        versions_before = versions
        for chunk in _chunks(store.scan(table, None, None, _ALL_VERSIONS), _BATCH_ROWS):
            rows += len(chunk)
            with atomically() if atomically is not None and not dry_run else nullcontext():
                if atomically is not None and not dry_run:
                    # Read again inside the atomic step: a one-phase commit may have
                    # written since the scan without changing the FREE lock.
                    fresh = store.read_rows(table, [row for row, _ in chunk], _ALL_VERSIONS)
                    chunk = [(row, fresh[row]) for row, _ in chunk if row in fresh]
                plans = [plan_row(row, cells, below, can_delete_locks) for row, cells in chunk]
                mutations = [p.mutation for p in plans if p.mutation is not None]
                for plan in plans:
                    versions += plan.versions
                    cells_removed += plan.cells
                    removed_bytes += plan.bytes
                if not dry_run and mutations:
                    step()
                    store.mutate_rows(table, mutations)
                    for plan, (row, _) in zip(plans, chunk, strict=True):
                        for column, raw in plan.locks or ():
                            step()
                            assert deleting is not None  # plan_row plans none without it
                            if not deleting.delete_if(table, row, column, raw):
                                versions -= 1  # a writer took it meanwhile: it stays
            if progress is not None:
                progress(len(chunk))
            if rows_per_second is not None:
                ahead = rows / rows_per_second - (time.monotonic() - pace_start)
                if ahead > 0:
                    time.sleep(ahead)
        if versions > versions_before:
            removed_by_table[table] = versions - versions_before
    freed: int | None = None
    if vacuum and not dry_run:
        step()
        freed = _vacuum(store)
    return GcSummary(
        safe_point=safe_point,
        previous_safe_point=previous,
        collected_below=below,
        held_back_by=why,
        rows_scanned=rows,
        versions_removed=versions,
        cells_removed=cells_removed,
        locks_resolved=resolved,
        locks_left=left,
        bytes_removed=removed_bytes,
        bytes_freed=freed,
        dry_run=dry_run,
        seconds=time.monotonic() - began,
        removed_by_table=removed_by_table,
    )


def _vacuum(store: Store) -> int | None:
    """Return free space to the file system where the store can; bytes freed."""
    vacuuming = offered(store, VACUUM)
    if vacuuming is None:
        return None
    file = offered(store, EMBEDDED_FILE)
    path = file.path if file is not None else None
    before = _file_size(path)
    vacuuming.vacuum()
    after = _file_size(path)
    return None if before is None or after is None else before - after


def _file_size(path: str | None) -> int | None:
    if path is None:
        return None
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.path.getsize(path + suffix)
        except OSError:
            pass
    return total
