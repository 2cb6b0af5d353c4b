"""The Spark job: parse, shuffle by row key, prewrite, commit, release.

Stages (one Percolator transaction, see :mod:`percolator._bulk`):

1. parse each input partition into ``(row, (cells, line))`` or a reject;
2. shuffle by row key and sort within partitions: duplicates of a key meet, and
   each partition writes its rows in key order;
3. *prewrite* job: every partition takes its locks in batches (data + lock cells)
   and reports its counts and rejects; the locked cells stay cached;
4. the driver checks the rejects against ``max_rejects`` and commits the primary
   (the commit point) or rolls it back;
5. *release* job: every partition writes write records (and notify cells of
   observed columns) and frees its locks, or frees them after a roll-back.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import percolator
from percolator import ConflictError, PercolatorError, SnapshotTooOldError, UnknownTableError
from percolator.ext import AlreadyLoaded, BulkLoad, LoadTxn, finish_rows, internals, prewrite_rows
from percolator.metrics import inc as _inc
from spark_loader._records import ColumnMap, Parsed, Reject, dedupe, parse_csv, parse_json, to_cells
from spark_loader._spark import check_workers, executor_cluster, require_classic, require_pyspark

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["LoadError", "LoadResult", "load_dataframe", "load_files"]

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "csv", "parquet")
MAX_REJECTS_KEPT = 10_000
"""Reject records kept per partition for the rejects file (all are counted)."""


class LoadError(PercolatorError):
    """The load failed; nothing of it is visible. ``result`` holds what was counted."""

    def __init__(self, message: str, result: LoadResult | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass(slots=True)
class LoadResult:
    """What a load did. ``already_loaded`` is True when an earlier run with the same
    ``load_id`` had committed (nothing was written again)."""

    table: str
    load_id: str
    rows: int = 0
    cells: int = 0
    rejects: int = 0
    seconds: float = 0.0
    start_ts: int = 0
    commit_ts: int | None = None
    already_loaded: bool = False
    rejects_path: str | None = None
    reject_samples: list[Reject] = field(default_factory=list)

    @property
    def cells_per_second(self) -> float:
        return self.cells / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One line for people: the load id, rows, cells, rejects, time, commit timestamp."""
        head = "already loaded earlier (nothing written again): " if self.already_loaded else ""
        text = (f"{head}load {self.load_id[:16]} into {self.table!r}: rows={self.rows} "
                f"cells={self.cells} rejects={self.rejects} seconds={self.seconds:.2f} "
                f"cells/s={self.cells_per_second:,.0f}")
        if self.commit_ts is not None:
            text += f" commit_ts={self.commit_ts}"
        if self.rejects_path:
            text += f" rejects_file={self.rejects_path}"
        return text


@dataclass(frozen=True, slots=True)
class _Options:
    url: str
    connect: tuple[tuple[str, Any], ...]
    batch_cells: int
    batch_delay: float  # tests only: pause after each prewrite batch


def _prewrite_partition(
    options: _Options, txn: LoadTxn, items: Iterable[tuple[bytes, Any]]
) -> Iterator[tuple[str, Any]]:
    """Yield ``("L", (row, {column: value}))`` per locked row, then one ``("S", stats)``."""
    rejects: list[Reject] = []
    stats: dict[str, Any] = {"rows": 0, "cells": 0, "rejects": 0, "error": None}

    def records() -> Iterator[tuple[bytes, tuple[dict[str, bytes], str]]]:
        for key, value in items:
            if not key:
                rejects.append(value)
                continue
            yield key, value

    def rows() -> Iterator[tuple[bytes, dict[str, bytes]]]:
        for row, cells in dedupe(records(), rejects):
            stats["rows"] += 1
            stats["cells"] += len(cells)
            yield row, cells

    pause = (lambda: time.sleep(options.batch_delay)) if options.batch_delay else None
    try:
        cluster = executor_cluster(options.url, options.connect)
        with _collector_paused():
            for row, cells in prewrite_rows(cluster, txn, rows(),
                                              batch_cells=options.batch_cells, after_batch=pause):
                yield "L", (row, cells)
    except PercolatorError as e:
        stats["error"] = f"{type(e).__name__}: {e}"
    stats["rejects"] = len(rejects)
    stats["reject_samples"] = [(r.reason, r.line, r.row) for r in rejects[:MAX_REJECTS_KEPT]]
    yield "S", stats


