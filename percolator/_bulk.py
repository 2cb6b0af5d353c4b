"""Bulk writes in Percolator's layout: one transaction, many cells, batched store calls.

A bulk load (``spark_loader``, or any other bulk writer) is ONE Percolator
transaction whose cells are written by many workers at once (DESIGN.md §5):

1. the driver takes ``start_ts`` and prewrites the **primary**: a marker cell of
   the load in the internal table ``__percolator_loads``, row = the load id (derived
   from the input, so a rerun finds it), column ``load:marker``;
2. workers prewrite their cells in batches (:func:`prewrite_rows`): a ``LOCKED``
   lock pointing at the primary and carrying the value (a value over
   ``INLINE_MAX_BYTES`` goes to a data cell at ``start_ts`` instead), taken with a batched
   compare-and-set so no other transaction's lock is overwritten (Invariant A/B);
3. the driver takes ``commit_ts`` and commits the primary with one compare-and-set
   (:meth:`BulkLoad.commit`): the commit point of the whole load;
4. workers write the write records (and notify cells of observed columns) and free
   their locks in batches (:func:`finish_rows`); a record carries its value when it
   is small (``INLINE_MAX_BYTES``), so reading it needs no data cell.

Readers meeting a lock of the load resolve it through the primary like any other
lock: they wait while the driver is alive (it refreshes the primary's wall time),
roll the load back if the driver died before the commit point, and roll the cell
forward after it. A load is therefore visible all at once or not at all.

Write-write conflicts: a cell with a write record newer than the load's start_ts
fails the load with :class:`ConflictError` naming the cell (nothing becomes
visible; run the load again). A cell locked by a live transaction is waited for up
to the cluster's lock wait, then the load fails with :class:`LockedError`.

Store capability: ``check_and_set_many(table, items) -> list[bool]``
(:class:`percolator._store.BatchedCas`; each item ``(row, column, expected, new,
puts)``, decided in order) applies many compare-and-sets in fewer round trips: one
write transaction per batch on SQLite, one ``CheckAndMutateRow`` per row on Bigtable.
HBase's Thrift1 ``checkAndPut`` compares and sets one cell per call and has no batch
form, so there (and on any store without the capability) :func:`check_and_set_many`
writes the batch's puts in one ``mutate_rows`` and then makes one ``check_and_set``
per cell.

Cost per loaded cell on SQLite: three row writes (the lock with the value at prewrite;
write record and lock again at release; a large value adds a data cell), against one
for a plain write of the same cell;
the batch is written without reading when every compare-and-set wins (the usual
case: nothing else touches the new cells), and read first only when one does not.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from percolator._cas import lock_cas
from percolator._commit import committed_anyway, free_locks_may_stay
from percolator._encoding import (
    DATA,
    FAMILIES,
    FREE_TAG,
    LOCK,
    WRITE,
    Committed,
    Free,
    Lock,
    RolledBack,
    WriteKind,
    decode_lock,
    decode_write,
    encode_lock,
    inlined,
    with_value,
)
from percolator._errors import ConflictError, LockedError, PercolatorError
from percolator._internals import internals
from percolator._lock_resolver import (
    TxnStatus,
    release,
    resolve_lock,
    roll_back_primary,
    write_cells,
)
from percolator._notify_index import write_entries
from percolator._safe_point import Hold
from percolator._store import CHECK_AND_SET_MANY, CasItem, Mutation, Read, Store, offered

if TYPE_CHECKING:
    from percolator._cluster import Cluster

__all__ = [
    "LOADS_TABLE",
    "LOAD_COLUMN",
    "AlreadyLoaded",
    "BulkLoad",
    "CasItem",
    "LoadTxn",
    "begin_or_join",
    "check_and_set_many",
    "finish_rows",
    "prewrite_rows",
    "refresh_primary",
]

log = logging.getLogger(__name__)

LOADS_TABLE = "__percolator_loads"
"""Internal table holding one marker row per bulk load (the load's primary cell)."""
LOAD_COLUMN = "load:marker"
_FINISHED = f"{DATA}:load:finished"
"""Plain (non-transactional) cell: every lock of the committed load was released."""

_RELEASE_BATCH = 5000
"""Locks released per store call when a committed load is rolled forward, as
the default *batch_cells* of :func:`finish_rows`."""


def check_and_set_many(store: Store, table: str, items: Sequence[CasItem]) -> list[bool]:
    """Apply *items* in order, as ``check_and_set`` would one by one; one round trip
    where the store offers ``check_and_set_many``. On stores without atomic row CAS
    (:attr:`Store.atomic_row_cas` False) the puts of every item are written first in
    one batch, then the cells are compared and set, as ``check_and_set`` documents."""
    if not items:
        return []
    batched = offered(store, CHECK_AND_SET_MANY)
    if batched is not None:
        return batched.check_and_set_many(table, items)
    if store.atomic_row_cas:
        return [store.check_and_set(table, r, c, e, n, p) for r, c, e, n, p in items]
    mutations = [Mutation(r, list(p)) for r, _, _, _, p in items if p]
    if mutations:
        store.mutate_rows(table, mutations)
    return [store.check_and_set(table, r, c, e, n) for r, c, e, n, _ in items]


@dataclass(frozen=True, slots=True)
class LoadTxn:
    """What a worker needs to take part in a load (picklable, shipped to executors)."""

    table: str
    load_id: str
    start_ts: int
    owner: str
    wall_ms: int
    ttl_ms: int
    observed: frozenset[str]
    """Columns of :attr:`table` that are observed: their locks carry ``notify``."""
    _helds: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)
    """:meth:`held` per column, encoded once (a dict, not a cache keyed on the whole
    transaction: hashing it for every cell cost a microsecond)."""

    @property
    def primary_row(self) -> bytes:
        return self.load_id.encode()

    def lock(self, column: str, wall_ms: int | None = None) -> Lock:
        """The lock this load puts on a cell of *column*: its primary is the load's row
        of the loads table; *wall_ms*, its time (the load's own by default)."""
        return Lock(
            start_ts=self.start_ts,
            primary_table=LOADS_TABLE,
            primary_row=self.primary_row,
            primary_column=LOAD_COLUMN,
            owner=self.owner,
            wall_ms=self.wall_ms if wall_ms is None else wall_ms,
            ttl_ms=self.ttl_ms,
            notify=column in self.observed,
        )

    def held(self, column: str) -> bytes:
        """The lock value of every secondary cell of *column* that carries no value
        (the same for all rows: only the primary's wall time matters to cleaners)."""
        held = self._helds.get(column)
        if held is None:
            held = self._helds[column] = encode_lock(self.lock(column))
        return held

    def prewrite_cell(
        self, column: str, value: bytes
    ) -> tuple[bytes, tuple[tuple[str, int, bytes], ...]]:
        """The lock value and the puts that prewrite one cell: a small value rides in
        the lock (no data cell), a large one in a data cell at start_ts."""
        inline = inlined(value)
        if inline is not None:
            return with_value(self.held(column), inline), ()
        return self.held(column), ((f"{DATA}:{column}", self.start_ts, value),)


