"""Observers and workers, named by failure mode: worker processes killed with
``kill -9`` mid-transaction, crashed writers, weak notifications, chains,
quarantine and retry, and what observers may see."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import observers
import percolator
from observers import Observer, WaitTimeout, Worker, wait_for_observers
from percolator import Snapshot, Transaction
from percolator.__main__ import main as percolator_main
from percolator._commit import CrashPoint, SimulatedCrash, commit_transaction
from percolator._internals import internals
from percolator._notifications import held_locks, pending_notifications, quarantined
from percolator.ext import SINGLE_WRITER
from percolator.testing import client_of, crash_commit
from tests._backends import SQLITE_AND_BIGTABLE, backend_fixture
from tests.observers import _app

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.observers._app:OBSERVERS"


# Bigtable finds notifications through the index (percolator/_notify_index.py): the
# same crashes must lose none there.
backend = backend_fixture(SQLITE_AND_BIGTABLE)


@pytest.fixture
def cluster_tables() -> tuple[str, ...]:
    return ("docs", "log", "flaky")


def log_rows(cluster: percolator.Cluster, kind: str) -> list[tuple[bytes, bytes]]:
    """(row, value) of each committed run of observer *kind*, from its own writes."""
    found = []
    for key, _ in Snapshot(cluster).scan("log", kind.encode() + b"/", kind.encode() + b"0"):
        _, row, value, _ = key.split(b"/")
        found.append((row, value))
    return found


def write(cluster: percolator.Cluster, row: bytes, value: bytes, column: str = "raw:v") -> int:
    with Transaction(cluster) as txn:
        txn.set("docs", row, column, value)
    assert txn.commit_ts is not None
    return txn.commit_ts


def start_worker(
    url: str, tmp_path: Path, name: str, threads: int = 4, app: str = APP, **env: str
) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{"OBSERVERS_TEST_SLEEP": "0.01", **env})
    return subprocess.Popen(
        [sys.executable, "-m", "observers", "--cluster", url, "--observers", app,
         "--threads", str(threads), "--lock-ttl", "5", "--log-level", "WARNING",
         "--stats-file", str(tmp_path / f"{name}.json")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "ab"),
    )


def wait_until_catching_sigterm(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Wait until *proc* has installed its SIGTERM handler (SigCgt in /proc), so that
    a SIGTERM tests its clean stop rather than racing its start-up."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        with open(f"/proc/{proc.pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt"))
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.02)
    raise AssertionError(f"worker {proc.pid} never installed its SIGTERM handler")


def test_exports_are_sorted_and_complete() -> None:
    assert observers.__all__ == sorted(observers.__all__)
    for name in observers.__all__:
        assert hasattr(observers, name)


def test_observer_checks_its_attributes() -> None:
    class NoColumn(Observer):
        table = "docs"

    with pytest.raises(percolator.InvalidArgument, match="'column'"):
        NoColumn.check()
    assert _app.Indexer.name == "Indexer"


def test_the_default_thread_count_follows_the_store(cluster: percolator.Cluster) -> None:
    """1 scanner thread on the embedded store (its commits are serial: one thread
    measured fastest), 4 on remote stores; an explicit count wins."""
    embedded = internals(cluster).store.url.startswith("sqlite")
    assert Worker(cluster, [_app.Indexer]).threads == (1 if embedded else 4)
    assert Worker(cluster, [_app.Indexer], threads=3).threads == 3
    with pytest.raises(percolator.InvalidArgument, match="threads"):
        Worker(cluster, [_app.Indexer], threads=0)
    store = internals(cluster).store
    store.capabilities = store.capabilities - {SINGLE_WRITER}  # type: ignore[misc]
    assert Worker(cluster, [_app.Indexer]).threads == 4


@pytest.mark.parametrize(("given", "message"), [
    ({"cluster": "no cluster"}, "Worker needs a percolator.Cluster, got 'no cluster'"),
    ({"observers": []}, "a Worker needs at least one observer"),
    ({"observers": ["Indexer"]},
     "observers must be Observer subclasses or instances, got 'Indexer'"),
    ({"observers": [_app.Indexer, _app.Indexer]},
     "observer names must be unique, got ['Indexer', 'Indexer']"),
    ({"threads": 0}, "threads must be an int >= 1 or None, got 0"),
    ({"threads": 2.0}, "threads must be an int >= 1 or None, got 2.0"),
    ({"max_failures": 0}, "max_failures must be an int >= 1, got 0"),
    ({"max_failures": 2.0}, "max_failures must be an int >= 1, got 2.0"),
    ({"retry_delay": -0.5}, "retry_delay must be a number of seconds >= 0, got -0.5"),
    ({"max_retry_delay": "60"}, "max_retry_delay must be a number of seconds >= 0, got '60'"),
    ({"idle_max": -1}, "idle_max must be a number of seconds >= 0, got -1"),
    ({"poll_interval": None}, "poll_interval must be a number of seconds >= 0, got None"),
], ids=["cluster", "no-observer", "not-an-observer", "same-names", "threads-0",
        "threads-float", "max_failures-0", "max_failures-float", "retry_delay",
        "max_retry_delay", "idle_max", "poll_interval"])
def test_a_worker_refuses_a_bad_argument_naming_it(
    cluster: percolator.Cluster, given: dict[str, Any], message: str,
) -> None:
    kwargs = {"cluster": cluster, "observers": [_app.Indexer], **given}
    with pytest.raises(percolator.InvalidArgument) as refused:
        Worker(kwargs.pop("cluster"), kwargs.pop("observers"), **kwargs)
    assert str(refused.value) == message


def test_a_worker_takes_the_documented_defaults_and_the_least_values_allowed(
    cluster: percolator.Cluster,
) -> None:
    """5 failures before quarantine, retried after 0.5 s doubling up to 60 s, scanners
    idle for 2 s while the lookout looks every 0.08 s; one thread, one failure and no
    seconds at all are allowed. The worker's parts (its runner, scanner and their
    back-off) are given the same."""
    def settings(worker: Worker) -> tuple[object, ...]:
        runner, scanner = worker._runner, worker._scanner
        assert (runner.backoff.retry_delay, runner.backoff.max_retry_delay) == (
            worker.retry_delay, worker.max_retry_delay)
        assert (scanner.threads, scanner.idle_max, scanner.poll_interval) == (
            worker.threads, worker.idle_max, worker.poll_interval)
        assert runner.max_failures == worker.max_failures
        return (worker.max_failures, worker.retry_delay, worker.max_retry_delay,
                worker.idle_max, worker.poll_interval, worker.on_commit, worker.tasks)

    assert settings(Worker(cluster, [_app.Indexer])) == (5, 0.5, 60.0, 2.0, 0.08, None, [])
    least = Worker(cluster, [_app.Indexer], threads=1, max_failures=1, retry_delay=0,
                   max_retry_delay=0, idle_max=0, poll_interval=0)
    assert least.threads == 1
    assert settings(least) == (1, 0, 0, 0, 0, None, [])


def test_a_worker_runs_named_daemon_threads_and_refuses_a_second_start(
    cluster: percolator.Cluster,
) -> None:
    """Its scanner threads and its lookout are daemons (a process that ends without
    stop() is not held by them), named for thread dumps; starting it again while it
    runs is refused, saying so. Its bell is rung by the cluster's commits while it runs,
    not once it stopped; a stopped worker starts again."""
    worker = Worker(cluster, [_app.Indexer], threads=2)
    wakeups = internals(cluster).wakeups
    with worker:
        assert {t.name: t.daemon for t in worker._threads} == {
            "observers-scanner-0": True, "observers-scanner-1": True,
            "observers-lookout": True}
        assert worker._scanner.bell.set in wakeups
        with pytest.raises(percolator.InvalidArgument) as twice:
            worker.start()
        assert str(twice.value) == "this worker is already started"
    assert worker._threads == [] and worker._scanner.bell.set not in wakeups
    with worker:
        assert len(worker._threads) == 3
        for row in (b"again", b"and again"):  # counted one run at a time
            write(cluster, row, b"1")
            wait_for_observers(cluster, timeout=60)
    assert worker.stats["committed"] == 2


class _Copier(Observer):
    """One class, many bound instances: table, column and name set per instance,
    as a stream recipe binds its observers to a pipeline's tables at run time."""

    def __init__(self, column: str, target: str) -> None:
        self.table, self.column, self.name, self.target = "docs", column, f"copy-{target}", target

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        value = txn.get("docs", row, column)
        if value is not None:
            txn.set("docs", row, self.target, value)


