"""The HBase store over HBase's Thrift2 server (``hbase://host:9091?api=thrift2``).

HBase's Thrift2 server (the same ``hbase-thrift`` artifact: ``hbase thrift2 start``)
speaks HBase's own client API: ``TPut`` cells carry a timestamp each, ``TRowMutations``
mix puts and deletes of one row, and ``checkAndMutate`` compares one cell and applies
row mutations in the same atomic step. So on Thrift2 the store declares
``atomic_row_cas``, ``CAS_DELETES`` and ``DELETE_IF``: the commit point writes the
primary's write record, frees its lock and those of the other cells of its row, and
deletes the notification its observer run served, in the one call that checks the
lock (``percolator/_two_phase.py``), as on Bigtable.

:class:`HBaseThrift2Store` shares everything but the calls with the Thrift1 store
(:class:`percolator.stores.hbase.HBaseStore`): table names, options, the connection
pool, the retry of calls safe to send twice, the error mapping, the read plan and the
assembly of answers, the scan loop with its restarts. What each method sends:

* :meth:`~HBaseStore.read_rows`: one ``getMultiple`` with one ``TGet`` per row (the
  *wide call*: newest version of each selected column at or below the largest
  ``max_ts``, one atomic ``Get`` per row); a Read it cannot answer costs one more
  ``getMultiple`` per distinct ``max_ts`` of the single-version Reads that saw a newer
  cell, plus **one** ``getMultiple`` for every multi-version history (one ``TGet`` per
  row and column, with the Read's own time range and version limit), where Thrift1
  needs one ``getVer`` call each.
* :meth:`~HBaseStore.mutate_rows`: one ``mutateRow`` for a batch of one row (its puts
  and deletes atomically); otherwise one ``deleteMultiple`` for the rows' deletes, then
  one ``putMultiple`` for their puts, each cell at its own timestamp (a row's puts are
  atomic; a row that mixes deletes and puts in a batch of several rows takes two steps,
  deletes first).
* :meth:`~HBaseStore.check_and_set`: one ``checkAndMutate`` whose ``TRowMutations``
  hold the *deletes* (:class:`percolator._store.CasDeletes`) and a ``TPut`` of the new
  value and the *puts*. The compared cell is written without a timestamp, which HBase
  sets to ``max(now_ms, timestamp of the compared cell)`` (as Thrift1's ``checkAndPut``):
  lock cells carry server time, so a lock written again after a delete of its column
  is not hidden by that delete's marker longer than a millisecond. A put at timestamp
  0 in the compared cell's family (the other lock cells of the row, which Bigtable
  keeps at 0) gets that same server timestamp; every other put keeps its own, 0
  included, as HBase honours explicit timestamps in ``checkAndMutate``.
* :meth:`~HBaseStore.increment`: one ``increment``; :meth:`~HBaseStore.delete_if`:
  one ``checkAndMutate`` deleting the column; :meth:`~HBaseStore.scan`:
  ``openScanner`` + one ``getScannerRows`` per *batch_size* rows (+1 at the end) +
  ``closeScanner``; :meth:`~HBaseStore.split_keys`: ``getAllRegionLocations``.
* tables: ``getTableDescriptor``, then ``isTableEnabled`` (an existing table) or
  ``createTable`` (a missing one; ``tableExists`` and ``getTableDescriptor`` when it
  fails, as when another client created the table meanwhile: the Thrift2 server's
  messages drop HBase's exception class), ``isTableEnabled`` + ``disableTable`` +
  ``deleteTable``,
  ``getTableNamesByPattern`` (``getTableNamesByNamespace`` with a namespace).

Failures are met as on Thrift1 (``percolator/stores/hbase.py``): ``checkAndMutate``
and ``increment`` are never sent twice (a broken connection is
:class:`~percolator.StoreUnavailable`, and a lock-cell compare-and-set reads the cell
again, ``percolator/_cas.py``); ``checkAndMutate`` is retried inside the Thrift
server's HBase client without a nonce, so its False may answer a replay
(``CAS_ANSWER_MAY_BE_REPLAYED``); reads and writes at explicit timestamps are sent once
more on a new connection; a scanner the server forgot ("Invalid scanner Id") or lost
with its connection is opened again after the last row returned.

Only the part of HBase 2.6's ``thrift2/hbase.thrift`` these calls use is declared
below (same field ids); thriftpy2 (happybase's Thrift library) compiles it at import.
"""

