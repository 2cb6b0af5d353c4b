"""The two-phase prewrite on every backend: each conflict condition, checked either
by a read and a compare-and-set or, where the store offers ``set_unless``
(Bigtable), by the guards of one conditional mutation; and the store calls a commit
takes on the remote backends."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import Observer, Worker
from percolator import Cluster, ConflictError, Transaction, TransactionBase
from percolator import _commit_checks as commit_checks
from percolator import _two_phase as two_phase
from percolator._commit import commit_transaction
from percolator._encoding import (
    LOCK,
    META_TABLE,
    WRITE,
    Free,
    Lock,
    RolledBack,
    WriteKind,
    decode_lock,
    decode_write,
    encode_lock,
    encode_write,
)
from percolator._internals import internals
from percolator._lock_resolver import UNTOLD
from percolator._notifications import pending_notifications
from percolator._store import Mutation, Read
from percolator._timestamps import NextStart, StoreTimestamps
from percolator._transaction import _SEEN_MAX
from percolator._two_phase import TwoPhaseCommit, committed_anyway
from percolator.testing import (
    Actor,
    CrashPoint,
    Interleaving,
    SimulatedCrash,
    client_of,
    crash_commit,
)
from tests._backends import BIGTABLE, CAS_SQLITE, SQLITE, WITH_THRIFT1, backend_fixture
from tests._concurrency import hold_locks

# And the embedded store taking HBase's path (CAS_SQLITE): the prewrite locks from what
# the transaction's reads kept.
backend = backend_fixture([*WITH_THRIFT1, CAS_SQLITE])

T, C = "accounts", "bal:amount"
KEEPS_READS = ("hbase", "hbase-thrift1", "cas-sqlite")
"""The backends whose transactions keep what their reads saw of each cell for the
prewrite (``Snapshot._read_state``): no lock census, no ``set_unless``, no atomic steps."""


@pytest.fixture
def accounts(cluster: Cluster) -> Cluster:
    cluster.one_phase_commit = False  # the two-phase path on every backend
    cluster.create_table(T)
    return cluster


def test_a_rollback_record_at_our_start_is_a_conflict(accounts: Cluster) -> None:
    # A transaction rolled back by a cleaner must not commit later (a zombie client
    # that still believes in it): the rollback record sits at its start_ts.
    dying = Transaction(client_of(accounts))
    dying.set(T, b"alice", C, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert Transaction(accounts).get(T, b"alice", C) is None  # rolls it back
    zombie = Transaction(accounts, start_ts=dying.start_ts)
    zombie.set(T, b"alice", C, b"never")
    with pytest.raises(percolator.ConflictError) as refused:
        zombie.commit()
    conflict = refused.value
    assert str(conflict) == (f"write-write conflict on {T}/b'alice'/{C}: this transaction "
                             f"was rolled back (transaction {dying.start_ts})")
    assert (conflict.start_ts, conflict.conflict_ts, conflict.table, conflict.row,
            conflict.column) == (dying.start_ts, dying.start_ts, T, b"alice", C)
    assert Transaction(accounts).get(T, b"alice", C) is None


@pytest.mark.parametrize("newer", [False, True], ids=["alone", "under-a-newer-commit"])
def test_a_rolled_back_transaction_that_read_its_cell_first_is_a_conflict(
    accounts: Cluster, backend: str, newer: bool
) -> None:
    """The zombie above, reading alice before it writes her: its read sees the value
    below its start (a rollback record is no value), under a commit made since too,
    and its commit is a conflict, decided before any store call where the read's state
    is kept for the prewrite.

    Guards ``Snapshot._remember`` keeping the write records at start_ts too (a kept
    state without the rollback record lets the zombie lock and commit: "never") and
    leaving them visible to the read (alice None under the newer commit), and leaving
    out only a rollback record above start_ts (one at it sends the prewrite to read)."""
    with Transaction(accounts) as first:
        first.set(T, b"alice", C, b"old")
    dying = Transaction(client_of(accounts))
    dying.set(T, b"alice", C, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert Transaction(accounts).get(T, b"alice", C) == b"old"  # rolls it back
    if newer:
        with Transaction(accounts) as winner:
            winner.set(T, b"alice", C, b"winner")
    zombie = Transaction(accounts, start_ts=dying.start_ts)
    assert zombie.get(T, b"alice", C) == b"old"
    zombie.set(T, b"alice", C, b"never")
    counted = _Counted(internals(accounts).store)
    internals(accounts).store = counted  # type: ignore[assignment]
    with pytest.raises(percolator.ConflictError,
                       match="after our start" if newer else "rolled back"):
        zombie.commit()
    if backend in KEEPS_READS:  # (the observed columns' registry may be read)
        assert not [call for call in counted.calls if call[1] == T], counted.calls
    assert Transaction(accounts).get(T, b"alice", C) == (b"winner" if newer else b"old")


def test_a_rollback_record_since_our_start_hides_no_commit_below_it(accounts: Cluster) -> None:
    """We start; a commit writes bob; a transaction locks bob, dies, and a reader rolls
    it back: its rollback record is the newest of bob's records, above that commit. We
    read bob (0, our snapshot) and write him: a conflict, the commit stands.

    Guards ``Snapshot._remember`` leaving out a cell whose newest record after start_ts
    is a rollback record (the read brings only the newest, which may hide a commit; the
    prewrite reads the cell itself): kept, our compare-and-set from the dead
    transaction's FREE lock succeeds and we commit over that commit (a lost update)."""
    with Transaction(accounts) as seed:
        seed.set(T, b"bob", C, b"0")
    mine = Transaction(accounts)
    assert mine.start_ts
    with Transaction(accounts) as since:
        since.set(T, b"bob", C, b"7")
    dying = Transaction(client_of(accounts))
    dying.set(T, b"bob", C, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert Transaction(accounts).get(T, b"bob", C) == b"7"  # rolls it back
    assert mine.get(T, b"bob", C) == b"0"
    mine.set(T, b"bob", C, b"1")
    with pytest.raises(percolator.ConflictError, match="after our start") as info:
        mine.commit()
    assert info.value.conflict_ts == since.commit_ts
    assert Transaction(accounts).get(T, b"bob", C) == b"7"


def _read_by(txn: Transaction, how: str, rows: list[bytes]) -> dict[bytes, dict[str, bytes]]:
    """*rows*' column C as *txn* reads them *how*."""
    if how == "get":
        found = {row: txn.get(T, row, C) for row in rows}
        return {row: {C: value} if value is not None else {} for row, value in found.items()}
    if how == "get_row":
        return {row: txn.get_row(T, row, [C]) for row in rows}
    if how == "get_rows":
        return txn.get_rows(T, rows, [C])
    columns = None if how == "scan-whole-rows" else [C]
    scanned = dict(txn.scan(T, None, None, columns))  # a row with no value is not there
    return {row: scanned.get(row, {}) for row in rows}


def _reads_of_commit(cluster: Cluster, txn: Transaction) -> int:
    """Commits *txn*, and says how many reads of the table it made."""
    store = internals(cluster).store
    counted = _Counted(store)
    internals(cluster).store = counted  # type: ignore[assignment]
    try:
        txn.commit()
    finally:
        internals(cluster).store = store  # type: ignore[assignment]
    return counted.calls[("read_rows", T)]


@pytest.mark.parametrize("how", ["get", "get_row", "get_rows", "scan", "scan-whole-rows"])
def test_a_commit_reads_nothing_of_the_cells_its_transaction_read(
    backend: str, how: str, request: pytest.FixtureRequest
) -> None:
    """A transaction reads cells, then writes them: where its reads keep what they saw
    (``Snapshot._remember``, each read path), the prewrite locks each cell from that,
    with no read of its own. The cells: one committed, one whose only lock was a rolled
    back secondary's (a FREE lock, no write record), one with a write record and no lock
    cell (as the embedded store's one-phase commit writes it), and, read by row, one
    that does not exist (a scan does not see it). On the other backends the prewrite
    reads them (one read per table, or none: Bigtable's ``set_unless``). Each read path
    is the transaction's own: HBase runs two of them, the embedded store taking its
    path all."""
    if backend not in KEEPS_READS:
        pytest.skip("the prewrite reads every cell itself here (or checks it in its lock's "
                    "conditional mutation)")
    if backend != "cas-sqlite" and how not in ("get_rows", "scan-whole-rows"):
        pytest.skip("a read path of the transaction's own: checked on cas-sqlite")
    accounts: Cluster = request.getfixturevalue("accounts")
    with Transaction(accounts) as first:
        first.set(T, b"alice", C, b"100")
    dying = Transaction(client_of(accounts))
    dying.set(T, b"alice", C, b"never")  # the primary
    dying.set(T, b"bob", C, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 1)) is False
    assert Transaction(accounts).get(T, b"bob", C) is None  # rolls it back
    store = internals(accounts).store
    assert not store.read_rows(T, [b"bob"], [Read(WRITE, (C,))])
    committed = internals(accounts).timestamps.get_timestamp()
    store.mutate_rows(T, [Mutation(b"carol", puts=[
        (f"{WRITE}:{C}", committed, encode_write(WriteKind.PUT, committed - 1, b"7"))])])
    rows = [b"alice", b"bob", b"carol"] + ([] if how.startswith("scan") else [b"dave"])
    txn = Transaction(accounts)
    seen = {b"alice": {C: b"100"}, b"bob": {}, b"carol": {C: b"7"}, b"dave": {}}
    assert _read_by(txn, how, rows) == {row: seen[row] for row in rows}
    for row in rows:
        txn.set(T, row, C, b"new")
    assert _reads_of_commit(accounts, txn) == 0
    assert Transaction(accounts).get_rows(T, rows, [C]) == {row: {C: b"new"} for row in rows}


