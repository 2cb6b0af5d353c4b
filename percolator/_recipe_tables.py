"""What the recipes (``observers``: ``Periodic``, Photon, MillWheel, Ubiq) need of
percolator beyond its public API, stated in one internal module so that no recipe
reads or writes percolator's own tables and encodings itself:

* the cluster-wide schedule of periodic tasks (:func:`last_task_run`,
  :func:`record_task_run`), kept in percolator's meta table, outside transactions: a
  task's last run is a hint shared by every process, and a lost or doubled record
  only moves a run by one interval;
* the commit history of a cell (:func:`committed_puts`): the commit timestamps of its
  committed PUTs still kept, which no snapshot shows (a snapshot sees only the
  newest); Photon's ``verify`` counts an event's outputs with it.

The observer worker's contract with a transaction is :mod:`percolator._observer_hooks`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from percolator._cluster import Cluster
from percolator._encoding import META_TABLE, WRITE, WriteKind, check_column, decode_write
from percolator._internals import internals
from percolator._store import Mutation, Read

__all__ = ["committed_puts", "last_task_run", "record_task_run"]

_TASKS_ROW = b"periodic"
_TASKS_FAMILY = "m"
_TIME = struct.Struct(">d")
_BATCH_ROWS = 200


def last_task_run(cluster: Cluster, name: str) -> float | None:
    """Wall time (seconds since the epoch) recorded by the last :func:`record_task_run`
    of task *name* anywhere in the cluster, or None."""
    column = f"{_TASKS_FAMILY}:{name}"
    cells = internals(cluster).store.read_rows(
        META_TABLE, [_TASKS_ROW], [Read(_TASKS_FAMILY, (name,))])
    versions = cells.get(_TASKS_ROW, {}).get(column)
    return _TIME.unpack(versions[0][1])[0] if versions else None


def record_task_run(cluster: Cluster, name: str, when: float) -> None:
    """Record that task *name* finished a run at wall time *when* (seconds)."""
    internals(cluster).store.mutate_rows(META_TABLE, [
        Mutation(_TASKS_ROW, [(f"{_TASKS_FAMILY}:{name}", 0, _TIME.pack(when))])])


def committed_puts(
    cluster: Cluster, table: str, rows: Sequence[bytes], column: str
) -> dict[bytes, list[int]]:
    """The commit timestamps, newest first, of every committed PUT of *column* kept in
    each of *rows* of *table* (rows with none are left out). Read outside any snapshot:
    a commit in flight may or may not be counted; garbage collection drops old ones.

    :raises InvalidArgument: for a bad column.
    """
    check_column(column)
    name = f"{WRITE}:{column}"
    found: dict[bytes, list[int]] = {}
    for start in range(0, len(rows), _BATCH_ROWS):
        cells = internals(cluster).store.read_rows(
            table, rows[start:start + _BATCH_ROWS], [Read(WRITE, (column,), versions=None)])
        for row, columns in cells.items():
            puts = [ts for ts, value in columns.get(name, ())
                    if decode_write(value)[0] is WriteKind.PUT]
            if puts:
                found[row] = puts
    return found