from __future__ import annotations

import functools
import http.client
import io
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import thriftpy2
from thriftpy2.protocol import TCompactProtocolFactory, TCyBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TClient, TException
from thriftpy2.transport import (
    TCyBufferedTransportFactory,
    TCyFramedTransportFactory,
    TTransportBase,
    TTransportException,
)

from percolator import metrics as _metrics
from percolator._encoding import split_column
from percolator._errors import InvalidArgument, StoreUnavailable, TlsError
from percolator._store import (
    CAS_ANSWER_MAY_BE_REPLAYED,
    CAS_DELETES,
    DELETE_IF,
    INCREMENT,
    SPLIT_KEYS,
    Capability,
    Cell,
    Mutation,
    Read,
    check_increment_amount,
)
from percolator._tls import TlsConfig, diagnose
from percolator.stores import REQUESTS
from percolator.stores.hbase import (
    _IN_MEMORY,
    _MUTATION_OVERHEAD,
    FOREVER,
    MAX_VERSIONS,
    HBaseStore,
    _check_cas,
    _check_qualified,
    _dec,
    _enc,
    _Latest,
    _Plan,
    _upper,
)

_IDL = """
struct TTimeRange {
  1: required i64 minStamp,
  2: required i64 maxStamp
}
struct TColumn {
  1: required binary family,
  2: optional binary qualifier,
  3: optional i64 timestamp
}
struct TColumnValue {
  1: required binary family,
  2: required binary qualifier,
  3: required binary value,
  4: optional i64 timestamp
}
struct TColumnIncrement {
  1: required binary family,
  2: required binary qualifier,
  3: optional i64 amount = 1
}
struct TResult {
  1: optional binary row,
  2: required list<TColumnValue> columnValues
}
enum TDeleteType {
  DELETE_COLUMN = 0,
  DELETE_COLUMNS = 1,
  DELETE_FAMILY = 2,
  DELETE_FAMILY_VERSION = 3
}
struct TGet {
  1: required binary row,
  2: optional list<TColumn> columns,
  3: optional i64 timestamp,
  4: optional TTimeRange timeRange,
  5: optional i32 maxVersions
}
struct TPut {
  1: required binary row,
  2: required list<TColumnValue> columnValues
  3: optional i64 timestamp
}
struct TDelete {
  1: required binary row,
  2: optional list<TColumn> columns,
  3: optional i64 timestamp,
  4: optional TDeleteType deleteType = 1
}
struct TIncrement {
  1: required binary row,
  2: required list<TColumnIncrement> columns,
  7: optional bool returnResults
}
struct TScan {
  1: optional binary startRow,
  2: optional binary stopRow,
  3: optional list<TColumn> columns
  4: optional i32 caching,
  5: optional i32 maxVersions=1,
  6: optional TTimeRange timeRange
}
union TMutation {
  1: TPut put
  2: TDelete deleteSingle
}
struct TRowMutations {
  1: required binary row
  2: required list<TMutation> mutations
}
struct THRegionInfo {
  1: required i64 regionId
  2: required binary tableName
  3: optional binary startKey
  4: optional binary endKey
}
struct TServerName {
  1: required string hostName
  2: optional i32 port
  3: optional i64 startCode
}
struct THRegionLocation {
  1: required TServerName serverName
  2: required THRegionInfo regionInfo
}
enum TCompareOp {
  LESS = 0,
  LESS_OR_EQUAL = 1,
  EQUAL = 2,
  NOT_EQUAL = 3,
  GREATER_OR_EQUAL = 4,
  GREATER = 5,
  NO_OP = 6
}
enum TBloomFilterType {
  NONE = 0,
  ROW = 1,
  ROWCOL = 2,
  ROWPREFIX_FIXED_LENGTH = 3
}
enum TCompressionAlgorithm {
  LZO = 0,
  GZ = 1,
  NONE = 2,
  SNAPPY = 3,
  LZ4 = 4,
  BZIP2 = 5,
  ZSTD = 6
}
struct TTableName {
  1: optional binary ns
  2: required binary qualifier
}
struct TColumnFamilyDescriptor {
  1: required binary name
  5: optional TBloomFilterType bloomnFilterType
  6: optional TCompressionAlgorithm compressionType
  10: optional i32 maxVersions
  13: optional i32 timeToLive
  14: optional bool blockCacheEnabled
  20: optional bool inMemory
}
struct TTableDescriptor {
  1: required TTableName tableName
  2: optional list<TColumnFamilyDescriptor> columns
}
enum TThriftServerType {
  ONE = 1,
  TWO = 2
}
exception TIOError {
  1: optional string message
  2: optional bool canRetry
}
exception TIllegalArgument {
  1: optional string message
}
service THBaseService {
  list<TResult> getMultiple(1: required binary table, 2: required list<TGet> tgets)
    throws (1: TIOError io)
  void putMultiple(1: required binary table, 2: required list<TPut> tputs)
    throws (1: TIOError io)
  list<TDelete> deleteMultiple(1: required binary table, 2: required list<TDelete> tdeletes)
    throws (1: TIOError io)
  TResult increment(1: required binary table, 2: required TIncrement tincrement)
    throws (1: TIOError io)
  i32 openScanner(1: required binary table, 2: required TScan tscan)
    throws (1: TIOError io)
  list<TResult> getScannerRows(1: required i32 scannerId, 2: i32 numRows = 1)
    throws (1: TIOError io, 2: TIllegalArgument ia)
  void closeScanner(1: required i32 scannerId)
    throws (1: TIOError io, 2: TIllegalArgument ia)
  void mutateRow(1: required binary table, 2: required TRowMutations trowMutations)
    throws (1: TIOError io)
  list<THRegionLocation> getAllRegionLocations(1: required binary table)
    throws (1: TIOError io)
  bool checkAndMutate(
    1: required binary table,
    2: required binary row,
    3: required binary family,
    4: required binary qualifier,
    5: required TCompareOp compareOp,
    6: binary value,
    7: required TRowMutations rowMutations
  ) throws (1: TIOError io)
  TTableDescriptor getTableDescriptor(1: required TTableName table)
    throws (1: TIOError io)
  bool tableExists(1: TTableName tableName) throws (1: TIOError io)
  list<TTableName> getTableNamesByPattern(1: optional string regex,
                                          2: required bool includeSysTables)
    throws (1: TIOError io)
  list<TTableName> getTableNamesByNamespace(1: required string name)
    throws (1: TIOError io)
  void createTable(1: required TTableDescriptor desc, 2: optional list<binary> splitKeys)
    throws (1: TIOError io)
  void deleteTable(1: required TTableName tableName) throws (1: TIOError io)
  void disableTable(1: required TTableName tableName) throws (1: TIOError io)
  bool isTableEnabled(1: required TTableName tableName) throws (1: TIOError io)
  TThriftServerType getThriftServerType()
}
"""

