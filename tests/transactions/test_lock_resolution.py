"""Lock resolution: dead owners are rolled back at once, live ones only after their
ttl, and a long commit keeps its primary fresh so that it is not rolled back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator import Transaction
from percolator._cas import lock_cas
from percolator._commit import CrashPoint
from percolator._encoding import (
    LOCK,
    NOTIFY,
    WRITE,
    Committed,
    Free,
    Lock,
    RolledBack,
    WriteKind,
    decode_lock,
    decode_write,
    encode_lock,
    encode_write,
)
from percolator._errors import StoreUnavailable
from percolator._internals import internals
from percolator._lock_resolver import NOTIFY_STRONG, release, resolve_lock
from percolator._notifications import pending_notifications
from percolator._store import Mutation, Read
from percolator.testing import client_of, crash_commit
from tests._concurrency import hold_locks

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(seeded_sqlite_url: str) -> str:
    return seeded_sqlite_url


@pytest.fixture
def holder(url: str) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(ttl: float) -> subprocess.Popen[str]:
        # Prewrites t/r1 and t/r2 (embedded coordination), then blocks: a live owner.
        p = subprocess.Popen(
            [sys.executable, "-m", "tests.coordination._child", "lock", url, "-", str(ttl)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline().startswith("LOCKED ")
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_dead_owner_is_rolled_back_at_once(url: str, holder: Any) -> None:
    proc = holder(ttl=3600)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with percolator.connect(url, lock_wait=3600) as cluster:
        txn = Transaction(cluster)
        assert txn.get("t", b"r2", "c:v") == b"old"  # no wait for the hour-long ttl
        assert internals(cluster).stats["locks_resolved"] >= 1


def test_live_owner_blocks_readers_until_its_ttl(url: str, holder: Any) -> None:
    ttl = 4.0
    proc = holder(ttl=ttl)
    locked_at = time.time()
    with percolator.connect(url, lock_wait=0.2) as cluster:
        # Within the ttl the owner's lock is left alone: readers give up waiting...
        with pytest.raises(percolator.LockedError, match="still alive") as info:
            Transaction(cluster).get("t", b"r1", "c:v")
        assert info.value.row == b"r1"
        # ...and writers conflict rather than roll it back.
        writer = Transaction(cluster)
        writer.set("t", b"r2", "c:v", b"mine")
        with pytest.raises(percolator.ConflictError, match="live transaction"):
            writer.commit()
    assert proc.poll() is None
    # ...and once the ttl has passed, it is rolled back although the owner lives.
    time.sleep(max(0.0, locked_at + ttl + 0.2 - time.time()))
    with percolator.connect(url, lock_wait=0.2) as cluster:
        assert Transaction(cluster).get("t", b"r1", "c:v") == b"old"
        assert Transaction(cluster).get("t", b"r2", "c:v") == b"old"
    assert proc.poll() is None


def test_a_live_owners_lock_is_rolled_back_once_its_ttl_has_passed(url: str) -> None:
    # The owner (this process) stays alive: only the lock's wall time plus its ttl,
    # against the clock, lets a reader roll it back (a killed owner would be at once).
    with percolator.connect(url, lock_ttl=0.2) as owner, \
            percolator.connect(url, lock_wait=10) as reader:
        live = Transaction(owner)
        live.set("t", b"r1", "c:v", b"mine")
        hold_locks(live)
        assert Transaction(reader).get("t", b"r1", "c:v") == b"old"
        assert internals(reader).stats["locks_resolved"] == 1


def test_each_lock_of_a_dead_owner_is_counted_once_as_it_is_resolved(url: str) -> None:
    # The reader meets the primary first: rolling it back resolves that lock; the
    # secondary, met next, is one more (its primary tells it was rolled back).
    with percolator.connect(url, lock_wait=10) as reader:
        dying = Transaction(client_of(reader))
        dying.set("t", b"r1", "c:v", b"never")  # the primary: the first cell set
        dying.set("t", b"r2", "c:v", b"never")
        assert crash_commit(dying, CrashPoint("prewrite", 1)) is False
        resolved = internals(reader).stats
        assert Transaction(reader).get("t", b"r1", "c:v") == b"old"
        assert resolved["locks_resolved"] == 1
        assert Transaction(reader).get("t", b"r2", "c:v") == b"old"
        assert resolved["locks_resolved"] == 2


def test_a_delete_rolled_forward_by_a_reader_reads_as_deleted(url: str) -> None:
    # The committer dies after its commit point: the reader rolls the secondary, a
    # delete, forward, and must write it as a delete, not as a put of nothing.
    with percolator.connect(url) as reader:
        dying = Transaction(client_of(reader))
        dying.set("t", b"r1", "c:v", b"new")  # the primary
        dying.delete("t", b"r2", "c:v")
        assert crash_commit(dying, CrashPoint("commit_point")) is True
        txn = Transaction(reader)
        assert txn.get("t", b"r2", "c:v") is None
        assert txn.get("t", b"r1", "c:v") == b"new"
        assert internals(reader).stats["locks_resolved"] == 1
        # A put whose data cell is missing reads as None too: the record says delete
        # (the change feed and GC tell the two apart).
        records = internals(reader).store.read_rows(
            "t", [b"r2"], [Read(WRITE, ("c:v",), versions=1)])[b"r2"][f"{WRITE}:c:v"]
        assert decode_write(records[0][1]) == (WriteKind.DELETE, dying.start_ts)


def test_a_change_of_an_observed_column_rolled_forward_by_a_reader_notifies(url: str) -> None:
    # The committer dies after its commit point: only its secondary's lock says that the
    # change is to an observed column, so the reader rolling it forward writes its
    # notification (at the commit timestamp) from that lock, or no observer ever runs.
    with percolator.connect(url) as reader:
        reader.observe("t", "c:v")
        dying = Transaction(client_of(reader))  # made after: knows the observed column
        dying.set("t", b"r1", "c:v", b"new")  # the primary
        dying.set("t", b"r2", "c:v", b"new")
        assert crash_commit(dying, CrashPoint("commit_point")) is True
        assert Transaction(reader).get("t", b"r2", "c:v") == b"new"
        found = {(n.row, n.timestamps, n.strong) for n in pending_notifications(reader, ["t"])}
        assert found == {(b"r1", (dying.commit_ts,), True), (b"r2", (dying.commit_ts,), True)}


def test_a_lock_whose_primary_row_holds_nothing_is_rolled_back(url: str) -> None:
    # Neither lock nor write record at the primary (GC removes a cell's records, then
    # its FREE lock): the transaction cannot have committed, so its lock goes.
    with percolator.connect(url, lock_wait=10) as reader:
        start_ts = internals(reader).timestamps.get_timestamp()
        orphan = Lock(start_ts, "t", b"gone", "c:v", owner="nobody",
                      wall_ms=int(time.time() * 1000), ttl_ms=3_600_000)
        assert internals(reader).store.check_and_set(
            "t", b"r3", f"{LOCK}:c:v", None, encode_lock(orphan))
        assert Transaction(reader).get("t", b"r3", "c:v") is None
        assert internals(reader).stats["locks_resolved"] == 1


def test_a_free_lock_handed_to_resolution_sends_its_caller_to_read_again(url: str) -> None:
    # The callers of today skip FREE cells before they ask; one that does not (a scan
    # of every lock cell) must be told "read again", changing nothing, never "wait":
    # a FREE cell has no owner to wait for, its caller would wait out its lock_wait.
    with percolator.connect(url, lock_wait=10) as cluster:
        host = internals(cluster)
        lock = host.store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])
        raw = lock[b"r1"][f"{LOCK}:c:v"][0][1]
        assert isinstance(decode_lock(raw), Free)
        assert resolve_lock(host, "t", b"r1", "c:v", raw) is True
        assert host.store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))]) == lock
        assert host.stats["locks_resolved"] == 0
        assert Transaction(cluster).get("t", b"r1", "c:v") == b"old"


def test_a_dead_owners_primary_is_rolled_back_and_freed_in_one_resolution(url: str) -> None:
    # X dies after locking its primary: one resolution of that lock decides X rolled
    # back (ROLLED_BACK), leaves its ROLLBACK record and frees the cell (FREE for X, not
    # committed); it is not left ROLLED_BACK for the next reader to free.
    with percolator.connect(url, lock_wait=10) as reader:
        x = _dies_after_its_prewrite(reader)
        host = internals(reader)
        cells = host.store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])
        raw = cells[b"r1"][f"{LOCK}:c:v"][0][1]
        assert isinstance(decode_lock(raw), Lock)
        assert resolve_lock(host, "t", b"r1", "c:v", raw) is True
        cells = host.store.read_rows(
            "t", [b"r1"], [Read(LOCK, ("c:v",)), Read(WRITE, ("c:v",), versions=None)])
        assert decode_lock(cells[b"r1"][f"{LOCK}:c:v"][0][1]) == Free(x.start_ts, False)
        assert [(ts, decode_write(v)) for ts, v in cells[b"r1"][f"{WRITE}:c:v"]
                if ts == x.start_ts] == [(x.start_ts, (WriteKind.ROLLBACK, x.start_ts))]
        assert host.stats["locks_resolved"] == 1


def _a_writer_of_r1_commits_over_it(cluster: percolator.Cluster) -> None:
    """A writer of r1, X's primary left decided, commits; X's r2 stays as it was."""
    writer = Transaction(cluster)
    writer.set("t", b"r1", "c:v", b"w")
    writer.commit()
    assert Transaction(cluster).get("t", b"r1", "c:v") == b"w"
    assert Transaction(cluster).get("t", b"r2", "c:v") == b"old"


def test_a_write_over_a_primary_left_rolled_back_frees_it_and_commits(url: str) -> None:
    # X dies after its prewrite; a cleaner decides X rolled back (ROLLED_BACK, its
    # ROLLBACK record) and dies before freeing X's primary r1. Readers pass over a
    # decided rollback; a writer of r1 frees it (FREE for X, not committed) and commits.
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        x = _dies_after_its_prewrite(cluster)
        store = internals(cluster).store
        raw = store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])[b"r1"][f"{LOCK}:c:v"][0][1]
        decided = encode_lock(RolledBack(x.start_ts))
        assert lock_cas(store, "t", b"r1", f"{LOCK}:c:v", raw, decided)
        store.mutate_rows("t", [Mutation(b"r1", [(f"{WRITE}:c:v", x.start_ts,
                                                  encode_write(WriteKind.ROLLBACK, x.start_ts))])])
        assert Transaction(cluster).get("t", b"r1", "c:v") == b"old"
        _a_writer_of_r1_commits_over_it(cluster)


def test_a_primary_left_rolled_back_without_its_record_stays_rolled_back(url: str) -> None:
    # X dies after its prewrite; a cleaner decides X rolled back (ROLLED_BACK) and dies
    # before it writes the ROLLBACK record. The next resolution frees the primary with
    # no record: FREE for X, not committed, which is the record now. Neither cell shows
    # x; X's commit point (a compare-and-set from its lock), had X been only paused,
    # and a replay of its primary's prewrite (from the cell's value before X) both
    # lose; a writer of r1 commits.
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        store = internals(cluster).store
        lock_of_r1 = f"{LOCK}:c:v"

        def primary() -> bytes:
            return store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])[b"r1"][lock_of_r1][0][1]

        before_x = primary()
        x = _dies_after_its_prewrite(cluster)
        locked = primary()
        assert lock_cas(store, "t", b"r1", lock_of_r1, locked,
                        encode_lock(RolledBack(x.start_ts)))
        assert Transaction(cluster).get("t", b"r2", "c:v") == b"old"
        assert Transaction(cluster).get("t", b"r1", "c:v") == b"old"
        assert decode_lock(primary()) == Free(x.start_ts, False)
        records = store.read_rows("t", [b"r1"], [Read(WRITE, ("c:v",), versions=None)])
        assert all(decode_write(v)[1] != x.start_ts for _, v in records[b"r1"][f"{WRITE}:c:v"])
        commit_ts = internals(cluster).timestamps.get_timestamp()
        assert not lock_cas(store, "t", b"r1", lock_of_r1, locked,
                            encode_lock(Committed(x.start_ts, commit_ts)))
        assert not lock_cas(store, "t", b"r1", lock_of_r1, before_x, locked)
        assert Transaction(cluster).get("t", b"r1", "c:v") == b"old"
        _a_writer_of_r1_commits_over_it(cluster)


def test_a_write_over_a_primary_left_committed_rolls_it_forward_and_commits(
        url: str) -> None:
    # Y dies right after its commit point, its primary r1 left COMMITTED: a writer of r1
    # started since rolls Y forward (its change is below the writer's start: no
    # conflict) and commits over it.
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        _dies_after_its_commit_point(cluster)
        writer = Transaction(cluster)
        writer.set("t", b"r1", "c:v", b"w")
        writer.commit()
        assert Transaction(cluster).get("t", b"r1", "c:v") == b"w"
        assert Transaction(cluster).get("t", b"r2", "c:v") == b"y"


def test_a_reader_whose_rollback_loses_to_another_cleaner_reads_again_at_once(
        url: str) -> None:
    # X dies after locking its primary r1. A reader that may not wait at all
    # (lock_wait=0) finds r1 LOCKED by a dead owner and is about to roll X back;
    # another cleaner does it first. The reader's compare-and-set loses: X moved, so
    # it reads again at once (no wait, no LockedError) and sees r1's old value.
    with percolator.connect(url, lock_wait=0) as reader:
        _dies_after_its_prewrite(reader)
        parked = ParkedCommitter(internals(reader).store, b"r1", 1)  # its rollback CAS
        internals(reader).store = parked  # type: ignore[assignment]
        seen: list[bytes | None] = []
        parked.committer = threading.Thread(
            target=lambda: seen.append(Transaction(reader).get("t", b"r1", "c:v")))
        parked.committer.start()
        try:
            assert parked.reached.wait(30)
            with percolator.connect(url, lock_wait=10) as cleaner:
                assert Transaction(cleaner).get("t", b"r1", "c:v") == b"old"
        finally:
            parked.go.set()
            parked.committer.join()
        assert seen == [b"old"]


class RowCasNotAtomic:
    """The real store, declaring no atomic row compare-and-set (as HBase over Thrift1): a commit
    point then writes COMMITTED to its primary, released in a step of its own."""

    atomic_row_cas = False

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_a_primary_committed_by_a_later_transaction_says_nothing_of_an_earlier_one(
        url: str) -> None:
    # X dies after its prewrite; a reader rolls X's primary back, leaving X's secondary
    # locked; Y then locks the same primary cell and dies right after its commit point,
    # leaving it COMMITTED (for Y). X's secondary, met next, must still read as rolled
    # back: the primary's COMMITTED value is Y's, not X's.
    with percolator.connect(url, lock_wait=10) as reader:
        _dies_after_its_prewrite(reader)
        assert Transaction(reader).get("t", b"r1", "c:v") == b"old"
        y_client = client_of(reader)
        internals(y_client).store = RowCasNotAtomic(internals(y_client).store)  # type: ignore[assignment]
        y = Transaction(y_client)
        y.set("t", b"r1", "c:v", b"y")  # Y's primary
        y.set("t", b"r3", "c:v", b"y")
        assert crash_commit(y, CrashPoint("commit_point")) is True
        primary = internals(reader).store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])
        assert isinstance(decode_lock(primary[b"r1"][f"{LOCK}:c:v"][0][1]), Committed)
        txn = Transaction(reader)
        assert txn.get("t", b"r2", "c:v") == b"old"
        # Y's secondary: its primary, COMMITTED for Y, is rolled forward and freed.
        assert txn.get("t", b"r3", "c:v") == b"y"
        primary = internals(reader).store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])
        assert isinstance(decode_lock(primary[b"r1"][f"{LOCK}:c:v"][0][1]), Free)
        assert txn.get("t", b"r1", "c:v") == b"y"


def test_the_primarys_cells_tell_each_fate_of_its_transaction(url: str) -> None:
    """``check_txn_status`` asked of X by each state X's primary cell can be in, written
    by hand (one column of r1 each): the status it answers, in every field, and what it
    leaves in the cell. LOCKED for X: pending, that lock and its raw value; COMMITTED
    for X: committed at its commit timestamp, rolled forward (its write record, with
    its inline value, and its notify cell) and freed as committed; ROLLED_BACK for X:
    rolled back and freed as not committed; FREE with X's write record among others:
    committed at that record's timestamp; with X's ROLLBACK record, or with nothing
    left: rolled back."""
    from percolator._lock_resolver import TxnStatus, check_txn_status

    with percolator.connect(url) as cluster:
        host = internals(cluster)
        store = host.store
        x, commit_ts, other = (host.timestamps.get_timestamp() for _ in range(3))

        def status(column: str, state: Any | None, *records: tuple[int, int, WriteKind]
                   ) -> TxnStatus:
            """X's status with r1's *column* holding the lock *state* and the write
            records *records* (timestamp, start timestamp, kind)."""
            if state is not None:
                assert store.check_and_set("t", b"r1", f"{LOCK}:{column}", None,
                                           encode_lock(state))
            if records:
                store.mutate_rows("t", [Mutation(b"r1", [
                    (f"{WRITE}:{column}", ts, encode_write(kind, start_ts))
                    for ts, start_ts, kind in records])])
            lock = Lock(x, "t", b"r1", column, owner="nobody",
                        wall_ms=int(time.time() * 1000), ttl_ms=3_600_000)
            return check_txn_status(host, lock)

        def cells(column: str) -> dict[str, list[tuple[int, bytes]]]:
            return store.read_rows("t", [b"r1"], [
                Read(LOCK, (column,)), Read(WRITE, (column,), versions=None),
                Read(NOTIFY, (column,), versions=None)])[b"r1"]

        held = Lock(x, "t", b"r1", "c:locked", owner="nobody", wall_ms=1, ttl_ms=1)
        assert status("c:locked", held) == TxnStatus(
            x, pending=held, pending_raw=encode_lock(held))
        assert cells("c:locked") == {f"{LOCK}:c:locked": [(0, encode_lock(held))]}

        decided = Committed(x, commit_ts, notify=True, value=b"inline")
        assert status("c:committed", decided) == TxnStatus(x, commit_ts=commit_ts)
        assert cells("c:committed") == {
            f"{LOCK}:c:committed": [(0, encode_lock(Free(x, True)))],
            f"{WRITE}:c:committed": [(commit_ts, encode_write(WriteKind.PUT, x, b"inline"))],
            f"{NOTIFY}:c:committed": [(commit_ts, NOTIFY_STRONG)],
        }

        assert status("c:rolled", RolledBack(x)) == TxnStatus(x, rolled_back=True)
        assert cells("c:rolled") == {f"{LOCK}:c:rolled": [(0, encode_lock(Free(x, False)))]}

        # Newest first: another transaction's record above X's.
        assert status("c:put", Free(x, True), (other + 1, other, WriteKind.PUT),
                      (commit_ts, x, WriteKind.PUT)) == TxnStatus(x, commit_ts=commit_ts)
        assert status("c:rollback", Free(x, False), (other + 1, other, WriteKind.PUT),
                      (x, x, WriteKind.ROLLBACK)) == TxnStatus(x, rolled_back=True)
        assert status("c:gone", None) == TxnStatus(x, rolled_back=True)


def _dies_after_its_prewrite(cluster: percolator.Cluster) -> Transaction:
    """X, a client of *cluster*'s, writes x to r1 (its primary) and r2 and dies after
    its prewrite: both cells left locked by a dead owner."""
    x = Transaction(client_of(cluster))
    x.set("t", b"r1", "c:v", b"x")  # the primary
    x.set("t", b"r2", "c:v", b"x")
    assert crash_commit(x, CrashPoint("prewrite", 1)) is False
    return x


def _dies_after_its_commit_point(reader: percolator.Cluster) -> Transaction:
    """Y, a client of *reader*'s on a store without atomic row CAS, writes y to r1 (its
    primary) and r2 and dies right after its commit point: r1 left COMMITTED."""
    y_client = client_of(reader)
    internals(y_client).store = RowCasNotAtomic(internals(y_client).store)  # type: ignore[assignment]
    y = Transaction(y_client)
    y.set("t", b"r1", "c:v", b"y")  # the primary
    y.set("t", b"r2", "c:v", b"y")
    assert crash_commit(y, CrashPoint("commit_point")) is True
    return y


def test_a_committed_primary_met_by_a_reader_is_rolled_forward(url: str) -> None:
    # On a store without atomic row CAS the commit point leaves the primary COMMITTED
    # until its release; a reader meeting it there rolls it forward itself.
    with percolator.connect(url, lock_wait=10) as reader:
        _dies_after_its_commit_point(reader)
        assert Transaction(reader).get("t", b"r1", "c:v") == b"y"
        primary = internals(reader).store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])
        assert isinstance(decode_lock(primary[b"r1"][f"{LOCK}:c:v"][0][1]), Free)
        assert Transaction(reader).get("t", b"r2", "c:v") == b"y"


def test_a_snapshot_at_the_commit_timestamp_of_a_primary_left_committed_sees_it(
    url: str,
) -> None:
    # Y's change is at its commit timestamp: a snapshot taken there
    # (Snapshot(cluster, start_ts)) meets the COMMITTED primary at its very start and
    # rolls it forward; one just below it reads past it.
    with percolator.connect(url, lock_wait=10) as reader:
        y = _dies_after_its_commit_point(reader)
        assert y.commit_ts is not None
        with percolator.Snapshot(reader, start_ts=y.commit_ts - 1) as before:
            assert before.get("t", b"r1", "c:v") == b"old"
        with percolator.Snapshot(reader, start_ts=y.commit_ts) as at:
            assert at.get("t", b"r1", "c:v") == b"y"


def test_a_reader_without_atomic_row_cas_records_what_it_rolls_forward(url: str) -> None:
    # On a store without atomic row CAS a release writes the write records first, in
    # the lock's row, then frees the lock: a reader there that rolls Y forward (its
    # primary left COMMITTED, its secondary r2 locked) leaves both cells readable.
    with percolator.connect(url, lock_wait=10) as reader:
        _dies_after_its_commit_point(reader)
        internals(reader).store = RowCasNotAtomic(internals(reader).store)  # type: ignore[assignment]
        assert Transaction(reader).get("t", b"r2", "c:v") == b"y"
        cells = internals(reader).store.read_rows(
            "t", [b"r1", b"r2"], [Read(LOCK, ("c:v",)), Read(WRITE, ("c:v",))])
        for row in (b"r1", b"r2"):
            assert isinstance(decode_lock(cells[row][f"{LOCK}:c:v"][0][1]), Free)
            assert decode_write(cells[row][f"{WRITE}:c:v"][0][1])[0] is WriteKind.PUT
        with percolator.connect(url) as other:
            assert Transaction(other).get("t", b"r1", "c:v") == b"y"
            assert Transaction(other).get("t", b"r2", "c:v") == b"y"


class AnswerLostAfterOthersMove:
    """The real store, whose first compare-and-set (the *nth* on *row*, if given)
    applies (unless not *applied*: lost on its way), then lets *meanwhile* run (another
    client moving on, or the store going :attr:`down`), then loses its answer: a
    dropped connection. While :attr:`down`, every read fails too (counted in
    :attr:`reads_failed`)."""

    def __init__(self, store: Any, meanwhile: Any, *, row: bytes | None = None,
                 nth: int = 1, applied: bool = True) -> None:
        self._store, self._meanwhile = store, meanwhile
        self._row, self._nth, self._applied = row, nth, applied
        self.lost = 0
        self.down = False
        self.reads_failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_rows(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            self.reads_failed += 1
            raise StoreUnavailable("the store is down")
        return self._store.read_rows(*args, **kwargs)

    def check_and_set(self, *args: Any, **kwargs: Any) -> bool:
        if self.lost or (self._row is not None and args[1] != self._row):
            return bool(self._store.check_and_set(*args, **kwargs))
        self._nth -= 1
        if self._nth:
            return bool(self._store.check_and_set(*args, **kwargs))
        if self._applied:
            self._store.check_and_set(*args, **kwargs)
        self.lost += 1
        self._meanwhile()
        raise StoreUnavailable("connection lost before the answer came back")


def test_a_release_whose_answer_is_lost_after_the_cell_moved_on_reads_again(
        url: str) -> None:
    # Y dies right after its commit point (its primary left COMMITTED). A reader rolls
    # it forward; its release applies, Z locks the freed cell at once, and the
    # release's answer is lost. The cell holds Z's lock, not the reader's FREE, yet Y's
    # outcome is recorded: the reader must read again (and roll back dead Z), not fail
    # with StoreUnavailable (the bank's workers died of it on HBase with faults).
    with percolator.connect(url, lock_wait=10) as reader:
        _dies_after_its_commit_point(reader)

        def z_locks_r1() -> None:
            z = Transaction(client_of(reader))
            z.set("t", b"r1", "c:v", b"z")  # Z's primary
            z.set("t", b"r3", "c:v", b"z")
            assert crash_commit(z, CrashPoint("prewrite", 1)) is False

        store = AnswerLostAfterOthersMove(internals(reader).store, z_locks_r1)
        internals(reader).store = store  # type: ignore[assignment]
        assert Transaction(reader).get("t", b"r1", "c:v") == b"y"
        assert store.lost == 1
        primary = store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])
        z_lock = decode_lock(primary[b"r1"][f"{LOCK}:c:v"][0][1])
        assert isinstance(z_lock, Lock) and z_lock.value == b"z"
        # Y's records stand; dead Z's lock, met by a later reader, is rolled back.
        assert Transaction(reader).get("t", b"r2", "c:v") == b"y"
        assert Transaction(reader).get("t", b"r1", "c:v") == b"y"


def test_a_release_whose_answer_is_lost_while_the_store_is_down_raises_its_error(
        url: str) -> None:
    # Y dies right after its commit point (its primary left COMMITTED). A reader rolls
    # it forward; its release applies, then the store goes down and the answer is lost.
    # The cell cannot be read again (neither by lock_cas, looking for its FREE, nor by
    # release, looking for the cell moved on), so whether the release applied is
    # unknown: the reader gets the compare-and-set's own StoreUnavailable, not the
    # read's. Once the store is back, Y's outcome is there.
    with percolator.connect(url, lock_wait=10) as reader:
        _dies_after_its_commit_point(reader)

        def store_goes_down() -> None:
            store.down = True

        store = AnswerLostAfterOthersMove(internals(reader).store, store_goes_down)
        internals(reader).store = store  # type: ignore[assignment]
        with pytest.raises(StoreUnavailable, match=r"^connection lost before the answer"):
            Transaction(reader).get("t", b"r1", "c:v")
        assert store.lost == 1
        assert store.reads_failed == 2  # lock_cas's read, then release's
        store.down = False
        primary = store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])
        assert isinstance(decode_lock(primary[b"r1"][f"{LOCK}:c:v"][0][1]), Free)
        assert Transaction(reader).get("t", b"r1", "c:v") == b"y"
        assert Transaction(reader).get("t", b"r2", "c:v") == b"y"


def test_a_release_whose_answer_is_lost_tells_it_freed_nothing_once_the_cell_moved_on(
        url: str) -> None:
    # As above, release() called itself: its compare-and-set applied, Z locked the cell,
    # the answer was lost: it returns False (the caller reads again), raising nothing.
    with percolator.connect(url, lock_wait=10) as reader:
        _dies_after_its_commit_point(reader)
        host = internals(reader)
        raw = host.store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])[b"r1"][
            f"{LOCK}:c:v"][0][1]
        y = decode_lock(raw)
        assert isinstance(y, Committed)

        def z_locks_r1() -> None:
            z = Transaction(client_of(reader))
            z.set("t", b"r1", "c:v", b"z")
            assert crash_commit(z, CrashPoint("prewrite", 0)) is False

        host.store = store = AnswerLostAfterOthersMove(host.store, z_locks_r1)  # type: ignore[assignment]
        commit = (y.commit_ts, y.delete, y.notify)
        assert release(host, "t", b"r1", "c:v", raw, y.start_ts, commit, inline=y.value) is False
        assert store.lost == 1
        assert Transaction(reader).get("t", b"r2", "c:v") == b"y"


def test_a_release_lost_on_its_way_raises_its_error_while_the_cell_still_holds_the_lock(
        url: str) -> None:
    # A reader rolls Y forward; its release's compare-and-set fails without applying
    # (the connection dropped on its way). The cell still holds Y's COMMITTED value,
    # which proves nothing (the call may still be on its way): the reader gets the
    # StoreUnavailable, not a "read again". Its next read rolls Y forward.
    with percolator.connect(url, lock_wait=10) as reader:
        _dies_after_its_commit_point(reader)
        host = internals(reader)
        host.store = store = AnswerLostAfterOthersMove(  # type: ignore[assignment]
            host.store, lambda: None, applied=False)
        with pytest.raises(StoreUnavailable, match=r"^connection lost before the answer"):
            Transaction(reader).get("t", b"r1", "c:v")
        assert store.lost == 1
        primary = store.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])
        assert isinstance(decode_lock(primary[b"r1"][f"{LOCK}:c:v"][0][1]), Committed)
        assert Transaction(reader).get("t", b"r1", "c:v") == b"y"


class SlowStore:
    """The real store, with a pause before every compare-and-set (a slow network)."""

    def __init__(self, store: Any, pause: float) -> None:
        self._store, self._pause = store, pause

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def check_and_set(self, *args: Any, **kwargs: Any) -> bool:
        time.sleep(self._pause)
        return bool(self._store.check_and_set(*args, **kwargs))


def test_long_commit_refreshes_its_primary(url: str) -> None:
    ttl = 1.0  # refreshed every ttl/3: only a stall of 2/3 s could fail this test
    slow = percolator.connect(url, lock_ttl=ttl)
    internals(slow).store = SlowStore(internals(slow).store, 0.025)  # type: ignore[assignment]
    slow.one_phase_commit = False  # the two-phase path is the one that refreshes
    reader_cluster = percolator.connect(url, lock_wait=30)
    txn = Transaction(slow)
    rows = [b"r%03d" % i for i in range(150)]  # prewrite takes ~4 ttls
    for row in rows:
        txn.set("t", row, "c:q", b"v")
    seen: list[bytes | None] = []
    stop = threading.Event()

    def read_last_secondary() -> None:
        # A reader meeting the locks while the commit runs: with a stale primary it
        # would roll the live transaction back (its wall time is past the ttl).
        while not stop.is_set():
            seen.append(Transaction(reader_cluster).get("t", rows[-1], "c:q"))
            time.sleep(0.01)

    reader = threading.Thread(target=read_last_secondary)
    reader.start()
    start = time.monotonic()
    try:
        txn.commit()  # raises ConflictError if a cleaner rolled it back
    finally:
        stop.set()
        reader.join()
    assert time.monotonic() - start > 3 * ttl
    assert Transaction(reader_cluster).get("t", rows[-1], "c:q") == b"v"
    assert seen and set(seen) <= {None, b"v"}
    slow.close()
    reader_cluster.close()


def test_a_commit_whose_clean_up_fails_warns_without_a_traceback(
    url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the commit point a failed clean-up (the secondaries' commit) leaves the
    locks to readers: the commit succeeds and says so in one warning line, with no
    traceback on stderr (one read like a failure); readers roll the locks forward."""
    from percolator import StoreUnavailable
    from percolator._two_phase import TwoPhaseCommit

    def store_down(self: TwoPhaseCommit, commit_ts: int) -> None:
        raise StoreUnavailable("the store went away after the commit point")

    with percolator.connect(url) as cluster:
        cluster.one_phase_commit = False  # the paper's two phases, as on HBase
        txn = Transaction(cluster)
        txn.set("t", b"r1", "c:v", b"new")
        txn.set("t", b"r2", "c:v", b"new")
        with monkeypatch.context() as patch:
            patch.setattr(TwoPhaseCommit, "commit_secondaries", store_down)
            with caplog.at_level("WARNING", logger="percolator"):
                txn.commit()
        warnings = [r for r in caplog.records if "clean-up left to readers" in r.message]
        assert len(warnings) == 1 and warnings[0].exc_info is None
        assert "StoreUnavailable: the store went away" in warnings[0].getMessage()
        with Transaction(cluster) as reader:
            assert reader.get("t", b"r2", "c:v") == b"new"


