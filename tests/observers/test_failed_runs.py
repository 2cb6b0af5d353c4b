"""A failed observer run stops holding garbage collection back at once, although its
error lives on: the worker logs it, and a handler that keeps records (pytest's capture,
a memory handler, an error reporter) keeps its traceback and so the run's frames."""

from __future__ import annotations

import gc
import logging

import percolator
from observers import Observer, Worker, wait_for_observers
from percolator._internals import internals
from percolator.testing import temporary_cluster


class _Refuses(Observer):
    table, column = "docs", "in:v"

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        txn.get("docs", row, column)
        raise ValueError(f"refused {row!r}")


class _Keeper(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_failed_run_is_closed_although_its_error_is_kept() -> None:
    keeper = _Keeper()
    log = logging.getLogger("observers")
    log.addHandler(keeper)
    try:
        with temporary_cluster() as cluster:
            with Worker(cluster, [_Refuses], max_failures=2, retry_delay=0.0):
                with percolator.Transaction(cluster) as txn:
                    txn.set("docs", b"d1", "in:v", b"x")
                wait_for_observers(cluster, 30)  # quarantined after two failed runs
            kept = [r for r in keeper.records if any(
                isinstance(a, ValueError) for a in (r.args or ()))]
            assert kept, "the worker no longer logs the error object: this test needs another"
            gc.collect()
            assert internals(cluster).safe_point.running() == []
    finally:
        log.removeHandler(keeper)
