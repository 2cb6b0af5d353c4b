"""The read side: a Percolator table as a Spark DataFrame, at one snapshot
(:func:`read_table`; how the snapshot is planned and read: :mod:`spark_loader._snapshot`).
On a classic SparkSession the partitions are RDD tasks of our own; on Spark Connect,
which has no RDDs, the same read goes through ``format("percolator")``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import percolator
from percolator import InvalidArgument, PercolatorError
from percolator.ext import internals
from spark_loader._compat import renamed_keyword
from spark_loader._options import ROW_KEY, source_options
from spark_loader._snapshot import (
    Range,
    ReadSpec,
    check_columns,
    check_splits,
    check_start_ts,
    open_snapshot,
    plan_read,
    read_error,
)
from spark_loader._spark import check_workers, is_connect, require_pyspark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["decode_columns", "read_table", "start_ts_of"]


# --- executors ---------------------------------------------------------------------------


def _where(start: bytes | None, stop: bytes | None) -> str:
    return f"rows [{start!r}, {stop!r})"


def _scan(spec: ReadSpec, bounds: Iterable[Range],
          columns: tuple[str, ...] | None) -> Iterator[tuple[Range, bytes, dict[str, bytes]]]:
    for start, stop in bounds:
        where = _where(start, stop)
        snap = open_snapshot(spec, where)
        try:
            for row, values in snap.scan(spec.table, start, stop, columns):
                yield (start, stop), row, values
        except PercolatorError as e:
            raise read_error(spec, where, e) from e


def _read_partition(spec: ReadSpec, columns: tuple[str, ...],
                    bounds: Iterable[Range]) -> Iterator[tuple[bytes | None, ...]]:
    for _, row, values in _scan(spec, bounds, columns):
        yield (row, *[values.get(c) for c in columns])


def _columns_of_partition(spec: ReadSpec, bounds: Iterable[Range]) -> Iterator[str]:
    seen: set[str] = set()
    for _, _, values in _scan(spec, bounds, None):
        seen.update(values)
    yield from seen


# --- the driver ----------------------------------------------------------------------------


@renamed_keyword("cluster_url", "url")
def read_table(
    spark: SparkSession,
    url: str,
    table: str,
    columns: Sequence[str] | None = None,
    start_ts: int | None = None,
    splits: int | Sequence[bytes] | None = None,
    *,
    connect_options: Mapping[str, Any] | None = None,
) -> DataFrame:
    """*table* of the cluster at *url* as a DataFrame, read at one snapshot.

    One DataFrame row per Percolator row that has a visible value in *columns*: the
    row key in column ``row`` (binary), then one binary column per requested
    ``"family:qualifier"`` in the order given (null where the row has no value).
    *columns* None reads every user column (found by a first Spark job over the same
    snapshot, sorted by name). Decode in Spark with ``F.col("`raw:html`")
    .cast("string")`` (UTF-8) or :func:`decode_columns`; values the bulk loader wrote
    are UTF-8 text, numbers as decimal text, lists and dicts as JSON.

    Every partition reads at the same *start_ts*: drawn from the timestamp oracle once,
    here, or given (a repeatable read: the same data however many times it is read,
    whatever commits meanwhile; :func:`start_ts_of` gives the timestamp a DataFrame
    reads at). Locks met are resolved as
    any reader resolves them; nothing is read that was not committed before
    *start_ts*.

    *splits* cuts the table into Spark partitions by row-key ranges: None uses the
    store's own cut points (Bigtable tablets and samples, HBase regions) or, where
    the store reports none (SQLite), ``2 * defaultParallelism`` ranges of sampled
    keys; a number asks for that many ranges of about equal row counts (sampled: the
    driver scans the row keys once); a list of row keys cuts there.
    *connect_options* go to :func:`percolator.connect` on the driver and on every
    executor (``oracle``, ``zookeeper``, TLS...).

    The DataFrame is lazy: it is read when an action runs, and every action reads
    again at the same *start_ts* (``.cache()`` it to read once).

    .. warning:: blocks while it samples split keys (one key scan) and, with
       *columns* None, while a Spark job finds the columns.
    :raises UnknownTableError: *table* does not exist.
    :raises InvalidArgument: a malformed column, *start_ts* or *splits*, or a
        *start_ts* the oracle has not issued yet.
    :raises ReadError: (in Spark actions, as the text of Spark's error) when a
        partition's read fails; it names the table, *start_ts*, the row range and the
        cause.
    """
    require_pyspark()
    if is_connect(spark):
        return _read_over_connect(spark, url, table, columns, start_ts, splits,
                                  dict(connect_options or {}))
    if not hasattr(spark, "sparkContext"):
        raise InvalidArgument(f"spark must be a SparkSession, got {type(spark).__name__}")
    wanted = check_columns(columns)
    options = dict(connect_options or {})
    sc = spark.sparkContext
    with percolator.connect(url, **options) as cluster:
        plan = plan_read(cluster, table, wanted, start_ts, splits,
                         default_parts=2 * sc.defaultParallelism)
    # After the driver's checks of the table, columns, timestamp and splits: the
    # workers' probe is a Spark job, and bad input is refused before any job runs.
    check_workers(spark)
    ts, ranges = plan.start_ts, list(plan.ranges)
    spec = ReadSpec(url, tuple(sorted(options.items())), table, wanted, ts)
    bounds = sc.parallelize(ranges, len(ranges))
    if wanted is None:
        sc.setJobDescription(f"percolator read {table}@{ts}: columns")
        found = bounds.mapPartitions(lambda b: _columns_of_partition(spec, b)).distinct()
        wanted = tuple(sorted(found.collect()))
        sc.setJobDescription(None)  # type: ignore[arg-type]
    names = wanted
    rows = bounds.mapPartitions(lambda b: _read_partition(spec, names, b))
    from pyspark.sql.types import BinaryType, StructField, StructType

    schema = StructType([StructField(ROW_KEY, BinaryType(), False),
                         *[StructField(c, BinaryType(), True) for c in names]])
    df = spark.createDataFrame(rows, schema, verifySchema=False)
    setattr(df, _TS_ATTRIBUTE, ts)
    return df


def _read_over_connect(spark: SparkSession, cluster_url: str, table: str,
                       columns: Sequence[str] | None, start_ts: int | None,
                       splits: int | Sequence[bytes] | None,
                       connect_options: dict[str, Any]) -> DataFrame:
    """:func:`read_table` on a Spark Connect session, where there are no RDDs: the
    same DataFrame through ``format("percolator")`` at one start timestamp drawn
    here. *columns* None: the columns are found by a scan of the table at that
    snapshot, here (name them to save it); *splits* may only be a number."""
    wanted = check_columns(columns)
    checked = check_splits(splits)
    if isinstance(checked, list):
        raise InvalidArgument("splits as a list of row keys needs a classic SparkSession; on "
                              "Spark Connect give a number of partitions (or None)")
    options = source_options(connect_options)
    with percolator.connect(cluster_url, **connect_options) as cluster:
        internals(cluster).require_table(table)
        ts = check_start_ts(start_ts, cluster)
        if wanted is None:
            found: set[str] = set()
            for _, values in percolator.Snapshot(cluster, start_ts=ts).scan(table):
                found.update(values)
            wanted = tuple(sorted(found))
    if not wanted:  # an empty table: the DataFrame the classic path gives
        from pyspark.sql.types import BinaryType, StructField, StructType

        empty = spark.createDataFrame([], StructType([StructField(ROW_KEY, BinaryType(), False)]))
        setattr(empty, _TS_ATTRIBUTE, ts)
        return empty
    reader = (spark.read.format("percolator").option("url", cluster_url).option("table", table)
              .option("columns", ",".join(wanted)).option("startTs", str(ts)))
    if checked is not None:
        reader = reader.option("numPartitions", str(checked))
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load()
    setattr(df, _TS_ATTRIBUTE, ts)
    return df


_TS_ATTRIBUTE = "_percolator_start_ts"


def start_ts_of(df: DataFrame) -> int:
    """The start timestamp *df* (a DataFrame :func:`read_table` returned) reads at:
    pass it as ``start_ts`` to read the same snapshot again."""
    ts = getattr(df, _TS_ATTRIBUTE, None)
    if not isinstance(ts, int):
        raise InvalidArgument("this DataFrame did not come from spark_loader.read_table "
                              "(derived DataFrames do not keep the timestamp)")
    return ts


def decode_columns(df: DataFrame, encoding: str = "utf-8") -> DataFrame:
    """*df* from :func:`read_table` with the row key and every binary column cast to
    strings (UTF-8; invalid sequences become U+FFFD)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    if encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
        raise InvalidArgument(f"only UTF-8 decoding is done in Spark, got {encoding!r}")
    return df.select(*[F.col(f"`{f.name}`").cast("string").alias(f.name)
                       if isinstance(f.dataType, BinaryType) else F.col(f"`{f.name}`")
                       for f in df.schema.fields])
