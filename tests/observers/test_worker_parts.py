"""The worker's parts asked directly, each question they answer on its own: what
``load_observers`` accepts; how long ``wait_for_observers`` waits unless told;
which served cells :class:`observers._runner.Recent` vouches for, up to which version
and for how long (the module's clock set by the test, so that an answer that depends
on time is asked at exactly the time it depends on), and which a runner keeping one
remembers; where a family pass begins (the rows it samples and remembers) and what it
reads; which index entries :class:`observers._scanner.Served` holds, and for
how long; how far a pass skips when it meets another scanner, and when it ends
(:class:`observers._scanner.Spread`, its random draw set by the test); what a look
hands over; when a run lets go of the store turn (:class:`observers._store_turn.Waits`)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import observers._runner
import observers._scanner
import percolator
from observers import WaitTimeout, Worker, _store_turn, load_observers, wait_for_observers
from observers._runner import Ran, Recent, Runner
from observers._scanner import Served, Spread, _first_rows
from observers._store_turn import StoreTurn, Waits
from percolator import (
    InvalidArgument,
    OracleUnavailable,
    Snapshot,
    StoreUnavailable,
    Transaction,
    metrics,
)
from percolator.ext import NOTIFY, SINGLE_WRITER, Mutation, Read, RowCells, internals
from tests._backends import backend_fixture, make_store_url
from tests.observers import _app
from tests.observers.test_notify_index import DrawsFail
from tests.observers.test_trickle import CountingStore

backend = backend_fixture("sqlite")

AN_INSTANCE = _app.Indexer()
A_TUPLE = (_app.Indexer, _app.Stage2)
NOT_AN_OBSERVER = 42
NOT_AN_OBSERVER_CLASS = int


# --- load_observers ------------------------------------------------------------------------


def test_load_observers_takes_an_observer_class_an_instance_or_a_list_of_them() -> None:
    assert load_observers("tests.observers._app:Indexer") == [_app.Indexer]
    assert load_observers(f"{__name__}:AN_INSTANCE") == [AN_INSTANCE]
    loaded = load_observers(f"{__name__}:A_TUPLE")
    assert loaded == [_app.Indexer, _app.Stage2] and isinstance(loaded, list)
    assert load_observers("tests.observers._app:OBSERVERS") == _app.OBSERVERS


@pytest.mark.parametrize("name", ["NOT_AN_OBSERVER", "NOT_AN_OBSERVER_CLASS"])
def test_load_observers_refuses_what_is_no_observer_naming_it(name: str) -> None:
    spec = f"{__name__}:{name}"
    refused = f"^{re.escape(repr(spec))} is not a list of observers: "
    with pytest.raises(InvalidArgument, match=refused):
        load_observers(spec)


def test_load_observers_tells_a_malformed_spec_as_the_observers_spec() -> None:
    with pytest.raises(InvalidArgument, match=r"^bad observers spec 'no-colon': expected"):
        load_observers("no-colon")
    with pytest.raises(InvalidArgument, match=r"^cannot load observers spec "):
        load_observers("tests.observers._app:NO_SUCH_NAME")


# --- wait_for_observers -------------------------------------------------------------------


def test_wait_for_observers_gives_up_after_a_minute_unless_told(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Left out, the timeout is 60 s. A notification no worker serves keeps the wait
    busy; its clock (set by the test) moves 15 s at each pause between passes, so
    that its passes look at 0, 15, 30, 45 and 60 s: it gives up at the one at 60 s,
    naming its timeout."""
    now = [1000.0]

    def pause(seconds: float) -> None:
        now[0] += 15.0

    monkeypatch.setattr("percolator._notifications.time",
                        SimpleNamespace(monotonic=lambda: now[0], sleep=pause))
    Worker(cluster, [_app.Indexer]).register()
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"1")
    with pytest.raises(WaitTimeout, match=r"^observers still busy after 60\.0s: 1 pending "):
        wait_for_observers(cluster)
    assert now[0] == 1060.0


# --- Worker: the parts it makes and what it gives them -------------------------------------


@pytest.mark.parametrize(("threads", "single_writer", "turn", "recent"), [
    (1, True, False, False), (2, True, True, False),
    (1, False, False, False), (2, False, False, True),
])
def test_a_worker_gives_its_parts_one_store_turn_or_one_recent_as_its_threads_need(
    cluster: percolator.Cluster, threads: int, single_writer: bool, turn: bool, recent: bool,
) -> None:
    """Several scanners take turns at a single-writer store (one StoreTurn for the
    runner and the scanner); elsewhere they pass at once, and the runner keeps Recent.
    Both parts share the worker's stop event, counts, cluster and observed columns;
    the runner has a Waits per observer and the worker's commit hook."""
    store = internals(cluster).store
    if not single_writer:
        store.capabilities = store.capabilities - {SINGLE_WRITER}  # type: ignore[misc]

    def on_commit(*args: object) -> None:
        pass

    chosen = [_app.Indexer, _app.Copier, _app.Stage2]
    worker = Worker(cluster, chosen, threads=threads, on_commit=on_commit)
    runner, scanner = worker._runner, worker._scanner
    assert isinstance(runner._store_turn, StoreTurn) is turn
    assert scanner._store_turn is runner._store_turn
    assert isinstance(runner._recent, Recent) is recent
    assert scanner.runner is runner and scanner.cluster is runner.cluster is cluster
    assert scanner._stop is runner._stop is worker._stop
    assert scanner._count == runner._count == worker._count
    assert worker.on_commit is runner.on_commit is on_commit
    indexer, copier, stage2 = worker.observers
    assert runner.by_column is worker._by_column == {
        ("docs", "raw:v"): [indexer, copier], ("docs", "out:seen"): [stage2]}
    assert scanner.columns is worker._columns == {"docs": ("raw:v", "out:seen")}
    assert sorted(runner._waits) == sorted(o.name for o in worker.observers)
    assert all(isinstance(w, Waits) for w in runner._waits.values())


# --- Recent: the cells this worker process saw served lately -------------------------------


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """``time.monotonic()`` as observers._runner sees it: the test moves it by hand."""
    now = [1000.0]
    monkeypatch.setattr(observers._runner, "time", SimpleNamespace(
        monotonic=lambda: now[0], perf_counter=time.perf_counter, sleep=time.sleep))
    return now


def notify(ts: int, *older: int, column: str = "raw:v") -> dict[str, list[tuple[int, bytes]]]:
    """A scanner's read of one notify cell: its versions, newest first."""
    return {f"{NOTIFY}:{column}": [(t, b"") for t in (ts, *older)]}


def test_recent_vouches_for_served_versions_only(clock: list[float]) -> None:
    recent = Recent()
    assert recent.holds("docs", b"r", notify(5)) is False  # nothing served yet
    recent.add("docs", b"r", "raw:v", 500)
    assert recent.holds("docs", b"r", notify(500, 300)) is True  # at and below the served
    assert recent.holds("docs", b"r", notify(499)) is True
    assert recent.holds("docs", b"r", notify(501, 500)) is False  # a newer notification
    assert recent.holds("docs", b"q", notify(500)) is False  # another row
    assert recent.holds("other", b"r", notify(500)) is False  # another table
    assert recent.holds("docs", b"r", notify(500, column="raw:w")) is False  # another column


def test_recent_keeps_the_newest_version_served(clock: list[float]) -> None:
    """A cell served up to 500 and then found served up to 300 (a staler run) is still
    served up to 500, and no higher."""
    recent = Recent()
    recent.add("docs", b"r", "raw:v", 500)
    recent.add("docs", b"r", "raw:v", 300)
    assert recent.holds("docs", b"r", notify(500)) is True
    assert recent.holds("docs", b"r", notify(700)) is False
    recent.add("docs", b"r", "raw:v", 700)
    assert recent.holds("docs", b"r", notify(700)) is True


def test_recent_vouches_for_every_cell_of_the_row_or_none(clock: list[float]) -> None:
    """Every notify cell with versions must be served; cells without versions are left
    out, and a row of none of them is not vouched for."""
    recent = Recent()
    recent.add("docs", b"r", "raw:v", 500)
    both = {**notify(500), **notify(400, column="raw:w")}
    assert recent.holds("docs", b"r", both) is False  # raw:w was never served
    recent.add("docs", b"r", "raw:w", 400)
    assert recent.holds("docs", b"r", both) is True
    no_versions: dict[str, list[tuple[int, bytes]]] = {f"{NOTIFY}:raw:x": []}
    assert recent.holds("docs", b"r", {**no_versions, **notify(500)}) is True
    assert recent.holds("docs", b"r", no_versions) is False
    assert recent.holds("docs", b"r", {}) is False