@pytest.mark.parametrize("backend", [CAS_SQLITE])  # what is kept is the transaction's own
@pytest.mark.parametrize("how", ["get_row", "get_rows", "scan"])
def test_a_commit_reads_nothing_of_a_column_its_row_read_found_absent(
    accounts: Cluster, backend: str, how: str
) -> None:
    """A read of two columns of a row that holds only one keeps what it saw of the
    other too (no lock cell, no write record): a commit that writes that column locks it
    from there, with no read of its own (the columns asked for, not only those found)."""
    with Transaction(accounts) as first:
        first.set(T, b"alice", C, b"100")
    other = "bal:other"
    txn = Transaction(accounts)
    if how == "get_row":
        found = {b"alice": txn.get_row(T, b"alice", [C, other])}
    elif how == "get_rows":
        found = txn.get_rows(T, [b"alice"], [C, other])
    else:
        found = dict(txn.scan(T, None, None, [C, other]))
    assert found == {b"alice": {C: b"100"}}
    txn.set(T, b"alice", other, b"new")
    assert _reads_of_commit(accounts, txn) == 0
    assert Transaction(accounts).get_row(T, b"alice", [C, other]) == {C: b"100", other: b"new"}


@pytest.mark.parametrize("backend", [CAS_SQLITE])  # what is kept is the transaction's own
def test_a_whole_row_scan_that_rolls_a_lock_forward_keeps_what_it_read_again(
    accounts: Cluster, backend: str
) -> None:
    """A scan of whole rows meets a secondary lock whose primary committed (its
    committer died after its commit point): it rolls the lock forward, reads the row
    again (every column) and keeps what that read saw, so a commit that writes the cell
    reads nothing more."""
    dying = Transaction(client_of(accounts))
    dying.set(T, b"zed", C, b"primary")
    dying.set(T, b"alice", C, b"100")
    assert crash_commit(dying, CrashPoint("commit", 0)) is True
    txn = Transaction(accounts)
    assert dict(txn.scan(T, None, None, None)) == {b"alice": {C: b"100"}, b"zed": {C: b"primary"}}
    txn.set(T, b"alice", C, b"new")
    assert _reads_of_commit(accounts, txn) == 0
    assert Transaction(accounts).get(T, b"alice", C) == b"new"


