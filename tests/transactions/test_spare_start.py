"""A transaction that only writes, on the cluster stores: it commits at a start
timestamp its thread's previous commit drew with its own commit timestamp, one
timestamp request per transaction where there were two (docs/timestamps.md, "A
transaction that only writes"). A transaction that reads draws its snapshot at its
first read, so it holds every commit that returned before it was created; one that
meets a commit made since its spare commits again at a fresh start timestamp; a
forked child never uses its parent's spare."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from percolator import (
    Cluster,
    ConflictError,
    OracleUnavailable,
    Transaction,
    TransactionClosedError,
    metrics,
)
from percolator._commit import SimulatedCrash, commit_transaction
from percolator._internals import internals
from percolator._safe_point import SafePoint
from percolator._timestamps import NextStart
from percolator.testing import CrashPoint, Interleaving, client_of
from tests._backends import BACKENDS, CAS_SQLITE, backend_fixture

T, X, Y, COL = "t", b"x", b"y", "c:v"

# And the embedded store taking HBase's path (CAS_SQLITE): no lock census, so its
# transactions take spares as the cluster stores' do, which the mutation runs (the
# embedded store only) reach there alone.
backend = backend_fixture([*BACKENDS, CAS_SQLITE])


def _count(name: str) -> float:
    return metrics.snapshot()[0].get((name, ("user",)), 0.0)


class CountedTimestamps:
    """The cluster's timestamp source, counting requests (a call of either method)."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.requests = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def get_timestamp(self) -> int:
        self.requests += 1
        ts: int = self._source.get_timestamp()
        return ts

    def get_timestamps(self, n: int) -> range:
        self.requests += 1
        drawn: range = self._source.get_timestamps(n)
        return drawn


@pytest.fixture
def table(cluster: Cluster) -> Cluster:
    if internals(cluster).lock_census is not None:
        pytest.skip("the embedded store draws a start timestamp when a transaction is made")
    cluster.create_table(T)
    with Transaction(cluster) as txn:  # leaves this thread a spare
        txn.set(T, X, COL, b"0")
    return cluster


@pytest.fixture
def counted(table: Cluster) -> Iterator[CountedTimestamps]:
    parts = internals(table)
    source = parts.timestamps
    parts.timestamps = counter = CountedTimestamps(source)
    yield counter
    parts.timestamps = source


def test_a_transaction_that_only_writes_makes_one_timestamp_request(
    table: Cluster, counted: CountedTimestamps
) -> None:
    """Fails when a transaction draws its start timestamp when made (2 requests)."""
    for i in range(5):
        with Transaction(table) as txn:
            txn.set(T, X, COL, str(i).encode())
    assert counted.requests == 5
    assert table.snapshot().get(T, X, COL) == b"4"


def test_a_transaction_that_reads_sees_every_commit_made_before_it(table: Cluster) -> None:
    """Another client commits after this thread's spare was drawn, before the
    transaction is made: its first read must see that commit. Fails when reads use
    the spare (the snapshot below the other client's commit)."""
    other = client_of(table)
    with Transaction(other) as txn:
        txn.set(T, X, COL, b"other")
    assert txn.commit_ts is not None
    reader = Transaction(table)
    assert reader.get(T, X, COL) == b"other"
    assert reader.start_ts > txn.commit_ts
    reader.set(T, Y, COL, b"after")
    assert reader.commit() > reader.start_ts


def test_asking_for_start_ts_takes_the_snapshot(table: Cluster) -> None:
    txn = Transaction(table)
    start = txn.start_ts
    with Transaction(client_of(table)) as later:
        later.set(T, X, COL, b"later")
    assert txn.start_ts == start
    assert txn.get(T, X, COL) == b"0"
    txn.rollback()


def test_a_transaction_that_read_commits_at_the_snapshot_it_read(table: Cluster) -> None:
    """Its first read drew a start timestamp in place of the spare: it commits as of
    that snapshot. Fails when the draw leaves the spare held (start_ts's descriptor
    not clearing it): the commit then takes the spare's older start."""
    txn = Transaction(table)
    assert txn.get(T, X, COL) == b"0"
    read_at = txn.start_ts
    txn.set(T, Y, COL, b"read")
    assert txn.commit() > read_at
    assert txn.start_ts == read_at