def test_recent_vouches_for_its_seconds_and_no_longer(clock: list[float]) -> None:
    recent = Recent(seconds=10.0)
    recent.add("docs", b"r", "raw:v", 500)
    clock[0] += 10.0
    assert recent.holds("docs", b"r", notify(500)) is True  # exactly its seconds old
    clock[0] += 0.5
    assert recent.holds("docs", b"r", notify(500)) is False
    recent.add("docs", b"r", "raw:v", 300)  # served again: vouched for anew, up to 500
    assert recent.holds("docs", b"r", notify(500)) is True


def test_recent_forgets_the_cells_served_longest_ago_beyond_its_limit(
    clock: list[float],
) -> None:
    recent = Recent(limit=2)
    recent.add("docs", b"a", "raw:v", 1)
    recent.add("docs", b"b", "raw:v", 1)
    assert recent.holds("docs", b"a", notify(1)) and recent.holds("docs", b"b", notify(1))
    recent.add("docs", b"a", "raw:v", 2)  # served again: now the latest
    recent.add("docs", b"c", "raw:v", 1)
    assert recent.holds("docs", b"b", notify(1)) is False  # the oldest went
    assert recent.holds("docs", b"a", notify(2)) and recent.holds("docs", b"c", notify(1))


def notify_cells(cluster: percolator.Cluster, row: bytes) -> RowCells:
    """*row*'s notify cells as a scanner's batch lists them (every version, newest first)."""
    scan = internals(cluster).store.scan(
        "docs", row, row + b"\x00", [Read(NOTIFY, ("raw:v",), versions=None)])
    return dict(scan)[row]


def runner_keeping_recent(cluster: percolator.Cluster) -> Runner:
    """The runner of a worker whose scanner threads pass at once (a remote store's,
    threads > 1), which keeps a :class:`Recent`: the embedded store's workers take
    turns at the store and keep none, so the test hands the runner one."""
    cluster.create_table("log")  # the Indexer's record of its runs
    worker = Worker(cluster, [_app.Indexer], threads=1)
    worker.register()
    runner = worker._runner
    runner._recent = Recent()
    return runner


def test_a_runner_keeping_recent_vouches_for_the_cells_its_runs_served(
    cluster: percolator.Cluster,
) -> None:
    """A run that served a cell (its commit deleted the notification) leaves it
    remembered up to the version served: a scanner whose batch, read before, still
    lists it is behind (``served_lately``). Not a row it did not serve, nor the cell
    once notified again."""
    runner = runner_keeping_recent(cluster)
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"1")
        txn.set("docs", b"q", "raw:v", b"1")
    batch = notify_cells(cluster, b"r")
    assert runner.served_lately("docs", b"r", batch) is False
    assert runner.run_cells("docs", b"r", batch) is Ran.WORKED
    assert runner.served_lately("docs", b"r", batch) is True
    assert runner.served_lately("docs", b"q", notify_cells(cluster, b"q")) is False
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"2")
    assert runner.served_lately("docs", b"r", notify_cells(cluster, b"r")) is False


def test_a_runner_keeping_recent_vouches_for_a_cell_its_run_found_served(
    cluster: percolator.Cluster,
) -> None:
    """A run that finds the notification its scanner read served already (by another
    worker's run since the scan) meets that scanner, and remembers the cell as served
    up to the version the scanner read."""
    runner = runner_keeping_recent(cluster)
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"1")
    batch = notify_cells(cluster, b"r")
    other = Worker(cluster, [_app.Indexer], threads=1)._runner
    assert other.run_cells("docs", b"r", batch) is Ran.WORKED
    assert runner.run_cells("docs", b"r", batch) is Ran.MET
    assert runner.served_lately("docs", b"r", batch) is True


def test_a_run_of_a_change_acknowledged_already_deletes_its_notification(
    cluster: percolator.Cluster,
) -> None:
    """A notification whose change the observer acknowledged already (a run that
    committed, then crashed before its notification was deleted) is skipped, and
    served: deleted, not left for every later pass to skip again."""
    cluster.create_table("log")
    worker = Worker(cluster, [_app.Indexer], threads=1)
    worker.register()
    runner = worker._runner
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"1")
    batch = notify_cells(cluster, b"r")
    assert runner.run_cells("docs", b"r", batch) is Ran.WORKED
    assert runner.run_cells("docs", b"r", batch) is Ran.MET  # served: an absent run
    store = internals(cluster).store
    store.mutate_rows("docs", [Mutation(b"r", [
        (name, ts, value) for name, versions in batch.items() for ts, value in versions])])
    assert notify_cells(cluster, b"r") == batch  # the notification back, acknowledged
    skipped = ("percolator_observer_runs_total", ("Indexer", "acked_already"))
    before = metrics.snapshot()[0].get(skipped, 0)
    assert runner.run_cells("docs", b"r", batch) is Ran.WORKED
    assert metrics.snapshot()[0].get(skipped, 0) == before + 1
    assert dict(worker.stats) == {"committed": 1, "skipped": 1}  # no absent run counted
    assert dict(store.scan("docs", b"r", b"r\x00", [Read(NOTIFY, versions=None)])) == {}


class WritesItsAck(_app.Indexer):
    """Writes its own acknowledgement, a column of the worker's."""

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, f"_ack:{self.name}@{column}", b"1")


def test_an_observer_is_refused_the_workers_own_columns(cluster: percolator.Cluster) -> None:
    """The acknowledgements (``_`` families) are the worker's alone, read and written
    around the observer's code: an observer that writes one fails its run (a failure
    counted, nothing committed), and its notification stays."""
    cluster.create_table("log")
    worker = Worker(cluster, [WritesItsAck], threads=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"1")
    batch = notify_cells(cluster, b"r")
    worker._runner.run_cells("docs", b"r", batch)
    assert (worker.stats["failures"], worker.stats["committed"]) == (1, 0)
    assert notify_cells(cluster, b"r") == batch


def test_a_run_committed_alone_tells_the_commit_hook_what_it_served(
    cluster: percolator.Cluster,
) -> None:
    """A run committed on its own (not in a group) calls ``on_commit`` with its
    observer, the cell, the change it served and its own commit timestamp."""
    cluster.create_table("log")
    told: list[tuple[object, ...]] = []
    worker = Worker(cluster, [_app.Indexer], threads=1,
                    on_commit=lambda *args: told.append(args))
    worker.register()
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"1")
    timed = ("percolator_observer_run_duration_seconds", ("Indexer",))
    counts, total = metrics.snapshot()[1].get(timed, ([], 0.0))
    began = time.perf_counter()
    assert worker._runner.run_cells("docs", b"r", notify_cells(cluster, b"r")) is Ran.WORKED
    elapsed = time.perf_counter() - began
    counts_after, total_after = metrics.snapshot()[1][timed]
    assert sum(counts_after) == sum(counts) + 1 and 0 <= total_after - total <= elapsed
    assert len(told) == 1
    observer, table, row, column, change, commit_ts = told[0]
    assert (observer, table, row, column, change) == (
        worker.observers[0], "docs", b"r", "raw:v", txn.commit_ts)
    assert isinstance(commit_ts, int) and commit_ts > change


def test_a_family_pass_run_draws_its_start_after_the_scan_that_read_its_notification(
    request: pytest.FixtureRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A run of a scanner's batch begins at a fresh start timestamp, drawn after the
    scan read the notification: not at the spare one its thread's previous (two-phase:
    ``cas-sqlite``) commit drew before that, which only runs that read the
    notification themselves may take, and whose snapshot would hold none of the
    change."""
    with percolator.connect(make_store_url("cas-sqlite", request, tmp_path)) as cas:
        cas.create_table("docs")
        cas.create_table("log")
        worker = Worker(cas, [_app.Indexer], threads=1)
        worker.register()
        for row in (b"r", b"q"):  # the second change comes after the first run's commit
            with Transaction(cas) as txn:
                txn.set("docs", row, "raw:v", b"1")
            assert worker._runner.run_cells("docs", row, notify_cells(cas, row)) is Ran.WORKED
        assert worker.stats["committed"] == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


def test_a_run_that_fails_before_reading_its_notification_counts_against_the_scans(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that fails before its first read (which reads the notification) counts
    its failure against the notification the scanner read: quarantined (here at the
    first failure), that one leaves circulation."""
    from percolator._observer_hooks import ObserverRun

    cluster.create_table("log")
    worker = Worker(cluster, [_app.Indexer], threads=1, max_failures=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"1")

    def refused(*args: object, **kwargs: object) -> None:
        raise InvalidArgument("the run's first read refused (test)")

    monkeypatch.setattr(ObserverRun, "get_row_notified", refused)
    worker._runner.run_cells("docs", b"r", notify_cells(cluster, b"r"))
    monkeypatch.undo()
    assert (worker.stats["failures"], worker.stats["quarantined"]) == (1, 1)
    assert dict(internals(cluster).store.scan(
        "docs", b"r", b"r\x00", [Read(NOTIFY, versions=None)])) == {}


