"""The read side: a Percolator table as a Spark DataFrame, at one snapshot.

The driver draws one start timestamp (or takes the caller's) and cuts the table into
row-key ranges; every Spark partition scans its range through
:class:`percolator.Snapshot` at that same timestamp, so the DataFrame is one consistent
snapshot: exactly the transactions that committed before the timestamp, whatever
commits while the job runs. A partition that meets a lock resolves it as any reader
does (rolls a dead writer back, or forward when its primary committed), waiting up to
the cluster's lock wait for a live one.

Ranges: by default, where the store reports its own cut points (Bigtable
``SampleRowKeys``, HBase ``getTableRegions``) the table is cut there; otherwise (SQLite,
a one-region HBase table), or when a number of partitions is asked for, the driver
samples the row keys with one key scan and cuts at evenly spaced samples.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import percolator
from percolator import InvalidArgument, PercolatorError
from percolator.ext import SPLIT_KEYS, WRITE, Read, check_column, internals, offered
from spark_loader._compat import renamed_keyword
from spark_loader._job import _require_pyspark, check_workers, executor_cluster

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ROW_KEY", "ReadError", "decode_columns", "plan_ranges", "read_table", "start_ts_of"]

ROW_KEY = "row"
"""Name of the DataFrame's row-key column (user columns always hold a colon)."""

SAMPLES_PER_RANGE = 64
"""Keys kept per wanted range when the driver samples the row keys itself."""

Range = tuple[bytes | None, bytes | None]


class ReadError(PercolatorError):
    """Reading a table failed in a Spark partition. The message names the table, the
    start timestamp and the row range, then the cause (for example a lock still held
    by a live writer past the lock wait, or a start timestamp below the garbage
    collection safe point: snapshot too old)."""


@dataclass(frozen=True, slots=True)
class _Spec:
    url: str
    connect: tuple[tuple[str, Any], ...]
    table: str
    columns: tuple[str, ...] | None
    start_ts: int