_t2: Any = thriftpy2.load_fp(io.StringIO(_IDL), module_name="percolator_hbase2_thrift")
ANSWERED = (_t2.TIOError, _t2.TIllegalArgument)
"""Errors the Thrift2 server answered with (the connection is still good)."""
_DELETE_COLUMNS = _t2.TDeleteType.DELETE_COLUMNS
_EQUAL = _t2.TCompareOp.EQUAL


def parse_address(value: str, url: str) -> tuple[str, int]:
    """``host:port`` of a Thrift2 server, from the store URL's ``thrift2`` option."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(
            f"option thrift2={value!r} in {url!r} must be host:port of an HBase Thrift2 "
            "server (hbase thrift2 start -p PORT)"
        )
    return host, int(port)


class _HttpTransport(TTransportBase):  # type: ignore[misc]
    """Thrift over HTTP(S) to HBase's Thrift HTTP server (``hbase.regionserver.thrift.http``,
    TLS with ``hbase.thrift.ssl.enabled``): one POST per call on a kept-alive
    connection, each answer read whole, so the next call may follow on the same
    connection. A call is never sent again here: a broken connection is the store's to
    handle, as on a socket."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext | None,
                 timeout_s: float) -> None:
        self._conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
            if context is not None else http.client.HTTPConnection(host, port, timeout=timeout_s))
        self._out = io.BytesIO()
        self._in = io.BytesIO()

    @property
    def sock(self) -> socket.socket | None:
        """The socket, for the pool's idle check (a TLS socket the server closed is
        readable, and found closed)."""
        return self._conn.sock  # type: ignore[no-any-return]

    def is_open(self) -> bool:
        return self._conn.sock is not None

    def open(self) -> None:
        self._conn.connect()
        self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self._conn.close()

    def write(self, data: bytes) -> None:
        self._out.write(data)

    def read(self, size: int) -> bytes:
        return self._in.read(size)

    _read = read

    def flush(self) -> None:
        body, self._out = self._out.getvalue(), io.BytesIO()
        self._conn.request("POST", "/", body=body, headers=_HTTP_HEADERS)
        response = self._conn.getresponse()
        answer = response.read()
        if response.status != 200:
            raise TTransportException(
                message=f"HTTP {response.status} {response.reason}: {answer[:200]!r}")
        self._in = io.BytesIO(answer)


