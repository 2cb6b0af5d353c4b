"""The races of the commit protocol, each played out step by step on every backend.

Each test puts actors in one exact order (``percolator.testing.Interleaving`` parks
them before each store call) or kills committers at exact points (``crash_commit``),
and checks what a reader sees against what must hold. Each names the line it guards:
with that line broken as described, the test fails (checked by hand, one mutation
at a time, on every backend where the line runs).

Accounts ``alice`` (the primary of every transfer) and ``bob`` start at 100 and 0;
a transfer of 60 ends 40 / 60, all of it or none of it.
"""

from __future__ import annotations

import threading

import pytest

import percolator
from percolator import Cluster, ConflictError, Snapshot, Transaction
from percolator._internals import internals
from percolator._store import SET_UNLESS, offered
from percolator.testing import CrashPoint, Interleaving, Step, client_of, crash_commit
from tests._backends import CAS_SQLITE, WITH_THRIFT1, backend_fixture
from tests.transactions.test_lock_resolution import ParkedCommitter

# And the embedded store taking HBase's path (CAS_SQLITE): the prewrite locks by
# compare-and-set from what the transaction's reads kept.
backend = backend_fixture([*WITH_THRIFT1, CAS_SQLITE])

T, COL = "bank", "bal:v"
ALICE, BOB = b"alice", b"bob"


@pytest.fixture
def bank(cluster: Cluster) -> Cluster:
    cluster.create_table(T)
    with Transaction(cluster) as txn:
        txn.set(T, ALICE, COL, b"100")
        txn.set(T, BOB, COL, b"0")
    return cluster


def committer(cluster: Cluster) -> Cluster:
    """Another client, committing in two phases (one store call per step)."""
    client = client_of(cluster)
    client.one_phase_commit = False
    return client


def transfer(client: Cluster, alice: bytes = b"40", bob: bytes = b"60") -> Transaction:
    txn = Transaction(client)
    txn.set(T, ALICE, COL, alice)  # first written: the primary
    txn.set(T, BOB, COL, bob)
    return txn


def balances(cluster: Cluster) -> tuple[bytes | None, bytes | None]:
    """Both balances; bob first, so that his lock, if any, is resolved through the
    primary's status as it stands (reading alice first would clean the primary)."""
    snap = Snapshot(cluster)
    bob = snap.get(T, BOB, COL)
    return snap.get(T, ALICE, COL), bob


def is_timestamp(step: Step) -> bool:
    return step.matches("timestamp")


def test_a_commit_point_lost_to_a_cleaner_leaves_nothing_visible(bank: Cluster) -> None:
    """T1 is paused at its commit point's compare-and-set, after it confirmed its
    session, and stays paused long enough for the session to expire; a reader rolls
    it back; T1 wakes and makes its compare-and-set.

    Guards ``if not won:`` in ``TwoPhaseCommit.commit_point`` (carrying on after the lost
    CAS frees bob with T1's write record: bob 60, alice 100) and, on the embedded
    store, ``check_and_set`` applying its puts only when the compare succeeds
    (else alice's write record lands while T1 gets ConflictError)."""
    with Interleaving(bank) as world:
        client = committer(bank)
        lost = transfer(client)
        t1 = world.actor("T1", lost.commit, clients=[client])
        t1.run_until(is_timestamp)  # both cells locked; its commit timestamp is next
        t1.run_until(lambda step: step.matches("check_and_set", row=ALICE))
        internals(client).coordination.close()  # its session expires while it is paused
        assert balances(bank) == (b"100", b"0")  # the reader rolled it back
        with pytest.raises(ConflictError) as info:
            t1.finish()
    assert str(info.value) == (
        f"write-write conflict on {T}/{ALICE!r}/{COL}: rolled back by a cleaner before the "
        f"commit point (transaction {lost.start_ts})")
    assert balances(bank) == (b"100", b"0")