class AfterTheDraw:
    """The cluster's timestamp source; its next draw is followed by *then* (called with
    the timestamp drawn, which it may replace)."""

    def __init__(self, source: Any, then: Callable[[int], int]) -> None:
        self._source = source
        self.then: Callable[[int], int] | None = then

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def get_timestamp(self) -> int:
        drawn: int = self._source.get_timestamp()
        then, self.then = self.then, None
        return then(drawn) if then is not None else drawn


def below_the_notification(
    cluster: percolator.Cluster, runner: Runner, cells: RowCells, then: Callable[[int], int],
    caplog: pytest.LogCaptureFixture,
) -> list[str]:
    """Run the cells of row r with *then* after the run's draw; the errors logged."""
    host = internals(cluster)
    source = host.timestamps
    host.timestamps = AfterTheDraw(source, then)
    try:
        with caplog.at_level("ERROR", logger="observers"):
            runner.run_cells("docs", b"r", cells)
    finally:
        host.timestamps = source
    return [r.getMessage() for r in caplog.records if "is below the notification" in r.getMessage()]


def test_a_run_whose_snapshot_is_below_the_notification_read_leaves_it_and_says_so(
    cluster: percolator.Cluster, caplog: pytest.LogCaptureFixture,
) -> None:
    """Every timestamp source draws above what was read before the draw
    (docs/timestamps.md); one that drew a run's start below the notification its
    scanner read (played by the test: one below it) leaves the notification for a
    later pass, and an error is logged. Not for a run whose notification was served
    meanwhile (a meeting), nor for one at the notification's own timestamp that finds
    only a notification committed after its draw: those are no fault of the
    timestamp source."""
    runner = runner_keeping_recent(cluster)
    notified(cluster, b"r")
    batch = notify_cells(cluster, b"r")
    handed = batch[f"{NOTIFY}:raw:v"][0][0]
    errors = below_the_notification(cluster, runner, batch, lambda drawn: handed - 1, caplog)
    assert errors == [f"Indexer on docs/r/raw:v: snapshot {handed - 1} is below the "
                      f"notification {handed}; leaving it for a later pass"]
    assert notify_cells(cluster, b"r") == batch
    caplog.clear()
    other = Worker(cluster, [_app.Indexer], threads=1)._runner
    assert other.run_cells("docs", b"r", batch)  # served by another worker: a meeting
    assert below_the_notification(cluster, runner, batch, lambda drawn: drawn, caplog) == []

    def notified_after(drawn: int) -> int:
        notified(cluster, b"r")
        return handed

    assert below_the_notification(cluster, runner, batch, notified_after, caplog) == []


class IndexerToo(_app.Indexer):
    """A second observer of raw:v."""


def test_a_cell_is_left_notified_unless_every_observer_of_it_ran_on_the_notification(
    cluster: percolator.Cluster,
) -> None:
    """Two observers of raw:v. The scanner's batch lists a notification that another
    worker serves before the run; a new one is committed just after the first
    observer's start is drawn (the test's timestamp source), so the first finds
    nothing at or below its start and the second runs on the new one: the cell stays
    notified, for the first observer's next run (fails if the second's run alone
    deletes the notification: the first would never see that change)."""
    cluster.create_table("log")
    worker = Worker(cluster, [_app.Indexer, IndexerToo], threads=1)
    worker.register()
    notified(cluster, b"r")
    batch = notify_cells(cluster, b"r")
    other = Worker(cluster, [_app.Indexer, IndexerToo], threads=1)._runner
    assert other.run_cells("docs", b"r", batch)
    assert internals(cluster).store.read_rows(
        "docs", [b"r"], [Read(NOTIFY, ("raw:v",), versions=None)]) == {}

    def notified_after(drawn: int) -> int:
        notified(cluster, b"r")
        return drawn

    host = internals(cluster)
    source = host.timestamps
    host.timestamps = AfterTheDraw(source, notified_after)
    try:
        worker._runner.run_cells("docs", b"r", batch)
    finally:
        host.timestamps = source
    assert worker.stats["committed"] == 1
    assert notify_cells(cluster, b"r")[f"{NOTIFY}:raw:v"][0][0] > batch[f"{NOTIFY}:raw:v"][0][0]


def test_a_runner_keeping_recent_vouches_for_a_cell_all_its_observers_served(
    cluster: percolator.Cluster,
) -> None:
    """Two observers of the column: their commits leave the notification, which the
    runner deletes once both served it, and remembers as served."""
    cluster.create_table("log")
    worker = Worker(cluster, [_app.Indexer, IndexerToo], threads=1)
    worker.register()
    runner = worker._runner
    runner._recent = Recent()
    notified(cluster, b"r")
    batch = notify_cells(cluster, b"r")
    assert runner.run_cells("docs", b"r", batch) is Ran.WORKED
    assert worker.stats["committed"] == 2
    assert runner.served_lately("docs", b"r", batch) is True


def test_a_scanner_thread_begins_with_a_pass(
    cluster: percolator.Cluster, caplog: pytest.LogCaptureFixture,
) -> None:
    """A scanner thread passes over the notify family as soon as it starts, before any
    ring or hand-over (there is no lookout here, and it would otherwise sleep its
    idle time, an hour): the observer, on the row it finds, stops the worker. The
    pass is timed (its duration within the thread's) without an error."""
    worker: list[Worker] = []

    class StopsTheWorker(Recording):
        def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
            worker[0]._stop.set()
            super().process(txn, row, column)

    cluster.create_table("log")
    observer = StopsTheWorker()
    worker.append(Worker(cluster, [observer], threads=1, idle_max=3600.0))
    worker[0].register()
    notified(cluster, b"r")
    timed = ("percolator_notification_scan_duration_seconds", ())
    counts, total = metrics.snapshot()[1].get(timed, ([], 0.0))
    thread = threading.Thread(target=worker[0]._scanner.scanner_thread, daemon=True)
    began = time.perf_counter()
    thread.start()
    thread.join(timeout=60)
    elapsed = time.perf_counter() - began
    if thread.is_alive():  # asleep without a first pass: wake it to end
        worker[0]._stop.set()
        worker[0]._scanner.bell.set()
        thread.join()
    assert observer.rows == [b"r"] and worker[0].stats["passes"] == 1
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []
    counts_after, total_after = metrics.snapshot()[1][timed]
    assert sum(counts_after) == sum(counts) + 1 and 0 <= total_after - total <= elapsed


