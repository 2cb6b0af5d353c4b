"""The HBase backend: the store contract over HBase's Thrift1 server, through happybase.

``open_hbase_store("hbase://host:9090?namespace=NS&table_prefix=P&pool_size=8&timeout=30000")``
(every query option may also be passed as a keyword argument):

* ``namespace``: tables are named ``NS:table``. The namespace must already exist
  (``create_namespace 'NS'`` in the HBase shell); Thrift1 cannot create it.
* ``table_prefix``: tables are named ``P_table`` (tests use it for isolation).
* ``pool_size``: connections in the ``happybase.ConnectionPool`` shared by all threads
  (default 8); ``timeout``: socket timeout in milliseconds, also for connecting
  (default 30000).

Tables get one HBase family per physical family with ``VERSIONS`` set from
:meth:`HBaseStore.create_table` (0, "keep all", becomes ``2**31 - 1``). Logical
timestamps are used directly as HBase cell timestamps.

What Thrift1 can express, and therefore how many Thrift calls each method makes:

* :meth:`~HBaseStore.read_rows`: one ``getRowsWithColumns[Ts]`` call for all rows and
  all Reads (a *wide call*: the newest cell of each selected column at or below the
  largest ``max_ts``, one atomic ``Get`` per row). A Read with ``versions=1`` is
  answered from it whenever that newest cell is within the Read's own range, which is
  always the case for ``max_ts=None``. Otherwise: one more ``getRowsWithColumnsTs`` per
  distinct ``max_ts`` among the ``versions=1`` Reads that saw a newer cell, and one
  ``getVer``/``getVerTs`` per (row, column) of a multi-version Read that may have more
  than one version in range. Thrift1 ``Get``s return one version per column, and
  ``getVerTs`` one column of one row. A transactional get (lock latest, write and data
  records at or below ``start_ts``, one version each) costs **1 call**, or 2 when a
  newer write or data record exists. Reads with ``max_ts=None, versions=1`` (the lock)
  are always served by the first call; every other Read by that same atomic row read
  or by a later call, never an earlier one (DESIGN.md §5: lock before write records).
* :meth:`~HBaseStore.mutate_rows`: ``Mutation`` has no timestamp in Thrift1 and
  ``mutateRowsTs`` takes one timestamp per call, so one ``mutateRowsTs`` per distinct
  delete timestamp (``isDelete``: every version at or below it), then one per distinct
  put timestamp, each covering all rows. **A row mutation spanning several timestamps,
  or mixing deletes and puts, is therefore applied in several steps on this backend**
  (deletes first), not atomically.
* :meth:`~HBaseStore.check_and_set`: ``checkAndPut`` (1 call), preceded by the writes of
  *puts* (``atomic_row_cas`` is False: ``checkAndPut`` cannot write other cells or
  explicit timestamps). HBase writes the new cell at server time
  (``max(now_ms, timestamp of the checked cell)``), so lock cells carry wall-clock
  timestamps, and HBase treats an empty expected value as "absent or empty": empty
  values are refused for *expected* and *new*.
* :meth:`~HBaseStore.increment` (optional capability, :mod:`percolator._store`):
  ``atomicIncrement`` (1 call); HBase writes the sum at ``max(now_ms, timestamp of the
  previous cell + 1)``. There is no ``set_unless``: ``checkAndPut`` compares one value.
* :meth:`~HBaseStore.scan`: ``scannerOpenWithScan`` + one ``scannerGetList`` per
  *batch_size* rows (+1 at the end) + ``scannerClose``. The scanner reads the newest
  version of each selected column at or below the largest ``max_ts`` and plays the
  part of the wide call above for each batch; Reads it cannot answer cost the same
  extra calls as in :meth:`~HBaseStore.read_rows`.
* :meth:`~HBaseStore.create_table`: ``createTable`` (plus ``getColumnDescriptors`` if
  it already exists); :meth:`~HBaseStore.drop_table`: ``isTableEnabled``,
  ``disableTable``, ``deleteTable``; :meth:`~HBaseStore.list_tables`: ``getTableNames``.

Deletes are HBase tombstones: until a major compaction they also hide versions put
*later* at or below their timestamp ("Deletes mask Puts" in the HBase reference guide).
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from percolator._errors import InvalidArgument, StoreUnavailable, UnknownTableError
from percolator._store import (
    Cell,
    Mutation,
    Read,
    RowCells,
    Store,
    check_increment_amount,
    check_skip_tag,
    drop_skipped,
)
from percolator.stores._memo import memo_by_reads

try:
    import happybase
    from thriftpy2.thrift import TException
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError("the hbase:// store needs happybase: pip install 'percolator[hbase]'") from _e

__all__ = ["HBaseStore", "open_hbase_store"]

logger = logging.getLogger(__name__)

_hb: Any = sys.modules["Hbase_thrift"]  # loaded by happybase from its Hbase.thrift

DEFAULT_PORT = 9090
DEFAULT_POOL_SIZE = 8
DEFAULT_TIMEOUT_MS = 30_000
MAX_VERSIONS = 2**31 - 1
_LATEST = 2**63 - 1  # HConstants.LATEST_TIMESTAMP
_OPTIONS = ("namespace", "table_prefix", "pool_size", "timeout")
_TABLE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_]+$")

_Latest = dict[bytes, dict[str, Cell]]
"""Newest cell per column per row, as a wide call returns it."""


def _enc(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _dec(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _upper(max_ts: int | None) -> int:
    """Thrift1's exclusive upper bound for an inclusive *max_ts* (None: no bound)."""
    return _LATEST if max_ts is None or max_ts >= _LATEST - 1 else max_ts + 1


