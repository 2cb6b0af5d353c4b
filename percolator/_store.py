"""The store contract: everything a storage backend implements (DESIGN.md §4).

A store is a Bigtable-like map ``(table, row, "family:qualifier", timestamp) -> bytes``
sorted by row. The transaction protocol needs nothing beyond the methods of
:class:`Store`; each backend (``percolator/stores/``) implements exactly these.

Conventions every backend follows:

* a *column* is the string ``"family:qualifier"``; the family is everything before
  the first colon, the qualifier (which may contain colons) everything after it;
* timestamps are non-negative integers (backends map them to their own units);
* versions are returned newest first;
* ``read_rows``/``scan`` return only columns that have at least one cell in range,
  and ``read_rows`` omits rows that have none;
* a missing table raises :class:`~percolator.UnknownTableError`; a store that
  cannot be reached raises :class:`~percolator.StoreUnavailable` naming it.

Two latitudes, because HBase's Thrift1 interface cannot do otherwise (the conformance
suite documents both with strict expected failures on HBase):

* a :class:`Mutation` whose changes span several timestamps, or mix deletes and
  puts, may become visible in steps (Thrift1 applies one timestamp per call);
* a put at or below the timestamp of an earlier delete of the same cell may stay
  hidden (HBase delete markers mask older versions until a major compaction).

The protocol never needs either: its multi-timestamp writes are ordered so that each
step is safe on its own (data before its write record, write record before the lock
is freed), and it only ever deletes notify versions at or below a notification already
processed and records at or below a timestamp drawn after them, writing anew only
at fresh, larger timestamps.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

Cell = tuple[int, bytes]
"""One version of a cell: ``(timestamp, value)``."""

RowCells = dict[str, list[Cell]]
"""A row's cells: column -> versions, newest first."""


@dataclass(frozen=True, slots=True)
class Read:
    """What to read of one family.

    ``qualifiers=None`` reads every qualifier of the family. ``max_ts`` and
    ``min_ts`` are both inclusive; ``versions`` is how many versions per column to
    return, newest first (``None``: all in the range).
    """

    family: str
    qualifiers: tuple[str, ...] | None = None
    max_ts: int | None = None
    min_ts: int = 0
    versions: int | None = 1


@dataclass(frozen=True, slots=True)
class Mutation:
    """Changes to one row, applied atomically.

    ``puts`` are ``(column, timestamp, value)``; ``deletes`` are ``(column, max_ts)``
    and remove every version of the column at or below ``max_ts``. Deletes are
    applied before puts.
    """

    row: bytes
    puts: Sequence[tuple[str, int, bytes]] = ()
    deletes: Sequence[tuple[str, int]] = ()


@runtime_checkable
class Store(Protocol):
    """The store contract (DESIGN.md §4)."""

    url: str
    """Where the store lives, for messages (no secrets)."""

    atomic_row_cas: bool
    """True if :meth:`check_and_set` applies its ``puts`` in the same atomic step as
    the compare-and-set (and only when it succeeds). False means the caller's puts
    are written first, unconditionally, and then the cell is compared and set."""

    def create_table(self, table: str, families: Mapping[str, int]) -> None:
        """Create *table* with *families* (name -> max versions kept, 0 = all). Idempotent."""
        ...

    def drop_table(self, table: str) -> None:
        """Delete *table* and all its cells. Dropping a missing table is not an error."""
        ...

    def list_tables(self) -> list[str]:
        """Names of the existing tables, sorted."""
        ...

    def read_rows(
        self, table: str, rows: Sequence[bytes], reads: Sequence[Read]
    ) -> dict[bytes, RowCells]:
        """Read *reads* of every row in *rows*, in as few round trips as possible."""
        ...

    def mutate_rows(self, table: str, mutations: Sequence[Mutation]) -> None:
        """Apply *mutations*, each atomically within its row, batched."""
        ...

    def check_and_set(
        self,
        table: str,
        row: bytes,
        column: str,
        expected: bytes | None,
        new: bytes,
        puts: Sequence[tuple[str, int, bytes]] = (),
    ) -> bool:
        """Compare-and-set of one cell whose family keeps a single version.

        If the latest value of ``(row, column)`` equals *expected* (``None``: the cell
        has no value), write *new* as its value and return True; otherwise change
        nothing and return False. *puts* are other cells of the same row
        ``(column, ts, value)``: see :attr:`atomic_row_cas`.
        """
        ...

    def scan(
        self,
        table: str,
        start: bytes | None,
        stop: bytes | None,
        reads: Sequence[Read],
        *,
        batch_size: int = 1000,
    ) -> Iterator[tuple[bytes, RowCells]]:
        """Rows in ``[start, stop)`` in row order with their cells selected by *reads*.

        Rows with no selected cell are not yielded, so a scan over a sparse family
        costs in proportion to its cells, not to the table.
        """
        ...

    def close(self) -> None:
        """Release connections. The store is unusable afterwards."""
        ...