class ParkedCommitter:
    """The real store, with one thread's commit parked before its *nth*
    compare-and-set on *row* until :attr:`go` is set; the data calls of every other
    thread on *table* listed in :attr:`calls` (``read_rows``, ``check_and_set``,
    ...)."""

    _DATA_CALLS = frozenset({"read_rows", "mutate_rows", "check_and_set", "scan",
                             "check_and_set_many", "newest_at"})

    def __init__(self, store: Any, row: bytes, nth: int, table: str = "t") -> None:
        self._store, self._row, self._nth, self._table = store, row, nth, table
        self.committer: threading.Thread | None = None
        self.reached, self.go = threading.Event(), threading.Event()
        self.calls: list[str] = []
        self._met = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in self._DATA_CALLS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not self.committer:
                if args and args[0] == self._table:  # not the clients' own bookkeeping
                    self.calls.append(name)
            elif name == "check_and_set" and args[1] == self._row:
                self._met += 1
                if self._met == self._nth:
                    self.reached.set()
                    assert self.go.wait(30)
            return attr(*args, **kwargs)

        return call


@contextmanager
def _committer_parked(parked: ParkedCommitter) -> Iterator[None]:
    """Runs *parked*'s committer until it parks; when the block ends (however), lets
    it go and waits for its end."""
    parked.committer.start()  # type: ignore[union-attr]
    try:
        assert parked.reached.wait(30)
        yield
    finally:
        parked.go.set()
        parked.committer.join()  # type: ignore[union-attr]