def test_the_prewrite_reads_of_a_set_of_columns_are_made_once_for_up_to_1024_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reads of a prewrite's row read (each cell's newest lock and write record)
    depend only on its columns: made once per set of columns, kept for the first 1,024
    sets (a client writing ever new columns keeps no more), made afresh beyond."""
    monkeypatch.setattr(commit_checks, "_PREWRITE_READS", {})
    sets = [(f"c:{i}", C) for i in range(1025)]
    made = [commit_checks._prewrite_reads(columns) for columns in sets]
    assert made[-1] == [Read(LOCK, sets[-1]), Read(WRITE, sets[-1])]
    kept = [commit_checks._prewrite_reads(columns) is first for columns, first in zip(
        sets, made, strict=True)]
    assert kept == [True] * 1024 + [False]
    assert len(commit_checks._PREWRITE_READS) == 1024


@pytest.mark.parametrize("backend", [CAS_SQLITE])  # the bound is the transaction's own
def test_the_cells_whose_reads_a_transaction_keeps_are_bounded(
    accounts: Cluster, backend: str
) -> None:
    """A transaction keeps what its reads saw of ``_SEEN_MAX`` cells at most (its
    memory stays bounded however much it reads): it reads that many rows, which do not
    exist, in one ``get_rows``, then one more; it writes the first and the last. Its
    prewrite locks the first from what its read kept and reads the last itself."""
    rows = [b"r%05d" % i for i in range(_SEEN_MAX + 1)]
    txn = Transaction(accounts)
    assert txn.get_rows(T, rows[:-1], [C]) == {row: {} for row in rows[:-1]}
    assert txn.get(T, rows[-1], C) is None
    txn.set(T, rows[0], C, b"first")
    txn.set(T, rows[-1], C, b"last")
    assert _reads_of_commit(accounts, txn) == 1


def test_a_later_rollback_record_does_not_block_a_writer(accounts: Cluster) -> None:
    mine = Transaction(accounts)
    dying = Transaction(client_of(accounts))
    dying.set(T, b"alice", C, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert Transaction(accounts).get(T, b"alice", C) is None  # rolls it back
    mine.set(T, b"alice", C, b"mine")
    mine.commit()
    assert Transaction(accounts).get(T, b"alice", C) == b"mine"


def test_an_older_commit_and_a_free_lock_do_not_block_a_writer(accounts: Cluster) -> None:
    for value in (b"1", b"2", b"3"):
        with Transaction(accounts) as txn:
            txn.set(T, b"alice", C, value)
    with Transaction(accounts) as txn:
        txn.delete(T, b"alice", C)
    with Transaction(accounts) as txn:
        txn.set(T, b"alice", C, b"4")
    assert Transaction(accounts).get(T, b"alice", C) == b"4"


def test_a_newer_commit_is_a_conflict_and_leaves_nothing(accounts: Cluster) -> None:
    mine = Transaction(accounts)
    with Transaction(accounts) as winner:
        winner.set(T, b"alice", C, b"winner")
    mine.set(T, b"bob", C, b"mine")  # the primary: locked, then released
    mine.set(T, b"alice", C, b"mine")
    with pytest.raises(percolator.ConflictError, match="after our start") as info:
        mine.commit()
    assert info.value.conflict_ts == winner.commit_ts
    reader = Transaction(accounts)
    assert reader.get(T, b"alice", C) == b"winner" and reader.get(T, b"bob", C) is None
    with Transaction(accounts) as txn:  # no lock left behind
        txn.set(T, b"bob", C, b"next")


def test_a_commit_just_after_our_start_is_a_conflict(accounts: Cluster) -> None:
    """The first timestamp after our start is after it: a commit there wins the cell
    (on Bigtable, the guard on newer write records starts there, not one above)."""
    with Transaction(accounts) as winner:
        winner.set(T, b"alice", C, b"winner")
    mine = Transaction(accounts, start_ts=winner.commit_ts - 1)
    mine.set(T, b"alice", C, b"mine")
    with pytest.raises(percolator.ConflictError, match="after our start") as info:
        mine.commit()
    assert info.value.conflict_ts == winner.commit_ts
    assert (info.value.table, info.value.row, info.value.column) == (T, b"alice", C)
    assert Transaction(accounts).get(T, b"alice", C) == b"winner"


def test_a_live_lock_is_a_conflict(accounts: Cluster, backend: str) -> None:
    """A live lock on the secondary: a conflict, raised before the primary is locked
    where the prewrite reads first (``TwoPhaseCommit._checked_before_locking``): no
    compare-and-set, where it would lock bob, meet alice's lock and free bob again.
    Bigtable locks bob by its conditional mutation first."""
    holder = Transaction(accounts)
    holder.set(T, b"alice", C, b"held")
    hold_locks(holder)
    mine = Transaction(accounts)
    mine.set(T, b"bob", C, b"mine")  # the primary
    mine.set(T, b"alice", C, b"mine")
    counted = _Counted(internals(accounts).store)
    internals(accounts).store = counted  # type: ignore[assignment]
    with pytest.raises(percolator.ConflictError, match="locked by live transaction") as info:
        mine.commit()
    if backend != "bigtable":
        assert not counted.calls[("check_and_set", T)], counted.calls
    # The error names the cell, our transaction and the holder's.
    conflict = info.value
    assert str(conflict) == (f"write-write conflict on {T}/b'alice'/{C}: locked by live "
                             f"transaction {holder.start_ts} (transaction {mine.start_ts})")
    assert (conflict.start_ts, conflict.conflict_ts, conflict.table, conflict.row,
            conflict.column) == (mine.start_ts, holder.start_ts, T, b"alice", C)


@pytest.mark.parametrize("backend", [SQLITE])
def test_a_prewrites_locks_carry_the_clusters_lock_ttl(accounts: Cluster, backend: str) -> None:
    """Each lock a prewrite takes says how long readers honour it while its owner is
    silent: the cluster's ``lock_ttl``, in milliseconds."""
    accounts.lock_ttl = 12.5
    holder = Transaction(accounts)
    holder.set(T, b"alice", C, b"held")  # the primary
    holder.set(T, b"bob", C, b"held")
    with pytest.raises(SimulatedCrash):  # stops after its prewrite; its owner lives on
        commit_transaction(holder, CrashPoint("prewrite", 1))
    for row in (b"alice", b"bob"):
        lock = _lock_state(accounts, row)
        assert isinstance(lock, Lock) and lock.ttl_ms == 12_500


def _locking(world: Interleaving, txn: Transaction, row: bytes) -> Actor[None]:
    """*txn*'s commit as an actor, parked before its compare-and-set of *row*'s lock:
    its prewrite has read the cell (or took what its reads kept) and found it FREE."""
    actor = world.actor("mine", txn.commit)
    actor.run_until(lambda step: step.matches("check_and_set", row=row))
    return actor


@pytest.mark.parametrize("backend", [SQLITE, CAS_SQLITE])
def test_a_live_lock_taken_between_our_read_and_our_lock_is_a_conflict(
    accounts: Cluster, backend: str
) -> None:
    """Another transaction locks alice after our prewrite read her and before it locks
    her, and lives on: our compare-and-set fails, the read again finds the live lock,
    and the prewrite gives way, naming its holder (``TwoPhaseCommit._prewrite``'s
    resolution of a lock met while locking, not before)."""
    with Interleaving(accounts) as world:
        mine = Transaction(accounts)
        mine.set(T, b"alice", C, b"mine")
        actor = _locking(world, mine, b"alice")
        holder = Transaction(accounts)  # the test's thread: runs straight through
        holder.set(T, b"alice", C, b"held")
        hold_locks(holder)
        with pytest.raises(percolator.ConflictError) as info:
            actor.finish()
    assert str(info.value) == (f"write-write conflict on {T}/b'alice'/{C}: locked by live "
                               f"transaction {holder.start_ts} (transaction {mine.start_ts})")
    assert info.value.conflict_ts == holder.start_ts
    assert isinstance(_lock_state(accounts, b"alice"), Lock)  # the holder's, untouched


