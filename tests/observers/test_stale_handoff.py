"""A scan pass hands the runner what it read of a row (the notify cells on the embedded
store and HBase, the notification index's entries on Bigtable); by the time the row's
run starts that may be stale. Each race is played with the pass as an actor parked
right after its scan read the row (``percolator.testing.Interleaving``: before its
run draws a start timestamp), while the test serves the row as another worker would
or commits a newer change: the family pass on SQLite (group commits, the notification
deleted in the commit's atomic step) and on HBase (two-phase commits, the worker's
deletion a delete marker at the served version, for the two races where those
differ), the index pass on Bigtable.

What must hold: a change, or a weak notification, is run once, however stale the
hand-off, and a run deletes no notification it did not serve. Which change a run saw,
the one its acknowledgement records and is compared with
(``ObserverRun.change_version``), is checked here too: past a rolled-back writer's
ROLLBACK record, and for a cell never written."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

import percolator
from observers import Observer, Worker
from percolator import Cluster, StoreUnavailable, Transaction
from percolator._notifications import NOTIFY_STRONG
from percolator.ext import (
    LOCK,
    NOTIFY,
    Mutation,
    ObserverRun,
    Read,
    ack_column,
    internal_columns,
    internals,
    pending_notifications,
)
from percolator.testing import Actor, CrashPoint, Interleaving, client_of, crash_commit
from tests._backends import SQLITE, SQLITE_AND_BIGTABLE

T, COL = "docs", "raw:v"
ROW = b"r"


@pytest.fixture
def cluster_tables() -> tuple[str, ...]:
    return (T,)


class Recorder(Observer):
    """Records what each run of it saw of the cell."""

    table, column = T, COL
    seen: ClassVar[list[bytes | None]] = []

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        self.seen.append(txn.get(T, row, column))
        txn.set(T, row, "out:v", txn.get(T, row, column) or b"-")


def _workers(cluster: Cluster) -> tuple[Worker, Worker]:
    """Two workers of the observer: the one whose pass goes stale, and another."""
    Recorder.seen = []
    mine, other = Worker(cluster, [Recorder()], threads=1), Worker(cluster, [Recorder()])
    mine.register()
    return mine, other


def _parked_after_its_scan(world: Interleaving, worker: Worker) -> Actor[bool]:
    """A pass of *worker*, parked once its scan read the row: its run draws its start
    timestamp next."""
    scan = world.actor("pass", worker._scanner.scan_pass)
    scan.run_until(lambda s: s.matches("timestamp"))
    return scan


def _pending(cluster: Cluster) -> list[tuple[bytes, int]]:
    return [(p.row, len(p.timestamps)) for p in pending_notifications(cluster, [T])]


@pytest.mark.parametrize("backend", SQLITE_AND_BIGTABLE)  # HBase adds nothing here
def test_a_change_served_by_another_worker_after_the_scan_is_not_run_again(
    cluster: Cluster,
) -> None:
    """Another worker runs the change, acknowledges it and deletes its notification
    between the pass's scan and its run: the run finds the change acknowledged and
    does not call the observer again."""
    mine, other = _workers(cluster)
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"v1")
    with Interleaving(cluster) as world:
        scan = _parked_after_its_scan(world, mine)
        assert other._scanner.serve_row(T, ROW)  # not an actor: runs at once
        assert Recorder.seen == [b"v1"]
        scan.finish()
    assert Recorder.seen == [b"v1"]
    assert _pending(cluster) == []


def test_a_weak_notification_served_by_another_worker_after_the_scan_is_not_run_again(
    cluster: Cluster,
) -> None:
    """The same with a weak notification, which a run serves without looking at the
    acknowledgement: the run must learn that it was served from its own read, not
    from the scan's.

    Catches the run that takes its notification from the cells the scan handed over
    (issue 49's runner, ``Runner.run_cells``): it calls the observer a second time."""
    mine, other = _workers(cluster)
    with Transaction(cluster) as txn:
        txn.notify(T, ROW, COL)
    with Interleaving(cluster) as world:
        scan = _parked_after_its_scan(world, mine)
        assert other._scanner.serve_row(T, ROW)
        assert Recorder.seen == [None]
        scan.finish()
    assert Recorder.seen == [None]
    assert _pending(cluster) == []


@pytest.mark.parametrize("backend", SQLITE_AND_BIGTABLE)
def test_a_change_committed_after_the_scan_is_run_once(cluster: Cluster) -> None:
    """A newer change commits between the pass's scan and its run: the run's snapshot
    holds it, so the run observes the newer value, and no later run observes it again
    (the notification it left, if any, finds it acknowledged)."""
    mine, _ = _workers(cluster)
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"old")
    with Interleaving(cluster) as world:
        scan = _parked_after_its_scan(world, mine)
        with Transaction(cluster) as txn:
            txn.set(T, ROW, COL, b"new")
        scan.finish()
    assert Recorder.seen == [b"new"]
    mine._scanner.serve_row(T, ROW)
    assert Recorder.seen == [b"new"]
    assert _pending(cluster) == []


