"""Soak (slow; ``pytest --run-slow`` or ``python bench/gc.py --soak``): a hot cell
updated 10^5 times and 10^4 rows created and deleted, with a pass every couple of
seconds from another thread. Versions kept per cell stay at most those newer than the
safe point plus one, deleted rows go entirely, and the SQLite file stops growing.
``PERCOLATOR_SOAK_SCALE`` (default 1) scales the counts."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

import percolator
from percolator._internals import internals
from percolator._store import Read

SCALE = float(os.environ.get("PERCOLATOR_SOAK_SCALE", "1"))
HOT_UPDATES = int(100_000 * SCALE)
ROWS = int(10_000 * SCALE)


def _size(path: Path) -> int:
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return path.stat().st_size


@pytest.mark.slow
def test_soak_hot_cell_and_churning_rows(tmp_path: Path) -> None:
    path = tmp_path / "soak.db"
    stop = threading.Event()
    passes: list[percolator._gc.GcSummary] = []
    with percolator.connect(f"sqlite:///{path}", safe_point_refresh=0.05) as c:
        c.create_table("t")

        def collect() -> None:
            while not stop.wait(1.0):
                passes.append(c.gc(retention=0))

        collector = threading.Thread(target=collect)
        collector.start()
        sizes = []
        try:
            per_row = max(HOT_UPDATES // ROWS, 1)
            for i in range(HOT_UPDATES):
                with percolator.Transaction(c) as txn:
                    txn.set("t", b"hot", "c:v", b"%d" % i)
                    row = b"churn%06d" % (i // per_row)
                    if i % per_row == 0:
                        txn.set("t", row, "c:v", b"x" * 100)
                    elif i % per_row == per_row - 1:
                        txn.delete("t", row, "c:v")
                if i in (HOT_UPDATES // 2, HOT_UPDATES - 1):
                    sizes.append(_size(path))
        finally:
            stop.set()
            collector.join()
        assert len(passes) >= 2 and sum(p.versions_removed for p in passes) > 0
        final = c.gc(retention=0)
        store = internals(c).store
        writes = store.read_rows("t", [b"hot"], [Read("w", versions=None)])[b"hot"]["w:c:v"]
        newer = [ts for ts, _ in writes if ts >= final.safe_point]
        assert len(writes) <= len(newer) + 1
        left = [row for row, _ in internals(c).store.scan("t", None, None, [Read("w"), Read("l")])
                if row != b"hot"]
        assert left == [], "deleted rows go entirely"
        assert percolator.Snapshot(c).get("t", b"hot", "c:v") == b"%d" % (HOT_UPDATES - 1)
    assert sizes[1] <= sizes[0] * 1.2, f"the file kept growing: {sizes}"
