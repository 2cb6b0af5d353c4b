"""Transactions: the public API on every backend."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import percolator
from percolator import Cluster, Transaction, metrics
from percolator._encoding import DATA, FREE_TAG, LOCK, META_TABLE, NOTIFY
from percolator._internals import internals
from percolator._observer_hooks import internal_columns
from percolator._store import Read
from percolator.testing import CrashPoint, client_of, crash_commit
from tests._backends import make_store_url
from tests._concurrency import hold_locks


@pytest.fixture
def accounts(cluster: Cluster) -> Cluster:
    cluster.create_table("accounts")
    cluster.create_table("audit")
    return cluster


def test_committed_writes_are_visible_to_later_transactions(accounts: Cluster) -> None:
    with Transaction(accounts) as txn:
        txn.set("accounts", b"alice", "bal:amount", b"100")
        txn.set("audit", b"1", "log:text", b"opened alice")
    assert txn.commit_ts is not None and txn.commit_ts > txn.start_ts
    reader = Transaction(accounts)
    assert reader.start_ts > txn.commit_ts
    assert reader.get("accounts", b"alice", "bal:amount") == b"100"
    assert reader.get("audit", b"1", "log:text") == b"opened alice"
    assert reader.get("accounts", b"bob", "bal:amount") is None


def test_reads_see_own_writes_and_deletes(accounts: Cluster) -> None:
    with Transaction(accounts) as txn:
        txn.set("accounts", b"a", "bal:amount", b"1")
        txn.set("accounts", b"a", "bal:note", b"x")
    txn = Transaction(accounts)
    txn.set("accounts", b"a", "bal:amount", b"2")
    txn.delete("accounts", b"a", "bal:note")
    txn.set("accounts", b"b", "bal:amount", b"3")
    assert txn.get("accounts", b"a", "bal:amount") == b"2"
    assert txn.get("accounts", b"a", "bal:note") is None
    assert txn.get_row("accounts", b"a", ["bal:amount", "bal:note"]) == {"bal:amount": b"2"}
    assert list(txn.scan("accounts")) == [
        (b"a", {"bal:amount": b"2"}),
        (b"b", {"bal:amount": b"3"}),
    ]
    txn.commit()
    after = Transaction(accounts)
    assert after.get_row("accounts", b"a", ["bal:amount", "bal:note"]) == {"bal:amount": b"2"}


def test_a_scan_merges_own_writes_into_the_stored_rows_in_row_order(accounts: Cluster) -> None:
    """Stored rows a, c, e; own writes to b (a new row), c (another column) and d (a
    delete of a cell never stored): the scan yields every row once, in row order, each
    with its stored and its own columns. Fails when the stored rows are left out of the
    merge, when rows are not merged in row order, or when different rows are joined."""
    with Transaction(accounts) as txn:
        for row in (b"a", b"c", b"e"):
            txn.set("accounts", row, "bal:amount", row)
    txn = Transaction(accounts)
    txn.set("accounts", b"b", "bal:amount", b"own b")
    txn.set("accounts", b"c", "bal:note", b"own c")
    txn.delete("accounts", b"d", "bal:amount")
    assert list(txn.scan("accounts")) == [
        (b"a", {"bal:amount": b"a"}),
        (b"b", {"bal:amount": b"own b"}),
        (b"c", {"bal:amount": b"c", "bal:note": b"own c"}),
        (b"e", {"bal:amount": b"e"}),
    ]
    txn.rollback()


def test_a_scan_shows_the_own_writes_of_its_table_range_and_columns_only(
    accounts: Cluster,
) -> None:
    """A scan of accounts from b to d (d excluded) of bal:amount, then of every user
    column: own writes to another table, to rows before b or from d on, to bal:note
    (in the first) or to a reserved family are left out, each written before one it
    shows; stored rows out of the range or its columns too. Fails when any of those is
    shown, or one in range or column is not."""
    with Transaction(accounts) as txn:
        for row in (b"a", b"c", b"e"):
            txn.set("accounts", row, "bal:amount", row)
            txn.set("accounts", row, "bal:note", b"stored note")
    txn = Transaction(accounts)
    internal_columns(txn, True)  # to write the reserved family's cell
    for row in (b"a", b"b", b"b2", b"d", b"f"):
        txn.set("audit", b"b1", "log:text", b"other table")
        txn.set("accounts", row, "bal:note", b"own note")
        txn.set("accounts", row, "_ack:q", b"reserved")
        txn.set("accounts", row, "bal:amount", b"own " + row)
    internal_columns(txn, False)
    assert list(txn.scan("accounts", b"b", b"d", ["bal:amount"])) == [
        (b"b", {"bal:amount": b"own b"}),
        (b"b2", {"bal:amount": b"own b2"}),
        (b"c", {"bal:amount": b"c"}),
    ]
    assert list(txn.scan("accounts", b"b", b"d")) == [  # every user column
        (b"b", {"bal:amount": b"own b", "bal:note": b"own note"}),
        (b"b2", {"bal:amount": b"own b2", "bal:note": b"own note"}),
        (b"c", {"bal:amount": b"c", "bal:note": b"stored note"}),
    ]
    txn.rollback()


def test_snapshot_does_not_see_later_commits(accounts: Cluster) -> None:
    with Transaction(accounts) as txn:
        txn.set("accounts", b"a", "bal:amount", b"1")
    old = Transaction(accounts)
    assert old.start_ts  # the snapshot, taken now at the latest (at its first read else)
    with Transaction(accounts) as txn:
        txn.set("accounts", b"a", "bal:amount", b"2")
        txn.set("accounts", b"c", "bal:amount", b"9")
    assert old.get("accounts", b"a", "bal:amount") == b"1"
    assert list(old.scan("accounts")) == [(b"a", {"bal:amount": b"1"})]
    assert Transaction(accounts).get("accounts", b"a", "bal:amount") == b"2"


def test_scan_range_and_columns(accounts: Cluster) -> None:
    with Transaction(accounts) as txn:
        for i in range(10):
            txn.set("accounts", b"r%02d" % i, "bal:amount", str(i).encode())
            if i % 2:
                txn.set("accounts", b"r%02d" % i, "bal:odd", b"1")
    reader = Transaction(accounts)
    rows = list(reader.scan("accounts", b"r03", b"r07"))
    assert [r for r, _ in rows] == [b"r03", b"r04", b"r05", b"r06"]
    assert rows[0][1] == {"bal:amount": b"3", "bal:odd": b"1"}
    odd = list(reader.scan("accounts", columns=["bal:odd"]))
    assert [r for r, _ in odd] == [b"r01", b"r03", b"r05", b"r07", b"r09"]


def test_a_snapshot_reads_the_large_value_of_its_own_time_not_a_later_one(
    accounts: Cluster,
) -> None:
    """As above with values too large to ride in their write records (a two-phase
    commit writes each in a data cell at its writer's start): the snapshot reads the
    data cell its write record names, not the newer one a later commit wrote."""
    accounts.one_phase_commit = False  # one phase keeps any value in its write record
    old_value, new_value = b"1" * 2048, b"2" * 2048
    with Transaction(accounts) as txn:
        txn.set("accounts", b"a", "bal:amount", old_value)
    old = Transaction(accounts)
    assert old.start_ts  # the snapshot, taken now at the latest (at its first read else)
    with Transaction(accounts) as txn:
        txn.set("accounts", b"a", "bal:amount", new_value)
    assert old.get("accounts", b"a", "bal:amount") == old_value
    assert percolator.Snapshot(accounts).get("accounts", b"a", "bal:amount") == new_value


def test_delete_then_reinsert_and_many_versions(accounts: Cluster) -> None:
    for value in (b"1", None, b"3", b"4"):
        with Transaction(accounts) as txn:
            if value is None:
                txn.delete("accounts", b"a", "bal:amount")
            else:
                txn.set("accounts", b"a", "bal:amount", value)
    assert Transaction(accounts).get("accounts", b"a", "bal:amount") == b"4"


def test_conflict_first_committer_wins_and_leaves_nothing(accounts: Cluster) -> None:
    t1, t2 = Transaction(accounts), Transaction(accounts)
    t1.set("accounts", b"a", "bal:amount", b"1")
    t2.set("accounts", b"b", "bal:amount", b"2")
    t2.set("accounts", b"a", "bal:amount", b"2")
    t1.commit()
    with pytest.raises(percolator.ConflictError) as info:
        t2.commit()
    assert info.value.start_ts == t2.start_ts
    assert info.value.row == b"a" and info.value.column == "bal:amount"
    assert info.value.conflict_ts == t1.commit_ts
    reader = Transaction(accounts)
    assert reader.get("accounts", b"a", "bal:amount") == b"1"
    assert reader.get("accounts", b"b", "bal:amount") is None
    # No lock of t2 is left behind: a new writer of b succeeds at once.
    with Transaction(accounts) as t3:
        t3.set("accounts", b"b", "bal:amount", b"3")


def test_context_manager_rolls_back_on_exception(accounts: Cluster) -> None:
    with pytest.raises(RuntimeError), Transaction(accounts) as txn:
        txn.set("accounts", b"a", "bal:amount", b"1")
        raise RuntimeError("boom")
    assert txn.closed
    assert Transaction(accounts).get("accounts", b"a", "bal:amount") is None


def test_rollback_discards(accounts: Cluster) -> None:
    txn = Transaction(accounts)
    txn.set("accounts", b"a", "bal:amount", b"1")
    txn.rollback()
    txn.rollback()
    assert Transaction(accounts).get("accounts", b"a", "bal:amount") is None


def test_transactional_retries_conflicts_and_composes(accounts: Cluster) -> None:
    with Transaction(accounts) as txn:
        txn.set("accounts", b"a", "bal:amount", b"0")
    runs = []

    @percolator.transactional
    def increment(txn: percolator.TransactionBase, row: bytes) -> int:
        runs.append(txn.start_ts)
        value = int(txn.get("accounts", row, "bal:amount") or b"0") + 1
        if len(runs) == 1:  # a competing commit lands between our read and commit
            with Transaction(accounts) as other:
                other.set("accounts", row, "bal:amount", b"10")
        txn.set("accounts", row, "bal:amount", str(value).encode())
        return value

    @percolator.transactional(retries=3)
    def twice(txn: percolator.TransactionBase) -> int:
        increment(txn, b"a")
        return increment(txn, b"a")

    assert increment(accounts, b"a") == 11
    assert len(runs) == 2
    assert twice(accounts) == 13
    assert Transaction(accounts).get("accounts", b"a", "bal:amount") == b"13"


def test_transactional_gives_up_after_its_retries(accounts: Cluster) -> None:
    @percolator.transactional(retries=2)
    def always_conflicts(txn: percolator.TransactionBase) -> None:
        txn.get("accounts", b"a", "bal:amount")
        with Transaction(accounts) as other:
            other.set("accounts", b"a", "bal:amount", b"x")
        txn.set("accounts", b"a", "bal:amount", b"y")

    with pytest.raises(percolator.ConflictError):
        always_conflicts(accounts)


def test_tables(cluster: Cluster) -> None:
    cluster.create_table("t1")
    cluster.create_table("t1")
    cluster.create_table("t2")
    assert cluster.tables() == ["t1", "t2"]
    cluster.drop_table("t2")
    assert cluster.tables() == ["t1"]


@pytest.mark.parametrize("one_phase", [True, False], ids=["one-phase", "two-phase"])
def test_a_rollback_record_does_not_hide_a_conflicting_commit(
    accounts: Cluster, one_phase: bool
) -> None:
    # The prewrite's conflict check reads only the newest write record at or above
    # start_ts; a rollback record there (at a later transaction's start_ts) must not
    # hide a commit made after our start underneath it.
    accounts.one_phase_commit = one_phase
    mine = Transaction(accounts)
    with Transaction(accounts) as winner:
        winner.set("accounts", b"alice", "bal:amount", b"winner")
    dying_client = client_of(accounts)
    dying = Transaction(dying_client)
    assert dying.start_ts > winner.commit_ts  # type: ignore[operator]
    dying.set("accounts", b"alice", "bal:amount", b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert Transaction(accounts).get("accounts", b"alice", "bal:amount") == b"winner"
    # a rollback record now sits at dying.start_ts, above the winner's write record
    mine.set("accounts", b"alice", "bal:amount", b"lost update")
    with pytest.raises(percolator.ConflictError, match="after our start"):
        mine.commit()
    assert Transaction(accounts).get("accounts", b"alice", "bal:amount") == b"winner"


def _gc_overtakes_the_read(
    c: Cluster, snapshot: percolator.Snapshot, monkeypatch: pytest.MonkeyPatch,
    at: Callable[[list[Read]], bool],
) -> None:
    """*snapshot* reads accounts/a/bal:amount; just before the first store read that
    *at* picks, a GC pass overtakes it. The read raises SnapshotTooOldError."""
    store = internals(c).store
    read_rows = store.read_rows
    passes: list[int] = []

    def collected_first(table: str, rows: list[bytes], reads: list[Read]) -> object:
        if not passes and at(reads):
            passes.append(snapshot.start_ts)  # once: the pass reads through here too
            summary = c.gc(retention=0, max_txn_age=1e-9)
            assert summary.safe_point > snapshot.start_ts
        return read_rows(table, rows, reads)

    monkeypatch.setattr(store, "read_rows", collected_first)
    with pytest.raises(percolator.SnapshotTooOldError):
        snapshot.get("accounts", b"a", "bal:amount")
    assert passes


def test_a_read_whose_rollback_record_gc_removes_under_it_is_too_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell's only record at or below a snapshot's start is a rollback record (a dead
    writer's, rolled back), so its read looks below it in a second store call; a GC
    pass that overtakes the snapshot runs in between and removes the cell. The read
    raises SnapshotTooOldError, as any read that GC overtook, not an error of the
    records it no longer finds."""
    with percolator.connect(f"sqlite:{tmp_path / 'repo.db'}", safe_point_refresh=0.02) as c:
        c.create_table("accounts")
        dead = Transaction(client_of(c))
        dead.set("accounts", b"a", "bal:amount", b"lost")
        assert crash_commit(dead, CrashPoint("prewrite", 0)) is False
        assert Transaction(c).get("accounts", b"a", "bal:amount") is None  # rolled back
        snapshot = percolator.Snapshot(c)
        _gc_overtakes_the_read(c, snapshot, monkeypatch,  # before the look below
                               lambda reads: any(read.versions is None for read in reads))


def test_a_row_read_goes_past_a_column_whose_only_record_is_a_rollback(
    accounts: Cluster,
) -> None:
    """A dead writer's write, rolled back, is the only record of bal:amount (the row's
    first column): a read of the row (``get_row``, ``scan``) leaves that column out and
    goes on to the row's other columns."""
    dead = Transaction(client_of(accounts))
    dead.set("accounts", b"a", "bal:amount", b"lost")
    assert crash_commit(dead, CrashPoint("prewrite", 0)) is False
    assert Transaction(accounts).get("accounts", b"a", "bal:amount") is None  # rolled back
    with Transaction(accounts) as txn:
        txn.set("accounts", b"a", "bal:owner", b"ann")
    snapshot = percolator.Snapshot(accounts)
    assert snapshot.get_row("accounts", b"a", ["bal:amount", "bal:owner"]) == {
        "bal:owner": b"ann"}
    assert list(percolator.Snapshot(accounts).scan("accounts")) == [
        (b"a", {"bal:owner": b"ann"})]


def test_a_read_whose_data_cell_gc_removes_under_it_is_too_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above with a large value: the snapshot's write record names a data cell, read
    in a second store call; a GC pass that overtakes the snapshot runs in between and
    removes it (a newer commit replaced the value). The read raises
    SnapshotTooOldError, not an error of the data cell it no longer finds."""
    with percolator.connect(f"sqlite:{tmp_path / 'repo.db'}", safe_point_refresh=0.02) as c:
        c.create_table("accounts")
        c.one_phase_commit = False  # one phase keeps any value in its write record
        with Transaction(c) as txn:
            txn.set("accounts", b"a", "bal:amount", b"1" * 2048)
        snapshot = percolator.Snapshot(c)
        with Transaction(c) as txn:
            txn.set("accounts", b"a", "bal:amount", b"2" * 2048)
        _gc_overtakes_the_read(c, snapshot, monkeypatch,  # before the data read
                               lambda reads: any(read.family == DATA for read in reads))


def test_a_read_told_to_stop_waiting_gives_up_on_a_live_lock_at_once(
    accounts: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that stops sets its runs' stop event (``ObserverRun.stop_waiting_on``):
    a read meeting a live writer's lock then raises LockedError after one try, where
    the cluster's lock wait (three tries here) reads the row again twice more. The
    error names the cell and the lock's holder; the time waited is counted."""
    writer = client_of(accounts)
    writer.one_phase_commit = False
    held = Transaction(writer)
    held.set("accounts", b"a", "bal:amount", b"new")
    hold_locks(held)
    internals(accounts).lock_wait_policy = percolator.RetryPolicy(
        max_tries=3, delay=0.01, max_delay=0.01, deadline=None)
    store = internals(accounts).store
    read_rows = store.read_rows
    reads: list[object] = []

    def counted(*args: object) -> object:
        reads.append(args)
        return read_rows(*args)

    monkeypatch.setattr(store, "read_rows", counted)
    tries = []
    for stop in (True, False):
        snapshot = percolator.Snapshot(accounts)
        if stop:
            snapshot._stop_waiting = threading.Event()
            snapshot._stop_waiting.set()
        reads.clear()
        waited = metrics.snapshot()[0].get(("percolator_lock_wait_seconds_total", ()), 0.0)
        began = time.monotonic()
        with pytest.raises(percolator.LockedError) as locked:
            snapshot.get("accounts", b"a", "bal:amount")
        elapsed = time.monotonic() - began
        waited = metrics.snapshot()[0][("percolator_lock_wait_seconds_total", ())] - waited
        tries.append(len(reads))
        error = locked.value
        assert (error.table, error.row, error.column, error.lock_ts) == (
            "accounts", b"a", "bal:amount", held.start_ts)
        assert str(error).startswith(
            f"accounts/b'a'/bal:amount is locked by transaction {held.start_ts} (owner "
            f"{internals(writer).coordination.current_owner()}), still alive after waiting ")
        assert 0 <= waited <= elapsed and (stop or waited > 0)
    assert 0 < tries[0] < tries[1]


def test_get_rows_reads_many_rows_in_one_store_call(
    accounts: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Transaction(accounts) as txn:
        for i in range(5):
            txn.set("accounts", b"r%d" % i, "bal:amount", b"%d" % i)
        txn.set("accounts", b"r1", "bal:note", b"n1")
    txn = Transaction(accounts)
    txn.set("accounts", b"r2", "bal:amount", b"own")
    txn.delete("accounts", b"r3", "bal:amount")
    read_rows = internals(accounts).store.read_rows
    calls = []

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return read_rows(*args, **kwargs)

    monkeypatch.setattr(internals(accounts).store, "read_rows", counted)
    found = txn.get_rows("accounts", [b"r0", b"r1", b"r1", b"r2", b"r3", b"nobody"],
                         ["bal:amount", "bal:note"])  # a row named twice, read once
    assert found == {
        b"r0": {"bal:amount": b"0"},
        b"r1": {"bal:amount": b"1", "bal:note": b"n1"},
        b"r2": {"bal:amount": b"own"},
        b"r3": {},
        b"nobody": {},
    }
    # The client's safe point reads its own meta table when its last reading is older
    # than its refresh (a second, which a loaded machine can spend between two lines):
    # not the rows' business.
    assert [c[0] for c in calls if c[0] != META_TABLE] == ["accounts"]
    monkeypatch.undo()
    for row, values in found.items():
        assert txn.get_row("accounts", row, ["bal:amount", "bal:note"]) == values
    with pytest.raises(percolator.InvalidArgument, match=r"^rows must be an iterable of bytes"):
        txn.get_rows("accounts", b"r0", ["bal:amount"])
    with pytest.raises(percolator.InvalidArgument):
        txn.get_rows("accounts", [b"r0"], ["no-family"])


def test_get_rows_waits_out_and_resolves_a_lock_like_get_row(accounts: Cluster) -> None:
    with Transaction(accounts) as txn:
        txn.set("accounts", b"a", "bal:amount", b"1")
        txn.set("accounts", b"b", "bal:amount", b"1")
    crashed = Transaction(accounts)
    crashed.set("accounts", b"a", "bal:amount", b"2")
    crashed.set("accounts", b"b", "bal:amount", b"2")
    crash_commit(crashed, CrashPoint("commit_point"))  # committed, secondaries still locked
    reader = Transaction(accounts)
    assert reader.get_rows("accounts", [b"a", b"b"], ["bal:amount"]) == {
        b"a": {"bal:amount": b"2"}, b"b": {"bal:amount": b"2"}}


def test_rows_that_meet_a_lock_are_read_again_for_the_columns_asked_only(
    accounts: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows a and b hold bal:amount and bal:note; a commit that crashed after its commit
    point left b's bal:amount locked. A scan, then (after another such crash) a
    ``get_rows``, of bal:amount: each returns bal:amount alone, and no store read
    asks for another column (the row read again after the lock, nor the first read),
    so a lock on a column not asked for could not make them wait."""
    with Transaction(accounts) as txn:
        for row in (b"a", b"b"):
            txn.set("accounts", row, "bal:amount", b"1")
            txn.set("accounts", row, "bal:note", b"n")
    store = internals(accounts).store
    read_rows, scan = store.read_rows, store.scan
    asked: list[tuple[str, ...] | None] = []

    def noted_read_rows(table: str, rows: list[bytes], reads: list[Read]) -> object:
        asked.extend(read.qualifiers for read in reads)
        return read_rows(table, rows, reads)

    def noted_scan(table: str, start: object, stop: object, reads: list[Read]) -> object:
        asked.extend(read.qualifiers for read in reads)
        return scan(table, start, stop, reads)

    monkeypatch.setattr(store, "read_rows", noted_read_rows)
    monkeypatch.setattr(store, "scan", noted_scan)
    for value, read in ((b"2", "scan"), (b"3", "get_rows")):
        crashed = Transaction(client_of(accounts))
        crashed.set("accounts", b"a", "bal:amount", value)
        crashed.set("accounts", b"b", "bal:amount", value)
        crash_commit(crashed, CrashPoint("commit_point"))  # committed, b still locked
        asked.clear()
        reader = Transaction(accounts)
        found = (dict(reader.scan("accounts", columns=["bal:amount"])) if read == "scan"
                 else reader.get_rows("accounts", [b"a", b"b"], ["bal:amount"]))
        assert found == {b"a": {"bal:amount": value}, b"b": {"bal:amount": value}}, read
        assert len(asked) > 2 and set(asked) == {("bal:amount",)}, read  # b read again
        reader.rollback()


@pytest.fixture
def cas_accounts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """The embedded store taking HBase's path (``CAS_SQLITE``), with the accounts table."""
    with percolator.connect(make_store_url("cas-sqlite", request, tmp_path)) as c:
        c.create_table("accounts")
        yield c


def test_a_free_lock_read_before_a_held_one_does_not_end_the_look_at_the_locks(
    cas_accounts: Cluster,
) -> None:
    """On the embedded store taking HBase's path (``CAS_SQLITE``) a transaction's row
    read brings every lock cell, FREE ones too (what its prewrite would read): the
    FREE lock an earlier commit left on a's bal:amount comes before the lock a commit
    that crashed after its commit point left on a's bal:note. The read still meets
    that lock, rolls the commit forward and returns its value."""
    with Transaction(cas_accounts) as txn:
        txn.set("accounts", b"a", "bal:amount", b"1")
        txn.set("accounts", b"a", "bal:note", b"old")
    crashed = Transaction(client_of(cas_accounts))
    crashed.set("accounts", b"0", "bal:amount", b"2")
    crashed.set("accounts", b"a", "bal:note", b"new")
    assert crash_commit(crashed, CrashPoint("commit_point")) is True
    locks = internals(cas_accounts).store.read_rows("accounts", [b"a"], [Read(LOCK)])[b"a"]
    assert [n for n, v in locks.items() if v[0][1][:1] == FREE_TAG] == ["l:bal:amount"]
    reader = Transaction(cas_accounts)
    assert reader.get_row("accounts", b"a", ["bal:amount", "bal:note"]) == {
        "bal:amount": b"1", "bal:note": b"new"}
    reader.rollback()


def test_a_transactions_reads_on_the_cas_path_ask_for_the_columns_asked_only(
    cas_accounts: Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the embedded store taking HBase's path (``CAS_SQLITE``) a transaction's read
    brings what its prewrite would read (the lock whatever its state, the write
    records after its start too), of the columns asked only: a live lock on another
    column of the row (taken by a writer that started first) does not make it wait, and
    no store read asks for another column (nor for every column)."""
    with Transaction(cas_accounts) as txn:
        txn.set("accounts", b"a", "bal:amount", b"1")
        txn.set("accounts", b"a", "bal:note", b"n")
    holder = Transaction(client_of(cas_accounts))
    holder.set("accounts", b"a", "bal:note", b"held")
    assert holder.start_ts
    reader = Transaction(cas_accounts)
    assert reader.start_ts > holder.start_ts
    hold_locks(holder)
    internals(cas_accounts).lock_wait_policy = percolator.RetryPolicy(
        max_tries=2, delay=0.01, max_delay=0.01, deadline=None)
    store = internals(cas_accounts).store
    read_rows = store.read_rows
    asked: list[tuple[str, ...] | None] = []

    def noted(table: str, rows: list[bytes], reads: list[Read]) -> object:
        asked.extend(read.qualifiers for read in reads)
        return read_rows(table, rows, reads)

    monkeypatch.setattr(store, "read_rows", noted)
    assert reader.get("accounts", b"a", "bal:amount") == b"1"
    assert asked and set(asked) == {("bal:amount",)}
    reader.rollback()


def test_a_commit_at_the_timestamp_just_above_a_readers_start_is_a_conflict_for_it(
    cas_accounts: Cluster,
) -> None:
    """On the embedded store taking HBase's path (``CAS_SQLITE``) a transaction's read
    keeps, for its prewrite, the write records after its start: W, begun first, commits
    at the very next timestamp after T's start; T reads the cell after that, writes it
    and commits: a conflict (first committer wins), not a lost update."""
    w = Transaction(cas_accounts)
    w.set("accounts", b"a", "bal:amount", b"w")
    assert w.start_ts
    t = Transaction(cas_accounts)
    assert t.start_ts > w.start_ts
    assert w.commit() == t.start_ts + 1
    assert t.get("accounts", b"a", "bal:amount") is None  # W committed after T began
    t.set("accounts", b"a", "bal:amount", b"lost update")
    with pytest.raises(percolator.ConflictError, match="after our start"):
        t.commit()
    assert percolator.Snapshot(cas_accounts).get("accounts", b"a", "bal:amount") == b"w"


@pytest.mark.parametrize("one_phase", [True, False], ids=["one-phase", "two-phase"])
def test_a_commit_that_makes_a_notification_wakes_this_processs_workers(
    accounts: Cluster, one_phase: bool
) -> None:
    """A commit that makes a notification (a write of an observed column, or a weak
    one alone) wakes this process's idle workers at once (``Internals.wakeups``, which
    a worker's scanners listen on); one that makes none leaves them asleep. So does
    each committed member of a group commit."""
    from percolator._commit import commit_group

    accounts.one_phase_commit = one_phase
    accounts.observe("accounts", "bal:amount")
    rung: list[int] = []
    wakeups = internals(accounts).wakeups
    wakeups.append(lambda: rung.append(1))
    try:
        with Transaction(accounts) as quiet:
            quiet.set("accounts", b"alice", "bal:note", b"not observed")
        assert rung == []
        with Transaction(accounts) as strong:
            strong.set("accounts", b"alice", "bal:amount", b"1")
        assert rung == [1]
        with Transaction(accounts) as weak:
            weak.notify("accounts", b"bob", "bal:amount")
        assert rung == [1, 1]
        # It writes no cell, yet commits at a timestamp of its own, its notification's.
        assert weak.commit_ts is not None and weak.commit_ts > weak.start_ts
        notify = f"{NOTIFY}:bal:amount"
        found = internals(accounts).store.read_rows(
            "accounts", [b"bob"], [Read(NOTIFY, ("bal:amount",))])
        assert [ts for ts, _ in found[b"bob"][notify]] == [weak.commit_ts]
        with Transaction(accounts) as read_only:  # commits at its start, nothing rung
            read_only.get("accounts", b"alice", "bal:amount")
        assert read_only.commit_ts == read_only.start_ts
        members = [Transaction(accounts) for _ in range(2)]
        members[0].set("accounts", b"carol", "bal:note", b"not observed")
        members[1].set("accounts", b"carol", "bal:amount", b"2")
        assert all(isinstance(o, int) for o in commit_group(members))
        assert rung == [1, 1, 1]
    finally:
        wakeups.pop()