def _transfer_parked(cluster: Any, row: bytes, nth: int) -> tuple[ParkedCommitter, Any]:
    """A transfer (r1 its primary, r2 its secondary) committing in a thread of
    *cluster*'s own client, parked before its *nth* compare-and-set on *row*."""
    parked = ParkedCommitter(internals(cluster).store, row, nth)
    internals(cluster).store = parked  # type: ignore[assignment]
    txn = Transaction(cluster)
    txn.set("t", b"r1", "c:v", b"new")
    txn.set("t", b"r2", "c:v", b"new")
    parked.committer = threading.Thread(target=txn.commit)
    return parked, txn


def test_a_read_past_a_commit_of_its_own_client_drawn_above_it_does_not_wait(
    url: str,
) -> None:
    """A commit of the reader's own client holds r2's lock, parked at its commit point
    with its commit timestamp drawn above the reader's start: the lock hides nothing
    from that reader, which its committer tells it (``CommitsInFlight``): it reads
    r2's old value in its one row read. Resolved through the store, the lock of a live
    owner within its ttl makes it wait out its lock wait: LockedError."""
    with percolator.connect(url, lock_wait=0.5) as cluster:
        cluster.one_phase_commit = False
        parked, _ = _transfer_parked(cluster, b"r1", 2)  # the commit point's
        reader = Transaction(cluster)
        assert reader.start_ts
        with _committer_parked(parked):
            assert reader.get("t", b"r2", "c:v") == b"old"
            assert parked.calls == ["read_rows"]
        assert Transaction(cluster).get("t", b"r2", "c:v") == b"new"


