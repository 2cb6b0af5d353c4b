"""``format("percolator")``: a Percolator table as a PySpark (4.0+) Python data source.

Spark finds :class:`PercolatorDataSource` by itself through the top-level module
``pyspark_percolator`` (it looks for ``pyspark_*`` modules exposing ``DefaultSource``);
``spark.dataSource.register(PercolatorDataSource)`` works too. Where each piece runs
(pyspark 4's ``pyspark/sql/worker``): ``schema()`` and ``reader()``/``partitions()``
in short-lived Python workers the driver's JVM starts, ``read()`` in the executors'
workers with the reader pickled there, so everything a reader carries is plain data
(:class:`SourceOptions`, the start timestamp, the row ranges); nothing is shared with
the Python process that built the query.

Reading (see docs/spark.md): the start timestamp is drawn once, when Spark plans the
scan (or given with ``startTs``), and every input partition reads at it through
:class:`percolator.Snapshot`; partitions follow the store's cut points as
:func:`spark_loader.read_table` does; row-key filters are pushed down when
``spark.sql.python.filterPushdown.enabled`` is true.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import datasource as D
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

import percolator
from percolator import (
    ConflictError,
    InvalidArgument,
    PercolatorError,
    SnapshotTooOldError,
    TlsConfig,
)
from percolator.ext import (
    AlreadyLoaded,
    BulkLoad,
    LoadTxn,
    begin_or_join,
    check_column,
    internals,
    prewrite_rows,
    refresh_primary,
)
from spark_loader._changes import changes, safe_end
from spark_loader._job import (
    MAX_REJECTS_KEPT,
    LoadError,
    executor_cluster,
    local_workers_run_this_python,
)
from spark_loader._read import (
    ROW_KEY,
    Range,
    _check_start_ts,
    _read_error,
    _snapshot,
    _Spec,
    is_connect,
    plan_ranges,
)
from spark_loader._records import ColumnMap, Reject, to_cells

__all__ = ["NAME", "PercolatorChangeFeed", "PercolatorDataSource", "SourceOptions",
           "change_schema", "is_connect", "register", "snapshot_ts", "source_options"]

NAME = "percolator"
DEFAULT_PARTITIONS = 4
"""Input partitions where the store reports no cut points and none are asked for
(``numPartitions``); the planning worker cannot know the cluster's parallelism."""

# Option names are case-insensitive (Spark lower-cases them). Aliases first: what
# users of the HBase and Bigtable connectors and of JDBC would try.
_URL_KEYS = ("url", "cluster", "percolator.url")
_TABLE_KEYS = ("table", "dbtable", "path")
_CONNECT_KEYS: dict[str, tuple[str, type]] = {
    "oracle": ("oracle", str),
    "oracledeadline": ("oracle_deadline", float),
    "zookeeper": ("zookeeper", str),
    "zookeeperauth": ("zookeeper_auth", str),
    "zookeepersessiontimeout": ("zookeeper_session_timeout", float),
    "lockttl": ("lock_ttl", float),
    "lockwait": ("lock_wait", float),
    "safepointrefresh": ("safe_point_refresh", float),
}
_TLS_KEYS = {"oracle.tls": "oracle_tls", "zookeeper.tls": "zookeeper_tls"}
_OTHER_KEYS = ("columns", "rowkey", "startts", "numpartitions", "loadid", "maxrejects",
               "rejectspath", "createtable", "observe", "batchcells", "queryid",
               "checkpointlocation", "queryname", "readchangefeed", "startingts")
_KNOWN = {*_URL_KEYS, *_TABLE_KEYS, *_CONNECT_KEYS, *_OTHER_KEYS,
          *(f"{prefix}.{part}" for prefix in _TLS_KEYS for part in ("ca", "cert", "key"))}


def _bad(message: str) -> InvalidArgument:
    return InvalidArgument(f"format({NAME!r}): {message}")