def _selects(read: Read, column: str) -> bool:
    family, _, qualifier = column.partition(":")
    return family == read.family and (read.qualifiers is None or qualifier in read.qualifiers)


def _in_range(read: Read, ts: int) -> bool:
    return ts >= read.min_ts and (read.max_ts is None or ts <= read.max_ts)


def _wide_columns(reads: Sequence[Read]) -> list[bytes]:
    """The Thrift column list covering *reads* (a family alone if any Read wants it all).

    HBase's ``Get.addColumn`` after ``addFamily`` narrows the family to that column,
    so a family and its columns are never sent together.
    """
    families: dict[str, set[str] | None] = {}
    for read in reads:
        if read.qualifiers is None:
            families[read.family] = None
        elif read.family not in families:
            families[read.family] = set(read.qualifiers)
        else:
            quals = families[read.family]
            if quals is not None:
                quals.update(read.qualifiers)
    out: list[bytes] = []
    for family, quals in families.items():
        if quals is None:
            out.append(_enc(family))
        else:
            out.extend(_enc(f"{family}:{q}") for q in sorted(quals))
    return out


def _parse_row_results(results: Sequence[Any]) -> _Latest:
    out: _Latest = {}
    for result in results:
        cells = out.setdefault(result.row, {})
        for column, cell in (result.columns or {}).items():
            cells[_dec(column)] = (cell.timestamp, cell.value)
        for tcol in result.sortedColumns or ():
            cells[_dec(tcol.columnName)] = (tcol.cell.timestamp, tcol.cell.value)
    return out


@dataclass(frozen=True)
class _Plan:
    """What a read or scan derives from its Reads (memoised per tuple of Reads)."""

    reads: tuple[Read, ...]
    columns: list[bytes]
    """The wide call's column list (see :func:`_wide_columns`)."""
    wide_max: int | None
    """The wide call's inclusive upper bound: the largest ``max_ts`` (None: any Read
    without one)."""
    by_family: dict[str, list[tuple[Read, frozenset[str] | None]]]
    """family -> the Reads of it, each with its qualifiers (None: all)."""
    skipping: bool
    """Some Read has a ``skip_tag`` (validated), applied to the answer on the client."""


def _build_plan(reads: tuple[Read, ...]) -> _Plan:
    bounds = [r.max_ts for r in reads]
    wide_max = None if any(b is None for b in bounds) else max(b for b in bounds if b is not None)
    by_family: dict[str, list[tuple[Read, frozenset[str] | None]]] = {}
    for read in reads:
        qualifiers = None if read.qualifiers is None else frozenset(read.qualifiers)
        by_family.setdefault(read.family, []).append((read, qualifiers))
    skipping = any([check_skip_tag(read) is not None for read in reads])
    return _Plan(reads, _wide_columns(reads), wide_max, by_family, skipping)


_plan = memo_by_reads(_build_plan)