@pytest.mark.parametrize("backend", [SQLITE, CAS_SQLITE])
@pytest.mark.parametrize("met", ["primary", "secondary"])
def test_a_dead_lock_taken_between_our_read_and_our_lock_is_rolled_back(
    accounts: Cluster, backend: str, met: str
) -> None:
    """A transaction locks alice (its primary, or its secondary after bob) after our
    prewrite read her and before it locks her, and dies: our compare-and-set fails,
    the read again finds the dead lock, which the prewrite rolls back (a rollback record
    at the dead one's primary; alice freed), then locks her and commits."""
    with Interleaving(accounts) as world:
        mine = Transaction(accounts)
        mine.set(T, b"alice", C, b"mine")
        actor = _locking(world, mine, b"alice")
        dying = Transaction(client_of(accounts))
        rows = [b"alice"] if met == "primary" else [b"bob", b"alice"]
        for row in rows:
            dying.set(T, row, C, b"dead")
        assert crash_commit(dying, CrashPoint("prewrite", len(rows) - 1)) is False
        actor.finish()
    assert mine.commit_ts is not None
    store = internals(accounts).store
    primary = rows[0]  # rolled back: a rollback record at the dead one's start
    records = store.read_rows(T, [primary], [Read(WRITE, (C,), versions=None)])[primary]
    assert (dying.start_ts, WriteKind.ROLLBACK) in [
        (ts, decode_write(v)[0]) for ts, v in records[f"{WRITE}:{C}"]]
    assert Transaction(accounts).get_rows(T, [b"alice", b"bob"], [C]) == {
        b"alice": {C: b"mine"}, b"bob": {}}


def _lock_raw(cluster: Cluster, row: bytes) -> bytes | None:
    cells = internals(cluster).store.read_rows(T, [row], [Read(LOCK, (C,))]).get(row, {})
    return cells[f"{LOCK}:{C}"][0][1] if f"{LOCK}:{C}" in cells else None


def _replace_lock(cluster: Cluster, row: bytes, state: Any) -> None:
    """*row*'s lock set to *state*, from the test's thread (straight through)."""
    assert internals(cluster).store.check_and_set(
        T, row, f"{LOCK}:{C}", _lock_raw(cluster, row), encode_lock(state))


def _orphan(cluster: Cluster) -> Lock:
    """A lock of a transaction whose primary row holds nothing: resolved at once
    (rolled back, no write record), leaving the cell FREE."""
    return Lock(internals(cluster).timestamps.get_timestamp(), T, b"gone", C, owner="nobody",
                wall_ms=int(time.time() * 1000), ttl_ms=3_600_000)


def _is_prewrite_read(step: Any) -> bool:
    """The prewrite's read of alice's lock and write records."""
    return step.matches("read_rows", row=b"alice", column=f"{LOCK}:{C}") and step.matches(
        column=f"{WRITE}:{C}")


@pytest.mark.parametrize("backend", [SQLITE, CAS_SQLITE])
@pytest.mark.parametrize("changes", [3, 4])
def test_a_prewrite_whose_lock_cell_keeps_changing_gives_up_at_its_fourth_failed_lock(
    accounts: Cluster, backend: str, changes: int
) -> None:
    """Each time our prewrite is about to lock alice, her FREE lock changes to another
    FREE one (a writer that locked her and gave up): the compare-and-set fails, the
    prewrite reads her again and tries again, up to four times; then it gives up
    (a conflict: the cell is too busy) rather than spin."""
    with Interleaving(accounts) as world:
        mine = Transaction(accounts)
        mine.set(T, b"alice", C, b"mine")
        actor = _locking(world, mine, b"alice")
        for change in range(changes):
            if change:
                actor.run_until(lambda step: step.matches("check_and_set", row=b"alice"))
            _replace_lock(accounts, b"alice", Free(_orphan(accounts).start_ts, False))
            actor.step()  # its compare-and-set fails
        if changes < 4:
            actor.finish()
            assert Transaction(accounts).get(T, b"alice", C) == b"mine"
        else:
            with pytest.raises(percolator.ConflictError) as info:
                actor.finish()
            assert str(info.value) == (
                f"write-write conflict on {T}/b'alice'/{C}: the lock cell changed while we "
                f"locked it (transaction {mine.start_ts})")
            assert info.value.conflict_ts is None
            assert Transaction(accounts).get(T, b"alice", C) is None


@pytest.mark.parametrize("backend", [SQLITE, CAS_SQLITE])
@pytest.mark.parametrize("locks", [18, 19])
def test_a_prewrite_that_meets_a_new_lock_after_each_resolution_gives_up_at_its_twentieth(
    accounts: Cluster, backend: str, locks: int
) -> None:
    """Our prewrite's compare-and-set of alice fails (her lock changed), and each time
    it reads her again it finds the lock of another dead transaction, which it rolls
    back before reading again: twenty rounds in all (the failed lock, then one per
    lock met). Found FREE in the twentieth, she is locked; a lock met there, the
    prewrite gives up (a conflict) rather than spin."""
    with Interleaving(accounts) as world:
        mine = Transaction(accounts)
        mine.set(T, b"alice", C, b"mine")
        actor = _locking(world, mine, b"alice")
        _replace_lock(accounts, b"alice", Free(_orphan(accounts).start_ts, False))
        for _ in range(locks):
            actor.step()
            actor.run_until(_is_prewrite_read)
            _replace_lock(accounts, b"alice", _orphan(accounts))
        if locks < 19:
            actor.finish()
            assert Transaction(accounts).get(T, b"alice", C) == b"mine"
        else:
            with pytest.raises(percolator.ConflictError) as info:
                actor.finish()
            assert str(info.value) == (f"write-write conflict on {T}/b'alice'/{C}: could not "
                                       f"take the lock (transaction {mine.start_ts})")
            assert info.value.conflict_ts is None
            assert Transaction(accounts).get(T, b"alice", C) is None


def _lock_state(cluster: Cluster, row: bytes) -> Any:
    cells = internals(cluster).store.read_rows(T, [row], [Read(LOCK, (C,))])[row]
    return decode_lock(cells[f"{LOCK}:{C}"][0][1])