@pytest.mark.parametrize("backend", [SQLITE])  # the notify cell is written by hand
def test_a_notification_met_again_past_a_rolled_back_write_finds_its_change_acknowledged(
    cluster: Cluster,
) -> None:
    """A change is run and acknowledged; a writer of the cell then dies after its
    prewrite and is rolled back (a ROLLBACK record, above the change, at its start
    timestamp); the change's notification is met again (as a worker that died before
    deleting it leaves it). The run looks past the ROLLBACK record to the change's
    commit and finds it acknowledged: the observer is not run again."""
    mine, _ = _workers(cluster)
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"v1")
    assert txn.commit_ts is not None
    assert mine._scanner.serve_row(T, ROW)
    assert Recorder.seen == [b"v1"]
    dying = Transaction(client_of(cluster))
    dying.set(T, ROW, COL, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert Transaction(cluster).get(T, ROW, COL) == b"v1"  # rolled back by the reader
    internals(cluster).store.mutate_rows(
        T, [Mutation(ROW, [(f"{NOTIFY}:{COL}", txn.commit_ts, NOTIFY_STRONG)])])
    mine._scanner.serve_row(T, ROW)
    assert Recorder.seen == [b"v1"]


@pytest.mark.parametrize("backend", [SQLITE])  # the runner's acknowledgement, on every backend
def test_a_weak_notification_of_a_cell_never_written_acknowledges_no_change(
    cluster: Cluster,
) -> None:
    """A weak notification of a cell never written runs its observer (which sees
    nothing) and acknowledges the commit timestamp of the change the run saw: none,
    0."""
    mine, _ = _workers(cluster)
    with Transaction(cluster) as txn:
        txn.notify(T, ROW, COL)
    assert mine._scanner.serve_row(T, ROW)
    assert Recorder.seen == [None]
    acknowledged = Transaction(cluster)
    internal_columns(acknowledged, True)
    assert acknowledged.get(T, ROW, ack_column(Recorder.name, COL)) == b"0"
    assert _pending(cluster) == []


@pytest.mark.parametrize("backend", [SQLITE])  # ObserverRun's own bookkeeping
def test_a_runs_change_version_is_its_snapshots_newest_commit_past_a_rollback(
    cluster: Cluster,
) -> None:
    """What a run tells its worker of the change it saw: the commit timestamp of the
    newest write at or below its start, looking past a ROLLBACK record (a writer that
    died after its prewrite) but not at a commit after its start; 0 for a cell never
    written."""
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"v1")
    dying = Transaction(client_of(cluster))
    dying.set(T, ROW, COL, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert Transaction(cluster).get(T, ROW, COL) == b"v1"  # rolled back by the reader
    run = ObserverRun(cluster)
    with Transaction(cluster) as later:
        later.set(T, ROW, COL, b"v2")
    assert run.get_row(T, ROW, [COL, "raw:never"]) == {COL: b"v1"}
    assert run.change_version(T, ROW, COL) == txn.commit_ts
    assert run.change_version(T, ROW, "raw:never") == 0
    run.close()


@pytest.mark.parametrize("backend", [SQLITE])  # ObserverRun's own bookkeeping
def test_a_runs_change_version_is_0_once_the_rollback_record_it_saw_is_collected(
    store_url: str,
) -> None:
    """A cell whose only record is a ROLLBACK (its one writer died after its prewrite
    and was rolled back): a run reads it, then a garbage-collection pass removes that
    record (below the run's start, no PUT to keep). Looking past it, the run finds no
    record at all: its change version is 0, as for a cell never written."""
    # A short safe-point refresh: the pass waits twice the largest of a live client's.
    with percolator.connect(store_url, safe_point_refresh=0.01) as cluster:
        cluster.create_table(T)
        dying = Transaction(client_of(cluster))
        dying.set(T, ROW, COL, b"never")
        assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
        assert Transaction(cluster).get(T, ROW, COL) is None  # rolled back by the reader
        run = ObserverRun(cluster)
        assert run.get_row(T, ROW, [COL]) == {}
        cluster.gc(retention=0)
        assert run.change_version(T, ROW, COL) == 0
        run.close()


@pytest.mark.parametrize("backend", [SQLITE])  # ObserverRun's own bookkeeping
def test_a_runs_reads_before_and_after_its_notified_read_are_plain_reads(
    cluster: Cluster,
) -> None:
    """A run's first read of the notified row brings the notify versions with the
    columns asked (``get_row_notified``); its reads before and after it, of another
    row, bring the columns asked and nothing else: a lock that a dead writer left on
    another column of that row is not even met (neither waited on nor resolved)."""
    _workers(cluster)  # the column observed: its commits write notifications
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"v")
        txn.set(T, b"r2", COL, b"x")
        txn.set(T, b"r2", "raw:w", b"w")
    dying = Transaction(client_of(cluster))
    dying.set(T, b"r2", "raw:d", b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False

    def held() -> bytes:
        return internals(cluster).store.read_rows(
            T, [b"r2"], [Read(LOCK, ("raw:d",))])[b"r2"][f"{LOCK}:raw:d"][0][1]

    lock = held()
    run = ObserverRun(cluster)
    assert run.get_row(T, b"r2", ["raw:w"]) == {"raw:w": b"w"}
    values, versions = run.get_row_notified(T, ROW, [COL], COL)
    assert values == {COL: b"v"}
    assert [ts for ts, _ in versions] == [txn.commit_ts]
    assert run.get_row(T, b"r2", [COL]) == {COL: b"x"}
    run.close()
    assert held() == lock


def test_a_change_committed_after_the_runs_start_keeps_its_notification(
    cluster: Cluster,
) -> None:
    """A newer change commits after the run drew its start timestamp: the run observes
    the older value and deletes only the notification it served; the newer one stays,
    and the next run observes the newer value.

    Catches a deletion of every notify version of the cell (or of the versions up to
    the run's start timestamp rather than up to the newest one it served): the newer
    change would never be observed."""
    mine, _ = _workers(cluster)
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"old")
    with Interleaving(cluster) as world:
        scan = _parked_after_its_scan(world, mine)
        scan.step()  # drew its start timestamp
        with Transaction(cluster) as txn:
            txn.set(T, ROW, COL, b"new")
        scan.finish()
    assert Recorder.seen == [b"old"]
    assert _pending(cluster) == [(ROW, 1)]
    assert mine._scanner.serve_row(T, ROW)
    assert Recorder.seen == [b"old", b"new"]
    assert _pending(cluster) == []


