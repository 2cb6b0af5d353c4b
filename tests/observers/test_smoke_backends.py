"""Observers smoke test on every backend (sqlite, hbase, bigtable): a worker with a
two-stage chain processes what a transaction committed, at most one observer
commit per change, and ``wait_for_observers`` returns."""

from __future__ import annotations

import threading
from collections import Counter

import percolator
from observers import Observer, Worker, wait_for_observers
from percolator import Snapshot, Transaction, TransactionBase
from tests._backends import WITH_FAULTS, backend_fixture

ROWS = [b"doc%02d" % i for i in range(6)]


backend = backend_fixture(WITH_FAULTS)


class Upper(Observer):
    """docs/raw:v -> docs/up:v (observed by the second stage)."""

    table, column = "docs", "raw:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        value = txn.get(self.table, row, column) or b""
        txn.set(self.table, row, "up:v", value.upper())


class Count(Observer):
    """docs/up:v -> docs/out:v: the value and its length (second stage)."""

    table, column = "docs", "up:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        value = txn.get(self.table, row, column) or b""
        txn.set(self.table, row, "out:v", b"%s/%d" % (value, len(value)))


def test_a_two_stage_chain_runs_once_per_change(cluster: percolator.Cluster, backend: str) -> None:
    commits: Counter[tuple[str, bytes, int]] = Counter()
    lock = threading.Lock()

    def on_commit(
        observer: Observer, table: str, row: bytes, column: str, change_ts: int, commit_ts: int
    ) -> None:
        with lock:
            commits[observer.name, row, change_ts] += 1

    worker = Worker(cluster, [Upper, Count], threads=2, idle_max=0.05, on_commit=on_commit)
    with worker:
        with Transaction(cluster) as txn:
            for row in ROWS:
                txn.set("docs", row, "raw:v", b"text of " + row)
        first = txn.commit_ts
        wait_for_observers(cluster, timeout=60)
        with Transaction(cluster) as txn:  # a second change of one row goes through too
            txn.set("docs", ROWS[0], "raw:v", b"changed")
        second = txn.commit_ts
        wait_for_observers(cluster, timeout=60)

    snapshot = Snapshot(cluster)
    for row in ROWS[1:]:
        expected = b"TEXT OF " + row.upper()
        assert snapshot.get("docs", row, "up:v") == expected
        assert snapshot.get("docs", row, "out:v") == expected + b"/%d" % len(expected)
    assert snapshot.get("docs", ROWS[0], "out:v") == b"CHANGED/7"

    # at most one observer commit per change (several changes may collapse into one)
    assert commits and max(commits.values()) == 1, commits
    upper = {(row, ts) for (name, row, ts) in commits if name == "Upper"}
    assert upper == {(row, first) for row in ROWS} | {(ROWS[0], second)}, backend
    assert len([k for k in commits if k[0] == "Count"]) == len(ROWS) + 1
    assert worker.stats["failures"] == 0 and worker.stats["quarantined"] == 0
