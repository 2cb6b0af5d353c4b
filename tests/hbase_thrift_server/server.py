"""An in-memory HBase Thrift1 server with HBase's semantics, for tests.

It serves happybase's own ``Hbase.thrift`` through thriftpy2 with the transport and
protocol happybase uses by default (buffered transport, binary protocol), one thread
per connection, and keeps every table in memory. Each handler method follows what
``org.apache.hadoop.hbase.thrift.ThriftHBaseServiceHandler`` (``ThriftServerRunner``
in HBase 1.x) does with the Java client, and what the region server does with the
resulting ``Get``/``Put``/``Delete``/``Scan``:

* a column is ``family`` or ``family:qualifier``, split at the first colon
  (``CellUtil.parseColumn``);
* the ``*Ts`` calls use ``setTimeRange(0, timestamp)``: the upper bound is exclusive;
* ``getRow*`` and scanners return the newest version of each column only (the Thrift1
  ``Get``/``Scan`` keep the default of one version); ``getVer``/``getVerTs`` return up
  to ``numVersions`` versions, newest first;
* a family keeps its newest ``maxVersions`` versions. This server trims the older ones
  when it writes, as HBase does at flush and compaction time (before a flush HBase may
  still show them to a time-range read; the reference guide, "Major compactions change
  query results", calls that behaviour undefined);
* ``deleteAll*``/``isDelete`` mutations write tombstones (``Delete.addColumns``,
  ``addFamily``, whole row) that hide every version at or below their timestamp, also
  versions put *later* with such a timestamp ("Deletes mask Puts", reference guide
  §"Current Limitations"), until a major compaction (``majorCompact``) drops them;
* ``mutateRowTs`` applies a row's deletes then its puts; ``mutateRowsTs`` applies all
  puts then all deletes (as the handler does); a put with the same timestamp as an
  existing version replaces its value;
* puts and deletes without a timestamp use the server's clock in milliseconds;
* ``atomicIncrement`` adds to the newest version read as an 8-byte big-endian long
  (absent: 0; any other width is a ``DoNotRetryIOException``) and writes the sum at
  ``max(timestamp of that version + 1, now)`` (``HRegion.reckonDelta``);
* ``checkAndPut`` compares with the newest version; an absent or empty expected value
  matches a missing cell or a cell whose value is empty (``HRegion.checkAndMutate``);
  the put is written at ``max(now, timestamp of the checked cell)``;
* tables must be disabled before ``deleteTable``; a missing table is an ``IOError``
  (``TableNotFoundException``), a missing family too (``NoSuchColumnFamilyException``);
  ``createTable`` of an existing table raises ``AlreadyExists``;
* scanners: ``startRow`` inclusive, ``stopRow`` exclusive (but ``startRow == stopRow``
  reads that one row, ``Scan.isGetScan``), a snapshot taken when the
  scanner opens (the region's MVCC read point), ``scannerGetList`` returns ``[]`` at the
  end, an unknown scanner id is an ``IllegalArgument``;
* tables in namespaces (``ns:table``) need the namespace to exist; only ``default`` and
  ``hbase`` exist unless the server is started with ``--namespace NS``.

* a family's ``timeToLive`` (seconds; ``<= 0`` means forever, as
  ``ThriftUtilities.colDescFromThrift`` maps it) hides cells whose timestamp, read as
  milliseconds, is older than that; ``compression`` and ``bloomFilterType`` must name an
  algorithm HBase knows (``Compression.getCompressionAlgorithmByName``,
  ``BloomType.valueOf``), else an ``IllegalArgument``; the descriptor is kept as sent and
  returned by ``getColumnDescriptors`` (tests assert on what a client sent).

Faults (:class:`Faults`, ``--fault`` on the command line), each something a real
cluster does that a single in-memory process never would:

* ``cas-replay``: ``checkAndPut`` applies, then answers False: what the Thrift server's
  own HBase client returns when its first attempt applied, the response was lost (a
  slow region server, a region move) and it retried without a nonce;
* ``cas-drop``: a ``checkAndPut`` that applies (or any, not applying it, ``apply=0``),
  then the connection is closed without an answer;
* ``create-race``: another client creates the table (with the same families) the
  moment our ``createTable`` of it arrives, after the handler's ``tableExists`` check:
  ``IOError(TableExistsException)`` (``create-race:at=check``: before that check,
  ``AlreadyExists``); ``createTable`` of a table that existed before raises the same;
* ``--idle-timeout S``: connections idle for S seconds are closed by the server
  (``hbase.thrift.server.socket.read.timeout``, 60 s by default);
* ``--scanner-expiry S``: a scanner not used for S seconds is forgotten (HBase 2.4+: twice
  ``hbase.client.scanner.timeout.period``, 120 s), and then is "invalid";
* ``--latency S``: every call takes S seconds more (a network and a region server),
  so concurrent callers overlap as they do on a real cluster;
* ``--servers N``: N Thrift servers of the same tables (each with its own scanners, whose
  ids collide) behind a round-robin TCP proxy, as behind a load balancer;
* ``--max-request-bytes N``: a mutation request over N bytes closes the connection
  without an answer (libthrift 0.14+ ``TConfiguration.maxMessageSize``, 100 MB);
* ``--transport framed``, ``--protocol compact``: the other Thrift1 server modes.

Regions: ``getTableRegions`` reports a table cut every 100 rows (the whole table is served
by this one process whatever the regions). Not reproduced: filter strings
(``TScan.filterString`` raises an ``IOError`` saying so), region moves and splits as
events, security.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import logging
import os
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import happybase
import thriftpy2
from thriftpy2.protocol import TBinaryProtocolFactory, TCompactProtocolFactory
from thriftpy2.server import TThreadedServer
from thriftpy2.thrift import TApplicationException, TProcessor
from thriftpy2.transport import (
    TBufferedTransportFactory,
    TFramedTransportFactory,
    TServerSocket,
    TTransportException,
)

logger = logging.getLogger(__name__)

HBASE_THRIFT = os.path.join(os.path.dirname(happybase.__file__), "Hbase.thrift")
"""happybase's bundled Thrift1 IDL, the one served here."""

