"""The streaming writer (``writeStream.format("percolator")``,
spark_loader._stream_write) played without Spark's jobs: what its tasks
(``write_task``) and the driver's ``commit`` and ``abort`` do to the store, on the
embedded store. PySpark is imported for its data source classes; no JVM starts, so
these tests carry no ``spark`` mark and run in the mutation script's ``changes`` group
(the Spark round trips and kill -9 restarts are in tests/spark_loader/test_source.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._spark import require_pyspark_module

require_pyspark_module()

from pyspark.sql import Row  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

import percolator  # noqa: E402
from percolator._bulk import (  # noqa: E402
    LOADS_TABLE,
    AlreadyLoaded,
    BulkLoad,
    begin_or_join,
    prewrite_rows,
)
from percolator._encoding import LOCK, Lock, decode_lock  # noqa: E402
from percolator._internals import internals  # noqa: E402
from percolator._store import Read  # noqa: E402
from spark_loader import LoadError  # noqa: E402
from spark_loader._batch_write import WriteReport  # noqa: E402
from spark_loader._source import PercolatorDataSource  # noqa: E402
from spark_loader._stream_write import PercolatorStreamWriter, StreamReport  # noqa: E402

SCHEMA = T.StructType([T.StructField("row", T.StringType()), T.StructField("v:n", T.LongType())])


def _writer(url: str, **options: str) -> PercolatorStreamWriter:
    return PercolatorDataSource({"url": url, "table": "t", **options}).streamWriter(
        SCHEMA, False)


def _rows(batch: int, count: int) -> Iterator[Any]:
    return iter([Row(**{"row": f"k{batch}-{i}", "v:n": batch * 100 + i}) for i in range(count)])


def _table(url: str) -> dict[bytes, bytes]:
    with percolator.connect(url) as cluster:
        return {r: v["v:n"] for r, v in percolator.Snapshot(cluster).scan("t")}


def _locks_held(url: str, table: str) -> list[tuple[bytes, str, int]]:
    """(row, column, start_ts) of every lock held in *table*, from the lock family."""
    with percolator.connect(url) as cluster:
        rows = internals(cluster).store.scan(table, None, None, [Read(LOCK)])
        return sorted((row, name, state.start_ts) for row, cells in rows
                      for name, versions in cells.items()
                      if isinstance(state := decode_lock(versions[0][1]), Lock))


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
    with pytest.raises(LoadError, match=r"^micro-batch 0: its tasks wrote under 2 load "
                                        r"transactions \(an attempt was rolled back while "
                                        r"others ran\); nothing of it is visible; restart the "
                                        r"query to replay it$"):
        writer.commit(messages, 0)
    writer.abort(messages, 0)  # what Spark does with a batch whose commit failed
    with percolator.connect(url) as cluster:
        assert dict(percolator.Snapshot(cluster).scan("t")) == {}
    replay = [task("spark-stream:run3", b"k0"), task("spark-stream:run3", b"k1")]
    writer.commit(list(replay), 0)
    with percolator.connect(url) as cluster:
        got = {r: v["v:n"] for r, v in percolator.Snapshot(cluster).scan("t")}
    assert got == {b"k0": b"0", b"k1": b"1"}


def _begun(url: str, load_id: str, owner: str) -> int | None:
    """The start timestamp of the attempt of load *load_id* that *owner* holds, or None
    (no attempt of *owner* is live: a new one begins, which the caller throws away)."""
    with percolator.connect(url) as cluster:
        before = BulkLoad(cluster, "t", load_id)._read_primary()[0]
        held = decode_lock(before) if before is not None else None
        txn = begin_or_join(cluster, "t", load_id, owner, {})
        assert not isinstance(txn, AlreadyLoaded)
        joined = isinstance(held, Lock) and held.start_ts == txn.start_ts
        return txn.start_ts if joined else None


def test_a_micro_batch_is_one_load_named_by_the_query_and_the_batch(tmp_path: Path) -> None:
    """Two tasks of micro-batch 3 write under one load transaction, named after the
    query's checkpoint location and the batch (a name that survives the query's
    restarts and the upgrades of this library: a replay looks its batch's load up by
    it); the commit makes every row visible at once, records the batch's rows and cells
    and rolls every row's lock forward, so the load is finished. A task of the
    batch replayed after that (another run of the query, its rows as Spark reads them
    again) finds the load done and writes nothing."""
    url = f"sqlite://{tmp_path}/s.db"
    checkpoint = str(tmp_path / "cp")
    writer = _writer(url, checkpointLocation=checkpoint)
    rows = list(_rows(3, 5))
    reports = [writer.write_task("run1", 3, iter(rows[:2])),
               writer.write_task("run1", 3, iter(rows[2:]))]
    load_id = f"stream-cp{hashlib.sha256(checkpoint.encode()).hexdigest()[:24]}-3"
    assert [r.load_id for r in reports] == [load_id, load_id]
    assert [(r.report.rows, r.report.cells) for r in reports] == [(2, 2), (3, 3)]
    txns = {r.txn.start_ts for r in reports if r.txn is not None}
    assert len(txns) == 1 and len(_locks_held(url, "t")) == 5  # prewritten, one load
    writer.commit(list(reports), 3)
    assert _table(url) == {b"k3-%d" % i: b"%d" % (300 + i) for i in range(5)}
    assert _locks_held(url, "t") == [] and _locks_held(url, LOADS_TABLE) == []
    with percolator.connect(url) as cluster:
        assert BulkLoad(cluster, "t", load_id).is_finished()
        done = begin_or_join(cluster, "t", load_id, "spark-stream:run2", {})
    assert isinstance(done, AlreadyLoaded) and done.start_ts in txns
    assert done.info == {"source": "spark stream", "batch": 3, "load_id": load_id,
                         "rows": 5, "cells": 5}
    again = _writer(url, checkpointLocation=checkpoint)
    replay = again.write_task("run2", 3, iter([Row(**{"row": "other", "v:n": 1})]))
    assert replay == StreamReport(load_id, None, WriteReport(0, 0, 0, ()))
    again.commit([replay], 3)
    assert b"other" not in _table(url)


def test_queries_are_told_apart_by_query_id_else_by_checkpoint_location(tmp_path: Path) -> None:
    """Option queryId names the query (whatever its checkpoint location); without it,
    the checkpoint location does: two queries on different checkpoints write batch 0
    as two loads, a restart on the same checkpoint finds its batch 0 done. A stream
    write with neither is refused up front, saying what to set."""
    url = f"sqlite://{tmp_path}/s.db"
    named = _writer(url, queryId="q", checkpointLocation=str(tmp_path / "a"))
    assert named.write_task("r", 0, iter([Row(**{"row": "q", "v:n": 1})])).load_id == "stream-q-0"
    first, second = (_writer(url, checkpointLocation=str(tmp_path / cp)) for cp in "ab")
    for writer in (first, second):
        report = writer.write_task("r", 0, _rows(0, 1))
        assert report.txn is not None
        writer.commit([report], 0)
    assert len({first.write_task("r", 0, _rows(0, 1)).load_id,
                second.write_task("r", 0, _rows(0, 1)).load_id, "stream-q-0"}) == 3
    restarted = _writer(url, checkpointLocation=str(tmp_path / "a"))
    assert restarted.write_task("r2", 0, _rows(0, 1)).txn is None  # batch 0 done
    with pytest.raises(percolator.InvalidArgument,
                       match=r"^format\('percolator'\): a streaming write needs "
                             r"\.option\(\"checkpointLocation\", \.\.\.\) \(or option queryId\): "
                             r"it names the query, so that a micro-batch replayed after a restart "
                             r"finds its earlier commit$"):
        _writer(url)


def test_a_task_without_rows_begins_no_load_and_its_batch_commits_nothing(
    tmp_path: Path,
) -> None:
    """A micro-batch whose tasks got no rows: their reports hold no load transaction
    and count nothing, and the commit of their reports writes nothing."""
    url = f"sqlite://{tmp_path}/s.db"
    writer = _writer(url, queryId="q")
    reports = [writer.write_task("run1", 0, iter([])) for _ in range(2)]
    assert reports == [StreamReport("stream-q-0", None, WriteReport(0, 0, 0, ()))] * 2
    writer.commit([*reports, None], 0)
    assert _table(url) == {}


def test_a_batch_whose_load_was_rolled_back_before_its_commit_is_refused(
    tmp_path: Path,
) -> None:
    """The batch's load was rolled back after its tasks wrote (a task of another run
    of the query began it again, as after a lock's ttl): the commit refuses the batch
    with LoadError, nothing of it visible, so that Spark does not record it done."""
    url = f"sqlite://{tmp_path}/s.db"
    writer = _writer(url, queryId="q")
    report = writer.write_task("run1", 0, _rows(0, 2))
    with percolator.connect(url) as cluster:
        begin_or_join(cluster, "t", "stream-q-0", "spark-stream:run2", {})  # rolls back
    with pytest.raises(LoadError, match=r"micro-batch 0 into 't' failed, nothing of it is "
                                        r"visible: .*rolled back"):
        writer.commit([report], 0)
    assert _table(url) == {}


def test_abort_rolls_back_every_attempt_of_the_batch_still_live(tmp_path: Path) -> None:
    """Spark aborts a batch whose commit failed: every load transaction its tasks
    reported is rolled back at its primary (whether or not an earlier one of them was
    rolled back already), so the next run's first task begins the batch's load anew
    rather than joining a dead attempt."""
    url = f"sqlite://{tmp_path}/s.db"
    writer = _writer(url, queryId="q")
    lost = writer.write_task("run1", 0, _rows(0, 2))
    live = writer.write_task("run2", 0, _rows(0, 2))  # a task of run2 rolls run1's back
    assert lost.txn is not None and live.txn is not None
    assert _begun(url, "stream-q-0", "spark-stream:run2") == live.txn.start_ts
    writer.abort([None, lost, live], 0)
    assert _begun(url, "stream-q-0", "spark-stream:run2") is None
    with percolator.connect(url) as cluster:
        assert isinstance(begin_or_join(cluster, "t", "stream-q-0", "spark-stream:run3", {}),
                          percolator.ext.LoadTxn)
    assert _table(url) == {}


def test_a_write_outside_a_spark_micro_batch_task_is_refused(tmp_path: Path) -> None:
    """``write`` reads its run and batch from the Spark task's micro-batch properties;
    with none (no task here, or continuous processing, which sets no batch id) it
    refuses the rows with what it missed, and writes nothing."""
    url = f"sqlite://{tmp_path}/s.db"
    writer = _writer(url, queryId="q")
    with pytest.raises(percolator.InvalidArgument,
                       match=r"a streaming write task without Spark's micro-batch properties "
                             r"\(spark\.jobGroup\.id, streaming\.sql\.batchId\); continuous "
                             r"processing is not supported"):
        writer.write(_rows(0, 1))
    assert _table(url) == {}


@pytest.fixture
def spark_task() -> Iterator[Any]:
    """Sets the running Spark task's local properties as PySpark's Python worker does
    before it calls a writer (its TaskContext, whose ``_localProperties`` the worker
    fills from the JVM's task); forgets the task at the end."""
    from pyspark import TaskContext

    def in_task(properties: dict[str, str]) -> None:
        TaskContext._getOrCreate()._localProperties = properties

    yield in_task
    TaskContext._setTaskContext(None)  # type: ignore[arg-type]


def test_a_task_writes_under_its_run_and_micro_batch_from_spark_s_properties(
    tmp_path: Path, spark_task: Any,
) -> None:
    """``write`` names the batch's load from the micro-batch id Spark gives the task, and
    takes the query's run id (the job group) as its attempt's owner: a task of the next
    run of the query (the first run's driver died mid-batch) rolls the dead run's attempt
    back and begins its own, rather than joining it; the rows of the dead attempt stay
    unseen once the replay commits.

    Catches an owner that ignores the run (every run of the query the same owner): the
    replay would join the dead attempt, and its commit would show the dead run's rows."""
    url = f"sqlite://{tmp_path}/s.db"
    writer = _writer(url, queryId="q")
    spark_task({"spark.jobGroup.id": "run1", "streaming.sql.batchId": "3"})
    dead = writer.write(iter([Row(**{"row": "only-in-run1", "v:n": 1})]))
    assert dead.load_id == "stream-q-3" and dead.txn is not None
    assert _begun(url, "stream-q-3", "spark-stream:run1") == dead.txn.start_ts
    spark_task({"spark.jobGroup.id": "run2", "streaming.sql.batchId": "3"})
    replay = writer.write(iter([Row(**{"row": "k", "v:n": 2})]))
    assert replay.txn is not None and replay.txn.start_ts != dead.txn.start_ts
    writer.commit([replay], 3)
    assert _table(url) == {b"k": b"2"}


def test_a_batch_cells_option_that_is_not_a_number_is_refused_up_front(tmp_path: Path) -> None:
    """batchCells (the cells a task prewrites per store call) is read when the writer
    is made, on the driver: a value that is not an integer fails the query before any
    micro-batch, naming the option."""
    url = f"sqlite://{tmp_path}/s.db"
    with pytest.raises(percolator.InvalidArgument,
                       match=r"^format\('percolator'\): option batchcells must be an integer, "
                             r"got 'many'$"):
        _writer(url, queryId="q", batchCells="many")
    assert _writer(url, queryId="q", batchCells="2").batch_cells == 2