def test_a_pass_ends_at_the_first_run_the_store_fails(tmp_path: Path) -> None:
    """The store goes away between the pass's scan and its runs (here the embedded
    store is closed under the pass; in tests/hbase/test_hbase_real_faults.py HBase is
    killed): the first run fails with StoreUnavailable, counted as no failure of the
    observer, and the pass ends there, raising it, for the scanner to back off. The
    rest of the scan's batch is left to a later pass: on a dead HBase behind a live
    Thrift server each of its runs would wait the store's deadline (two socket
    timeouts) to fail the same way. Once the store is back, each change is run once.

    Catches the runner that swallows the error and goes on to the next row of the
    batch (issue 49's runner): the pass runs all three rows."""
    url = f"sqlite:///{tmp_path}/repo.db"
    rows = [b"a", b"b", b"c"]
    with percolator.connect(url) as cluster:
        cluster.create_table(T)
        mine, _ = _workers(cluster)
        with Transaction(cluster) as txn:
            for row in rows:
                txn.set(T, row, COL, row)
        with Interleaving(cluster) as world:
            scan = _parked_after_its_scan(world, mine)
            internals(cluster).store.close()  # the store goes away
            with pytest.raises(StoreUnavailable):
                scan.finish()
        assert [s.op for s in scan.steps].count("timestamp") == 1  # one run, not three
        assert Recorder.seen == []
    with percolator.connect(url) as cluster:  # the store is back
        again, _ = _workers(cluster)
        while again._scanner.scan_pass():
            pass
        assert sorted(Recorder.seen) == rows  # type: ignore[type-var]
        assert _pending(cluster) == []
        assert again.stats["failures"] == 0
