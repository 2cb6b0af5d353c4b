"""PySpark bulk loader: seed a Percolator table from files or a DataFrame, atomically.

::

    from pyspark.sql import SparkSession
    from spark_loader import load_dataframe

    spark = SparkSession.builder.getOrCreate()
    df = spark.read.json("crawl.jsonl")               # any DataFrame with url and html
    result = load_dataframe(df, "sqlite:///var/lib/app/repo.db", "documents",
                            row_key="url", columns={"html": "raw:html"})
    print(result.summary())

The whole load is one Percolator transaction (see :mod:`percolator._bulk`): readers
see all of it or none of it; a rerun of a committed load writes nothing again; a
rerun after a crash loads again. Command line: ``python -m spark_loader --help``.
The read side, :func:`read_table`, gives a table as a DataFrame read at one snapshot
timestamp; ``python -m spark_loader export`` writes it to Parquet or JSON lines. A job of
its own over the same partitions (a raw scan to compare with, say) takes the row-key
ranges :func:`read_table` would read from :func:`plan_ranges`, and in its tasks the
cluster of their worker process from :func:`executor_cluster`.
PySpark is needed only when a load or a read runs: ``pip install 'percolator-txn[spark]'``.
"""

from spark_loader._export import ExportResult, export_table
from spark_loader._job import LoadError, LoadResult, load_dataframe, load_files
from spark_loader._read import decode_columns, read_table, start_ts_of
from spark_loader._records import Reject
from spark_loader._snapshot import ReadError, plan_ranges
from spark_loader._spark import executor_cluster

__all__ = [
    "ExportResult",
    "LoadError",
    "LoadResult",
    "ReadError",
    "Reject",
    "decode_columns",
    "executor_cluster",
    "export_table",
    "load_dataframe",
    "load_files",
    "plan_ranges",
    "read_table",
    "start_ts_of",
]