def _release_partition(
    options: _Options, txn: LoadTxn, commit_ts: int | None, items: Iterable[tuple[str, Any]]
) -> None:
    cluster = executor_cluster(options.url, options.connect)
    rows = (value for kind, value in items if kind == "L")
    with _collector_paused():
        finish_rows(cluster, txn, rows, commit_ts, batch_cells=options.batch_cells)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a partition is written (in a Spark
    worker, one task at a time). The partition's objects (tuples, dicts, bytes) form no
    cycles, reference counting frees them, and the collector would otherwise walk the
    newly allocated ones every 700 allocations: about 6% of the time of the writes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# --- the driver ------------------------------------------------------------------------------


def _load_id(table: str, mapping: ColumnMap, source: str) -> str:
    text = json.dumps([table, mapping.row_key, mapping.columns, source], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _source_fingerprint(path: str, fmt: str) -> str:
    """The input's identity for the load id: paths, sizes and mtimes of local files."""
    entries: list[Any] = [fmt, path]
    local = path[len("file://"):] if path.startswith("file://") else path
    if "://" not in local and os.path.exists(local):
        files = [local] if os.path.isfile(local) else sorted(
            os.path.join(d, f) for d, _, names in os.walk(local) for f in names
            if not f.startswith((".", "_"))
        )
        for name in files:
            st = os.stat(name)
            entries.append((os.path.abspath(name), st.st_size, st.st_mtime_ns))
    return json.dumps(entries)


def _write_rejects(path: str, rejects: list[Reject]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for reject in rejects:
            f.write(reject.to_json() + "\n")


def _run(
    spark: SparkSession,
    parsed: RDD[Parsed],
    *,
    url: str,
    table: str,
    mapping: ColumnMap,
    load_id: str,
    info: dict[str, Any],
    create_table: bool,
    observe: Iterable[str],
    max_rejects: int | None,
    rejects_path: str | None,
    partitions: int | None,
    batch_cells: int,
    connect_options: Mapping[str, Any],
    test_hooks: Mapping[str, Any],
) -> LoadResult:
    from pyspark import StorageLevel

    check_workers(spark)
    began = time.monotonic()
    result = LoadResult(table=table, load_id=load_id)
    if rejects_path:
        rejects_path = rejects_path.replace("{load_id}", load_id[:12])
    try:
        cluster = percolator.connect(url, **connect_options)
    except PercolatorError as e:
        raise LoadError(f"cannot reach the store {url}: {e}") from e
    try:
        if create_table:
            cluster.create_table(table)
        else:
            try:
                internals(cluster).require_table(table)
            except UnknownTableError as e:
                raise LoadError(f"unknown table: {e}") from e
        for column in observe:
            cluster.observe(table, column)
        load = BulkLoad(cluster, table, load_id)
        begun = load.begin({**info, "table": table, "load_id": load_id})
        if not isinstance(begun, AlreadyLoaded):
            _inc("percolator_transactions_begun_total", "bulk")
        if isinstance(begun, AlreadyLoaded):
            leftovers = 0 if load.is_finished() else load.finish_leftovers(begun)
            log.info("load %s committed before at %d; %d leftover locks released",
                     load_id, begun.commit_ts, leftovers)
            result.already_loaded = True
            result.start_ts, result.commit_ts = begun.start_ts, begun.commit_ts
            for name in ("rows", "cells", "rejects"):
                setattr(result, name, int(begun.info.get(name, 0)))
            result.seconds = time.monotonic() - began
            return result
        txn = begun
        result.start_ts = txn.start_ts
        options = _Options(url, tuple(sorted(connect_options.items())), batch_cells,
                           float(test_hooks.get("batch_delay", 0.0)))
        n = partitions or spark.sparkContext.defaultParallelism
        keyed = parsed.map(lambda p: (b"", p) if isinstance(p, Reject) else p)
        shuffled = keyed.repartitionAndSortWithinPartitions(n, lambda k: zlib.crc32(k) % n)
        locked = shuffled.mapPartitions(
            lambda items: _prewrite_partition(options, txn, items)
        ).persist(StorageLevel.MEMORY_AND_DISK)
        committed: int | None = None
        try:
            spark.sparkContext.setJobDescription(f"percolator load {load_id[:12]}: prewrite")
            stats = locked.filter(lambda kv: kv[0] == "S").map(lambda kv: kv[1]).collect()
            log.debug("load %s: parse, shuffle and prewrite took %.2fs", load_id[:12],
                      time.monotonic() - began)
            errors = [s["error"] for s in stats if s["error"]]
            result.rows = sum(s["rows"] for s in stats)
            result.cells = sum(s["cells"] for s in stats)
            result.rejects = sum(s["rejects"] for s in stats)
            result.reject_samples = sorted(
                (Reject(*r) for s in stats for r in s["reject_samples"]),
                key=lambda r: (r.line, r.reason),
            )
            if rejects_path and result.reject_samples:
                _write_rejects(rejects_path, result.reject_samples)
                result.rejects_path = rejects_path
            failure: str | None = None
            if errors:
                failure = errors[0]
            elif load.lost is not None:
                failure = str(load.lost)
            elif max_rejects is not None and result.rejects > max_rejects:
                failure = (f"{result.rejects} rejects, more than --max-rejects {max_rejects}"
                           + (f" (see {rejects_path})" if result.rejects_path else ""))
            if failure is None:
                try:
                    committed = load.commit({**info, "table": table, "load_id": load_id,
                                             "rows": result.rows, "cells": result.cells,
                                             "rejects": result.rejects})
                except (ConflictError, SnapshotTooOldError) as e:
                    failure = str(e)
                    _inc("percolator_transactions_conflicted_total", "bulk")
                else:
                    result.commit_ts = committed
                    _inc("percolator_transactions_committed_total", "bulk")
                    _inc("percolator_loader_rows_total", amount=result.rows)
                    _inc("percolator_loader_rejects_total", amount=result.rejects)
                    if test_hooks.get("crash_after_commit"):
                        os._exit(137)
            if failure is not None:
                load.abort()
            spark.sparkContext.setJobDescription(f"percolator load {load_id[:12]}: release")
            released = time.monotonic()
            locked.foreachPartition(
                lambda items: _release_partition(options, txn, committed, items)
            )
            log.debug("load %s: release took %.2fs", load_id[:12], time.monotonic() - released)
            if committed is not None:
                load.mark_finished(committed)
            # The load's locks are gone: reads skip locks again.
            internals(cluster).sweep_locks(force=True)
            if failure is not None:
                result.seconds = time.monotonic() - began
                raise LoadError(f"load {load_id[:16]} into {table!r} failed, nothing of it "
                                f"is visible: {failure}", result)
        except BaseException:
            if committed is None:
                load.abort()
            raise
        finally:
            locked.unpersist()
        result.seconds = time.monotonic() - began
        return result
    finally:
        cluster.close()


def load_dataframe(
    df: DataFrame,
    url: str,
    table: str,
    row_key: str,
    columns: Mapping[str, str],
    *,
    load_id: str | None = None,
    create_table: bool = True,
    observe: Iterable[str] = (),
    max_rejects: int | None = None,
    rejects_path: str | None = None,
    partitions: int | None = None,
    batch_cells: int = 5000,
    connect_options: Mapping[str, Any] | None = None,
) -> LoadResult:
    """Load the rows of *df* into *table* of the cluster at *url* as one transaction.

    *row_key* names the field that gives each row's key; *columns* maps field names
    to ``"family:qualifier"`` columns. *load_id* identifies the load for reruns (a
    rerun of a committed load writes nothing; a rerun after a crash loads again);
    by default it is derived from *table*, the mapping and ``df.semanticHash()``,
    so pass your own when the same plan can read different data. *observe* lists
    columns to register as observed first. With *create_table* False a missing
    table fails the load. *rejects_path*, if given, receives the rejects as JSON
    lines. *connect_options* go to :func:`percolator.connect` on the driver and on
    every executor.

    .. warning:: blocks until the Spark jobs finish.
    :raises LoadError: when the load fails (too many rejects, a write-write conflict,
        a cell kept locked, an unreachable store); nothing of it is then visible.
    """
    require_pyspark()
    require_classic(df.sparkSession, "load_dataframe")
    mapping = ColumnMap.of(row_key, columns)
    missing = [f for f in mapping.fields() if f not in df.columns]
    if missing:
        raise LoadError(f"unknown field(s) {missing} in the mapping: the DataFrame has "
                        f"columns {df.columns}")
    if load_id is None:
        load_id = _load_id(table, mapping, f"dataframe:{df.semanticHash()}")
    wanted = df.select(*mapping.fields())

    def parse(rows: Iterable[Any]) -> Iterator[Parsed]:
        for r in rows:
            record = r.asDict(recursive=True)
            yield to_cells(record, mapping, json.dumps(record, default=str, sort_keys=True))

    return _run(
        df.sparkSession, wanted.rdd.mapPartitions(parse), url=url, table=table,
        mapping=mapping, load_id=load_id, info={"source": "dataframe"},
        create_table=create_table, observe=observe, max_rejects=max_rejects,
        rejects_path=rejects_path, partitions=partitions, batch_cells=batch_cells,
        connect_options=connect_options or {}, test_hooks={},
    )


def load_files(
    spark: SparkSession,
    path: str,
    fmt: str,
    url: str,
    table: str,
    row_key: str,
    columns: Mapping[str, str],
    *,
    load_id: str | None = None,
    create_table: bool = True,
    observe: Iterable[str] = (),
    max_rejects: int | None = None,
    rejects_path: str | None = None,
    partitions: int | None = None,
    batch_cells: int = 5000,
    connect_options: Mapping[str, Any] | None = None,
    test_hooks: Mapping[str, Any] | None = None,
) -> LoadResult:
    """Load the file(s) at *path* in format *fmt* (``jsonl``, ``csv`` with a header
    line, ``parquet``); see :func:`load_dataframe` for the other arguments. The
    default *load_id* is derived from the table, the mapping, the format and the
    files' paths, sizes and modification times.
    """
    require_pyspark()
    require_classic(spark, "load_files")
    if fmt not in FORMATS:
        raise percolator.InvalidArgument(f"unknown format {fmt!r}: expected one of {FORMATS}")
    mapping = ColumnMap.of(row_key, columns)
    if load_id is None:
        load_id = _load_id(table, mapping, _source_fingerprint(path, fmt))
    sc = spark.sparkContext
    n = partitions or sc.defaultParallelism
    parsed: RDD[Parsed]
    if fmt == "parquet":
        df = spark.read.parquet(path)
        missing = [f for f in mapping.fields() if f not in df.columns]
        if missing:
            raise LoadError(f"unknown field(s) {missing} in the mapping: {path} has "
                            f"columns {df.columns}")

        def parse_rows(rows: Iterable[Any]) -> Iterator[Parsed]:
            for r in rows:
                record = r.asDict(recursive=True)
                yield to_cells(record, mapping, json.dumps(record, default=str, sort_keys=True))

        parsed = df.select(*mapping.fields()).rdd.mapPartitions(parse_rows)
    else:
        lines = sc.textFile(path, minPartitions=n)
        if fmt == "jsonl":
            parsed = lines.mapPartitions(lambda it: parse_json(it, mapping))
        else:
            import csv

            first = lines.take(1)
            if not first:
                raise LoadError(f"{path}: no CSV header line (empty input)")
            header_line = first[0]
            header = next(csv.reader([header_line]))
            missing = [f for f in mapping.fields() if f not in header]
            if missing:
                raise LoadError(f"unknown field(s) {missing} in the mapping: the CSV header "
                                f"of {path} has {header}")
            parsed = lines.mapPartitions(lambda it: parse_csv(it, mapping, header, header_line))
    return _run(
        spark, parsed, url=url, table=table, mapping=mapping, load_id=load_id,
        info={"source": path, "format": fmt}, create_table=create_table, observe=observe,
        max_rejects=max_rejects, rejects_path=rejects_path, partitions=partitions,
        batch_cells=batch_cells, connect_options=connect_options or {},
        test_hooks=test_hooks or {},
    )