def test_observers_bound_at_run_time_are_checked_and_run(cluster: percolator.Cluster) -> None:
    with pytest.raises(percolator.InvalidArgument, match="bad column"):
        Worker(cluster, [_Copier("no-family", "out:x")])
    with pytest.raises(percolator.InvalidArgument, match="observer names must be unique"):
        Worker(cluster, [_Copier("in:a", "out:x"), _Copier("in:b", "out:x")])
    bound = [_Copier("in:a", "out:a"), _Copier("in:b", "out:b")]
    with Worker(cluster, bound, threads=1):
        with Transaction(cluster) as txn:
            txn.set("docs", b"r", "in:a", b"1")
            txn.set("docs", b"r", "in:b", b"2")
        wait_for_observers(cluster, timeout=60)
    assert Snapshot(cluster).get_row("docs", b"r", ["out:a", "out:b"]) == {
        "out:a": b"1", "out:b": b"2"}


class _Stuck(Observer):
    """Runs until the test lets it go, as an observer waiting on a slow service."""

    table, column = "docs", "raw:v"

    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        self.entered, self.release = entered, release

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        self.entered.set()
        self.release.wait(60)


def test_stop_waits_for_a_stuck_scanner_and_a_stuck_task_at_most_its_timeout(
    cluster: percolator.Cluster,
) -> None:
    """stop(timeout) waits at most *timeout* seconds for each thread and task: it
    returns while a scanner is still in its observer and a task still in its run."""
    entered, task_entered, release = threading.Event(), threading.Event(), threading.Event()

    def stuck_task() -> None:
        task_entered.set()
        release.wait(60)

    task = observers.Periodic(cluster, "stuck", stuck_task, interval=0.01)
    worker = Worker(cluster, [_Stuck(entered, release)], threads=1, tasks=[task])
    worker.start()
    threads = [*worker._threads, task._thread]
    try:
        write(cluster, b"r", b"1")
        assert entered.wait(60) and task_entered.wait(60)
        stopping = threading.Thread(target=worker.stop, args=(0.01,))
        stopping.start()
        stopping.join(30)
        assert not stopping.is_alive(), "stop waited for a stuck thread beyond its timeout"
    finally:
        release.set()
        for thread in threads:
            assert thread is not None
            thread.join(60)


