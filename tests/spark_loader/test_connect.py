"""spark_loader's functions on a Spark Connect session (no sparkContext, no RDDs):
read_table and export_table go through format("percolator")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import percolator
from spark_loader import export_table, load_dataframe, read_table, start_ts_of

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def test_read_table_and_export_table_on_spark_connect(spark_connect: Any, tmp_path: Path) -> None:
    """A read at one snapshot (a later commit is not in a read at the first one's
    timestamp), every column found when none is named, and both export formats."""
    url = f"sqlite://{tmp_path}/c.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"a", "f:v", b"1")
            txn.set("t", b"a", "g:w", "é".encode())
            txn.set("t", b"b", "f:v", b"2")
    df = read_table(spark_connect, url, "t", ["f:v"])
    assert sorted((bytes(r[0]), bytes(r[1])) for r in df.collect()) == [(b"a", b"1"), (b"b", b"2")]
    ts = start_ts_of(df)
    with percolator.connect(url) as cluster, percolator.Transaction(cluster) as txn:
        txn.set("t", b"c", "f:v", b"3")
    everything = read_table(spark_connect, url, "t")
    assert everything.columns == ["row", "f:v", "g:w"]
    assert len(everything.collect()) == 3
    then = read_table(spark_connect, url, "t", ["f:v"], start_ts=ts)
    assert len(then.collect()) == 2
    result = export_table(spark_connect, url, "t", "jsonl", str(tmp_path / "out"), start_ts=ts)
    assert result.rows == 2 and result.start_ts == ts
    lines = [json.loads(line) for p in sorted((tmp_path / "out").glob("part-*"))
             for line in p.read_text().splitlines()]
    assert sorted(lines, key=lambda r: r["row"]) == [
        {"row": "a", "f:v": "1", "g:w": "é"}, {"row": "b", "f:v": "2"}]
    parquet = export_table(spark_connect, url, "t", "parquet", str(tmp_path / "pq"))
    assert parquet.rows == 3


def test_load_dataframe_on_spark_connect_names_the_data_source_instead(
    spark_connect: Any, tmp_path: Path
) -> None:
    df = spark_connect.createDataFrame([("a", "1")], "k string, v string")
    with pytest.raises(percolator.InvalidArgument, match=r"load_dataframe needs a classic "
                       r"SparkSession .* df\.write\.format\(\"percolator\"\)"):
        load_dataframe(df, f"sqlite://{tmp_path}/l.db", "t", "k", {"v": "f:v"})
