"""The notification index: where a scan for pending notifications costs O(pending).

Percolator keeps notify cells in their own locality group, so scanning them reads only
the dirty cells (paper §2.4). The embedded store and HBase have that for free: SQLite
indexes the family, and HBase keeps each column family in its own store files, so a
scan restricted to the ``n`` family reads only those files (plus one seek per region).
Cloud Bigtable has no locality groups a client can ask for: a family-filtered scan
reads every row of the table on the server and is billed for it. A store whose
family-filtered scans cost O(rows) declares ``NOTIFY_INDEX`` (:mod:`percolator._store`); for it,
every notify cell also has an **index entry** in the internal table ``__notify``:

* row ``<bucket><table>\\0<row>`` (*bucket*: two hex digits of a hash of table and
  row, so that the index spreads over tablets and scanners start at random places),
  column ``n:<column>``, value ``b"1"``;
* written **before the commit point** by the committer (after the notifying
  transaction holds its locks), for strong and weak notifications alike, so neither
  a roll-forward nor a crash after the commit point can leave a notify cell without
  its entry (roll-forward writes notify cells only for a transaction whose entries
  are already there);
* deleted by a worker only when it finds the cell settled: no notify version and the
  cell's lock FREE. It deletes, then reads the cell again and writes the entry back
  if a notify version or a held lock appeared meanwhile (:func:`settle`). Why that
  loses nothing: a strong notification's entry is written while its transaction
  holds the cell's lock, which it releases only after writing the notify cell; an
  entry deleted before the second read was written before it, so the second read
  sees the lock still held or the notify cell already there. A weak notification's
  notify cell is written before its entry, so the same second read sees it. An entry
  written after the deletion is not touched by it (Bigtable deletes only existing
  cells; HBase, whose delete markers would mask it, does not use the index).

The index is a superset of the pending notifications: a transaction that fails after
writing its entries leaves some without a notify cell, which a worker deletes.

Tables whose notifications predate the index (or a client that does not write it)
are migrated by :func:`migrate`: one scan of the table's notify family, writing an
entry for each pending notification, then a marker in the meta table so that it
happens once per table.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from percolator._encoding import (
    FREE_TAG,
    LOCK,
    META_TABLE,
    NOTIFY,
    Free,
    decode_lock,
    split_column,
)
from percolator._lock_resolver import LockHost, resolve_lock
from percolator._store import NOTIFY_INDEX, Mutation, Read, Store, declares

if TYPE_CHECKING:
    from percolator._timestamps import TimestampSource

__all__ = [
    "INDEX_FAMILIES",
    "INDEX_TABLE",
    "index_key",
    "indexed_cells",
    "is_migrated",
    "migrate",
    "parse_key",
    "scan_index",
    "settle",
    "settle_rows",
    "uses_index",
    "write_entries",
]

INDEX_TABLE = "__notify"
INDEX_FAMILIES: dict[str, int] = {"n": 0}
_ENTRY = b"1"
_MIGRATED = b"notify-index/"


class IndexHost(LockHost, Protocol):
    """What the notification index uses of a cluster's parts (``internals(cluster)``):
    what lock resolution does, and its timestamps (entries it writes again, and the
    migration marker, take a fresh timestamp)."""

    @property
    def timestamps(self) -> TimestampSource: ...


def uses_index(store: Store) -> bool:
    """Whether notifications on *store* are found through the index."""
    return declares(store, NOTIFY_INDEX)


def index_key(table: str, row: bytes) -> bytes:
    """The index row of *row* of *table*."""
    name = table.encode()
    bucket = b"%02x" % (zlib.crc32(name + b"\0" + row) & 0xFF)
    return bucket + name + b"\0" + row


def parse_key(key: bytes) -> tuple[str, bytes]:
    """``(table, row)`` of the index row *key*."""
    name, _, row = key[2:].partition(b"\0")
    return name.decode(), row


def write_entries(cluster: IndexHost, cells: Iterable[tuple[str, bytes, str]], ts: int) -> None:
    """Write index entries for the notify cells ``(table, row, column)`` (a no-op on a
    store without the index)."""
    if not uses_index(cluster.store):
        return
    rows: dict[bytes, list[tuple[str, int, bytes]]] = {}
    for table, row, column in cells:
        rows.setdefault(index_key(table, row), []).append((f"n:{column}", ts, _ENTRY))
    if rows:
        cluster.store.mutate_rows(INDEX_TABLE, [Mutation(k, p) for k, p in rows.items()])


def scan_index(
    cluster: IndexHost, start: bytes | None, stop: bytes | None, batch_size: int = 128
) -> Iterator[tuple[str, bytes, dict[str, int]]]:
    """Index entries in ``[start, stop)``: ``(table, row, {column: newest entry ts})``."""
    for key, cells in cluster.store.scan(INDEX_TABLE, start, stop, [Read("n")],
                                         batch_size=batch_size):
        table, row = parse_key(key)
        yield table, row, {name[2:]: versions[0][0] for name, versions in cells.items()}


def settle(
    cluster: IndexHost, table: str, row: bytes, entries: dict[str, int], *, look_first: bool = True
) -> list[str]:
    """Delete the index entries *entries* (``{column: newest entry ts seen}``) of
    *row* whose cell is settled (no notify version, lock FREE), keeping the others;
    see the module docstring for why this loses no notification. Locks found held are
    resolved as a reader would (a crashed committer's cell is rolled forward, which
    writes its notify cell). Returns the columns whose entries stay.

    Only the read after the deletion matters for safety; the one before (skipped
    without *look_first*, e.g. right after processing the row, when the cell is most
    likely settled) spares a busy cell's entry a deletion and a rewrite at a new
    timestamp, which would look like new work to the lookouts."""
    return settle_rows(cluster, [(table, row, entries)], look_first=look_first)[(table, row)]


def settle_rows(
    cluster: IndexHost, items: Sequence[tuple[str, bytes, dict[str, int]]], *,
    look_first: bool = True,
) -> dict[tuple[str, bytes], list[str]]:
    """:func:`settle` of several rows ``(table, row, entries)`` at once: one deletion
    for all of them, and one read per table before (with *look_first*) and after it,
    instead of those calls per row; each row is settled exactly as :func:`settle`
    settles it alone. Returns, by ``(table, row)``, the columns whose entries stay."""
    merged: dict[tuple[str, bytes], dict[str, int]] = {}
    for table, row, entries in items:
        merged.setdefault((table, row), {}).update(entries)

    def busy(
        wanted: Mapping[tuple[str, bytes], Iterable[str]],
    ) -> dict[tuple[str, bytes], set[str]]:
        by_table: dict[str, dict[bytes, tuple[str, ...]]] = {}
        for (table, row), columns in wanted.items():
            by_table.setdefault(table, {})[row] = tuple(columns)
        found: dict[tuple[str, bytes], set[str]] = {key: set() for key in wanted}
        for table, rows in by_table.items():
            columns = tuple(dict.fromkeys(c for cs in rows.values() for c in cs))
            reads = [Read(NOTIFY, columns), Read(LOCK, columns, skip_tag=FREE_TAG)]
            result = cluster.store.read_rows(table, list(rows), reads)
            for row, cells in result.items():
                for name, versions in cells.items():
                    family, column = split_column(name)
                    if column not in rows[row]:
                        continue  # read for another row of the table
                    if family == LOCK and versions:
                        state = decode_lock(versions[0][1])
                        if isinstance(state, Free):
                            continue
                        resolve_lock(cluster, table, row, column, versions[0][1])
                    found[(table, row)].add(column)
        return found

    keep = busy(merged) if look_first else {key: set() for key in merged}
    settled = {key: [c for c in entries if c not in keep[key]]
               for key, entries in merged.items()}
    settled = {key: columns for key, columns in settled.items() if columns}
    if settled:
        cluster.store.mutate_rows(INDEX_TABLE, [
            Mutation(index_key(*key), deletes=[(f"n:{c}", merged[key][c]) for c in columns])
            for key, columns in settled.items()])
    again = busy(settled) if settled else {}
    back = [(table, row, c) for (table, row), columns in again.items() for c in columns]
    if back:
        write_entries(cluster, back, cluster.timestamps.get_timestamp())
    return {key: sorted(keep[key] | again.get(key, set())) for key in merged}


def indexed_cells(
    cluster: IndexHost, tables: Iterable[str], reads: Iterable[Read], batch_rows: int = 100
) -> Iterator[tuple[str, bytes, dict[str, list[tuple[int, bytes]]]]]:
    """``(table, row, cells)`` of every indexed row of *tables*: *reads* (each
    restricted to the row's indexed columns) of the rows the index names, a batch of
    rows per store read. Costs O(index entries), not O(rows) (see the module docstring
    for why every pending notification has an entry, once its table is migrated)."""
    wanted = set(tables)
    reads = list(reads)
    batch: dict[str, dict[bytes, set[str]]] = {}

    def flush(table: str) -> Iterator[tuple[str, bytes, dict[str, list[tuple[int, bytes]]]]]:
        rows = batch.pop(table)
        columns = tuple(sorted(set().union(*rows.values())))
        narrowed = [replace(r, qualifiers=columns) for r in reads]
        found = cluster.store.read_rows(table, list(rows), narrowed)
        for row, indexed in rows.items():
            cells = {name: versions for name, versions in found.get(row, {}).items()
                     if split_column(name)[1] in indexed}
            if cells:
                yield table, row, cells

    for table, row, entries in scan_index(cluster, None, None, batch_size=512):
        if table not in wanted:
            continue
        batch.setdefault(table, {})[row] = set(entries)
        if len(batch[table]) >= batch_rows:
            yield from flush(table)
    for table in list(batch):
        yield from flush(table)


def is_migrated(cluster: IndexHost, table: str) -> bool:
    """Whether every pending notification of *table* has an index entry (see
    :func:`migrate`)."""
    marker = _marker(table)
    store = cluster.store
    return marker in store.read_rows(META_TABLE, [marker], [Read("m", ("migrated",))])


def _marker(table: str) -> bytes:
    return _MIGRATED + table.encode()


def migrate(cluster: IndexHost, table: str) -> int:
    """Give every pending notification of *table* an index entry, once per table (a
    marker in the meta table remembers it). Returns how many entries were written."""
    if not uses_index(cluster.store):
        return 0
    if is_migrated(cluster, table):
        return 0
    marker = _marker(table)
    ts = cluster.timestamps.get_timestamp()
    found = [
        (table, row, name[len(NOTIFY) + 1 :])
        for row, cells in cluster.store.scan(table, None, None, [Read(NOTIFY)])
        for name in cells
    ]
    write_entries(cluster, found, ts)
    cluster.store.mutate_rows(META_TABLE, [Mutation(marker, [("m:migrated", 0, b"1")])])
    return len(found)