hb: Any = sys.modules.get("Hbase_thrift") or thriftpy2.load(
    HBASE_THRIFT, module_name="Hbase_thrift"
)  # the module happybase itself loaded, so its structs are ours

LATEST_TIMESTAMP = 2**63 - 1
"""``HConstants.LATEST_TIMESTAMP``: a put or delete at it gets the server time."""

FOREVER = 2**31 - 1
"""``HConstants.FOREVER``: a family's time to live when it has none."""
COMPRESSIONS = {"none", "gz", "lzo", "snappy", "lz4", "bzip2", "zstd", "brotli"}
BLOOM_TYPES = {"NONE", "ROW", "ROWCOL", "ROWPREFIX_FIXED_LENGTH"}

_TABLE_QUALIFIER = re.compile(rb"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_NAMESPACE = re.compile(rb"^[A-Za-z0-9_]+$")

Col = tuple[bytes, bytes]
F = TypeVar("F", bound=Callable[..., Any])


def _now_ms() -> int:
    return int(time.time() * 1000)


def _text(value: str | bytes) -> str:
    """A Thrift string field (bytes: the server does not decode them)."""
    return value.decode() if isinstance(value, bytes) else value


def parse_column(column: bytes) -> tuple[bytes, bytes | None]:
    """``CellUtil.parseColumn``: split *column* at its first colon; no colon: family only."""
    family, sep, qualifier = column.partition(b":")
    return (family, qualifier) if sep else (family, None)


def io_error(message: str) -> Any:
    return hb.IOError(message=message)


class DropConnection(TTransportException):  # type: ignore[misc]
    """Raised by a handler method: the server closes the connection without answering."""


@dataclass
class Rule:
    """When a fault fires: on calls whose value starts with one of *prefixes* (none:
    any value), after the first *skip* of them, the next *times* (0: no limit), or
    every *every*-th one."""

    prefixes: tuple[bytes, ...] = ()
    skip: int = 0
    times: int = 0
    every: int = 0
    apply: bool = True
    seen: int = 0
    fired: int = 0

    @classmethod
    def parse(cls, options: Iterable[str]) -> Rule:
        rule = cls()
        for option in options:
            key, _, value = option.partition("=")
            if key == "prefix":
                rule.prefixes = tuple(bytes.fromhex(p) for p in value.split(","))
            elif key in ("skip", "times", "every"):
                setattr(rule, key, int(value))
            elif key == "apply":
                rule.apply = value not in ("0", "false", "no")
            else:
                raise ValueError(f"unknown fault option {option!r}")
        return rule

    def fires(self, value: bytes) -> bool:
        if self.prefixes and not value.startswith(self.prefixes):
            return False
        self.seen += 1
        if self.seen <= self.skip:
            return False
        if self.every:
            hit = self.seen % self.every == 0
        else:
            hit = not self.times or self.fired < self.times
        self.fired += hit
        return hit


@dataclass
class Faults:
    """The faults a handler plays (see the module docstring); none by default."""

    cas_replay: Rule | None = None
    cas_drop: Rule | None = None
    create_race: str | None = None
    """Where another client's create of the same table lands: ``"check"`` (before the
    handler's ``tableExists``) or ``"create"`` (between it and ``createTable``)."""
    scanner_expiry: float | None = None
    max_request_bytes: int | None = None
    latency: float = 0.0

    @classmethod
    def parse(cls, specs: Iterable[str]) -> Faults:
        """Faults from ``NAME[:key=value...]`` strings: ``cas-replay``, ``cas-drop``
        (options ``prefix=HEX``, ``skip=N``, ``times=N``, ``every=N``, ``apply=0``),
        ``create-race``."""
        faults = cls()
        for spec in specs:
            name, *options = spec.split(":")
            if name == "cas-replay":
                faults.cas_replay = Rule.parse(options)
            elif name == "cas-drop":
                faults.cas_drop = Rule.parse(options)
            elif name == "create-race" and options in ([], ["at=check"], ["at=create"]):
                faults.create_race = options[0].removeprefix("at=") if options else "create"
            else:
                raise ValueError(f"unknown fault {spec!r}")
        return faults


@dataclass
class Family:
    name: bytes
    max_versions: int
    descriptor: Any
    ttl_ms: int | None = None


@dataclass
class Row:
    cells: dict[Col, dict[int, bytes]] = field(default_factory=dict)
    column_tombstones: dict[Col, int] = field(default_factory=dict)
    family_tombstones: dict[bytes, int] = field(default_factory=dict)
    row_tombstone: int = -1

    def tombstone(self, col: Col) -> int:
        return max(
            self.row_tombstone,
            self.family_tombstones.get(col[0], -1),
            self.column_tombstones.get(col, -1),
        )

    def is_empty(self) -> bool:
        return not any(self.cells.values())


@dataclass
class Table:
    name: bytes
    families: dict[bytes, Family]
    enabled: bool = True
    rows: dict[bytes, Row] = field(default_factory=dict)
    family_rows: dict[bytes, set[bytes]] = field(default_factory=dict)
    """Per family, the rows that have cells or delete markers of it: HBase keeps each
    family in its own store files, so a scan restricted to some families reads only
    theirs (what Percolator's notify family relies on). Rows leave at a major
    compaction, as their cells and markers leave the store files."""


@dataclass
class Selection:
    """What a ``Get``/``Scan`` selects: per family ``None`` (all) or a set of qualifiers."""

    families: dict[bytes, set[bytes] | None]
    time_max: int = LATEST_TIMESTAMP  # exclusive
    max_versions: int = 1

    @classmethod
    def from_columns(
        cls, columns: Iterable[bytes] | None, time_max: int, max_versions: int = 1
    ) -> Selection:
        families: dict[bytes, set[bytes] | None] = {}
        for column in columns or ():
            family, qualifier = parse_column(column)
            if qualifier is None:
                families[family] = None  # Get.addFamily replaces earlier addColumn
            else:
                quals = families.get(family)
                if quals is None:
                    quals = set()  # Get.addColumn after addFamily narrows to the column
                    families[family] = quals
                quals.add(qualifier)
        return cls(families, time_max, max_versions)


def _declared(func: F) -> F:
    """Turn unexpected exceptions into ``TApplicationException`` as Java Thrift does."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        latency = args[0].faults.latency
        if latency:
            time.sleep(latency)  # outside the lock, as a network round trip is
        try:
            return func(*args, **kwargs)
        except (hb.IOError, hb.IllegalArgument, hb.AlreadyExists, TApplicationException,
                DropConnection):
            raise
        except Exception as e:
            logger.exception("internal error in %s", func.__name__)
            raise TApplicationException(TApplicationException.INTERNAL_ERROR, repr(e)) from e

    return wrapper  # type: ignore[return-value]


class HBaseHandler:
    """The Thrift1 ``Hbase`` service over in-memory tables (one lock for all state)."""

    def __init__(
        self,
        namespaces: Iterable[str] = (),
        faults: Faults | None = None,
        cluster: HBaseHandler | None = None,
    ) -> None:
        """*cluster*: another handler whose tables this one serves too (a second Thrift
        server of the same HBase: same tables, its own scanners)."""
        self._lock: threading.RLock = threading.RLock() if cluster is None else cluster._lock
        self._tables: dict[bytes, Table] = {} if cluster is None else cluster._tables
        self._namespaces = {b"default", b"hbase", *(ns.encode() for ns in namespaces)}
        self._scanners: dict[int, list[Any]] = {}
        self._scanner_used: dict[int, float] = {}
        self._next_scanner = 1
        self.faults = faults or Faults()

    def _check_request_size(self, size: int) -> None:
        cap = self.faults.max_request_bytes
        if cap is not None and size > cap:
            logger.warning("request of %d bytes over the cap of %d: connection closed", size, cap)
            raise DropConnection(message=f"MaxMessageSize reached: {size} > {cap}")

    # ---- helpers --------------------------------------------------------------

    @staticmethod
    def _normalise(name: bytes) -> bytes:
        return name[len(b"default:") :] if name.startswith(b"default:") else name

    def _table(self, name: bytes, *, enabled: bool = True) -> Table:
        table = self._tables.get(self._normalise(name))
        if table is None:
            raise io_error(f"org.apache.hadoop.hbase.TableNotFoundException: {name.decode()}")
        if enabled and not table.enabled:
            raise io_error(
                f"org.apache.hadoop.hbase.TableNotEnabledException: {name.decode()} is disabled"
            )
        return table

    @staticmethod
    def _family(table: Table, family: bytes) -> Family:
        fam = table.families.get(family)
        if fam is None:
            raise io_error(
                "org.apache.hadoop.hbase.regionserver.NoSuchColumnFamilyException: "
                f"Column family {family.decode(errors='replace')} does not exist in region "
                f"of table {table.name.decode()}"
            )
        return fam

    def _check_selection(self, table: Table, sel: Selection) -> None:
        for family in sel.families:
            self._family(table, family)

    @staticmethod
    def _versions(
        row: Row, col: Col, time_max: int, ttl_ms: int | None = None
    ) -> list[tuple[int, bytes]]:
        """Visible versions of *col* with timestamp < *time_max*, newest first (and,
        with a *ttl_ms*, not older than that many milliseconds before now)."""
        stone = row.tombstone(col)
        if ttl_ms is not None:
            stone = max(stone, _now_ms() - ttl_ms - 1)
        return sorted(
            ((ts, v) for ts, v in row.cells.get(col, {}).items() if stone < ts < time_max),
            reverse=True,
        )

    def _select(self, table: Table, row_key: bytes, sel: Selection) -> list[tuple[Col, int, bytes]]:
        """Cells of one row chosen by *sel*, sorted by column then newest first."""
        row = table.rows.get(row_key)
        if row is None:
            return []
        out: list[tuple[Col, int, bytes]] = []
        for col in sorted(row.cells):
            if sel.families:
                if col[0] not in sel.families:
                    continue
                quals = sel.families[col[0]]
                if quals is not None and col[1] not in quals:
                    continue
            family = table.families[col[0]]
            limit = min(sel.max_versions, family.max_versions)
            for ts, value in self._versions(row, col, sel.time_max, family.ttl_ms)[:limit]:
                out.append((col, ts, value))
        return out

    @staticmethod
    def _row_result(
        row_key: bytes, cells: list[tuple[Col, int, bytes]], sort_columns: bool = False
    ) -> Any:
        if sort_columns:
            return hb.TRowResult(
                row=row_key,
                sortedColumns=[
                    hb.TColumn(columnName=f + b":" + q, cell=hb.TCell(value=v, timestamp=ts))
                    for (f, q), ts, v in cells
                ],
            )
        columns = {f + b":" + q: hb.TCell(value=v, timestamp=ts) for (f, q), ts, v in cells}
        return hb.TRowResult(row=row_key, columns=columns)

    def _put(self, table: Table, row_key: bytes, col: Col, ts: int, value: bytes) -> None:
        fam = self._family(table, col[0])
        row = table.rows.setdefault(row_key, Row())
        if ts <= row.tombstone(col):
            return  # masked by a delete marker until a major compaction
        versions = row.cells.setdefault(col, {})
        versions[ts] = value
        table.family_rows.setdefault(col[0], set()).add(row_key)
        if len(versions) > fam.max_versions:
            for old in sorted(versions)[: len(versions) - fam.max_versions]:
                del versions[old]

    def _purge(self, table: Table, row_key: bytes) -> None:
        row = table.rows.get(row_key)
        if row is None:
            return
        for col, versions in row.cells.items():
            stone = row.tombstone(col)
            for ts in [ts for ts in versions if ts <= stone]:
                del versions[ts]

    def _delete(self, table: Table, row_key: bytes, column: bytes | None, ts: int) -> None:
        """``Delete.addColumns``/``addFamily``/whole row at *ts* (versions <= ts)."""
        if ts == LATEST_TIMESTAMP:
            ts = _now_ms()
        row = table.rows.setdefault(row_key, Row())
        if column is None:
            row.row_tombstone = max(row.row_tombstone, ts)
        else:
            family, qualifier = parse_column(column)
            self._family(table, family)
            if qualifier is None:
                row.family_tombstones[family] = max(row.family_tombstones.get(family, -1), ts)
            else:
                col = (family, qualifier)
                row.column_tombstones[col] = max(row.column_tombstones.get(col, -1), ts)
        self._purge(table, row_key)

    # ---- administration -------------------------------------------------------

    @_declared
    def getTableNames(self) -> list[bytes]:
        with self._lock:
            return sorted(self._tables)

    @_declared
    def createTable(self, tableName: bytes, columnFamilies: list[Any]) -> None:
        with self._lock:
            name = self._normalise(tableName)
            namespace, sep, qualifier = name.rpartition(b":")
            if not _TABLE_QUALIFIER.match(qualifier) or (sep and not _NAMESPACE.match(namespace)):
                # TableName.valueOf throws outside the handler's try: an internal error.
                raise ValueError(f"Illegal table name {tableName!r}")
            if sep and namespace not in self._namespaces:
                raise io_error(
                    "org.apache.hadoop.hbase.NamespaceNotFoundException: " + namespace.decode()
                )
            if name in self._tables:
                self._refuse_existing(name)
            families: dict[bytes, Family] = {}
            for desc in columnFamilies or ():
                compression = _text(desc.compression or "NONE").lower()
                bloom = _text(desc.bloomFilterType or "NONE")
                if compression not in COMPRESSIONS:
                    raise hb.IllegalArgument(
                        message="java.lang.IllegalArgumentException: "
                        f"Unsupported compression algorithm name: {compression}"
                    )
                if bloom not in BLOOM_TYPES:
                    raise hb.IllegalArgument(
                        message="java.lang.IllegalArgumentException: No enum constant "
                        f"org.apache.hadoop.hbase.regionserver.BloomType.{bloom}"
                    )
                if not desc.name:
                    raise hb.IllegalArgument(message="column name is empty")
                family = parse_column(desc.name)[0]
                if desc.maxVersions is None or desc.maxVersions <= 0:
                    raise hb.IllegalArgument(
                        message="java.lang.IllegalArgumentException: "
                        "Maximum versions must be positive"
                    )
                ttl = desc.timeToLive if desc.timeToLive and desc.timeToLive > 0 else FOREVER
                stored = hb.ColumnDescriptor(
                    name=family + b":",
                    maxVersions=desc.maxVersions,
                    compression=compression.upper(),
                    inMemory=bool(desc.inMemory),
                    bloomFilterType=bloom,
                    bloomFilterVectorSize=0,
                    bloomFilterNbHashes=0,
                    blockCacheEnabled=bool(desc.blockCacheEnabled),
                    timeToLive=ttl,
                )
                families[family] = Family(
                    family, desc.maxVersions, stored, None if ttl >= FOREVER else ttl * 1000
                )
            if not families:
                raise io_error(
                    "org.apache.hadoop.hbase.DoNotRetryIOException: "
                    "Table should have at least one column family."
                )
            self._tables[name] = Table(name, families)
            if self.faults.create_race is not None:  # that create was another client's
                self._refuse_existing(name)

    def _refuse_existing(self, name: bytes) -> None:
        """``createTable``'s answer for a table that exists: ``AlreadyExists`` from the
        handler's own ``tableExists`` check, ``IOError(TableExistsException)`` from a
        create that another client's overtook after that check."""
        if self.faults.create_race == "create":
            raise io_error(f"org.apache.hadoop.hbase.TableExistsException: {name.decode()}")
        raise hb.AlreadyExists(message="table name already in use")

    @_declared
    def deleteTable(self, tableName: bytes) -> None:
        with self._lock:
            table = self._tables.get(self._normalise(tableName))
            if table is None:
                raise io_error("table does not exist")
            if table.enabled:
                raise io_error(
                    f"org.apache.hadoop.hbase.TableNotDisabledException: {tableName.decode()}"
                )
            del self._tables[table.name]

    @_declared
    def enableTable(self, tableName: bytes) -> None:
        with self._lock:
            table = self._table(tableName, enabled=False)
            if table.enabled:
                raise io_error(
                    f"org.apache.hadoop.hbase.TableNotDisabledException: {tableName.decode()}"
                )
            table.enabled = True

    @_declared
    def disableTable(self, tableName: bytes) -> None:
        with self._lock:
            table = self._table(tableName, enabled=False)
            if not table.enabled:
                raise io_error(
                    f"org.apache.hadoop.hbase.TableNotEnabledException: {tableName.decode()}"
                )
            table.enabled = False

    @_declared
    def isTableEnabled(self, tableName: bytes) -> bool:
        with self._lock:
            return self._table(tableName, enabled=False).enabled

    @_declared
    def getColumnDescriptors(self, tableName: bytes) -> dict[bytes, Any]:
        with self._lock:
            table = self._table(tableName, enabled=False)
            return {f.name + b":": f.descriptor for f in table.families.values()}

    REGION_ROWS = 100
    """Rows per region that ``getTableRegions`` reports (see there)."""

    @_declared
    def getTableRegions(self, tableName: bytes) -> list[Any]:
        """The table's regions as if HBase had split it every :attr:`REGION_ROWS` rows
        as it grew (cut at the current rows; HBase splits by size): parallel readers
        see several regions, as on a cluster, while every call serves the whole table."""
        with self._lock:
            table = self._table(tableName, enabled=False)
            keys = sorted(table.rows)[self.REGION_ROWS :: self.REGION_ROWS]
            bounds = list(zip([b"", *keys], [*keys, b""], strict=True))
            return [
                hb.TRegionInfo(
                    startKey=start,
                    endKey=end,
                    id=i + 1,
                    name=table.name + b"," + start + b",%d" % (i + 1),
                    version=1,
                    serverName=b"localhost",
                    port=0,
                )
                for i, (start, end) in enumerate(bounds)
            ]

    @_declared
    def compact(self, tableNameOrRegionName: bytes) -> None:
        with self._lock:
            self._table(tableNameOrRegionName, enabled=False)

    @_declared
    def majorCompact(self, tableNameOrRegionName: bytes) -> None:
        """Drop delete markers and the cells they hide, so later puts are visible again."""
        with self._lock:
            table = self._table(tableNameOrRegionName, enabled=False)
            for key in list(table.rows):
                self._purge(table, key)
                row = table.rows[key]
                row.column_tombstones.clear()
                row.family_tombstones.clear()
                row.row_tombstone = -1
                if row.is_empty():
                    del table.rows[key]
            for family, keys in table.family_rows.items():
                keys.intersection_update([k for k in keys if k in table.rows and any(
                    v for col, v in table.rows[k].cells.items() if col[0] == family)])

    # ---- reads ----------------------------------------------------------------

    def _cells_of_column(
        self, tableName: bytes, row: bytes, column: bytes, time_max: int, versions: int
    ) -> list[Any]:
        with self._lock:
            table = self._table(tableName)
            if versions <= 0:
                raise io_error("java.io.IOException: maxVersions must be positive")
            sel = Selection.from_columns([column], time_max, versions)
            self._check_selection(table, sel)
            return [hb.TCell(value=v, timestamp=ts) for _, ts, v in self._select(table, row, sel)]

    @_declared
    def get(self, tableName: bytes, row: bytes, column: bytes, attributes: Any = None) -> Any:
        return self._cells_of_column(tableName, row, column, LATEST_TIMESTAMP, 1)

    @_declared
    def getVer(
        self, tableName: bytes, row: bytes, column: bytes, numVersions: int, attributes: Any = None
    ) -> Any:
        return self._cells_of_column(tableName, row, column, LATEST_TIMESTAMP, numVersions)

    @_declared
    def getVerTs(
        self,
        tableName: bytes,
        row: bytes,
        column: bytes,
        timestamp: int,
        numVersions: int,
        attributes: Any = None,
    ) -> Any:
        return self._cells_of_column(tableName, row, column, timestamp, numVersions)

    def _rows(
        self, tableName: bytes, rows: list[bytes], columns: list[bytes] | None, timestamp: int
    ) -> list[Any]:
        with self._lock:
            table = self._table(tableName)
            sel = Selection.from_columns(columns, timestamp)
            self._check_selection(table, sel)
            out = []
            for key in rows or ():
                cells = self._select(table, key, sel)
                if cells:  # rowResultFromHBase skips empty results
                    out.append(self._row_result(key, cells))
            return out

    @_declared
    def getRow(self, tableName: bytes, row: bytes, attributes: Any = None) -> Any:
        return self._rows(tableName, [row], None, LATEST_TIMESTAMP)

    @_declared
    def getRowWithColumns(
        self, tableName: bytes, row: bytes, columns: list[bytes], attributes: Any = None
    ) -> Any:
        return self._rows(tableName, [row], columns, LATEST_TIMESTAMP)

    @_declared
    def getRowTs(self, tableName: bytes, row: bytes, timestamp: int, attributes: Any = None) -> Any:
        return self._rows(tableName, [row], None, timestamp)

    @_declared
    def getRowWithColumnsTs(
        self,
        tableName: bytes,
        row: bytes,
        columns: list[bytes],
        timestamp: int,
        attributes: Any = None,
    ) -> Any:
        return self._rows(tableName, [row], columns, timestamp)

    @_declared
    def getRows(self, tableName: bytes, rows: list[bytes], attributes: Any = None) -> Any:
        return self._rows(tableName, rows, None, LATEST_TIMESTAMP)

    @_declared
    def getRowsWithColumns(
        self, tableName: bytes, rows: list[bytes], columns: list[bytes], attributes: Any = None
    ) -> Any:
        return self._rows(tableName, rows, columns, LATEST_TIMESTAMP)

    @_declared
    def getRowsTs(
        self, tableName: bytes, rows: list[bytes], timestamp: int, attributes: Any = None
    ) -> Any:
        return self._rows(tableName, rows, None, timestamp)

    @_declared
    def getRowsWithColumnsTs(
        self,
        tableName: bytes,
        rows: list[bytes],
        columns: list[bytes],
        timestamp: int,
        attributes: Any = None,
    ) -> Any:
        return self._rows(tableName, rows, columns, timestamp)

    # ---- writes ---------------------------------------------------------------

    @staticmethod
    def _size(row: bytes, mutations: list[Any] | None) -> int:
        """About how many bytes a row's mutations take on the wire."""
        return len(row) + sum(
            16 + len(m.column or b"") + len(m.value or b"") for m in mutations or ()
        )

    def _split_mutations(
        self, table: Table, mutations: list[Any], *, batch: bool
    ) -> tuple[list[tuple[Col, bytes]], list[bytes]]:
        puts: list[tuple[Col, bytes]] = []
        deletes: list[bytes] = []
        for m in mutations or ():
            column = m.column or b""
            family, qualifier = parse_column(column)
            if m.isDelete:
                self._family(table, family)
                deletes.append(column)
            elif qualifier is None:
                if batch:
                    # HBase 2.6's handler throws IllegalArgumentException outside its
                    # try/catch: Java Thrift answers an internal error, not IllegalArgument.
                    raise TApplicationException(
                        TApplicationException.INTERNAL_ERROR,
                        "java.lang.IllegalArgumentException: Invalid famAndQf provided.",
                    )
                logger.warning("No column qualifier specified; put of %r ignored", column)
            else:
                self._family(table, family)
                puts.append(((family, qualifier), m.value if m.value is not None else b""))
        return puts, deletes

    @_declared
    def mutateRow(
        self, tableName: bytes, row: bytes, mutations: list[Any], attributes: Any = None
    ) -> None:
        self.mutateRowTs(tableName, row, mutations, LATEST_TIMESTAMP, attributes)

    @_declared
    def mutateRowTs(
        self,
        tableName: bytes,
        row: bytes,
        mutations: list[Any],
        timestamp: int,
        attributes: Any = None,
    ) -> None:
        self._check_request_size(self._size(row, mutations))
        with self._lock:
            table = self._table(tableName)
            puts, deletes = self._split_mutations(table, mutations, batch=False)
            for column in deletes:  # table.delete(delete) then table.put(put)
                self._delete(table, row, column, timestamp)
            ts = _now_ms() if timestamp == LATEST_TIMESTAMP else timestamp
            for col, value in puts:
                self._put(table, row, col, ts, value)

    @_declared
    def mutateRows(self, tableName: bytes, rowBatches: list[Any], attributes: Any = None) -> None:
        self.mutateRowsTs(tableName, rowBatches, LATEST_TIMESTAMP, attributes)

    @_declared
    def mutateRowsTs(
        self, tableName: bytes, rowBatches: list[Any], timestamp: int, attributes: Any = None
    ) -> None:
        self._check_request_size(sum(self._size(b.row, b.mutations) for b in rowBatches or ()))
        with self._lock:
            if self._normalise(tableName) not in self._tables:
                # HBase 2.6 batches the puts: the cause, TableNotFoundException, is
                # quoted by its message alone (the table name), once per row.
                n = len(rowBatches or ())
                raise io_error(
                    "org.apache.hadoop.hbase.client.RetriesExhaustedWithDetailsException: "
                    f"Failed {n} action{'s' * (n != 1)}: {tableName.decode()}: "
                    f"{n} time{'s' * (n != 1)}, servers with issues: null"
                )
            table = self._table(tableName)
            split = [
                (b.row, *self._split_mutations(table, b.mutations, batch=True))
                for b in rowBatches or ()
            ]
            ts = _now_ms() if timestamp == LATEST_TIMESTAMP else timestamp
            for row, puts, _ in split:  # table.put(puts) then table.delete(deletes)
                for col, value in puts:
                    self._put(table, row, col, ts, value)
            for row, _, deletes in split:
                for column in deletes:
                    self._delete(table, row, column, timestamp)

    @_declared
    def deleteAll(
        self, tableName: bytes, row: bytes, column: bytes, attributes: Any = None
    ) -> None:
        self.deleteAllTs(tableName, row, column, LATEST_TIMESTAMP, attributes)

    @_declared
    def deleteAllTs(
        self, tableName: bytes, row: bytes, column: bytes, timestamp: int, attributes: Any = None
    ) -> None:
        with self._lock:
            self._delete(self._table(tableName), row, column, timestamp)

    @_declared
    def deleteAllRow(self, tableName: bytes, row: bytes, attributes: Any = None) -> None:
        self.deleteAllRowTs(tableName, row, LATEST_TIMESTAMP, attributes)

    @_declared
    def deleteAllRowTs(
        self, tableName: bytes, row: bytes, timestamp: int, attributes: Any = None
    ) -> None:
        with self._lock:
            self._delete(self._table(tableName), row, None, timestamp)

    @_declared
    def atomicIncrement(self, tableName: bytes, row: bytes, column: bytes, value: int) -> int:
        with self._lock:
            table = self._table(tableName)
            family, qualifier = parse_column(column)
            col = (family, qualifier or b"")
            fam = self._family(table, family)
            r = table.rows.get(row)
            current = self._versions(r, col, LATEST_TIMESTAMP, fam.ttl_ms) if r else []
            if current and len(current[0][1]) != 8:  # HRegion.getLongValue
                raise io_error(
                    "org.apache.hadoop.hbase.DoNotRetryIOException: "
                    f"Field is not a long, it's {len(current[0][1])} bytes wide"
                )
            total = (struct.unpack(">q", current[0][1])[0] if current else 0) + value
            total = (total + 2**63) % 2**64 - 2**63  # Java long arithmetic wraps
            # HRegion.reckonDelta: max(timestamp of the current cell + 1, now)
            ts = max(_now_ms(), current[0][0] + 1) if current else _now_ms()
            self._put(table, row, col, ts, struct.pack(">q", total))
            return total

    @_declared
    def checkAndPut(
        self,
        tableName: bytes,
        row: bytes,
        column: bytes,
        value: bytes | None,
        mput: Any,
        attributes: Any = None,
    ) -> bool:
        self._check_request_size(self._size(row, [mput]))
        with self._lock:
            table = self._table(tableName)
            family, qualifier = parse_column(column)
            fam = self._family(table, family)
            put_family, put_qualifier = parse_column(mput.column or b"")
            if put_qualifier is None:
                raise hb.IllegalArgument(
                    message="java.lang.ArrayIndexOutOfBoundsException: "
                    "checkAndPut mutation column has no qualifier"
                )
            self._family(table, put_family)
            r = table.rows.get(row)
            col = (family, qualifier or b"")
            current = self._versions(r, col, LATEST_TIMESTAMP, fam.ttl_ms) if r else []
            value_is_null = not value
            if not current:
                matches, cell_ts = value_is_null, 0
            elif value_is_null:
                matches, cell_ts = len(current[0][1]) == 0, current[0][0]
            else:
                matches, cell_ts = current[0][1] == value, current[0][0]
            new = mput.value if mput.value is not None else b""
            drop = self.faults.cas_drop
            # (apply=1 drops only calls that apply: what a client can tell apart)
            dropping = drop is not None and (matches or not drop.apply) and drop.fires(new)
            if matches and not (dropping and drop is not None and not drop.apply):
                ts = max(_now_ms(), cell_ts)  # "ensure write is not eclipsed"
                self._put(table, row, (put_family, put_qualifier), ts, new)
            if dropping:
                logger.warning("fault: checkAndPut on %r answered by closing the connection", row)
                raise DropConnection(message="fault: connection closed after checkAndPut")
            replay = self.faults.cas_replay
            if matches and replay is not None and replay.fires(new):
                logger.warning("fault: checkAndPut on %r applied, answered False", row)
                return False
            return matches

    # ---- scanners -------------------------------------------------------------

    def _open(
        self,
        tableName: bytes,
        start: bytes | None,
        stop: bytes | None,
        columns: list[bytes] | None,
        timestamp: int,
        *,
        prefix: bytes | None = None,
        batch_size: int | None = None,
        sort_columns: bool = False,
        reversed_: bool = False,
    ) -> int:
        with self._lock:
            table = self._table(tableName)
            sel = Selection.from_columns(columns, timestamp)
            self._check_selection(table, sel)
            if sel.families:  # only the selected families' store files
                candidates: set[bytes] = set()
                for family in sel.families:
                    candidates |= table.family_rows.get(family, set())
                keys = sorted(candidates, reverse=reversed_)
            else:
                keys = sorted(table.rows, reverse=reversed_)
            if start and stop and start == stop and not reversed_:
                stop = start + b"\0"  # HBase reads start == stop as a Get of that row
            results: list[Any] = []
            for key in keys:
                if reversed_:
                    if start and key > start:
                        continue
                    if stop and key <= stop:
                        break
                else:
                    if start and key < start:
                        continue
                    if stop and key >= stop:
                        break
                if prefix is not None and not key.startswith(prefix):
                    if key > prefix:
                        break  # WhileMatchFilter(PrefixFilter) ends the scan
                    continue
                cells = self._select(table, key, sel)
                if not cells:
                    continue
                step = batch_size if batch_size and batch_size > 0 else len(cells)
                for i in range(0, len(cells), step):
                    results.append(self._row_result(key, cells[i : i + step], sort_columns))
            scanner_id = self._next_scanner
            self._next_scanner += 1
            self._scanners[scanner_id] = results
            self._scanner_used[scanner_id] = time.monotonic()
            return scanner_id

    def _scanner(self, id: int) -> list[Any]:
        """The results left of scanner *id*; one unused for longer than the expiry is
        gone (HBase 2.4+ keeps scanners in a cache that expires after access)."""
        expiry = self.faults.scanner_expiry
        now = time.monotonic()
        if expiry is not None:
            for sid in [s for s, used in self._scanner_used.items() if now - used > expiry]:
                logger.warning("fault: scanner %d expired", sid)
                self._scanners.pop(sid, None)
                self._scanner_used.pop(sid, None)
        results = self._scanners.get(id)
        if results is None:
            raise hb.IllegalArgument(message="scanner ID is invalid")
        self._scanner_used[id] = now
        return results

    @_declared
    def scannerOpenWithScan(self, tableName: bytes, scan: Any, attributes: Any = None) -> int:
        if scan.filterString:
            raise io_error("filterString is not supported by the HBase test server")
        return self._open(
            tableName,
            scan.startRow,
            scan.stopRow,
            scan.columns,
            scan.timestamp if scan.timestamp is not None else LATEST_TIMESTAMP,
            batch_size=scan.batchSize,
            sort_columns=bool(scan.sortColumns),
            reversed_=bool(scan.reversed),
        )

    @_declared
    def scannerOpen(
        self, tableName: bytes, startRow: bytes, columns: list[bytes], attributes: Any = None
    ) -> int:
        return self._open(tableName, startRow, None, columns, LATEST_TIMESTAMP)

    @_declared
    def scannerOpenWithStop(
        self,
        tableName: bytes,
        startRow: bytes,
        stopRow: bytes,
        columns: list[bytes],
        attributes: Any = None,
    ) -> int:
        return self._open(tableName, startRow, stopRow, columns, LATEST_TIMESTAMP)

    @_declared
    def scannerOpenWithPrefix(
        self, tableName: bytes, startAndPrefix: bytes, columns: list[bytes], attributes: Any = None
    ) -> int:
        return self._open(
            tableName, startAndPrefix, None, columns, LATEST_TIMESTAMP, prefix=startAndPrefix
        )

    @_declared
    def scannerOpenTs(
        self,
        tableName: bytes,
        startRow: bytes,
        columns: list[bytes],
        timestamp: int,
        attributes: Any = None,
    ) -> int:
        return self._open(tableName, startRow, None, columns, timestamp)

    @_declared
    def scannerOpenWithStopTs(
        self,
        tableName: bytes,
        startRow: bytes,
        stopRow: bytes,
        columns: list[bytes],
        timestamp: int,
        attributes: Any = None,
    ) -> int:
        return self._open(tableName, startRow, stopRow, columns, timestamp)

    @_declared
    def scannerGetList(self, id: int, nbRows: int) -> list[Any]:
        with self._lock:
            results = self._scanner(id)
            n = max(nbRows, 0)
            batch, results[:n] = results[:n], []
            return batch

    @_declared
    def scannerGet(self, id: int) -> list[Any]:
        return self.scannerGetList(id, 1)

    @_declared
    def scannerClose(self, id: int) -> None:
        with self._lock:
            self._scanner(id)
            del self._scanners[id]
            del self._scanner_used[id]


TRANSPORTS = {"buffered": TBufferedTransportFactory, "framed": TFramedTransportFactory}
PROTOCOLS = {"binary": TBinaryProtocolFactory, "compact": TCompactProtocolFactory}


def make_server(
    host: str,
    port: int,
    namespaces: Iterable[str] = (),
    *,
    faults: Faults | None = None,
    idle_timeout: float | None = None,
    transport: str = "buffered",
    protocol: str = "binary",
    cluster: HBaseHandler | None = None,
) -> TThreadedServer:
    """A threaded Thrift1 server on *host*:*port* with *transport* and *protocol*
    (happybase's defaults: buffered, binary), playing *faults*. *idle_timeout*: seconds
    a connection may stay idle before the server closes it (None: never). *cluster*:
    serve the tables of that handler (see :class:`HBaseHandler`)."""
    processor = TProcessor(hb.Hbase, HBaseHandler(namespaces, faults, cluster))
    socket = TServerSocket(  # client_timeout is in milliseconds
        host=host, port=port, client_timeout=None if idle_timeout is None else idle_timeout * 1000
    )
    return TThreadedServer(
        processor,
        socket,
        # thriftpy2's compact protocol reads method names as bytes unless it decodes
        # strings; the handler takes either (``_text``), table and row names are binary.
        iprot_factory=PROTOCOLS[protocol](decode_response=protocol == "compact"),
        itrans_factory=TRANSPORTS[transport](),
        daemon=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.hbase_thrift_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9090)
    parser.add_argument(
        "--namespace", action="append", default=[], help="a namespace that exists (repeatable)"
    )
    parser.add_argument("--transport", choices=sorted(TRANSPORTS), default="buffered")
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), default="binary")
    parser.add_argument(
        "--fault", action="append", default=[],
        help="cas-replay|cas-drop[:prefix=HEX[,HEX...]][:skip=N][:times=N|:every=N][:apply=0], "
        "create-race",
    )
    parser.add_argument("--idle-timeout", type=float, help="close connections idle S seconds")
    parser.add_argument("--scanner-expiry", type=float, help="forget scanners unused S seconds")
    parser.add_argument("--max-request-bytes", type=int, help="drop bigger mutation requests")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to each call")
    parser.add_argument(
        "--servers", type=int, default=1,
        help="N > 1: N Thrift servers of the same tables behind a round-robin TCP proxy",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    faults = Faults.parse(args.fault)
    faults.scanner_expiry = args.scanner_expiry
    faults.max_request_bytes = args.max_request_bytes
    faults.latency = args.latency
    options: dict[str, Any] = dict(
        faults=faults, idle_timeout=args.idle_timeout, transport=args.transport,
        protocol=args.protocol,
    )
    if args.servers > 1:
        backends = []
        first: HBaseHandler | None = None
        for _ in range(args.servers):
            behind = make_server(args.host, 0, args.namespace, cluster=first, **options)
            behind.trans.listen()
            if first is None:
                first = behind.processor._handler
            backends.append(behind.trans.sock.getsockname()[:2])
            threading.Thread(target=_serve_listening, args=(behind,), daemon=True).start()
        logger.warning("%d HBase Thrift1 test servers behind a round-robin proxy on %s:%d",
                       args.servers, args.host, args.port)
        try:
            round_robin_proxy(args.host, args.port, backends)
        except KeyboardInterrupt:
            pass
        return
    server = make_server(args.host, args.port, args.namespace, **options)
    logger.warning("HBase Thrift1 test server on %s:%d", args.host, args.port)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass


def _serve_listening(server: TThreadedServer) -> None:
    """``TThreadedServer.serve`` for a server whose socket already listens."""
    while not server.closed:
        try:
            client = server.trans.accept()
        except OSError:
            return
        threading.Thread(target=server.handle, args=(client,), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def round_robin_proxy(host: str, port: int, backends: list[tuple[str, int]]) -> None:
    """Forward each connection accepted on *host*:*port* to the next of *backends* in
    turn, as a TCP load balancer in front of several Thrift servers does. Blocks."""
    listener = socket.create_server((host, port))
    turn = itertools.cycle(backends)
    while True:
        client, _ = listener.accept()
        try:
            backend = socket.create_connection(next(turn))
        except OSError:
            client.close()
            continue
        for a, b in ((client, backend), (backend, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()
