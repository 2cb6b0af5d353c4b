"""Garbage collection on the embedded store: space comes back, and the command line.

Freed pages are reused by later writes (a second round of the same updates after a
pass does not grow the file much), ``--vacuum`` returns space to the file system, and
``percolator gc`` / ``percolator status`` say what they did and what holds the safe
point back.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

import percolator
from percolator.__main__ import main as percolator_main

CELLS = 20
VALUE = b"x" * 100


def _file_size(path: Path) -> int:
    with sqlite3.connect(path) as db:  # fold the write-ahead log into the file
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return os.path.getsize(path)


def _updates(cluster: percolator.Cluster, rounds: int) -> None:
    for i in range(rounds):
        with percolator.Transaction(cluster) as txn:
            for c in range(CELLS):
                txn.set("t", b"row%03d" % c, "c:v", VALUE + b"%d" % i)


def test_freed_pages_are_reused_and_vacuum_returns_them(tmp_path: Path) -> None:
    path = tmp_path / "repo.db"
    with percolator.connect(f"sqlite:///{path}", safe_point_refresh=0.01) as c:
        c.create_table("t")
        _updates(c, 100)
        grown = _file_size(path)
        _updates(c, 100)
        doubled = _file_size(path)  # without GC, the same updates again
        assert doubled > 1.6 * grown
        summary = c.gc(retention=0)
        assert summary.versions_removed == CELLS * 199
        assert _file_size(path) == doubled, "without vacuum the file keeps its pages"
        _updates(c, 100)
        c.gc(retention=0)
        _updates(c, 100)
        after = _file_size(path)
        assert after <= doubled * 1.05, "a pass's freed pages are reused by later writes"
        vacuumed = c.gc(retention=0, vacuum=True)
        assert vacuumed.bytes_freed is not None and vacuumed.bytes_freed > 0
        assert _file_size(path) < after / 4
        with percolator.Transaction(c) as txn:
            assert txn.get("t", b"row000", "c:v") == VALUE + b"99"


def test_the_gc_and_status_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/repo.db"
    with percolator.connect(url) as c:
        c.create_table("t")
        _updates(c, 3)
        reader = percolator.Snapshot(c)
        c.safe_point.publish()  # as its background thread would, within half a second
        assert percolator_main(["status", "--cluster", url]) == 0
        out = capsys.readouterr().out
        assert "gc safe point: none" in out
        assert percolator_main(["gc", "--cluster", url, "--retention", "0", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert f"safe point: {reader.start_ts} (was 0; client {c.coordination.current_owner()})" \
            in out
        # The reader sees the last of the 3 versions: the 2 older ones can go.
        assert f"would remove: {CELLS * 2} versions" in out and "dry run" in out
        del reader
        c.safe_point.publish()
        assert percolator_main(["gc", "--cluster", url, "--retention", "0"]) == 0
        out = capsys.readouterr().out
        assert f"removed: {CELLS * 2} versions" in out
        assert percolator_main(["status", "--cluster", url]) == 0
        out = capsys.readouterr().out
        assert "gc safe point: " in out and "held back by: no running transaction" in out


def test_closing_waits_for_the_safe_point_publisher_to_finish_its_write(tmp_path: Path) -> None:
    """The cluster closes its store right after the safe point: a publisher thread still
    inside a store write would then use a closed SQLite connection (a crash, once seen
    as SIGSEGV). close() must wait for it."""
    cluster = percolator.connect(f"sqlite:///{tmp_path}/repo.db", safe_point_refresh=0.01)
    sp = cluster.safe_point
    inside, release = threading.Event(), threading.Event()
    publish = sp.publish

    def slow_publish() -> None:
        inside.set()
        release.wait(60)
        publish()

    sp.publish = slow_publish  # type: ignore[method-assign]
    snapshot = percolator.Snapshot(cluster)  # starts the publisher
    assert inside.wait(60)
    closer = threading.Thread(target=sp.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive(), "close() returned while the publisher was mid-write"
    release.set()
    closer.join(60)
    assert not closer.is_alive()
    del snapshot
    cluster.close()
