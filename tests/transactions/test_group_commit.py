"""``commit_group``: transactions of one thread committed together (on the embedded
store, in one SQLite write transaction), each exactly as if committed alone: its own
conflict checks, against what committed before it in the group too, and its own
commit timestamp. Checked against a model of first-committer-wins with hypothesis, on
every backend (elsewhere the group is committed one by one)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import percolator
from percolator import (
    Cluster,
    ConflictError,
    Snapshot,
    SnapshotTooOldError,
    StoreUnavailable,
    Transaction,
    TransactionClosedError,
)
from percolator._commit import (
    commit_group,
    commits_in_one_phase,
)
from percolator._encoding import LOCK, Free, decode_lock
from percolator._internals import internals
from percolator._safe_point import SafePoint
from percolator._store import ATOMICALLY, Read, declares
from percolator._timestamps import HostTimestamps
from percolator.testing import client_of
from tests._concurrency import hold_locks

T, COL = "g", "c:v"
CELLS = [b"a", b"b", b"c", b"d"]


@pytest.fixture
def table(cluster: Cluster) -> Cluster:
    cluster.create_table(T)
    return cluster


class CountingSteps:
    """The cluster's store, counting atomic steps (SQLite write transactions) and
    compare-and-sets (a two-phase commit's steps; a one-phase commit makes none)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.steps = 0
        self.cas = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def check_and_set(self, *args: Any, **kwargs: Any) -> bool:
        self.cas += 1
        return bool(self._store.check_and_set(*args, **kwargs))

    @contextlib.contextmanager
    def atomically(self) -> Iterator[None]:
        self.steps += 1
        with self._store.atomically():
            yield


def test_a_group_commits_each_member_as_if_alone(table: Cluster) -> None:
    before = Transaction(table)  # started before a commit to "a": must conflict
    before.set(T, b"a", COL, b"late")
    with Transaction(table) as txn:
        txn.set(T, b"a", COL, b"first")
    members = [Transaction(table) for _ in range(4)]
    members[0].set(T, b"b", COL, b"m0")
    members[1].set(T, b"b", COL, b"m1")  # the same cell as member 0: conflicts with it
    members[2].set(T, b"c", COL, b"m2")
    members[3].get(T, b"a", COL)  # reads only
    atomic = declares(internals(table).store, ATOMICALLY)
    counting = CountingSteps(internals(table).store)
    if atomic:
        internals(table).store = counting  # type: ignore[assignment]
    conflicts, commits = internals(table).stats["conflicts"], internals(table).stats["commits"]
    try:
        outcomes = commit_group([before, *members])
    finally:
        internals(table).store = counting._store if atomic else internals(table).store
    assert isinstance(outcomes[0], ConflictError)
    assert (outcomes[0].table, outcomes[0].row, outcomes[0].column) == (T, b"a", COL)
    assert isinstance(outcomes[1], int)
    assert isinstance(outcomes[2], ConflictError)
    if atomic:  # met in the group (elsewhere: its record, committed before)
        assert "written by a transaction committed with it" in str(outcomes[2])
    assert internals(table).stats["conflicts"] == conflicts + 2
    assert internals(table).stats["commits"] == commits + 2  # the read-only one: none
    assert (members[0].commit_ts, members[2].commit_ts) == (outcomes[1], outcomes[3])
    assert isinstance(outcomes[3], int) and outcomes[3] > outcomes[1]
    assert outcomes[4] == members[3].start_ts  # nothing to write
    if atomic:  # one step, and no member left it for a two-phase commit
        assert (counting.steps, counting.cas) == (1, 0)
    snap = Snapshot(table)
    assert [snap.get(T, r, COL) for r in (b"a", b"b", b"c")] == [b"first", b"m0", b"m2"]
    assert Snapshot(table, start_ts=outcomes[3] - 1).get(T, b"c", COL) is None


def test_a_member_conflicts_with_any_earlier_member_of_its_cells(table: Cluster) -> None:
    # Not only with the member just before it: the third writes what the first wrote.
    members = [Transaction(table) for _ in range(3)]
    members[0].set(T, b"a", COL, b"m0")
    members[1].set(T, b"b", COL, b"m1")
    members[2].set(T, b"a", COL, b"m2")
    outcomes = commit_group(members)
    assert isinstance(outcomes[0], int) and isinstance(outcomes[1], int)
    conflict = outcomes[2]
    assert isinstance(conflict, ConflictError)
    # The conflict names its transaction and the cell, as one met in the store does.
    assert (conflict.start_ts, conflict.table, conflict.row, conflict.column) == (
        members[2].start_ts, T, b"a", COL)
    snap = Snapshot(table)
    assert (snap.get(T, b"a", COL), snap.get(T, b"b", COL)) == (b"m0", b"m1")


class FailingWrites(CountingSteps):
    """The cluster's store, failing every batched write (a store gone mid-step)."""

    def mutate_rows(self, table: str, mutations: Any) -> None:
        raise StoreUnavailable("the store went away")


def test_a_store_failure_in_the_step_fails_every_member_but_a_conflicting_one(
        table: Cluster) -> None:
    parts = internals(table)
    if not declares(parts.store, ATOMICALLY):
        pytest.skip("only a one-phase group commits in one step")
    before = Transaction(table)  # conflicts with the next commit to "a"
    before.set(T, b"a", COL, b"late")
    with Transaction(table) as txn:
        txn.set(T, b"a", COL, b"first")
    member = Transaction(table)
    member.set(T, b"b", COL, b"m")
    failing = FailingWrites(parts.store)
    parts.store = failing  # type: ignore[assignment]
    try:
        outcomes = commit_group([before, member])
    finally:
        parts.store = failing._store
    assert isinstance(outcomes[0], ConflictError)
    assert isinstance(outcomes[1], StoreUnavailable)  # rolled back with the step
    assert Snapshot(table).get(T, b"b", COL) is None


def test_a_group_with_no_room_left_in_the_block_commits_on_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The persisted block of timestamps (HostTimestamps.BLOCK) has no room for the whole
    # group's commit timestamps: its members then commit one by one, in two phases.
    monkeypatch.setattr(HostTimestamps, "BLOCK", 6)
    monkeypatch.setattr(HostTimestamps, "REFILL", 3)
    with percolator.connect(f"sqlite:///{tmp_path}/db") as cluster:
        cluster.create_table(T)
        members = [Transaction(cluster) for _ in range(12)]
        for i, member in enumerate(members):
            member.set(T, b"r%02d" % i, COL, b"%d" % i)
        outcomes = commit_group(members)
        assert all(isinstance(o, int) for o in outcomes), outcomes
        snap = Snapshot(cluster)
        assert [snap.get(T, b"r%02d" % i, COL) for i in range(12)] == [
            b"%d" % i for i in range(12)]


def test_a_member_leaves_an_existing_free_lock_as_it_was(table: Cluster) -> None:
    # As a flat one-phase commit (percolator/_one_phase.py): a two-phase prewriter that
    # read the FREE lock before this commit must find the same value in its CAS.
    with Transaction(table) as first:
        first.set(T, b"a", COL, b"first")
    store = internals(table).store

    def lock_of(row: bytes) -> bytes | None:
        cells = store.read_rows(T, [row], [Read(LOCK, (COL,))]).get(row, {}).get(f"{LOCK}:{COL}")
        return bytes(cells[0][1]) if cells else None

    before = lock_of(b"a")
    member = Transaction(table)
    member.set(T, b"a", COL, b"member")
    member.set(T, b"b", COL, b"new")  # a cell without a lock cell yet
    assert isinstance(commit_group([member])[0], int)
    assert Snapshot(table).get(T, b"a", COL) == b"member"
    if declares(store, ATOMICALLY):  # elsewhere a two-phase commit writes a new FREE
        assert lock_of(b"a") == before
    # A lock cell exists wherever a write record does (the next writer's CAS needs it).
    new = lock_of(b"b")
    assert new is not None and isinstance(decode_lock(new), Free)


def test_a_member_overtaken_by_the_safe_point_fails_alone(table: Cluster) -> None:
    """A member whose start is below the safe point gets SnapshotTooOldError; a
    read-only member commits at its start; neither keeps the others, after them in the
    group, out of its one step. Every member is closed afterwards."""
    stale = Transaction(table)
    stale.set(T, b"a", COL, b"stale")
    parts = internals(table)
    SafePoint(parts.store, parts.coordination).advance(parts.timestamps.get_timestamp())
    parts.safe_point._fetched = float("-inf")  # the commit's check reads it again
    read_only, fresh = Transaction(table), [Transaction(table) for _ in range(2)]
    read_only.get(T, b"b", COL)
    fresh[0].set(T, b"b", COL, b"1")
    fresh[1].set(T, b"c", COL, b"2")
    atomic = declares(parts.store, ATOMICALLY)
    counting = CountingSteps(parts.store)
    if atomic:
        parts.store = counting  # type: ignore[assignment]
    try:
        outcomes = commit_group([read_only, stale, *fresh])
    finally:
        parts.store = counting._store if atomic else parts.store
    assert outcomes[0] == read_only.start_ts
    assert isinstance(outcomes[1], SnapshotTooOldError)
    assert isinstance(outcomes[2], int) and isinstance(outcomes[3], int)
    if atomic:
        assert (counting.steps, counting.cas) == (1, 0)
    for txn in (stale, *fresh):
        with pytest.raises(TransactionClosedError):
            txn.commit()
    snap = Snapshot(table)
    assert [snap.get(T, r, COL) for r in (b"a", b"b", b"c")] == [None, b"1", b"2"]


def test_a_closed_member_fails_alone_and_keeps_no_other_out_of_the_step(
        table: Cluster) -> None:
    """A member committed already (closed) gets TransactionClosedError; the members
    after it in the group still share the group's one step."""
    done = Transaction(table)
    done.set(T, b"a", COL, b"done")
    done.commit()
    fresh = [Transaction(table) for _ in range(2)]
    fresh[0].set(T, b"b", COL, b"1")
    fresh[1].set(T, b"c", COL, b"2")
    parts = internals(table)
    atomic = declares(parts.store, ATOMICALLY)
    counting = CountingSteps(parts.store)
    if atomic:
        parts.store = counting  # type: ignore[assignment]
    try:
        outcomes = commit_group([done, *fresh])
    finally:
        parts.store = counting._store if atomic else parts.store
    assert isinstance(outcomes[0], TransactionClosedError)
    assert isinstance(outcomes[1], int) and isinstance(outcomes[2], int)
    if atomic:
        assert (counting.steps, counting.cas) == (1, 0)
    snap = Snapshot(table)
    assert [snap.get(T, r, COL) for r in (b"a", b"b", b"c")] == [b"done", b"1", b"2"]


def test_a_cluster_tells_whether_its_groups_share_one_step(table: Cluster) -> None:
    """commits_in_one_phase: on a store with an atomic step and one-phase commits on
    (the embedded store), a group commits in one step, so a worker gathers its runs
    into groups; with one-phase commits off, or elsewhere, it does not."""
    atomic = declares(internals(table).store, ATOMICALLY)
    assert commits_in_one_phase(table) is atomic
    two_phase = client_of(table)
    two_phase.one_phase_commit = False
    assert commits_in_one_phase(two_phase) is False


def test_a_member_that_meets_a_lock_commits_on_its_own(table: Cluster) -> None:
    """A live writer holds "a"; the member writing "a" leaves the group and meets the
    lock in a two-phase commit (a conflict: the holder is alive); the others commit."""
    writer = client_of(table)
    writer.one_phase_commit = False
    held = Transaction(writer)
    held.set(T, b"a", COL, b"held")
    hold_locks(held)
    blocked, free = Transaction(table), Transaction(table)
    blocked.set(T, b"a", COL, b"x")
    free.set(T, b"b", COL, b"y")
    outcomes = commit_group([blocked, free])
    assert isinstance(outcomes[0], ConflictError) and isinstance(outcomes[1], int)
    assert Snapshot(table).get(T, b"b", COL) == b"y"


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=st.lists(st.sets(st.sampled_from(CELLS), min_size=1, max_size=2),
                       min_size=2, max_size=7),
       cuts=st.lists(st.booleans(), min_size=7, max_size=7),
       late=st.lists(st.booleans(), min_size=7, max_size=7))
