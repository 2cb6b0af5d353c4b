"""A failing observer, one run at a time on the embedded store: the failure is counted
for the cluster (in the store) and backs the cell off in this worker process
(``observers/_backoff.py``); a later success clears both; the last failure allowed
quarantines the notification with what a person needs to see (``percolator status``)
and clears both too. This process's clock is set by the test (the back-off's ``time``),
so that a retry is due exactly when the test says."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

import observers._backoff
import observers._scanner
import percolator
from observers import Observer, Worker
from observers._backoff import Backoff
from percolator import Snapshot, TlsError, Transaction, TransactionBase, metrics
from percolator._notifications import (
    _NO_FAILURES,
    Quarantined,
    _failures_key,
    _read_failures,
    pending_notifications,
    quarantined,
)
from percolator.ext import NOTIFY, Read, internals
from tests._backends import backend_fixture

backend = backend_fixture("sqlite")
T, COL, ROW = "docs", "raw:v", b"r"


@pytest.fixture
def cluster_tables() -> tuple[str, ...]:
    return (T,)


class Fails(Observer):
    """Raises while ``failing`` is set (a ValueError with a note); copies otherwise."""

    table, column = T, COL

    def __init__(self) -> None:
        self.failing = True
        self.runs = 0

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        self.runs += 1
        if self.failing:
            error = ValueError("boom")
            error.add_note("while copying")
            raise error
        txn.set(T, row, "out:v", txn.get(T, row, column) or b"")


class NoReads:
    """A store that refuses reads (a row passed by must cost none)."""

    def __init__(self, store: object) -> None:
        self._store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def read_rows(self, *args: object, **kwargs: object) -> object:
        raise AssertionError(f"read_rows{args!r:.200}")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """``time.monotonic()`` as observers._backoff sees it: the test moves it by hand."""
    now = [1000.0]
    monkeypatch.setattr(observers._backoff, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def failures_counted(cluster: percolator.Cluster) -> bytes | None:
    """The cluster's failure count of the cell, as the store keeps it."""
    return _read_failures(cluster, _failures_key(T, ROW), COL)


def failed_once(cluster: percolator.Cluster, retry_delay: float,
                max_failures: int) -> tuple[Fails, Worker]:
    """A worker of one failing observer, whose first run on a change of the cell failed."""
    observer = Fails()
    worker = Worker(cluster, [observer], threads=1, retry_delay=retry_delay,
                    max_failures=max_failures)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"v")
    assert worker._scanner.serve_row(T, ROW)
    return observer, worker


def test_a_failure_backs_off_here_counts_for_the_cluster_and_a_success_clears_both(
    cluster: percolator.Cluster, clock: list[float],
) -> None:
    observer, worker = failed_once(cluster, retry_delay=10.0, max_failures=5)
    assert observer.runs == 1 and worker.stats["failures"] == 1
    assert worker._runner.backoff.waiting(T, ROW, COL)  # this cell, for this process
    assert failures_counted(cluster) not in (None, _NO_FAILURES)

    assert not worker._scanner.serve_row(T, ROW)  # backing off: no run
    worker._scanner.look(frozenset())
    handed = worker._scanner.bell.take()
    assert handed is not None and handed[:2] == (T, ROW)
    host = internals(cluster)
    store, host.store = host.store, NoReads(host.store)  # type: ignore[assignment]
    try:
        worker._scanner.serve_handed(*handed)  # nor when a look hands the row over:
    finally:  # passed by without a read of its notify cells
        host.store = store
    assert observer.runs == 1

    clock[0] += 1000.0  # the retry is due
    observer.failing = False
    assert worker._scanner.serve_row(T, ROW)
    assert observer.runs == 2 and worker.stats["committed"] == 1
    assert not worker._runner.backoff  # cleared here
    assert failures_counted(cluster) == _NO_FAILURES  # and for the cluster
    assert list(pending_notifications(cluster, [T])) == []