def _parse(key: str, text: str, kind: type) -> Any:
    if kind is str:
        return text
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise _bad(f"option {key} must be true or false, got {text!r}")
        return text.lower() == "true"
    try:
        return kind(text)
    except ValueError:
        raise _bad(f"option {key} must be {'an integer' if kind is int else 'a number'}, "
                   f"got {text!r}") from None


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The options of one ``format("percolator")`` read or write, checked (picklable:
    it travels to every executor)."""

    url: str
    table: str
    connect: tuple[tuple[str, Any], ...]
    columns: tuple[str, ...] | None
    row_key: str
    raw: tuple[tuple[str, str], ...]
    """Every option as given (lower-cased keys), for the readers' and writers' own."""

    @classmethod
    def of(cls, options: Mapping[str, str]) -> SourceOptions:
        given = {str(k).lower(): str(v) for k, v in options.items()}
        unknown = sorted(k for k in given if k not in _KNOWN)
        if unknown:
            raise _bad(f"unknown option(s) {unknown}; known: {sorted(_KNOWN)}")
        url = next((given[k] for k in _URL_KEYS if given.get(k)), None)
        if url is None:
            raise _bad("option url (the cluster: sqlite:///path.db, hbase://host:port, "
                       "bigtable://project/instance or a published zk://host:port/chroot) "
                       "is required")
        table = next((given[k] for k in _TABLE_KEYS if given.get(k)), None)
        if table is None:
            raise _bad("option table is required (or load(\"table\"))")
        connect: dict[str, Any] = {}
        for key, (name, kind) in _CONNECT_KEYS.items():
            if key in given:
                connect[name] = _parse(key, given[key], kind)
        for prefix, name in _TLS_KEYS.items():
            parts = {p: given[f"{prefix}.{p}"] for p in ("ca", "cert", "key")
                     if f"{prefix}.{p}" in given}
            if parts:
                connect[name] = TlsConfig(**parts)
        columns = None
        if given.get("columns", "").strip():
            names = [c.strip() for c in given["columns"].split(",") if c.strip()]
            columns = tuple(check_column(c) for c in names)
            if len(set(columns)) != len(columns):
                raise _bad(f"option columns names a column twice: {list(columns)}")
        return cls(url, table, tuple(sorted(connect.items())), columns,
                   given.get("rowkey", ROW_KEY), tuple(sorted(given.items())))

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        for k, v in self.raw:
            if k == key:
                return _parse(key, v, kind)
        return default

    def cluster(self) -> percolator.Cluster:
        return percolator.connect(self.url, **dict(self.connect))


def source_options(connect_options: Mapping[str, Any]) -> dict[str, str]:
    """The data source's options for :func:`percolator.connect`'s keyword arguments
    (what ``read_table`` and the loader take as ``connect_options``)."""
    names = {name: key for key, (name, _) in _CONNECT_KEYS.items()}
    tls = {name: prefix for prefix, name in _TLS_KEYS.items()}
    out: dict[str, str] = {}
    for name, value in connect_options.items():
        if name in names:
            out[names[name]] = str(value)
        elif name in tls and isinstance(value, TlsConfig):
            for part in ("ca", "cert", "key"):
                if getattr(value, part, None) is not None:
                    out[f"{tls[name]}.{part}"] = str(getattr(value, part))
        else:
            raise _bad(f"connect option {name}={value!r:.60} has no data source option "
                       f"(known: {sorted([*names, *tls])})")
    return out


def snapshot_ts(url: str, **connect_options: Any) -> int:
    """A fresh start timestamp of the cluster at *url*: pass it as the ``startTs``
    option of several reads to read them all at one snapshot (a repeatable read)."""
    with percolator.connect(url, **connect_options) as cluster:
        return internals(cluster).timestamps.get_timestamp()


def register(spark: Any) -> None:
    """Register the data source with *spark* (``spark.dataSource.register``) and, in
    local mode with no interpreter chosen (``PYSPARK_PYTHON``, ``spark.pyspark.python``),
    have its Python workers run this interpreter.

    ``format("percolator")`` needs no registration where Spark's workers can import
    this package. A script run by an interpreter that is not ``python3`` on PATH
    (``venv/bin/python script.py`` under cron) is where it fails: the JVM looks the
    name up, and starts every worker of a source found by name, with the interpreter
    of its environment when the session started; no code of ours runs before that.
    A source registered from here carries the interpreter PySpark ships functions
    with, which this points at ``sys.executable``.
    """
    if not is_connect(spark):  # a Connect server runs the workers of its own environment
        local_workers_run_this_python(spark)
    spark.dataSource.register(PercolatorDataSource)


# --- values <-> Spark types ----------------------------------------------------------------


def _boolean(b: bytes) -> bool:
    if b not in (b"true", b"false"):
        raise ValueError("not true or false")
    return b == b"true"


_DECODERS: dict[str, Any] = {
    "binary": bytes,
    "string": lambda b: b.decode("utf-8"),
    "long": int, "int": int, "short": int, "byte": int,
    "double": float, "float": float,
    "boolean": _boolean,
    "date": lambda b: datetime.date.fromisoformat(b.decode()),
    "timestamp": lambda b: datetime.datetime.fromisoformat(b.decode()),
}
"""How a stored value becomes a value of a Spark type, by its simple name (as the
bulk loader encodes them: text as UTF-8, numbers as decimal text, booleans as
true/false, dates and times in ISO 8601)."""


def _type_name(dtype: T.DataType, field: str) -> str:
    name = str(dtype.simpleString())
    name = {"bigint": "long", "smallint": "short", "tinyint": "byte"}.get(name, name)
    if name not in _DECODERS:
        raise _bad(f"field {field!r} has type {dtype.simpleString()}: a Percolator value "
                   f"reads as one of {sorted(_DECODERS)}")
    return name


def _row_key_type(schema: T.StructType, row_key: str) -> bool:
    """True when the row key field is a string (else binary); checks the schema."""
    if row_key not in schema.names:
        raise _bad(f"the schema has no row key field {row_key!r} (fields {schema.names}); "
                   "name it with option rowKey")
    dtype = schema[row_key].dataType
    if not isinstance(dtype, T.BinaryType | T.StringType):
        raise _bad(f"row key field {row_key!r} must be binary or string, got "
                   f"{dtype.simpleString()}")
    return isinstance(dtype, T.StringType)


def _value_fields(schema: T.StructType, row_key: str) -> list[str]:
    fields = [f.name for f in schema.fields if f.name != row_key]
    for name in fields:
        try:
            check_column(name)
        except InvalidArgument as e:
            raise _bad(f"field {name!r} is not a Percolator column: {e}; every field but "
                       f"the row key ({row_key!r}) must be named 'family:qualifier'") from None
    return fields


# --- reading --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _KeyRange:
    """What the pushed-down row-key filters leave: ``[start, stop)`` and, for ``=`` and
    ``IN``, the exact keys (None: any key in the range)."""

    start: bytes | None = None
    stop: bytes | None = None
    keys: frozenset[bytes] | None = None

    def meet(self, other: _KeyRange) -> _KeyRange:
        start = other.start if self.start is None or (
            other.start is not None and other.start > self.start) else self.start
        stop = other.stop if self.stop is None or (
            other.stop is not None and other.stop < self.stop) else self.stop
        keys = self.keys if other.keys is None else (
            other.keys if self.keys is None else self.keys & other.keys)
        return _KeyRange(start, stop, keys)

    def clip(self, bounds: Range) -> Range | None:
        """*bounds* narrowed to this range, None when they do not meet."""
        start = bounds[0] if self.start is None or (
            bounds[0] is not None and bounds[0] > self.start) else self.start
        stop = bounds[1] if self.stop is None or (
            bounds[1] is not None and bounds[1] < self.stop) else self.stop
        if start is not None and stop is not None and start >= stop:
            return None
        return start, stop


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with *prefix* (None: none is)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else None


def _pushed(flt: D.Filter, row_key: str, as_text: bool) -> _KeyRange | None:
    """The key range a filter on the row key keeps, None when it is not one we take."""
    if getattr(flt, "attribute", None) != (row_key,):  # Not, And... have none
        return None

    def key(value: Any) -> bytes | None:
        if as_text and isinstance(value, str):
            return value.encode()
        if not as_text and isinstance(value, bytes | bytearray):
            return bytes(value)
        return None

    if isinstance(flt, D.In):
        keys = [key(v) for v in flt.value]
        if any(k is None for k in keys):
            return None
        return _KeyRange(keys=frozenset(k for k in keys if k))
    if not isinstance(flt, D.EqualTo | D.EqualNullSafe | D.GreaterThan | D.GreaterThanOrEqual
                      | D.LessThan | D.LessThanOrEqual | D.StringStartsWith):
        return None
    value = key(flt.value)
    if value is None:
        return None
    after = value + b"\x00"  # the smallest key above value
    if isinstance(flt, D.EqualTo | D.EqualNullSafe):
        return _KeyRange(keys=frozenset([value]) if value else frozenset())
    if isinstance(flt, D.GreaterThan):
        return _KeyRange(start=after)
    if isinstance(flt, D.GreaterThanOrEqual):
        return _KeyRange(start=value)
    if isinstance(flt, D.LessThan):
        return _KeyRange(stop=value)
    if isinstance(flt, D.LessThanOrEqual):
        return _KeyRange(stop=after)
    if isinstance(flt, D.StringStartsWith) and as_text:
        return _KeyRange(start=value, stop=_prefix_end(value))
    return None


class KeyRangePartition(InputPartition):  # type: ignore[misc]
    """Rows ``[start, stop)`` of the table, or exactly *keys* when not None, read at
    *start_ts*. The timestamp rides in every partition: Spark pickles the reader for
    the executors before it asks for the partitions, so nothing the reader learns in
    :meth:`PercolatorReader.partitions` reaches them otherwise."""

    def __init__(self, start: bytes | None, stop: bytes | None,
                 keys: tuple[bytes, ...] | None, start_ts: int) -> None:
        super().__init__((start, stop, keys, start_ts))


class _PushFilters:
    """``reader.pushFilters``, presented so that Spark does not refuse the reader when
    ``spark.sql.python.filterPushdown.enabled`` is false (the default): pyspark then
    fails any reader whose ``pushFilters.__func__`` is not the base class's, to stop a
    reader relying on pushdown from silently returning too much. Ours relies on
    nothing: a filter not pushed is applied by Spark, so the read is right either way
    and pushdown is only an optimisation, used when the user enables it."""

    def __init__(self, reader: PercolatorReader) -> None:
        self.reader = reader
        self.__func__ = DataSourceReader.pushFilters

    def __call__(self, filters: list[D.Filter]) -> Iterable[D.Filter]:
        return self.reader.push_filters(filters)


class PercolatorReader(DataSourceReader):  # type: ignore[misc]
    """A batch read of the table at one snapshot (see the module's docstring)."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.options = options
        self.as_text = _row_key_type(schema, options.row_key)
        self.fields = [f.name for f in schema.fields]
        self.columns = tuple(_value_fields(schema, options.row_key))
        if not self.columns:
            raise _bad("read at least one column (option columns or the schema)")
        self.types = tuple(_type_name(f.dataType, f.name) for f in schema.fields)
        self.schema = schema
        self.range = _KeyRange()
        self.start_ts = options.get("startts", int)

    @property
    def pushFilters(self) -> _PushFilters:
        return _PushFilters(self)

    def push_filters(self, filters: list[D.Filter]) -> Iterable[D.Filter]:
        """Take the row-key filters (``=``, ``IN``, ``<``, ``<=``, ``>``, ``>=``, a
        string prefix); give back the others for Spark to apply after the read."""
        for flt in filters:
            taken = _pushed(flt, self.options.row_key, self.as_text)
            if taken is None:
                yield flt  # Spark applies it after the read
            else:
                self.range = self.range.meet(taken)

    def partitions(self) -> list[InputPartition]:
        part = KeyRangePartition
        options = self.options
        with options.cluster() as cluster:
            internals(cluster).require_table(options.table)
            ts = _check_start_ts(self.start_ts, cluster)
            if self.range.keys is not None:
                keys = sorted(k for k in self.range.keys
                              if self.range.clip((k, k + b"\x00")) is not None)
                parts = [part(None, None, tuple(keys), ts)]
            else:
                splits = options.get("numpartitions", int)
                ranges = plan_ranges(cluster, options.table, splits,
                                     default_parts=DEFAULT_PARTITIONS,
                                     columns=self.columns)
                clipped = [c for r in ranges if (c := self.range.clip(r)) is not None]
                parts = [part(s, e, None, ts) for s, e in clipped] or [part(None, None, (), ts)]
            # An error every partition would meet (a snapshot too old for garbage
            # collection, say) is raised here, on the driver, before tasks start.
            start, stop, keys, _ = parts[0].value
            probe = percolator.Snapshot(cluster, start_ts=ts)
            if keys is not None:
                probe.get_rows(options.table, keys[:1], self.columns)
            else:
                scan = probe.scan(options.table, start, stop, self.columns)
                try:
                    next(scan, None)
                finally:
                    getattr(scan, "close", lambda: None)()
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        start, stop, keys, start_ts = partition.value
        spec = _Spec(self.options.url, self.options.connect, self.options.table,
                     self.columns, start_ts)
        where = f"rows {list(keys)[:3]!r}" if keys is not None else f"rows [{start!r}, {stop!r})"
        decoders = [_DECODERS[t] for t in self.types]
        rows = _read_rows(spec, start, stop, keys, self.fields, self.options.row_key,
                          decoders, where)
        arrow = _arrow_schema(self.schema, self.types)
        if arrow is None:
            yield from rows
        else:
            yield from _batches(rows, arrow)


_ARROW_TYPES = frozenset(("binary", "string", "long", "int", "short", "byte", "double",
                          "float", "boolean", "date"))
"""Types whose Python values Arrow takes as Spark's own row converter would (a naive
timestamp Spark reads as local time, Arrow as UTC: those go row by row)."""

ARROW_BATCH_ROWS = 4096


def _arrow_schema(schema: T.StructType, types: tuple[str, ...]) -> Any:
    """The Arrow schema Spark expects of *schema*'s batches, or None (no pyarrow, or a
    type outside :data:`_ARROW_TYPES`): then rows go to Spark one tuple at a time."""
    if not set(types) <= _ARROW_TYPES:
        return None
    try:
        from pyspark.sql.pandas.types import to_arrow_schema
    except ImportError:
        return None
    return to_arrow_schema(schema, timezone="UTC")


def _batches(rows: Iterator[tuple[Any, ...]], schema: Any) -> Iterator[Any]:
    """*rows* as Arrow record batches: Spark checks and converts a tuple's values one
    by one in the worker, several times the cost of reading them from the store."""
    import pyarrow as pa

    while chunk := list(itertools.islice(rows, ARROW_BATCH_ROWS)):
        columns = zip(*chunk, strict=True)
        yield pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)],
            schema=schema)