def test_a_lock_left_committed_is_rolled_forward_before_the_writer_locks(
    accounts: Cluster,
) -> None:
    """A transaction that died after its commit point left bob locked; a writer started
    after it writes bob without reading him: its prewrite rolls bob forward (the dead
    one's record at its commit timestamp, below our start: no conflict), then locks and
    commits him, having resolved that lock once. Guards the lock resolution of
    ``TwoPhaseCommit._checked_before_locking`` naming the cell it met (another row or
    column: that roll forward misses, and the lock is resolved again as it is taken)."""
    dying = Transaction(client_of(accounts))
    dying.set(T, b"alice", C, b"dead")  # the primary
    dying.set(T, b"bob", C, b"dead")
    assert crash_commit(dying, CrashPoint("commit", 0)) is True
    mine = Transaction(accounts)
    mine.set(T, b"bob", C, b"mine")
    resolved = internals(accounts).stats["locks_resolved"]
    mine.commit()
    assert internals(accounts).stats["locks_resolved"] == resolved + 1  # once, there
    store = internals(accounts).store
    records = store.read_rows(T, [b"bob"], [Read(WRITE, (C,), versions=None)])
    assert [(ts, decode_write(v)[0]) for ts, v in records[b"bob"][f"{WRITE}:{C}"]] == [
        (mine.commit_ts, WriteKind.PUT), (dying.commit_ts, WriteKind.PUT)]
    assert Transaction(accounts).get_rows(T, [b"alice", b"bob"], [C]) == {
        b"alice": {C: b"dead"}, b"bob": {C: b"mine"}}


def test_a_harness_runs_the_phases_of_a_two_phase_commit_and_stops_at_its_crash_point(
    tmp_path: Path,
) -> None:
    """``TwoPhaseCommit.of(txn, crash)``, the harnesses' way in (bench/, the notify-index
    tests): its prewrite locks the primary, then stops at the crash point, before the
    secondary, saying where; its abort releases what it locked."""
    with percolator.connect(f"sqlite:///{tmp_path}/harness.db") as cluster:
        cluster.create_table(T)
        txn = Transaction(cluster)
        txn.set(T, b"alice", C, b"a")  # the primary
        txn.set(T, b"bob", C, b"b")
        committer = TwoPhaseCommit.of(txn, CrashPoint("prewrite", 0))
        with pytest.raises(SimulatedCrash, match=r"^simulated crash at prewrite\[0\]$"):
            committer.prewrite()  # says where it stopped
        assert [cell.row for cell in committer.locked] == [b"alice"]
        other = Transaction(cluster)
        other.set(T, b"alice", C, b"other")
        with pytest.raises(percolator.ConflictError, match="locked by live transaction"):
            other.commit()
        committer.abort()
        with Transaction(cluster) as other:
            other.set(T, b"alice", C, b"other")
        assert Transaction(cluster).get(T, b"alice", C) == b"other"


def test_a_commit_point_without_a_yes_is_told_by_its_primary_or_reported_unknown(
    tmp_path: Path,
) -> None:
    """``committed_anyway``: after a commit point's compare-and-set said no (error
    None) or failed (an error), the primary tells. Committed at our commit timestamp:
    committed. Still locked: after a no, not committed (the caller's conflict); after
    an error, unknown (the call may still apply). Unreadable: unknown, saying which."""
    with percolator.connect(f"sqlite:///{tmp_path}/commit-point.db") as cluster:
        cluster.create_table(T)
        txn = Transaction(cluster)
        txn.set(T, b"alice", C, b"a")
        committer = TwoPhaseCommit.of(txn)
        committer.prewrite()
        parts, lock = committer.parts, committer._lock_for(committer.primary)
        commit_ts = parts.timestamps.get_timestamp()
        lost = percolator.StoreUnavailable("connection dropped")
        assert committed_anyway(parts, lock, commit_ts, None) is False
        with pytest.raises(percolator.CommitUnknownError,
                           match=f"failed at the commit point of transaction {txn.start_ts}: "
                                 "connection dropped; it may or may not have committed") as info:
            committed_anyway(parts, lock, commit_ts, lost)
        assert info.value.__cause__ is lost
        committer.commit_point(commit_ts)
        assert committed_anyway(parts, lock, commit_ts, None) is True
        assert committed_anyway(parts, lock, commit_ts, lost) is True
        parts.store.close()  # the primary can no longer be read
        with pytest.raises(percolator.CommitUnknownError,
                           match=r"failed at the commit point .*connection dropped") as info:
            committed_anyway(parts, lock, commit_ts, lost)
        assert info.value.__cause__ is lost
        with pytest.raises(percolator.CommitUnknownError,
                           match=r"answered no and its primary could not be read again: "
                                 r".*closed database.*; it may or may not have committed") as info:
            committed_anyway(parts, lock, commit_ts, None)
        assert isinstance(info.value.__cause__, percolator.StoreUnavailable)


class _CommitPointFails:
    """The cluster's store, whose compare-and-set (the commit point's) fails after it
    applied or before, and whose reads fail from then on: ``lock_cas`` cannot tell,
    and hands the error to ``committed_anyway``, which reads the primary through the
    cluster's own store."""

    def __init__(self, store: Any, applied: bool) -> None:
        self._store, self.applied, self.failed = store, applied, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def check_and_set(self, *args: Any, **kwargs: Any) -> bool:
        if self.applied:
            self._store.check_and_set(*args, **kwargs)
        self.failed = True
        raise percolator.StoreUnavailable("connection dropped")

    def read_rows(self, *args: Any, **kwargs: Any) -> Any:
        if self.failed:
            raise percolator.StoreUnavailable("connection dropped")
        return self._store.read_rows(*args, **kwargs)


@pytest.mark.parametrize("backend", [SQLITE])
@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_a_commit_point_whose_store_call_fails_is_told_by_its_primary(
    accounts: Cluster, backend: str, applied: bool
) -> None:
    """The commit point's compare-and-set fails (its answer lost): the primary, read
    again, tells. Its commit record at our commit timestamp: committed, the commit
    goes on. Still locked: unknown (CommitUnknownError, with the store's error), not a
    conflict, which would tell the caller that nothing committed."""
    txn = Transaction(accounts)
    txn.set(T, b"alice", C, b"a")
    txn.set(T, b"bob", C, b"b")
    committer = TwoPhaseCommit.of(txn)
    committer.prewrite()
    commit_ts = committer.parts.timestamps.get_timestamp()
    store = committer.store
    committer.store = _CommitPointFails(store, applied)  # type: ignore[assignment]
    if not applied:
        with pytest.raises(percolator.CommitUnknownError,
                           match=f"failed at the commit point of transaction {txn.start_ts}: "
                                 "connection dropped; it may or may not have committed"):
            committer.commit_point(commit_ts)
        assert txn.commit_ts is None
        return
    committer.commit_point(commit_ts)
    assert txn.commit_ts == commit_ts
    committer.store = store
    committer.commit_secondaries(commit_ts)
    with percolator.Snapshot(accounts) as snap:
        assert (snap.get(T, b"alice", C), snap.get(T, b"bob", C)) == (b"a", b"b")