def test_a_scanner_thread_whose_pass_fails_sleeps_before_the_next(
    cluster: percolator.Cluster,
) -> None:
    """A pass that fails (the store unavailable) is not taken for work done: the scanner
    sleeps (idle) before its next pass, rather than pass again at once. The failing
    pass also stops the worker and rings its bell, so that the sleep ends at once."""
    worker = Worker(cluster, [_app.Indexer], threads=1, idle_max=3600.0)
    scanner = worker._scanner

    def fails() -> bool:
        worker._stop.set()
        scanner.bell.set()
        raise StoreUnavailable("the test's store is away")

    scanner.scan_pass = fails  # type: ignore[method-assign]
    thread = threading.Thread(target=scanner.scanner_thread, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert worker.stats["passes"] == 1 and worker.stats["idle"] == 1


@pytest.mark.parametrize("handed", [False, True], ids=["pass", "handed-row"])
def test_a_scanner_thread_waiting_for_the_store_turn_ends_when_its_worker_stops(
    cluster: percolator.Cluster, caplog: pytest.LogCaptureFixture, handed: bool,
) -> None:
    """A scanner thread about to pass (or to serve a row the lookout handed over)
    while another thread holds the store turn waits for the turn watching its
    worker's stop: once the worker stops, it ends without the pass and without an
    error (a wait that did not watch the stop failed at once, a scanner error, where
    the turn was held)."""
    worker = Worker(cluster, [_app.Indexer], threads=2, idle_max=3600.0)
    scanner = worker._scanner
    turn = scanner._store_turn
    assert turn is not None and turn.take(threading.Event())  # the test holds the turn
    if handed:
        scanner.bell.hand([("docs", b"r", {"raw:v": 1}, time.monotonic())])

    def errors() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]

    thread = threading.Thread(target=scanner.scanner_thread, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60  # bounds a hang only
    while (turn._watcher != thread.ident and thread.is_alive() and not errors()
           and time.monotonic() < deadline):
        time.sleep(0.001)
    waited = turn._watcher == thread.ident
    worker._stop.set()
    scanner.bell.set()
    thread.join(timeout=60)
    turn.give()
    assert not thread.is_alive()
    assert errors() == []
    assert worker.stats["passes"] == 0  # ended waiting, before its pass
    assert waited, "the scanner thread did not wait for the turn"


class WaitsForTheTest(_app.Indexer):
    """The Indexer, once the test lets it go (an observer waiting on a service)."""

    def __init__(self) -> None:
        self.entered, self.go = threading.Event(), threading.Event()

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        self.entered.set()
        assert self.go.wait(60)
        super().process(txn, row, column)


def test_a_run_that_let_go_of_the_store_turn_commits_without_it_once_its_worker_stops(
    cluster: percolator.Cluster,
) -> None:
    """A run whose observer waits lets go of the store turn; when another thread holds
    the turn as the observer returns, the run waits for it watching its worker's stop,
    and once the worker stops goes on without it: it commits (a wait that did not
    watch the stop failed the run)."""
    cluster.create_table("log")
    observer = WaitsForTheTest()
    worker = Worker(cluster, [observer], threads=2)
    worker.register()
    runner, turn = worker._runner, worker._runner._store_turn
    assert turn is not None
    runner._waits[observer.name].mean = 1.0  # measured waiting: its runs let go of the turn
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"1")
    batch = notify_cells(cluster, b"r")
    ran: list[Ran] = []

    def scanner() -> None:
        assert turn.take(worker._stop)
        ran.append(runner.run_cells("docs", b"r", batch))

    thread = threading.Thread(target=scanner)
    thread.start()
    try:
        assert observer.entered.wait(60)
        assert turn.take(threading.Event())  # the test takes the turn the run let go of
        worker._stop.set()
    finally:
        observer.go.set()
        thread.join(60)
    turn.give()
    assert ran == [Ran.WORKED]
    assert (worker.stats["committed"], worker.stats["failures"]) == (1, 0)


class Conflicts(_app.Indexer):
    """The Indexer, whose first *times* runs meet a conflict in its own code (a read
    of a cell another transaction wrote meanwhile, say)."""

    def __init__(self, times: int) -> None:
        self.times = times

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        if self.times:
            self.times -= 1
            raise percolator.ConflictError("a conflict in the observer (test)",
                                           start_ts=txn.start_ts)
        super().process(txn, row, column)


@pytest.mark.parametrize(("times", "committed"), [(1, 1), (4, 0)])
def test_a_conflict_in_an_observers_code_is_run_again_not_counted_as_its_failure(
    cluster: percolator.Cluster, times: int, committed: int,
) -> None:
    """A retryable error raised in the observer's code is a conflict: the run is tried
    again (and commits), not failed towards quarantine; after four tries it is left,
    its notification kept for a later pass."""
    cluster.create_table("log")
    worker = Worker(cluster, [Conflicts(times)], threads=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"1")
    batch = notify_cells(cluster, b"r")
    assert worker._runner.run_cells("docs", b"r", batch) is Ran.WORKED
    assert [worker.stats[k] for k in ("conflicts", "committed", "failures")] == [
        times, committed, 0]
    assert dict(internals(cluster).store.scan(
        "docs", b"r", b"r\x00", [Read(NOTIFY, versions=None)])) == (
            {} if committed else {b"r": batch})


class Unavailable(_app.Indexer):
    """The Indexer, whose own code finds a store of its unavailable."""

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        raise StoreUnavailable("the observer's other store is down (test)")


def test_an_observer_whose_own_code_finds_a_store_unavailable_fails_its_run(
    cluster: percolator.Cluster,
) -> None:
    """StoreUnavailable from the observer's code is the observer's failure (counted
    towards quarantine), not the worker's store failing: the pass goes on."""
    cluster.create_table("log")
    worker = Worker(cluster, [Unavailable()], threads=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"1")
    assert worker._runner.run_cells("docs", b"r", notify_cells(cluster, b"r")) is Ran.WORKED
    assert (worker.stats["failures"], worker.stats["committed"]) == (1, 0)