_HTTP_HEADERS = {"Content-Type": "application/x-thrift", "Accept": "application/x-thrift"}


class _Connection:
    """One Thrift2 client, as the pool and the idle check want it (``client``,
    ``transport`` whose ``sock`` is the socket, ``close()``)."""

    __slots__ = ("client", "transport")

    def __init__(self, client: Any, transport: Any = None) -> None:
        self.client = client
        self.transport = client._iprot.trans if transport is None else transport

    def close(self) -> None:
        self.client.close()


def _column(column: str, ts: int | None = None) -> Any:
    family, qualifier = split_column(column)
    return _t2.TColumn(family=_enc(family), qualifier=_enc(qualifier), timestamp=ts)


@functools.lru_cache(maxsize=1024)
def _columns(columns: tuple[bytes, ...]) -> list[Any]:
    """The ``TColumn`` list of a plan's Thrift column names (``b"f:q"`` or ``b"f"``)."""
    out = []
    for name in columns:
        family, sep, qualifier = name.partition(b":")
        out.append(_t2.TColumn(family=family, qualifier=qualifier if sep else None))
    return out


def _time_range(min_ts: int, max_ts: int | None) -> Any:
    """HBase's ``[minStamp, maxStamp)`` for the inclusive ``[min_ts, max_ts]``."""
    if min_ts == 0 and max_ts is None:
        return None
    return _t2.TTimeRange(minStamp=min_ts, maxStamp=_upper(max_ts))


def _latest(results: Sequence[Any]) -> _Latest:
    """The newest cell of each column of each row of *results* (rows without cells,
    which ``getMultiple`` answers with an empty ``TResult``, left out)."""
    out: _Latest = {}
    for result in results:
        values = result.columnValues
        if not values:
            continue
        cells = out.setdefault(result.row, {})
        for cv in values:
            column = f"{_dec(cv.family)}:{_dec(cv.qualifier)}"
            if column not in cells:  # versions come newest first
                cells[column] = (cv.timestamp, cv.value)
    return out