def _decoded(decode: Any, raw: bytes, row: bytes, column: str) -> Any:
    try:
        return decode(raw)
    except ValueError as e:
        raise percolator.InvalidArgument(
            f"row {row!r}, column {column}: value {raw[:60]!r} does not read as the "
            f"field's type ({type(e).__name__}: {e}); read it as binary or string") from None


def _read_rows(spec: _Spec, start: bytes | None, stop: bytes | None,
               keys: tuple[bytes, ...] | None, fields: list[str], row_key: str,
               decoders: list[Any], where: str) -> Iterator[tuple[Any, ...]]:
    snap = _snapshot(spec, where)
    columns = spec.columns
    assert columns is not None
    try:
        found: Iterable[tuple[bytes, dict[str, bytes]]]
        if keys is not None:
            got = snap.get_rows(spec.table, keys, columns) if keys else {}
            found = ((k, got[k]) for k in keys if got.get(k))
        else:
            found = snap.scan(spec.table, start, stop, columns)
        for row, values in found:
            out: list[Any] = []
            for name, decode in zip(fields, decoders, strict=True):
                raw = row if name == row_key else values.get(name)
                if raw is None:
                    out.append(None)
                    continue
                out.append(_decoded(decode, raw, row, name))
            yield tuple(out)
    except PercolatorError as e:
        raise _read_error(spec, where, e) from e