def test_a_scanner_with_nothing_to_do_sleeps_between_half_and_all_of_idle_max(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a pass that found nothing, a scanner sleeps a time drawn between half of
    ``idle_max`` and all of it (scanners started together spread out), unless woken,
    or until a failed notification is due again if that comes sooner."""
    worker = Worker(cluster, [_app.Indexer], threads=1, idle_max=8.0)
    scanner = worker._scanner
    drawn: list[tuple[float, float]] = []
    real = observers._scanner.random

    def uniform(low: float, high: float) -> float:
        drawn.append((low, high))
        return high

    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        uniform=uniform, choice=real.choice, randint=real.randint, random=real.random,
        randrange=real.randrange, shuffle=real.shuffle))
    slept: list[float] = []
    asleep: list[tuple[bool, int]] = []  # (waits for the rings since its own, sleepers)
    naps = [0]  # sleeps to end by their timeout before the one that stops the worker
    passed_ago: list[float] = []

    def wait(seen: int, timeout: float) -> bool:
        slept.append(timeout)
        asleep.append((seen == scanner.bell.rung, scanner._sleeping))
        if passed_ago:  # when a scanner of the worker last began a pass, as the test sets
            scanner._passed_at = time.monotonic() - passed_ago[0]
        if naps[0]:
            naps[0] -= 1
        else:
            worker._stop.set()
        return False

    monkeypatch.setattr(scanner.bell, "wait", wait)
    scanner.scanner_thread()  # here: a pass with nothing to do, then the sleep
    assert (drawn, slept) == ([(4.0, 8.0)], [8.0])
    assert (worker.stats["passes"], worker.stats["idle"]) == (1, 1)
    # A failed notification due again sooner (after retry_delay): awake by then.
    delay = worker._runner.backoff.failed("docs", b"r", "raw:v")
    worker._stop.clear()
    scanner.scanner_thread()
    assert len(slept) == 2 and 0 < slept[1] <= 1.2 * delay + 0.001  # jittered by 1.2 at most
    # One due already: a millisecond's nap, not none (nor a negative one), and a pass
    # once it ends, though this scanner passed just now. Another scanner sleeps too.
    worker._runner.backoff.retry_delay = 0
    worker._runner.backoff.failed("docs", b"q", "raw:v")
    worker._stop.clear()
    naps[0], scanner._sleeping = 1, 1
    scanner.scanner_thread()
    assert slept[2:] == [0.001, 0.001]
    assert worker.stats["passes"] == 4  # a pass after the nap, then the last sleep
    assert asleep == [(True, 1), (True, 1), (True, 2), (True, 2)]
    assert scanner._sleeping == 1  # the other one
    # No failure due: after a nap that ended by itself, a pass only if no scanner of the
    # worker began one for half of idle_max (3 s ago: none; 5 s ago: one).
    worker._runner.backoff.clear("docs", b"r", "raw:v")
    worker._runner.backoff.clear("docs", b"q", "raw:v")
    for ago, passes in ((3.0, 1), (5.0, 2)):
        before = worker.stats["passes"]
        worker._stop.clear()
        naps[0], passed_ago[:] = 1, [ago]
        scanner.scanner_thread()
        assert worker.stats["passes"] - before == passes, ago


class FailsOnBad(_app.Indexer):
    """The Indexer, failing on the value ``bad``."""

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        if txn.get(self.table, row, column) == b"bad":
            raise ValueError("bad value")
        super().process(txn, row, column)


def test_a_failed_run_does_not_renew_what_recent_vouches_for(
    cluster: percolator.Cluster, clock: list[float],
) -> None:
    """A cell served (remembered for ten seconds here, the module's clock set by the
    test) and then notified again with a change its observer fails on: the failed run
    served nothing, so the cell is vouched for up to the first version only until ten
    seconds after that was served (fails if the failure renews the remembering)."""
    cluster.create_table("log")
    worker = Worker(cluster, [FailsOnBad], threads=1)
    worker.register()
    runner = worker._runner
    runner._recent = Recent(seconds=10.0)
    notified(cluster, b"r")
    first = notify_cells(cluster, b"r")
    assert runner.run_cells("docs", b"r", first)
    clock[0] += 9.0
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"bad")
    assert runner.run_cells("docs", b"r", notify_cells(cluster, b"r"))
    assert worker.stats["failures"] == 1 and runner.served_lately("docs", b"r", first)
    clock[0] += 2.0
    assert runner.served_lately("docs", b"r", first) is False


def test_a_scanner_thread_serves_a_handed_row_holding_the_store_turn(
    cluster: percolator.Cluster,
) -> None:
    """Two scanner threads on the embedded store take turns at it (a store turn): a
    row handed over by a look is served by a scanner thread that holds the turn (the
    observer looks, then stops the worker)."""
    worker: list[Worker] = []
    held: list[bool] = []

    class LooksAtTheTurn(Recording):
        def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
            turn = worker[0]._scanner._store_turn
            held.append(turn is not None and turn._holder == threading.get_ident())
            worker[0]._stop.set()
            super().process(txn, row, column)

    cluster.create_table("log")
    observer = LooksAtTheTurn()
    worker.append(Worker(cluster, [observer], threads=2))
    worker[0].register()
    notified(cluster, b"r")
    scanner = worker[0]._scanner
    scanner.look(frozenset())
    thread = threading.Thread(target=scanner.scanner_thread, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert observer.rows == [b"r"] and held == [True]
    assert worker[0].stats["passes"] == 0  # the handed row, then stopped


# --- Served: the index entries this worker's scanners ran -------------------------------


def test_served_forgets_the_entries_noted_longest_ago_beyond_its_limit() -> None:
    served = Served(limit=2)
    served.add("docs", b"a", {"raw:v": 1})
    served.add("docs", b"b", {"raw:v": 1})
    assert served.holds("docs", b"a", {"raw:v": 1}) and served.holds("docs", b"b", {"raw:v": 1})
    served.add("docs", b"c", {"raw:v": 1})
    assert served.holds("docs", b"a", {"raw:v": 1}) is False  # the oldest went
    assert served.holds("docs", b"b", {"raw:v": 1}) and served.holds("docs", b"c", {"raw:v": 1})


def test_served_forgets_a_batch_whose_settling_failed_entry_by_entry() -> None:
    """Each entry of the batch is forgotten (a later look settles them), one no longer
    held (gone beyond the limit meanwhile) with them; the others stay."""
    served = Served()
    served.add("docs", b"a", {"raw:v": 1, "raw:w": 2})
    served.add("docs", b"b", {"raw:v": 3})
    served.forget([("docs", b"a", {"raw:v": 1, "raw:w": 2}), ("docs", b"gone", {"raw:v": 9})])
    assert served.holds("docs", b"a", {"raw:v": 1}) is False
    assert served.holds("docs", b"a", {"raw:w": 2}) is False
    assert served.holds("docs", b"b", {"raw:v": 3}) is True


# --- Spread: a pass's anti-clumping ---------------------------------------------------------


def test_a_pass_skips_a_random_stretch_at_each_meeting_and_ends_at_the_fourth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each of the first three meetings skips a stretch drawn from [held, held + 16 per
    scanner thread] (the draw returns its bound here, each end in turn); the fourth ends
    the pass."""
    drawn: list[tuple[int, int]] = []

    def randint(lo: int, hi: int) -> int:
        drawn.append((lo, hi))
        return hi if len(drawn) % 2 else lo

    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(randint=randint))
    spread = Spread(threads=3, held=2)
    assert spread.met() is False and spread.skip == 2 + 48
    assert spread.met() is False and spread.skip == 2
    assert spread.met() is False
    assert drawn == [(2, 50)] * 3
    assert spread.met() is True  # the fourth
    assert spread.meetings == 4
    skipped = 0
    while spread.skipping():
        skipped += 1
    assert skipped == 50 and spread.skip == 0  # the third draw's stretch, then no more


def test_a_scanner_counts_its_meetings_and_the_jumps_that_end_its_passes(
    cluster: percolator.Cluster,
) -> None:
    worker = Worker(cluster, [_app.Indexer], threads=1)
    spread = Spread(threads=1)
    assert [worker._scanner._met(spread) for _ in range(4)] == [False, False, False, True]
    assert worker.stats["meetings"] == 4 and worker.stats["jumps"] == 1


def test_a_row_handed_over_while_another_scanner_holds_it_is_a_meeting(
    cluster: percolator.Cluster,
) -> None:
    """The row's advisory lock is held (by the test, as another scanner of the process
    would hold it): the scanner it is handed to leaves it, and counts a meeting."""
    worker = Worker(cluster, [_app.Indexer], threads=1)
    coordination = internals(cluster).coordination
    key = f"docs/{b'r'.hex()}"
    assert coordination.try_advisory_lock(key)
    try:
        worker._scanner.serve_handed("docs", b"r", {"raw:v": 5}, 0.0)
    finally:
        coordination.release_advisory_lock(key)
    assert worker.stats["meetings"] == 1 and worker.stats["committed"] == 0


# --- a family pass: where it begins, what it reads ----------------------------------------


class Recording(_app.Indexer):
    """The Indexer, noting the rows it runs on, in order."""

    def __init__(self) -> None:
        self.rows: list[bytes] = []

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        self.rows.append(row)
        super().process(txn, row, column)


def recording_worker(cluster: percolator.Cluster) -> tuple[Worker, Recording]:
    cluster.create_table("log")  # the Indexer's record of its runs
    observer = Recording()
    worker = Worker(cluster, [observer], threads=1)
    worker.register()
    return worker, observer


def notified(cluster: percolator.Cluster, *rows: bytes, column: str = "raw:v") -> None:
    with Transaction(cluster) as txn:
        for row in rows:
            txn.set("docs", row, column, row)


@pytest.fixture
def scanner_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """``time.monotonic()`` as observers._scanner sees it: the test moves it by hand."""
    now = [1000.0]
    monkeypatch.setattr(observers._scanner, "time", SimpleNamespace(
        monotonic=lambda: now[0], perf_counter=time.perf_counter, sleep=time.sleep))
    return now


def test_first_rows_takes_count_rows_of_a_scan_and_closes_it() -> None:
    """An HBase scanner is let go of at once, not when its iterator is collected; a
    scan without ``close`` (a list's iterator) is taken as it is."""

    class Scan:
        def __init__(self, rows: list[tuple[bytes, dict[str, Any]]]) -> None:
            self.rows = iter(rows)
            self.closed = False

        def __iter__(self) -> Scan:
            return self

        def __next__(self) -> tuple[bytes, dict[str, Any]]:
            return next(self.rows)

        def close(self) -> None:
            self.closed = True

    scan = Scan([(b"a", {}), (b"b", {}), (b"c", {})])
    assert _first_rows(scan, 2) == [(b"a", {}), (b"b", {})]
    assert scan.closed
    assert _first_rows(iter([(b"a", {})]), 5) == [(b"a", {})]