def test_a_committer_whose_session_expired_does_not_reach_its_commit_point(
    bank: Cluster,
) -> None:
    """T1 is paused between its prewrite and its commit point while its session
    expires; nobody touches its locks. Woken, it must not commit them (issue 21):
    its commit raises CoordinationError, releases its locks, and nothing is visible.

    Guards ``confirm_owner`` in ``TwoPhaseCommit.commit_point`` (without it T1 commits:
    alice 40, bob 60)."""
    with Interleaving(bank) as world:
        client = committer(bank)
        t1 = world.actor("T1", transfer(client).commit, clients=[client])
        t1.run_until(is_timestamp)
        internals(client).coordination.close()
        with pytest.raises(percolator.CoordinationError, match="not committing"):
            t1.finish()
    assert balances(bank) == (b"100", b"0")


def test_status_of_a_primary_overwritten_after_its_commit_finds_the_older_record(
    bank: Cluster,
) -> None:
    """T1 dies right after its commit point; T2 then overwrites T1's primary cell
    and commits; a reader meets T1's secondary.

    Guards ``versions=None`` in ``check_txn_status``'s read of the primary's write
    records: with only the newest (T2's), T1 looks rolled back and bob is erased."""
    assert crash_commit(transfer(committer(bank)), CrashPoint("commit_point"))
    with Transaction(bank) as t2:
        t2.set(T, ALICE, COL, b"77")
    assert balances(bank) == (b"77", b"60")


def test_a_read_past_a_rollback_record_stays_in_its_snapshot(bank: Cluster) -> None:
    """Bob: 0 committed; T0 locks bob and dies; reader R starts; T1 rolls T0 back
    (a ROLLBACK record at T0's start, below R's) and commits 5 after R's start.

    Guards ``max_ts=self.start_ts`` in ``Snapshot._newest_write``: the search below
    a rollback record must not go past the reader's start (R would read 5)."""
    t0 = Transaction(committer(bank))
    t0.set(T, BOB, COL, b"dead")
    assert not crash_commit(t0, CrashPoint("prewrite", 0))
    reader = Snapshot(bank)
    with Transaction(bank) as t1:
        t1.set(T, BOB, COL, b"5")
    assert reader.get(T, BOB, COL) == b"0"
    assert balances(bank) == (b"100", b"5")


def test_a_prewrite_rolls_a_committed_primary_forward_before_locking_it(
    bank: Cluster,
) -> None:
    """T1 dies right after its commit point (on HBase its primary lock is left
    COMMITTED, its write record not yet written); T2 then writes T1's primary cell.

    Guards ``not isinstance(state, Free)`` in ``TwoPhaseCommit._prewrite``: a prewrite
    that takes only LOCKED as held replaces T1's COMMITTED lock with its own, T1's
    write record is never written, and a reader then rolls bob back."""
    assert crash_commit(transfer(committer(bank)), CrashPoint("commit_point"))
    with Transaction(bank) as t2:
        t2.set(T, ALICE, COL, b"41")
    assert balances(bank) == (b"41", b"60")
    history = Snapshot(bank, start_ts=internals(bank).timestamps.get_timestamp())
    assert history.get(T, BOB, COL) == b"60"


def test_status_ignores_another_transactions_committed_primary_lock(bank: Cluster) -> None:
    """T1 locks both cells and dies; T2 rolls T1 back while writing alice and dies
    right after its own commit point (on HBase: alice's lock COMMITTED by T2); a
    reader meets T1's lock on bob.

    Guards ``state.start_ts == start_ts`` in ``check_txn_status``'s COMMITTED branch:
    taking T2's decision for T1's would roll bob forward to a value never committed."""
    assert not crash_commit(transfer(committer(bank)), CrashPoint("prewrite", 1))
    t2 = Transaction(committer(bank))
    t2.set(T, ALICE, COL, b"55")
    assert crash_commit(t2, CrashPoint("commit_point"))
    assert balances(bank) == (b"55", b"0")


