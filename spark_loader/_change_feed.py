"""``spark.readStream.format("percolator").option("readChangeFeed", "true")``: the
change feed's Spark half (offsets, partitions, records); its store half, which needs
no Spark, is :mod:`spark_loader._commit_range`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from percolator import PercolatorError
from percolator.ext import internals
from spark_loader._commit_range import changes, safe_end
from spark_loader._options import DEFAULT_PARTITIONS, ROW_KEY, SourceOptions, bad, parse
from spark_loader._snapshot import Range, ReadSpec, check_start_ts, plan_ranges, read_error
from spark_loader._spark import executor_cluster
from spark_loader._spark_types import DECODERS, decoded, row_key_is_text, type_name

__all__ = ["CHANGE_FIELDS", "ChangePartition", "PercolatorChangeFeed", "change_schema",
           "is_change_schema"]

CHANGE_FIELDS = ("column", "value", "commit_ts")
"""The change feed's fields after the row key: one record per committed cell."""


def change_schema(row_key: str = ROW_KEY) -> T.StructType:
    """The change feed's schema: the row key, the column (``family:qualifier``), the
    value committed (null: a delete) and its commit timestamp."""
    return T.StructType([T.StructField(row_key, T.BinaryType(), False),
                         T.StructField("column", T.StringType(), False),
                         T.StructField("value", T.BinaryType(), True),
                         T.StructField("commit_ts", T.LongType(), False)])


def is_change_schema(schema: T.StructType, row_key: str) -> bool:
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
        raise bad(f"{offset!r} is not an offset of a Percolator change feed (a checkpoint "
                   "of another source?): expected {\"commit_ts\": N}")
    return ts


class PercolatorChangeFeed(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """``spark.readStream.format("percolator").option("readChangeFeed", "true")``: the
    cells committed in the table (or in option ``columns``), one record each, in
    micro-batches of commit timestamps (see :mod:`spark_loader._commit_range` for where a
    batch may end and what it costs). An offset ``{"commit_ts": N}`` means every commit
    below N was delivered; Spark checkpoints it, so a restarted query goes on from
    there and replays a batch it had not finished with the same ends: no commit is
    missed and none is delivered twice (with an exactly-once sink).

    Runs in the driver's long-lived Python worker of the query (offsets, planning)
    and in the executors (:meth:`read`, with the partition's timestamps)."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        if not is_change_schema(schema, options.row_key):
            raise bad("a stream read is the table's change feed: option readChangeFeed "
                       "\"true\" (option columns then restricts it to those columns); its "
                       f"fields are {[options.row_key, *CHANGE_FIELDS]}, got {schema.names}")
        self.options = options
        self.as_text = row_key_is_text(schema, options.row_key)
        if not isinstance(schema["column"].dataType, T.StringType) or not isinstance(
                schema["commit_ts"].dataType, T.LongType):
            raise bad("the change feed's column is a string and its commit_ts a long")
        self.value_type = type_name(schema["value"].dataType, "value")
        self.target: int | None = None
        self.ranges: list[Range] | None = None
        starting = (options.get("startingts", str) or "latest").lower()
        if starting not in ("earliest", "latest"):
            parse("startingts", starting, int)
        self.starting = starting

    def initialOffset(self) -> dict[str, int]:
        options = self.options
        with options.cluster() as cluster:
            internals(cluster).require_table(options.table)
            if self.starting == "earliest":
                return _offset(0)
            if self.starting == "latest":
                return _offset(safe_end(cluster, options.table, options.columns, 0))
            ts = check_start_ts(int(self.starting), cluster)
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
        spec = ReadSpec(options.url, options.connect, options.table, options.columns, from_ts)
        where = f"commits [{from_ts}, {to_ts}) of rows [{start!r}, {stop!r})"
        decode_row = DECODERS["string" if self.as_text else "binary"]
        decode = DECODERS[self.value_type]
        try:
            cluster = executor_cluster(options.url, options.connect)
            for row, column, value, commit_ts in changes(cluster, options.table, start, stop,
                                                         options.columns, from_ts, to_ts):
                yield (decoded(decode_row, row, row, options.row_key), column,
                       None if value is None else decoded(decode, value, row, column),
                       commit_ts)
        except PercolatorError as e:
            raise read_error(spec, where, e) from e