def test_a_read_after_a_commit_point_of_its_own_client_sees_it_before_its_release(
    url: str,
) -> None:
    """A commit of the reader's own client has passed its commit point and is parked
    before it releases its secondary r2: a reader started since reads r2's new value
    from its committer, in its one row read, without asking the primary or rolling r2
    forward itself (which the committer does next). Resolved through the store, it
    reads the primary, rolls r2 forward and reads r2 again: 4 store calls."""
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        parked, holder = _transfer_parked(cluster, b"r2", 2)  # the secondary's release
        with _committer_parked(parked):
            reader = Transaction(cluster)
            assert reader.start_ts > holder.commit_ts
            assert reader.get("t", b"r2", "c:v") == b"new"
            assert parked.calls == ["read_rows"]
        lock = internals(cluster).store.read_rows("t", [b"r2"], [Read(LOCK, ("c:v",))])
        assert isinstance(decode_lock(lock[b"r2"][f"{LOCK}:c:v"][0][1]), Free)


def test_a_read_of_a_commit_of_its_own_client_still_locking_waits_for_it(url: str) -> None:
    """A commit of the reader's own client has locked its primary r1 and is parked
    before it locks r2: it has no commit timestamp yet, so its committer cannot tell
    the reader anything (``CommitsInFlight``): the reader waits for it as for any live
    owner within its ttl, and past its lock wait raises LockedError; once the commit
    goes on, it reads the new value."""
    with percolator.connect(url, lock_wait=0.3) as cluster:
        cluster.one_phase_commit = False
        parked, _ = _transfer_parked(cluster, b"r2", 1)  # the secondary's prewrite
        with (_committer_parked(parked),
              pytest.raises(percolator.LockedError, match="still alive")):
            Transaction(cluster).get("t", b"r1", "c:v")
        assert Transaction(cluster).get("t", b"r1", "c:v") == b"new"


