"""``format("percolator")``: a Percolator table as a PySpark (4.0+) Python data source.

Spark finds :class:`PercolatorDataSource` by itself through the top-level module
``pyspark_percolator`` (it looks for ``pyspark_*`` modules exposing ``DefaultSource``);
``spark.dataSource.register(PercolatorDataSource)`` works too. Where each piece runs
(pyspark 4's ``pyspark/sql/worker``): ``schema()`` and ``reader()``/``partitions()``
in short-lived Python workers the driver's JVM starts, ``read()`` in the executors'
workers with the reader pickled there, so everything a reader carries is plain data
(:class:`~spark_loader._options.SourceOptions`, the start timestamp, the row ranges);
nothing is shared with the Python process that built the query.

The source's parts, each in its module: its options (:mod:`spark_loader._options`),
values and Spark types (:mod:`spark_loader._spark_types`), the batch read
(:mod:`spark_loader._batch_read`), the batch write (:mod:`spark_loader._batch_write`),
the streaming write (:mod:`spark_loader._stream_write`) and the change feed
(:mod:`spark_loader._change_feed`). See docs/spark.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource

import percolator
from percolator.ext import internals
from spark_loader._batch_read import PercolatorReader
from spark_loader._batch_write import PercolatorWriter
from spark_loader._change_feed import PercolatorChangeFeed, change_schema, is_change_schema
from spark_loader._options import NAME, SourceOptions, bad
from spark_loader._spark import is_connect, local_workers_run_this_python
from spark_loader._stream_write import PercolatorStreamWriter

__all__ = ["PercolatorDataSource", "register", "snapshot_ts"]


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
            raise bad("the change feed (option readChangeFeed) is read with "
                       "spark.readStream; a batch read gives the table at one snapshot")
        if self.checked.columns is None and is_change_schema(schema, self.checked.row_key):
            raise bad("name the columns to read: option columns "
                       "(\"family:qualifier,...\"), or a schema with .schema(...) "
                       f"(field {self.checked.row_key!r} for the row key, one field per "
                       "column, typed binary, string, long, double, boolean...)")
        return PercolatorReader(self.checked, schema)

    def streamReader(self, schema: T.StructType) -> PercolatorChangeFeed:
        return PercolatorChangeFeed(self.checked, schema)

    def writer(self, schema: T.StructType, overwrite: bool) -> PercolatorWriter:
        if overwrite:
            raise bad("mode overwrite is refused: a Percolator table is not replaced "
                       "wholesale (it keeps every version, readers at older snapshots "
                       "still see them, and observers react to each change); use "
                       "mode(\"append\"), which writes the DataFrame's cells as one "
                       "transaction over what is there, or write to a new table")
        return PercolatorWriter(self.checked, schema)

    def streamWriter(self, schema: T.StructType, overwrite: bool) -> PercolatorStreamWriter:
        if overwrite:
            raise bad("output mode complete is refused: a Percolator table is not "
                       "replaced wholesale; use outputMode(\"append\") or \"update\"")
        return PercolatorStreamWriter(self.checked, schema)
