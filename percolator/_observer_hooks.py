"""The observer-transaction contract (internal): everything the observer worker
(``observers/_worker.py``) does to a percolator transaction beyond the public API,
and everything percolator's commit does for it in return. Both sides import this
module; neither sets nor reads the other's private attributes.

A worker's run of observer *O* on the notification of ``(table, row, column)``, whose
newest notify version it read raw is *N* (Percolator §2.4; DESIGN.md §7):

1. It begins an :class:`ObserverRun` (a :class:`~percolator.TransactionBase` that
   the framework commits) and hands it the worker's stop event
   (:meth:`ObserverRun.stop_waiting_on`): a read that waits on a lock gives up at once
   when the worker stops.
2. With :meth:`ObserverRun.internal_columns` on, it reads *column* and *O*'s
   acknowledgement ``_ack:<O>@<column>`` (columns of ``_`` families are refused to
   user code). Every row read passes through :meth:`ObserverRun._values`, which keeps
   the write records it saw, so :meth:`ObserverRun.change_version` tells the commit
   timestamp of the change the run sees without another store call. A worker that
   has not read the notification yet (its index pass) reads it in the same store
   call (:meth:`ObserverRun.get_row_notified`): *N* is then the newest notify version
   at or below the run's start_ts, a newer one (a commit after the draw, whose change
   the snapshot lacks) being left for a later pass.
3. Already acknowledged (and not a weak notification): it closes the run (nothing
   to commit). Otherwise it switches internal columns off, calls ``O.process(txn,
   row, column)``, switches them on again and writes the new acknowledgement.
4. Where its commit may serve the notification itself it says so with
   :meth:`ObserverRun.settle_on_commit` (a :class:`Settlement`: the notify versions
   of the cell at or below *N*). A one-phase commit (the embedded store,
   ``percolator/_commit.py``) deletes them in its atomic step, with the run's writes,
   and marks the settlement :attr:`~Settlement.done`; a two-phase commit leaves them,
   and the worker deletes them after the commit (:attr:`ObserverRun.settled` False).
   A notification written meanwhile is above *N* and survives either way.

5. A worker that reads the notification in the run's first read may also ask the
   run's two-phase commit for its next run's start timestamp
   (:meth:`ObserverRun.pass_start_on`): the commit draws two timestamps in one
   request, takes the lower and leaves the upper in the :class:`NextStart`, and the
   worker begins its next run at it (``ObserverRun(cluster, start_ts=...)``), one
   timestamp request per run where there were two. The snapshot is as of that draw;
   a notification committed since is above it and left for a later run (step 2).
   A run that found no notification at or below its start timestamp, and none above
   it, wrote nothing: the worker hands its start timestamp on in the same way.

The commit side reads only :attr:`TransactionBase._settlement` (None for every
transaction that is not an observer run) and sets :attr:`Settlement.done`, and fills
:attr:`TransactionBase._next_start` where a run set it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from percolator._cluster import Cluster
from percolator._encoding import NOTIFY, WRITE, WriteKind, decode_write
from percolator._internals import internals
from percolator._store import Cell, Read, RowCells
from percolator._timestamps import NextStart
from percolator._transaction import Snapshot, TransactionBase

__all__ = ["NextStart", "ObserverRun", "Settlement", "internal_columns"]

_WRITE_PREFIX = f"{WRITE}:"


@dataclass(slots=True)
class Settlement:
    """The notification an observer run serves: the notify versions of ``(table, row,
    column)`` at or below *newest*. :attr:`done` is set by the commit that deleted
    them in its own atomic step."""

    table: str
    row: bytes
    column: str
    newest: int
    done: bool = False

    @property
    def notify_column(self) -> str:
        """The notify cell's column in the store."""
        return f"{NOTIFY}:{self.column}"


@functools.lru_cache(maxsize=256)
def _notify_read(column: str) -> Read:
    """The read of every notify version of *column* (one Read per column: building a
    frozen dataclass on every observer run's path costs more than the lookup)."""
    return Read(NOTIFY, (column,), versions=None)