# --- writing ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteReport(WriterCommitMessage):  # type: ignore[misc]
    """What one write task did (its commit message to the driver)."""

    rows: int
    cells: int
    rejects: int
    samples: tuple[tuple[str, str, str | None], ...]
    """The first rejects: ``(reason, record as JSON, row)``."""


def _keep_alive(cluster: percolator.Cluster, txn: LoadTxn, stop: threading.Event,
                lost: list[PercolatorError]) -> None:
    period = max(txn.ttl_ms / 3000, 0.05)
    while not stop.wait(period):
        try:
            refresh_primary(cluster, txn)
        except PercolatorError as e:
            lost.append(e)
            return


def _write_partition(options: SourceOptions, txn: LoadTxn, mapping: ColumnMap,
                     batch_cells: int, rows: Iterator[Any]) -> WriteReport:
    """Prewrite the cells of one Spark partition for the load *txn*, keeping the
    load's primary alive meanwhile (the process that began the load has moved on)."""
    cluster = executor_cluster(options.url, options.connect)
    rejects: list[Reject] = []
    counts = {"rows": 0, "cells": 0}

    def parsed() -> Iterator[tuple[bytes, dict[str, bytes]]]:
        for r in rows:
            record = r.asDict(recursive=True)
            # The record's JSON is only a reject's line here (no dedupe reads it, unlike
            # the bulk loader's): made for rejects alone, it was half a row's parsing.
            got = to_cells(record, mapping, "")
            if isinstance(got, Reject):
                rejects.append(replace(got, line=json.dumps(record, default=str,
                                                            sort_keys=True)))
                continue
            row, (cells, _) = got
            counts["rows"] += 1
            counts["cells"] += len(cells)
            yield row, cells

    stop, lost = threading.Event(), list[PercolatorError]()
    refresher = threading.Thread(target=_keep_alive, args=(cluster, txn, stop, lost),
                                 name=f"percolator-load-{txn.load_id}", daemon=True)
    refresher.start()
    try:
        for _ in prewrite_rows(cluster, txn, parsed(), batch_cells=batch_cells):
            if lost:
                raise lost[0]
    finally:
        stop.set()
        refresher.join()
    if lost:
        raise lost[0]
    return WriteReport(counts["rows"], counts["cells"], len(rejects),
                       tuple((r.reason, r.line, r.row) for r in rejects[:MAX_REJECTS_KEPT]))


