"""The HBase backend: the store contract over HBase's Thrift1 server, through happybase.

``percolator.connect("hbase://host:9090?namespace=NS&table_prefix=P&transport=framed")``
(every query option may also be passed as a keyword argument; docs/hbase.md says how
to set them for a cluster):

* ``namespace``: tables are named ``NS:table``. The namespace must already exist
  (``create_namespace 'NS'`` in the HBase shell); Thrift1 cannot create it.
* ``table_prefix``: tables are named ``P_table`` (tests use it for isolation).
* ``transport`` (``buffered``, the default, or ``framed``) and ``protocol`` (``binary``,
  the default, or ``compact``): those of the Thrift server (``hbase thrift start
  -f -c``). HTTP and SASL/Kerberos Thrift servers are refused with InvalidArgument:
  happybase cannot speak them.
* ``timeout``: socket timeout in seconds, also for connecting (default 120, above
  what the Thrift server's own client spends retrying through a region move).
* ``pool_size``: idle connections kept (default 8); ``idle_timeout``: seconds an
  idle one is kept (default 50, below the server's 60 s
  ``hbase.thrift.server.socket.read.timeout``). A caller who finds none idle opens one.
* ``max_request_bytes``: mutation calls are split to stay under it (default 64 MiB,
  below libthrift's 100 MB ``maxMessageSize``).
* ``compression``: of new families (``NONE``, the default, ``SNAPPY``, ``ZSTD``,
  ``LZ4``, ``GZ``...; the codec must be installed on every region server).
* ``thrift2``: ``host:port`` of the cluster's Thrift2 server (``hbase thrift2 start``),
  optional. Thrift1 has no conditional delete; with it, garbage collection removes a
  deleted cell's last FREE lock too (``percolator/stores/_hbase_thrift2.py``).

Failures a real cluster shows and how they are met:

* a connection the server closed while idle is replaced before use; a call safe to
  send twice (reads, writes at explicit timestamps) that meets a broken connection is
  sent once more on a new one; ``checkAndPut`` and ``atomicIncrement`` are not (their
  failure is :class:`~percolator.StoreUnavailable`: the call may have applied);
* ``checkAndPut`` is retried inside the Thrift server without a nonce, so False may
  answer a replay of an attempt that applied: its capability ``CAS_ANSWER_MAY_BE_REPLAYED``
  tells the protocol to read the cell again (``percolator/_cas.py``);
* scanner ids belong to one Thrift server: a scan holds one connection for its
  scanner's life (behind a load balancer another connection may reach another
  server); a scanner the server forgot (HBase 2.4+: unused for 120 s) or lost with its
  connection is opened again after the last row returned;
* ``createTable`` racing another client's (the table was missing when its families
  were asked for) answers ``AlreadyExists`` or ``IOError(TableExistsException)``:
  the table exists, and its families are checked as an existing table's;
* ``createTable`` is answered once HBase's procedure has opened the table's regions;
  one slower than the socket timeout goes on in HBase without us: when the resend's
  answer is lost too, :meth:`~HBaseStore.create_table` waits until the table is there
  and enabled (``isTableEnabled``), as it does for an existing table not enabled yet,
  so that it returns only once the table is usable.

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
* :meth:`~HBaseStore.create_table`: ``getColumnDescriptors`` (the families of an
  existing table must keep enough versions and no TTL), then ``isTableEnabled`` if the
  table exists, ``createTable`` if not (asked first because HBase's master answers a
  ``createTable`` of an existing table only after running a create procedure);
  :meth:`~HBaseStore.drop_table`: ``isTableEnabled``, ``disableTable``, ``deleteTable``;
  :meth:`~HBaseStore.list_tables`: ``getTableNames``.

Deletes are HBase tombstones: until a major compaction they also hide versions put
*later* at or below their timestamp ("Deletes mask Puts" in the HBase reference guide).
"""

from __future__ import annotations

import contextlib
import logging
import re
import select
import socket
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from percolator import metrics as _metrics
from percolator._encoding import LOCK, NOTIFY, split_column
from percolator._errors import (
    InvalidArgument,
    PercolatorError,
    StoreUnavailable,
    UnknownTableError,
    ValueTooLargeError,
)
from percolator._store import (
    CAS_ANSWER_MAY_BE_REPLAYED,
    INCREMENT,
    SPLIT_KEYS,
    Capability,
    Cell,
    Mutation,
    Read,
    RowCells,
    check_increment_amount,
    check_skip_tag,
    drop_skipped,
)
from percolator.stores import REQUESTS
from percolator.stores._memo import memo_by_reads
from percolator.stores._url import check_scan