def test_a_scanner_remembers_sample_rows_then_replaces_one_at_random(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SAMPLE rows (two here) are kept as they come; then each new one replaces one
    drawn from them (the draw set by the test: the second)."""
    monkeypatch.setattr(observers._scanner, "SAMPLE", 2)
    drawn: list[int] = []

    def randrange(n: int) -> int:
        drawn.append(n)
        return 1

    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(randrange=randrange))
    scanner = Worker(cluster, [_app.Indexer], threads=1)._scanner
    for row in (b"a", b"b", b"c"):
        scanner.remember("docs", row)
    assert scanner._sample["docs"] == [b"a", b"c"] and drawn == [2]


def test_a_scanner_without_split_keys_samples_its_first_rows_at_most_once_a_minute(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch, scanner_clock: list[float],
) -> None:
    """On a store that tells no split keys (the embedded store), a scanner that has seen
    no row of a table reads the first SAMPLE_READ (three here) rows of its notify
    family to start passes at; again SPLITS_REFRESH seconds later, not before (the
    module's clock set by the test)."""
    monkeypatch.setattr(observers._scanner, "SAMPLE_READ", 3)
    worker = Worker(cluster, [_app.Indexer], threads=1)
    worker.register()
    scanner = worker._scanner
    notified(cluster, b"b", b"c", b"d", b"e")
    reads = [Read(NOTIFY, ("raw:v",), versions=None)]
    scanner._read_sample("docs", reads)
    assert scanner._sample["docs"] == [b"b", b"c", b"d"]
    notified(cluster, b"a")
    scanner_clock[0] += 59.5
    scanner._read_sample("docs", reads)
    assert scanner._sample["docs"] == [b"b", b"c", b"d"]  # not read again
    scanner_clock[0] += 0.5
    scanner._read_sample("docs", reads)
    assert scanner._sample["docs"] == [b"b", b"c", b"d", b"a", b"b", b"c"]


def test_a_fresh_scanners_family_pass_begins_at_a_sampled_row_and_wraps_around(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a store without split keys, a scanner that has seen no row samples the notify
    family first and begins its pass at a sampled row (the draw set by the test: the
    third), serves the rows from there, then wraps around to the first row."""
    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        choice=lambda rows: rows[2], randint=lambda lo, hi: lo, shuffle=lambda tables: None))
    worker, observer = recording_worker(cluster)
    notified(cluster, b"a", b"b", b"c", b"d")
    assert worker._scanner._family_pass()
    assert observer.rows == [b"c", b"d", b"a", b"b"]
    assert worker.stats["meetings"] == 0


def test_a_family_pass_with_no_row_to_begin_at_reads_the_table_once(
    cluster: percolator.Cluster, scanner_clock: list[float],
) -> None:
    """A pass that found the table empty sampled nothing; rows notified before the
    sample may be read again (SPLITS_REFRESH) are served by a pass from the first row,
    over the table once: no row met twice (it would be, still held by the pass's
    group: a meeting). The scanner remembers the rows it passed, to begin at later."""
    worker, observer = recording_worker(cluster)
    assert not worker._scanner._family_pass()
    notified(cluster, b"a", b"b", b"c")
    assert worker._scanner._family_pass()
    assert observer.rows == [b"a", b"b", b"c"]
    assert worker.stats["meetings"] == 0 and worker.stats["committed"] == 3
    assert worker._scanner._sample["docs"] == [b"a", b"b", b"c"]  # the rows it passed


def test_a_family_pass_reads_its_rows_a_batch_at_a_time_each_fresh(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SCAN_BATCH rows (three here) per scan, each scan from just past the previous
    batch's last row and within the pass's range: the pass begins at a sampled row
    (the draw set by the test: the third, c), serves the rows from there, then wraps
    around to a and b. Row g is served by another worker while this one runs c: the
    second batch, read after, no longer lists it, so this worker neither runs it nor
    meets anyone (fails if a scan reads more than its batch, from the first row, from
    past another row of the batch or further than just past its last, past its
    range's end, or if a range ends after its first full batch)."""
    monkeypatch.setattr(observers._scanner, "SCAN_BATCH", 3)
    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        choice=lambda rows: rows[2], randint=lambda lo, hi: lo, shuffle=lambda tables: None))
    other = Worker(cluster, [_app.Indexer], threads=1)._runner

    class ServesGMeanwhile(Recording):
        def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
            if row == b"c":
                assert other.run_cells("docs", b"g", notify_cells(cluster, b"g")) is Ran.WORKED
            super().process(txn, row, column)

    cluster.create_table("log")
    observer = ServesGMeanwhile()
    worker = Worker(cluster, [observer], threads=1)
    worker.register()
    notified(cluster, b"a", b"b", b"c", b"d", b"e", b"e1", b"f", b"g", b"h")
    assert worker._scanner._family_pass()
    assert observer.rows == [b"c", b"d", b"e", b"e1", b"f", b"h", b"a", b"b"]
    assert worker.stats["meetings"] == 0 and worker.stats["committed"] == 8


def test_a_family_pass_ends_its_range_at_its_bound_without_another_scan(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass begins at row ``b"b\\x00"`` (the draw set by the test), the row just
    past b: its wrapped range ends there, and a full batch of that range ending at b
    ends it, without a scan of the empty rest (four scans of the table: the sample,
    two batches of the first range and one of the second). The pass served rows, and
    says so."""
    monkeypatch.setattr(observers._scanner, "SCAN_BATCH", 2)
    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        choice=lambda rows: rows[2], randint=lambda lo, hi: lo, shuffle=lambda tables: None))
    worker, observer = recording_worker(cluster)
    notified(cluster, b"a", b"b", b"b\x00", b"c")
    counting = CountingStore(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        assert worker._scanner._family_pass() is True
    finally:
        internals(cluster).store = counting._store  # type: ignore[assignment]
    assert observer.rows == [b"b\x00", b"c", b"a", b"b"]
    assert counting.calls["scan"] == 4


def test_a_family_pass_stops_mid_batch_when_its_worker_stops(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker stops while the pass runs its batch's first row (the pass begins at
    the first row: the draw set by the test): the pass ends there, the rest of the
    batch left for a later worker."""
    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        choice=lambda rows: rows[0], randint=lambda lo, hi: lo, shuffle=lambda tables: None))

    class StopsTheWorker(Recording):
        def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
            worker._stop.set()
            super().process(txn, row, column)

    cluster.create_table("log")
    observer = StopsTheWorker()
    worker = Worker(cluster, [observer], threads=1)
    worker.register()
    notified(cluster, b"a", b"b", b"c")
    assert worker._scanner._family_pass()
    assert observer.rows == [b"a"] and worker.stats["committed"] == 1


@pytest.mark.parametrize(("store", "drawn", "meetings", "answer"), [
    ("sqlite", [(32, 48)], 1, False), ("cas-sqlite", [(1, 17)] * 3, 4, True)],
    ids=["sqlite", "cas-sqlite"])
def test_a_family_pass_that_meets_held_rows_skips_what_another_may_hold_and_ends_at_the_fourth(
    store: str, drawn: list[tuple[int, int]], meetings: int, answer: bool,
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ten rows, each held by another scanner (their advisory locks taken). A meeting
    skips a stretch drawn from [held, held + 16 per scanner thread] (the draw set by
    the test: its lower end), where held is what another scanner may hold at once:
    GROUP_MAX (32) rows where runs commit in groups (the embedded store), so one
    meeting passes them all by and the pass found nothing; one where each commits
    alone (``cas-sqlite``), so the pass meets every other row and ends at the fourth
    meeting, a jump (the pass begins at the third row, the draw set by the test: it
    does not go on to the rows before it): it answers True, for its scanner to pass
    again at once."""
    drew: list[tuple[int, int]] = []

    def randint(lo: int, hi: int) -> int:
        drew.append((lo, hi))
        return lo

    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        choice=lambda rows: rows[2], randint=randint, shuffle=lambda tables: None))
    with percolator.connect(make_store_url(store, request, tmp_path)) as held_cluster:
        held_cluster.create_table("docs")
        worker, observer = recording_worker(held_cluster)
        rows = [b"r%d" % i for i in range(10)]
        notified(held_cluster, *rows)
        coordination = internals(held_cluster).coordination
        keys = [f"docs/{row.hex()}" for row in rows]
        assert all(coordination.try_advisory_lock(key) for key in keys)
        try:
            assert worker._scanner._family_pass() is answer
        finally:
            for key in keys:
                coordination.release_advisory_lock(key)
        assert drew == drawn and worker.stats["meetings"] == meetings
        assert observer.rows == []


def test_a_scanner_on_a_store_that_tells_split_keys_begins_at_one_without_sampling(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that tells its split keys (HBase's regions, Bigtable's tablets; the
    embedded store's answer set by the test, ``split_keys`` of the table asked):
    a fresh scanner begins its pass at one (the draw set by the test), reads no sample
    of the table, and wraps around."""
    splits = {"docs": [b"c"]}
    splits_told(monkeypatch, lambda table: splits[table])
    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        random=lambda: 0.0, choice=lambda keys: keys[0], randint=lambda lo, hi: lo,
        shuffle=lambda tables: None))
    worker, observer = recording_worker(cluster)
    notified(cluster, b"a", b"b", b"c", b"d")
    assert worker._scanner._family_pass()
    assert observer.rows == [b"c", b"d", b"a", b"b"]
    assert worker.stats["split_starts"] == 1