@dataclass(frozen=True, slots=True)
class AlreadyLoaded:
    """A load with this id committed before (a rerun found it)."""

    load_id: str
    start_ts: int
    commit_ts: int
    info: dict[str, Any]


# --- workers ------------------------------------------------------------------------


def _conflict(txn: LoadTxn, row: bytes, column: str, why: str, ts: int | None) -> ConflictError:
    return ConflictError(
        f"bulk load {txn.load_id!r} into {txn.table!r}: write-write conflict on "
        f"{txn.table}/{row!r}/{column}: {why} (load transaction {txn.start_ts}); "
        "nothing of the load is visible; run it again",
        start_ts=txn.start_ts, conflict_ts=ts, table=txn.table, row=row, column=column,
    )


def _read_chunks(cells: list[tuple[bytes, str]]) -> Iterator[list[tuple[bytes, str]]]:
    # Keep each read well below SQLite's 500 terms per compound SELECT.
    chunk: list[tuple[bytes, str]] = []
    rows: set[bytes] = set()
    columns: set[str] = set()
    for cell in cells:
        rows.add(cell[0])
        columns.add(cell[1])
        chunk.append(cell)
        if len(rows) * len(columns) >= 100:
            yield chunk
            chunk, rows, columns = [], set(), set()
    if chunk:
        yield chunk


