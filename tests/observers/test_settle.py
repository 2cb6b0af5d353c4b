"""An observer run's commit deletes the notification it served in the same atomic step
where the store commits in one phase (the embedded store): one write transaction per
notification instead of two. Where the commit is two-phase, the worker deletes it
afterwards, as before; with two observers on a column, only after both have run."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import Observer, Worker, _runner, wait_for_observers
from percolator import StoreUnavailable, TransactionBase, metrics
from percolator._internals import internals
from percolator._notifications import pending_notifications
from percolator._notify_index import INDEX_TABLE
from percolator._store import NOTIFY_INDEX, Mutation
from percolator.stores.sqlite import SqliteStore
from percolator.testing import CrashPoint, Interleaving, client_of, crash_commit


class Copy(Observer):
    table, column = "t", "in:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, "out:v", txn.get(self.table, row, column) or b"")


class Count(Observer):
    table, column = "t", "in:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, "out:n", b"1")


class NotifyWrites:
    """The cluster's store, counting writes to the notify family made outside an atomic
    step (the worker's own deletions)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.outside = 0
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def mutate_rows(self, table: str, mutations: Sequence[Mutation]) -> None:
        if table != INDEX_TABLE and not getattr(self._store._local, "atomic", False) and any(
                column.startswith("n:") for m in mutations for column, _ in m.deletes):
            with self.lock:
                self.outside += 1
        self._store.mutate_rows(table, mutations)


def _run(tmp_path: Path, observers: list[type[Observer]], one_phase: bool) -> tuple[
        int, dict[bytes, dict[str, bytes]]]:
    with percolator.connect(f"sqlite://{tmp_path}/db") as cluster:
        cluster.create_table("t")
        cluster.observe("t", "in:v")
        cluster.one_phase_commit = one_phase
        with percolator.Transaction(cluster) as txn:
            for i in range(40):
                txn.set("t", b"r%02d" % i, "in:v", b"v%d" % i)
        counting = NotifyWrites(internals(cluster).store)
        internals(cluster).store = counting  # type: ignore[assignment]
        with Worker(cluster, observers, threads=2):
            wait_for_observers(cluster, 60)
        internals(cluster).store = counting._store
        assert not list(pending_notifications(cluster))
        rows = dict(percolator.Transaction(cluster).scan("t"))
    return counting.outside, rows


def test_a_one_phase_observer_commit_deletes_its_notification(tmp_path: Path) -> None:
    outside, rows = _run(tmp_path, [Copy], one_phase=True)
    assert outside == 0
    assert {r: v["out:v"] for r, v in rows.items()} == {b"r%02d" % i: b"v%d" % i
                                                        for i in range(40)}


def test_a_one_phase_observer_commit_deletes_its_notification_found_through_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The embedded store declaring the notification index (as Bigtable does): the
    scanners find the rows through it and each run reads its own notification
    (``Runner.run_noticed``); its one-phase commit deletes the notification too (fails
    if the worker deletes it afterwards: a write transaction more per notification)."""
    monkeypatch.setattr(SqliteStore, "capabilities", SqliteStore.capabilities | {NOTIFY_INDEX})
    outside, rows = _run(tmp_path, [Copy], one_phase=True)
    assert outside == 0
    assert {r: v["out:v"] for r, v in rows.items()} == {b"r%02d" % i: b"v%d" % i
                                                        for i in range(40)}


def test_an_observer_commit_of_its_own_deletes_its_notification(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs committed one by one (no groups): each through the flat one-phase commit
    of ``commit_transaction``, which must serve the notification in its atomic step
    as the group commit does (``_settles_mutation`` in ``_commit_one_phase``)."""
    monkeypatch.setattr(_runner, "GROUP_MAX", 1)  # read by Runner.commits_in_groups at each pass
    outside, rows = _run(tmp_path, [Copy], one_phase=True)
    assert outside == 0
    assert {r: v["out:v"] for r, v in rows.items()} == {b"r%02d" % i: b"v%d" % i
                                                        for i in range(40)}


def test_a_two_phase_observer_commit_leaves_the_deletion_to_the_worker(
        tmp_path: Path) -> None:
    outside, rows = _run(tmp_path, [Copy], one_phase=False)
    assert outside >= 40
    assert all(v["out:v"] == v["in:v"] for v in rows.values()) and len(rows) == 40


def test_two_observers_of_a_column_both_run_before_the_deletion(tmp_path: Path) -> None:
    outside, rows = _run(tmp_path, [Copy, Count], one_phase=True)
    assert outside >= 40  # neither commit may delete what the other has yet to serve
    assert all(v.get("out:v") == v["in:v"] and v.get("out:n") == b"1"
               for v in rows.values()) and len(rows) == 40


def test_a_scanner_commits_its_runs_in_groups(tmp_path: Path) -> None:
    """On the embedded store a scanner commits up to GROUP_MAX observer runs in one
    write transaction (``commit_group``), each run still exactly once."""
    from observers._runner import GROUP_MAX

    steps = [0]
    with percolator.connect(f"sqlite://{tmp_path}/db") as cluster:
        cluster.create_table("t")
        cluster.observe("t", "in:v")
        with percolator.Transaction(cluster) as txn:
            for i in range(200):
                txn.set("t", b"r%03d" % i, "in:v", b"v%d" % i)
        store = internals(cluster).store
        atomically = store.atomically

        def counted() -> Any:
            steps[0] += 1
            return atomically()

        store.atomically = counted  # type: ignore[method-assign]
        commits: list[bytes] = []
        with Worker(cluster, [Copy], threads=1,
                    on_commit=lambda o, t, row, c, ch, ts: commits.append(row)):
            wait_for_observers(cluster, 60)
        del store.atomically
        rows = dict(percolator.Transaction(cluster).scan("t"))
    assert sorted(commits) == sorted(rows) and len(commits) == 200  # each once
    assert all(v["out:v"] == v["in:v"] for v in rows.values())
    assert steps[0] <= 200 // GROUP_MAX * 3, steps  # groups, not one write per run


class Held(Observer):
    """Copies in:v to out:v; its first run waits inside ``process`` until let go."""

    table, column = "t", "in:v"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()
        self.runs = 0

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        self.runs += 1
        value = txn.get(self.table, row, column) or b""
        if self.runs == 1:
            self.entered.set()
            assert self.go.wait(30)
        txn.set(self.table, row, "out:v", value)


def test_a_change_made_during_a_run_outlives_the_runs_deletion(tmp_path: Path) -> None:
    """The run's commit deletes notify versions only up to the one it read: a change
    committed while the run is parked inside the observer (a newer notification) is
    still pending afterwards, and a second run copies it."""
    with percolator.connect(f"sqlite://{tmp_path}/db") as cluster:
        cluster.create_table("t")
        cluster.observe("t", "in:v")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"r", "in:v", b"first")
        held = Held()
        with Worker(cluster, [held], threads=1):
            assert held.entered.wait(30)
            with percolator.Transaction(cluster) as txn:  # while the run is parked
                txn.set("t", b"r", "in:v", b"second")
            held.go.set()
            wait_for_observers(cluster, 60)
        assert percolator.Transaction(cluster).get("t", b"r", "out:v") == b"second"
        assert held.runs == 2


