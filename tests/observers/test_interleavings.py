"""Races between a worker and committers, played out step by step on every backend
(``percolator.testing.Interleaving``)."""

from __future__ import annotations

from typing import ClassVar

import percolator
from observers import Observer, Worker
from percolator import Cluster, Transaction
from percolator.testing import Interleaving, client_of

T, COL = "docs", "raw:v"
PRIMARY, ROW = b"p", b"s"


class Recorder(Observer):
    table, column = T, COL
    seen: ClassVar[list[bytes | None]] = []

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        if row == ROW:
            self.seen.append(txn.get(T, row, column))


def test_a_change_rolled_forward_during_a_weak_run_is_still_observed(cluster: Cluster) -> None:
    """T1 writes p and s (observed) and pauses before drawing its commit timestamp; a
    weak notification of s commits; a worker picks s up and starts its observer
    transaction; T1 then commits and dies before releasing s; the worker's read rolls
    s forward (T1's change is newer than its snapshot, so the run sees the old value)
    and, done, deletes s's notify versions up to the weak one it processed.

    Guards the notify cell of a rolled-forward change at the *commit* timestamp
    (``write_cells``, used by ``release`` in lock resolution): at T1's start
    timestamp, below the weak notification, that deletion takes it, and T1's change
    is never observed."""
    Recorder.seen = []
    worker = Worker(cluster, [Recorder()], threads=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"old")
    worker._scanner.serve_row(T, ROW)
    assert Recorder.seen == [b"old"]

    with Interleaving(cluster) as world:
        client = client_of(cluster)
        client.one_phase_commit = False
        t1_txn = Transaction(client)
        t1_txn.set(T, PRIMARY, COL, b"primary")
        t1_txn.set(T, ROW, COL, b"new")
        weak = Transaction(cluster)
        weak.notify(T, ROW, COL)
        weak.commit()
        t1 = world.actor("T1", t1_txn.commit, clients=[client])
        t1.run_until(lambda s: s.matches("timestamp"))  # prewritten; commit ts next
        run = world.actor("worker", lambda: worker._scanner.serve_row(T, ROW))
        run.run_until(lambda s: s.matches("timestamp"))  # read the weak notification
        run.step()  # drew its start timestamp: below T1's commit timestamp
        t1.step()
        t1.run_until(lambda s: ROW in s.rows)  # committed; s not yet released
        t1.kill()
        assert run.finish()
    assert Recorder.seen == [b"old", b"old"]
    worker._scanner.serve_row(T, ROW)
    assert Recorder.seen[-1] == b"new"


def test_a_run_that_reads_its_notification_leaves_one_committed_after_its_start(
    cluster: Cluster,
) -> None:
    """The index pass's run draws its start timestamp, then reads the notification and
    the cell in one store call (``Runner.run_noticed``). A change committed between the
    draw and the read notifies above the snapshot, which does not hold the change:
    the run serves only the notify versions at or below its start timestamp, and the
    newer one stays for the next run, which observes the change.

    Catches the mutant that serves every notify version read (``served = versions``
    in ``Runner._observe``): the run deletes the new notification with the old
    one, and the change is never observed."""
    Recorder.seen = []
    worker = Worker(cluster, [Recorder()], threads=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"old")
    with Interleaving(cluster) as world:
        run = world.actor("worker", lambda: worker._scanner.serve_indexed(T, ROW, [COL]))
        run.run_until(lambda s: s.matches("timestamp"))
        run.step()  # drew its start timestamp; reads next
        with Transaction(cluster) as txn:  # not an actor: commits at once
            txn.set(T, ROW, COL, b"new")
        assert run.finish()
    assert Recorder.seen == [b"old"]
    assert worker._scanner.serve_indexed(T, ROW, [COL])
    assert Recorder.seen == [b"old", b"new"]


def test_a_run_begun_at_the_previous_commits_draw_leaves_newer_notifications(
    cluster: Cluster,
) -> None:
    """A run's two-phase commit draws the next run's start timestamp with its commit
    timestamp (``NextStart``). A change committed after that draw is above the next
    run's snapshot: that run observes the state before it and leaves its notification;
    the run after it (begun at a later draw) observes the change.

    Catches two mutants: the next run drawing its own start timestamp (the spare
    unused: it would observe b"new" at once, one timestamp request more per run), and
    the run serving every notify version read (``served = versions``: the newer
    notification deleted unobserved)."""
    cluster.one_phase_commit = False  # the spare is drawn by two-phase commits
    Recorder.seen = []
    worker = Worker(cluster, [Recorder()], threads=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set(T, PRIMARY, COL, b"p")
        txn.set(T, ROW, COL, b"old")
    assert worker._scanner.serve_indexed(T, PRIMARY, [COL])  # commits; leaves a start
    assert worker._runner.next_start().ts
    with Transaction(cluster) as txn:
        txn.set(T, ROW, COL, b"new")
    assert worker._scanner.serve_indexed(T, ROW, [COL])
    assert Recorder.seen == [b"old"]
    assert worker._scanner.serve_indexed(T, ROW, [COL])
    assert Recorder.seen == [b"old", b"new"]
    assert not worker._scanner.serve_indexed(T, ROW, [COL])  # served: nothing left


def test_an_absent_run_that_read_a_newer_notification_hands_on_no_start(
    sqlite_cluster: Cluster,
) -> None:
    """A run begun at its thread's spare start timestamp (drawn by the previous run's
    commit) finds only a notification committed after that draw: absent, it leaves
    the notification. The next run must draw afresh and observe the change; were the
    absent run's start timestamp handed on, every following run of the pass would
    begin at it and leave the newer notifications until the next pass.

    Catches the absent run that hands on its start timestamp whatever it read
    (``held.ts = txn.start_ts`` without ``not notice.later`` in
    ``Runner._transaction``): the second run is absent too. The runs' logic is
    the store's business nowhere, so SQLite alone plays it."""
    cluster = sqlite_cluster
    cluster.one_phase_commit = False  # the spare is drawn by two-phase commits
    Recorder.seen = []
    worker = Worker(cluster, [Recorder()], threads=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set(T, PRIMARY, COL, b"p")
    assert worker._scanner.serve_indexed(T, PRIMARY, [COL])  # commits; leaves a start
    assert worker._runner.next_start().ts
    with Transaction(cluster) as txn:  # above that start: ROW's only notification
        txn.set(T, ROW, COL, b"new")
    assert not worker._scanner.serve_indexed(T, ROW, [COL])  # absent: the change is newer
    assert Recorder.seen == []
    assert worker._scanner.serve_indexed(T, ROW, [COL])
    assert Recorder.seen == [b"new"]