def test_a_cleaner_that_loses_its_rollback_cas_leaves_the_commit_whole(
    bank: Cluster,
) -> None:
    """A reader finds T1's primary LOCKED by a dead owner and is about to roll it back
    (CAS LOCKED -> ROLLED_BACK); T1, only paused at its commit point's CAS (its session
    confirmed just before), wakes and passes it first, then dies before releasing
    bob; the reader's CAS loses.

    Guards ``if not ...check_and_set(...): return False`` in ``roll_back_primary``
    (the race its docstring names): ignoring the lost CAS frees bob as rolled back,
    so T1's committed transfer loses its credit to bob."""
    with Interleaving(bank) as world:
        client = committer(bank)
        t1_txn = transfer(client)
        t1 = world.actor("T1", t1_txn.commit, clients=[client])
        t1.run_until(is_timestamp)
        # At its commit point's CAS, its session confirmed; then the session expires
        # and it does not know yet.
        t1.run_until(lambda s: s.matches("check_and_set", row=ALICE))
        internals(client).coordination.close()
        reader = Transaction(bank)
        r = world.actor("reader", lambda: reader.get(T, BOB, COL))
        r.run_until(lambda s: s.matches("check_and_set", row=ALICE))  # the rollback CAS
        t1.step()  # its commit point
        t1.run_until(lambda s: ALICE not in s.rows)  # past the commit point, at bob
        assert r.finish() == b"60"  # T1 committed below the reader's start
        t1.kill()
    commit_ts = t1_txn.commit_ts
    assert commit_ts is not None
    assert balances(bank) == (b"40", b"60")
    assert Snapshot(bank, start_ts=commit_ts - 1).get(T, BOB, COL) == b"0"


def test_status_ignores_another_transactions_lock_on_the_primary(bank: Cluster) -> None:
    """T1 dies right after its commit point; T2 locks the same primary cell and dies;
    a reader meets T1's lock on bob.

    Guards ``state.start_ts == start_ts`` in ``check_txn_status``'s LOCKED branch:
    taking T2's lock for T1's, the reader rolls back T2's lock as if it were T1's and
    erases T1's committed credit to bob."""
    assert crash_commit(transfer(committer(bank)), CrashPoint("commit_point"))
    t2 = Transaction(committer(bank))
    t2.set(T, ALICE, COL, b"1")
    assert not crash_commit(t2, CrashPoint("prewrite", 0))
    assert balances(bank) == (b"40", b"60")


def test_a_secondary_rolled_forward_under_a_paused_committer_is_not_written_twice(
    bank: Cluster,
) -> None:
    """T1 passes its commit point and pauses before releasing bob; a reader rolls bob
    forward; T1 wakes and releases bob: its compare-and-set must fail harmlessly.

    Guards the release of a secondary being a compare-and-set from T1's own lock
    (``release``): an unconditional write would put T1's FREE over a later lock."""
    with Interleaving(bank) as world:
        client = committer(bank)
        t1 = world.actor("T1", transfer(client).commit, clients=[client])
        t1.run_until(is_timestamp)
        t1.step()
        t1.run_until(lambda s: ALICE not in s.rows)  # committed, bob still locked
        internals(client).coordination.close()
        t2 = Transaction(committer(bank))
        assert t2.get(T, BOB, COL) == b"60"  # rolled forward by the reader
        t2.set(T, BOB, COL, b"61")
        t3 = world.actor("T2", lambda: t2.commit())
        t3.run_until(lambda s: s.matches("timestamp"))  # bob locked by T2 now
        t1.finish()
        t3.finish()
    assert balances(bank) == (b"40", b"61")


def test_a_killed_actor_makes_no_further_call(bank: Cluster) -> None:
    """The harness itself: a committer killed before its commit point leaves locks
    that are rolled back (its owner declared dead), and nothing it did after."""
    with Interleaving(bank) as world:
        client = committer(bank)
        t1 = world.actor("T1", transfer(client).commit, clients=[client])
        t1.run_until(is_timestamp)
        taken = len(t1.steps)
        t1.kill()
        assert isinstance(t1.error, percolator.testing.SimulatedCrash)
        assert len(t1.steps) == taken
    assert balances(bank) == (b"100", b"0")