def _check_writes(txn: LoadTxn, row: bytes, column: str, writes: list[tuple[int, bytes]]) -> bool:
    """Refuse a change committed after the load's start (or the load's own rollback);
    return whether the load itself already committed this cell."""
    ours_committed = False
    for ts, value in writes:
        kind, data_ts = decode_write(value)
        if data_ts == txn.start_ts:
            if kind is WriteKind.ROLLBACK:
                raise _conflict(txn, row, column, "this load was rolled back", ts)
            ours_committed = True
        elif kind is not WriteKind.ROLLBACK and ts > txn.start_ts:
            raise _conflict(txn, row, column, f"committed at {ts} after the load started", ts)
    return ours_committed


def _recheck_writes(store: Store, txn: LoadTxn, cells: list[tuple[bytes, str]]) -> None:
    for chunk in _read_chunks(cells):
        rows = list(dict.fromkeys(r for r, _ in chunk))
        columns = tuple(dict.fromkeys(c for _, c in chunk))
        found = store.read_rows(txn.table, rows, [
            Read(WRITE, columns, min_ts=txn.start_ts, versions=None)])
        for row, column in chunk:
            _check_writes(txn, row, column, found.get(row, {}).get(f"{WRITE}:{column}", []))


def _slow_prewrite(
    cluster: Cluster, txn: LoadTxn, cells: dict[tuple[bytes, str], bytes]
) -> set[tuple[bytes, str]]:
    """Prewrite *cells* (whose optimistic CAS from "absent" failed) the careful way:
    read lock and newer write records, resolve foreign locks, CAS from what was read.
    Returns the cells that are already finished by this very load (a recomputation)."""
    store = internals(cluster).store
    pending = dict(cells)
    done: set[tuple[bytes, str]] = set()
    attempts = internals(cluster).lock_wait_policy.attempts()
    while pending:
        items: list[CasItem] = []
        waiting: list[tuple[bytes, str, Lock]] = []
        progressed = False
        for chunk in _read_chunks(list(pending)):
            rows = list(dict.fromkeys(r for r, _ in chunk))
            columns = tuple(dict.fromkeys(c for _, c in chunk))
            found = store.read_rows(txn.table, rows, [
                Read(LOCK, columns), Read(WRITE, columns, min_ts=txn.start_ts, versions=None),
            ])
            for row, column in chunk:
                row_cells = found.get(row, {})
                lock_cell = row_cells.get(f"{LOCK}:{column}")
                raw = lock_cell[0][1] if lock_cell else None
                ours_committed = _check_writes(txn, row, column,
                                               row_cells.get(f"{WRITE}:{column}", []))
                state = decode_lock(raw) if raw is not None else None
                if ours_committed or (isinstance(state, Free) and state.start_ts == txn.start_ts
                                      and state.committed):
                    done.add((row, column))
                    del pending[(row, column)]
                    progressed = True
                elif isinstance(state, Lock) and state.start_ts == txn.start_ts:
                    del pending[(row, column)]  # ours already (a recomputed partition)
                    progressed = True
                elif isinstance(state, Free) and state.start_ts == txn.start_ts:
                    raise _conflict(txn, row, column, "this load was rolled back", None)
                elif state is None or isinstance(state, Free):
                    held, puts = txn.prewrite_cell(column, pending[(row, column)])
                    items.append((row, f"{LOCK}:{column}", raw, held, puts))
                elif isinstance(state, Committed | RolledBack) or (
                    isinstance(state, Lock) and state.start_ts != txn.start_ts
                ):
                    assert raw is not None
                    if resolve_lock(internals(cluster), txn.table, row, column, raw):
                        progressed = True
                    elif isinstance(state, Lock):
                        waiting.append((row, column, state))
        if items:
            locked = []
            for item, won in zip(items, check_and_set_many(store, txn.table, items), strict=True):
                if won:
                    locked.append((item[0], item[1][len(LOCK) + 1 :]))
                    del pending[locked[-1]]
                    progressed = True
            if free_locks_may_stay(store):
                _recheck_writes(store, txn, locked)
        if pending and not progressed and not attempts.wait():
            row, column, lock = waiting[0] if waiting else (*next(iter(pending)), None)
            raise LockedError(
                f"bulk load {txn.load_id!r}: {txn.table}/{row!r}/{column} is locked by "
                f"live transaction {getattr(lock, 'start_ts', '?')} (owner "
                f"{getattr(lock, 'owner', '?')}) after waiting {attempts.elapsed():.1f}s; "
                "nothing of the load is visible; run it again later",
                table=txn.table, row=row, column=column,
                lock_ts=getattr(lock, "start_ts", 0),
            )
    return done