def _prepare_table(cluster: percolator.Cluster, options: SourceOptions) -> None:
    """What both writers do on the driver before any task runs: create the table
    (option createTable, default true) or require it, and turn on the observed
    columns (option observe), so that tasks never race to create it."""
    if options.get("createtable", bool, True):
        cluster.create_table(options.table)
    else:
        internals(cluster).require_table(options.table)
    for column in (c.strip() for c in (options.get("observe", str) or "").split(",")):
        if column:
            cluster.observe(options.table, column)


class PercolatorWriter(DataSourceWriter):  # type: ignore[misc]
    """A batch write (mode append): the whole DataFrame is one Percolator transaction,
    a bulk load (:mod:`percolator._bulk`). :meth:`PercolatorDataSource.writer` begins
    it (prewrites its primary), every task prewrites its rows (:meth:`write`), and
    :meth:`commit` commits the primary, the commit point, then releases the locks."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.options = options
        fields = _value_fields(schema, options.row_key)
        _row_key_type(schema, options.row_key)
        self.mapping = ColumnMap.of(options.row_key, {f: f for f in fields})
        self.load_id: str = options.get("loadid", str) or uuid.uuid4().hex
        self.batch_cells: int = options.get("batchcells", int, 5000)
        self.txn: LoadTxn | None = None
        self.loaded: AlreadyLoaded | None = None
        with options.cluster() as cluster:
            _prepare_table(cluster, options)
            load = BulkLoad(cluster, options.table, self.load_id)
            begun = load.begin(self._info())
            if isinstance(begun, AlreadyLoaded):
                self.loaded = begun
            else:
                self.txn = begun
                load.detach()  # the write tasks keep it alive from now on

    def _info(self, **counts: int) -> dict[str, Any]:
        return {"source": "spark data source", "table": self.options.table,
                "load_id": self.load_id, **counts}

    def write(self, iterator: Iterator[Any]) -> WriteReport:
        if self.txn is None:  # a rerun of a committed load: nothing to write
            return WriteReport(0, 0, 0, ())
        return _write_partition(self.options, self.txn, self.mapping, self.batch_cells,
                                iterator)

    def commit(self, messages: list[WriteReport | None]) -> None:
        options = self.options
        with options.cluster() as cluster:
            load = BulkLoad(cluster, options.table, self.load_id)
            if self.loaded is not None:
                if not load.is_finished():
                    load.finish_leftovers(self.loaded)
                return
            assert self.txn is not None
            reports = [m for m in messages if m is not None]
            rows = sum(m.rows for m in reports)
            cells = sum(m.cells for m in reports)
            rejected = sum(m.rejects for m in reports)
            samples = sorted((Reject(*r) for m in reports for r in m.samples),
                             key=lambda r: (r.line, r.reason))
            path = options.get("rejectspath", str)
            if path and samples:
                path = path.replace("{load_id}", self.load_id[:12])
                with open(path, "w", encoding="utf-8") as f:
                    f.writelines(r.to_json() + "\n" for r in samples)
            limit = options.get("maxrejects", int)
            failure: str | None = None
            try:
                load.resume(self.txn)
                if limit is not None and rejected > limit:
                    failure = (f"{rejected} rejects, more than maxRejects {limit}"
                               + (f" (see {path})" if path and samples else "")
                               + (f"; first: {samples[0].reason}" if samples else ""))
                    load.abort()
                else:
                    commit_ts = load.commit(self._info(rows=rows, cells=cells,
                                                       rejects=rejected))
                    load.finish_leftovers(AlreadyLoaded(self.load_id, self.txn.start_ts,
                                                        commit_ts, {}))
                    internals(cluster).sweep_locks(force=True)
            except (ConflictError, SnapshotTooOldError) as e:
                load.abort()
                failure = str(e)
            if failure is not None:
                raise LoadError(f"write {self.load_id[:16]} into {options.table!r} failed, "
                                f"nothing of it is visible: {failure}")

    def abort(self, messages: list[WriteReport | None]) -> None:
        if self.txn is None:
            return
        with self.options.cluster() as cluster:
            load = BulkLoad(cluster, self.options.table, self.load_id)
            try:
                load.resume(self.txn)
            except ConflictError:
                return  # rolled back already
            load.abort()


# --- streaming write -------------------------------------------------------------------------

_PARK_AFTER_PREWRITE = "_PERCOLATOR_TEST_PARK_AFTER_PREWRITE"
"""Tests only: a directory. If the file ``park-prewritten-N`` is there, a streaming
write task of batch N that prewrote its rows writes ``prewritten-N`` and waits (to be
killed with its driver mid-batch); ``park-committed-N`` parks the driver's commit of
batch N after the commit point (before Spark records the batch done)."""


def _park(point: str, batch: int) -> None:
    park = os.environ.get(_PARK_AFTER_PREWRITE)
    if park and os.path.exists(os.path.join(park, f"park-{point}-{batch}")):
        with open(os.path.join(park, f"{point}-{batch}"), "w"):
            pass
        threading.Event().wait()


@dataclass(frozen=True, slots=True)
class StreamReport(WriterCommitMessage):  # type: ignore[misc]
    """What one task of a micro-batch did: its share of the batch's load *txn* (None
    for a task without rows, or a batch committed before)."""

    load_id: str
    txn: LoadTxn | None
    report: WriteReport


def _batch_of_task() -> tuple[str, int]:
    """(run id, batch id) of the running task, from the local properties Spark's
    micro-batch execution sets on its jobs (the job group is the query's run id)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    run = ctx.getLocalProperty("spark.jobGroup.id") if ctx is not None else None
    batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    if run is None or batch is None:
        raise _bad("a streaming write task without Spark's micro-batch properties "
                   "(spark.jobGroup.id, streaming.sql.batchId); continuous processing "
                   "is not supported")
    return str(run), int(batch)


def _query_of(options: SourceOptions) -> str:
    """What names the query across its restarts: option queryId, else its checkpoint
    location (Spark's own query id does not reach the tasks)."""
    query = options.get("queryid", str)
    if query:
        return str(query)
    checkpoint = options.get("checkpointlocation", str)
    if not checkpoint:
        raise _bad("a streaming write needs .option(\"checkpointLocation\", ...) (or "
                   "option queryId): it names the query, so that a micro-batch replayed "
                   "after a restart finds its earlier commit")
    return "cp" + hashlib.sha256(str(checkpoint).encode()).hexdigest()[:24]


class PercolatorStreamWriter(DataSourceStreamWriter):  # type: ignore[misc]
    """``writeStream.format("percolator")``, exactly once: every micro-batch is one
    bulk load whose id is (query id, batch id) and whose primary, the load's marker
    cell, records them; a batch Spark replays after a failure finds its load
    committed and writes nothing. The tasks begin the load (the first one) or join
    it, since no code of the source runs on the driver between batches before the
    commit; an attempt of an earlier run of the query (its driver died mid-batch) is
    rolled back by the first task of the replay."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.options = options
        fields = _value_fields(schema, options.row_key)
        _row_key_type(schema, options.row_key)
        self.mapping = ColumnMap.of(options.row_key, {f: f for f in fields})
        self.batch_cells: int = options.get("batchcells", int, 5000)
        _query_of(options)
        with options.cluster() as cluster:
            _prepare_table(cluster, options)

    def write(self, iterator: Iterator[Any]) -> StreamReport:
        run, batch = _batch_of_task()
        return self.write_task(run, batch, iterator)

    def write_task(self, run: str, batch: int, iterator: Iterator[Any]) -> StreamReport:
        """:meth:`write` of the task of micro-batch *batch* of the query's run *run*,
        whose rows are *iterator* (``Row`` objects): what a task does once it knows
        where it stands (the tests play tasks with it, without Spark's jobs)."""
        query = _query_of(self.options)
        load_id = f"stream-{query}-{batch}"
        first = next(iterator, None)
        if first is None:
            return StreamReport(load_id, None, WriteReport(0, 0, 0, ()))
        cluster = executor_cluster(self.options.url, self.options.connect)
        begun = begin_or_join(cluster, self.options.table, load_id, f"spark-stream:{run}",
                              {"source": "spark stream", "query": query, "batch": batch})
        if isinstance(begun, AlreadyLoaded):
            return StreamReport(load_id, None, WriteReport(0, 0, 0, ()))
        report = _write_partition(self.options, begun, self.mapping, self.batch_cells,
                                  itertools.chain([first], iterator))
        _park("prewritten", batch)
        return StreamReport(load_id, begun, report)

    def commit(self, messages: list[StreamReport | None], batchId: int) -> None:
        reports = [m for m in messages if m is not None]
        txns = {m.txn.start_ts: m.txn for m in reports if m.txn is not None}
        if not txns:
            return  # an empty batch, or one committed before
        if len(txns) > 1:
            raise LoadError(f"micro-batch {batchId}: its tasks wrote under {len(txns)} "
                            "load transactions (an attempt was rolled back while others "
                            "ran); nothing of it is visible; restart the query to replay it")
        (txn,) = txns.values()
        rows = sum(m.report.rows for m in reports)
        cells = sum(m.report.cells for m in reports)
        with self.options.cluster() as cluster:
            load = BulkLoad(cluster, self.options.table, txn.load_id)
            try:
                load.resume(txn)
                commit_ts = load.commit({"source": "spark stream", "batch": batchId,
                                         "load_id": txn.load_id, "rows": rows, "cells": cells})
            except (ConflictError, SnapshotTooOldError) as e:
                load.abort()
                raise LoadError(f"micro-batch {batchId} into {self.options.table!r} failed, "
                                f"nothing of it is visible: {e}") from e
            load.finish_leftovers(AlreadyLoaded(txn.load_id, txn.start_ts, commit_ts, {}))
        _park("committed", batchId)

    def abort(self, messages: list[StreamReport | None], batchId: int) -> None:
        txns = {m.txn.start_ts: m.txn for m in messages if m is not None and m.txn is not None}
        with self.options.cluster() as cluster:
            for txn in txns.values():
                load = BulkLoad(cluster, self.options.table, txn.load_id)
                try:
                    load.resume(txn)
                except ConflictError:
                    continue
                load.abort()


# --- streaming read: the change feed -----------------------------------------------------------

CHANGE_FIELDS = ("column", "value", "commit_ts")
"""The change feed's fields after the row key: one record per committed cell."""


def change_schema(row_key: str = ROW_KEY) -> T.StructType:
    """The change feed's schema: the row key, the column (``family:qualifier``), the
    value committed (null: a delete) and its commit timestamp."""
    return T.StructType([T.StructField(row_key, T.BinaryType(), False),
                         T.StructField("column", T.StringType(), False),
                         T.StructField("value", T.BinaryType(), True),
                         T.StructField("commit_ts", T.LongType(), False)])


def _is_change_schema(schema: T.StructType, row_key: str) -> bool:
    return list(schema.names) == [row_key, *CHANGE_FIELDS]


class ChangePartition(InputPartition):  # type: ignore[misc]
    """The commits ``[from_ts, to_ts)`` of rows ``[start, stop)``."""

    def __init__(self, start: bytes | None, stop: bytes | None, from_ts: int, to_ts: int) -> None:
        super().__init__((start, stop, from_ts, to_ts))


def _offset(ts: int) -> dict[str, int]:
    return {"commit_ts": ts}


def _ts_of(offset: object) -> int:
    ts = offset.get("commit_ts") if isinstance(offset, dict) else None
    if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
        raise _bad(f"{offset!r} is not an offset of a Percolator change feed (a checkpoint "
                   "of another source?): expected {\"commit_ts\": N}")
    return ts


class PercolatorChangeFeed(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """``spark.readStream.format("percolator").option("readChangeFeed", "true")``: the
    cells committed in the table (or in option ``columns``), one record each, in
    micro-batches of commit timestamps (see :mod:`spark_loader._changes` for where a
    batch may end and what it costs). An offset ``{"commit_ts": N}`` means every commit
    below N was delivered; Spark checkpoints it, so a restarted query goes on from
    there and replays a batch it had not finished with the same ends: no commit is
    missed and none is delivered twice (with an exactly-once sink).

    Runs in the driver's long-lived Python worker of the query (offsets, planning)
    and in the executors (:meth:`read`, with the partition's timestamps)."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        if not _is_change_schema(schema, options.row_key):
            raise _bad("a stream read is the table's change feed: option readChangeFeed "
                       "\"true\" (option columns then restricts it to those columns); its "
                       f"fields are {[options.row_key, *CHANGE_FIELDS]}, got {schema.names}")
        self.options = options
        self.as_text = _row_key_type(schema, options.row_key)
        if not isinstance(schema["column"].dataType, T.StringType) or not isinstance(
                schema["commit_ts"].dataType, T.LongType):
            raise _bad("the change feed's column is a string and its commit_ts a long")
        self.value_type = _type_name(schema["value"].dataType, "value")
        self.target: int | None = None
        self.ranges: list[Range] | None = None
        starting = (options.get("startingts", str) or "latest").lower()
        if starting not in ("earliest", "latest"):
            _parse("startingts", starting, int)
        self.starting = starting

    def initialOffset(self) -> dict[str, int]:
        options = self.options
        with options.cluster() as cluster:
            internals(cluster).require_table(options.table)
            if self.starting == "earliest":
                return _offset(0)
            if self.starting == "latest":
                return _offset(safe_end(cluster, options.table, options.columns, 0))
            ts = _check_start_ts(int(self.starting), cluster)
            internals(cluster).safe_point.check(ts)
            return _offset(ts)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        floor = _ts_of(start)
        with self.options.cluster() as cluster:
            end = safe_end(cluster, self.options.table, self.options.columns, floor)
        if self.target is not None:
            end = max(floor, min(end, self.target))
        return _offset(end)

    def prepareForTriggerAvailableNow(self) -> None:
        # A fresh timestamp: latestOffset reaches it once the writers below it are done.
        with self.options.cluster() as cluster:
            self.target = internals(cluster).timestamps.get_timestamp()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        from_ts, to_ts = _ts_of(start), _ts_of(end)
        if from_ts >= to_ts:
            return []
        if self.ranges is None:  # planned once per run of the query: a key scan on SQLite
            with self.options.cluster() as cluster:
                self.ranges = plan_ranges(cluster, self.options.table,
                                          self.options.get("numpartitions", int),
                                          default_parts=DEFAULT_PARTITIONS,
                                          columns=self.options.columns)
        return [ChangePartition(s, e, from_ts, to_ts) for s, e in self.ranges]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        start, stop, from_ts, to_ts = partition.value
        options = self.options
        spec = _Spec(options.url, options.connect, options.table, options.columns, from_ts)
        where = f"commits [{from_ts}, {to_ts}) of rows [{start!r}, {stop!r})"
        decode_row = _DECODERS["string" if self.as_text else "binary"]
        decode = _DECODERS[self.value_type]
        try:
            cluster = executor_cluster(options.url, options.connect)
            for row, column, value, commit_ts in changes(cluster, options.table, start, stop,
                                                         options.columns, from_ts, to_ts):
                yield (_decoded(decode_row, row, row, options.row_key), column,
                       None if value is None else _decoded(decode, value, row, column),
                       commit_ts)
        except PercolatorError as e:
            raise _read_error(spec, where, e) from e


# --- the data source -------------------------------------------------------------------------


class PercolatorDataSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("percolator")`` and ``df.write.format("percolator")``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        self.checked = SourceOptions.of(options)

    def schema(self) -> T.StructType:
        columns = self.checked.columns
        if columns is None or self.checked.get("readchangefeed", bool, False):
            return change_schema(self.checked.row_key)
        return T.StructType([T.StructField(self.checked.row_key, T.BinaryType(), False),
                             *[T.StructField(c, T.BinaryType(), True) for c in columns]])

    def reader(self, schema: T.StructType) -> PercolatorReader:
        if self.checked.get("readchangefeed", bool, False):
            raise _bad("the change feed (option readChangeFeed) is read with "
                       "spark.readStream; a batch read gives the table at one snapshot")
        if self.checked.columns is None and _is_change_schema(schema, self.checked.row_key):
            raise _bad("name the columns to read: option columns "
                       "(\"family:qualifier,...\"), or a schema with .schema(...) "
                       f"(field {self.checked.row_key!r} for the row key, one field per "
                       "column, typed binary, string, long, double, boolean...)")
        return PercolatorReader(self.checked, schema)

    def streamReader(self, schema: T.StructType) -> PercolatorChangeFeed:
        return PercolatorChangeFeed(self.checked, schema)

    def writer(self, schema: T.StructType, overwrite: bool) -> PercolatorWriter:
        if overwrite:
            raise _bad("mode overwrite is refused: a Percolator table is not replaced "
                       "wholesale (it keeps every version, readers at older snapshots "
                       "still see them, and observers react to each change); use "
                       "mode(\"append\"), which writes the DataFrame's cells as one "
                       "transaction over what is there, or write to a new table")
        return PercolatorWriter(self.checked, schema)

    def streamWriter(self, schema: T.StructType, overwrite: bool) -> PercolatorStreamWriter:
        if overwrite:
            raise _bad("output mode complete is refused: a Percolator table is not "
                       "replaced wholesale; use outputMode(\"append\") or \"update\"")
        return PercolatorStreamWriter(self.checked, schema)