def _two_observed_rows(cluster: percolator.Cluster) -> int:
    """Table t, its column in:v observed, written in rows r1 and r2: the commit's
    timestamp (the change the runs see)."""
    cluster.create_table("t")
    cluster.observe("t", "in:v")
    with percolator.Transaction(cluster) as txn:
        for row in (b"r1", b"r2"):
            txn.set("t", row, "in:v", row)
    assert txn.commit_ts is not None
    return txn.commit_ts


def _copy_runs(outcome: str) -> float:
    """``percolator_observer_runs_total`` of the Copy observer's runs ended *outcome*."""
    return float(metrics.snapshot()[0].get(
        ("percolator_observer_runs_total", ("Copy", outcome)), 0))


def test_a_group_commit_counts_each_run_by_its_observer_and_outcome(tmp_path: Path) -> None:
    """A scanner's pass runs two rows and commits them as one group; a commit of
    another client to the cell the first run writes lands between the runs and the
    group's commit: that run conflicts (its notification stays for a later pass),
    the other commits. Each is counted by its outcome, in the worker's stats and in
    ``percolator_observer_runs_total`` under its observer's name."""
    with percolator.connect(f"sqlite://{tmp_path}/db") as cluster:
        changed = _two_observed_rows(cluster)
        told: list[tuple[object, ...]] = []
        worker = Worker(cluster, [Copy], threads=1,
                        on_commit=lambda *args: told.append(args))
        assert worker._runner.commits_in_groups()
        committed, conflicts = _copy_runs("committed"), _copy_runs("conflict")
        with Interleaving(cluster) as world:
            scanner = world.actor("scanner", worker._scanner.scan_pass)
            scanner.run_until(lambda s: s.op == "atomic")  # the group's commit
            with percolator.Transaction(cluster) as txn:  # not an actor: commits at once
                txn.set("t", b"r1", "out:v", b"other")
            scanner.finish()
        assert (worker.stats["committed"], worker.stats["conflicts"]) == (1, 1)
        assert (_copy_runs("committed"), _copy_runs("conflict")) == (committed + 1, conflicts + 1)
        assert [p.row for p in pending_notifications(cluster)] == [b"r1"]
        # The on_commit hook is told of the committed run: observer, cell, change, commit.
        [(observer, table, row, column, change, commit_ts)] = told
        assert (observer, table, row, column, change) == (
            worker.observers[0], "t", b"r2", "in:v", changed)
        assert isinstance(commit_ts, int) and commit_ts > changed


