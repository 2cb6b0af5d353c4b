"""The streaming writer (``writeStream.format("percolator")``,
spark_loader._stream_write) played without Spark's jobs: what its tasks
(``write_task``) and the driver's ``commit`` and ``abort`` do to the store, on the
embedded store. PySpark is imported for its data source classes; no JVM starts, so
these tests carry no ``spark`` mark and run in the mutation script's ``changes`` group
(the Spark round trips and kill -9 restarts are in tests/spark_loader/test_source.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._spark import require_pyspark_module

require_pyspark_module()

from pyspark.sql import types as T  # noqa: E402

import percolator  # noqa: E402
from percolator._bulk import AlreadyLoaded, begin_or_join, prewrite_rows  # noqa: E402
from percolator._internals import internals  # noqa: E402
from spark_loader import LoadError  # noqa: E402
from spark_loader._batch_write import WriteReport  # noqa: E402
from spark_loader._source import PercolatorDataSource  # noqa: E402
from spark_loader._stream_write import StreamReport  # noqa: E402


def test_a_stream_writer_creates_its_table_unless_create_table_is_false(tmp_path: Path) -> None:
    """writeStream honours createTable (default true) and observe as write does: the
    driver creates the table before the first micro-batch, whose tasks would otherwise
    fail on a missing table; with createTable false a missing table is refused up
    front. (The data source object is what Spark's planning worker calls.)"""

    url = f"sqlite://{tmp_path}/s.db"
    schema = T.StructType([T.StructField("row", T.StringType()),
                           T.StructField("v:n", T.LongType())])
    options = {"url": url, "checkpointLocation": str(tmp_path / "cp")}
    PercolatorDataSource({**options, "table": "made", "observe": "v:n"}).streamWriter(
        schema, False)
    with percolator.connect(url) as cluster:
        internals(cluster).require_table("made")
    with pytest.raises(percolator.UnknownTableError, match="missing"):
        PercolatorDataSource({**options, "table": "missing", "createTable": "false"}
                             ).streamWriter(schema, False)


@pytest.mark.parametrize("live_first", [True, False], ids=["live-first", "rolled-back-first"])
def test_a_micro_batch_written_under_two_load_transactions_is_refused(
    tmp_path: Path, live_first: bool,
) -> None:
    """Two tasks of one micro-batch: the first begins the batch's load and prewrites
    its row; its attempt is rolled back (here by a task of another run, as a lock ttl
    expiry would) and the second task begins the load again and prewrites its own row.
    The driver's commit gets their reports, under two load transactions: it must
    refuse the batch (LoadError), with nothing of it visible, so that Spark does not
    record it done; the replay writes every row once. (The tasks' Spark half is the
    stream round trips' business, opt-in; this plays the store half, without jobs.)

    Catches the commit that takes one of the batch's transactions (whichever comes
    first, as the reports' order makes it) and commits it: the live one commits, the
    batch counts as done, and the row prewritten under the rolled-back one never
    appears."""

    url = f"sqlite://{tmp_path}/s.db"
    schema = T.StructType([T.StructField("row", T.StringType()),
                           T.StructField("v:n", T.LongType())])
    writer = PercolatorDataSource({"url": url, "table": "t", "queryId": "q"}).streamWriter(
        schema, False)
    load_id, info = "stream-q-0", {"source": "spark stream", "query": "q", "batch": 0}

    def task(owner: str, row: bytes) -> StreamReport:
        with percolator.connect(url) as cluster:
            txn = begin_or_join(cluster, "t", load_id, owner, info)
            assert not isinstance(txn, AlreadyLoaded)
            list(prewrite_rows(cluster, txn, [(row, {"v:n": row[1:]})]))
        return StreamReport(load_id, txn, WriteReport(1, 1, 0, ()))

    first = task("spark-stream:run1", b"k0")
    second = task("spark-stream:run2", b"k1")  # rolls the first attempt back
    assert first.txn is not None and second.txn is not None
    assert first.txn.start_ts != second.txn.start_ts
    messages: list[StreamReport | None] = [second, first] if live_first else [first, second]
    with pytest.raises(LoadError, match="under 2 load transactions"):
        writer.commit(messages, 0)
    writer.abort(messages, 0)  # what Spark does with a batch whose commit failed
    with percolator.connect(url) as cluster:
        assert dict(percolator.Snapshot(cluster).scan("t")) == {}
    replay = [task("spark-stream:run3", b"k0"), task("spark-stream:run3", b"k1")]
    writer.commit(list(replay), 0)
    with percolator.connect(url) as cluster:
        got = {r: v["v:n"] for r, v in percolator.Snapshot(cluster).scan("t")}
    assert got == {b"k0": b"0", b"k1": b"1"}
