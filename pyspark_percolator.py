"""Spark's name for Percolator: ``spark.read.format("percolator")``.

PySpark (4.0+) registers a Python data source by itself when a top-level module named
``pyspark_<something>`` exposes ``DefaultSource``; this module is that entry point.
The data source lives in :mod:`spark_loader._source` and the modules it names (see
docs/spark.md).
"""

from spark_loader._source import PercolatorDataSource, register, snapshot_ts

DefaultSource = PercolatorDataSource

__all__ = ["DefaultSource", "PercolatorDataSource", "register", "snapshot_ts"]