try:
    import happybase
    from thriftpy2.protocol.cybin import ProtocolError
    from thriftpy2.thrift import TException
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the hbase:// store needs happybase: pip install 'percolator-txn[hbase]'"
    ) from _e

__all__ = ["HBaseStore"]

logger = logging.getLogger(__name__)

_hb: Any = sys.modules["Hbase_thrift"]  # loaded by happybase from its Hbase.thrift

DEFAULT_PORT = 9090
DEFAULT_POOL_SIZE = 8
DEFAULT_TIMEOUT_MS = 120_000
"""Above what the Thrift server's own HBase client may spend retrying one call through
a region move (``hbase.rpc.timeout`` 60 s, and its retries), so that its answer
arrives instead of our timeout: a timeout at the commit point leaves the outcome
unknown."""
DEFAULT_IDLE_TIMEOUT_MS = 50_000
"""Below the Thrift server's ``hbase.thrift.server.socket.read.timeout`` (60 s), after
which it closes an idle connection."""
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""Below libthrift's (0.14+) ``maxMessageSize`` of 100 MB, over which the server drops
the request and the connection."""
CREATE_WAIT_S = 120.0
"""How long :meth:`HBaseStore.create_table` waits at least (the socket ``timeout`` if
longer) for a table whose ``createTable`` got no answer, or which exists but is not
enabled yet, to be there and enabled."""
MAX_VERSIONS = 2**31 - 1
FOREVER = 2**31 - 1  # HConstants.FOREVER: a family's time to live when it has none
_LATEST = 2**63 - 1  # HConstants.LATEST_TIMESTAMP
_OPTIONS = (
    "namespace", "table_prefix", "pool_size", "timeout", "idle_timeout", "transport",
    "protocol", "max_request_bytes", "compression", "thrift2", "api", "tls", "tls_ca",
    "tls_cert", "tls_key",
)
_APIS = ("thrift1", "thrift2")
_TRANSPORTS = ("buffered", "framed")
_HTTP = ("http", "https")
"""Thrift over HTTP(S): the Thrift2 store speaks it (HBase's TLS is HTTP-only)."""
_PROTOCOLS = ("binary", "compact")
_UNSUPPORTED_TRANSPORTS = {
    "http": "Thrift over HTTP (hbase.regionserver.thrift.http=true)",
    "https": "Thrift over HTTPS",
    "sasl": "SASL/Kerberos Thrift (hbase.thrift.security.qop)",
    "kerberos": "SASL/Kerberos Thrift (hbase.thrift.security.qop)",
}
_COMPRESSIONS = ("NONE", "GZ", "LZO", "SNAPPY", "LZ4", "BZIP2", "ZSTD")
_IN_MEMORY = frozenset({LOCK, NOTIFY})
"""Families HBase should keep in its in-memory block cache tier (Percolator §2.2:
"special in-memory columns"): read on every get, prewrite and notification scan."""
_MUTATION_OVERHEAD = 32
"""Bytes on the wire per Thrift ``Mutation`` besides its column and value, rounded up."""
_DECLARED = (_hb.IOError, _hb.IllegalArgument, _hb.AlreadyExists)
"""Errors the server answered with: the connection is still good."""
_BROKEN = (TException, OSError, EOFError, ProtocolError)
"""Errors of the connection itself: it is dropped (it may be half-way through a call)."""
_SCANNER_GONE = (
    "scanner ID is invalid", "Invalid scanner Id", "UnknownScannerException",
    "ScannerTimeoutException",
)
"""How a server says a scanner it no longer has (HBase 2.4+ forgets one unused for
twice ``hbase.client.scanner.timeout.period``, 120 s; older region servers lose its
lease after 60 s)."""
_SCAN_RESTARTS = 3
T = TypeVar("T")
_TABLE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_]+$")

_Latest = dict[bytes, dict[str, Cell]]
"""Newest cell per column per row, as a wide call returns it."""