def test_groups_keep_first_committer_wins(
    table: Cluster, writes: list[set[bytes]], cuts: list[bool], late: list[bool]
) -> None:
    """Transactions over four cells, begun before the first commit or after it, then
    committed in groups cut at random (a group of one: alone): a commit succeeds exactly
    when no cell it writes was committed by another transaction after its start, and
    the store ends as the committed writes applied in commit order."""
    prefix = Snapshot(table).start_ts.to_bytes(8, "big")
    committed: list[tuple[int, int]] = []  # commit_ts, transaction
    txns: dict[int, Transaction] = {}
    starts: dict[int, int] = {}

    def begin(i: int) -> None:
        txns[i] = Transaction(table)
        starts[i] = txns[i].start_ts
        for cell in writes[i]:
            txns[i].set(T, prefix + cell, COL, b"%d" % i)

    for i in range(len(writes)):
        if not late[i]:
            begin(i)
    groups: list[list[int]] = [[]]
    for i in range(len(writes)):
        groups[-1].append(i)
        if cuts[i]:
            groups.append([])
    for n, group in enumerate(g for g in groups if g):
        if n == 1:
            for i in range(len(writes)):
                if late[i]:
                    begin(i)
        members = [i for i in group if i in txns]
        if not members:
            continue
        outcomes = commit_group([txns.pop(i) for i in members])
        for i, outcome in zip(members, outcomes, strict=True):
            overtaken = any(c > starts[i] and writes[j] & writes[i] for c, j in committed)
            if isinstance(outcome, int):
                assert not overtaken, f"transaction {i} committed over a newer write"
                committed.append((outcome, i))
            else:
                assert isinstance(outcome, ConflictError) and overtaken, outcome
    final: dict[bytes, bytes] = {}
    for _, i in sorted(committed):
        final.update({c: b"%d" % i for c in writes[i]})
    snap = Snapshot(table)
    assert {c: snap.get(T, prefix + c, COL) for c in CELLS} == {c: final.get(c) for c in CELLS}


def test_a_group_of_two_clusters_is_refused_and_nothing_commits(table: Cluster) -> None:
    from percolator import InvalidArgument

    other = client_of(table)
    mine, theirs = Transaction(table), Transaction(other)
    mine.set(T, b"x", COL, b"1")
    theirs.set(T, b"y", COL, b"2")
    with pytest.raises(InvalidArgument, match="one cluster"):
        commit_group([mine, theirs])
    snap = Snapshot(table)
    assert (snap.get(T, b"x", COL), snap.get(T, b"y", COL)) == (None, None)