# --- processes killed mid-transaction -----------------------------------------------------


def test_workers_killed_mid_transaction_process_every_change_once(
    cluster: percolator.Cluster, store_url: str, tmp_path: Path
) -> None:
    Worker(cluster, _app.OBSERVERS).register()
    workers = [start_worker(store_url, tmp_path, f"w{i}") for i in range(2)]
    rng = random.Random(5)
    final: dict[bytes, bytes] = {}
    kills = 0
    try:
        deadline = time.monotonic() + 6.0
        n = 0
        # At least three kills, however slow the store is on a loaded machine.
        while time.monotonic() < deadline or kills < 3:
            assert time.monotonic() < deadline + 120, f"only {kills} kills in 126 s"
            row = b"doc%02d" % rng.randrange(40)
            value = b"v%d" % n
            n += 1
            write(cluster, row, value)
            final[row] = value
            if n % 40 == 0:
                victim = rng.randrange(len(workers))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait()  # reap it, so its pid is gone at once
                kills += 1
                workers[victim] = start_worker(store_url, tmp_path, f"w{victim}")
            time.sleep(0.01)
        wait_for_observers(cluster, timeout=90)
    finally:
        for w in workers:
            wait_until_catching_sigterm(w)
            w.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=30) for w in workers]
    assert codes == [0, 0]  # SIGTERM stops a worker cleanly
    assert kills >= 3
    idx = Counter(log_rows(cluster, "idx"))
    s2 = Counter(log_rows(cluster, "s2"))
    assert idx and max(idx.values()) == 1, [k for k, v in idx.items() if v > 1]
    assert max(s2.values()) == 1, [k for k, v in s2.items() if v > 1]
    snap = Snapshot(cluster)
    for row, value in final.items():
        assert (row, value) in idx
        assert snap.get("docs", row, "out:final") == value
    assert not list(pending_notifications(cluster))
    for i in range(2):  # the last incarnations stopped cleanly and wrote their counters
        json.loads((tmp_path / f"w{i}.json").read_text())
        assert "Traceback" not in (tmp_path / f"w{i}.log").read_text()


