"""Backup and restore of an embedded store (``percolator backup`` / ``percolator restore``).

**What is copied.** The repository's state is the SQLite file alone: tables, write
records, locks, notifications, the catalog and the persisted timestamp ceiling. The
side files next to it (docs/embedded.md lists them) hold what the processes that have
the file open share while they run (the timestamp block handed out from memory, the
lock census flag, advisory locks, the writers' turn and presence); each is made anew,
from the file, by the first process that opens a store where it is missing. So a backup
is one file: SQLite's online backup API copies the database as of one read transaction,
a consistent snapshot of a single point of its history, while writers go on (in WAL
mode a reader never blocks them). It is written beside its destination and renamed
into place, so a destination never holds half a backup.

**Timestamps never go backwards.** A process persists a timestamp ceiling in the file
before it hands out a timestamp below it (:class:`~percolator._timestamps.HostTimestamps`),
in an earlier SQLite transaction than any commit that uses one; a snapshot of the file
that holds a commit holds the ceiling above it. A restored store has no ``-ts`` file:
its first process starts above that ceiling, so above every timestamp in the backup.

**Locks in the copy.** A two-phase commit (or a bulk load) in flight when the backup was
taken leaves its locks in the copy. No process writes the restored file yet, so none
of those transactions can finish there: :func:`restore` resolves every lock as a
reader would resolve the lock of a dead owner (rolled forward where the primary had
committed, rolled back otherwise) before it returns, so that the restored store starts
with no lock held.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from percolator._encoding import FREE_TAG, LOCK
from percolator._errors import InvalidArgument, StoreUnavailable
from percolator._lock_resolver import resolve_lock
from percolator._store import Read, Store
from percolator.stores.sqlite import SqliteStore, open_sqlite_store, sqlite_path

__all__ = ["BackupSummary", "backup", "restore"]


@dataclass(frozen=True)
class BackupSummary:
    """What :func:`backup` or :func:`restore` did."""

    source: str
    destination: str
    bytes: int
    locks_resolved: int = 0


def _embedded_path(url: str, what: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise InvalidArgument(
            f"{what} {url!r} is not an embedded store: backup and restore copy a "
            "'sqlite:' store; back up HBase or Bigtable with their own tools, or export "
            "tables at one snapshot (docs/spark.md)"
        )
    if parts.netloc or not parts.path.strip("/") or ":memory:" in parts.path:
        raise InvalidArgument(f"bad sqlite url {url!r}: expected 'sqlite:///abs/path.db'")
    return sqlite_path(parts.path)


def _refuse_existing(path: str) -> None:
    if os.path.exists(path):
        raise InvalidArgument(
            f"{path} already exists: backup and restore never overwrite a file; remove it "
            "or choose another path"
        )


def _copy(source: str, destination: str, busy_timeout: float) -> int:
    """Copy the database *source* to *destination* with SQLite's online backup, in one
    step (one read transaction: one consistent point), through a temporary file
    renamed into place."""
    partial = f"{destination}.partial-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(partial)
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=busy_timeout)
        try:
            dst = sqlite3.connect(partial)
            try:
                src.backup(dst)  # pages=-1: all of it in one step
                dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            finally:
                dst.close()
        finally:
            src.close()
        os.replace(partial, destination)
    except sqlite3.Error as e:
        raise StoreUnavailable(f"cannot copy {source} to {destination}: {e}") from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    return os.path.getsize(destination)


def backup(url: str, destination: str, *, busy_timeout: float = 60.0) -> BackupSummary:
    """Copy the embedded store at *url* to the file *destination* (which must not
    exist), consistently, while its writers run.

    :raises InvalidArgument: *url* is not an embedded store, or *destination* exists.
    :raises StoreUnavailable: no store at *url*, or the copy failed."""
    source = _embedded_path(url, "source")
    if not os.path.isfile(source):
        raise StoreUnavailable(f"no store at {source} ({url}): nothing to back up")
    destination = os.path.abspath(destination)
    _refuse_existing(destination)
    size = _copy(source, destination, busy_timeout)
    return BackupSummary(url, destination, size)


class _NoOwnerLives:
    """The coordination of a restored file, which no process has written: every owner
    of a lock found in it is dead here (its transaction cannot go on in this copy)."""

    def is_alive(self, owner: str) -> bool:
        return False


@dataclass
class _RestoreHost:
    """What :func:`~percolator._lock_resolver.resolve_lock` needs of a cluster."""

    store: Store
    coordination: Any
    stats: Counter[str]


def restore(backup_file: str, url: str, *, busy_timeout: float = 60.0) -> BackupSummary:
    """Make a new embedded store at *url* (its file must not exist) from *backup_file*
    (made by :func:`backup`), resolving the locks of transactions that were in flight
    when the backup was taken. Its first process hands out timestamps above every
    timestamp in the backup.

    :raises InvalidArgument: *url* is not an embedded store, or its file exists.
    :raises StoreUnavailable: *backup_file* is missing or not a store."""
    source = os.path.abspath(backup_file)
    if not os.path.isfile(source):
        raise StoreUnavailable(f"no backup at {source}")
    destination = _embedded_path(url, "destination")
    _refuse_existing(destination)
    for suffix in ("-ts", "-census", "-locks", "-wal", "-shm"):
        # side files of an earlier store at this path: its state, not the backup's
        _refuse_existing(destination + suffix)
    size = _copy(source, destination, busy_timeout)
    store = open_sqlite_store(f"sqlite://{destination}", busy_timeout=busy_timeout)
    try:
        resolved = _resolve_every_lock(store)
    finally:
        store.close()
    return BackupSummary(backup_file, url, size, resolved)


def _resolve_every_lock(store: SqliteStore) -> int:
    host = _RestoreHost(store, _NoOwnerLives(), Counter())
    held = Read(LOCK, skip_tag=FREE_TAG)
    for table in store.list_tables():
        if LOCK not in store._table_families(table):
            continue
        for _ in range(3):  # a secondary resolved with its primary is FREE the next time
            found = [(row, name[len(LOCK) + 1:], versions[0][1])
                     for row, cells in store.scan(table, None, None, [held])
                     for name, versions in cells.items()]
            if not found:
                break
            for row, column, raw in found:
                resolve_lock(host, table, row, column, raw)
        else:
            raise StoreUnavailable(f"restore: locks of table {table!r} are still held after "
                                   "three passes of resolution; the backup may be damaged")
    return host.stats["locks_resolved"]
