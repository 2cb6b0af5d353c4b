"""Export a table, read at one snapshot, to Parquet or JSON lines.

The files have one record per Percolator row: field ``row`` (the row key), then one
field per column named ``family:qualifier``. Parquet keeps values as binary, exactly;
JSON lines hold UTF-8 text (a value that is not UTF-8 fails the export: use Parquet),
leaving out the columns a row has no value in. Either loads back with the bulk loader:
``--row-key row --column family:qualifier=family:qualifier`` per column.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from percolator import InvalidArgument
from spark_loader._compat import renamed_keyword
from spark_loader._options import ROW_KEY
from spark_loader._read import read_table, start_ts_of
from spark_loader._snapshot import ReadError
from spark_loader._spark import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["EXPORT_FORMATS", "ExportResult", "export_table"]

EXPORT_FORMATS = ("parquet", "jsonl")


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What an export wrote: *rows* records with *columns* at *start_ts* to *output*."""

    table: str
    output: str
    format: str
    start_ts: int
    columns: tuple[str, ...]
    rows: int
    partitions: int
    seconds: float

    def summary(self) -> str:
        """One line for people: rows, columns, start timestamp, where, how fast."""
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        return (f"exported {self.rows} rows of {self.table!r} ({len(self.columns)} columns: "
                f"{', '.join(self.columns)}) at start_ts {self.start_ts} to {self.output} "
                f"({self.format}, {self.partitions} partitions) in {self.seconds:.2f}s "
                f"= {rate:,.0f} rows/s; load back with --row-key {ROW_KEY} "
                + " ".join(f"--column {c}={c}" for c in self.columns))


def _json_lines(columns: tuple[str, ...],
                rows: Iterable[Any]) -> Iterator[str]:
    names = (ROW_KEY, *columns)
    for r in rows:
        record: dict[str, str] = {}
        for name, value in zip(names, r, strict=True):
            if value is None:
                continue
            try:
                record[name] = bytes(value).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ReadError(f"row {bytes(r[0])!r}: the value of {name} is not UTF-8 text "
                                f"({e.reason}); export to parquet, which keeps bytes") from None
        yield json.dumps(record, ensure_ascii=False, sort_keys=True)


@renamed_keyword("cluster_url", "url")
def export_table(
    spark: SparkSession,
    url: str,
    table: str,
    fmt: str,
    output: str,
    *,
    columns: Sequence[str] | None = None,
    start_ts: int | None = None,
    splits: int | Sequence[bytes] | None = None,
    connect_options: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Write *table* read at one snapshot (see :func:`~spark_loader.read_table` for
    *columns*, *start_ts*, *splits* and *connect_options*) to *output* in *fmt*
    (``parquet`` or ``jsonl``, a directory of part files as Spark writes them).

    .. warning:: blocks while the Spark job runs.
    :raises InvalidArgument: a bad format, an *output* that exists already, or any
        bad argument of :func:`~spark_loader.read_table`, before Spark starts work.
    """
    if fmt not in EXPORT_FORMATS:
        raise InvalidArgument(f"unknown export format {fmt!r}: expected one of {EXPORT_FORMATS}")
    if not isinstance(output, str) or not output:
        raise InvalidArgument(f"output must be a path, got {output!r}")
    local = output[len("file://"):] if output.startswith("file://") else output
    if "://" not in local and os.path.exists(local):
        raise InvalidArgument(f"output {output!r} exists already; remove it or name another")
    began = time.monotonic()
    df = read_table(spark, url, table, columns, start_ts, splits,
                    connect_options=connect_options)
    ts = start_ts_of(df)
    names = tuple(df.columns[1:])
    if is_connect(spark):
        return _export_over_connect(spark, df, table, fmt, output, ts, names, began)
    sc = spark.sparkContext
    counted = sc.accumulator(0)

    def count(rows: Iterable[Any]) -> Iterator[Any]:
        n = 0
        for r in rows:
            n += 1
            yield r
        counted.add(n)

    sc.setJobDescription(f"percolator export {table}@{ts} to {output}")
    try:
        rows = df.rdd.mapPartitions(count)
        if fmt == "parquet":
            spark.createDataFrame(rows, df.schema, verifySchema=False).write.parquet(output)
        else:
            rows.mapPartitions(lambda rs: _json_lines(names, rs)).saveAsTextFile(output)
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
    return ExportResult(table, output, fmt, ts, names, int(counted.value),
                        df.rdd.getNumPartitions(), time.monotonic() - began)


def _export_over_connect(spark: SparkSession, df: DataFrame, table: str, fmt: str, output: str,
                         ts: int, names: tuple[str, ...], began: float) -> ExportResult:
    """:func:`export_table` on Spark Connect (no RDDs, no accumulators): DataFrame
    writers only; a value that is not UTF-8 fails a JSON export through Spark's
    ``validate_utf8``; the rows are counted from what was written."""
    from pyspark.sql import functions as F

    if fmt == "parquet":
        df.write.parquet(output)
        written = spark.read.parquet(output)
    else:
        fields = sorted([ROW_KEY, *names])
        record = F.struct(*[F.validate_utf8(F.col(f"`{n}`").cast("string")).alias(n)
                            for n in fields])
        df.select(F.to_json(record).alias("value")).write.text(output)
        written = spark.read.text(output)
    local = output[len("file://"):] if output.startswith("file://") else output
    parts = (len([n for n in os.listdir(local) if n.startswith("part-")])
             if "://" not in local else 0)
    return ExportResult(table, output, fmt, ts, names, written.count(), parts,
                        time.monotonic() - began)