def is_connect(spark: object) -> bool:
    """Whether *spark* is a Spark Connect session (no sparkContext, no RDDs)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _check_columns(columns: object) -> tuple[str, ...] | None:
    if columns is None:
        return None
    if isinstance(columns, str | bytes) or not isinstance(columns, Iterable):
        raise InvalidArgument(
            f"columns must be a list of 'family:qualifier' strings or None, got {columns!r:.80}"
        )
    checked = tuple(check_column(c) for c in columns)
    if not checked:
        raise InvalidArgument("columns is empty: name at least one 'family:qualifier' "
                              "(or pass None for every column)")
    if len(set(checked)) != len(checked):
        raise InvalidArgument(f"columns names a column twice: {list(checked)}")
    return checked


def _check_start_ts(start_ts: object, cluster: percolator.Cluster) -> int:
    now = internals(cluster).timestamps.get_timestamp()
    if start_ts is None:
        return now
    if isinstance(start_ts, bool) or not isinstance(start_ts, int) or start_ts <= 0:
        raise InvalidArgument(f"start_ts must be a positive int timestamp or None, "
                              f"got {start_ts!r}")
    if start_ts > now:
        # Transactions may still commit below a timestamp not yet issued: such a read
        # would not be repeatable.
        raise InvalidArgument(f"start_ts {start_ts} is in the future (the oracle is at "
                              f"{now}); pass a timestamp the oracle issued, such as the "
                              "start_ts of an earlier read")
    return start_ts


def _check_splits(splits: object) -> int | list[bytes] | None:
    if splits is None:
        return None
    if isinstance(splits, int) and not isinstance(splits, bool):
        if splits < 1:
            raise InvalidArgument(f"splits must be a positive number of partitions, got {splits}")
        return splits
    if isinstance(splits, str | bytes) or not isinstance(splits, Iterable):
        raise InvalidArgument(f"splits must be None, a number of partitions or a list of "
                              f"row keys (bytes), got {splits!r:.80}")
    keys = list(splits)
    bad = [k for k in keys if not isinstance(k, bytes) or not k]
    if bad:
        raise InvalidArgument(f"split keys must be non-empty bytes, got {bad[0]!r:.80}")
    return sorted(set(keys))


def _ranges(keys: Sequence[bytes]) -> list[Range]:
    return list(zip([None, *keys], [*keys, None], strict=True))


def _evenly(keys: Sequence[bytes], parts: int) -> list[bytes]:
    """``parts - 1`` keys spread evenly over the sorted *keys* (fewer if they repeat)."""
    if parts <= 1 or not keys:
        return []
    return sorted({keys[i * len(keys) // parts] for i in range(1, parts)})


def _sample_keys(cluster: percolator.Cluster, table: str, columns: tuple[str, ...] | None,
                 parts: int) -> list[bytes]:
    """A uniform sample of the table's row keys (one key scan on the driver,
    reservoir sampling: memory bounded by ``SAMPLES_PER_RANGE * parts``)."""
    size = SAMPLES_PER_RANGE * parts
    rng = random.Random(0)
    sample: list[bytes] = []
    read = Read(WRITE, columns)  # rows with a committed (or resolved) change
    for seen, (row, _) in enumerate(internals(cluster).store.scan(table, None, None, [read])):
        if seen < size:
            sample.append(row)
        else:
            j = rng.randrange(seen + 1)
            if j < size:
                sample[j] = row
    return sorted(sample)


def plan_ranges(cluster: percolator.Cluster, table: str, splits: int | Sequence[bytes] | None,
                *, default_parts: int, columns: Sequence[str] | None = None) -> list[Range]:
    """The row-key ranges ``[start, stop)`` (None: unbounded) that cover *table*.

    *splits*: a list of row keys cuts there; a number asks for that many ranges of
    about as many rows each (cut at sampled keys); None takes the store's own cut
    points (Bigtable tablets and samples, HBase regions, as Hadoop's input formats
    do), or ``default_parts`` ranges of sampled keys where it reports none.
    """
    checked = _check_splits(splits)
    if isinstance(checked, list):
        return _ranges(checked)
    if checked is None:
        splitting = offered(internals(cluster).store, SPLIT_KEYS)
        if splitting is not None:
            store_keys = splitting.split_keys(table)
            if store_keys:
                return _ranges(store_keys)
        checked = default_parts
    if checked <= 1:
        return [(None, None)]
    wanted = tuple(columns) if columns is not None else None
    return _ranges(_evenly(_sample_keys(cluster, table, wanted, checked), checked))


# --- executors ---------------------------------------------------------------------------


def _snapshot(spec: _Spec, where: str) -> percolator.Snapshot:
    try:
        return percolator.Snapshot(executor_cluster(spec.url, spec.connect), start_ts=spec.start_ts)
    except PercolatorError as e:
        raise _read_error(spec, where, e) from e


def _read_error(spec: _Spec, where: str, e: PercolatorError) -> ReadError:
    return ReadError(f"reading table {spec.table!r} at start_ts {spec.start_ts} ({where}) "
                     f"failed: {type(e).__name__}: {e}")


def _where(start: bytes | None, stop: bytes | None) -> str:
    return f"rows [{start!r}, {stop!r})"


def _scan(spec: _Spec, bounds: Iterable[Range],
          columns: tuple[str, ...] | None) -> Iterator[tuple[Range, bytes, dict[str, bytes]]]:
    for start, stop in bounds:
        where = _where(start, stop)
        snap = _snapshot(spec, where)
        try:
            for row, values in snap.scan(spec.table, start, stop, columns):
                yield (start, stop), row, values
        except PercolatorError as e:
            raise _read_error(spec, where, e) from e


def _read_partition(spec: _Spec, columns: tuple[str, ...],
                    bounds: Iterable[Range]) -> Iterator[tuple[bytes | None, ...]]:
    for _, row, values in _scan(spec, bounds, columns):
        yield (row, *[values.get(c) for c in columns])


def _columns_of_partition(spec: _Spec, bounds: Iterable[Range]) -> Iterator[str]:
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
    _require_pyspark()
    if is_connect(spark):
        return _read_over_connect(spark, url, table, columns, start_ts, splits,
                                  dict(connect_options or {}))
    if not hasattr(spark, "sparkContext"):
        raise InvalidArgument(f"spark must be a SparkSession, got {type(spark).__name__}")
    wanted = _check_columns(columns)
    check_workers(spark)
    options = dict(connect_options or {})
    with percolator.connect(url, **options) as cluster:
        internals(cluster).require_table(table)
        ts = _check_start_ts(start_ts, cluster)
        sc = spark.sparkContext
        ranges = plan_ranges(cluster, table, splits, default_parts=2 * sc.defaultParallelism,
                             columns=wanted)
        # Read the first row here: an error that every partition would meet (a
        # snapshot too old for garbage collection, a store refusing the read) is
        # raised now, before Spark starts work.
        probe = percolator.Snapshot(cluster, start_ts=ts).scan(
            table, ranges[0][0], ranges[0][1], wanted)
        try:
            next(probe, None)
        finally:
            getattr(probe, "close", lambda: None)()  # an HBase scanner, say
    spec = _Spec(url, tuple(sorted(options.items())), table, wanted, ts)
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
    from spark_loader._source import source_options

    wanted = _check_columns(columns)
    checked = _check_splits(splits)
    if isinstance(checked, list):
        raise InvalidArgument("splits as a list of row keys needs a classic SparkSession; on "
                              "Spark Connect give a number of partitions (or None)")
    options = source_options(connect_options)
    with percolator.connect(cluster_url, **connect_options) as cluster:
        internals(cluster).require_table(table)
        ts = _check_start_ts(start_ts, cluster)
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