@pytest.mark.parametrize("backend", [SQLITE])
def test_each_two_phase_commit_counts_once_in_the_clusters_stats(
    accounts: Cluster, backend: str
) -> None:
    """``percolator status``'s commits: one per two-phase commit."""
    stats = internals(accounts).stats
    commits = stats["commits"]
    for value in (b"1", b"2"):
        with Transaction(accounts) as txn:
            txn.set(T, b"alice", C, value)
            txn.set(T, b"bob", C, value)
    assert stats["commits"] == commits + 2


@pytest.mark.parametrize("backend", [SQLITE])
def test_a_two_phase_commit_asked_for_a_next_start_draws_it_one_above_its_commit(
    accounts: Cluster, backend: str
) -> None:
    """A commit whose transaction holds a ``NextStart`` (an observer run's, or on the
    cluster stores any transaction's) draws two timestamps in one request: it commits
    at the first and leaves the second, one above, for its thread's next
    transaction (docs/timestamps.md, "A start timestamp drawn with the previous
    commit"). The embedded store's transactions take none by themselves."""
    txn = Transaction(accounts)
    txn.set(T, b"alice", C, b"a")
    txn._next_start = spare = NextStart()
    commit_ts = txn.commit()
    assert spare.ts == commit_ts + 1
    assert Transaction(accounts).get(T, b"alice", C) == b"a"


def _lock_of(txn: Transaction) -> Lock:
    """A lock of *txn*, as a reader of its client would meet it (live for its TTL)."""
    return Lock(start_ts=txn.start_ts, primary_table=T, primary_row=b"alice",
                primary_column=C, owner="", wall_ms=int(time.time() * 1000), ttl_ms=30_000)


class _NoTimestamps:
    """A timestamp source that cannot draw."""

    def get_timestamp(self) -> int:
        raise percolator.OracleUnavailable("no timestamp")

    def get_timestamps(self, n: int) -> range:
        raise percolator.OracleUnavailable("no timestamp")


class _BeforeTheCommitPoint:
    """The cluster's coordination, whose check of the owner right before the commit
    point first runs *before*: a cleaner's move, or the owner's session lost."""

    def __init__(self, coordination: Any, before: Any) -> None:
        self._coordination, self._before = coordination, before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._coordination, name)

    def confirm_owner(self, owner: str) -> None:
        self._before()
        self._coordination.confirm_owner(owner)


@pytest.mark.parametrize("backend", [SQLITE])
def test_a_commit_tells_its_clients_readers_how_it_ended(accounts: Cluster, backend: str) -> None:
    """``CommitsInFlight``: a two-phase commit that conflicts in its prewrite or at its
    commit point (a cleaner rolled it back), whose prewrite the store fails, that gets
    no commit timestamp, or whose owner's session is lost before its commit point, tells
    its client's readers it is rolled back (and counts its conflicts); one that dies (a simulated
    crash) is forgotten, so that its locks are resolved through the store, as any dead
    client's; none stays in flight once ended."""
    parts = internals(accounts)
    in_flight, stats = parts.in_flight, parts.stats
    conflicts = stats["conflicts"]
    losers = [Transaction(accounts) for _ in range(2)]
    with Transaction(accounts) as first:
        first.set(T, b"alice", C, b"first")
    for loser in losers:
        loser.set(T, b"alice", C, b"loser")
        with pytest.raises(ConflictError):
            loser.commit()
        assert in_flight.settle(_lock_of(loser), loser.start_ts + 10) == (0, False)
    assert stats["conflicts"] == conflicts + 2
    failed = Transaction(accounts)
    failed.set(T, b"bob", C, b"failed")
    store = parts.store
    parts.store = _CommitPointFails(store, applied=False)  # type: ignore[assignment]
    try:
        with pytest.raises(percolator.StoreUnavailable):
            failed.commit()
    finally:
        parts.store = store
    assert in_flight.settle(_lock_of(failed), failed.start_ts + 10) == (0, False)
    undrawn = Transaction(accounts)
    undrawn.set(T, b"bob", C, b"undrawn")
    timestamps = parts.timestamps
    parts.timestamps = _NoTimestamps()  # type: ignore[assignment]
    try:
        with pytest.raises(percolator.OracleUnavailable):
            undrawn.commit()  # prewritten, then no commit timestamp
    finally:
        parts.timestamps = timestamps
    assert in_flight.settle(_lock_of(undrawn), undrawn.start_ts + 10) == (0, False)
    coordination = parts.coordination
    overtaken = Transaction(accounts)
    overtaken.set(T, b"carol", C, b"overtaken")  # its primary

    def roll_back() -> None:  # a cleaner, before the commit point's compare-and-set
        cell = f"{LOCK}:{C}"
        held = store.read_rows(T, [b"carol"], [Read(LOCK, (C,))])[b"carol"][cell][0][1]
        decided = encode_lock(RolledBack(overtaken.start_ts))
        assert store.check_and_set(T, b"carol", cell, held, decided)

    parts.coordination = _BeforeTheCommitPoint(coordination, roll_back)
    try:
        with pytest.raises(ConflictError, match="rolled back by a cleaner"):
            overtaken.commit()
    finally:
        parts.coordination = coordination
    assert stats["conflicts"] == conflicts + 3
    assert in_flight.settle(_lock_of(overtaken), overtaken.start_ts + 10) == (0, False)
    expired = Transaction(accounts)
    expired.set(T, b"dave", C, b"expired")

    def session_lost() -> None:
        raise percolator.CoordinationError("the owner's session expired")

    parts.coordination = _BeforeTheCommitPoint(coordination, session_lost)
    try:
        with pytest.raises(percolator.CoordinationError):
            expired.commit()
    finally:
        parts.coordination = coordination
    assert stats["conflicts"] == conflicts + 3
    assert in_flight.settle(_lock_of(expired), expired.start_ts + 10) == (0, False)
    with Transaction(accounts) as last:
        last.set(T, b"alice", C, b"last")
    assert not in_flight._flights
    client = client_of(accounts)  # its owner dies with the crash
    client.one_phase_commit = False
    dead = Transaction(client)
    dead.set(T, b"alice", C, b"dead")
    assert crash_commit(dead, CrashPoint("commit_point"))
    assert internals(client).in_flight.settle(_lock_of(dead), dead.start_ts) is UNTOLD


