"""The change feed (``readStream.format("percolator").option("readChangeFeed",
"true")``, spark_loader._change_feed) played without Spark's jobs: its offsets,
partitions and records as Spark's micro-batch loop asks for them, on the embedded
store. PySpark is imported for its data source classes; no JVM starts, so these tests
carry no ``spark`` mark and run in the mutation script's ``changes`` group (the feed's
store half is tests/spark_loader/test_changes.py; its Spark runs and kill -9 restarts
are in tests/spark_loader/test_source.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests._spark import require_pyspark_module

require_pyspark_module()

from pyspark.sql import Row  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

import percolator  # noqa: E402
from spark_loader._change_feed import _ts_of  # noqa: E402
from spark_loader._source import PercolatorDataSource  # noqa: E402


def test_micro_batches_written_then_read_back_through_the_change_feed(tmp_path: Path) -> None:
    """The fast twin of the round trip below, run by default, without Spark's jobs:
    two micro-batches through the stream writer (``write_task`` and ``commit``, two
    tasks each), then the change feed from the earliest commit (``availableNow``,
    string-typed as the schema asks): every written cell once, at the commit
    timestamp of its micro-batch's one transaction; a later run of the feed from the
    offset the first ended at adds only a later commit."""

    url = f"sqlite://{tmp_path}/rt.db"
    schema = T.StructType([T.StructField("row", T.StringType()),
                           T.StructField("v:n", T.LongType())])
    writer = PercolatorDataSource({"url": url, "table": "t", "queryId": "rt"}).streamWriter(
        schema, False)
    for batch in range(2):
        rows = [Row(**{"row": f"k{batch}-{i}", "v:n": batch * 10 + i}) for i in range(5)]
        reports = [writer.write_task("run", batch, iter(rows[:3])),
                   writer.write_task("run", batch, iter(rows[3:]))]
        writer.commit(list(reports), batch)
    source = PercolatorDataSource({"url": url, "table": "t", "readChangeFeed": "true",
                                   "startingTs": "earliest"})
    feed_schema = T.StructType([T.StructField("row", T.StringType()),
                                T.StructField("column", T.StringType()),
                                T.StructField("value", T.StringType()),
                                T.StructField("commit_ts", T.LongType())])

    def feed(start: dict[str, int] | None) -> tuple[list[tuple[Any, ...]], dict[str, int]]:
        reader = source.streamReader(feed_schema)
        offset = reader.initialOffset() if start is None else start
        reader.prepareForTriggerAvailableNow()
        got: list[tuple[Any, ...]] = []
        while _ts_of(offset) < (reader.target or 0):
            end = reader.latestOffset(offset, None)
            got += [tuple(r) for part in reader.partitions(offset, end) for r in reader.read(part)]
            offset = end
        return sorted(got), offset

    got, offset = feed(None)
    assert [(r, c, v) for r, c, v, _ in got] == sorted(
        (f"k{b}-{i}", "v:n", str(b * 10 + i)) for b in range(2) for i in range(5))
    assert len({ts for *_, ts in got}) == 2  # one transaction per micro-batch
    with percolator.connect(url) as cluster, percolator.Transaction(cluster) as txn:
        txn.delete("t", b"k0-0", "v:n")
    added, _ = feed(offset)
    assert [(r, c, v) for r, c, v, _ in added] == [("k0-0", "v:n", None)]