@pytest.mark.parametrize("t2_one_phase", [True, False], ids=["t2-one-phase", "t2-two-phase"])
def test_a_commit_between_the_prewrite_read_and_its_locks_is_a_conflict(
    bank: Cluster, t2_one_phase: bool
) -> None:
    """T1's prewrite reads both cells (one read per table) and is parked before it
    locks its primary; T2 then commits bob. T1, woken, must not lock bob on what it
    read: its commit raises ConflictError and T2's bob stands.

    Guards the prewrite's read before the primary's lock
    (``TwoPhaseCommit._prewrite_all``): each lock is set by a compare-and-set against
    the lock cell as read, which a commit since the read has changed (invariant A), and
    a lost compare-and-set reads the cell's write records again
    (``TwoPhaseCommit._prewrite``): locking bob on the lock cell read again but the
    write records read before commits T1 over T2's bob (fails on HBase, both APIs)."""
    if offered(internals(bank).store, SET_UNLESS):
        pytest.skip("the store tests the conflict conditions in each lock's conditional "
                    "mutation: its prewrite reads nothing first")
    with Interleaving(bank) as world:
        client = committer(bank)
        t1 = world.actor("T1", transfer(client).commit, clients=[client])
        t1.run_until(lambda step: step.matches("check_and_set", row=ALICE))
        t2_client = client_of(bank)
        t2_client.one_phase_commit = t2_one_phase
        with Transaction(t2_client) as t2:
            t2.set(T, BOB, COL, b"7")
        with pytest.raises(ConflictError):
            t1.finish()
    assert balances(bank) == (b"100", b"7")


def read_transfer(client: Cluster) -> Transaction:
    """A transfer that reads both balances first, as a bank's does: alice -40, bob +40."""
    txn = Transaction(client)
    alice, bob = txn.get(T, ALICE, COL), txn.get(T, BOB, COL)
    assert alice is not None and bob is not None
    txn.set(T, ALICE, COL, b"%d" % (int(alice) - 40))
    txn.set(T, BOB, COL, b"%d" % (int(bob) + 40))
    return txn


@pytest.mark.parametrize("t2_one_phase", [True, False], ids=["t2-one-phase", "t2-two-phase"])
def test_a_commit_since_the_transaction_read_its_cells_is_a_conflict(
    bank: Cluster, t2_one_phase: bool
) -> None:
    """T1 reads both balances and writes both; its commit is parked before its first
    step; T2 then commits bob. T1, woken, must not lock bob on what its reads saw:
    its commit raises ConflictError and T2's bob stands.

    Guards the prewrite's use of what the transaction's reads saw
    (``TwoPhaseCommit._checked_before_locking`` taking ``WriteSet.read_state``, kept
    by ``TransactionBase._remember``): each lock is set by a compare-and-set against
    the lock cell as that read saw it, which a commit since has changed (invariant A).
    Kept with the lock value read again at commit instead (a lock cell but no write
    records), T1 commits over T2's bob (fails on HBase, both APIs)."""
    with Interleaving(bank) as world:
        client = committer(bank)
        txn = read_transfer(client)
        t1 = world.actor("T1", txn.commit, clients=[client])
        t1.run_until(lambda step: True)  # parked at its commit's first step
        t2_client = client_of(bank)
        t2_client.one_phase_commit = t2_one_phase
        with Transaction(t2_client) as t2:
            t2.set(T, BOB, COL, b"7")
        with pytest.raises(ConflictError):
            t1.finish()
    assert balances(bank) == (b"100", b"7")


def test_a_change_the_transaction_read_past_fails_its_commit_before_any_lock(
    bank: Cluster,
) -> None:
    """T1 starts; T2 commits bob; T1 reads both balances (bob as before T2, in its
    snapshot) and writes both. T1's commit raises ConflictError without taking a lock:
    no compare-and-set at all, where it used to lock alice, meet bob's newer record and
    free alice again (2 compare-and-sets for nothing, in a contended bank).

    Guards first committer wins checked for every cell before the primary's lock
    (``TwoPhaseCommit._checked_before_locking``); skipped where the store's conditional
    mutation tests the conflict conditions (Bigtable: no read to check first)."""
    if offered(internals(bank).store, SET_UNLESS):
        pytest.skip("the store tests the conflict conditions in each lock's conditional "
                    "mutation: its prewrite reads nothing first")
    client = committer(bank)
    txn = Transaction(client)
    assert txn.start_ts
    with Transaction(client_of(bank)) as t2:
        t2.set(T, BOB, COL, b"7")
    assert txn.get(T, BOB, COL) == b"0"  # its snapshot
    assert txn.get(T, ALICE, COL) == b"100"
    txn.set(T, ALICE, COL, b"60")
    txn.set(T, BOB, COL, b"40")
    with Interleaving(bank, client) as world:
        t1 = world.actor("T1", txn.commit, clients=[client])
        with pytest.raises(ConflictError, match="committed at"):
            t1.finish()
        assert not [s for s in t1.steps if s.matches("check_and_set")], t1.steps
    assert balances(bank) == (b"100", b"7")