def _enc(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _dec(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _batch_failed_on_missing_table(message: str, name: str) -> bool:
    """Whether *message* is HBase 2.6's answer to a batch mutation of the missing table
    *name*: the TableNotFoundException's message is the bare table name, quoted as the
    cause of each failed action (seen on a real 2.6.1; its Thrift2 server drops the
    exception's class name from the message)."""
    return re.search(
        rf"(?:RetriesExhaustedWithDetailsException: )?Failed \d+ actions?: {re.escape(name)}: "
        r"\d+ times?", message,
    ) is not None


def _check_qualified(column: object) -> None:
    """A column the store writes must name a qualifier: HBase's Thrift1 turns a bare
    family into a family-wide operation."""
    if not isinstance(column, str) or ":" not in column:
        raise InvalidArgument(f"column {column!r} must be 'family:qualifier'")


def _check_cas(column: str, expected: bytes | None, new: bytes) -> None:
    """The arguments of a compare-and-set HBase can take: HBase's checkAndMutate
    treats an empty expected value as "absent or empty"."""
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
    _check_qualified(column)


def _upper(max_ts: int | None) -> int:
    """Thrift1's exclusive upper bound for an inclusive *max_ts* (None: no bound)."""
    return _LATEST if max_ts is None or max_ts >= _LATEST - 1 else max_ts + 1


def _selects(read: Read, column: str) -> bool:
    family, qualifier = split_column(column)
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


def _message(error: Exception) -> str:
    """The message of a Thrift exception (bytes: responses are not decoded)."""
    message = getattr(error, "message", None) or ""
    return _dec(message) if isinstance(message, bytes) else str(message)


def _peer_closed(connection: Any) -> bool:
    """Whether the server closed *connection* (it is readable with nothing to read):
    a connection it dropped while idle is replaced before a call is sent on it."""
    # thriftpy2's Cython transports expose the socket, the pure-Python ones a TSocket.
    sock = getattr(connection.transport, "sock", None)
    sock = getattr(sock, "sock", sock)
    if not isinstance(sock, socket.socket):
        return False  # cannot tell: a safe call is retried if it breaks
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _close_quietly(connection: Any) -> None:
    with contextlib.suppress(Exception):
        connection.close()


class _Pool:
    """Thrift connections to one address, each used by one caller at a time.

    Up to *size* idle connections are kept, each for at most *idle_s* seconds (the
    server drops idle ones); a caller who finds none idle opens a new one, so a thread
    that holds one for a scan never waits for another.
    """

    def __init__(self, open_: Callable[[], Any], size: int, idle_s: float) -> None:
        self._open = open_
        self._size = size
        self._idle_s = idle_s
        self._idle: list[tuple[float, Any]] = []  # (returned at, connection), newest last
        self._mutex = threading.Lock()
        self._closed = False

    def take(self) -> Any:
        now = time.monotonic()
        stale: list[Any] = []
        connection = None
        with self._mutex:
            while self._idle:
                since, candidate = self._idle.pop()
                if now - since >= self._idle_s:
                    stale.extend(c for _, c in self._idle)  # older still
                    stale.append(candidate)
                    self._idle.clear()
                elif _peer_closed(candidate):
                    stale.append(candidate)
                else:
                    connection = candidate
                    break
        for old in stale:
            _close_quietly(old)
        return connection if connection is not None else self._open()

    def give(self, connection: Any) -> None:
        with self._mutex:
            if not self._closed and len(self._idle) < self._size:
                self._idle.append((time.monotonic(), connection))
                return
        _close_quietly(connection)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            idle, self._idle = self._idle, []
        for _, connection in idle:
            _close_quietly(connection)


class HBaseStore:
    """The store contract (:class:`percolator._store.Store`) over an HBase Thrift1 server.

    Build it with :func:`open_hbase_store`. *host* and *port* name the Thrift server,
    *namespace* and *table_prefix* place the tables; up to *pool_size* idle connections
    are kept, each at most *idle_timeout_ms*; *timeout_ms* bounds every socket
    operation; *transport* and *protocol* are the Thrift server's (``buffered`` or
    ``framed``; ``binary`` or ``compact``); a mutation call carries at most
    *max_request_bytes*; new families get *compression*.
    """

    atomic_row_cas = False
    api = "thrift1"
    _server = "HBase Thrift server"
    _declared: tuple[type[Exception], ...] = _DECLARED
    """Errors the server answers with (the connection is still good)."""
    _illegal: type[Exception] = _hb.IllegalArgument
    capabilities: frozenset[Capability[Any]] = frozenset({
        INCREMENT, SPLIT_KEYS,
        # The Thrift server's HBase client retries checkAndMutate without a nonce, so a
        # False may answer a retry of an attempt that applied (percolator/_cas.py).
        CAS_ANSWER_MAY_BE_REPLAYED,
    })

    def __init__(
        self,
        host: str,
        port: int,
        *,
        namespace: str | None = None,
        table_prefix: str | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
        transport: str = "buffered",
        protocol: str = "binary",
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        compression: str = "NONE",
    ) -> None:
        self.host = host
        self.port = port
        self.namespace = namespace
        self.table_prefix = table_prefix
        self.timeout_ms = timeout_ms
        self.transport = transport
        self.protocol = protocol
        self.max_request_bytes = max_request_bytes
        self.compression = compression
        query = "&".join(
            f"{k}={v}"
            for k, v in (("namespace", namespace), ("table_prefix", table_prefix))
            if v is not None
        )
        if self.api != "thrift1":
            query = "&".join(filter(None, (f"api={self.api}", query)))
        self.url = f"hbase://{host}:{port}" + (f"?{query}" if query else "")
        self._where = f"{self._server} at {host}:{port}"
        self._closed = False
        self._pool = _Pool(self._connect, pool_size, idle_timeout_ms / 1000)
        self._pool.give(self._connect())  # fail now if the server cannot be reached
        logger.debug("opened %s (%s transport, %s protocol)", self.url, transport, protocol)

    # ---- plumbing ---------------------------------------------------------------

    def _connect(self) -> Any:
        try:
            return happybase.Connection(
                self.host, self.port, timeout=self.timeout_ms,
                transport=self.transport, protocol=self.protocol,
            )
        except (TException, OSError) as e:
            raise StoreUnavailable(f"cannot reach the {self._where}: {e}") from e

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

    def _take(self) -> Any:
        if self._closed:
            raise StoreUnavailable(f"the store {self.url} is closed")
        return self._pool.take()

    def _answered(self, e: Exception, table: str | None) -> PercolatorError:
        """Our error for an error the server answered with (the connection is fine)."""
        if isinstance(e, self._illegal):
            return InvalidArgument(f"{self._where} refused the request: {_message(e)}")
        message = _message(e)
        first = message.splitlines()[0] if message else repr(e)
        if table is not None and (
            "TableNotFoundException" in message or "table does not exist" in message
            or _batch_failed_on_missing_table(message, _dec(self._name(table)))
            # Thrift2 answers a TableNotFoundException with its message alone.
            or message.strip() == _dec(self._name(table))
        ):
            return UnknownTableError(table)
        if "Field is not a long" in message:  # increment of a cell that is no counter
            return InvalidArgument(f"table {table!r}: {first}")
        if "NoSuchColumnFamilyException" in message:
            return InvalidArgument(f"table {table!r}: {first}")
        if "NamespaceNotFoundException" in message:
            return InvalidArgument(
                f"HBase namespace {self.namespace!r} does not exist on the {self._where}; "
                f"create it first (HBase shell: create_namespace '{self.namespace}')"
            )
        return StoreUnavailable(f"{self._where} failed: {first}")

    def _call(self, table: str | None, work: Callable[[Any], T], *, safe: bool = True) -> T:
        """``work(client)`` on a pooled connection. A broken connection is dropped and,
        when *safe* (the calls of *work* may be sent twice: reads, writes at explicit
        timestamps), *work* runs once more on a new one; otherwise the caller learns
        :class:`StoreUnavailable` (the call may or may not have been applied)."""
        for attempt in (1, 2):
            # The second attempt on a new connection: other pooled ones may be as stale.
            connection = self._take() if attempt == 1 else self._connect()
            try:
                result = work(connection.client)
            except self._declared as e:
                self._pool.give(connection)
                raise self._answered(e, table) from None
            except _BROKEN as e:
                _close_quietly(connection)
                if safe and attempt == 1:
                    logger.info("%s: connection broke (%r); trying again on a new one",
                                self._where, e)
                    continue
                raise StoreUnavailable(f"{self._where} is unreachable or failed: {e!r}") from e
            except BaseException:
                _close_quietly(connection)
                raise
            self._pool.give(connection)
            return result
        raise AssertionError("unreachable")

    # ---- tables -----------------------------------------------------------------

    def _descriptor(self, family: str, versions: int) -> Any:
        """What a family is created with: *versions* kept, no time to live, HBase's own
        defaults for the block cache and a row bloom filter (Thrift1's IDL defaults
        turn both off), the lock and notify families in memory (docs/hbase.md)."""
        return _hb.ColumnDescriptor(
            name=_enc(family + ":"),
            maxVersions=versions or MAX_VERSIONS,
            compression=self.compression,
            inMemory=family in _IN_MEMORY,
            bloomFilterType="ROW",
            blockCacheEnabled=True,
            timeToLive=FOREVER,
        )

    def create_table(self, table: str, families: Mapping[str, int]) -> None:
        """Create *table* with *families* (name -> versions kept, 0 = all); idempotent.

        A table that already exists (made by another client, or in the HBase shell)
        must have every family, keeping at least as many versions and no time to live:
        HBase drops what exceeds either at flush or compaction, and snapshot reads
        would then find committed data gone.

        :raises InvalidArgument: a bad name, or an existing table without some family
            or with settings that would lose data (the message says how to alter it).
        """
        if _metrics._enabled:
            next(REQUESTS.create_table)
        name = self._name(table)
        if not families:
            raise InvalidArgument(f"table {table!r} needs at least one family, got {families!r}")
        descriptors = []
        for family, versions in families.items():
            if not isinstance(family, str) or not family or ":" in family:
                raise InvalidArgument(f"family name {family!r} must be a non-empty str without ':'")
            if not isinstance(versions, int) or versions < 0:
                raise InvalidArgument(f"versions of family {family!r} must be >= 0: {versions!r}")
            descriptors.append(self._descriptor(family, versions))

        deadline = time.monotonic() + max(self.timeout_ms / 1000, CREATE_WAIT_S)
        # The families first: most calls find the table there (every client and worker
        # start creates its tables), and HBase's master answers a createTable of an
        # existing table only after running (and failing) a create procedure, where it
        # answers a descriptor from memory: an existing table costs two cheap calls
        # (families, enabled), a new one one more call than the create alone.
        existing: Mapping[bytes, Any] | None
        try:
            existing = self._call(table, lambda client: self._families_of(client, name))
        except UnknownTableError:
            existing = self._create_new(table, name, descriptors, deadline)
        if existing is None:
            logger.info("created HBase table %s", _dec(name))
            return  # answered once HBase's procedure ended: its regions are open
        self._check_families(table, families, existing)
        self._await_enabled(table, name, deadline)

    def _create_new(
        self, table: str, name: bytes, descriptors: list[Any], deadline: float,
    ) -> Mapping[bytes, Any] | None:
        """``createTable`` of a table HBase did not know a moment ago: None once it is
        created, or the families of the table that another client created meanwhile."""
        try:
            return self._call(table, lambda client: self._create(client, name, descriptors))
        except StoreUnavailable as e:
            if not isinstance(e.__cause__, _BROKEN):
                raise  # HBase answered: a failure, not a create still under way
            # No answer to either send (a create slower than the socket timeout):
            # HBase may still be creating it. Done once it is there and enabled.
            return self._await_created(table, name, descriptors, deadline, e)

    def _await_created(
        self, table: str, name: bytes, descriptors: list[Any], deadline: float,
        lost: StoreUnavailable,
    ) -> Mapping[bytes, Any]:
        """The families of *table*, once HBase has created and enabled it after a
        ``createTable`` whose answer was lost (*lost*): while it is unknown to HBase,
        ``createTable`` is sent again (queued behind a create under way, it answers
        "exists" when that one ends).

        :raises StoreUnavailable: not there and enabled by *deadline*."""
        pause = 0.1
        while True:
            try:
                if self._call(table, lambda client: self._enabled(client, name)):
                    return self._call(table, lambda client: self._families_of(client, name))
            except UnknownTableError:
                try:
                    if self._call(table, lambda client: self._create(client, name, descriptors),
                                  safe=False) is None:
                        return self._call(table, lambda client: self._families_of(client, name))
                except StoreUnavailable as e:
                    if not isinstance(e.__cause__, _BROKEN):
                        raise
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"createTable {_dec(name)} on the {self._where} got no answer ({lost}) "
                    f"and the table was not there and enabled "
                    f"{max(self.timeout_ms / 1000, CREATE_WAIT_S):.0f} s later; HBase may "
                    "still create it: calling create_table again is safe") from lost
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _await_enabled(self, table: str, name: bytes, deadline: float) -> None:
        """Return once *table*, which exists, is enabled (its regions open): another
        client may be creating it, or an operator altering it.

        :raises StoreUnavailable: still not enabled at *deadline*."""
        pause = 0.1
        while not self._call(table, lambda client: self._enabled(client, name)):
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"table {table!r} ({_dec(name)}) exists on the {self._where} but is "
                    "not enabled: HBase is still creating it, or it was disabled (HBase "
                    f"shell: enable '{_dec(name)}')")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _create(
        self, client: Any, name: bytes, descriptors: list[Any]
    ) -> Mapping[bytes, Any] | None:
        """Create the table; if it exists, its families' descriptors by ``b"family:"``
        (each with ``maxVersions`` and ``timeToLive``)."""
        try:
            client.createTable(name, descriptors)
            return None
        except _hb.AlreadyExists:
            pass
        except _hb.IOError as e:
            # Created by another client between the Thrift server's own check and
            # its createTable.
            if "TableExistsException" not in _message(e):
                raise
        return self._families_of(client, name)

    def _enabled(self, client: Any, name: bytes) -> bool:
        """Whether the table is enabled (HBase: a missing one is an error)."""
        return bool(client.isTableEnabled(name))

    def _families_of(self, client: Any, name: bytes) -> Mapping[bytes, Any]:
        """The table's families' descriptors by ``b"family:"``, as :meth:`_create`."""
        return dict(client.getColumnDescriptors(name))

    def _check_families(
        self, table: str, families: Mapping[str, int], existing: Mapping[bytes, Any]
    ) -> None:
        found = {_dec(f).rstrip(":"): d for f, d in existing.items()}
        missing = sorted(set(families) - set(found))
        if missing:
            raise InvalidArgument(
                f"table {table!r} already exists without families {missing} "
                f"(it has {sorted(found)})"
            )
        wrong: list[str] = []
        fixes: list[str] = []
        for family, versions in families.items():
            have = found[family]
            need = versions or MAX_VERSIONS
            ttl = have.timeToLive
            problems = []
            if have.maxVersions is not None and have.maxVersions < need:
                problems.append(f"VERSIONS => {have.maxVersions} (needs {need})")
            if ttl is not None and 0 < ttl < FOREVER:
                problems.append(f"TTL => {ttl} (needs FOREVER)")
            if problems:
                wrong.append(f"family {family!r}: " + ", ".join(problems))
                fixes.append(f"{{NAME => '{family}', VERSIONS => {need}, TTL => 'FOREVER'}}")
        if wrong:
            raise InvalidArgument(
                f"table {table!r} ({_dec(self._name(table))}) already exists with settings "
                "under which HBase drops committed versions at flush or compaction: "
                + "; ".join(wrong)
                + f". Alter it in the HBase shell: alter '{_dec(self._name(table))}', "
                + ", ".join(fixes)
            )

    def drop_table(self, table: str) -> None:
        """Disable and delete *table*; a missing table is not an error."""
        if _metrics._enabled:
            next(REQUESTS.drop_table)
        name = self._name(table)

        try:
            self._call(table, lambda client: self._drop(client, name))
            logger.info("dropped HBase table %s", _dec(name))
        except UnknownTableError:
            return

    def _drop(self, client: Any, name: bytes) -> None:
        if client.isTableEnabled(name):
            client.disableTable(name)
        client.deleteTable(name)

    def list_tables(self) -> list[str]:
        """Names of this store's tables (inside its namespace and prefix), sorted."""
        if _metrics._enabled:
            next(REQUESTS.list_tables)
        names = self._call(None, self._table_names)
        return sorted(n for n in map(self._logical, names) if n is not None)

    def split_keys(self, table: str) -> list[bytes]:
        """The start keys of *table*'s regions after the first (``getTableRegions``),
        sorted: where a parallel reader splits its scan (optional capability, see
        :class:`percolator._store.SplitKeys`). One region: an empty list."""
        name = self._name(table)
        starts = self._call(table, lambda client: self._region_starts(client, name))
        return sorted({bytes(key) for key in starts if key})

    def _table_names(self, client: Any) -> list[bytes]:
        return list(client.getTableNames())

    def _region_starts(self, client: Any, name: bytes) -> list[bytes]:
        return [r.startKey for r in client.getTableRegions(name)]

    # ---- reads ------------------------------------------------------------------

    def read_rows(
        self, table: str, rows: Sequence[bytes], reads: Sequence[Read]
    ) -> dict[bytes, RowCells]:
        """Read *reads* of every row in *rows* (see the module docstring for the calls)."""
        if _metrics._enabled:
            next(REQUESTS.read_rows)
        name = self._name(table)
        order = list(dict.fromkeys(rows))
        if not order or not reads:
            return {}
        plan = _plan(reads)

        def read(client: Any) -> _Answer:
            answer = _Answer()
            latest = self._latest_at(client, name, order, plan.columns, plan.wide_max)
            self._resolve(client, name, plan, latest, answer)
            return answer

        return self._call(table, read).result(order, plan)

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
                family, qualifier = split_column(column)
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
            older = self._latest_at(client, name, rows_, [_enc(c) for c in cols], max_ts)
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
        pending = [p for p in pending if p[0].versions is None or p[0].versions > 0]
        if pending:
            for (read, row, column), history in zip(
                pending, self._histories(client, name, pending), strict=True
            ):
                answer.add(row, column, [c for c in history if _in_range(read, c[0])])

    def _latest_at(
        self, client: Any, name: bytes, rows: list[bytes], columns: list[bytes],
        max_ts: int | None,
    ) -> _Latest:
        """The newest cell of each of *columns* (Thrift column names) at or below
        *max_ts* in each of *rows*: one ``getRowsWithColumns[Ts]``."""
        if max_ts is None:
            results = client.getRowsWithColumns(name, rows, columns, {})
        else:
            results = client.getRowsWithColumnsTs(name, rows, columns, _upper(max_ts), {})
        return _parse_row_results(results)

    def _histories(
        self, client: Any, name: bytes, items: Sequence[tuple[Read, bytes, str]]
    ) -> list[list[Cell]]:
        """For each ``(read, row, column)``, the newest versions of the column at or
        below the read's ``max_ts``, as many as it wants: one ``getVer[Ts]`` each
        (Thrift1 reads one column of one row per call)."""
        out: list[list[Cell]] = []
        for read, row, column in items:
            versions = MAX_VERSIONS if read.versions is None else read.versions
            if read.max_ts is None:
                tcells = client.getVer(name, row, _enc(column), versions, {})
            else:
                tcells = client.getVerTs(name, row, _enc(column), _upper(read.max_ts), versions, {})
            out.append([(c.timestamp, c.value) for c in tcells])
        return out

    # ---- writes -----------------------------------------------------------------

    def mutate_rows(self, table: str, mutations: Sequence[Mutation]) -> None:
        """Apply *mutations*: deletes first, then puts, one ``mutateRowsTs`` per timestamp.

        A row mutation that spans several timestamps is applied in several steps here.
        """
        if _metrics._enabled:
            next(REQUESTS.mutate_rows)
        name = self._name(table)
        deletes: dict[int, dict[bytes, list[Any]]] = defaultdict(lambda: defaultdict(list))
        puts: dict[int, dict[bytes, list[Any]]] = defaultdict(lambda: defaultdict(list))
        for m in mutations:
            for column, max_ts in m.deletes:
                self._check_ts(max_ts)
                deletes[max_ts][m.row].append(_hb.Mutation(isDelete=True, column=_enc(column)))
            for column, ts, value in m.puts:
                self._check_ts(ts)
                _check_qualified(column)
                puts[ts][m.row].append(
                    _hb.Mutation(isDelete=False, column=_enc(column), value=bytes(value))
                )
        if not deletes and not puts:
            return
        for batches in (deletes, puts):
            for ts, by_row in sorted(batches.items()):
                for chunk in self._chunks(table, by_row):
                    self._mutate_rows_ts(table, name, chunk, ts)

    def _mutate_rows_ts(self, table: str, name: bytes, batch: list[Any], ts: int) -> None:
        # Writes at an explicit timestamp: sending one twice changes nothing.
        self._call(table, lambda client: client.mutateRowsTs(name, batch, ts, {}))

    def _chunks(self, table: str, by_row: Mapping[bytes, list[Any]]) -> Iterator[list[Any]]:
        """*by_row* as ``BatchMutation`` lists of at most ``max_request_bytes`` each
        (the Thrift server drops a bigger request, and the connection with it)."""
        return self._chunked(table, (
            (row, len(row) + sum(
                _MUTATION_OVERHEAD + len(m.column) + len(m.value or b"") for m in mutations
            ), _hb.BatchMutation(row=row, mutations=mutations))
            for row, mutations in by_row.items()
        ))

    def _chunked(
        self, table: str, weighed: Iterable[tuple[bytes, int, T]]
    ) -> Iterator[list[T]]:
        """The items of *weighed* (``(row, bytes on the wire, item)``) in lists of at
        most ``max_request_bytes`` each."""
        chunk: list[T] = []
        size = 0
        for row, weight, item in weighed:
            if weight > self.max_request_bytes:
                raise ValueTooLargeError(
                    f"the mutation of row {row[:80]!r} in table {table!r} takes {weight} "
                    f"bytes, over max_request_bytes={self.max_request_bytes} (the Thrift "
                    "server drops requests over its maxMessageSize, 100 MB by default)"
                )
            if chunk and size + weight > self.max_request_bytes:
                yield chunk
                chunk, size = [], 0
            chunk.append(item)
            size += weight
        if chunk:
            yield chunk

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
        if _metrics._enabled:
            next(REQUESTS.check_and_set)
        name = self._name(table)
        _check_cas(column, expected, new)
        if puts:
            self.mutate_rows(table, [Mutation(row=row, puts=puts)])
        mput = _hb.Mutation(isDelete=False, column=_enc(column), value=bytes(new))
        old = None if expected is None else bytes(expected)
        return bool(
            self._call(
                table,
                lambda client: client.checkAndPut(name, row, _enc(column), old, mput, {}),
                safe=False,
            )
        )

    def increment(self, table: str, row: bytes, column: str, amount: int) -> int:
        """Add *amount* to the 64-bit big-endian counter ``(row, column)`` (absent: 0) and
        return the new value: one Thrift1 ``atomicIncrement``
        (:class:`percolator._store.Incrementing`).

        :raises InvalidArgument: the cell does not hold 8 bytes, or *amount* is not a
            64-bit integer.
        """
        if _metrics._enabled:
            next(REQUESTS.increment)
        name = self._name(table)
        _check_qualified(column)
        check_increment_amount(amount)
        return int(
            self._call(
                table,
                lambda client: client.atomicIncrement(name, row, _enc(column), amount),
                safe=False,
            )
        )

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

        The scanner is closed when the iterator is exhausted or closed; one connection
        is held for its life (scanner ids belong to one Thrift server).
        """
        if _metrics._enabled:
            next(REQUESTS.scan)
        name = self._name(table)
        check_scan(start, stop, batch_size)
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
        """One connection holds the scanner for its whole life: scanner ids belong to
        one Thrift server, and behind a load balancer another connection may reach
        another server (whose scanner of that id is someone else's). A scanner the
        server forgot (unused too long) or lost with its connection is opened again
        after the last row returned."""
        plan = _plan(reads)
        last: bytes | None = None
        connection = None
        scanner_id: int | None = None
        restarts = 0
        try:
            while True:
                try:
                    if connection is None:
                        connection = self._take() if not restarts else self._connect()
                    if scanner_id is None:
                        begin = start if last is None else last + b"\0"
                        if begin and stop and begin >= stop:
                            # An empty range: HBase would read start == stop as a Get
                            # of that row (Scan.isGetScan), and return it.
                            return
                        scanner_id = self._open_scanner(
                            connection.client, name, begin, stop, plan, batch_size
                        )
                    latest = self._scanner_rows(connection.client, scanner_id, batch_size)
                    if not latest:
                        return
                    answer = _Answer()
                    self._resolve(connection.client, name, plan, latest, answer)
                except self._declared as e:
                    message = _message(e)
                    if scanner_id is None or not any(s in message for s in _SCANNER_GONE):
                        raise self._answered(e, table) from None
                    restarts = self._restart(restarts, f"scanner lost ({message[:80]})")
                    scanner_id = None
                    continue
                except _BROKEN as e:
                    if connection is not None:
                        _close_quietly(connection)
                    connection = scanner_id = None
                    restarts = self._restart(restarts, f"connection broke ({e!r})")
                    continue
                restarts = 0
                last = next(reversed(latest))
                yield from answer.result(list(latest), plan).items()
        finally:
            if connection is not None:
                self._close_scanner(connection, scanner_id)

    def _open_scanner(
        self, client: Any, name: bytes, start: bytes | None, stop: bytes | None, plan: _Plan,
        batch_size: int,
    ) -> int:
        tscan = _hb.TScan(
            startRow=start or None,
            stopRow=stop or None,
            columns=plan.columns,
            caching=batch_size,
            timestamp=None if plan.wide_max is None else _upper(plan.wide_max),
        )
        return int(client.scannerOpenWithScan(name, tscan, {}))

    def _scanner_rows(self, client: Any, scanner_id: int, count: int) -> _Latest:
        """The scanner's next *count* rows (none: it is done)."""
        return _parse_row_results(client.scannerGetList(scanner_id, count))

    def _scanner_close(self, client: Any, scanner_id: int) -> None:
        client.scannerClose(scanner_id)

    def _restart(self, restarts: int, why: str) -> int:
        if restarts >= _SCAN_RESTARTS:
            raise StoreUnavailable(
                f"{self._where}: a scan failed {restarts + 1} times in a row: {why}"
            )
        logger.info("%s: %s; the scan goes on from its last row", self._where, why)
        return restarts + 1

    def _close_scanner(self, connection: Any, scanner_id: int | None) -> None:
        try:
            if scanner_id is not None:
                self._scanner_close(connection.client, scanner_id)
        except self._declared as e:
            logger.info("could not close scanner %d on %s: %s", scanner_id, self.url, e)
        except _BROKEN as e:
            logger.info("could not close scanner %d on %s: %r", scanner_id, self.url, e)
            _close_quietly(connection)
            return
        self._pool.give(connection)

    def close(self) -> None:
        """Close the pooled connections; the store is unusable afterwards."""
        self._closed = True
        self._pool.close()