def test_the_last_failure_allowed_quarantines_the_notification_with_its_error(
    cluster: percolator.Cluster, clock: list[float],
) -> None:
    observer, worker = failed_once(cluster, retry_delay=100.0, max_failures=2)
    clock[0] += 1000.0
    quarantines = metrics.snapshot()[0].get(
        ("percolator_observer_runs_total", (observer.name, "quarantined")), 0)
    before = time.time()
    assert worker._scanner.serve_row(T, ROW)
    after = time.time()
    assert worker.stats["quarantined"] == 1
    assert metrics.snapshot()[0][("percolator_observer_runs_total", (
        observer.name, "quarantined"))] == quarantines + 1
    [record] = quarantined(cluster)
    assert before <= record.since <= after
    assert record == Quarantined(T, ROW, COL, observer.name, "ValueError: boom\nwhile copying",
                                 2, False, record.since)
    assert not worker._runner.backoff  # cleared here
    assert failures_counted(cluster) == _NO_FAILURES  # and for the cluster
    assert list(pending_notifications(cluster, [T])) == []


def test_a_cells_back_off_doubles_per_failure_up_to_its_cap_jittered(
    clock: list[float], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """retry_delay after the first failure, twice as long after each next one, at most
    max_retry_delay; the next try is that far ahead times a jitter drawn from [0.8, 1.2]
    (the draw returns its upper bound here)."""
    drawn: list[tuple[float, float]] = []

    def uniform(lo: float, hi: float) -> float:
        drawn.append((lo, hi))
        return hi

    monkeypatch.setattr(observers._backoff, "random", SimpleNamespace(uniform=uniform))
    backoff = Backoff(retry_delay=1.0, max_retry_delay=5.0)
    assert not backoff and backoff.next_due() is None
    assert not backoff.waiting(T, ROW, COL) and not backoff.all_waiting(T, ROW, [COL])
    assert [backoff.failed(T, ROW, COL) for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert drawn == [(0.8, 1.2)] * 5
    assert backoff.next_due() == pytest.approx(1000.0 + 5.0 * 1.2)
    assert backoff.failed(T, b"other", COL) == 1.0  # each cell counts its own
    assert backoff.next_due() == pytest.approx(1000.0 + 1.2)  # the earliest
    clock[0] += 1.1
    assert backoff.waiting(T, b"other", COL) and backoff.all_waiting(T, b"other", [COL])
    assert not backoff.waiting(T, b"third", COL)
    assert not backoff.all_waiting(T, b"other", [COL, "raw:w"])  # raw:w never failed
    clock[0] += 0.1
    assert not backoff.waiting(T, b"other", COL)  # due exactly now
    assert not backoff.all_waiting(T, b"other", [COL])
    assert backoff.waiting(T, ROW, COL)
    assert backoff.clear(T, b"other", COL) is True
    assert backoff.clear(T, b"other", COL) is False  # cleared already
    assert backoff.clear(T, ROW, COL) is True
    assert not backoff and backoff.next_due() is None
    assert backoff.clear(T, ROW, COL) is False  # nothing failed here
    assert backoff.failed(T, ROW, COL) == 1.0  # counts from the start again


class FirstDrawFails:
    """The cluster's timestamp source, whose first draw fails with a TLS error (a
    certificate that expired, say): not a failure of the observer, nor a service
    that is unavailable, so the run fails before its read of the notification."""

    def __init__(self, source: object) -> None:
        self._source = source
        self.failed = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._source, name)

    def get_timestamp(self) -> int:
        if not self.failed:
            self.failed = True
            raise TlsError("the oracle's certificate expired")
        return self._source.get_timestamp()  # type: ignore[attr-defined, no-any-return]


def _served_while_the_first_draw_fails(cluster: percolator.Cluster,
                                       serve: Callable[[Worker], object]) -> None:
    """The cell holds a weak notification and a newer strong one; a worker whose
    observer fails (one failure allowed) serves it by *serve* while the first start
    timestamp drawn fails: the run fails before its own read, and its observer never
    runs."""
    observer = Fails()
    worker = Worker(cluster, [observer], threads=1, max_failures=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.notify(T, ROW, COL)
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"v")
    host = internals(cluster)
    failing = FirstDrawFails(host.timestamps)
    host.timestamps = failing  # type: ignore[assignment]
    try:
        serve(worker)
    finally:
        host.timestamps = failing._source  # type: ignore[assignment]
    assert failing.failed and observer.runs == 0


def test_a_run_that_fails_before_its_read_counts_against_the_notifications_the_scanner_read(
    cluster: percolator.Cluster,
) -> None:
    """The cell holds a weak notification and a newer strong one; the run fails before
    its own read of them (its start timestamp's draw fails), so its failure counts
    against what the scanner read: the newest version, and weak, since one of the
    versions is (the run's own read would have said so). The last failure allowed
    quarantines the notification as weak, to be put back as weak. Fails if the
    scanner reads the newest version only (strong: the record says not weak)."""
    _served_while_the_first_draw_fails(cluster, lambda w: w._scanner.serve_row(T, ROW))
    [record] = quarantined(cluster)
    assert record.weak and record.error == "percolator.TlsError: the oracle's certificate expired"
    assert list(pending_notifications(cluster, [T])) == []


def test_a_handed_rows_run_that_fails_quarantines_its_weak_notification_as_weak(
    cluster: percolator.Cluster,
) -> None:
    """A look hands over a row with a weak notification (``notify``); its one
    observer's run reads the notification in its own first read (the run-noticed way,
    no read of the notify cells before) and fails: the last failure allowed
    quarantines the notification as weak, to be put back as weak (fails if the
    failure is counted as for a strong one)."""
    observer = Fails()
    worker = Worker(cluster, [observer], threads=1, max_failures=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.notify(T, ROW, COL)
    worker._scanner.look(frozenset())
    handed = worker._scanner.bell.take()
    assert handed is not None and handed[:2] == (T, ROW)
    worker._scanner.serve_handed(*handed)
    assert observer.runs == 1
    [record] = quarantined(cluster)
    assert record.weak is True and record.error == "ValueError: boom\nwhile copying"
    assert list(pending_notifications(cluster, [T])) == []


def test_a_family_pass_run_that_fails_before_its_read_counts_against_every_version_read(
    cluster: percolator.Cluster,
) -> None:
    """As the test above, the row found by a pass over the notify family: its scan
    reads every notify version (fails if it reads the newest only: the record says
    not weak)."""
    _served_while_the_first_draw_fails(cluster, lambda w: w._scanner._family_pass())
    [record] = quarantined(cluster)
    assert record.weak


def test_the_next_due_try_of_a_back_off_cleared_meanwhile_is_none() -> None:
    """The last failing cell is cleared by another scanner thread between a look at the
    back-off and the taking of its lock (played by a lock that clears it as it is
    taken): no try is due (fails if the earliest of no tries is asked for)."""
    backoff = Backoff(retry_delay=1.0, max_retry_delay=5.0)
    backoff.failed(T, ROW, COL)

    class ClearedMeanwhile:
        def __enter__(self) -> None:
            backoff._failures.clear()  # what the other thread's clear() did, holding the lock

        def __exit__(self, *exc: object) -> None:
            return None

    backoff._lock = ClearedMeanwhile()  # type: ignore[assignment]
    assert backoff.next_due() is None


def test_a_family_pass_passes_by_a_row_backing_off_without_trying_its_lock(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row whose observer failed here waits an hour for its retry: a pass over the
    notify family (from that row: the draw set by the test) passes it by without a
    run and without a try of its advisory lock (held by the test, as another scanner
    would hold it: no meeting is counted), and serves the next row of its batch."""
    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        choice=lambda rows: rows[0], randint=lambda lo, hi: lo, shuffle=lambda tables: None))
    observer = Fails()
    worker = Worker(cluster, [observer], threads=1, retry_delay=3600.0,
                    max_retry_delay=3600.0)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"v")
    worker._scanner._family_pass()
    assert observer.runs == 1 and worker._runner.backoff.waiting(T, ROW, COL)
    observer.failing = False
    with Transaction(cluster) as txn:
        txn.set(T, ROW + b"s", COL, b"v")
    coordination = internals(cluster).coordination
    key = f"{T}/{ROW.hex()}"
    assert coordination.try_advisory_lock(key)
    try:
        assert worker._scanner._family_pass()
    finally:
        coordination.release_advisory_lock(key)
    assert observer.runs == 2 and worker.stats["meetings"] == 0
    assert worker.stats["committed"] == 1 and worker._runner.backoff.waiting(T, ROW, COL)


class CopiesW(Observer):
    """Copies raw:w, the row's other observed column."""

    table, column = T, "raw:w"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(T, row, "out:w", txn.get(T, row, column) or b"")


def test_a_rows_cell_backing_off_leaves_its_other_cells_served(
    cluster: percolator.Cluster,
) -> None:
    """raw:v's observer fails (its retry an hour away), raw:w's copies: each time the
    row is served, raw:w runs while raw:v waits (fails if a cell backing off ends the
    row's runs); so it does when the cells the runner is handed list raw:v without a
    notify version, passed by."""
    failing = Fails()
    worker = Worker(cluster, [failing, CopiesW], threads=1, retry_delay=3600.0,
                    max_retry_delay=3600.0)
    worker.register()
    for value in (b"1", b"2"):
        with Transaction(cluster) as txn:
            txn.set(T, ROW, COL, value)
            txn.set(T, ROW, "raw:w", value)
        worker._scanner.serve_row(T, ROW)
        assert failing.runs == 1 and Snapshot(cluster).get(T, ROW, "out:w") == value
    with Transaction(cluster) as txn:
        txn.set(T, ROW, "raw:w", b"3")
    cells = internals(cluster).store.read_rows(
        T, [ROW], [Read(NOTIFY, ("raw:w",), versions=None)])[ROW]
    assert worker._runner.run_cells(T, ROW, {f"{NOTIFY}:{COL}": [], **cells})
    assert Snapshot(cluster).get(T, ROW, "out:w") == b"3"
    assert failing.runs == 1 and worker.stats["committed"] == 3


def test_a_run_that_fails_before_its_read_of_a_strong_notification_counts_it_strong(
    cluster: percolator.Cluster,
) -> None:
    """As the run above, the scanner having read one strong notification only: the
    failure counts against it as strong (the quarantine record says not weak)."""
    worker = Worker(cluster, [Fails()], threads=1, max_failures=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"v")
    host = internals(cluster)
    failing = FirstDrawFails(host.timestamps)
    host.timestamps = failing  # type: ignore[assignment]
    try:
        worker._scanner.serve_row(T, ROW)
    finally:
        host.timestamps = failing._source  # type: ignore[assignment]
    [record] = quarantined(cluster)
    assert failing.failed and record.weak is False


def test_a_run_that_fails_counts_against_the_notifications_of_its_own_read(
    cluster: percolator.Cluster,
) -> None:
    """The scanner read a strong notification; a weak one came before the run's start:
    the run reads both and fails, and its failure counts against what it read, the
    newest version and weak (the quarantine record says weak), not against the
    scanner's read."""
    observer = Fails()
    worker = Worker(cluster, [observer], threads=1, max_failures=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"v")
    batch = internals(cluster).store.read_rows(
        T, [ROW], [Read(NOTIFY, (COL,), versions=None)])[ROW]
    with Transaction(cluster) as txn:
        txn.notify(T, ROW, COL)
    worker._runner.run_cells(T, ROW, batch)
    assert observer.runs == 1
    [record] = quarantined(cluster)
    assert record.weak is True
    assert list(pending_notifications(cluster, [T])) == []
