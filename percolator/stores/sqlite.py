"""The embedded store: one SQLite file in WAL mode, shared by processes on one host.

Each (table, family) pair is its own SQLite table, keyed ``(row, qual, ts)`` without
rowid: a family is its own locality group, so a scan of the sparse notify family
touches only its cells. A lock family also gets, when first asked
(:meth:`SqliteStore.any_untagged`), a partial index of its cells that are not FREE.
Every contract call is one SQLite statement or one
``BEGIN IMMEDIATE`` transaction (a "round trip" in the benchmarks):

=================  ====================================================
``read_rows``       one SELECT (one row: scalar subqueries; several: a UNION ALL)
``mutate_rows``     one write transaction
``check_and_set``   one write transaction (puts applied atomically)
``scan``            one SELECT per batch of rows
=================  ====================================================

Next to the file: ``-wal`` and ``-shm`` (SQLite's), ``-write.lock`` (the writers' turn,
taken only while another store object writes the file) and ``-writers`` (who does:
see :class:`_Writers`); the timestamp sidecar ``-ts``, the lock census ``-census`` and
the coordinator's ``-locks`` belong to the cluster.

``synchronous=NORMAL`` in WAL mode: a committed write survives ``kill -9`` of any
process (the WAL is in the OS page cache); only a power cut may lose the last
transactions, never corrupt the file.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from percolator import _forks
from percolator import metrics as _metrics
from percolator._embedded_mode import WRITE_LOCK_SUFFIX, WRITERS_SUFFIX
from percolator._encoding import split_column
from percolator._errors import InvalidArgument, StoreUnavailable, UnknownTableError
from percolator._presence import MARK_SIZE, Presence
from percolator._store import (
    ATOMICALLY,
    CHECK_AND_SET_MANY,
    DELETE_IF,
    EMBEDDED_FILE,
    NEWEST_OF_ROW,
    PUT_ROW,
    SINGLE_WRITER,
    VACUUM,
    Capability,
    Cell,
    Mutation,
    Read,
    RowCells,
    check_skip_tag,
    drop_skipped,
)
from percolator.stores import REQUESTS
from percolator.stores._url import check_scan, parse_store_url

__all__ = ["SqliteStore", "open_sqlite_store", "sqlite_path"]

log = logging.getLogger(__name__)

_CATALOG = "_percolator_catalog"
_MAX_TS = (1 << 63) - 1
_FORMAT = 2
"""File format (``PRAGMA user_version``). 2: families of one version are keyed
``(row, qual)``, so a put is one upsert."""



def open_sqlite_store(url: str, **options: Any) -> SqliteStore:
    """Open ``sqlite:///absolute/path.db`` or ``sqlite:relative/path.db`` (relative to
    the current directory, made absolute here; the store's ``url`` shows the absolute
    form). ``sqlite:///:memory:`` is refused: the store is shared between connections
    and processes, and lives in files. Option (query or keyword, the keyword wins):
    ``busy_timeout`` (seconds, default 60)."""
    parsed = parse_store_url(url, "sqlite", options, known=("busy_timeout",))
    parts = parsed.parts
    if ":memory:" in parts.path.split("/"):
        raise InvalidArgument(
            f"bad sqlite url {url!r}: an in-memory database is refused (the store is shared "
            "between connections and processes, and keeps side files next to its file); "
            "give a file path, e.g. 'sqlite:///var/lib/app/repo.db' or 'sqlite:repo.db'"
        )
    if parts.netloc or parts.fragment or not parts.path.strip("/"):
        raise InvalidArgument(
            f"bad sqlite url {url!r}: expected 'sqlite:///absolute/path/to/file.db' "
            "(or 'sqlite:relative/path.db', from the current directory)"
        )
    return SqliteStore(sqlite_path(parts.path), busy_timeout=parsed.seconds("busy_timeout", 60.0))


def sqlite_path(url_path: str) -> str:
    """The absolute file path that the path part of a ``sqlite:`` url names."""
    if url_path.startswith("/"):
        # 'sqlite:////srv/x.db' (SQLAlchemy's absolute form) means /srv/x.db too
        return "/" + url_path.lstrip("/")
    return os.path.abspath(url_path)


def _collect_puts(
    by_family: dict[str, list[tuple[bytes, str, int, bytes]]],
    row: bytes,
    puts: Sequence[tuple[str, int, bytes]],
) -> None:
    for column, ts, value in puts:
        if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
            raise _bad_timestamp(column, ts)
        family, qual = split_column(column)
        by_family.setdefault(family, []).append((row, qual, ts, value))


def _bad_timestamp(column: str, ts: object) -> InvalidArgument:
    return InvalidArgument(f"timestamps must be integers >= 0, got {ts!r} for column {column!r}")


def _sql_name(table: str, family: str) -> str:
    return '"' + f"{table}#{family}".replace('"', '""') + '"'



def _newest_cells_into(cells: RowCells, names: list[str], result: Sequence[Any],
                       first: int) -> None:
    """Add to *cells* the newest versions in *result*, a row of
    :meth:`SqliteStore._plan_newest`'s statement: from column *first* on, a (timestamp,
    value) pair per name in *names*, the timestamp None where the cell has no version."""
    i = first
    for name in names:
        ts = result[i]
        if ts is not None:
            had = cells.get(name)
            if had is None:
                cells[name] = [(ts, result[i + 1])]
            else:
                # Another read of the same cell, in other bounds (a transaction's read of
                # the write records at or below start_ts and of the newest after it):
                # what each selects, as the general path gives it.
                had.append((ts, result[i + 1]))
                _newest_first(had)
        i += 2


def _newest_first(versions: list[Cell]) -> None:
    """*versions* of one cell, gathered by several reads, sorted newest first in place,
    a version that more than one read selected kept once."""
    versions.sort(key=lambda cell: -cell[0])
    at = 1
    while at < len(versions):
        if versions[at][0] == versions[at - 1][0]:
            del versions[at]
        else:
            at += 1


def _newest_params(row: bytes, reads: Sequence[Read]) -> list[Any]:
    """The parameters of :meth:`SqliteStore._plan_newest`'s statement: the row, each
    read's bounds, then every qualifier."""
    params: list[Any] = [row]
    for read in reads:
        params.append(read.min_ts)
        params.append(_MAX_TS if read.max_ts is None else read.max_ts)
    for read in reads:
        params.extend(read.qualifiers or ())
    return params