class _GoOnOnceWaitedFor(threading.Condition):
    """A client's condition (``CommitsInFlight``) that lets a parked commit go on once a
    reader waits on it, each wait's timeout listed in :attr:`waits`: the commit's tell
    needs the lock that the wait lets go, so it comes after the reader waits."""

    def __init__(self, parked: ParkedCommitter) -> None:
        super().__init__(threading.Lock())
        self._parked = parked
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self._parked.go.set()
        return super().wait(timeout)


def _resolver_clock_stopped(monkeypatch: pytest.MonkeyPatch, ahead: float = 0.0) -> None:
    """Stop the lock resolver's monotonic clock, so that a reader's wait on a commit of
    its own client ends only when that commit tells something (however slow the
    machine), and set its wall clock *ahead* seconds."""
    from percolator import _lock_resolver

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return 1000.0

        @staticmethod
        def time() -> float:
            return time.time() + ahead

    monkeypatch.setattr(_lock_resolver, "time", Clock)


def test_a_read_waits_for_a_commit_of_its_own_client_to_tell_its_outcome(
    url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit of the reader's own client is parked at its commit point, its commit
    timestamp drawn below the reader's start: whether r2's lock hides a change the
    reader sees depends on the outcome, which its committer tells as soon as it knows
    (``CommitsInFlight``). The reader waits on its client's condition, not on the store:
    the commit goes on once the reader waits, and the reader then reads r2's new value
    in its one row read."""
    _resolver_clock_stopped(monkeypatch)
    with percolator.connect(url, lock_wait=0.3) as cluster:
        cluster.one_phase_commit = False
        parked, holder = _transfer_parked(cluster, b"r1", 2)  # the commit point's
        in_flight = internals(cluster).in_flight
        in_flight._changed = condition = _GoOnOnceWaitedFor(parked)
        with _committer_parked(parked):
            reader = Transaction(cluster)
            assert 0 < in_flight._flights[holder.start_ts].commit_ts < reader.start_ts
            assert reader.get("t", b"r2", "c:v") == b"new"
            assert parked.calls == ["read_rows"]
            assert condition.waits and all(w is not None and w > 0 for w in condition.waits)


def test_a_read_does_not_wait_for_a_commit_of_its_own_client_past_its_ttl(
    url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, but the lock's ttl has passed (the resolver's wall clock set an hour
    ahead): the reader does not wait for its committer to tell, it resolves the lock
    through the store as any other past its ttl, rolling the commit back (which then
    fails at its commit point) and reading r2's old value."""
    _resolver_clock_stopped(monkeypatch, ahead=3600.0)
    with percolator.connect(url, lock_wait=0.3) as cluster:
        cluster.one_phase_commit = False
        parked, holder = _transfer_parked(cluster, b"r1", 2)  # the commit point's
        internals(cluster).in_flight._changed = condition = _GoOnOnceWaitedFor(parked)
        failed: list[BaseException] = []

        def commit() -> None:
            try:
                holder.commit()
            except percolator.ConflictError as error:
                failed.append(error)

        parked.committer = threading.Thread(target=commit)
        parked.committer.start()
        try:
            assert parked.reached.wait(30)
            assert Transaction(cluster).get("t", b"r2", "c:v") == b"old"
            assert condition.waits == []
        finally:
            parked.go.set()
            parked.committer.join()
        assert len(failed) == 1
        assert Transaction(cluster).get("t", b"r1", "c:v") == b"old"


def test_a_read_told_by_its_own_client_of_a_commit_rolled_back_sees_nothing_of_it(
    url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit of the reader's own client, writing r1 (its primary) and r2's column
    c:w (never written before), is parked at its commit point, its commit timestamp
    drawn below the reader's start; a cleaner rolls its primary back meanwhile. The
    reader meets r2's lock and waits for the committer, which then loses its commit
    point and tells so: the lock hides nothing, r2's c:w reads as never written (not as
    the value of a commit at its drawn timestamp, nor at any other)."""
    from percolator._lock_resolver import check_txn_status, roll_back_primary

    _resolver_clock_stopped(monkeypatch)
    with percolator.connect(url, lock_wait=0.3) as cluster:
        cluster.one_phase_commit = False
        host = internals(cluster)
        parked = ParkedCommitter(host.store, b"r1", 2)  # the commit point's
        host.store = parked  # type: ignore[assignment]
        holder = Transaction(cluster)
        holder.set("t", b"r1", "c:v", b"new")  # the primary
        holder.set("t", b"r2", "c:w", b"new")
        failed: list[BaseException] = []

        def commit() -> None:
            try:
                holder.commit()
            except percolator.ConflictError as error:
                failed.append(error)

        parked.committer = threading.Thread(target=commit)
        host.in_flight._changed = condition = _GoOnOnceWaitedFor(parked)
        parked.committer.start()
        try:
            assert parked.reached.wait(30)
            primary = parked.read_rows("t", [b"r1"], [Read(LOCK, ("c:v",))])
            lock = decode_lock(primary[b"r1"][f"{LOCK}:c:v"][0][1])
            assert isinstance(lock, Lock) and lock.start_ts == holder.start_ts
            assert roll_back_primary(host, check_txn_status(host, lock))
            reader = Transaction(cluster)
            assert reader.get("t", b"r2", "c:w") is None
            assert condition.waits
        finally:
            parked.go.set()
            parked.committer.join()
        assert len(failed) == 1


def _committed_leaving_r2_locked(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A two-phase commit of *cluster*'s client writes new to r1 (its primary) and r2,
    and its clean-up fails past its commit point: it ends committed, r2 left locked."""
    from percolator._two_phase import TwoPhaseCommit

    def store_down(self: TwoPhaseCommit, commit_ts: int) -> None:
        raise StoreUnavailable("the store went away after the commit point")

    committer = Transaction(cluster)
    committer.set("t", b"r1", "c:v", b"new")
    committer.set("t", b"r2", "c:v", b"new")
    with monkeypatch.context() as patch:
        patch.setattr(TwoPhaseCommit, "commit_secondaries", store_down)
        committer.commit()
    lock = internals(cluster).store.read_rows("t", [b"r2"], [Read(LOCK, ("c:v",))])
    assert isinstance(decode_lock(lock[b"r2"][f"{LOCK}:c:v"][0][1]), Lock)


def test_a_read_of_an_ended_commit_of_its_own_client_is_told_by_its_committer(
    url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit of the reader's own client has ended committed, r2's lock left to
    readers: its client still knows how it ended (``CommitsInFlight``), so a reader
    reads r2's new value in its one row read, neither asking the primary nor rolling
    r2 forward; a reader of another client does that, through the store."""
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        _committed_leaving_r2_locked(cluster, monkeypatch)
        counted = ParkedCommitter(internals(cluster).store, b"r1", 1)  # parks nobody
        internals(cluster).store = counted  # type: ignore[assignment]
        assert Transaction(cluster).get("t", b"r2", "c:v") == b"new"
        assert counted.calls == ["read_rows"]
        with percolator.connect(url, lock_wait=10) as other:
            assert Transaction(other).get("t", b"r2", "c:v") == b"new"
        lock = counted.read_rows("t", [b"r2"], [Read(LOCK, ("c:v",))])
        assert isinstance(decode_lock(lock[b"r2"][f"{LOCK}:c:v"][0][1]), Free)


def test_a_write_over_an_ended_commit_of_its_own_client_after_its_start_is_a_conflict(
    url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transaction writing r2 started before a commit of its own client that ended
    committed, r2's lock left to readers: its prewrite meets that lock and knows from
    its client that the commit came after its start: a conflict, found in its one row
    read, without asking the primary or rolling r2 forward."""
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        writer = Transaction(cluster)
        assert writer.start_ts
        writer.set("t", b"r2", "c:v", b"mine")
        _committed_leaving_r2_locked(cluster, monkeypatch)
        counted = ParkedCommitter(internals(cluster).store, b"r1", 1)  # parks nobody
        internals(cluster).store = counted  # type: ignore[assignment]
        with pytest.raises(percolator.ConflictError, match="after our start"):
            writer.commit()
        assert counted.calls == ["read_rows"]


def test_a_write_over_a_commit_of_its_own_client_under_way_after_its_start_is_a_conflict(
    url: str,
) -> None:
    """As above, with the commit still under way: past its commit point, parked before
    it releases r2. The writer's prewrite knows from its client that it committed after
    the writer's start: a conflict, in its one row read."""
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        writer = Transaction(cluster)
        assert writer.start_ts
        writer.set("t", b"r2", "c:v", b"mine")
        parked, _ = _transfer_parked(cluster, b"r2", 2)  # the secondary's release
        with _committer_parked(parked):
            with pytest.raises(percolator.ConflictError, match="after our start"):
                writer.commit()
            assert parked.calls == ["read_rows"]


def test_a_snapshot_at_the_commit_timestamp_of_a_commit_of_its_own_client_sees_it(
    url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A snapshot reads every commit at or below its start timestamp, one at exactly it
    too: given the commit timestamp of a commit of its own client parked at its commit
    point, it waits for the committer to tell its outcome, and reads r2's new value."""
    _resolver_clock_stopped(monkeypatch)
    with percolator.connect(url, lock_wait=0.3) as cluster:
        cluster.one_phase_commit = False
        parked, holder = _transfer_parked(cluster, b"r1", 2)  # the commit point's
        in_flight = internals(cluster).in_flight
        in_flight._changed = condition = _GoOnOnceWaitedFor(parked)
        with _committer_parked(parked):
            commit_ts = in_flight._flights[holder.start_ts].commit_ts
            with percolator.Snapshot(cluster, start_ts=commit_ts) as snapshot:
                assert snapshot.get("t", b"r2", "c:v") == b"new"
            assert condition.waits
        assert holder.commit_ts == commit_ts


def test_a_write_at_the_commit_timestamp_of_a_commit_of_its_own_client_is_no_conflict(
    url: str,
) -> None:
    """A change committed at exactly a transaction's start timestamp is in its snapshot,
    no conflict (first committer wins only over commits after the start): a writer at
    the commit timestamp of a commit of its own client, parked past its commit point
    before it releases r2, reads r2's new value and commits over it."""
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        parked, holder = _transfer_parked(cluster, b"r2", 2)  # the secondary's release
        with _committer_parked(parked):
            writer = Transaction(cluster, start_ts=holder.commit_ts)
            assert writer.get("t", b"r2", "c:v") == b"new"
            writer.set("t", b"r2", "c:v", b"newer")
            writer.commit()
        assert Transaction(cluster).get("t", b"r2", "c:v") == b"newer"


class _NoWait(threading.Condition):
    """A client's condition (``CommitsInFlight``) on which no reader may wait."""

    def __init__(self) -> None:
        super().__init__(threading.Lock())

    def wait(self, timeout: float | None = None) -> bool:
        raise AssertionError("a reader waited for a commit that has ended")


def test_a_read_of_a_commit_of_its_own_client_ended_not_knowing_its_outcome_reads_again(
    url: str,
) -> None:
    """A commit of the reader's own client applied its commit point, but lost the
    answer with the store gone: it ended not knowing its outcome (CommitUnknownError),
    r2 left locked. Its client can tell a reader nothing more; a reader meeting r2's
    lock waits for no one: it reads the row again, then resolves the lock through the
    store, rolling r2 forward."""
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        host = internals(cluster)

        def store_goes_down() -> None:
            store.down = True

        store = AnswerLostAfterOthersMove(host.store, store_goes_down, row=b"r1", nth=2)
        host.store = store  # type: ignore[assignment]
        committer = Transaction(cluster)
        committer.set("t", b"r1", "c:v", b"new")  # the primary: its 2nd CAS, the commit point
        committer.set("t", b"r2", "c:v", b"new")
        with pytest.raises(percolator.CommitUnknownError):
            committer.commit()
        assert store.lost == 1
        store.down = False
        host.in_flight._changed = _NoWait()
        counted = ParkedCommitter(store, b"r1", 1)  # parks nobody
        host.store = counted  # type: ignore[assignment]
        assert Transaction(cluster).get("t", b"r2", "c:v") == b"new"
        # The row, the row again, the primary, r2 rolled forward, the row.
        assert counted.calls == ["read_rows", "read_rows", "read_rows", "check_and_set",
                                 "read_rows"]
        lock = counted.read_rows("t", [b"r2"], [Read(LOCK, ("c:v",))])
        assert isinstance(decode_lock(lock[b"r2"][f"{LOCK}:c:v"][0][1]), Free)


def test_a_client_remembers_how_its_last_commits_ended_up_to_its_bound() -> None:
    """A client keeps how its last ``_ENDED_KEPT`` commits ended (a lock one of them left
    is read from it, and a writer meeting it knows of the conflict) and forgets older
    ones, so that its memory stays bounded: the oldest lock is then resolved through the
    store, as another client's."""
    from percolator._lock_resolver import _ENDED_KEPT, UNTOLD, CommitsInFlight

    def lock_of(start_ts: int) -> Lock:
        return Lock(start_ts, "t", b"r1", "c:v", "me", int(time.time() * 1000), 30_000)

    in_flight = CommitsInFlight()
    for start_ts in range(1, _ENDED_KEPT + 2):
        flight = in_flight.begin(start_ts)
        in_flight.tell(flight, commit_ts=start_ts + 5000)
        in_flight.tell(flight, committed=True)
        in_flight.end(start_ts)
    reader_ts = 10 * _ENDED_KEPT + 5000
    assert in_flight.settle(lock_of(1), reader_ts) is UNTOLD
    assert in_flight.committed_after(lock_of(1), 1) == 0
    for kept in (2, _ENDED_KEPT + 1):
        assert in_flight.settle(lock_of(kept), reader_ts) == (kept + 5000, True)
        assert in_flight.committed_after(lock_of(kept), kept) == kept + 5000


def test_a_released_lock_tells_its_last_holders_outcome(url: str) -> None:
    """A lock cell a commit released holds FREE for that transaction, committed: the
    value a reader told the outcome by its client keeps for its prewrite (which locks
    by compare-and-set from it where the prewrite reads nothing again), and which a
    bulk load's recomputed partition reads (rolled back, FREE says not committed:
    test_a_dead_owners_primary_is_rolled_back_and_freed_in_one_resolution)."""
    with percolator.connect(url) as cluster:
        cluster.one_phase_commit = False
        txn = Transaction(cluster)
        txn.set("t", b"r1", "c:v", b"new")
        txn.set("t", b"r2", "c:v", b"new")
        txn.commit()
        cells = internals(cluster).store.read_rows("t", [b"r1", b"r2"], [Read(LOCK, ("c:v",))])
        for row in (b"r1", b"r2"):
            assert decode_lock(cells[row][f"{LOCK}:c:v"][0][1]) == Free(txn.start_ts, True)


def test_a_read_past_a_commit_of_its_own_client_still_resolves_the_rows_other_locks(
    url: str,
) -> None:
    """r2's ``c:v`` is locked by a commit of the reader's own client, parked at its
    commit point with its commit timestamp drawn above the reader's start (nothing of it
    to see); r2's ``c:w`` by X, a commit of another client that died after its commit
    point, below the reader's start. The reader's read of both sees ``c:v``'s old value
    and X's ``c:w``, which it rolls forward through the store.

    Guards ``Snapshot._settled`` going on to the row's next lock after one that hides
    nothing (stopping there, the read goes past X's lock: ``c:w`` absent), and reading
    the row again at once only for a commit of its own client that ended not knowing its
    outcome (for X's lock too: one more ``read_rows`` before X's is resolved)."""
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        x = Transaction(client_of(cluster))
        x.set("t", b"r9", "c:v", b"x")  # the primary
        x.set("t", b"r2", "c:w", b"x")
        assert crash_commit(x, CrashPoint("commit", 0)) is True
        parked, _ = _transfer_parked(cluster, b"r1", 2)  # the commit point's
        reader = Transaction(cluster)
        assert reader.start_ts
        with _committer_parked(parked):
            assert reader.get_row("t", b"r2", ["c:v", "c:w"]) == {"c:v": b"old", "c:w": b"x"}
            # its read, X's primary, X's roll forward, its read again
            assert parked.calls == ["read_rows", "read_rows", "check_and_set", "read_rows"]


def test_a_read_after_a_commit_point_of_its_own_client_sees_its_delete_and_new_cell(
    url: str,
) -> None:
    """As the test above, the commit deleting r2's ``c:v`` and writing ``c:n``, a cell
    with no write record yet: the reader sees the delete (no ``c:v``) and the new cell,
    from the committer, before the release.

    Guards the write records ``Snapshot._settled`` makes of the commit's locks: a
    delete's (as a put, ``c:v`` reads as an empty value) and the first of a cell (a
    column with no record in the read)."""
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        parked = ParkedCommitter(internals(cluster).store, b"r2", 3)  # r2's first release
        internals(cluster).store = parked  # type: ignore[assignment]
        holder = Transaction(cluster)
        holder.set("t", b"r1", "c:v", b"new")  # the primary
        holder.delete("t", b"r2", "c:v")
        holder.set("t", b"r2", "c:n", b"new")
        parked.committer = threading.Thread(target=holder.commit)
        parked.committer.start()
        try:
            assert parked.reached.wait(30)
            reader = Transaction(cluster)
            assert holder.commit_ts is not None and reader.start_ts > holder.commit_ts
            assert reader.get_row("t", b"r2", ["c:v", "c:n"]) == {"c:n": b"new"}
            assert parked.calls == ["read_rows"]
        finally:
            parked.go.set()
            parked.committer.join()
        assert Transaction(cluster).get_row("t", b"r2", ["c:v", "c:n"]) == {"c:n": b"new"}


def test_a_cell_read_from_its_own_clients_committer_is_locked_from_what_its_release_wrote(
    seeded_cas_sqlite_url: str,
) -> None:
    """Where a transaction's reads keep what its prewrite locks from (the embedded store
    taking HBase's path, ``CAS_SQLITE``): the reader of
    ``test_a_read_after_a_commit_point_of_its_own_client_sees_it_before_its_release``,
    which read r2 from the committer before its release, writes r2 once the committer
    is done. Its prewrite locks r2 by compare-and-set from the FREE value that release
    wrote, kept by its read: no read of its own.

    Guards ``Snapshot._settled`` keeping the lock as the FREE value the release writes
    (another value, or none: the compare-and-set fails and the prewrite reads r2)."""
    with percolator.connect(seeded_cas_sqlite_url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        parked, holder = _transfer_parked(cluster, b"r2", 2)  # the secondary's release
        with _committer_parked(parked):
            reader = Transaction(cluster)
            assert reader.start_ts > holder.commit_ts
            assert reader.get("t", b"r2", "c:v") == b"new"
        parked.calls.clear()
        reader.set("t", b"r2", "c:v", b"mine")
        reader.commit()
        assert "read_rows" not in parked.calls, parked.calls
        assert Transaction(cluster).get("t", b"r2", "c:v") == b"mine"


class CommitPointAnswerLost:
    """The real store, whose compare-and-set of *row*'s lock at a commit point (its
    second there) applies and loses its answer, and which then fails every read until
    :attr:`down` is cleared: that commit cannot tell its outcome. The data calls on
    table ``t`` made once it is back are listed in :attr:`calls`."""

    def __init__(self, store: Any, row: bytes) -> None:
        self._store, self._row = store, row
        self.down, self.lost = False, False
        self.calls: list[str] = []
        self._met = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in ParkedCommitter._DATA_CALLS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down and name == "read_rows":
                raise StoreUnavailable("the store went away")
            if self.lost and args and args[0] == "t":
                self.calls.append(name)
            if name == "check_and_set" and args[1] == self._row and not self.lost:
                self._met += 1
                if self._met == 2:
                    attr(*args, **kwargs)
                    self.lost = self.down = True
                    raise StoreUnavailable("connection lost before the answer came back")
            return attr(*args, **kwargs)

        return call


@pytest.mark.parametrize("committed_primary", [False, True],
                         ids=["alone", "after-a-committed-primary"])
def test_a_read_meeting_a_commit_of_its_own_client_that_ended_unknowing_reads_again(
    url: str, committed_primary: bool
) -> None:
    """A commit of the reader's own client applies its commit point but loses the answer,
    and cannot read its primary again: it ends with CommitUnknownError, its locks left.
    A reader started since meets r2's lock: its committer, ended, cannot tell; the
    reader reads r2 again (the lock might be gone by then), then resolves it through the
    store: the primary committed, it rolls r2 forward and reads the new value. Also
    where the row holds first the COMMITTED primary of Y, another client's commit that
    died after its commit point on a store without atomic row CAS: the read again comes
    first, then both are resolved.

    Guards ``Snapshot._settled`` sending the read to read again for a commit that ended
    not knowing its outcome (without, the read goes past the lock: r2 reads old), once
    per commit (always: the read never ends; never: one ``read_rows`` fewer), and going
    on past Y's lock to the next (stopping there: Y's is resolved before the read again,
    which then reads once more)."""
    with percolator.connect(url, lock_wait=10) as cluster:
        cluster.one_phase_commit = False
        if committed_primary:
            y_client = client_of(cluster)
            internals(y_client).store = RowCasNotAtomic(  # type: ignore[assignment]
                internals(y_client).store)
            y = Transaction(y_client)
            y.set("t", b"r2", "c:a", b"y")  # the primary
            y.set("t", b"r9", "c:v", b"y")
            assert crash_commit(y, CrashPoint("commit_point")) is True
        store = CommitPointAnswerLost(internals(cluster).store, b"r1")
        internals(cluster).store = store  # type: ignore[assignment]
        holder = Transaction(cluster)
        holder.set("t", b"r1", "c:v", b"new")  # the primary
        holder.set("t", b"r2", "c:v", b"new")
        with pytest.raises(percolator.CommitUnknownError):
            holder.commit()
        store.down = False
        store.calls.clear()
        reader = Transaction(cluster)
        if not committed_primary:
            assert reader.get("t", b"r2", "c:v") == b"new"
            # its read, its read again, the primary's, r2 rolled forward, its read again
            assert store.calls == ["read_rows", "read_rows", "read_rows", "check_and_set",
                                   "read_rows"]
            return
        assert reader.get_row("t", b"r2", ["c:a", "c:v"]) == {"c:a": b"y", "c:v": b"new"}
        # its read, its read again, Y's primary released, the other primary read, r2
        # rolled forward, its read again
        assert store.calls == ["read_rows", "read_rows", "check_and_set", "read_rows",
                               "check_and_set", "read_rows"]
