"""``df.write.format("percolator")``: a batch write, the whole DataFrame one
Percolator transaction (a bulk load, :mod:`percolator._bulk`); and what a write task
does, which the streaming writer's tasks do too (:func:`write_partition`)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage

import percolator
from percolator import ConflictError, PercolatorError, SnapshotTooOldError
from percolator.ext import (
    AlreadyLoaded,
    BulkLoad,
    LoadTxn,
    internals,
    prewrite_rows,
    refresh_primary,
)
from spark_loader._job import MAX_REJECTS_KEPT, LoadError
from spark_loader._options import SourceOptions
from spark_loader._records import ColumnMap, Reject, to_cells
from spark_loader._spark import executor_cluster
from spark_loader._spark_types import row_key_is_text, value_fields

__all__ = ["PercolatorWriter", "WriteReport", "prepare_table", "write_partition"]


@dataclass(frozen=True, slots=True)
class WriteReport(WriterCommitMessage):  # type: ignore[misc]
    """What one write task did (its commit message to the driver)."""

    rows: int
    cells: int
    rejects: int
    samples: tuple[tuple[str, str, str | None], ...]
    """The first rejects: ``(reason, record as JSON, row)``."""


def _keep_alive(cluster: percolator.Cluster, txn: LoadTxn, stop: threading.Event,
                lost: list[PercolatorError]) -> None:
    period = max(txn.ttl_ms / 3000, 0.05)
    while not stop.wait(period):
        try:
            refresh_primary(cluster, txn)
        except PercolatorError as e:
            lost.append(e)
            return


def write_partition(options: SourceOptions, txn: LoadTxn, mapping: ColumnMap,
                     batch_cells: int, rows: Iterator[Any]) -> WriteReport:
    """Prewrite the cells of one Spark partition for the load *txn*, keeping the
    load's primary alive meanwhile (the process that began the load has moved on)."""
    cluster = executor_cluster(options.url, options.connect)
    rejects: list[Reject] = []
    counts = {"rows": 0, "cells": 0}

    def parsed() -> Iterator[tuple[bytes, dict[str, bytes]]]:
        for r in rows:
            record = r.asDict(recursive=True)
            # The record's JSON is only a reject's line here (no dedupe reads it, unlike
            # the bulk loader's): made for rejects alone, it was half a row's parsing.
            got = to_cells(record, mapping, "")
            if isinstance(got, Reject):
                rejects.append(replace(got, line=json.dumps(record, default=str,
                                                            sort_keys=True)))
                continue
            row, (cells, _) = got
            counts["rows"] += 1
            counts["cells"] += len(cells)
            yield row, cells

    stop, lost = threading.Event(), list[PercolatorError]()
    refresher = threading.Thread(target=_keep_alive, args=(cluster, txn, stop, lost),
                                 name=f"percolator-load-{txn.load_id}", daemon=True)
    refresher.start()
    try:
        for _ in prewrite_rows(cluster, txn, parsed(), batch_cells=batch_cells):
            if lost:
                raise lost[0]
    finally:
        stop.set()
        refresher.join()
    if lost:
        raise lost[0]
    return WriteReport(counts["rows"], counts["cells"], len(rejects),
                       tuple((r.reason, r.line, r.row) for r in rejects[:MAX_REJECTS_KEPT]))


def prepare_table(cluster: percolator.Cluster, options: SourceOptions) -> None:
    """What both writers do on the driver before any task runs: create the table
    (option createTable, default true) or require it, and turn on the observed
    columns (option observe), so that tasks never race to create it."""
    if options.get("createtable", bool, True):
        cluster.create_table(options.table)
    else:
        internals(cluster).require_table(options.table)
    for column in (c.strip() for c in (options.get("observe", str) or "").split(",")):
        if column:
            cluster.observe(options.table, column)


class PercolatorWriter(DataSourceWriter):  # type: ignore[misc]
    """A batch write (mode append): the whole DataFrame is one Percolator transaction,
    a bulk load (:mod:`percolator._bulk`). :meth:`PercolatorDataSource.writer` begins
    it (prewrites its primary), every task prewrites its rows (:meth:`write`), and
    :meth:`commit` commits the primary, the commit point, then releases the locks."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.options = options
        fields = value_fields(schema, options.row_key)
        row_key_is_text(schema, options.row_key)
        self.mapping = ColumnMap.of(options.row_key, {f: f for f in fields})
        self.load_id: str = options.get("loadid", str) or uuid.uuid4().hex
        self.batch_cells: int = options.get("batchcells", int, 5000)
        self.txn: LoadTxn | None = None
        self.loaded: AlreadyLoaded | None = None
        with options.cluster() as cluster:
            prepare_table(cluster, options)
            load = BulkLoad(cluster, options.table, self.load_id)
            begun = load.begin(self._info())
            if isinstance(begun, AlreadyLoaded):
                self.loaded = begun
            else:
                self.txn = begun
                load.detach()  # the write tasks keep it alive from now on

    def _info(self, **counts: int) -> dict[str, Any]:
        return {"source": "spark data source", "table": self.options.table,
                "load_id": self.load_id, **counts}

    def write(self, iterator: Iterator[Any]) -> WriteReport:
        if self.txn is None:  # a rerun of a committed load: nothing to write
            return WriteReport(0, 0, 0, ())
        return write_partition(self.options, self.txn, self.mapping, self.batch_cells,
                                iterator)

    def commit(self, messages: list[WriteReport | None]) -> None:
        options = self.options
        with options.cluster() as cluster:
            load = BulkLoad(cluster, options.table, self.load_id)
            if self.loaded is not None:
                if not load.is_finished():
                    load.finish_leftovers(self.loaded)
                return
            assert self.txn is not None
            reports = [m for m in messages if m is not None]
            rows = sum(m.rows for m in reports)
            cells = sum(m.cells for m in reports)
            rejected = sum(m.rejects for m in reports)
            samples = sorted((Reject(*r) for m in reports for r in m.samples),
                             key=lambda r: (r.line, r.reason))
            path = options.get("rejectspath", str)
            if path and samples:
                path = path.replace("{load_id}", self.load_id[:12])
                with open(path, "w", encoding="utf-8") as f:
                    f.writelines(r.to_json() + "\n" for r in samples)
            limit = options.get("maxrejects", int)
            failure: str | None = None
            try:
                load.resume(self.txn)
                if limit is not None and rejected > limit:
                    failure = (f"{rejected} rejects, more than maxRejects {limit}"
                               + (f" (see {path})" if path and samples else "")
                               + (f"; first: {samples[0].reason}" if samples else ""))
                    load.abort()
                else:
                    commit_ts = load.commit(self._info(rows=rows, cells=cells,
                                                       rejects=rejected))
                    load.finish_leftovers(AlreadyLoaded(self.load_id, self.txn.start_ts,
                                                        commit_ts, {}))
                    internals(cluster).sweep_locks(force=True)
            except (ConflictError, SnapshotTooOldError) as e:
                load.abort()
                failure = str(e)
            if failure is not None:
                raise LoadError(f"write {self.load_id[:16]} into {options.table!r} failed, "
                                f"nothing of it is visible: {failure}")

    def abort(self, messages: list[WriteReport | None]) -> None:
        if self.txn is None:
            return
        with self.options.cluster() as cluster:
            load = BulkLoad(cluster, self.options.table, self.load_id)
            try:
                load.resume(self.txn)
            except ConflictError:
                return  # rolled back already
            load.abort()