def prewrite_rows(
    cluster: Cluster,
    txn: LoadTxn,
    rows: Iterable[tuple[bytes, dict[str, bytes]]],
    *,
    batch_cells: int = 5000,
    after_batch: Any = None,
) -> Iterator[tuple[bytes, dict[str, bytes]]]:
    """Prewrite every cell of *rows* (``(row, {column: value})``, already validated)
    for the load *txn*, in batches of about *batch_cells* cells, and yield
    ``(row, {column: value})`` for the cells left locked (to pass to
    :func:`finish_rows`, which inlines small values in the write records).

    Each batch first tries one compare-and-set per cell from "absent" (a cell never
    written has no lock cell and, by Invariant A, no write record); cells where that
    fails take the careful path (read, resolve, CAS from what was read). Running
    this again for the same rows and load is harmless (recomputed partitions).

    :raises ConflictError: a cell has a write record newer than the load's start.
    :raises LockedError: a live transaction kept a cell locked beyond the lock wait.
    """
    with internals(cluster).taking_locks():
        yield from _prewrite_batches(cluster, txn, rows, batch_cells, after_batch)


def _prewrite_batches(
    cluster: Cluster,
    txn: LoadTxn,
    rows: Iterable[tuple[bytes, dict[str, bytes]]],
    batch_cells: int,
    after_batch: Any,
) -> Iterator[tuple[bytes, dict[str, bytes]]]:
    store = internals(cluster).store
    batch: list[tuple[bytes, dict[str, bytes]]] = []
    size = 0
    prewrite_cell = txn.prewrite_cell

    def flush() -> Iterator[tuple[bytes, dict[str, bytes]]]:
        items: list[CasItem] = []
        append = items.append
        for row, values in batch:
            for column, value in values.items():
                held, puts = prewrite_cell(column, value)
                append((row, f"{LOCK}:{column}", None, held, puts))
        won = check_and_set_many(store, txn.table, items)
        if all(won):
            locked = batch
        else:
            lost = {(item[0], item[1][len(LOCK) + 1 :])
                    for item, ok in zip(items, won, strict=True) if not ok}
            failed = {(row, c): v for row, values in batch for c, v in values.items()
                      if (row, c) in lost}
            done = _slow_prewrite(cluster, txn, failed)
            locked = []
            for row, values in batch:
                left = {c: v for c, v in values.items() if (row, c) not in done}
                if left:
                    locked.append((row, left))
        if txn.observed:  # index entries while the locks are held, before the commit point
            write_entries(internals(cluster), [(txn.table, row, c) for row, values in locked
                                    for c in values if c in txn.observed], txn.start_ts)
        yield from locked
        if after_batch is not None:
            after_batch()

    for row, values in rows:
        if not values:
            continue
        batch.append((row, values))
        size += len(values)
        if size >= batch_cells:
            yield from flush()
            batch, size = [], 0
    if batch:
        yield from flush()


def finish_rows(
    cluster: Cluster,
    txn: LoadTxn,
    rows: Iterable[tuple[bytes, Mapping[str, bytes]]],
    commit_ts: int | None,
    *,
    batch_cells: int = _RELEASE_BATCH,
) -> int:
    """Release the load's locks on *rows* (``(row, {column: value})`` from
    :func:`prewrite_rows`): rolled forward with write records (carrying values up to
    ``INLINE_MAX_BYTES``, as their locks do) and notify cells of observed columns at
    *commit_ts*, or rolled back when *commit_ts* is None. Cells already cleaned by a
    reader are skipped. Returns how many cells this call released."""
    free = encode_lock(Free(txn.start_ts, commit_ts is not None))

    def row_items(row: bytes, cells: Mapping[str, bytes]) -> list[CasItem]:
        items: list[CasItem] = []
        for column, value in cells.items():
            inline = inlined(value)
            puts = () if commit_ts is None else write_cells(
                column, txn.start_ts, commit_ts, False, column in txn.observed, inline
            )
            items.append((row, f"{LOCK}:{column}", with_value(txn.held(column), inline),
                          free, puts))
        return items

    return _release(internals(cluster).store, txn.table, txn.load_id,
                    (row_items(row, cells) for row, cells in rows), batch_cells)


