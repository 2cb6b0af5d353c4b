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
from typing import Any

import pytest

import percolator
from percolator.__main__ import main as percolator_main
from percolator._encoding import META_TABLE
from percolator._internals import internals
from percolator._safe_point import _RECORD, CLIENT_PREFIX, ROW, YOUNGER_PREFIX
from percolator._store import Read

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
        internals(c).safe_point.publish()  # as its background thread would, within half a second
        assert percolator_main(["status", "--cluster", url]) == 0
        out = capsys.readouterr().out
        assert "gc safe point: none" in out
        assert percolator_main(["gc", "--cluster", url, "--retention", "0", "--dry-run"]) == 0
        out = capsys.readouterr().out
        owner = internals(c).coordination.current_owner()
        assert f"safe point: {reader.start_ts} (was 0; client {owner})" \
            in out
        # The reader sees the last of the 3 versions: the 2 older ones can go.
        assert f"would remove: {CELLS * 2} versions" in out and "dry run" in out
        del reader
        internals(c).safe_point.publish()
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
    sp = internals(cluster).safe_point
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


class _TwoParkings:
    """The safe point's store: thread ``A`` stops before its next write of the meta
    table, thread ``B`` once its next write has returned, each until let go."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.parked = {"A": threading.Event(), "B": threading.Event()}
        self.go = {"A": threading.Event(), "B": threading.Event()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def mutate_rows(self, table: str, mutations: Any) -> None:
        me = threading.current_thread().name
        if me == "A":
            self.parked["A"].set()
            assert self.go["A"].wait(60)
        self._store.mutate_rows(table, mutations)
        if me == "B":
            self.parked["B"].set()
            assert self.go["B"].wait(60)


def test_two_publications_at_once_leave_the_newest_stored(tmp_path: Path) -> None:
    """A publication that computed its transactions (one snapshot) and waits to write
    them, and a newer one (two snapshots) that writes first: once both are done, what
    is stored is what the client believes it published, so the newer snapshot is
    published now or at the next round. (Interleaved, the older write lands last while
    the client records the newer one as published: the newer snapshot is never
    published while nothing changes.)"""
    with percolator.connect(f"sqlite:///{tmp_path}/db") as cluster:
        sp = internals(cluster).safe_point
        sp.refresh = 3600.0  # the background publisher stays out of the way
        older = percolator.Snapshot(cluster)
        parkings = _TwoParkings(sp.store)
        sp.store = parkings  # type: ignore[assignment]
        a = threading.Thread(target=sp.publish, name="A")
        a.start()
        assert parkings.parked["A"].wait(10)
        newer = percolator.Snapshot(cluster)
        b = threading.Thread(target=sp.publish, name="B")
        b.start()
        parkings.parked["B"].wait(0.5)  # B writes first where nothing holds it back
        parkings.go["A"].set()
        a.join(10)
        assert parkings.parked["B"].wait(10)
        parkings.go["B"].set()
        b.join(10)
        sp.store = parkings._store
        owner = internals(cluster).coordination.current_owner()
        cells = sp.store.read_rows(META_TABLE, [ROW], [Read("m")])[ROW]
        stored = [cells[CLIENT_PREFIX + owner][0][1]]
        if YOUNGER_PREFIX + owner in cells:
            stored.append(cells[YOUNGER_PREFIX + owner][0][1])
        published = sp._published
        assert published is not None
        assert b"".join(stored) == b"".join(_RECORD.pack(*step) for step in published)
        sp.publish()  # what the next round does
        cells = sp.store.read_rows(META_TABLE, [ROW], [Read("m")])[ROW]
        raw = cells[CLIENT_PREFIX + owner][0][1]
        raw += cells.get(YOUNGER_PREFIX + owner, [(0, b"")])[0][1]
        stored_ts = {ts for ts, _ in _RECORD.iter_unpack(raw)}
        assert {older.start_ts, newer.start_ts} <= stored_ts
        older.close()
        newer.close()