def test_stop_does_not_wait_out_a_live_lock(tmp_path: Path) -> None:
    """A scanner waiting on a live transaction's lock gives up when the worker is asked
    to stop, instead of waiting out the lock wait (here 20 min) and retrying."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    with percolator.connect(url, lock_ttl=600) as cluster, \
            percolator.connect(url, lock_ttl=600) as holder:
        worker = Worker(cluster, _app.OBSERVERS, threads=1)
        worker.register()
        write(cluster, b"doc", b"committed")
        txn = Transaction(holder)  # alive (this process, not closed), never finishing
        txn.set("docs", b"doc", "raw:v", b"pending")
        txn.set("docs", b"doc2", "raw:v", b"pending")
        with pytest.raises(SimulatedCrash):
            commit_transaction(txn, CrashPoint("prewrite", 1))
        worker.start()
        time.sleep(1.0)  # the scanner meets the notification at once, and the lock
        assert worker.stats["committed"] == 0 and worker.stats["passes"] == 0  # waiting
        stopper = threading.Thread(target=worker.stop)
        stopper.start()
        stopper.join(60)
        assert not stopper.is_alive(), "stop() waits out the lock"
        # given up, not counted as a conflict or a failure of the observer
        assert worker.stats["committed"] == worker.stats["conflicts"] == 0
        assert worker.stats["failures"] == 0


def test_a_signal_while_the_worker_registers_is_not_lost(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run() installs its handlers, then registers the observers (store writes, slow on
    a loaded machine): a SIGTERM in between must still stop it. (It used to be cleared
    when the scanners started, and the worker ran on.)"""
    worker = Worker(cluster, _app.OBSERVERS, threads=1)
    register = worker.register

    def register_meeting_a_signal() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # handled by run()'s handler, in this thread
        register()

    monkeypatch.setattr(worker, "register", register_meeting_a_signal)
    rescued: list[bool] = []

    def rescue() -> None:  # only if the signal was lost, so that the test ends
        rescued.append(True)
        worker.stop()

    timer = threading.Timer(30, rescue)
    timer.start()
    try:
        worker.run()
    finally:
        timer.cancel()
    assert rescued == [], "the SIGTERM during register() was lost"


def test_a_second_signal_stops_a_worker_whose_observer_hangs(
    cluster: percolator.Cluster, store_url: str, tmp_path: Path
) -> None:
    """The first SIGTERM waits for the observer's transaction; a second one exits at
    once, and the abandoned run leaves its notification and no lock."""
    mark = tmp_path / "hanging"
    Worker(cluster, _app.HANGING).register()
    write(cluster, b"doc", b"v", column="hang:x")
    proc = start_worker(store_url, tmp_path, "w", threads=1, app="tests.observers._app:HANGING",
                        OBSERVERS_TEST_HANG_MARK=str(mark))
    try:
        deadline = time.monotonic() + 60
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "observer never ran"
            time.sleep(0.05)
        wait_until_catching_sigterm(proc)
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None  # a clean stop waits for the hung observer
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert "exiting without waiting" in (tmp_path / "w.log").read_text()
    assert [(n.row, n.column) for n in pending_notifications(cluster)] == [(b"doc", "hang:x")]
    assert Snapshot(cluster).get("docs", b"doc", "out:hung") is None
    assert not list(held_locks(cluster))


# --- crashed writers and uncommitted data -------------------------------------------------


def test_change_committed_by_crashed_writer_is_rolled_forward_and_observed(
    cluster: percolator.Cluster, store_url: str
) -> None:
    worker = Worker(cluster, _app.OBSERVERS, threads=2)
    worker.register()
    with percolator.connect(store_url) as doomed:
        txn = percolator.Transaction(doomed)
        txn.set("docs", b"other", "misc:x", b"primary")     # the primary
        txn.set("docs", b"crashed", "raw:v", b"after-commit-point")  # a secondary
        with pytest.raises(SimulatedCrash):
            commit_transaction(txn, CrashPoint("commit_point"))
        internals(doomed).coordination.close()  # its owner is now dead
    with worker:
        wait_for_observers(cluster, timeout=60)
    assert (b"crashed", b"after-commit-point") in log_rows(cluster, "idx")
    assert Snapshot(cluster).get("docs", b"crashed", "out:final") == b"after-commit-point"


