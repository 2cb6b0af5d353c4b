"""Reading another Percolator table's changes: the cells committed since a position,
shared by ``millwheel.TableSource`` and ``photon.TableFeed``.

A position is ``{"a": T}`` (every change committed at or below timestamp T was read)
or, in the middle of a pass, ``{"a": T, "p": S, "r": row}``. A pass reads, in row
order, the cells whose newest committed write has a commit timestamp in ``(T, S]``,
where S is the start timestamp of the pass's first snapshot; each later read of the
pass takes a new snapshot (at or above S) and goes on after ``row``.

Why nothing is read twice or missed: a change is read in the pass whose interval holds
its commit timestamp, and intervals do not overlap. A commit at or below S is visible
to every snapshot of the pass (snapshot isolation: they start at or above S), so it is
read when the pass reaches its row, unless a newer write of the cell (above S) hides
it: the newer value is then read by a later pass (changes of a cell coalesce, as
notifications do). Deletes are not reported.

A pass scans the whole table (O(table), not O(changes)): for a large table that
changes little, observe it instead (an observer writing into the pipeline).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from percolator import Cluster, InvalidArgument
from percolator.ext import ObserverRun

__all__ = ["Change", "TableChanges"]


@dataclass(frozen=True)
class Change:
    """A committed cell: its row, column, value and commit timestamp."""

    row: bytes
    column: str
    value: bytes
    commit_ts: int


class TableChanges:
    """The changes of *columns* (None: every user column) of *table*, read from a
    position that the caller commits with what it does with them (module docstring)."""

    def __init__(self, cluster: Cluster, table: str, columns: Sequence[str] | None = None
                 ) -> None:
        if not isinstance(cluster, Cluster):
            raise InvalidArgument(f"TableChanges needs a percolator.Cluster, got {cluster!r:.80}")
        if not isinstance(table, str) or not table:
            raise InvalidArgument(f"table must be a table name, got {table!r}")
        if columns is not None and (isinstance(columns, str) or not all(
                isinstance(c, str) and c for c in columns)):
            raise InvalidArgument(f"columns must be a list of column names or None, "
                                  f"got {columns!r:.80}")
        self.cluster, self.table = cluster, table
        self.columns = None if columns is None else list(columns)

    def read(self, position: dict[str, Any], limit: int) -> tuple[list[Change], dict[str, Any]]:
        """Up to about *limit* changes after *position* (whole rows: a row with more
        changes than that is read whole), and the position after them."""
        if not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(f"limit must be an int >= 1, got {limit!r}")
        after = int(position.get("a", 0))
        # A snapshot that remembers the commit timestamp of each cell it reads.
        snap = ObserverRun(self.cluster)
        try:
            upto = int(position.get("p", snap.start_ts))
            start = bytes.fromhex(position["r"]) + b"\0" if "r" in position else None
            found: list[Change] = []
            for row, cells in snap.scan(self.table, start, None, self.columns):
                for column in sorted(cells):
                    ts = snap.change_version(self.table, row, column)
                    if after < ts <= upto:
                        found.append(Change(row, column, cells[column], ts))
                if len(found) >= limit:
                    return found, {"a": after, "p": upto, "r": row.hex()}
        finally:
            snap.close()
        if not found and "p" not in position:
            return [], dict(position)  # nothing new: the same position, nothing to commit
        return found, {"a": upto}