def test_a_write_meeting_a_commit_since_its_spare_commits_at_a_fresh_start(
    table: Cluster, counted: CountedTimestamps
) -> None:
    """The spare is older than another client's commit of the same cell, which
    returned before this transaction was made. Fails (ConflictError) when the commit
    does not start over at a fresh draw."""
    with Transaction(client_of(table)) as other:
        other.set(T, X, COL, b"other")
    assert other.commit_ts is not None
    counted.requests = 0
    conflicted = _count("percolator_transactions_conflicted_total")
    committed = _count("percolator_transactions_committed_total")
    stats = internals(table).stats  # what `percolator status` shows
    conflicts, commits = stats["conflicts"], stats["commits"]
    with Transaction(table) as txn:
        txn.set(T, X, COL, b"mine")
    assert txn.start_ts > other.commit_ts
    assert counted.requests == 2  # a fresh start and the commit: the spare conflicted first
    assert table.snapshot().get(T, X, COL) == b"mine"
    # One commit as the application sees it: the spare's attempt is not a conflict.
    assert _count("percolator_transactions_conflicted_total") == conflicted
    assert _count("percolator_transactions_committed_total") == committed + 1
    assert (stats["conflicts"], stats["commits"]) == (conflicts, commits + 1)


def test_a_commit_that_starts_over_counts_only_its_last_attempt(cluster: Cluster) -> None:
    """commit_transaction's *again*: the first attempt conflicts, *again* makes the
    transaction ready at a fresh start, and the second attempt commits. The first
    attempt's conflict, which the application never sees, is counted neither in the
    cluster's stats (``percolator status``) nor in the metrics. On every store: the
    test hands *again* itself (the embedded store's transactions take no spare)."""
    cluster.create_table(T)
    stale, loser = Transaction(cluster), Transaction(cluster)
    stale.set(T, X, COL, b"stale")
    loser.set(T, X, COL, b"loser")
    stale_start = stale.start_ts
    assert loser.start_ts > 0
    with Transaction(cluster) as other:
        other.set(T, X, COL, b"other")
    assert other.commit_ts is not None and other.commit_ts > stale_start
    stats = internals(cluster).stats
    conflicts, commits = stats["conflicts"], stats["commits"]
    with pytest.raises(ConflictError):  # a conflict the application sees: counted
        loser.commit()
    assert (stats["conflicts"], stats["commits"]) == (conflicts + 1, commits)
    conflicted = _count("percolator_transactions_conflicted_total")
    committed = _count("percolator_transactions_committed_total")
    conflicts += 1
    commit_ts = commit_transaction(stale, again=stale._start_over)
    assert stale.commit_ts == commit_ts
    assert stale.start_ts > other.commit_ts and commit_ts > stale.start_ts
    assert cluster.snapshot().get(T, X, COL) == b"stale"
    assert (stats["conflicts"], stats["commits"]) == (conflicts, commits + 1)
    assert _count("percolator_transactions_conflicted_total") == conflicted
    assert _count("percolator_transactions_committed_total") == committed + 1


def test_a_commit_that_starts_over_stops_at_its_crash_point(cluster: Cluster) -> None:
    """A test harness's crash point holds for the attempt after *again* too: the
    commit stops there (its primary committed, as a process that died right after
    its commit point leaves it), and a reader rolls it forward."""
    cluster.create_table(T)
    stale = Transaction(cluster)
    stale.set(T, X, COL, b"stale")
    stale.set(T, Y, COL, b"stale")
    assert stale.start_ts > 0
    with Transaction(cluster) as other:
        other.set(T, X, COL, b"other")
    with pytest.raises(SimulatedCrash):
        commit_transaction(stale, CrashPoint("commit_point"), again=stale._start_over)
    assert stale.commit_ts is not None
    assert cluster.snapshot().get(T, Y, COL) == b"stale"


def test_a_write_meeting_a_live_lock_still_conflicts(table: Cluster) -> None:
    """A writer holds its lock on x (parked at its commit point): a transaction
    that only writes x conflicts, at its spare and at a fresh start, and the
    writer's update survives."""
    with Interleaving(table) as world:
        client = client_of(table)
        client.one_phase_commit = False
        holder = Transaction(client)
        holder.set(T, X, COL, b"holder")
        actor = world.actor("holder", holder.commit, clients=[client])
        actor.run_until(lambda s: s.matches("timestamp"))  # its prewrite done
        txn = Transaction(table)
        txn.set(T, X, COL, b"mine")
        with pytest.raises(ConflictError):
            txn.commit()
        actor.finish()
    assert table.snapshot().get(T, X, COL) == b"holder"