def test_a_write_past_a_commit_of_its_own_client_after_its_start_is_a_conflict(
    bank: Cluster,
) -> None:
    """T1 then T2 start; T1, of the same client, commits a transfer (commit timestamp
    above T2's start) and is parked after its commit point, before it frees bob; T2 reads
    bob, which T1's lock hides nothing of (its committer says so, CommitsInFlight):
    the old 0. T1 then finishes; T2 writes bob and must conflict, not commit over
    T1's 60.

    Guards the write record of a commit after start_ts kept with the FREE value its
    release writes (``TransactionBase._settled``, then ``_remember``): kept without it,
    T2's compare-and-set from that FREE value succeeds once T1 freed bob, and T2
    commits over T1 (bob 1, a lost update; fails over Thrift2 and on ``cas-sqlite``.
    Over Thrift1, without atomic row CAS, T1 writes bob's record before it frees him,
    so T2's read finds that record in the store: the line is not reached there)."""
    client = committer(bank)
    t1 = transfer(client)
    assert t1.start_ts  # below T2's: its locks are in T2's way
    t2 = Transaction(client)
    assert t2.start_ts
    store = internals(client).store
    parked = ParkedCommitter(store, BOB, 1 if offered(store, SET_UNLESS) else 2)
    internals(client).store = parked  # type: ignore[assignment]
    parked.committer = threading.Thread(target=t1.commit)
    parked.committer.start()
    try:
        assert parked.reached.wait(30)  # past its commit point, before bob's release
        assert t1.commit_ts and t1.commit_ts > t2.start_ts
        assert t2.get(T, BOB, COL) == b"0"
    finally:
        parked.go.set()
        parked.committer.join()
        internals(client).store = store
    t2.set(T, BOB, COL, b"1")
    with pytest.raises(ConflictError):
        t2.commit()
    assert balances(bank) == (b"40", b"60")


def test_a_blind_write_past_a_commit_of_its_own_client_is_a_conflict_its_committer_tells(
    bank: Cluster,
) -> None:
    """As the test above, T2 writing bob without reading him: its prewrite reads bob's
    lock, T1's, whose committer tells that T1 committed after T2's start: a conflict,
    raised on that one read, without asking T1's primary. Skipped where the store's
    conditional mutation tests the conflict conditions (Bigtable: no read first).

    Guards ``TwoPhaseCommit._checked_before_locking`` asking
    ``CommitsInFlight.committed_after`` of a lock of its own client (without, T2
    resolves the lock through the store: it reads alice, rolls bob forward and reads
    him again before the same conflict)."""
    if offered(internals(bank).store, SET_UNLESS):
        pytest.skip("the store tests the conflict conditions in each lock's conditional "
                    "mutation: its prewrite reads nothing first")
    client = committer(bank)
    t1 = transfer(client)
    assert t1.start_ts  # below T2's: its locks are in T2's way
    t2 = Transaction(client)
    assert t2.start_ts
    store = internals(client).store
    parked = ParkedCommitter(store, BOB, 2, table=T)
    internals(client).store = parked  # type: ignore[assignment]
    parked.committer = threading.Thread(target=t1.commit)
    parked.committer.start()
    try:
        assert parked.reached.wait(30)  # past its commit point, before bob's release
        t2.set(T, BOB, COL, b"1")
        with pytest.raises(ConflictError, match=f"committed at {t1.commit_ts} after our "
                           "start") as info:
            t2.commit()
        assert (info.value.row, info.value.conflict_ts) == (BOB, t1.commit_ts)
        assert parked.calls == ["read_rows"]
    finally:
        parked.go.set()
        parked.committer.join()
        internals(client).store = store
    assert balances(bank) == (b"40", b"60")