def test_observers_never_see_uncommitted_or_rolled_back_data(
    cluster: percolator.Cluster, store_url: str
) -> None:
    worker = Worker(cluster, _app.OBSERVERS, threads=2)
    worker.register()
    write(cluster, b"doc", b"committed")
    with percolator.connect(store_url) as doomed:
        txn = percolator.Transaction(doomed)
        txn.set("docs", b"doc", "raw:v", b"uncommitted")
        txn.set("docs", b"doc2", "raw:v", b"uncommitted")
        with pytest.raises(SimulatedCrash):
            commit_transaction(txn, CrashPoint("prewrite", 1))
        internals(doomed).coordination.close()
    rolled = Transaction(cluster)
    rolled.set("docs", b"doc3", "raw:v", b"rolled-back")
    rolled.rollback()
    with worker:
        wait_for_observers(cluster, timeout=60)
        live = Transaction(cluster)  # holds locks while the observers run
        live.set("docs", b"doc4", "raw:v", b"in-flight")
        commit = percolator._commit.TwoPhaseCommit.of(live)
        commit.prewrite()
        time.sleep(0.5)
        commit.abort()
        wait_for_observers(cluster, timeout=60)
    seen = {value for _, value in log_rows(cluster, "idx")}
    assert seen == {b"committed"}


# --- weak notifications, chains --------------------------------------------------------


def test_weak_notification_runs_observer_without_a_change(cluster: percolator.Cluster) -> None:
    with Worker(cluster, _app.OBSERVERS, threads=2):
        write(cluster, b"w1", b"x")
        wait_for_observers(cluster, timeout=60)
        assert log_rows(cluster, "ping") == []
        for _ in range(2):
            with Transaction(cluster) as txn:
                txn.notify("docs", b"w1", "ping:p")
            wait_for_observers(cluster, timeout=60)
    assert log_rows(cluster, "ping") == [(b"w1", b"x"), (b"w1", b"x")]
    # the weak notification wrote only the notify cell: no data, no write record
    assert Snapshot(cluster).get("docs", b"w1", "ping:p") is None


@pytest.mark.parametrize("point", [CrashPoint("commit_point"), CrashPoint("commit", 0)],
                         ids=["after-commit-point", "after-secondaries"])
def test_weak_notification_survives_a_committer_dying_after_its_commit_point(
    cluster: percolator.Cluster, point: CrashPoint
) -> None:
    Worker(cluster, _app.OBSERVERS).register()
    client = client_of(cluster)
    txn = Transaction(client)
    txn.set("docs", b"w2", "raw:v", b"y")
    txn.notify("docs", b"w2", "ping:p")
    assert crash_commit(txn, point) is True
    weak = [p for p in pending_notifications(cluster, ["docs"]) if p.column == "ping:p"]
    assert [(p.row, p.weak) for p in weak] == [(b"w2", True)]
    with Worker(cluster, _app.OBSERVERS, threads=2):
        wait_for_observers(cluster, timeout=60)
    assert log_rows(cluster, "ping") == [(b"w2", b"y")]


def test_chain_runs_the_next_stage(cluster: percolator.Cluster) -> None:
    with Worker(cluster, _app.OBSERVERS, threads=2):
        for i in range(20):
            write(cluster, b"c%d" % i, b"first")
        wait_for_observers(cluster, timeout=60)
        write(cluster, b"c0", b"second")
        wait_for_observers(cluster, timeout=60)
    snap = Snapshot(cluster)
    assert snap.get("docs", b"c0", "out:final") == b"second"
    assert all(snap.get("docs", b"c%d" % i, "out:final") == b"first" for i in range(1, 20))
    assert Counter(log_rows(cluster, "s2"))[(b"c0", b"second")] == 1


def test_many_changes_collapse_and_acks_reject_reruns(cluster: percolator.Cluster) -> None:
    Worker(cluster, _app.OBSERVERS).register()
    for i in range(5):
        write(cluster, b"hot", b"v%d" % i)
    with Worker(cluster, _app.OBSERVERS, threads=3) as worker:
        wait_for_observers(cluster, timeout=60)
    assert log_rows(cluster, "idx") == [(b"hot", b"v4")]
    assert worker.stats["committed"] == 2  # Indexer once, Stage2 once


