"""``spark.read.format("percolator")``: a batch read of a table at one snapshot.

The start timestamp is drawn once, when Spark plans the scan (or given with
``startTs``), by :func:`spark_loader._snapshot.plan_read` as
:func:`spark_loader.read_table` draws it, and every input partition reads at it
through :class:`percolator.Snapshot`; partitions follow the store's cut points as
``read_table``'s do; row-key filters are pushed down when
``spark.sql.python.filterPushdown.enabled`` is true. Rows go to Spark as Arrow
batches where the types allow.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql import datasource as D
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSourceReader, InputPartition

from percolator import PercolatorError
from spark_loader._options import DEFAULT_PARTITIONS, SourceOptions, bad
from spark_loader._snapshot import (
    KeyRange,
    ReadSpec,
    open_snapshot,
    plan_read,
    read_error,
)
from spark_loader._spark_types import (
    DECODERS,
    decoded,
    row_key_is_text,
    type_name,
    value_fields,
)

__all__ = ["ARROW_BATCH_ROWS", "KeyRangePartition", "PercolatorReader"]


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with *prefix* (None: none is)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else None


def _pushed(flt: D.Filter, row_key: str, as_text: bool) -> KeyRange | None:
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
        return KeyRange(keys=frozenset(k for k in keys if k))
    if not isinstance(flt, D.EqualTo | D.EqualNullSafe | D.GreaterThan | D.GreaterThanOrEqual
                      | D.LessThan | D.LessThanOrEqual | D.StringStartsWith):
        return None
    value = key(flt.value)
    if value is None:
        return None
    after = value + b"\x00"  # the smallest key above value
    if isinstance(flt, D.EqualTo | D.EqualNullSafe):
        return KeyRange(keys=frozenset([value]) if value else frozenset())
    if isinstance(flt, D.GreaterThan):
        return KeyRange(start=after)
    if isinstance(flt, D.GreaterThanOrEqual):
        return KeyRange(start=value)
    if isinstance(flt, D.LessThan):
        return KeyRange(stop=value)
    if isinstance(flt, D.LessThanOrEqual):
        return KeyRange(stop=after)
    if isinstance(flt, D.StringStartsWith) and as_text:
        return KeyRange(start=value, stop=_prefix_end(value))
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
        self.as_text = row_key_is_text(schema, options.row_key)
        self.fields = [f.name for f in schema.fields]
        self.columns = tuple(value_fields(schema, options.row_key))
        if not self.columns:
            raise bad("read at least one column (option columns or the schema)")
        self.types = tuple(type_name(f.dataType, f.name) for f in schema.fields)
        self.schema = schema
        self.range = KeyRange()
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
        options = self.options
        with options.cluster() as cluster:
            plan = plan_read(cluster, options.table, self.columns, self.start_ts,
                             options.get("numpartitions", int),
                             default_parts=DEFAULT_PARTITIONS, within=self.range)
        if plan.keys is not None:
            return [KeyRangePartition(None, None, plan.keys, plan.start_ts)]
        return [KeyRangePartition(s, e, None, plan.start_ts) for s, e in plan.ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        start, stop, keys, start_ts = partition.value
        spec = ReadSpec(self.options.url, self.options.connect, self.options.table,
                     self.columns, start_ts)
        where = f"rows {list(keys)[:3]!r}" if keys is not None else f"rows [{start!r}, {stop!r})"
        decoders = [DECODERS[t] for t in self.types]
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


def _read_rows(spec: ReadSpec, start: bytes | None, stop: bytes | None,
               keys: tuple[bytes, ...] | None, fields: list[str], row_key: str,
               decoders: list[Any], where: str) -> Iterator[tuple[Any, ...]]:
    snap = open_snapshot(spec, where)
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
                out.append(decoded(decode, raw, row, name))
            yield tuple(out)
    except PercolatorError as e:
        raise read_error(spec, where, e) from e