class _Writers:
    """The writers' turn of one file (``<file>-write.lock``, see
    :meth:`SqliteStore._take_turn`) and whether another store object writes it: every
    store object (one per process and fork, in practice) has its
    :class:`~percolator._presence.Presence` in ``<file>-writers`` while it is open, and
    takes turns only while another one has too."""

    def __init__(self, path: str) -> None:
        self.generation = _forks.generation
        self.turn_fd = self.fd = -1
        self._map: mmap.mmap | None = None
        try:
            self.turn_fd = os.open(path + WRITE_LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
            self.fd = os.open(path + WRITERS_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(self.fd).st_size < MARK_SIZE:
                os.ftruncate(self.fd, MARK_SIZE)
            self._map = mmap.mmap(self.fd, MARK_SIZE)
        except OSError:
            pass  # others assumed present (a Presence without a map)
        self.presence = Presence(self.fd, self._map, 0)
        self.others_present = self.presence.others_present

    def close(self) -> None:
        self.presence.forget()
        if self._map is not None:
            self._map.close()
            self._map = None
        for fd in (self.fd, self.turn_fd):
            if fd >= 0:
                os.close(fd)  # drops the presence lock (unless a forked child shares it)
        self.fd = self.turn_fd = -1


class _WriteStep:
    """One write transaction of a thread (see :meth:`SqliteStore._write`): this
    process's writers queue on the store's lock, the processes' on the writers' turn,
    then ``BEGIN IMMEDIATE``; COMMIT at a clean exit, ROLLBACK at an exception. Inside
    an :meth:`SqliteStore.atomically` block of the thread it is that block's
    transaction. (A class, not a generator context manager: it is on every write's
    path, and costs a third as much.)"""

    __slots__ = ("atomic", "db", "nested", "store", "turn")

    def __init__(self, store: SqliteStore, *, atomic: bool = False) -> None:
        self.store = store
        self.atomic = atomic

    def __enter__(self) -> sqlite3.Connection:
        store = self.store
        db = self.db = store._db()
        local = store._local
        self.nested = getattr(local, "atomic", False)
        if self.nested:
            return db  # part of the enclosing atomically() transaction
        store._write_lock.acquire()
        try:
            self.turn = store._take_turn()
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise StoreUnavailable(
                    f"sqlite store {store.url}: cannot begin a write: {e}"
                ) from e
        except BaseException:
            self._release()
            raise
        if self.atomic:
            local.atomic = True
        return db

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if self.nested:
            return
        db = self.db
        try:
            if self.atomic:
                self.store._local.atomic = False
            if exc_type is None:
                db.execute("COMMIT")
            elif db.in_transaction:
                db.execute("ROLLBACK")
        finally:
            self._release()

    def _release(self) -> None:
        turn = getattr(self, "turn", -1)
        if turn >= 0:
            fcntl.flock(turn, fcntl.LOCK_UN)
        self.store._write_lock.release()


class _Connection(sqlite3.Connection):
    """A connection that can be held weakly (``sqlite3.Connection`` itself cannot)."""


class SqliteStore:
    """The store contract on one SQLite file (see the module docstring)."""

    atomic_row_cas = True
    capabilities: frozenset[Capability[Any]] = frozenset({
        ATOMICALLY, CHECK_AND_SET_MANY, DELETE_IF, EMBEDDED_FILE, VACUUM, PUT_ROW,
        NEWEST_OF_ROW, SINGLE_WRITER,  # one writer at a time: workers default to one scanner thread
    })

    def __init__(self, path: str, *, busy_timeout: float = 60.0) -> None:
        self.path = path
        self.url = f"sqlite://{path}"
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._families: dict[str, dict[str, int]] = {}
        self._sql_cache: dict[tuple[Any, ...], str] = {}
        self._newest_plans: dict[tuple[Any, ...], tuple[str, list[str]]] = {}
        self._row_plans: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}
        self._cell_plans: dict[tuple[str, str], str] = {}
        self._untagged_indexed: set[tuple[str, str, bytes]] = set()
        self._closed = False
        # Weakly held: a thread's connection lives in its thread-local slot and closes
        # when the thread ends; close() closes those of threads still running. (A list
        # kept every connection of every thread that ever read, with its descriptors.)
        self._all_connections: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._conn_lock = threading.Lock()
        # SQLite takes one writer at a time anyway; queueing this process's writers here
        # keeps them out of SQLite's busy handler, which sleeps in millisecond steps.
        self._write_lock = threading.Lock()
        self._turn: _Writers | None = None  # the writers' turn and presence, per fork
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            raise StoreUnavailable(
                f"cannot open sqlite store {self.url}: directory {directory!r} does not exist "
                f"(the file is created, its directory is not: mkdir -p {directory})"
            )
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            has_catalog = db.execute(
                "SELECT 1 FROM sqlite_master WHERE name = ?", (_CATALOG,)
            ).fetchone()
            if has_catalog and version != _FORMAT:
                raise StoreUnavailable(
                    f"sqlite store {self.url} was written by an older percolator (file format "
                    f"{version}, this version reads {_FORMAT}); reload it into a new file"
                )
            if not has_catalog:
                db.execute(
                    f"CREATE TABLE {_CATALOG} (name TEXT PRIMARY KEY, families TEXT NOT NULL)"
                )
                db.execute(f"PRAGMA user_version = {_FORMAT}")

    # --- connections ------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        # SQLite connections must not cross fork(): a child opens its own.
        if db is not None and self._local.generation == _forks.generation:
            return db
        if self._closed:
            raise StoreUnavailable(f"sqlite store {self.url} is closed")
        try:
            db = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=512,
                factory=_Connection,
            )
            self._use_wal(db)
            db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot open sqlite store {self.url}: {e}") from e
        self._local.db = db
        self._local.generation = _forks.generation
        with self._conn_lock:
            self._all_connections.add(db)
        return db

    def _use_wal(self, db: sqlite3.Connection) -> None:
        """Switch a new file to WAL. Two processes opening a new file at once: the one
        that does not make the switch may get "database is locked" at once (SQLite's
        busy handler does not cover it), so it tries again until busy_timeout."""
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def atomically(self) -> AbstractContextManager[None]:
        """Make every call of this thread inside the block one SQLite write transaction:
        all of it or none of it, with no other writer in between (an optional
        capability: the one-phase commit of :mod:`percolator._commit` uses it)."""
        return _WriteStep(self, atomic=True)  # type: ignore[return-value]  # enters as db

    def _write(self) -> _WriteStep:
        """``with self._write() as db``: one write transaction, or the enclosing
        :meth:`atomically` one."""
        return _WriteStep(self)

    def _error(self, table: str, e: sqlite3.Error) -> Exception:
        if "no such table" in str(e):
            self._families.pop(table, None)
            return UnknownTableError(table)
        return StoreUnavailable(f"sqlite store {self.url}: {e}")

    def _table_families(self, table: str) -> dict[str, int]:
        families = self._families.get(table)
        if families is None:
            row = self._db().execute(
                f"SELECT families FROM {_CATALOG} WHERE name = ?", (table,)
            ).fetchone()
            if row is None:
                raise UnknownTableError(table)
            families = {}
            for item in row[0].split(","):
                name, _, versions = item.partition("=")
                families[name] = int(versions)
            self._families[table] = families
        return families

    def _family(self, table: str, family: str) -> str:
        if family not in self._table_families(table):
            raise InvalidArgument(f"table {table!r} has no column family {family!r}")
        return _sql_name(table, family)

    # --- tables -----------------------------------------------------------------

    def create_table(self, table: str, families: Mapping[str, int]) -> None:
        if _metrics._enabled:
            next(REQUESTS.create_table)
        spec = ",".join(f"{name}={versions}" for name, versions in sorted(families.items()))
        with self._write() as db:
            existing = db.execute(
                f"SELECT families FROM {_CATALOG} WHERE name = ?", (table,)
            ).fetchone()
            if existing is not None:
                if existing[0] != spec:
                    raise InvalidArgument(
                        f"table {table!r} exists with families {existing[0]!r}, not {spec!r}"
                    )
                return
            for family, versions in families.items():
                key = "row, qual" if versions == 1 else "row, qual, ts DESC"
                db.execute(
                    f"CREATE TABLE IF NOT EXISTS {_sql_name(table, family)} "
                    "(row BLOB NOT NULL, qual TEXT NOT NULL, ts INTEGER NOT NULL, "
                    f"value BLOB NOT NULL, PRIMARY KEY ({key})) WITHOUT ROWID"
                )
            db.execute(f"INSERT INTO {_CATALOG} VALUES (?, ?)", (table, spec))
        self._forget(table)

    def drop_table(self, table: str) -> None:
        if _metrics._enabled:
            next(REQUESTS.drop_table)
        with self._write() as db:
            row = db.execute(
                f"SELECT families FROM {_CATALOG} WHERE name = ?", (table,)
            ).fetchone()
            if row is None:
                return
            for item in row[0].split(","):
                db.execute(f"DROP TABLE IF EXISTS {_sql_name(table, item.partition('=')[0])}")
            db.execute(f"DELETE FROM {_CATALOG} WHERE name = ?", (table,))
        self._forget(table)

    def _forget(self, table: str) -> None:
        """Drop what this object cached about *table* (created or dropped)."""
        self._families.pop(table, None)
        self._sql_cache.clear()
        self._newest_plans.clear()
        self._row_plans.clear()
        self._cell_plans.clear()
        self._untagged_indexed = {k for k in self._untagged_indexed if k[0] != table}

    def list_tables(self) -> list[str]:
        if _metrics._enabled:
            next(REQUESTS.list_tables)
        rows = self._db().execute(f"SELECT name FROM {_CATALOG} ORDER BY name").fetchall()
        return [r[0] for r in rows]

    # --- reads ------------------------------------------------------------------

    def _read_sql(self, table: str, read: Read) -> str:
        """The statement of one read of one row; parameters from :meth:`_read_params`."""
        name = self._family(table, read.family)
        tag = read.family.replace("'", "''")
        if read.qualifiers is not None:
            return " UNION ALL ".join(
                f"SELECT * FROM (SELECT row, '{tag}' AS fam, qual, ts, value FROM {name} "
                "WHERE row = ? AND qual = ? AND ts BETWEEN ? AND ? ORDER BY ts DESC LIMIT ?)"
                for _ in read.qualifiers
            )
        if read.versions is None:
            return (
                f"SELECT row, '{tag}' AS fam, qual, ts, value FROM {name} "
                "WHERE row = ? AND ts BETWEEN ? AND ?"
            )
        return (
            f"SELECT row, fam, qual, ts, value FROM (SELECT row, '{tag}' AS fam, qual, ts, value, "
            "row_number() OVER (PARTITION BY qual ORDER BY ts DESC) AS n "
            f"FROM {name} WHERE row = ? AND ts BETWEEN ? AND ?) WHERE n <= ?"
        )

    @staticmethod
    def _read_params(read: Read, params: list[Any], row: bytes) -> None:
        """The parameters of :meth:`_read_sql`'s statement, in the same order."""
        lo, hi = read.min_ts, _MAX_TS if read.max_ts is None else read.max_ts
        limit = -1 if read.versions is None else read.versions
        if read.qualifiers is not None:
            for qual in read.qualifiers:
                params.extend((row, qual, lo, hi, limit))
        elif limit < 0:
            params.extend((row, lo, hi))
        else:
            params.extend((row, lo, hi, limit))

    def read_rows(
        self, table: str, rows: Sequence[bytes], reads: Sequence[Read]
    ) -> dict[bytes, RowCells]:
        if _metrics._enabled:
            next(REQUESTS.read_rows)
        result: dict[bytes, RowCells] = {}
        if not rows or not reads:
            return result
        if len(rows) == 1:
            for read in reads:
                if read.versions != 1 or not read.qualifiers:
                    break
            else:
                return self._read_newest(table, rows[0], reads)
            if (read is reads[-1] and len(reads) > 1 and read.versions is None
                    and read.qualifiers is not None and len(read.qualifiers) == 1
                    and read.skip_tag is None):
                both = self._read_newest_and_versions(table, rows[0], reads)
                if both is not None:
                    return both
        else:
            rows = list(dict.fromkeys(rows))  # a row named twice is read once
        try:
            terms = len(rows) * sum(len(r.qualifiers or "_") for r in reads)
            if terms <= 100:
                shape = (table, len(rows), *[
                    (r.family, r.versions is None) if r.qualifiers is None
                    else (r.family, len(r.qualifiers)) for r in reads
                ])
                sql = self._sql_cache.get(shape)
                if sql is None:
                    sql = " UNION ALL ".join(
                        self._read_sql(table, read) for _ in rows for read in reads
                    )
                    if len(self._sql_cache) > 1000:
                        self._sql_cache.clear()
                    self._sql_cache[shape] = sql
                params: list[Any] = []
                for row in rows:
                    for read in reads:
                        self._read_params(read, params, row)
                found = self._db().execute(sql, params).fetchall()
            else:
                found = self._read_many(table, rows, reads)
        except sqlite3.Error as e:
            raise self._error(table, e) from e
        for row, fam, qual, ts, value in found:
            result.setdefault(row, {}).setdefault(f"{fam}:{qual}", []).append((ts, value))
        for cells in result.values():
            for versions in cells.values():
                if len(versions) > 1:
                    _newest_first(versions)
        if any(check_skip_tag(read) for read in reads):
            for cells in result.values():
                drop_skipped(cells, reads)
            return {row: cells for row, cells in result.items() if cells}
        return result

    def _read_newest(self, table: str, row: bytes, reads: Sequence[Read]) -> dict[bytes, RowCells]:
        """The common read of one row, the newest version of named cells: one statement
        of scalar subqueries, two per cell (its timestamp and value), one result row."""
        params: list[Any]
        if len(reads) == 1:  # most reads (a transaction's get): no loops, no list built
            read = reads[0]
            qualifiers: tuple[str, ...] = read.qualifiers  # type: ignore[assignment]
            if len(qualifiers) == 1 and read.skip_tag is None:  # one cell: one probe
                found = self._newest_cell(table, read.family, row, qualifiers[0], read.min_ts,
                                          _MAX_TS if read.max_ts is None else read.max_ts)
                if found is None:
                    return {}
                return {row: {f"{read.family}:{qualifiers[0]}": [found]}}
            key: tuple[Any, ...] = (table, (read.family, read.qualifiers, read.skip_tag))
            params = [row, read.min_ts, _MAX_TS if read.max_ts is None else read.max_ts,
                      *read.qualifiers]  # type: ignore[misc]  # read_rows sent none without
        else:
            key = (table, *[(r.family, r.qualifiers, r.skip_tag) for r in reads])
            params = _newest_params(row, reads)
        try:
            plan = self._newest_plans.get(key)
            if plan is None:
                plan = self._remember_plan(key, self._plan_newest(table, reads))
            sql, names = plan
            found = self._db().execute(sql, params).fetchone()
        except sqlite3.Error as e:
            raise self._error(table, e) from e
        cells: RowCells = {}
        _newest_cells_into(cells, names, found, 0)
        return {row: cells} if cells else {}

    def newest_of_row(self, table: str, row: bytes, fields: tuple[tuple[str, str], ...],
                      qualifiers: tuple[str, ...]) -> tuple[Any, ...]:
        """Parts of the newest version of some cells of one row, as one flat tuple: for
        each of *fields* (``(family, "ts")`` or ``(family, "value")``), for each of
        *qualifiers*, that part (None where the cell has no version). The one-phase
        commit's conflict read of a row
        (:func:`percolator._one_phase._commit_one_phase`): one prepared statement, a
        scalar subquery (one index probe) per field and qualifier, where
        :meth:`read_rows`' timestamp and value would take two."""
        if _metrics._enabled:
            next(REQUESTS.read_rows)
        key = (table, fields, qualifiers)
        try:
            plan = self._row_plans.get(key)
            if plan is None:
                plan = self._plan_fields(table, fields, qualifiers)
                if len(self._row_plans) > 1000:
                    self._row_plans.clear()
                self._row_plans[key] = plan
            sql, params = plan
            found: tuple[Any, ...] = self._db().execute(sql, (row, *params)).fetchone()
        except sqlite3.Error as e:
            raise self._error(table, e) from e
        return found

    def _plan_fields(self, table: str, fields: tuple[tuple[str, str], ...],
                     qualifiers: tuple[str, ...]) -> tuple[str, tuple[Any, ...]]:
        """:meth:`newest_of_row`'s statement, and its parameters after the row."""
        terms = []
        for family, part in fields:
            if part not in ("ts", "value"):
                raise InvalidArgument(f"a field is (family, 'ts') or (family, 'value'), "
                                      f"got {(family, part)!r}")
            name = self._family(table, family)
            terms += [f"(SELECT {part} FROM {name} WHERE row = ?1 AND qual = ?{2 + q} "
                      "ORDER BY ts DESC LIMIT 1)" for q in range(len(qualifiers))]
        return "SELECT " + ", ".join(terms), qualifiers

    def newest_at(self, table: str, row: bytes, family: str, qualifier: str,
                  max_ts: int) -> tuple[int, bytes] | None:
        """The newest version at or below *max_ts* of one cell, as ``(timestamp,
        value)``, or None: :meth:`read_rows` of one cell, without its objects
        (:class:`~percolator._store.EmbeddedFile`: a transaction's read of a write
        record while no lock can be held)."""
        if _metrics._enabled:
            next(REQUESTS.read_rows)
        return self._newest_cell(table, family, row, qualifier, 0, max_ts)

    def _newest_cell(self, table: str, family: str, row: bytes, qualifier: str,
                     min_ts: int, max_ts: int) -> tuple[int, bytes] | None:
        """One cell's newest version in ``[min_ts, max_ts]``: one index probe, where
        :meth:`_plan_newest`'s two scalar subqueries (timestamp, value) make two."""
        try:
            sql = self._cell_plans.get((table, family))
            if sql is None:
                sql = (f"SELECT ts, value FROM {self._family(table, family)} WHERE row = ? "
                       "AND qual = ? AND ts BETWEEN ? AND ? ORDER BY ts DESC LIMIT 1")
                self._cell_plans[(table, family)] = sql
            found: tuple[int, bytes] | None = self._db().execute(
                sql, (row, qualifier, min_ts, max_ts)).fetchone()
        except sqlite3.Error as e:
            raise self._error(table, e) from e
        return found

    def _read_newest_and_versions(
        self, table: str, row: bytes, reads: Sequence[Read]
    ) -> dict[bytes, RowCells] | None:
        """:meth:`_read_newest` of every read but the last, and every version of the last
        read's one cell, in one statement (one snapshot): an observer run's first read,
        which reads its notification with the cell and the acknowledgement
        (``ObserverRun.get_row_notified``), without the windowed UNION of the general
        path. The statement's first result row holds the newest versions, as
        :meth:`_read_newest`'s does; each further row one version of the last cell.
        None where the last read's family is another's too (the general path then)."""
        newest, every = reads[:-1], reads[-1]
        key = ("versions", table, every.family,
               *[(r.family, r.qualifiers, r.skip_tag) for r in newest])
        params = _newest_params(row, newest)
        params.append(every.min_ts)
        params.append(_MAX_TS if every.max_ts is None else every.max_ts)
        params.extend(every.qualifiers or ())
        try:
            plan = self._newest_plans.get(key)
            if plan is None:
                if any(r.family == every.family for r in newest):
                    return None
                terms, names = self._newest_terms(table, newest)
                first = 2 + 2 * len(newest) + len(names)  # the last read's parameters
                plan = self._remember_plan(key, (
                    f"SELECT 0, {', '.join(terms)} UNION ALL SELECT 1, ts, value"
                    + ", NULL" * (len(terms) - 2)
                    + f" FROM {self._family(table, every.family)} WHERE row = ?1 AND "
                    f"qual = ?{first + 2} AND ts BETWEEN ?{first} AND ?{first + 1}", names))
            sql, names = plan
            found = self._db().execute(sql, params).fetchall()
        except sqlite3.Error as e:
            raise self._error(table, e) from e
        cells: RowCells = {}
        versions: list[tuple[int, bytes]] = []
        for result in found:
            if result[0]:
                versions.append((result[1], result[2]))
                continue
            _newest_cells_into(cells, names, result, 1)
        if versions:
            if len(versions) > 1:
                versions.sort(key=lambda cell: -cell[0])
            assert every.qualifiers is not None
            cells[f"{every.family}:{every.qualifiers[0]}"] = versions
        return {row: cells} if cells else {}

    def _remember_plan(self, key: tuple[Any, ...],
                       plan: tuple[str, list[str]]) -> tuple[str, list[str]]:
        """*plan*, kept for *key* (the cache starts over past 1,000 shapes of read)."""
        if len(self._newest_plans) > 1000:
            self._newest_plans.clear()
        self._newest_plans[key] = plan
        return plan

    def _plan_newest(self, table: str, reads: Sequence[Read]) -> tuple[str, list[str]]:
        """:meth:`_read_newest`'s statement for these families and qualifiers, and the
        cell names of its result pairs. Parameters: the row, each read's bounds, then
        every qualifier."""
        terms, names = self._newest_terms(table, reads)
        return "SELECT " + ", ".join(terms), names

    def _newest_terms(self, table: str, reads: Sequence[Read]) -> tuple[list[str], list[str]]:
        """:meth:`_plan_newest`'s result columns (two scalar subqueries per cell: its
        newest version's timestamp and value), and the cell names of their pairs."""
        terms: list[str] = []
        names: list[str] = []
        for n, read in enumerate(reads):
            name = self._family(table, read.family)
            tag = check_skip_tag(read)
            for qual in read.qualifiers or ():
                q = 2 + 2 * len(reads) + len(names)
                where = (f"FROM {name} WHERE row = ?1 AND qual = ?{q} "
                         f"AND ts BETWEEN ?{2 * n + 2} AND ?{2 * n + 3} ORDER BY ts DESC LIMIT 1")
                if tag is None:
                    terms += (f"(SELECT ts {where})", f"(SELECT value {where})")
                else:  # the newest version, or NULL when it carries the tag
                    skip = f"CASE WHEN substr(value, 1, 1) = x'{tag.hex()}' THEN NULL ELSE"
                    terms += (f"(SELECT {skip} ts END {where})",
                              f"(SELECT {skip} value END {where})")
                names.append(f"{read.family}:{qual}")
        return terms, names

    def _read_many(
        self, table: str, rows: Sequence[bytes], reads: Sequence[Read]
    ) -> list[tuple[Any, ...]]:
        """Many rows: one windowed SELECT per read and chunk of rows, in one read
        transaction so that every row is read from one snapshot."""
        db = self._db()
        found: list[tuple[Any, ...]] = []
        own = not db.in_transaction
        if own:
            db.execute("BEGIN")
        try:
            for start in range(0, len(rows), 400):
                chunk = list(rows[start : start + 400])
                for read in reads:
                    name = self._family(table, read.family)
                    tag = read.family.replace("'", "''")
                    params: list[Any] = list(chunk)
                    qual_sql = ""
                    if read.qualifiers is not None:
                        qual_sql = f" AND qual IN ({','.join('?' * len(read.qualifiers))})"
                        params.extend(read.qualifiers)
                    params.extend((read.min_ts, _MAX_TS if read.max_ts is None else read.max_ts))
                    params.append(-1 if read.versions is None else read.versions)
                    found.extend(db.execute(
                        f"SELECT row, fam, qual, ts, value FROM (SELECT row, '{tag}' AS fam, "
                        "qual, ts, value, row_number() OVER (PARTITION BY row, qual "
                        f"ORDER BY ts DESC) AS n FROM {name} WHERE row IN "
                        f"({','.join('?' * len(chunk))}){qual_sql} AND ts BETWEEN ? AND ?) "
                        "WHERE ? < 0 OR n <= ?",
                        (*params[:-1], params[-1], params[-1]),
                    ).fetchall())
        finally:
            if own:
                db.execute("COMMIT")
        return found

    def scan(
        self,
        table: str,
        start: bytes | None,
        stop: bytes | None,
        reads: Sequence[Read],
        *,
        batch_size: int = 1000,
    ) -> Iterator[tuple[bytes, RowCells]]:
        if _metrics._enabled:
            next(REQUESTS.scan)
        check_scan(start, stop, batch_size)
        skips = [check_skip_tag(read) for read in reads]
        if not reads:
            return iter(())
        return self._scan(table, start, stop, reads, skips, batch_size)

    def _scan(
        self,
        table: str,
        start: bytes | None,
        stop: bytes | None,
        reads: Sequence[Read],
        skips: list[bytes | None],
        batch_size: int,
    ) -> Iterator[tuple[bytes, RowCells]]:
        names = [self._family(table, read.family) for read in reads]
        # In a family of one version, skipping tagged versions is a WHERE term: with
        # the family's partial index (see any_untagged), a scan for held locks costs
        # the held locks instead of every lock cell. Elsewhere it is applied below.
        where_untagged = [""] * len(reads)
        for i, (read, skip) in enumerate(zip(reads, skips, strict=True)):
            if skip is not None and self._table_families(table)[read.family] == 1:
                where_untagged[i] = f" AND {self._untagged(table, read.family, skip)}"
        by_name: dict[str, set[str]] = {}
        for name, where in zip(names, where_untagged, strict=True):
            by_name.setdefault(name, set()).add(where)
        lo: bytes = start or b""
        inclusive = True
        while True:
            bound = ">=" if inclusive else ">"
            stop_sql = "" if stop is None else " AND row < ?"
            stop_params: tuple[bytes, ...] = () if stop is None else (stop,)
            distinct = " UNION ".join(  # a family read both ways: its rows unfiltered
                f"SELECT row FROM {name} WHERE row {bound} ?{stop_sql}"
                + (next(iter(wheres)) if len(wheres) == 1 else "")
                for name, wheres in by_name.items()
            )
            params: list[Any] = []
            for _ in by_name:
                params.extend((lo, *stop_params))
            try:
                db = self._db()
                own = not db.in_transaction
                if own:
                    db.execute("BEGIN")
                try:
                    last = db.execute(
                        f"SELECT row FROM ({distinct}) ORDER BY row LIMIT 1 OFFSET ?",
                        (*params, batch_size - 1),
                    ).fetchone()
                    hi_sql, hi_params = ("", ()) if last is None else (" AND row <= ?", (last[0],))
                    subs: list[str] = []
                    cell_params: list[Any] = []
                    for read, name, where in zip(reads, names, where_untagged, strict=True):
                        tag = read.family.replace("'", "''")
                        qual_sql = ""
                        if read.qualifiers is not None:
                            qual_sql = f" AND qual IN ({','.join('?' * len(read.qualifiers))})"
                        subs.append(
                            f"SELECT row, '{tag}' AS fam, qual, ts, value, {len(subs)} AS r "
                            f"FROM {name} WHERE row {bound} ?{stop_sql}{hi_sql}{qual_sql} "
                            f"AND ts BETWEEN ? AND ?{where}"
                        )
                        cell_params.extend((lo, *stop_params, *hi_params))
                        cell_params.extend(read.qualifiers or ())
                        cell_params.extend(
                            (read.min_ts, _MAX_TS if read.max_ts is None else read.max_ts)
                        )
                    cells = db.execute(
                        " UNION ALL ".join(subs) + " ORDER BY row, r, qual, ts DESC", cell_params
                    ).fetchall()
                finally:
                    if own:
                        db.execute("COMMIT")
            except sqlite3.Error as e:
                raise self._error(table, e) from e
            current: bytes | None = None
            row_cells: RowCells = {}
            counts: dict[tuple[int, str], int] = {}
            for row, fam, qual, ts, value, r in cells:
                if row != current:
                    if current is not None and row_cells:
                        yield current, row_cells
                    current, row_cells, counts = row, {}, {}
                column = f"{fam}:{qual}"
                limit = reads[r].versions
                counted = (r, column)  # each read's own versions of the column
                seen = counts.get(counted, 0)
                if limit is not None and seen >= limit:
                    continue
                counts[counted] = seen + 1
                if skips[r] is not None and value[:1] == skips[r]:
                    continue
                had = row_cells.get(column)
                if had is None:
                    row_cells[column] = [(ts, value)]
                else:
                    had.append((ts, value))
                    if had[-2][0] <= ts:  # another read's version of the column
                        _newest_first(had)
            if current is not None and row_cells:
                yield current, row_cells
            if last is None:
                return
            lo, inclusive = last[0], False

    def any_untagged(self, family: str, tag: bytes) -> bool:
        """Whether a cell of *family*, in any table that has it, holds a value that
        does not start with the one-byte *tag* (the lock census asks it of the lock
        family, whose FREE values start with a tag). One look into a partial index of
        those cells per table, built the first time a table is asked."""
        if _metrics._enabled:
            next(REQUESTS.any_untagged)
        if not isinstance(tag, bytes) or len(tag) != 1:
            raise InvalidArgument(f"tag must be one byte, got {tag!r}")
        try:
            db = self._db()
            names = [n for (n,) in db.execute(f"SELECT name FROM {_CATALOG}").fetchall()]
        except sqlite3.Error as e:
            raise self._error(_CATALOG, e) from e
        for name in names:
            try:
                if family not in self._table_families(name):
                    continue
                untagged = self._untagged(name, family, tag)
                found = db.execute(
                    f"SELECT 1 FROM {_sql_name(name, family)} WHERE {untagged} LIMIT 1"
                ).fetchone()
            except UnknownTableError:
                continue  # dropped meanwhile
            except sqlite3.Error as e:
                error = self._error(name, e)
                if isinstance(error, UnknownTableError):
                    continue
                raise error from e
            if found is not None:
                return True
        return False

    def _untagged(self, table: str, family: str, tag: bytes) -> str:
        """The WHERE term "value does not start with *tag*", with a partial index of
        the cells of *family* it selects (created once per table, for every process):
        a question in those terms costs those cells (held locks), not the table. The
        tag is a literal, not a parameter: only then can the planner use the index."""
        untagged = f"substr(value, 1, 1) IS NOT x'{tag.hex()}'"
        key = (table, family, tag)
        if key not in self._untagged_indexed:
            index = _sql_name(table, f"{family}#untagged-{tag.hex()}")
            try:
                with self._write() as db:
                    db.execute(f"CREATE INDEX IF NOT EXISTS {index} "
                               f"ON {_sql_name(table, family)} (row) WHERE {untagged}")
            except sqlite3.Error as e:
                raise self._error(table, e) from e
            self._untagged_indexed.add(key)
        return untagged

    # --- writes -----------------------------------------------------------------

    def _put_sql(self, table: str, family: str) -> str:
        """The statement of one put; a family of one version keeps the newest, like HBase."""
        key = ("put", table, family)
        sql = self._sql_cache.get(key)
        if sql is None:
            name = self._family(table, family)
            if self._table_families(table)[family] == 1:
                sql = (
                    f"INSERT INTO {name} VALUES (?, ?, ?, ?) ON CONFLICT (row, qual) DO UPDATE "
                    "SET ts = excluded.ts, value = excluded.value WHERE excluded.ts >= ts"
                )
            else:
                sql = f"INSERT OR REPLACE INTO {name} VALUES (?, ?, ?, ?)"
            self._sql_cache[key] = sql
        return sql

    def _put(
        self, db: sqlite3.Connection, table: str, row: bytes, puts: Sequence[tuple[str, int, bytes]]
    ) -> None:
        # One INSERT per put, in order: a row's puts are few (a commit's record and
        # lock), and grouping them by family cost more than the statements it spares.
        for column, ts, value in puts:
            if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                raise _bad_timestamp(column, ts)
            family, qual = split_column(column)
            db.execute(self._put_sql(table, family), (row, qual, ts, value))

    def _flush_puts(
        self,
        db: sqlite3.Connection,
        table: str,
        by_family: dict[str, list[tuple[bytes, str, int, bytes]]],
    ) -> None:
        for family, cells in by_family.items():
            sql = self._put_sql(table, family)
            if len(cells) == 1:
                db.execute(sql, cells[0])
            else:
                db.executemany(sql, cells)
        by_family.clear()

    def mutate_rows(self, table: str, mutations: Sequence[Mutation]) -> None:
        if _metrics._enabled:
            next(REQUESTS.mutate_rows)
        if not mutations:
            return
        try:
            with self._write() as db:
                # Each family is its own SQL table, so only the order of one family's
                # puts and deletes matters: runs of one kind are batched per family
                # (a group commit's puts and notification deletes: a few statements
                # for the whole group instead of some per row).
                puts: dict[str, list[tuple[bytes, str, int, bytes]]] = {}
                deletes: dict[str, list[tuple[bytes, str, int]]] = {}
                for mutation in mutations:
                    for column, max_ts in mutation.deletes:
                        family, qual = split_column(column)
                        if family in puts:
                            self._flush_puts(db, table, {family: puts.pop(family)})
                        deletes.setdefault(family, []).append((mutation.row, qual, max_ts))
                    if deletes:
                        for column, _, _ in mutation.puts:
                            family = split_column(column)[0]
                            if family in deletes:
                                self._flush_deletes(db, table, {family: deletes.pop(family)})
                    _collect_puts(puts, mutation.row, mutation.puts)
                if deletes:
                    self._flush_deletes(db, table, deletes)
                self._flush_puts(db, table, puts)
        except sqlite3.Error as e:
            raise self._error(table, e) from e

    def put_row(self, table: str, row: bytes, puts: Sequence[tuple[str, int, bytes]]) -> None:
        """:meth:`mutate_rows` of one row's puts, in fewer steps: inside an
        :meth:`atomically` block of this thread (the one-phase commit's writes) straight
        on its transaction, else in a write transaction of its own."""
        if _metrics._enabled:
            next(REQUESTS.mutate_rows)
        local = self._local
        try:
            if getattr(local, "atomic", False):
                self._put(local.db, table, row, puts)
            else:
                with self._write() as db:
                    self._put(db, table, row, puts)
        except sqlite3.Error as e:
            raise self._error(table, e) from e

    def _flush_deletes(
        self, db: sqlite3.Connection, table: str, by_family: dict[str, list[tuple[bytes, str, int]]]
    ) -> None:
        for family, cells in by_family.items():
            db.executemany(f"DELETE FROM {self._family(table, family)} "
                           "WHERE row = ? AND qual = ? AND ts <= ?", cells)
        by_family.clear()

    def check_and_set(
        self,
        table: str,
        row: bytes,
        column: str,
        expected: bytes | None,
        new: bytes,
        puts: Sequence[tuple[str, int, bytes]] = (),
    ) -> bool:
        if _metrics._enabled:
            next(REQUESTS.check_and_set)
        family, qual = split_column(column)
        try:
            name = self._family(table, family)
            # One conditional statement decides; a family of single versions has at most
            # one row per cell, so "latest value" is "the value".
            if expected is None:
                sql = (
                    f"INSERT INTO {name} SELECT ?, ?, 0, ? WHERE NOT EXISTS "
                    f"(SELECT 1 FROM {name} WHERE row = ? AND qual = ?)"
                )
                params: tuple[Any, ...] = (row, qual, new, row, qual)
            else:
                sql = f"UPDATE {name} SET value = ? WHERE row = ? AND qual = ? AND value = ?"
                params = (new, row, qual, expected)
            with self._write() as db:
                if db.execute(sql, params).rowcount != 1:
                    return False
                self._put(db, table, row, puts)
                return True
        except sqlite3.Error as e:
            raise self._error(table, e) from e

    def vacuum(self) -> None:
        """Rebuild the file without its free pages (SQLite ``VACUUM``) and truncate the
        write-ahead log: returns space to the file system. Blocks every writer while
        it runs; without it, freed pages are reused by later writes."""
        try:
            with self._write_lock:
                db = self._db()
                db.execute("VACUUM")
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as e:
            raise StoreUnavailable(f"sqlite store {self.url}: VACUUM failed: {e}") from e

    def delete_if(self, table: str, row: bytes, column: str, expected: bytes) -> bool:
        """Remove the single-version cell ``(row, column)`` if its value is *expected*
        (:class:`percolator._store.ConditionalDelete`): one conditional statement."""
        family, qual = split_column(column)
        try:
            name = self._family(table, family)
            with self._write() as db:
                return bool(db.execute(
                    f"DELETE FROM {name} WHERE row = ? AND qual = ? AND value = ?",
                    (row, qual, expected),
                ).rowcount == 1)
        except sqlite3.Error as e:
            raise self._error(table, e) from e

    def check_and_set_many(
        self,
        table: str,
        items: Sequence[
            tuple[bytes, str, bytes | None, bytes, Sequence[tuple[str, int, bytes]]]
        ],
    ) -> list[bool]:
        """Many :meth:`check_and_set` calls in one write transaction (an optional
        capability used by bulk writers, see :mod:`percolator._bulk`).

        Each item is ``(row, column, expected, new, puts)`` and is decided in order,
        as if the calls ran one after another: an item sees the values set by the
        items before it. Returns one bool per item. The puts of an item are applied
        only when its compare-and-set succeeds, atomically with it; they must not
        write a cell that the batch compares.

        The common case, every compare-and-set wins, is written without reading: one
        INSERT per 200 cells compared with "absent" (``ON CONFLICT DO NOTHING``), one
        ``executemany`` of UPDATEs for the others, then the puts; the number of rows
        changed tells that all of them won. Otherwise the attempt is undone (a
        savepoint) and the batch is decided item by item from the current values, read
        with one SELECT per family and 400 cells. Bulk writers of one file, in any
        process, take turns (:meth:`_take_turn`).
        """
        if _metrics._enabled:
            next(REQUESTS.check_and_set_many)
        if not items:
            return []
        try:
            plan = self._cas_plan(table, items)  # before taking the file: others write meanwhile
            with self._write() as db:
                if plan is not None and self._cas_all(db, table, plan, len(items)):
                    return [True] * len(items)
                return self._cas_each(db, table, items)
        except sqlite3.Error as e:
            raise self._error(table, e) from e

    def _take_turn(self) -> int:
        """Queue the writers of this file (from every process; this process's threads
        already queue on ``_write_lock``) on an advisory lock next to it, and return its
        descriptor, held (-1: nothing held). A waiter takes its turn within
        microseconds of the previous writer's commit, instead of at the next step of
        SQLite's busy handler, which sleeps up to 100 ms at a time while the other
        writer commits again (two worker processes drained no faster than one). Only an
        order: SQLite's own locking keeps the writes correct, and a writer that waited
        ``busy_timeout`` goes on unqueued (to SQLite's busy handler). A store that no
        other one writes (:class:`_Writers`) takes no turn: there is nobody to queue
        behind, and the lock would cost two system calls a write."""
        turn = self._turn
        if turn is None or turn.generation != _forks.generation:
            turn = self._turn = _Writers(self.path)  # a forked child must not share them
        fd = turn.turn_fd
        if fd < 0 or not turn.others_present():
            return -1
        deadline = spin_until = None
        pause = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                now = time.monotonic()
                if deadline is None:
                    deadline, spin_until = now + self._busy_timeout, now + 0.0003
                if now > deadline:
                    return -1
                # A write lasts about 0.1 ms: yield while one may be ending, then
                # sleep in growing steps (a sleep costs at least ~0.06 ms here).
                if spin_until is not None and now > spin_until:
                    pause = min(pause * 2 or 0.00005, 0.0005)
                time.sleep(pause)

    def _cas_plan(
        self,
        table: str,
        items: Sequence[
            tuple[bytes, str, bytes | None, bytes, Sequence[tuple[str, int, bytes]]]
        ],
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]], dict[str, list[Any]]] | None:
        """The statements' parameters that write every item of :meth:`check_and_set_many`
        as if each one won: cells to insert where absent and to update where equal,
        by family, and the puts; None when the items need the careful path (a compared
        family of several versions, or a cell both inserted and updated)."""
        families = self._table_families(table)
        # Byte strings go to SQLite as bytearray: Python's sqlite3 binds a bytearray
        # directly but looks for an adapter for each bytes parameter first (about
        # 0.6 us). Row keys and compared values repeat: each is converted once.
        blobs: dict[bytes, bytearray] = {}
        inserts: dict[str, list[Any]] = {}  # family -> row, qual, new, row, qual, new...
        updates: dict[str, list[Any]] = {}  # family -> (new, row, qual, expected)...
        puts: dict[str, list[Any]] = {}  # family -> (row, qual, ts, value) as _flush_puts takes
        compared: dict[str, tuple[str, list[Any], list[Any]]] = {}  # column -> qual, lists
        written: dict[str, tuple[list[Any], str]] = {}  # put column -> list, qual
        row_seen: bytes | None = None  # items of one row, and their values, often follow
        new_seen: bytes | None = None  # one another: the previous conversion is reused
        ts_seen: int | None = None
        key = value = bytearray()
        for row, column, expected, new, item_puts in items:
            if row is not row_seen:
                key = blobs.get(row) or blobs.setdefault(row, bytearray(row))
                row_seen = row
            if new is not new_seen:
                value = blobs.get(new) or blobs.setdefault(new, bytearray(new))
                new_seen = new
            slot = compared.get(column)
            if slot is None:
                family, qual = split_column(column)
                self._family(table, family)
                if families[family] != 1:
                    return None
                slot = compared[column] = (
                    qual, inserts.setdefault(family, []), updates.setdefault(family, [])
                )
            if expected is None:
                slot[1].extend((key, slot[0], value))
            else:
                old = blobs.get(expected) or blobs.setdefault(expected, bytearray(expected))
                slot[2].append((value, key, slot[0], old))
            for put_column, ts, put_value in item_puts:
                if ts is not ts_seen:
                    if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                        raise InvalidArgument(f"timestamps must be integers >= 0, got {ts!r} "
                                              f"for column {put_column!r}")
                    ts_seen = ts
                target = written.get(put_column)
                if target is None:
                    family, qual = split_column(put_column)
                    target = written[put_column] = (puts.setdefault(family, []), qual)
                target[0].append((key, target[1], ts, bytearray(put_value)))
        if any(inserts[family] and updates[family] for family in inserts):
            absent = {(row, column) for row, column, expected, _, _ in items if expected is None}
            if any((row, column) in absent for row, column, expected, _, _ in items
                   if expected is not None):
                return None  # a cell both inserted and updated: decide one by one
        return inserts, updates, puts

    def _cas_all(
        self,
        db: sqlite3.Connection,
        table: str,
        plan: tuple[dict[str, list[Any]], dict[str, list[Any]], dict[str, list[Any]]],
        count: int,
    ) -> bool:
        """Write *plan* (:meth:`_cas_plan`) if all its *count* compare-and-sets win, and
        return whether they did; otherwise change nothing."""
        inserts, updates, puts = plan
        db.execute("SAVEPOINT check_and_set_many")
        changed = 0
        for family, flat in inserts.items():
            name = self._family(table, family)
            if flat:
                changed += self._execute_rows(
                    db, f"INSERT INTO {name} VALUES ", "(?,?,0,?)", 3, flat,
                    " ON CONFLICT DO NOTHING",
                )
            if updates[family]:
                changed += db.executemany(
                    f"UPDATE {name} SET value = ? WHERE row = ? AND qual = ? AND value = ?",
                    updates[family],
                ).rowcount
        if changed != count:
            db.execute("ROLLBACK TO check_and_set_many")
            db.execute("RELEASE check_and_set_many")
            return False
        self._flush_puts(db, table, puts)
        db.execute("RELEASE check_and_set_many")
        return True

    def _cas_each(
        self,
        db: sqlite3.Connection,
        table: str,
        items: Sequence[
            tuple[bytes, str, bytes | None, bytes, Sequence[tuple[str, int, bytes]]]
        ],
    ) -> list[bool]:
        """:meth:`check_and_set_many` item by item, from the current values."""
        families = self._table_families(table)
        split: dict[str, tuple[str, str]] = {}
        current: dict[tuple[str, bytes, str], bytes | None] = {}
        wanted: dict[str, list[tuple[bytes, str]]] = {}
        for row, column, _, _, _ in items:
            family, qual = split.get(column) or split.setdefault(
                column, split_column(column)
            )
            key = (family, row, qual)
            if key not in current:
                current[key] = None
                wanted.setdefault(family, []).append((row, qual))
        for family, keys in wanted.items():
            name = self._family(table, family)
            for i in range(0, len(keys), 400):
                chunk = keys[i : i + 400]
                values = ",".join("(?,?)" for _ in chunk)
                for row, qual, value in db.execute(
                    f"SELECT t.row, t.qual, t.value FROM {name} AS t JOIN (VALUES {values}) "
                    "AS v ON t.row = v.column1 AND t.qual = v.column2 ORDER BY t.ts",
                    [p for key in chunk for p in key],
                ):
                    current[(family, row, qual)] = value  # the newest (largest ts) last
        results: list[bool] = []
        changed: dict[tuple[str, bytes, str], bytes] = {}
        puts: dict[str, list[tuple[bytes, str, int, bytes]]] = {}
        for row, column, expected, new, item_puts in items:
            family, qual = split[column]
            key = (family, row, qual)
            if current[key] != expected:
                results.append(False)
                continue
            current[key] = changed[key] = new
            _collect_puts(puts, row, item_puts)
            results.append(True)
        sets: dict[str, list[tuple[bytes, str, bytes]]] = {}
        for (family, row, qual), value in changed.items():
            sets.setdefault(family, []).append((row, qual, value))
        for family, cells in sets.items():
            name = self._family(table, family)
            if families[family] == 1:
                db.executemany(
                    f"INSERT INTO {name} VALUES (?, ?, 0, ?) "
                    "ON CONFLICT (row, qual) DO UPDATE SET value = excluded.value",
                    cells,
                )
            else:  # every version is replaced by the new value at timestamp 0
                db.executemany(
                    f"DELETE FROM {name} WHERE row = ? AND qual = ?", [c[:2] for c in cells]
                )
                db.executemany(f"INSERT INTO {name} VALUES (?, ?, 0, ?)", cells)
        self._flush_puts(db, table, puts)
        return results

    @staticmethod
    def _execute_rows(
        db: sqlite3.Connection, head: str, row_sql: str, width: int, flat: list[Any],
        tail: str = "",
    ) -> int:
        """Run ``head`` + rows of ``VALUES`` + ``tail`` over *flat* (*width* parameters
        a row), 200 rows a statement; returns the number of rows changed."""
        rows = len(flat) // width
        changed = 0
        for start in range(0, rows, 200):
            count = min(200, rows - start)
            changed += db.execute(
                head + ",".join([row_sql] * count) + tail,
                flat[start * width : (start + count) * width],
            ).rowcount
        return changed

    def close(self) -> None:
        self._closed = True
        with self._conn_lock:
            connections = list(self._all_connections)
            self._all_connections = weakref.WeakSet()
        for db in connections:
            try:
                db.close()
            except sqlite3.Error:
                pass
        turn, self._turn = self._turn, None
        if turn is not None:
            turn.close()