class HBaseThrift2Store(HBaseStore):
    """The store contract over an HBase Thrift2 server (see the module docstring).

    Build it with :func:`percolator.stores._hbase_open.open_hbase_store` and ``api=thrift2``;
    the options are the Thrift1 store's (:class:`HBaseStore`), and *ssl_context*, if
    given, wraps every connection in TLS.
    """

    api = "thrift2"
    _server = "HBase Thrift2 server"
    atomic_row_cas = True
    _declared = ANSWERED
    _illegal = _t2.TIllegalArgument
    capabilities: frozenset[Capability[Any]] = frozenset({
        INCREMENT, SPLIT_KEYS, DELETE_IF, CAS_DELETES,
        # The Thrift server's HBase client retries checkAndMutate without a nonce, so a
        # False may answer a retry of an attempt that applied (percolator/_cas.py).
        CAS_ANSWER_MAY_BE_REPLAYED,
    })

    def __init__(self, host: str, port: int, *, tls: TlsConfig | None = None,
                 **options: Any) -> None:
        self._tls = tls
        self._ssl_context = None
        if options.get("transport") == "https":
            self._tls = tls or TlsConfig()  # the system's roots
            try:
                self._ssl_context = self._tls.client_context()
            except (OSError, ssl.SSLError) as e:
                raise TlsError(f"cannot load the TLS files {self._tls!r}: {e}") from e
        super().__init__(host, port, **options)
        try:
            kind = self._call(None, lambda client: client.getThriftServerType())
        except StoreUnavailable as e:
            self.close()
            if self.transport != "https":
                problem = diagnose((host, port), None, peer=f"the {self._where}")
                if problem is not None:  # a TLS (HTTPS) server: say how to reach it
                    raise TlsError(f"{problem.split(': configure')[0]}: give the store "
                                   "transport=https and tls=TlsConfig(...) (docs/tls.md)") from e
            raise StoreUnavailable(
                f"{e}; is {host}:{port} an HBase 2 Thrift2 server (hbase thrift2 start), "
                "with the url's transport and protocol?") from e
        if kind != _t2.TThriftServerType.TWO:
            self.close()
            raise InvalidArgument(
                f"{host}:{port} is HBase's Thrift1 server, and the url says api=thrift2: "
                "give the Thrift2 server's port (hbase thrift2 start -p PORT), or drop "
                "api=thrift2 to speak Thrift1 through happybase"
            )

    # ---- plumbing ---------------------------------------------------------------

    def _connect(self) -> Any:
        if self.transport in ("http", "https"):
            return self._connect_http()
        try:
            return _Connection(make_client(
                _t2.THBaseService, host=self.host, port=self.port, timeout=self.timeout_ms,
                trans_factory=(TCyFramedTransportFactory() if self.transport == "framed"
                               else TCyBufferedTransportFactory()),
                proto_factory=(TCompactProtocolFactory() if self.protocol == "compact"
                               else TCyBinaryProtocolFactory()),
            ))
        except (TException, OSError) as e:
            raise StoreUnavailable(f"cannot reach the {self._where}: {e}") from e

    def _connect_http(self) -> Any:
        transport = _HttpTransport(self.host, self.port, self._ssl_context,
                                   self.timeout_ms / 1000)
        try:
            transport.open()
        except (OSError, TException) as e:
            transport.close()
            if isinstance(e, ssl.SSLError) and self._tls is not None:
                problem = diagnose((self.host, self.port), self._tls, peer=f"the {self._where}")
                if problem is not None:
                    raise TlsError(problem) from e
            raise StoreUnavailable(f"cannot reach the {self._where}: {e}") from e
        buffered = TCyBufferedTransportFactory().get_transport(transport)
        protocol = (TCompactProtocolFactory() if self.protocol == "compact"
                    else TCyBinaryProtocolFactory()).get_protocol(buffered)
        return _Connection(TClient(_t2.THBaseService, protocol), transport)

    @staticmethod
    def _table_name(name: bytes) -> Any:
        ns, sep, qualifier = name.partition(b":")
        return _t2.TTableName(ns=ns, qualifier=qualifier) if sep else _t2.TTableName(
            qualifier=name)

    # ---- tables -----------------------------------------------------------------

    def _descriptor(self, family: str, versions: int) -> Any:
        return _t2.TColumnFamilyDescriptor(
            name=_enc(family),
            maxVersions=versions or MAX_VERSIONS,
            compressionType=getattr(_t2.TCompressionAlgorithm, self.compression),
            inMemory=family in _IN_MEMORY,
            bloomnFilterType=_t2.TBloomFilterType.ROW,
            blockCacheEnabled=True,
            timeToLive=FOREVER,
        )

    def _create(self, client: Any, name: bytes, descriptors: list[Any]) -> dict[bytes, Any] | None:
        table = self._table_name(name)
        try:
            client.createTable(_t2.TTableDescriptor(tableName=table, columns=descriptors), None)
            return None
        except _t2.TIOError:
            # The message is the bare table name whatever went wrong: ask.
            if not client.tableExists(table):
                raise
        return self._families_of(client, name)

    def _enabled(self, client: Any, name: bytes) -> bool:
        return bool(client.isTableEnabled(self._table_name(name)))

    def _families_of(self, client: Any, name: bytes) -> dict[bytes, Any]:
        existing = client.getTableDescriptor(self._table_name(name))
        return {bytes(c.name) + b":": c for c in existing.columns or ()}

    def _drop(self, client: Any, name: bytes) -> None:
        table = self._table_name(name)
        if client.isTableEnabled(table):
            client.disableTable(table)
        client.deleteTable(table)

    def _table_names(self, client: Any) -> list[bytes]:
        if self.namespace:
            tables = client.getTableNamesByNamespace(self.namespace)
        else:
            tables = client.getTableNamesByPattern(".*", False)
        return [(t.ns + b":" if t.ns else b"") + t.qualifier for t in tables]

    def _region_starts(self, client: Any, name: bytes) -> list[bytes]:
        return [loc.regionInfo.startKey for loc in client.getAllRegionLocations(name)]

    # ---- reads ------------------------------------------------------------------

    def _latest_at(
        self, client: Any, name: bytes, rows: list[bytes], columns: list[bytes],
        max_ts: int | None,
    ) -> _Latest:
        wanted = _columns(tuple(columns))
        window = _time_range(0, max_ts)
        gets = [_t2.TGet(row=row, columns=wanted, timeRange=window, maxVersions=1)
                for row in rows]
        return _latest(client.getMultiple(name, gets))

    def _histories(
        self, client: Any, name: bytes, items: Sequence[tuple[Read, bytes, str]]
    ) -> list[list[Cell]]:
        gets = [
            _t2.TGet(row=row, columns=[_column(column)],
                     timeRange=_time_range(read.min_ts, read.max_ts),
                     maxVersions=MAX_VERSIONS if read.versions is None else read.versions)
            for read, row, column in items
        ]
        return [[(cv.timestamp, cv.value) for cv in result.columnValues or ()]
                for result in client.getMultiple(name, gets)]

    def _open_scanner(
        self, client: Any, name: bytes, start: bytes | None, stop: bytes | None, plan: _Plan,
        batch_size: int,
    ) -> int:
        tscan = _t2.TScan(
            startRow=start or None, stopRow=stop or None,
            columns=_columns(tuple(plan.columns)), caching=batch_size, maxVersions=1,
            timeRange=_time_range(0, plan.wide_max),
        )
        return int(client.openScanner(name, tscan))

    def _scanner_rows(self, client: Any, scanner_id: int, count: int) -> _Latest:
        return _latest(client.getScannerRows(scanner_id, count))

    def _scanner_close(self, client: Any, scanner_id: int) -> None:
        client.closeScanner(scanner_id)

    # ---- writes -----------------------------------------------------------------

    def mutate_rows(self, table: str, mutations: Sequence[Mutation]) -> None:
        """Apply *mutations*: a batch of one row in one atomic ``mutateRow``; otherwise
        the deletes in one ``deleteMultiple``, then the puts in one ``putMultiple``."""
        if _metrics._enabled:
            next(REQUESTS.mutate_rows)
        name = self._name(table)
        rows: dict[bytes, tuple[list[Any], list[Any], list[int]]] = {}
        for m in mutations:
            puts, deletes, weight = rows.setdefault(m.row, ([], [], [len(m.row)]))
            for column, max_ts in m.deletes:
                self._check_ts(max_ts)
                _check_qualified(column)
                deletes.append(_column(column, max_ts))
                weight[0] += _MUTATION_OVERHEAD + len(column)
            for column, ts, value in m.puts:
                self._check_ts(ts)
                _check_qualified(column)
                family, qualifier = split_column(column)
                puts.append(_t2.TColumnValue(family=_enc(family), qualifier=_enc(qualifier),
                                             value=bytes(value), timestamp=ts))
                weight[0] += _MUTATION_OVERHEAD + len(column) + len(value)
        if len(rows) == 1:
            [(row, (puts, deletes, weight))] = rows.items()
            changes = _row_mutations(row, puts, deletes)
            for [one] in self._chunked(table, [(row, weight[0], changes)] if changes else []):
                self._call(table, _calling("mutateRow", name, one))
            return
        deletions = [
            (row, weight[0], _t2.TDelete(row=row, columns=deletes, deleteType=_DELETE_COLUMNS))
            for row, (_, deletes, weight) in rows.items() if deletes
        ]
        for chunk in self._chunked(table, deletions):
            failed = self._call(table, _calling("deleteMultiple", name, chunk))
            if failed:
                raise StoreUnavailable(
                    f"{self._where} did not apply {len(failed)} deletes of table {table!r}")
        additions = [(row, weight[0], _t2.TPut(row=row, columnValues=puts))
                     for row, (puts, _, weight) in rows.items() if puts]
        for chunk in self._chunked(table, additions):
            self._call(table, _calling("putMultiple", name, chunk))

    def check_and_set(
        self,
        table: str,
        row: bytes,
        column: str,
        expected: bytes | None,
        new: bytes,
        puts: Sequence[tuple[str, int, bytes]] = (),
        *,
        deletes: Sequence[tuple[str, int]] = (),
    ) -> bool:
        """Compare-and-set of ``(row, column)`` with *puts* and *deletes* of the same
        row in the same atomic step: one ``checkAndMutate`` (``atomic_row_cas``;
        :class:`percolator._store.CasDeletes`). A put at timestamp 0 in the compared
        cell's family is written at the compared cell's new timestamp (see the module
        docstring); every other put at its own."""
        if _metrics._enabled:
            next(REQUESTS.check_and_set)
        name = self._name(table)
        _check_cas(column, expected, new)
        family, qualifier = split_column(column)
        fam, qual = _enc(family), _enc(qualifier)
        cells = [_t2.TColumnValue(family=fam, qualifier=qual, value=bytes(new))]
        for put_column, ts, value in puts:
            self._check_ts(ts)
            _check_qualified(put_column)
            put_family, put_qualifier = split_column(put_column)
            cells.append(_t2.TColumnValue(
                family=_enc(put_family), qualifier=_enc(put_qualifier), value=bytes(value),
                timestamp=_put_timestamp(ts, put_family, family)))
        removed = []
        for delete_column, max_ts in deletes:
            self._check_ts(max_ts)
            _check_qualified(delete_column)
            removed.append(_column(delete_column, max_ts))
        changes = _row_mutations(row, cells, removed)
        # HBase reads an empty expected value as "absent" (refused above as a value).
        old = b"" if expected is None else bytes(expected)
        return bool(self._call(
            table,
            lambda client: client.checkAndMutate(name, row, fam, qual, _EQUAL, old, changes),
            safe=False,
        ))

    def delete_if(self, table: str, row: bytes, column: str, expected: bytes) -> bool:
        """Remove every version of ``(row, column)`` if its latest value is *expected*:
        one ``checkAndMutate`` (:class:`percolator._store.ConditionalDelete`)."""
        name = self._name(table)
        _check_cas(column, expected, b"-")
        family, qualifier = split_column(column)
        changes = _row_mutations(row, [], [_column(column)])
        return bool(self._call(
            table,
            lambda client: client.checkAndMutate(
                name, row, _enc(family), _enc(qualifier), _EQUAL, bytes(expected), changes),
            safe=False,
        ))

    def increment(self, table: str, row: bytes, column: str, amount: int) -> int:
        """Add *amount* to the 64-bit big-endian counter ``(row, column)`` (absent: 0)
        and return the new value: one ``increment``."""
        if _metrics._enabled:
            next(REQUESTS.increment)
        name = self._name(table)
        _check_qualified(column)
        check_increment_amount(amount)
        family, qualifier = split_column(column)
        change = _t2.TIncrement(row=row, columns=[_t2.TColumnIncrement(
            family=_enc(family), qualifier=_enc(qualifier), amount=amount)], returnResults=True)
        result = self._call(table, lambda client: client.increment(name, change), safe=False)
        [cell] = result.columnValues
        return int.from_bytes(cell.value, "big", signed=True)


