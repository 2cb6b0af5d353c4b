"""``writeStream.format("percolator")``: every micro-batch one bulk load, exactly
once across failures and restarts (:class:`PercolatorStreamWriter`)."""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from percolator import ConflictError, SnapshotTooOldError
from percolator.ext import AlreadyLoaded, BulkLoad, LoadTxn, begin_or_join
from spark_loader._batch_write import WriteReport, prepare_table, write_partition
from spark_loader._job import LoadError
from spark_loader._options import SourceOptions, bad
from spark_loader._records import ColumnMap
from spark_loader._spark import executor_cluster
from spark_loader._spark_types import row_key_is_text, value_fields

__all__ = ["PercolatorStreamWriter", "StreamReport"]

_PARK_AFTER_PREWRITE = "_PERCOLATOR_TEST_PARK_AFTER_PREWRITE"
"""Tests only: a directory. If the file ``park-prewritten-N`` is there, a streaming
write task of batch N that prewrote its rows writes ``prewritten-N`` and waits (to be
killed with its driver mid-batch); ``park-committed-N`` parks the driver's commit of
batch N after the commit point (before Spark records the batch done)."""


def _park(point: str, batch: int) -> None:
    park = os.environ.get(_PARK_AFTER_PREWRITE)
    if park and os.path.exists(os.path.join(park, f"park-{point}-{batch}")):
        with open(os.path.join(park, f"{point}-{batch}"), "w"):
            pass
        threading.Event().wait()


@dataclass(frozen=True, slots=True)
class StreamReport(WriterCommitMessage):  # type: ignore[misc]
    """What one task of a micro-batch did: its share of the batch's load *txn* (None
    for a task without rows, or a batch committed before)."""

    load_id: str
    txn: LoadTxn | None
    report: WriteReport


def _batch_of_task() -> tuple[str, int]:
    """(run id, batch id) of the running task, from the local properties Spark's
    micro-batch execution sets on its jobs (the job group is the query's run id)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    run = ctx.getLocalProperty("spark.jobGroup.id") if ctx is not None else None
    batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    if run is None or batch is None:
        raise bad("a streaming write task without Spark's micro-batch properties "
                   "(spark.jobGroup.id, streaming.sql.batchId); continuous processing "
                   "is not supported")
    return str(run), int(batch)


def _query_of(options: SourceOptions) -> str:
    """What names the query across its restarts: option queryId, else its checkpoint
    location (Spark's own query id does not reach the tasks)."""
    query = options.get("queryid", str)
    if query:
        return str(query)
    checkpoint = options.get("checkpointlocation", str)
    if not checkpoint:
        raise bad("a streaming write needs .option(\"checkpointLocation\", ...) (or "
                   "option queryId): it names the query, so that a micro-batch replayed "
                   "after a restart finds its earlier commit")
    return "cp" + hashlib.sha256(str(checkpoint).encode()).hexdigest()[:24]


class PercolatorStreamWriter(DataSourceStreamWriter):  # type: ignore[misc]
    """``writeStream.format("percolator")``, exactly once: every micro-batch is one
    bulk load whose id is (query id, batch id) and whose primary, the load's marker
    cell, records them; a batch Spark replays after a failure finds its load
    committed and writes nothing. The tasks begin the load (the first one) or join
    it, since no code of the source runs on the driver between batches before the
    commit; an attempt of an earlier run of the query (its driver died mid-batch) is
    rolled back by the first task of the replay."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.options = options
        fields = value_fields(schema, options.row_key)
        row_key_is_text(schema, options.row_key)
        self.mapping = ColumnMap.of(options.row_key, {f: f for f in fields})
        self.batch_cells: int = options.get("batchcells", int, 5000)
        _query_of(options)
        with options.cluster() as cluster:
            prepare_table(cluster, options)

    def write(self, iterator: Iterator[Any]) -> StreamReport:
        run, batch = _batch_of_task()
        return self.write_task(run, batch, iterator)

    def write_task(self, run: str, batch: int, iterator: Iterator[Any]) -> StreamReport:
        """:meth:`write` of the task of micro-batch *batch* of the query's run *run*,
        whose rows are *iterator* (``Row`` objects): what a task does once it knows
        where it stands (the tests play tasks with it, without Spark's jobs)."""
        query = _query_of(self.options)
        load_id = f"stream-{query}-{batch}"
        first = next(iterator, None)
        if first is None:
            return StreamReport(load_id, None, WriteReport(0, 0, 0, ()))
        cluster = executor_cluster(self.options.url, self.options.connect)
        begun = begin_or_join(cluster, self.options.table, load_id, f"spark-stream:{run}",
                              {"source": "spark stream", "query": query, "batch": batch})
        if isinstance(begun, AlreadyLoaded):
            return StreamReport(load_id, None, WriteReport(0, 0, 0, ()))
        report = write_partition(self.options, begun, self.mapping, self.batch_cells,
                                  itertools.chain([first], iterator))
        _park("prewritten", batch)
        return StreamReport(load_id, begun, report)

    def commit(self, messages: list[StreamReport | None], batchId: int) -> None:
        reports = [m for m in messages if m is not None]
        txns = {m.txn.start_ts: m.txn for m in reports if m.txn is not None}
        if not txns:
            return  # an empty batch, or one committed before
        if len(txns) > 1:
            raise LoadError(f"micro-batch {batchId}: its tasks wrote under {len(txns)} "
                            "load transactions (an attempt was rolled back while others "
                            "ran); nothing of it is visible; restart the query to replay it")
        (txn,) = txns.values()
        rows = sum(m.report.rows for m in reports)
        cells = sum(m.report.cells for m in reports)
        with self.options.cluster() as cluster:
            load = BulkLoad(cluster, self.options.table, txn.load_id)
            try:
                load.resume(txn)
                commit_ts = load.commit({"source": "spark stream", "batch": batchId,
                                         "load_id": txn.load_id, "rows": rows, "cells": cells})
            except (ConflictError, SnapshotTooOldError) as e:
                load.abort()
                raise LoadError(f"micro-batch {batchId} into {self.options.table!r} failed, "
                                f"nothing of it is visible: {e}") from e
            load.finish_leftovers(AlreadyLoaded(txn.load_id, txn.start_ts, commit_ts, {}))
        _park("committed", batchId)

    def abort(self, messages: list[StreamReport | None], batchId: int) -> None:
        txns = {m.txn.start_ts: m.txn for m in messages if m is not None and m.txn is not None}
        with self.options.cluster() as cluster:
            for txn in txns.values():
                load = BulkLoad(cluster, self.options.table, txn.load_id)
                try:
                    load.resume(txn)
                except ConflictError:
                    continue
                load.abort()