# --- failures, quarantine, retry --------------------------------------------------------


def test_failing_observer_is_quarantined_and_retried_from_the_cli(
    cluster: percolator.Cluster, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Transaction(cluster) as txn:
        txn.set("flaky", b"config", "cfg:fail", b"1")
    worker = Worker(cluster, [_app.Flaky], threads=2, max_failures=3, retry_delay=0.02)
    with worker:
        with Transaction(cluster) as txn:
            txn.set("flaky", b"r1", "in:x", b"payload")
        wait_for_observers(cluster, timeout=60)  # quarantined: no longer pending
        assert worker.stats["failures"] == 3 and worker.stats["quarantined"] == 1
        [record] = quarantined(cluster)
        assert (record.table, record.row, record.column) == ("flaky", b"r1", "in:x")
        assert record.observer == "Flaky" and record.failures == 3
        assert "RuntimeError: configured to fail" in record.error
        status = subprocess.run(
            [sys.executable, "-m", "percolator", "status", "--cluster", store_url],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        ).stdout
        assert "quarantined notifications: 1" in status
        assert "flaky/r1/in:x: observer Flaky, 3 failure(s)" in status
        assert "RuntimeError: configured to fail" in status
        time.sleep(0.3)
        assert worker.stats["failures"] == 3  # not retried forever
        with Transaction(cluster) as txn:
            txn.set("flaky", b"config", "cfg:fail", b"0")
        assert percolator_main(["retry", "--cluster", store_url, "flaky", "r1"]) == 0
        assert "1 notification(s) put back" in capsys.readouterr().out
        wait_for_observers(cluster, timeout=60)
    assert quarantined(cluster) == []
    assert log_rows(cluster, "flaky") == [(b"r1", b"payload")]


def test_failures_are_counted_across_workers(cluster: percolator.Cluster) -> None:
    # max_failures bounds the tries of a notification by the whole cluster: a worker
    # that takes over after another failed twice quarantines it at the third failure.
    with Transaction(cluster) as txn:
        txn.set("flaky", b"config", "cfg:fail", b"1")
    first = Worker(cluster, [_app.Flaky], threads=1, max_failures=3, retry_delay=0.5)
    with first:
        with Transaction(cluster) as txn:
            txn.set("flaky", b"r1", "in:x", b"payload")
        deadline = time.monotonic() + 60
        while first.stats["failures"] < 2 and time.monotonic() < deadline:
            time.sleep(0.002)
    assert first.stats["failures"] == 2 and quarantined(cluster) == []
    second = Worker(cluster, [_app.Flaky], threads=1, max_failures=3, retry_delay=0.01)
    with second:
        wait_for_observers(cluster, timeout=60)
    assert second.stats["failures"] == 1 and second.stats["quarantined"] == 1
    [record] = quarantined(cluster)
    assert record.failures == 3
    # a new change of the cell is processed afresh
    with Transaction(cluster) as txn:
        txn.set("flaky", b"config", "cfg:fail", b"0")
        txn.set("flaky", b"r1", "in:x", b"again")
    with Worker(cluster, [_app.Flaky], threads=1, max_failures=1) as third:
        wait_for_observers(cluster, timeout=60)
    assert third.stats["failures"] == 0
    assert log_rows(cluster, "flaky") == [(b"r1", b"again")]


# --- waiting ----------------------------------------------------------------------------


def test_wait_times_out_listing_what_is_pending(
    cluster: percolator.Cluster, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.observe("docs", "raw:v")
    write(cluster, b"stuck-row", b"x")
    with pytest.raises(WaitTimeout, match=r"docs/stuck-row/raw:v") as info:
        wait_for_observers(cluster, timeout=0.2)
    assert len(info.value.pending) == 1
    assert percolator_main(["wait", "--cluster", store_url, "--timeout", "0.2"]) == 1
    assert "docs/stuck-row/raw:v" in capsys.readouterr().err
    with Worker(cluster, _app.OBSERVERS, threads=1):
        assert percolator_main(["wait", "--cluster", store_url, "--timeout", "60"]) == 0