def test_a_spare_overtaken_by_the_safe_point_commits_at_a_fresh_start(
    table: Cluster,
) -> None:
    """Another client moves the safe point above this thread's spare (a collection
    with a retention of nothing); this client's cached safe point does not know yet.
    Fails (SnapshotTooOldError) when the commit does not start over."""
    spare = internals(table).spare_starts.next.ts
    assert spare
    parts = internals(table)
    above = parts.timestamps.get_timestamp()
    SafePoint(parts.store, parts.coordination).advance(above)  # another client's pass
    assert parts.safe_point._value < spare  # this client's cache does not know it yet
    parts.safe_point._fetched = float("-inf")  # the commit's check reads it
    with Transaction(table) as txn:
        txn.set(T, X, COL, b"late")
    assert txn.start_ts > above
    assert table.snapshot().get(T, X, COL) == b"late"


def test_a_forked_child_does_not_use_its_parents_spare() -> None:
    """Fails when NextStart.take ignores the fork generation: parent and child would
    both write at the one start timestamp."""
    spare = NextStart()
    spare.fill(12345)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when it refuses the spare
        os._exit(0 if spare.take(0) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert spare.take(0) == 12345  # the parent still may, once
    assert spare.take(0) == 0


def test_a_stale_spare_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    spare = NextStart()
    spare.fill(7)
    monkeypatch.setattr("percolator._timestamps.SPARE_MAX_AGE", -1.0)
    assert spare.take(0) == 0
    spare.fill(8)
    assert spare.take(9) == 0  # below the safe point


class FailingTimestamps(CountedTimestamps):
    def get_timestamp(self) -> int:
        raise OracleUnavailable("the oracle is down (test)")


def test_a_failed_first_draw_leaves_the_transaction_and_the_safe_point_usable(
    table: Cluster,
) -> None:
    """The first read's draw fails: the transaction must not be counted as running
    without a start timestamp. Fails (the safe point's lock held forever by a draw
    under it, a hang that stopped a whole client in the nemesis run) when
    ``SafePoint.begin`` registers a transaction whose draw raised."""
    parts = internals(table)
    txn = Transaction(table)  # holds the fixture's spare
    source = parts.timestamps
    parts.timestamps = FailingTimestamps(source)
    try:
        with pytest.raises(OracleUnavailable):
            txn.get(T, X, COL)
    finally:
        parts.timestamps = source
    listed: list[object] = []
    probe = threading.Thread(target=lambda: listed.append(parts.safe_point.running()),
                             daemon=True)
    probe.start()
    probe.join(30)  # a deadlock detector, not a timing bound: it answers at once
    assert listed, "SafePoint.running() never returned"
    assert txn.get(T, X, COL) == b"0"  # the draw is tried again
    txn.rollback()


def test_a_transaction_holding_a_spare_is_not_started_until_asked(
    table: Cluster, counted: CountedTimestamps
) -> None:
    """Its repr says so without drawing its start; asked of the class, ``start_ts`` is a
    missing attribute, as of any class whose instances set it (``help()``, autodoc)."""
    txn = Transaction(table)
    assert repr(txn) == "<percolator.Transaction start_ts=(not started) open>"
    assert counted.requests == 0
    start = txn.start_ts
    assert counted.requests == 1
    assert repr(txn) == f"<percolator.Transaction start_ts={start} open>"
    txn.rollback()
    with pytest.raises(AttributeError) as missing:
        Transaction.start_ts  # noqa: B018
    assert str(missing.value) == "'Transaction' object has no attribute 'start_ts'"


def test_a_commit_whose_fresh_start_cannot_be_drawn_leaves_the_transaction_closed(
    table: Cluster,
) -> None:
    """Its spare is older than another client's commit of the cell, which returned
    before it was made (as above), and the draw of a fresh start fails: the commit
    raises the oracle's error and the transaction is closed, as after any commit that
    failed. Failed when the start over reopened it before its draw: it stayed open at
    the spare, whose reads miss that commit."""
    with Transaction(client_of(table)) as other:
        other.set(T, X, COL, b"other")
    txn = Transaction(table)
    txn.set(T, X, COL, b"mine")
    parts = internals(table)
    source = parts.timestamps
    parts.timestamps = FailingTimestamps(source)
    try:
        with pytest.raises(OracleUnavailable):
            txn.commit()
    finally:
        parts.timestamps = source
    assert txn.closed is True
    with pytest.raises(TransactionClosedError, match="already closed"):
        txn.get(T, X, COL)
    assert table.snapshot().get(T, X, COL) == b"other"


def test_a_spare_start_under_the_safe_point_is_refused_one_at_it_is_taken_once() -> None:
    """``take(below)``, *below* the cached safe point: a snapshot below it may miss
    versions that GC removed (as ``SafePoint.check`` refuses a start under it), one at
    it reads all it needs."""
    spare = NextStart()
    spare.fill(10)
    assert spare.take(below=11) == 0
    spare.fill(10)
    assert spare.take(below=10) == 10
    assert spare.take(below=0) == 0  # taken once
