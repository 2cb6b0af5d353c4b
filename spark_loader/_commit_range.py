"""The change feed of a table: the cells committed between two commit timestamps.

This is the store-level half of ``spark.readStream.format("percolator")`` (the Spark
half is :class:`spark_loader._change_feed.PercolatorChangeFeed`); it needs no Spark.

An offset ``o`` means: every commit with ``commit_ts < o`` has been delivered. A
micro-batch ``[o1, o2)`` reads the write records (family ``w``, one per committed
cell, stored at its commit timestamp) whose timestamps lie in that range, with a
time-range scan; a record that points at a data cell is followed to it.

**Where a batch may end** (:func:`safe_end`). A fresh timestamp ``E`` is not enough: a
two-phase commit draws its commit timestamp ``T < E``, then makes its commit point and
writes its write records, so a scan at ``E`` can miss ``T`` while a later batch starting
at ``E`` never looks below it. What is known once ``E`` is drawn: a transaction that
commits below ``E`` drew its commit timestamp before ``E``, so it had prewritten every
lock before ``E`` (the oracle's one-phase commits are published as in flight, see
docs/timestamps.md, so a start timestamp is never handed out below one not yet
visible). Scanning the table's held locks after drawing ``E``: a lock below ``E`` that
resolves (its transaction dead, or committed at its primary) is rolled back or forward
now, leaving its write record; one that stays (a live writer) bounds the batch at its
start timestamp, since that transaction commits above it. Any other commit below ``E``
had every lock released, with its write records, before the scan passed its rows. So
``min(E, start_ts of the live locks below E)`` is an end below which no commit can
still appear; the reader never waits for a live writer, it only ends short of it.

**What it costs.** Each batch is one time-range scan of the write family and (unless
the embedded store's lock census says no lock is held) one scan of the lock family for
non-FREE cells. The store filters by timestamp and by tag server side (Bigtable's
timestamp-range and value filters, HBase's time range and filters, SQLite's index on
the version), so the rows sent are those that changed, but the scan still visits every
row of the table: a batch costs O(rows of the table) of store work plus O(changes) of
transfer, not O(changes). Cut into partitions by row-key range, it spreads over the
executors. An index of changes (written in the commit, as the notification index is)
would make it O(changes) and is not built: it would add a cell to every commit of every
table, for every reader or not (see docs/spark.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import percolator
from percolator.ext import (
    DATA,
    FREE_TAG,
    LOCK,
    WRITE,
    Committed,
    Lock,
    Read,
    WriteKind,
    decode_lock,
    decode_write,
    inline_value,
    internals,
    resolve_lock,
)

__all__ = ["Change", "changes", "safe_end"]

Change = tuple[bytes, str, bytes | None, int]
"""``(row, column, value, commit_ts)``; value None for a delete."""

_RESOLVE_ROUNDS = 16
"""Times a lock cell is resolved and read again before it counts as live (a cell that
keeps changing under us belongs to writers that are alive)."""


def _below(state: object, ts: int) -> int | None:
    """The start timestamp of a lock state that may hide a commit below *ts*, else
    None (FREE, rolled back, or a transaction that commits above *ts*)."""
    if isinstance(state, Lock) and state.start_ts < ts:
        return state.start_ts
    if isinstance(state, Committed) and state.commit_ts < ts:
        return state.start_ts
    return None


def _live_below(cluster: percolator.Cluster, table: str, row: bytes, name: str, raw: bytes,
                ts: int) -> int | None:
    """Resolve the lock cell *name* of *row* (value *raw*) as a reader does; the start
    timestamp of its transaction if that is alive, below *ts*, and might commit
    below it, else None (nothing there can commit below *ts* unseen any more)."""
    column = name[len(LOCK) + 1:]
    for _ in range(_RESOLVE_ROUNDS):
        start_ts = _below(decode_lock(raw), ts)
        if start_ts is None:
            return None
        if not resolve_lock(internals(cluster), table, row, column, raw):
            return start_ts
        got = internals(cluster).store.read_rows(
            table, [row], [Read(LOCK, (column,), skip_tag=FREE_TAG)]).get(row, {})
        if name not in got:
            return None
        raw = got[name][0][1]
    return _below(decode_lock(raw), ts)


def safe_end(cluster: percolator.Cluster, table: str, columns: Sequence[str] | None,
             floor: int) -> int:
    """An offset at least *floor* below which every commit of *table* (its *columns*,
    None: all) is visible, and none can appear any more (see the module docstring).
    Resolves the locks of dead or committed transactions it meets, as a reader does;
    never waits for a live one."""
    ts = internals(cluster).timestamps.get_timestamp()
    census = internals(cluster).lock_census
    if census is not None and census.clean():  # asked after ts was drawn, as it requires
        return max(ts, floor)
    end = ts
    qualifiers = None if columns is None else tuple(columns)
    lock_read = Read(LOCK, qualifiers, skip_tag=FREE_TAG)
    for row, cells in internals(cluster).store.scan(table, None, None, [lock_read]):
        for name, versions in cells.items():
            live = _live_below(cluster, table, row, name, versions[0][1], ts)
            if live is not None:
                end = min(end, live)  # it commits above its start, if at all
    return max(end, floor)


def changes(cluster: percolator.Cluster, table: str, start: bytes | None, stop: bytes | None,
            columns: Sequence[str] | None, from_ts: int, to_ts: int) -> Iterator[Change]:
    """The cells of rows ``[start, stop)`` of *table* committed with ``from_ts <=
    commit_ts < to_ts``, row by row, each row's in commit order. User columns only
    (observer acknowledgements and other ``_`` families are left out).

    *to_ts* must come from :func:`safe_end`. The read holds garbage collection back at
    *from_ts* while it runs and checks the safe point after it.

    :raises SnapshotTooOldError: *from_ts* is below the garbage-collection safe point:
        versions the feed has not delivered may have been collected.
    """
    if from_ts >= to_ts:
        return
    qualifiers = None if columns is None else tuple(columns)
    writes = Read(WRITE, qualifiers, min_ts=from_ts, max_ts=to_ts - 1, versions=None)
    prefix = WRITE + ":"
    with percolator.Snapshot(cluster, start_ts=max(from_ts, 1)):  # holds the safe point
        for row, cells in internals(cluster).store.scan(table, start, stop, [writes]):
            found: list[tuple[int, str, bytes | None]] = []
            pointers: dict[tuple[str, int], int] = {}
            for name, versions in cells.items():
                column = name[len(prefix):]
                if not name.startswith(prefix) or column[:1] == "_":
                    continue
                for commit_ts, record in versions:
                    kind, data_ts = decode_write(record)
                    if kind is WriteKind.ROLLBACK:
                        continue
                    value = inline_value(record)
                    if kind is WriteKind.PUT and value is None:
                        pointers[(column, data_ts)] = len(found)
                    found.append((commit_ts, column, value))
            if pointers:
                stamps = [ts for _, ts in pointers]
                data_read = Read(DATA, tuple({c for c, _ in pointers}), min_ts=min(stamps),
                                 max_ts=max(stamps), versions=None)
                data = internals(cluster).store.read_rows(table, [row], [data_read]).get(row, {})
                for (column, ts), i in pointers.items():
                    stored = [v for t, v in data.get(f"{DATA}:{column}", []) if t == ts]
                    found[i] = (found[i][0], column, stored[0] if stored else None)
            for commit_ts, column, value in sorted(found, key=lambda f: (f[0], f[1])):
                yield row, column, value, commit_ts
        internals(cluster).safe_point.check(from_ts)