def _release(
    store: Store, table: str, load_id: str, rows: Iterable[list[CasItem]], batch_cells: int
) -> int:
    """Apply the lock releases of *rows* (each row's items together), ``batch_cells``
    or a little more per :func:`check_and_set_many`; returns how many won. A lost
    one was cleaned by a reader already."""
    released = 0
    items: list[CasItem] = []

    def flush() -> int:
        won = check_and_set_many(store, table, items)
        n = sum(won)
        if n < len(items):
            for item, ok in zip(items, won, strict=True):
                if not ok:
                    log.debug("lock of load %s on %r/%s already cleaned", load_id,
                              item[0], item[1])
        items.clear()
        return n

    for row_items in rows:
        items.extend(row_items)
        if len(items) >= batch_cells:
            released += flush()
    if items:
        released += flush()
    return released


def _lost(txn: LoadTxn) -> ConflictError:
    return ConflictError(
        f"bulk load {txn.load_id!r} was rolled back by a cleaner (was nobody refreshing "
        "it for longer than the lock ttl?); nothing is visible; run it again",
        start_ts=txn.start_ts, table=LOADS_TABLE, row=txn.primary_row, column=LOAD_COLUMN,
    )


def refresh_primary(cluster: Cluster, txn: LoadTxn, held: bytes | None = None) -> bytes:
    """Renew the wall time of the load's primary lock so cleaners know the load is at
    work; returns the lock value written. Any number of processes may do this at
    once (the Spark data source's write tasks do): a compare-and-set lost to another
    refresher is retried from what it wrote, as long as the lock is still the load's.

    :raises ConflictError: the primary is no longer locked by the load.
    """
    store = internals(cluster).store
    column = f"{LOCK}:{LOAD_COLUMN}"
    while True:
        if held is None:
            cells = store.read_rows(LOADS_TABLE, [txn.primary_row], [
                Read(LOCK, (LOAD_COLUMN,))]).get(txn.primary_row, {}).get(column)
            held = cells[0][1] if cells else None
            state = decode_lock(held) if held is not None else None
            if not isinstance(state, Lock) or state.start_ts != txn.start_ts:
                raise _lost(txn)
        fresh = encode_lock(txn.lock(LOAD_COLUMN, int(time.time() * 1000)))
        if lock_cas(store, LOADS_TABLE, txn.primary_row, column, held, fresh):
            return fresh
        held = None  # somebody else wrote it: read it again


def begin_or_join(cluster: Cluster, table: str, load_id: str, owner: str,
                  info: dict[str, Any]) -> LoadTxn | AlreadyLoaded:
    """Begin the load *load_id* on behalf of *owner*, or join it if *owner* began it
    already: for loads begun by whichever of many workers comes first (a Spark
    streaming micro-batch, whose tasks are the only code that runs before its commit).

    *owner* names the attempt (the Spark query's run) and is not a coordination
    owner: its liveness is unknown to every reader, so only the lock's ttl, renewed
    by :func:`refresh_primary`, keeps the load alive. A load still locked by another
    owner is a dead attempt (the caller guarantees one attempt runs at a time): it is
    rolled back and the load begun again. Returns :class:`AlreadyLoaded` when the
    load committed before.
    """
    load = BulkLoad(cluster, table, load_id)
    internals(cluster).store.create_table(LOADS_TABLE, FAMILIES)
    while True:
        raw, writes, data = load._read_primary()
        for ts, value in writes:
            kind, data_ts = decode_write(value)
            if kind is WriteKind.PUT:
                return AlreadyLoaded(load_id, data_ts, ts, json.loads(data.get(data_ts, b"{}")))
        state = decode_lock(raw) if raw is not None else None
        if isinstance(state, Lock):
            if state.owner == owner:
                return _txn_of(cluster, table, load_id, state)
            roll_back_primary(internals(cluster), TxnStatus(state.start_ts, pending=state,
                                                 pending_raw=raw))
            continue
        start_ts = internals(cluster).timestamps.get_timestamp()
        txn = _txn_of(cluster, table, load_id, Lock(
            start_ts=start_ts, primary_table=LOADS_TABLE, primary_row=load.row,
            primary_column=LOAD_COLUMN, owner=owner, wall_ms=int(time.time() * 1000),
            ttl_ms=int(cluster.lock_ttl * 1000), notify=False))
        body = json.dumps(info, sort_keys=True).encode()
        if load._lock_primary(raw, encode_lock(txn.lock(LOAD_COLUMN)),
                              [(f"{DATA}:{LOAD_COLUMN}", start_ts, body)]):
            return txn


