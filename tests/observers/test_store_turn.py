"""The scanners of one worker on the embedded store take turns at the store work
(``observers._store_turn.StoreTurn``): they keep the turn through quick observer code,
let go of it around observer code that waits, and lend it when a run they kept it
through turns out slow, so that one slow run never stalls the other scanners."""

from __future__ import annotations

import threading
import time

import pytest

import percolator
from observers import Observer, Worker, _store_turn
from percolator import TransactionBase
from tests._backends import backend_fixture

backend = backend_fixture("sqlite")


@pytest.fixture
def cluster_tables() -> tuple[str, ...]:
    return ("docs",)


class _Overlaps(Observer):
    """Copies raw:v to out:v and records how many runs were inside process() at once."""

    table, column = "docs", "raw:v"

    def __init__(self, pause: float = 0.0) -> None:
        self.pause = pause
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            # Gives up the GIL: another scanner could now run its own observer code,
            # unless this one kept the store turn.
            time.sleep(self.pause)
            txn.set("docs", row, "out:v", txn.get("docs", row, column) or b"")
        finally:
            with self.lock:
                self.inside -= 1


def _write_rows(cluster: percolator.Cluster, n: int) -> None:
    cluster.observe("docs", "raw:v")  # before the writes: each one notifies
    with percolator.Transaction(cluster) as txn:
        for i in range(n):
            txn.set("docs", b"r%04d" % i, "raw:v", b"v%d" % i)


def _drain(worker: Worker, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while worker.stats["committed"] < n:
        assert time.monotonic() < deadline, f"only {worker.stats['committed']} of {n} runs"
        time.sleep(0.01)


def test_scanners_keep_the_turn_through_quick_observer_code(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four scanners, an observer whose code gives up the GIL but does not wait: no two
    runs are ever inside it at once (each kept the turn), and every change is copied.
    (A loaded machine that stops a thread inside the observer for milliseconds would
    make a run look slow or waiting; the test keeps those rules out of the way.)"""
    monkeypatch.setattr(_store_turn.StoreTurn, "LEND_AFTER", 30.0)
    monkeypatch.setattr(_store_turn.Waits, "WAITING", 30.0)
    observer = _Overlaps(pause=0.0)
    _write_rows(cluster, 300)
    with Worker(cluster, [observer], threads=4) as worker:
        _drain(worker, 300)
    assert observer.most_inside == 1
    rows = dict(percolator.Transaction(cluster).scan("docs"))
    assert all(cells["out:v"] == cells["raw:v"] for cells in rows.values())


def test_scanners_let_go_of_the_turn_around_observer_code_that_waits(
    cluster: percolator.Cluster,
) -> None:
    """An observer that waits 2 ms per run (below the lending time): its runs let go of
    the turn, so several are inside its code at once while others do store work."""
    observer = _Overlaps(pause=0.002)
    _write_rows(cluster, 200)
    with Worker(cluster, [observer], threads=4) as worker:
        _drain(worker, 200)
    assert observer.most_inside > 1


class _StuckOnce(Observer):
    """Its first run waits until released; every run copies raw:v to out:v."""

    table, column = "docs", "raw:v"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.stuck = threading.Event()
        self.lock = threading.Lock()

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        with self.lock:
            first = not self.stuck.is_set()
            self.stuck.set()
        if first:
            assert self.release.wait(60)
        txn.set("docs", row, "out:v", txn.get("docs", row, column) or b"")


def test_a_run_stuck_in_observer_code_lends_the_turn(cluster: percolator.Cluster) -> None:
    """The first run (quick so far, so it keeps the turn) hangs in observer code: the
    other scanner takes the turn over and commits runs meanwhile (not necessarily all:
    a scanner that meets a held row skips a stretch after it, as Percolator's scanners
    do to spread out); once released, the stuck run and every other one commit."""
    observer = _StuckOnce()
    _write_rows(cluster, 50)
    with Worker(cluster, [observer], threads=2) as worker:
        assert observer.stuck.wait(30)
        _drain(worker, 5, timeout=20)  # well before the stuck run gives up (60 s)
        assert not observer.release.is_set()
        observer.release.set()
        _drain(worker, 50)
    rows = dict(percolator.Transaction(cluster).scan("docs"))
    assert len(rows) == 50 and all(cells["out:v"] == cells["raw:v"] for cells in rows.values())


def test_a_worker_stops_while_a_run_is_stuck_in_observer_code(
    cluster: percolator.Cluster,
) -> None:
    """Scanners waiting for the turn see the stop; the stuck run, once released,
    finishes and the worker's threads all end."""
    observer = _StuckOnce()
    _write_rows(cluster, 20)
    worker = Worker(cluster, [observer], threads=3)
    worker.start()
    assert observer.stuck.wait(30)
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    time.sleep(0.2)
    observer.release.set()
    stopper.join(30)
    assert not stopper.is_alive()
    assert not any(t.is_alive() for t in worker._threads)