@dataclass
class _Answer:
    """Cells gathered for rows, merged per column (newest first, one per timestamp)."""

    rows: dict[bytes, dict[str, dict[int, bytes]]] = field(
        default_factory=lambda: defaultdict(dict)
    )

    def add(self, row: bytes, column: str, cells: Sequence[Cell]) -> None:
        if cells:
            per_ts = self.rows[row].setdefault(column, {})
            for ts, value in cells:
                per_ts[ts] = value

    def result(self, order: Sequence[bytes], plan: _Plan) -> dict[bytes, RowCells]:
        """The rows in *order*, each of the plan's Reads' ``skip_tag`` applied (Thrift1
        gets and scans cannot filter values on the server)."""
        out: dict[bytes, RowCells] = {}
        for row in order:
            columns = self.rows.get(row)
            if columns:
                cells = {c: sorted(v.items(), reverse=True) for c, v in sorted(columns.items())}
                if plan.skipping:
                    drop_skipped(cells, plan.reads)
                if cells:
                    out[row] = cells
        return out


class HBaseStore:
    """The store contract (:class:`percolator._store.Store`) over an HBase Thrift1 server.

    Build it with :func:`open_hbase_store`. *host* and *port* name the Thrift server,
    *namespace* and *table_prefix* place the tables, *pool_size* connections are
    shared by all threads, *timeout_ms* bounds every socket operation.
    """

    atomic_row_cas = False

    def __init__(
        self,
        host: str,
        port: int,
        *,
        namespace: str | None = None,
        table_prefix: str | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        self.host = host
        self.port = port
        self.namespace = namespace
        self.table_prefix = table_prefix
        query = "&".join(
            f"{k}={v}"
            for k, v in (("namespace", namespace), ("table_prefix", table_prefix))
            if v is not None
        )
        self.url = f"hbase://{host}:{port}" + (f"?{query}" if query else "")
        self._closed = False
        try:
            self._pool = happybase.ConnectionPool(
                pool_size, host=host, port=port, timeout=timeout_ms
            )
        except (TException, OSError) as e:
            raise StoreUnavailable(
                f"cannot reach the HBase Thrift server at {host}:{port}: {e}"
            ) from e
        logger.debug("opened %s with %d pooled connections", self.url, pool_size)

    # ---- plumbing ---------------------------------------------------------------

    def _name(self, table: str) -> bytes:
        if not isinstance(table, str) or not _TABLE.match(table):
            raise InvalidArgument(
                f"table name {table!r} is not a valid HBase table name "
                "(letters, digits, '_', '-', '.'; not starting with '-' or '.')"
            )
        name = f"{self.table_prefix}_{table}" if self.table_prefix else table
        return _enc(f"{self.namespace}:{name}" if self.namespace else name)

    def _logical(self, physical: bytes) -> str | None:
        name = _dec(physical)
        if self.namespace:
            ns, sep, name = name.partition(":")
            if not sep or ns != self.namespace:
                return None
        elif ":" in name and not name.startswith("default:"):
            return None
        name = name.removeprefix("default:")
        if self.table_prefix:
            if not name.startswith(self.table_prefix + "_"):
                return None
            name = name[len(self.table_prefix) + 1 :]
        return name

    @contextlib.contextmanager
    def _client(self, table: str | None = None) -> Iterator[Any]:
        """A pooled Thrift client; maps Thrift failures to our errors for *table*."""
        if self._closed:
            raise StoreUnavailable(f"the store {self.url} is closed")
        where = f"HBase Thrift server at {self.host}:{self.port}"
        try:
            with self._pool.connection() as connection:
                yield connection.client
        except _hb.IOError as e:
            message = str(e.message or "")
            if table is not None and (
                "TableNotFoundException" in message or "table does not exist" in message
            ):
                raise UnknownTableError(table) from None
            if "Field is not a long" in message:  # increment of a cell that is no counter
                raise InvalidArgument(
                    f"table {table!r}: {message.splitlines()[0]}"
                ) from None
            if "NoSuchColumnFamilyException" in message:
                raise InvalidArgument(
                    f"table {table!r}: {message.splitlines()[0] if message else e}"
                ) from None
            if "NamespaceNotFoundException" in message:
                raise InvalidArgument(
                    f"HBase namespace {self.namespace!r} does not exist on the {where}; "
                    f"create it first (HBase shell: create_namespace '{self.namespace}')"
                ) from None
            first = message.splitlines()[0] if message else repr(e)
            raise StoreUnavailable(f"{where} failed: {first}") from e
        except _hb.IllegalArgument as e:
            raise InvalidArgument(f"{where} refused the request: {e.message}") from None
        except (TException, OSError, EOFError, happybase.NoConnectionsAvailable) as e:
            raise StoreUnavailable(f"{where} is unreachable or failed: {e!r}") from e

    # ---- tables -----------------------------------------------------------------

    def create_table(self, table: str, families: Mapping[str, int]) -> None:
        """Create *table* with *families* (name -> versions kept, 0 = all); idempotent.

        :raises InvalidArgument: a bad name, or the table exists without some family.
        """
        name = self._name(table)
        if not families:
            raise InvalidArgument(f"table {table!r} needs at least one family, got {families!r}")
        descriptors = []
        for family, versions in families.items():
            if not isinstance(family, str) or not family or ":" in family:
                raise InvalidArgument(f"family name {family!r} must be a non-empty str without ':'")
            if not isinstance(versions, int) or versions < 0:
                raise InvalidArgument(f"versions of family {family!r} must be >= 0: {versions!r}")
            descriptors.append(
                _hb.ColumnDescriptor(name=_enc(family + ":"), maxVersions=versions or MAX_VERSIONS)
            )
        with self._client(table) as client:
            try:
                client.createTable(name, descriptors)
                logger.info("created HBase table %s", _dec(name))
                return
            except _hb.AlreadyExists:
                existing = {_dec(f).rstrip(":") for f in client.getColumnDescriptors(name)}
        missing = sorted(set(families) - existing)
        if missing:
            raise InvalidArgument(
                f"table {table!r} already exists without families {missing} "
                f"(it has {sorted(existing)})"
            )

    def drop_table(self, table: str) -> None:
        """Disable and delete *table*; a missing table is not an error."""
        name = self._name(table)
        try:
            with self._client(table) as client:
                if client.isTableEnabled(name):
                    client.disableTable(name)
                client.deleteTable(name)
                logger.info("dropped HBase table %s", _dec(name))
        except UnknownTableError:
            return

    def list_tables(self) -> list[str]:
        """Names of this store's tables (inside its namespace and prefix), sorted."""
        with self._client() as client:
            names = client.getTableNames()
        return sorted(n for n in map(self._logical, names) if n is not None)

    # ---- reads ------------------------------------------------------------------

    def read_rows(
        self, table: str, rows: Sequence[bytes], reads: Sequence[Read]
    ) -> dict[bytes, RowCells]:
        """Read *reads* of every row in *rows* (see the module docstring for the calls)."""
        name = self._name(table)
        order = list(dict.fromkeys(rows))
        if not order or not reads:
            return {}
        plan = _plan(reads)
        with self._client(table) as client:
            if plan.wide_max is None:
                results = client.getRowsWithColumns(name, order, plan.columns, {})
            else:
                results = client.getRowsWithColumnsTs(
                    name, order, plan.columns, _upper(plan.wide_max), {}
                )
            answer = _Answer()
            self._resolve(client, name, plan, _parse_row_results(results), answer)
        return answer.result(order, plan)

    def _resolve(
        self, client: Any, name: bytes, plan: _Plan, latest: _Latest, answer: _Answer
    ) -> None:
        """Answer the plan's reads from *latest* (newest cells at or below its wide
        bound), then fetch what it cannot tell: older single versions, and
        multi-version histories."""
        # (max_ts -> rows, columns) for single-version reads that saw a newer cell
        again: dict[int, set[tuple[bytes, str]]] = defaultdict(set)
        pending: list[tuple[Read, bytes, str]] = []
        for row, cells in latest.items():
            for column, (ts, value) in cells.items():
                family, _, qualifier = column.partition(":")
                for read, qualifiers in plan.by_family.get(family, ()):
                    if (qualifiers is not None and qualifier not in qualifiers) or (
                        ts < read.min_ts
                    ):
                        continue  # not selected, or nothing of this column in range
                    if read.max_ts is not None and ts > read.max_ts:
                        if read.versions == 1:
                            again[read.max_ts].add((row, column))
                        else:
                            pending.append((read, row, column))
                    elif read.versions == 1 or ts == read.min_ts:
                        answer.add(row, column, [(ts, value)])
                    else:
                        pending.append((read, row, column))
        for max_ts, pairs in again.items():
            rows_ = list(dict.fromkeys(row for row, _ in pairs))
            cols = sorted({column for _, column in pairs})
            results = client.getRowsWithColumnsTs(
                name, rows_, [_enc(c) for c in cols], _upper(max_ts), {}
            )
            older = _parse_row_results(results)
            for read in plan.reads:
                if read.versions != 1 or read.max_ts != max_ts:
                    continue
                for row, cells in older.items():
                    for column, (ts, value) in cells.items():
                        if (
                            (row, column) in pairs
                            and _selects(read, column)
                            and _in_range(read, ts)
                        ):
                            answer.add(row, column, [(ts, value)])
        for read, row, column in pending:
            versions = MAX_VERSIONS if read.versions is None else read.versions
            if versions <= 0:
                continue
            if read.max_ts is None:
                tcells = client.getVer(name, row, _enc(column), versions, {})
            else:
                tcells = client.getVerTs(name, row, _enc(column), _upper(read.max_ts), versions, {})
            answer.add(
                row,
                column,
                [(c.timestamp, c.value) for c in tcells if _in_range(read, c.timestamp)],
            )

    # ---- writes -----------------------------------------------------------------

    def mutate_rows(self, table: str, mutations: Sequence[Mutation]) -> None:
        """Apply *mutations*: deletes first, then puts, one ``mutateRowsTs`` per timestamp.

        A row mutation that spans several timestamps is applied in several steps here.
        """
        name = self._name(table)
        deletes: dict[int, dict[bytes, list[Any]]] = defaultdict(lambda: defaultdict(list))
        puts: dict[int, dict[bytes, list[Any]]] = defaultdict(lambda: defaultdict(list))
        for m in mutations:
            for column, max_ts in m.deletes:
                self._check_ts(max_ts)
                deletes[max_ts][m.row].append(_hb.Mutation(isDelete=True, column=_enc(column)))
            for column, ts, value in m.puts:
                self._check_ts(ts)
                if ":" not in column:
                    raise InvalidArgument(f"column {column!r} must be 'family:qualifier'")
                puts[ts][m.row].append(
                    _hb.Mutation(isDelete=False, column=_enc(column), value=bytes(value))
                )
        if not deletes and not puts:
            return
        with self._client(table) as client:
            for batches in (deletes, puts):
                for ts, by_row in sorted(batches.items()):
                    client.mutateRowsTs(
                        name,
                        [_hb.BatchMutation(row=r, mutations=ms) for r, ms in by_row.items()],
                        ts,
                        {},
                    )

    @staticmethod
    def _check_ts(ts: int) -> None:
        if not isinstance(ts, int) or not 0 <= ts < _LATEST:
            raise InvalidArgument(f"timestamp must be an int in [0, 2**63-1): {ts!r}")

    def check_and_set(
        self,
        table: str,
        row: bytes,
        column: str,
        expected: bytes | None,
        new: bytes,
        puts: Sequence[tuple[str, int, bytes]] = (),
    ) -> bool:
        """Compare-and-set of ``(row, column)`` with Thrift1 ``checkAndPut``.

        *puts* are written first, unconditionally (``atomic_row_cas`` is False). The
        cell must be compared with *expected* (None: absent) and set to *new*; HBase
        cannot tell an empty value from an absent one here, so both must be non-empty.
        """
        name = self._name(table)
        if expected is not None and len(expected) == 0:
            raise InvalidArgument(
                "expected=b'' is ambiguous on HBase (checkAndPut treats an empty value "
                "as absent); use None for 'absent' and non-empty values"
            )
        if not new:
            raise InvalidArgument(
                f"new={new!r}: HBase checkAndPut treats an empty value as absent; "
                "compare-and-set values must be non-empty"
            )
        if ":" not in column:
            raise InvalidArgument(f"column {column!r} must be 'family:qualifier'")
        if puts:
            self.mutate_rows(table, [Mutation(row=row, puts=puts)])
        with self._client(table) as client:
            mput = _hb.Mutation(isDelete=False, column=_enc(column), value=bytes(new))
            return bool(
                client.checkAndPut(
                    name, row, _enc(column), None if expected is None else bytes(expected), mput, {}
                )
            )

    def increment(self, table: str, row: bytes, column: str, amount: int) -> int:
        """Add *amount* to the 64-bit big-endian counter ``(row, column)`` (absent: 0) and
        return the new value: one Thrift1 ``atomicIncrement``
        (:class:`percolator._store.Incrementing`).

        :raises InvalidArgument: the cell does not hold 8 bytes, or *amount* is not a
            64-bit integer.
        """
        name = self._name(table)
        if not isinstance(column, str) or ":" not in column:
            raise InvalidArgument(f"column {column!r} must be 'family:qualifier'")
        check_increment_amount(amount)
        with self._client(table) as client:
            return int(client.atomicIncrement(name, row, _enc(column), amount))

    # ---- scans ------------------------------------------------------------------

    def scan(
        self,
        table: str,
        start: bytes | None,
        stop: bytes | None,
        reads: Sequence[Read],
        *,
        batch_size: int = 1000,
    ) -> Iterator[tuple[bytes, RowCells]]:
        """Rows in ``[start, stop)`` with the cells *reads* select, *batch_size* rows per call.

        The scanner is closed when the iterator is exhausted or closed; no connection is
        held between batches.
        """
        name = self._name(table)
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise InvalidArgument(f"batch_size must be a positive int: {batch_size!r}")
        if not reads:
            return iter(())
        return self._scan(table, name, start, stop, reads, batch_size)

    def _scan(
        self,
        table: str,
        name: bytes,
        start: bytes | None,
        stop: bytes | None,
        reads: Sequence[Read],
        batch_size: int,
    ) -> Iterator[tuple[bytes, RowCells]]:
        plan = _plan(reads)
        tscan = _hb.TScan(
            startRow=start or None,
            stopRow=stop or None,
            columns=plan.columns,
            caching=batch_size,
            timestamp=None if plan.wide_max is None else _upper(plan.wide_max),
        )
        with self._client(table) as client:
            scanner_id = client.scannerOpenWithScan(name, tscan, {})
        try:
            while True:
                with self._client(table) as client:
                    results = client.scannerGetList(scanner_id, batch_size)
                    if not results:
                        return
                    latest = _parse_row_results(results)
                    answer = _Answer()
                    self._resolve(client, name, plan, latest, answer)
                yield from answer.result(list(latest), plan).items()
        finally:
            try:
                with self._client(table) as client:
                    client.scannerClose(scanner_id)
            except (StoreUnavailable, InvalidArgument) as e:
                logger.info("could not close scanner %d on %s: %s", scanner_id, self.url, e)

    def close(self) -> None:
        """Close the pooled connections; the store is unusable afterwards."""
        self._closed = True
        queue = self._pool._queue
        while True:
            try:
                connection = queue.get_nowait()
            except Exception:
                break
            with contextlib.suppress(Exception):
                connection.close()


def open_hbase_store(url: str, **options: Any) -> Store:
    """Open the HBase store at *url* (``hbase://host:port?namespace=NS&table_prefix=P``).

    *options* may give ``namespace``, ``table_prefix``, ``pool_size`` and ``timeout``
    (milliseconds) instead of, or over, the URL's query.

    :raises InvalidArgument: a malformed URL or option.
    :raises StoreUnavailable: the Thrift server cannot be reached.
    """
    parts = urlsplit(url)
    if parts.scheme != "hbase":
        raise InvalidArgument(f"not an hbase:// url: {url!r}")
    try:
        host, port = parts.hostname, parts.port or DEFAULT_PORT
    except ValueError:
        raise InvalidArgument(f"bad port in store url {url!r}")
    if not host or parts.path not in ("", "/") or parts.fragment or parts.username:
        raise InvalidArgument(
            f"bad store url {url!r}: expected hbase://host:port?namespace=NS&table_prefix=P"
        )
    try:
        query = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    except ValueError:
        raise InvalidArgument(f"bad query in store url {url!r}")
    query.update({k: str(v) for k, v in options.items()})
    unknown = sorted(set(query) - set(_OPTIONS))
    if unknown:
        raise InvalidArgument(
            f"unknown option(s) {unknown} for {url!r}; expected some of {list(_OPTIONS)}"
        )
    namespace = query.get("namespace") or None
    if namespace is not None and not _NAMESPACE.match(namespace):
        raise InvalidArgument(f"bad HBase namespace {namespace!r} in {url!r}")
    prefix = query.get("table_prefix") or None
    if prefix is not None and not _TABLE.match(prefix):
        raise InvalidArgument(f"bad table_prefix {prefix!r} in {url!r}")
    numbers: dict[str, int] = {}
    for key, default in (("pool_size", DEFAULT_POOL_SIZE), ("timeout", DEFAULT_TIMEOUT_MS)):
        raw = query.get(key)
        try:
            numbers[key] = default if raw is None else int(raw)
        except ValueError:
            raise InvalidArgument(f"option {key}={raw!r} in {url!r} must be an integer")
        if numbers[key] <= 0:
            raise InvalidArgument(f"option {key}={raw!r} in {url!r} must be positive")
    return HBaseStore(
        host,
        port,
        namespace=namespace,
        table_prefix=prefix,
        pool_size=numbers["pool_size"],
        timeout_ms=numbers["timeout"],
    )