def _calling(method: str, *args: Any) -> Callable[[Any], Any]:
    """The work ``client.method(*args)`` for :meth:`HBaseStore._call`."""
    return lambda client: getattr(client, method)(*args)


def _put_timestamp(ts: int, put_family: str, compared_family: str) -> int | None:
    """The ``TColumnValue`` timestamp of a put of ``check_and_set`` (None: server time).

    A put at 0 in the compared cell's family, which keeps one version (another lock
    cell of the row, freed by the commit point), takes the server time the compared
    cell gets: such cells carry server time on HBase, so one written at 0 would sit
    under its current version, unseen. Every other put keeps its timestamp, 0 included
    (0 is a timestamp, not "unset")."""
    return None if ts == 0 and put_family == compared_family else ts


def _row_mutations(row: bytes, puts: list[Any], deletes: list[Any]) -> Any:
    """One row's ``TRowMutations``: the deletes (every version at or below each
    column's timestamp; none: all of them), then the puts. None if empty."""
    changes = []
    if deletes:
        changes.append(_t2.TMutation(deleteSingle=_t2.TDelete(
            row=row, columns=deletes, deleteType=_DELETE_COLUMNS)))
    if puts:
        changes.append(_t2.TMutation(put=_t2.TPut(row=row, columnValues=puts)))
    return _t2.TRowMutations(row=row, mutations=changes) if changes else None


__all__ = ["ANSWERED", "HBaseThrift2Store", "parse_address"]