class WritesFail:
    """The cluster's store, whose writes to a data table fail (StoreUnavailable)
    while ``failing`` is set."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.failing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def mutate_rows(self, table: str, mutations: Sequence[Mutation]) -> None:
        if self.failing and not table.startswith("_"):
            raise StoreUnavailable(f"writes to {table} fail (the test's)")
        self._store.mutate_rows(table, mutations)


def test_a_group_commit_the_store_fails_counts_each_run_transient(tmp_path: Path) -> None:
    """The store fails the write of a scanner's group commit: none of the group
    committed, each run is counted ``transient`` under its observer's name (not a
    conflict, nor a failure of the observer), and their notifications stay for the
    next pass, which serves them."""
    with percolator.connect(f"sqlite://{tmp_path}/db") as cluster:
        _two_observed_rows(cluster)
        worker = Worker(cluster, [Copy], threads=1)
        assert worker._runner.commits_in_groups()
        transient, conflicts = _copy_runs("transient"), _copy_runs("conflict")
        failing = WritesFail(internals(cluster).store)
        internals(cluster).store = failing  # type: ignore[assignment]
        try:
            failing.failing = True
            worker._scanner.scan_pass()
            failing.failing = False
        finally:
            internals(cluster).store = failing._store
        assert (_copy_runs("transient"), _copy_runs("conflict")) == (transient + 2, conflicts)
        assert worker.stats["committed"] == worker.stats["conflicts"] == 0
        assert worker.stats["failures"] == 0
        assert sorted(p.row for p in pending_notifications(cluster)) == [b"r1", b"r2"]
        assert worker._scanner.scan_pass()
        assert worker.stats["committed"] == 2
        assert list(pending_notifications(cluster)) == []


def test_a_group_member_that_meets_a_lock_commits_alone_and_its_notification_is_deleted(
    tmp_path: Path,
) -> None:
    """Between a pass's runs and its group's commit, a client that then dies leaves a
    lock on the cell the run writes: the run is committed on its own afterwards, in two
    phases (the lock of the dead owner rolled back), whose commit does not delete the
    notification: the worker deletes it (fails if it leaves it or deletes another)."""
    with percolator.connect(f"sqlite://{tmp_path}/db") as cluster:
        cluster.create_table("t")
        cluster.observe("t", "in:v")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"r", "in:v", b"v")
        worker = Worker(cluster, [Copy], threads=1)
        with Interleaving(cluster) as world:
            scanner = world.actor("scanner", worker._scanner.scan_pass)
            scanner.run_until(lambda s: s.op == "atomic")  # the group's commit
            dying = percolator.Transaction(client_of(cluster))
            dying.set("t", b"r", "out:v", b"dying")
            assert crash_commit(dying, CrashPoint("prewrite")) is False
            counting = NotifyWrites(internals(cluster).store)
            internals(cluster).store = counting  # type: ignore[assignment]
            try:
                assert scanner.finish()
            finally:
                internals(cluster).store = counting._store
        assert worker.stats["committed"] == 1 and counting.outside == 1
        assert list(pending_notifications(cluster)) == []
        with percolator.Snapshot(cluster) as snap:
            assert snap.get("t", b"r", "out:v") == b"v"