class _Clock:
    """``percolator._two_phase``'s clock, moved by the test: a commit's age
    (``monotonic``) and the wall time its locks carry (``time``)."""

    def __init__(self) -> None:
        self.now, self.wall = 1000.0, 1_800_000_000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.wall


@pytest.mark.parametrize("backend", [SQLITE])
def test_a_commit_refreshes_its_primary_once_a_third_of_its_ttl_has_passed(
    accounts: Cluster, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long commit sets its primary's lock again with a fresh wall time (so that
    cleaners leave it alone) once a third of the lock's TTL has passed since it last
    did, not before; a primary rolled back by a cleaner meanwhile is a conflict. The
    clock is the test's: the TTL's third falls on an exact instant."""
    clock = _Clock()
    monkeypatch.setattr(two_phase, "time", clock)
    txn = Transaction(accounts)
    txn.set(T, b"alice", C, b"a")
    txn.set(T, b"bob", C, b"b")
    committer = TwoPhaseCommit.of(txn)
    committer.ttl_ms = 3000  # a third: 1 s
    committer.prewrite()
    p, store = committer.primary, internals(accounts).store

    def stored() -> bytes:
        cells = store.read_rows(T, [b"alice"], [Read(LOCK, (C,))])[b"alice"]
        return bytes(cells[f"{LOCK}:{C}"][0][1])

    locked = stored()
    assert p.held == locked
    clock.wall += 5.0
    clock.now = 1000.9995  # just under a third of the TTL: left as it is
    committer._refresh_primary()
    assert (stored(), p.held, committer.refreshed_at) == (locked, locked, 1000.0)
    clock.now = 1001.0  # a third
    committer._refresh_primary()
    fresh = stored()
    assert fresh != locked and p.held == fresh and committer.refreshed_at == 1001.0
    before = decode_lock(locked)
    assert isinstance(before, Lock)
    assert decode_lock(fresh) == replace(before, wall_ms=int(clock.wall * 1000))
    clock.now = 1002.0
    store.check_and_set(T, b"alice", f"{LOCK}:{C}", fresh,
                        encode_lock(Free(txn.start_ts, False)))  # a cleaner's rollback
    with pytest.raises(ConflictError) as info:
        committer._refresh_primary()
    assert str(info.value) == (f"write-write conflict on {T}/{b'alice'!r}/{C}: rolled back by a "
                               f"cleaner while committing (transaction {txn.start_ts})")


class _Counted:
    """The cluster's real store behind a proxy that records ``(method, table)`` calls."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: Counter[tuple[str, str]] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in ("read_rows", "mutate_rows", "check_and_set", "set_unless", "increment"):
            return attr

        def counted(table: str, *args: Any, **kwargs: Any) -> Any:
            self.calls[(name, table)] += 1
            return attr(table, *args, **kwargs)

        return counted


# Store calls of a commit of one cell, and of two cells in two rows, after the start
# timestamp (reads of the observed-columns registry left out).
CALLS = {
    # set_unless: the conflict check folded into the lock's conditional mutation
    "bigtable": (
        {("set_unless", T): 1, ("check_and_set", T): 1, ("increment", META_TABLE): 1},
        {("set_unless", T): 2, ("check_and_set", T): 2, ("increment", META_TABLE): 1},
    ),
    # Thrift2: one read of every cell, then checkAndMutate with the data; the commit
    # point writes the primary's record and frees its lock; a secondary's release does
    # the same
    "hbase": (
        {("read_rows", T): 1, ("check_and_set", T): 2, ("increment", META_TABLE): 1},
        {("read_rows", T): 1, ("check_and_set", T): 4, ("increment", META_TABLE): 1},
    ),
    # Thrift1: one read of every cell, then checkAndPut (data written first); commit
    # point, write record, release
    "hbase-thrift1": (
        {("read_rows", T): 1, ("check_and_set", T): 3, ("mutate_rows", T): 1,
         ("increment", META_TABLE): 1},
        {("read_rows", T): 1, ("check_and_set", T): 5, ("mutate_rows", T): 2,
         ("increment", META_TABLE): 1},
    ),
}


@pytest.mark.parametrize("cells", [1, 2], ids=["one-cell", "two-cells"])
def test_store_calls_of_a_commit(accounts: Cluster, backend: str, cells: int) -> None:
    if backend not in CALLS:
        pytest.skip("counted on the cluster stores (the embedded store commits in one phase: "
                    "its own tests count it)")
    counted = _Counted(internals(accounts).store)
    internals(accounts).store = counted  # type: ignore[assignment]
    internals(accounts).timestamps = StoreTimestamps(counted)  # type: ignore[arg-type]
    for _ in range(2):  # the second time over existing cells, FREE locks, older records
        txn = Transaction(accounts)
        for i in range(cells):
            txn.set(T, b"row%d" % i, C, b"v")
        counted.calls.clear()
        txn.commit()
        calls = {k: v for k, v in counted.calls.items() if k != ("read_rows", META_TABLE)}
        assert calls == CALLS[backend][cells - 1]