def test_a_family_pass_passes_by_a_row_another_scanner_of_its_worker_served_since_its_scan(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker whose scanners pass at once keeps a :class:`Recent` (handed to the
    runner here, as in ``runner_keeping_recent``). While the pass runs a, another
    scanner thread of the worker serves c, which the pass's batch, read before,
    still lists: the pass meets it there (``served_lately``), without a run of it,
    not even one that finds its notification gone (an absent run: a timestamp and a
    read)."""
    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        choice=lambda rows: rows[0], randint=lambda lo, hi: lo, shuffle=lambda tables: None))
    runner: list[Runner] = []

    class ServesCMeanwhile(Recording):
        def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
            if row == b"a":
                assert runner[0].run_cells("docs", b"c", notify_cells(cluster, b"c"))
            super().process(txn, row, column)

    cluster.create_table("log")
    observer = ServesCMeanwhile()
    worker = Worker(cluster, [observer], threads=1)
    worker.register()
    worker._runner._recent = Recent()
    runner.append(worker._runner)
    notified(cluster, b"a", b"b", b"c")
    absent = ("percolator_observer_runs_total", (observer.name, "absent"))
    before = metrics.snapshot()[0].get(absent, 0)
    assert worker._scanner._family_pass()
    assert observer.rows == [b"c", b"a", b"b"]  # c by the other scanner, within a's run
    assert worker.stats["meetings"] == 1
    assert metrics.snapshot()[0].get(absent, 0) == before


def test_a_family_pass_whose_run_finds_no_timestamp_source_ends_with_its_error(
    request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    """On a store whose runs commit alone (``cas-sqlite``), the timestamp source is
    unreachable: the pass's first run fails for it, and the pass ends there with
    that error (its scanner backs off), the row's advisory lock let go."""
    with percolator.connect(make_store_url("cas-sqlite", request, tmp_path)) as cas:
        cas.create_table("docs")
        worker, observer = recording_worker(cas)
        notified(cas, b"a")
        host = internals(cas)
        draws = host.timestamps
        host.timestamps = DrawsFail(draws)  # type: ignore[assignment]
        try:
            with pytest.raises(OracleUnavailable, match="the test's"):
                worker._scanner._family_pass()
        finally:
            host.timestamps = draws
        key = f"docs/{b'a'.hex()}"
        assert host.coordination.try_advisory_lock(key)
        host.coordination.release_advisory_lock(key)
        assert observer.rows == []


def splits_told(monkeypatch: pytest.MonkeyPatch, split_keys: Callable[[str], list[bytes]],
                ) -> None:
    """The embedded store made to tell split keys (HBase's regions, Bigtable's tablets):
    *split_keys* answers the scanner's question."""
    real_offered = observers._scanner.offered

    def offered(store: Any, capability: Any) -> Any:
        if capability == observers._scanner.SPLIT_KEYS:
            return SimpleNamespace(split_keys=split_keys)
        return real_offered(store, capability)

    monkeypatch.setattr(observers._scanner, "offered", offered)


def test_a_pass_begins_at_a_split_key_until_rows_are_seen_then_half_the_time(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing seen yet: a split key, whatever the draw; rows seen: a split key when the
    draw (set by the test) is below one half, else a row seen."""
    splits_told(monkeypatch, lambda table: [b"m"])
    draw = [0.7]
    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        random=lambda: draw[0], choice=lambda seq: seq[-1]))
    worker = Worker(cluster, [_app.Indexer], threads=1)
    scanner = worker._scanner
    assert scanner.random_start("docs") == b"m"
    scanner.remember("docs", b"r")
    assert scanner.random_start("docs") == b"r"
    draw[0] = 0.5
    assert scanner.random_start("docs") == b"r"
    draw[0] = 0.49
    assert scanner.random_start("docs") == b"m"
    assert worker.stats["split_starts"] == 2


def test_a_scanner_asks_the_store_for_split_keys_at_most_once_a_minute(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch, scanner_clock: list[float],
) -> None:
    """The split keys are asked again only more than SPLITS_REFRESH seconds after the
    last question (the module's clock set by the test). Another scanner thread that
    wants them while one asks goes on with what was known, without asking too
    (played by the store's answer, which asks the scanner meanwhile)."""
    asked: list[str] = []
    answers = iter([[b"m"], [b"n"]])
    scanner = Worker(cluster, [_app.Indexer], threads=1)._scanner

    def split_keys(table: str) -> list[bytes]:
        asked.append(table)
        assert scanner._split_keys(table) == ([] if len(asked) == 1 else [b"m"])
        return next(answers)

    splits_told(monkeypatch, split_keys)
    assert scanner._split_keys("docs") == [b"m"]
    scanner_clock[0] += 60.0
    assert scanner._split_keys("docs") == [b"m"] and asked == ["docs"]
    scanner_clock[0] += 0.5
    assert scanner._split_keys("docs") == [b"n"] and asked == ["docs", "docs"]


def test_a_family_pass_holds_the_rows_of_its_groups_waiting_runs_until_their_commit(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs on the embedded store wait in a group of GROUP_MAX (two here) and commit
    together: the advisory lock of a row whose run waits is held until then, that of
    a row whose run failed (it waits for nothing) is let go at once. Each run looks at
    the locks of a, c and d, as another scanner would, and at a's output: b's finds a
    held; c's, after a and b committed, finds a free and its output; e's finds c held
    (waiting in the next group) and d, which failed, free."""
    monkeypatch.setattr(observers._scanner, "GROUP_MAX", 2)
    monkeypatch.setattr(observers._scanner, "random", SimpleNamespace(
        choice=lambda rows: rows[0], randint=lambda lo, hi: lo, shuffle=lambda tables: None))
    coordination = internals(cluster).coordination
    seen: dict[bytes, tuple[bool, bool, bool, bytes | None]] = {}

    def free(row: bytes) -> bool:
        key = f"docs/{row.hex()}"
        if not coordination.try_advisory_lock(key):
            return False
        coordination.release_advisory_lock(key)
        return True

    class Looks(Recording):
        def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
            if row == b"d":
                raise ValueError("d fails")
            seen[row] = (free(b"a"), free(b"c"), free(b"d"),
                         Snapshot(cluster).get("docs", b"a", "out:seen"))
            super().process(txn, row, column)

    cluster.create_table("log")
    observer = Looks()
    worker = Worker(cluster, [observer], threads=1)
    worker.register()
    notified(cluster, b"a", b"b", b"c", b"d", b"e")
    assert worker._scanner._family_pass()
    assert seen[b"b"] == (False, True, True, None)
    assert seen[b"c"] == (True, False, True, b"a")
    assert seen[b"e"] == (True, False, True, b"a")
    assert worker.stats["committed"] == 4 and worker.stats["failures"] == 1


def test_a_family_pass_runs_its_workers_columns_only(cluster: percolator.Cluster) -> None:
    """A row notified on a column another worker observes is left to it, its
    notification in place, as is the one the run on the other row made (fails if the
    pass reads every notify column: this worker has no observer of it)."""
    Worker(cluster, [_app.Stage2]).register()  # another worker's column: out:seen
    worker, observer = recording_worker(cluster)
    notified(cluster, b"a")
    notified(cluster, b"b", column="out:seen")
    assert worker._scanner._family_pass()
    assert observer.rows == [b"a"]
    pending = internals(cluster).store.read_rows(
        "docs", [b"a", b"b"], [Read(NOTIFY, None, versions=None)])
    assert {row: set(cells) for row, cells in pending.items()} == {
        b"a": {f"{NOTIFY}:out:seen"}, b"b": {f"{NOTIFY}:out:seen"}}


def test_observer_commits_share_a_store_write_on_a_one_phase_store_in_groups_of_two_or_more(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner = Worker(cluster, [_app.Indexer], threads=1)._runner
    assert runner.commits_in_groups() is True
    monkeypatch.setattr(observers._runner, "GROUP_MAX", 2)
    assert runner.commits_in_groups() is True
    monkeypatch.setattr(observers._runner, "GROUP_MAX", 1)
    assert runner.commits_in_groups() is False


def test_a_family_pass_on_a_two_phase_store_commits_each_run_alone(
    request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    """The embedded store taking HBase's path (``cas-sqlite``: no atomic step to share)
    gathers no group: each run commits in two phases as it ends."""
    with percolator.connect(make_store_url("cas-sqlite", request, tmp_path)) as cas:
        cas.create_table("docs")
        worker, observer = recording_worker(cas)
        assert worker._runner.commits_in_groups() is False
        notified(cas, b"a", b"b")
        assert worker._scanner._family_pass()
        assert sorted(observer.rows) == [b"a", b"b"] and worker.stats["committed"] == 2
        assert Snapshot(cas).get("docs", b"a", "out:seen") == b"a"


# --- the lookout's look, on the notify family (no index) ---------------------------------


def test_the_lookout_looks_only_while_a_scanner_sleeps(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Busy scanners need no lookout (their passes find the work): a lookout whose
    scanners all work reads nothing, poll after poll; once one sleeps, it looks."""
    worker = Worker(cluster, [_app.Indexer], threads=1, poll_interval=0.001)
    scanner = worker._scanner
    polls = threading.Semaphore(0)
    looks: list[frozenset[tuple[str, bytes, str, int]]] = []

    def looked(seen: frozenset[tuple[str, bytes, str, int]]) -> frozenset[
            tuple[str, bytes, str, int]]:
        looks.append(seen)
        return seen

    monkeypatch.setattr(scanner, "settle_deferred", lambda force=False: polls.release())
    monkeypatch.setattr(scanner, "look", looked)
    lookout = threading.Thread(target=scanner.lookout_thread, daemon=True)
    lookout.start()
    try:
        for _ in range(3):
            assert polls.acquire(timeout=60)
        assert looks == []
        with scanner._sleeping_lock:
            scanner._sleeping += 1  # as a scanner thread going to sleep does
        for _ in range(3):
            assert polls.acquire(timeout=60)
        assert looks
    finally:
        scanner._stop.set()
        lookout.join(60)
    assert not lookout.is_alive()


def test_a_look_hands_over_rows_of_observed_columns_and_again_once_notified_again(
    cluster: percolator.Cluster,
) -> None:
    """A look reads the notifications of its worker's observed columns only (a row
    notified on a column another worker observes is not handed over); a row it
    handed is handed again by a later look once notified again (a newer notify
    version), not while its notification is as the look saw it."""
    Worker(cluster, [_app.Stage2]).register()  # another worker's column: out:seen
    worker = Worker(cluster, [_app.Indexer], threads=1)
    worker.register()
    scanner = worker._scanner
    with Transaction(cluster) as txn:
        txn.set("docs", b"v", "raw:v", b"1")
        txn.set("docs", b"w", "out:seen", b"1")
    seen = scanner.look(frozenset())
    handed = scanner.bell.take()
    assert handed is not None and handed[:2] == ("docs", b"v")
    assert scanner.bell.take() is None
    assert scanner.look(seen) == seen and scanner.bell.take() is None  # nothing new
    with Transaction(cluster) as txn:
        txn.set("docs", b"v", "raw:v", b"2")
    scanner.look(seen)
    again = scanner.bell.take()
    assert again is not None and again[:2] == ("docs", b"v")
    assert again[2]["raw:v"] > handed[2]["raw:v"]  # the newer notification's timestamp
    assert worker.stats["wakeups"] == 2


def test_a_look_hands_over_up_to_handoff_max_new_rows_and_rings_for_more(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HANDOFF_MAX (two here) new rows are handed over, one scanner each; more wake
    every scanner for passes of their own (a ring), and none is handed over."""
    monkeypatch.setattr(observers._scanner, "HANDOFF_MAX", 2)
    worker = Worker(cluster, [_app.Indexer], threads=1)
    worker.register()
    scanner = worker._scanner
    rung = scanner.bell.rung
    with Transaction(cluster) as txn:
        for row in (b"a", b"b"):
            txn.set("docs", row, "raw:v", row)
    seen = scanner.look(frozenset())
    assert [scanner.bell.take() is not None for _ in range(3)] == [True, True, False]
    assert scanner.bell.rung == rung
    with Transaction(cluster) as txn:
        for row in (b"c", b"d", b"e"):
            txn.set("docs", row, "raw:v", row)
    scanner.look(seen)
    assert scanner.bell.take() is None and scanner.bell.rung == rung + 1


# --- Waits: when a run lets go of the store turn -------------------------------------------


def test_waits_averages_what_runs_wait_beyond_their_cpu_time() -> None:
    """Each measured run moves the mean a quarter of the way to what it waited (wall
    time beyond its thread's CPU time, never below 0)."""
    waits = Waits()
    waits.measured(0.004, 0.0)
    assert waits.mean == pytest.approx(0.001)
    waits.measured(0.005, 0.001)  # waited 0.004 again
    assert waits.mean == pytest.approx(0.00175)
    waits.measured(0.001, 0.002)  # more CPU than wall: waited nothing
    assert waits.mean == pytest.approx(0.00175 * 0.75)


def test_runs_of_an_observer_that_waits_let_go_of_the_turn_but_every_probeth() -> None:
    """While the mean wait is WAITING or more (exactly WAITING here), a run lets go of
    the store turn, but every PROBE-th run keeps it, to measure again; below it, no
    run lets go."""
    waits = Waits()
    assert [waits.release() for _ in range(3)] == [False] * 3
    waits = Waits()
    waits.measured(4 * Waits.WAITING, 0.0)
    assert waits.mean == Waits.WAITING
    released = [waits.release() for _ in range(2 * Waits.PROBE)]
    assert released == [(i + 1) % Waits.PROBE != 0 for i in range(2 * Waits.PROBE)]


# --- StoreTurn: the turn at the store work --------------------------------------------------


def _until(condition: Callable[[], bool]) -> None:
    """Wait for *condition*, which another thread makes true (a deadline, not a
    measure: it fails only if that never happens)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.001)


class _WaitsNoted(threading.Condition):
    """A condition noting who waited on it, and how long at most."""

    def __init__(self, lock: Any) -> None:
        super().__init__(lock)
        self.waits: list[tuple[int, float | None]] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append((threading.get_ident(), timeout))
        return super().wait(timeout)


def test_a_waiting_scanner_watches_the_holders_observer_code_and_is_lent_the_turn_when_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test's thread holds the turn and runs observer code that keeps it; scanner B
    waits for the turn and becomes the watcher (it looks every LEND_AFTER whether that
    code is slow). While the code has run less than LEND_AFTER (the module's clock set by
    the test), B waits; once it has run LEND_AFTER, B is lent the turn, and is no longer
    the watcher (another waiter may become it)."""
    now = [100.0]
    monkeypatch.setattr(_store_turn, "time", SimpleNamespace(
        monotonic=lambda: now[0], perf_counter=time.perf_counter, thread_time=time.thread_time))
    monkeypatch.setattr(StoreTurn, "LEND_AFTER", 1 / 64)  # exact in binary: now - since too
    turn, stop, stop_b = StoreTurn(), threading.Event(), threading.Event()
    turn._cond = _WaitsNoted(threading.Lock())
    told: list[tuple[bool, bool, int | None]] = []

    def b() -> None:
        got = turn.take(stop_b)
        told.append((got, turn._holder == threading.get_ident(), turn._watcher))
        turn.give()

    assert turn.take(stop)
    try:
        with turn.observer_code(Waits(), stop):  # quick so far: keeps the turn
            waiter = threading.Thread(target=b, daemon=True)
            waiter.start()
            _until(lambda: turn._watcher == waiter.ident)
            assert turn._holder == threading.get_ident() and not told
            now[0] += StoreTurn.LEND_AFTER  # the observer code has now run LEND_AFTER
            waiter.join(30)
            assert told == [(True, True, None)]
    finally:
        stop_b.set()
    # The watcher looked every LEND_AFTER (the others would sleep up to a second).
    assert {timeout for who, timeout in turn._cond.waits if who == waiter.ident} == {
        StoreTurn.LEND_AFTER}
    assert turn._holder == threading.get_ident()  # taken back after the observer code
    turn.give()


def test_a_watcher_that_stops_gives_up_waiting_and_watching() -> None:
    """Scanner B waits for the turn the test's thread holds, as the watcher, and C
    after it, sleeping a second at a time (to see its stop); their worker stops: each
    take answers False, without the turn, and B is no longer the watcher."""
    turn, stop, stop_b = StoreTurn(), threading.Event(), threading.Event()
    turn._cond = _WaitsNoted(threading.Lock())
    told: list[bool] = []
    assert turn.take(stop)
    waiter = threading.Thread(target=lambda: told.append(turn.take(stop_b)), daemon=True)
    other = threading.Thread(target=lambda: told.append(turn.take(stop_b)), daemon=True)
    waiter.start()
    try:
        _until(lambda: turn._watcher == waiter.ident)
        other.start()
        _until(lambda: any(who == other.ident for who, _ in turn._cond.waits))
        stop_b.set()
        waiter.join(30)
        other.join(30)
    finally:
        stop_b.set()
    assert {timeout for who, timeout in turn._cond.waits if who == other.ident} == {1.0}
    assert told == [False, False]
    assert turn._holder == threading.get_ident() and turn._watcher is None
    turn.give()
