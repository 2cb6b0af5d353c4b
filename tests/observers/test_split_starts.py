"""Scanners start passes at random tablet or region boundaries where the store reports
them (Percolator §2.4), not only at rows they have seen: a fresh worker on a big table
starts all over it at once instead of at the first row."""

from __future__ import annotations

from pathlib import Path

import pytest

import percolator
from observers import Observer, Worker
from percolator import TransactionBase
from percolator._internals import internals
from tests._backends import WITH_FAULTS, make_store_url, reports_split_keys


class Touch(Observer):
    table, column = "t", "in:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, "out:v", b"1")


@pytest.mark.parametrize("backend", WITH_FAULTS)  # hbase-faults: the test server's regions
def test_a_fresh_worker_starts_at_the_stores_split_keys(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = make_store_url(backend, request, tmp_path)
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        cluster.observe("t", "in:v")
        with percolator.Transaction(cluster) as txn:
            for i in range(300):
                txn.set("t", b"r%04d" % i, "in:v", b"x")
        splits = getattr(internals(cluster).store, "split_keys", lambda table: [])("t")
        assert bool(splits) == reports_split_keys(backend), splits  # regions; samples
        worker = Worker(cluster, [Touch], threads=1)
        starts = {worker._scanner.random_start("t") for _ in range(50)}  # nothing seen yet
        if not splits:
            assert starts == {None}  # from the first row, then from rows seen
        else:
            rows = {b"r%04d" % i for i in range(300)}
            if backend.startswith("hbase"):  # the test server cuts a region every 100 rows
                assert starts == set(splits) == {b"r0100", b"r0200"}
            else:  # the emulator's samples are rows, and vary from call to call
                assert starts <= rows, starts
            assert worker.stats["split_starts"] == 50
        worker._scanner.remember("t", b"r0150")  # once rows are seen, both kinds
        mixed = {worker._scanner.random_start("t") for _ in range(200)}
        assert b"r0150" in mixed and (not splits or len(mixed) > 1)
        if backend != "sqlite":
            for table in internals(cluster).store.list_tables():
                internals(cluster).store.drop_table(table)