def _rolled_back(cluster: Cluster) -> int:
    """A rollback record on alice: a transaction that died after its prewrite, rolled
    back by a reader. Returns its start timestamp (where the record sits)."""
    dying = Transaction(client_of(cluster))
    dying.set(T, b"alice", C, b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert Transaction(cluster).get(T, b"alice", C) is None  # rolls it back
    return dying.start_ts


def _below(cluster: Cluster) -> Transaction:
    """A rollback record below our start."""
    below = _rolled_back(cluster)
    mine = Transaction(cluster)
    assert mine.start_ts > below  # drawn now, after the record
    return mine


def _above(cluster: Cluster) -> Transaction:
    """A rollback record above our start, which is not ours."""
    mine = Transaction(cluster)
    start = mine.start_ts
    assert _rolled_back(cluster) > start
    return mine


def _just_below(cluster: Cluster) -> Transaction:
    """A commit at the timestamp just below our start."""
    with Transaction(cluster) as older:
        older.set(T, b"alice", C, b"older")
    assert older.commit_ts is not None
    # Draw past it: no later draw hands out our start again.
    assert internals(cluster).timestamps.get_timestamp() > older.commit_ts
    return Transaction(cluster, start_ts=older.commit_ts + 1)


@pytest.mark.parametrize("backend", [BIGTABLE])  # the store with set_unless
@pytest.mark.parametrize("history", [_below, _above, _just_below],
                         ids=["rollback-below", "rollback-above", "commit-just-below"])
def test_records_that_are_no_conflict_cost_a_guarded_prewrite_no_read(
    accounts: Cluster, backend: str, history: Any
) -> None:
    """Where the store tests the conflict conditions itself (``set_unless``), a cell
    whose history holds no conflict is locked by the conditional mutation alone: a
    guard that also matched a rollback record not at our start, or a commit below
    it, would send the prewrite to read the cell and lock it again."""
    mine = history(accounts)
    mine.set(T, b"alice", C, b"mine")
    counted = _Counted(internals(accounts).store)
    internals(accounts).store = counted  # type: ignore[assignment]
    internals(accounts).timestamps = StoreTimestamps(counted)  # type: ignore[arg-type]
    mine.commit()
    calls = {k: v for k, v in counted.calls.items() if k != ("read_rows", META_TABLE)}
    assert calls == CALLS[backend][0]
    assert Transaction(accounts).get(T, b"alice", C) == b"mine"


class _RowCasNotAtomic(_Counted):
    """The counted store, declaring no atomic row compare-and-set (as HBase over
    Thrift1): a release can then not write the write record with the lock's CAS."""

    atomic_row_cas = False


@pytest.mark.parametrize("backend", [SQLITE])
@pytest.mark.parametrize("atomic", [True, False], ids=["atomic-row-cas", "row-cas-not-atomic"])
def test_secondaries_are_recorded_in_one_batch_per_table_where_a_release_cannot_record(
    accounts: Cluster, backend: str, atomic: bool
) -> None:
    """Where a compare-and-set writes other cells of its row, each secondary's release
    writes its write record; where it cannot, the records of the secondaries (puts,
    deletes, the notifications of observed columns) are written first, one batch per
    table, and each release only frees its lock. Either way every change is visible,
    every notification made, and no lock left for readers to roll forward."""

    class Audit(Observer):
        table, column = "audit", C

        def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
            raise AssertionError("no worker runs here")

    accounts.create_table("audit")
    Worker(accounts, [Audit]).register()
    with Transaction(accounts) as before:
        before.set(T, b"carol", C, b"old")
    client = client_of(accounts)  # made after: reads the observed columns afresh
    store = internals(client).store
    counted = _Counted(store) if atomic else _RowCasNotAtomic(store)
    internals(client).store = counted  # type: ignore[assignment]
    written = {(T, b"alice"): b"1", (T, b"bob"): b"2", (T, b"carol"): None,
               ("audit", b"x"): b"4", ("audit", b"y"): b"5"}  # alice: the primary
    txn = Transaction(client)
    for (table, row), value in written.items():
        if value is None:
            txn.delete(table, row, C)
        else:
            txn.set(table, row, C, value)
    txn.commit()
    # Every lock FREE before anything reads (a read would roll a decided lock forward).
    for table, row in written:
        lock = store.read_rows(table, [row], [Read(LOCK, (C,))])[row][f"{LOCK}:{C}"]
        assert isinstance(decode_lock(lock[0][1]), Free)
    batches = {table: n for (name, table), n in counted.calls.items() if name == "mutate_rows"}
    # Without atomic row CAS: the primary's record after its commit point, then one
    # batch per table of the secondaries' records (the notifications' index entries,
    # where the store keeps an index, are written before the commit point).
    assert {t: n for t, n in batches.items() if t in (T, "audit")} == (
        {} if atomic else {T: 2, "audit": 1})
    with percolator.Snapshot(accounts) as snap:
        assert {(t, r): snap.get(t, r, C) for t, r in written} == written
    # A delete's record says so (garbage collection drops the cell under it), not a
    # put whose value is missing, which reads as absent too.
    ts, record = store.read_rows(T, [b"carol"], [Read(WRITE, (C,))])[b"carol"][f"{WRITE}:{C}"][0]
    assert (ts, decode_write(record)[0]) == (txn.commit_ts, WriteKind.DELETE)
    found = [(n.table, n.row, n.timestamps) for n in pending_notifications(accounts)]
    assert sorted(found) == [("audit", b"x", (txn.commit_ts,)), ("audit", b"y", (txn.commit_ts,))]


@pytest.mark.parametrize("backend", [SQLITE])
@pytest.mark.parametrize("released", [0, 1, 2])
def test_a_commit_crash_point_stops_after_that_many_secondaries_are_released(
    accounts: Cluster, backend: str, released: int
) -> None:
    """``CrashPoint("commit", n)`` (the harnesses' kills after the commit point) stops
    the commit once n secondaries are released, the last one included."""
    txn = Transaction(accounts)
    for row in (b"alice", b"bob", b"carol"):  # alice: the primary
        txn.set(T, row, C, b"v")
    with pytest.raises(SimulatedCrash):
        commit_transaction(txn, CrashPoint("commit", released))
    store = internals(accounts).store
    states = [decode_lock(store.read_rows(T, [row], [Read(LOCK, (C,))])[row][f"{LOCK}:{C}"][0][1])
              for row in (b"bob", b"carol")]
    assert [isinstance(state, Free) for state in states] == [i < released for i in range(2)]


@pytest.mark.parametrize("backend", [SQLITE])
def test_a_primary_decided_but_not_released_is_rolled_forward_as_what_it_was(
    accounts: Cluster, backend: str
) -> None:
    """Without atomic row CAS the commit point leaves the primary's lock COMMITTED until
    its release; a committer that dies there leaves a reader to roll it forward from
    that lock alone: a delete as a delete, with the notification of an observed column."""
    accounts.observe(T, C)
    with Transaction(accounts) as before:
        before.set(T, b"alice", C, b"old")
    client = client_of(accounts)  # made after: reads the observed columns afresh
    internals(client).store = _RowCasNotAtomic(internals(client).store)  # type: ignore[assignment]
    txn = Transaction(client)
    txn.delete(T, b"alice", C)  # the primary
    txn.set(T, b"bob", C, b"new")
    assert crash_commit(txn, CrashPoint("commit_point")) is True
    assert Transaction(accounts).get(T, b"alice", C) is None  # rolls it forward
    store = internals(accounts).store
    ts, record = store.read_rows(T, [b"alice"], [Read(WRITE, (C,))])[b"alice"][f"{WRITE}:{C}"][0]
    assert (ts, decode_write(record)[0]) == (txn.commit_ts, WriteKind.DELETE)
    notified = {n.row: n.timestamps for n in pending_notifications(accounts)}
    assert txn.commit_ts in notified[b"alice"]  # beside the one of the commit before