def internal_columns(txn: Snapshot, on: bool) -> None:
    """Let *txn* read and write the columns of ``_`` families (acknowledgements) while
    *on*; user code never gets them."""
    txn._internal_columns = on


class ObserverRun(TransactionBase):
    """A transaction run by an observer worker (see the module docstring): no commit
    of its own (the worker commits it), internal columns on request, the commit
    timestamps of the changes it read, and a notification its commit may serve."""

    _kind = "observer"

    def __init__(self, cluster: Cluster, *, start_ts: int | None = None) -> None:
        super().__init__(cluster, start_ts=start_ts)
        self._write_versions: dict[tuple[str, bytes, str], list[Cell]] = {}
        self._notify_read: Read | None = None
        self._notify_cells: list[Cell] = []

    def internal_columns(self, on: bool) -> None:
        """:func:`internal_columns` of this run."""
        internal_columns(self, on)

    def stop_waiting_on(self, stop: threading.Event) -> None:
        """Cut this run's lock waits short once *stop* is set (its worker stops)."""
        self._stop_waiting = stop

    def settle_on_commit(self, settlement: Settlement) -> None:
        """Ask the commit to delete *settlement*'s notify versions where it can do so
        atomically with the run's writes (see :attr:`settled`)."""
        self._settlement = settlement

    def pass_start_on(self, next_start: NextStart) -> None:
        """Ask a two-phase commit of this run to leave a start timestamp, drawn with
        its commit timestamp, in *next_start* (step 5 of the module docstring)."""
        self._next_start = next_start

    @property
    def settled(self) -> bool:
        """Whether the commit deleted the notification it was asked to settle."""
        return self._settlement is not None and self._settlement.done

    @property
    def settlement(self) -> Settlement | None:
        return self._settlement

    def get_row_notified(
        self, table: str, row: bytes, columns: Sequence[str], column: str
    ) -> tuple[dict[str, bytes], list[Cell]]:
        """:meth:`get_row` of *columns*, and the raw notify versions of *column* (newest
        first, at any timestamp) read in the same store call: the notify read and the
        run's first read are one round trip. The row read is atomic, so a strong notify
        version at or below start_ts comes with its change (or the lock the read waited
        on): the notification and the snapshot agree."""
        self._notify_read = _notify_read(column)
        self._notify_cells = []
        try:
            values = self.get_row(table, row, columns)
        finally:
            self._notify_read = None
        return values, self._notify_cells

    def _reads(self, columns: Sequence[str] | None) -> list[Read]:
        reads = super()._reads(columns)
        return reads if self._notify_read is None else [*reads, self._notify_read]

    def _values(self, table: str, row: bytes, cells: RowCells) -> dict[str, bytes]:
        if self._notify_read is not None:
            assert self._notify_read.qualifiers is not None
            self._notify_cells = cells.get(f"{NOTIFY}:{self._notify_read.qualifiers[0]}", [])
        for name, writes in cells.items():
            if name.startswith(_WRITE_PREFIX):
                self._write_versions[(table, row, name[len(_WRITE_PREFIX):])] = writes
        return super()._values(table, row, cells)

    def change_version(self, table: str, row: bytes, column: str) -> int:
        """Commit timestamp of the newest PUT or DELETE of the cell at or below
        start_ts (0: never written). Call after reading the cell."""
        writes = self._write_versions.get((table, row, column))
        if not writes:
            return 0
        ts, value = writes[0]
        if decode_write(value)[0] is not WriteKind.ROLLBACK:
            return ts
        cells = internals(self.cluster).store.read_rows(
            table, [row], [Read(WRITE, (column,), max_ts=self.start_ts, versions=None)]
        )
        for ts, value in cells.get(row, {}).get(f"{WRITE}:{column}", []):
            if decode_write(value)[0] is not WriteKind.ROLLBACK:
                return ts
        return 0
