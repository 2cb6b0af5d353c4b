"""Periodic cluster-singleton tasks, and the worker's garbage collection built on them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import percolator
from observers import Periodic, Worker
from percolator._internals import internals
from percolator._store import Read
from tests.observers import _app


@pytest.fixture
def cluster(tmp_path: Path) -> percolator.Cluster:
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db", safe_point_refresh=0.01) as c:
        yield c  # type: ignore[misc]


def test_run_once_runs_when_due_and_not_held(cluster: percolator.Cluster) -> None:
    ran: list[int] = []
    task = Periodic(cluster, "t", lambda: ran.append(1), interval=3600)
    assert task.last_run() is None and task.due()
    key = "periodic/t"
    assert internals(cluster).coordination.try_advisory_lock(key)  # someone else is running it
    assert not task.run_once() and ran == []
    internals(cluster).coordination.release_advisory_lock(key)
    assert task.run_once() and ran == [1]
    # Its last run is in the store: another process's task of the same name waits too.
    other = Periodic(cluster, "t", lambda: ran.append(2), interval=3600)
    assert not other.due() and not other.run_once() and ran == [1]
    assert Periodic(cluster, "t", lambda: ran.append(3), interval=1e-9).run_once()
    assert ran == [1, 3]


def test_a_failing_task_is_counted_and_waits_its_interval(cluster: percolator.Cluster) -> None:
    def fail() -> None:
        raise RuntimeError("boom")

    task = Periodic(cluster, "f", fail, interval=3600)
    assert task.run_once() and task.failures == 1 and task.runs == 0
    assert not task.run_once() and task.failures == 1


def test_tasks_of_one_name_run_one_at_a_time(cluster: percolator.Cluster) -> None:
    inside = 0
    overlaps = 0
    runs = 0
    lock = threading.Lock()

    def body() -> None:
        nonlocal inside, overlaps, runs
        with lock:
            inside += 1
            overlaps += inside > 1
        time.sleep(0.02)  # long enough for the others to try meanwhile
        with lock:
            inside -= 1
            runs += 1

    tasks = [Periodic(cluster, "one", body, interval=0.01) for _ in range(4)]
    for task in tasks:
        task.start()
    deadline = time.monotonic() + 60
    while runs < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    for task in tasks:
        task.stop()
    assert runs >= 10 and overlaps == 0
    assert sum(t.runs for t in tasks) == runs


def test_bad_arguments(cluster: percolator.Cluster) -> None:
    with pytest.raises(percolator.InvalidArgument, match="interval"):
        Periodic(cluster, "x", lambda: None, interval=0)
    with pytest.raises(percolator.InvalidArgument, match="name"):
        Periodic(cluster, "", lambda: None, interval=1)
    with pytest.raises(percolator.InvalidArgument, match="callable"):
        Periodic(cluster, "x", None, interval=1)  # type: ignore[arg-type]
    with pytest.raises(percolator.InvalidArgument, match="tasks"):
        Worker(cluster, [_app.Indexer], tasks=[object()])  # type: ignore[list-item]


def test_a_worker_collects_garbage_while_it_runs(cluster: percolator.Cluster) -> None:
    cluster.create_table("docs")
    for i in range(5):
        with percolator.Transaction(cluster) as txn:
            txn.set("docs", b"other", "c:v", b"%d" % i)

    def versions() -> int:
        cells = internals(cluster).store.read_rows("docs", [b"other"], [Read("w", versions=None)])
        return len(cells[b"other"]["w:c:v"])

    assert versions() == 5
    gc = Periodic(cluster, "gc", lambda: cluster.gc(retention=0), interval=0.05)
    worker = Worker(cluster, [_app.Indexer], threads=1, tasks=[gc])
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while versions() > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        worker.stop()
    assert versions() == 1 and gc.runs >= 1
    assert gc._thread is None, "the worker's stop stops its tasks"