def _txn_of(cluster: Cluster, table: str, load_id: str, primary: Lock) -> LoadTxn:
    observed = frozenset(c for t, c in cluster.observed_columns() if t == table)
    return LoadTxn(table=table, load_id=load_id, start_ts=primary.start_ts, owner=primary.owner,
                   wall_ms=primary.wall_ms, ttl_ms=primary.ttl_ms, observed=observed)


# --- the driver -----------------------------------------------------------------------


class BulkLoad:
    """The driver's side of a load: its primary, refreshed while workers write.

    Use :meth:`begin` (returns :class:`AlreadyLoaded` when a previous run with the
    same *load_id* committed), hand :attr:`txn` to the workers, then :meth:`commit`
    or :meth:`abort`; :meth:`mark_finished` once every worker released its locks.
    """

    def __init__(self, cluster: Cluster, table: str, load_id: str) -> None:
        self.cluster = cluster
        self.table = table
        self.load_id = load_id
        self.row = load_id.encode()
        self._held: bytes | None = None
        self._txn: LoadTxn | None = None
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        self._hold: Hold | None = None
        """Keeps garbage collection below the load's start_ts while the load runs."""
        self.lost: PercolatorError | None = None
        """Set when a cleaner rolled the load back (the refresher found the primary gone)."""

    @property
    def txn(self) -> LoadTxn:
        assert self._txn is not None, "begin() first"
        return self._txn

    def _read_primary(self) -> tuple[bytes | None, list[tuple[int, bytes]], dict[int, bytes]]:
        cells = internals(self.cluster).store.read_rows(LOADS_TABLE, [self.row], [
            Read(LOCK, (LOAD_COLUMN,)), Read(WRITE, (LOAD_COLUMN,), versions=None),
            Read(DATA, ("load:marker",), versions=None),
        ]).get(self.row, {})
        lock = cells.get(f"{LOCK}:{LOAD_COLUMN}")
        data = dict(cells.get(f"{DATA}:{LOAD_COLUMN}", []))
        return lock[0][1] if lock else None, cells.get(f"{WRITE}:{LOAD_COLUMN}", []), data

    def begin(self, info: dict[str, Any]) -> LoadTxn | AlreadyLoaded:
        """Start the load (prewrite its primary), or find that it committed before.

        A previous attempt whose driver died is rolled back here (its locks are then
        cleaned by whoever meets them); an attempt still running makes this raise.

        :raises LockedError: another live driver is running the same load.
        """
        cluster = self.cluster
        internals(cluster).store.create_table(LOADS_TABLE, FAMILIES)
        attempts = internals(cluster).lock_wait_policy.with_(deadline=5.0).attempts()
        while True:
            raw, writes, data = self._read_primary()
            for ts, value in writes:
                kind, data_ts = decode_write(value)
                if kind is WriteKind.PUT:
                    stored = data.get(data_ts, b"{}")
                    return AlreadyLoaded(self.load_id, data_ts, ts, json.loads(stored))
            state = decode_lock(raw) if raw is not None else None
            if state is not None and not isinstance(state, Free):
                if not resolve_lock(internals(cluster), LOADS_TABLE, self.row, LOAD_COLUMN,
                                    raw or b""):
                    if attempts.wait():
                        continue
                    raise LockedError(
                        f"bulk load {self.load_id!r} is already running (transaction "
                        f"{getattr(state, 'start_ts', '?')}, owner {getattr(state, 'owner', '?')})"
                        "; wait for it to finish or die",
                        table=LOADS_TABLE, row=self.row, column=LOAD_COLUMN,
                        lock_ts=getattr(state, "start_ts", 0),
                    )
                continue
            self._release_hold()
            self._hold = Hold()
            parts = internals(cluster)
            start_ts = parts.safe_point.begin(self._hold, parts.timestamps.get_timestamp)
            observed = frozenset(c for t, c in cluster.observed_columns() if t == self.table)
            txn = LoadTxn(
                table=self.table, load_id=self.load_id, start_ts=start_ts,
                owner=parts.coordination.current_owner(), wall_ms=int(time.time() * 1000),
                ttl_ms=int(cluster.lock_ttl * 1000), observed=observed,
            )
            held = encode_lock(txn.lock(LOAD_COLUMN))
            body = json.dumps(info, sort_keys=True).encode()
            if self._lock_primary(raw, held, [(f"{DATA}:{LOAD_COLUMN}", start_ts, body)]):
                self._txn, self._held = txn, held
                self._start_refresher()
                return txn

    def _release_hold(self) -> None:
        if self._hold is not None:
            self._hold.release()
            self._hold = None

    def _lock_primary(
        self, raw: bytes | None, held: bytes, puts: list[tuple[str, int, bytes]]
    ) -> bool:
        with internals(self.cluster).taking_locks():
            return lock_cas(
                internals(self.cluster).store, LOADS_TABLE, self.row, f"{LOCK}:{LOAD_COLUMN}", raw,
                held,
                puts,
            )

    # --- keeping the primary alive ------------------------------------------------------

    def _start_refresher(self) -> None:
        self._stop.clear()
        self._refresher = threading.Thread(
            target=self._refresh_loop, name=f"percolator-load-{self.load_id}", daemon=True
        )
        self._refresher.start()

    def _refresh_loop(self) -> None:
        period = max(self.txn.ttl_ms / 3000, 0.05)
        while not self._stop.wait(period):
            try:
                self.refresh()
            except PercolatorError as e:
                self.lost = e
                log.error("bulk load %s: %s", self.load_id, e)
                return

    def refresh(self) -> None:
        """Renew the primary's wall time so cleaners know the driver is at work."""
        with self._mutex:
            if self._held is None:
                return
            self._held = refresh_primary(self.cluster, self.txn, self._held)

    def resume(self, txn: LoadTxn) -> None:
        """Take over the load *txn* begun by another process (the Spark data source
        begins a load in one Python worker and commits it in another), to
        :meth:`commit` or :meth:`abort` it here. No refresher is started: the
        writers keep the primary alive (:func:`refresh_primary`) until the commit.

        :raises ConflictError: the load's primary is no longer locked by it (a
            cleaner rolled it back).
        """
        raw, _, _ = self._read_primary()
        state = decode_lock(raw) if raw is not None else None
        if not isinstance(state, Lock) or state.start_ts != txn.start_ts:
            raise _lost(txn)
        self._txn, self._held = txn, raw

    def detach(self) -> None:
        """Stop keeping the primary alive from this process, leaving the load running
        for another process to :meth:`resume` (nothing is committed or rolled back)."""
        self._stop_refresher()
        self._release_hold()
        with self._mutex:
            self._held = None

    def _stop_refresher(self) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join()
            self._refresher = None

    # --- outcome --------------------------------------------------------------------------

    def commit(self, info: dict[str, Any]) -> int:
        """The commit point of the whole load: one CAS of the primary. Returns commit_ts.

        :raises ConflictError: a cleaner rolled the load back first.
        :raises SnapshotTooOldError: garbage collection passed the load's start_ts (the
           load outlived ``max_txn_age``): a worker's conflict check may have missed a
           cell GC removed, so the load must not commit; :meth:`abort` it and run it again.
        """
        self._stop_refresher()
        if self.lost is not None:
            raise self.lost
        self.refresh()
        txn, held = self.txn, self._held
        assert held is not None
        # After every worker's prewrite (and its conflict reads) ended, before the
        # commit point: the writers' rule of percolator._safe_point.
        internals(self.cluster).safe_point.check(txn.start_ts)
        commit_ts = internals(self.cluster).timestamps.get_timestamp()
        store = internals(self.cluster).store
        column = f"{LOCK}:{LOAD_COLUMN}"
        body = [(f"{DATA}:{LOAD_COLUMN}", txn.start_ts, json.dumps(info, sort_keys=True).encode())]
        record = write_cells(LOAD_COLUMN, txn.start_ts, commit_ts, False, False)
        decided = encode_lock(Committed(txn.start_ts, commit_ts))
        try:
            if store.atomic_row_cas:
                won = lock_cas(store, LOADS_TABLE, self.row, column, held,
                               encode_lock(Free(txn.start_ts, True)), body + record)
            else:
                store.mutate_rows(LOADS_TABLE, [Mutation(self.row, body)])
                won = lock_cas(store, LOADS_TABLE, self.row, column, held, decided)
        except PercolatorError as e:  # as a transaction's commit point (percolator/_cas.py)
            won = committed_anyway(internals(self.cluster), txn.lock(LOAD_COLUMN), commit_ts, e)
        else:
            won = won or committed_anyway(internals(self.cluster), txn.lock(LOAD_COLUMN),
                                          commit_ts, None)
        if won and not store.atomic_row_cas:
            release(internals(self.cluster), LOADS_TABLE, self.row, LOAD_COLUMN, decided,
                    txn.start_ts, (commit_ts, False, False))
        if not won:
            raise ConflictError(
                f"bulk load {self.load_id!r} was rolled back by a cleaner before its commit "
                "point; nothing is visible; run it again",
                start_ts=txn.start_ts, table=LOADS_TABLE, row=self.row, column=LOAD_COLUMN,
            )
        self._held = None
        self._release_hold()
        return commit_ts

    def abort(self) -> None:
        """Roll the load back at its primary (nothing becomes visible); its secondary
        locks are then freed by :func:`finish_rows` with ``commit_ts=None`` or by
        whoever meets them."""
        self._stop_refresher()
        self._release_hold()
        with self._mutex:
            held, self._held = self._held, None
        if held is None or self._txn is None:
            return
        lock = decode_lock(held)
        assert isinstance(lock, Lock)
        try:
            roll_back_primary(internals(self.cluster), TxnStatus(lock.start_ts, pending=lock,
                                                      pending_raw=held))
        except PercolatorError:
            log.warning("bulk load %s: could not roll back its primary; readers will",
                        self.load_id, exc_info=True)

    def is_finished(self) -> bool:
        """Whether a committed load released all its locks (see :meth:`mark_finished`)."""
        cells = internals(self.cluster).store.read_rows(LOADS_TABLE, [self.row],
                                             [Read(DATA, ("load:finished",))])
        return bool(cells.get(self.row))

    def mark_finished(self, commit_ts: int) -> None:
        """Record in the loads table that this load committed at *commit_ts*: a rerun of
        it then finds it done (:class:`AlreadyLoaded`)."""
        internals(self.cluster).store.mutate_rows(
            LOADS_TABLE, [Mutation(self.row, [(_FINISHED, commit_ts, b"1")])]
        )

    def finish_leftovers(self, loaded: AlreadyLoaded) -> int:
        """Roll forward every lock a committed earlier run of this load left behind
        (its driver died after the commit point): one scan of the table's lock
        family (of its held cells only, where the store can). Returns how many cells
        were released."""
        store = internals(self.cluster).store
        free = encode_lock(Free(loaded.start_ts, True))
        left: list[list[CasItem]] = []
        held = [Read(LOCK, skip_tag=FREE_TAG)]
        for row, cells in store.scan(self.table, None, None, held):
            items: list[CasItem] = []
            for name, versions in cells.items():
                raw = versions[0][1]
                state = decode_lock(raw)
                if isinstance(state, Lock) and state.start_ts == loaded.start_ts:
                    # As release() does for one lock, in batches as finish_rows does: the
                    # data source's commit rolls a whole load forward here (one store
                    # call per lock made it 21 of a 100,000-row write's 30 s).
                    puts = write_cells(name[len(LOCK) + 1 :], loaded.start_ts,
                                       loaded.commit_ts, False, state.notify, state.value)
                    items.append((row, name, raw, free, puts))
            if items:
                left.append(items)
        done = _release(store, self.table, self.load_id, left, _RELEASE_BATCH)
        self.mark_finished(loaded.commit_ts)
        return done
