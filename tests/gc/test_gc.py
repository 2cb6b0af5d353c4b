"""Garbage collection below the safe point, on every backend.

What a pass removes and keeps (read back from the raw store), that a transaction left
below the safe point gets SnapshotTooOldError instead of a missing or stale value
(reads, commits, ``Snapshot(start_ts=...)``), the race between a reader and a pass
(a reader parked at the exact step, a fetch whose reply comes late, a pass that finds
the safe point already persisted by a pass killed in its grace wait), the data of a
commit across the safe point, a long-running reader in another process that keeps its
snapshot through passes, and a young transaction that keeps its snapshot when an older
one of its process is past max_txn_age (in this process, another, an older client).
"""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator._bulk import BulkLoad, LoadTxn, finish_rows, prewrite_rows
from percolator._encoding import META_TABLE
from percolator._gc import collect
from percolator._internals import internals
from percolator._store import ConditionalDelete, Mutation, Read
from percolator.testing import CrashPoint, client_of, crash_commit
from tests._backends import drop_tables

ROOT = Path(__file__).resolve().parents[2]
T = "t"
ALL = [Read("l"), Read("w", versions=None), Read("d", versions=None)]
REFRESH = 0.02
"""A short safe-point refresh: every pass waits twice it."""


@pytest.fixture
def gc_cluster(store_url: str) -> Iterator[percolator.Cluster]:
    with percolator.connect(store_url, safe_point_refresh=REFRESH) as c:
        c.create_table(T)
        yield c
        drop_tables(c)


def raw(cluster: percolator.Cluster, row: bytes) -> dict[str, list[tuple[int, bytes]]]:
    return internals(cluster).store.read_rows(T, [row], ALL).get(row, {})


def put(cluster: percolator.Cluster, row: bytes, value: bytes | None, column: str = "c:x") -> int:
    with percolator.Transaction(cluster) as txn:
        if value is None:
            txn.delete(T, row, column)
        else:
            txn.set(T, row, column, value)
    assert txn.commit_ts is not None
    return txn.commit_ts


def test_a_pass_keeps_the_newest_version_below_the_safe_point_and_removes_the_rest(
    gc_cluster: percolator.Cluster, backend: str,
) -> None:
    c = gc_cluster
    c.one_phase_commit = False  # which inlines every value: no data cells
    big = b"B" * 2000  # a data cell and a pointer record, not an inlined value
    for i in range(5):
        put(c, b"small", b"v%d" % i)
        put(c, b"large", big + b"%d" % i)
    put(c, b"gone", b"x")
    put(c, b"gone", None)
    put(c, b"back", b"old")
    put(c, b"back", None)
    put(c, b"back", b"new")
    summary = c.gc(retention=0)
    assert summary.safe_point > 0 and summary.collected_below == summary.safe_point
    assert summary.rows_scanned == 4
    small, large, back = raw(c, b"small"), raw(c, b"large"), raw(c, b"back")
    assert len(small["w:c:x"]) == 1 and small["w:c:x"][0][1].endswith(b"v4")
    assert len(large["w:c:x"]) == 1 and [v for _, v in large["d:c:x"]] == [big + b"4"]
    assert len(back["w:c:x"]) == 1
    gone = raw(c, b"gone")
    if isinstance(internals(c).store, ConditionalDelete):
        assert gone == {}, "a deleted cell with nothing newer goes entirely, lock included"
    else:
        assert list(gone) == ["l:c:x"]  # HBase Thrift1 cannot delete conditionally
    # 4 older small records, 4 older large records + 4 data, 2 records of "gone"
    # (+ its lock where it can go), 2 older records of "back".
    expected = 4 + 8 + 2 + 2 + (1 if isinstance(internals(c).store, ConditionalDelete) else 0)
    assert summary.versions_removed == expected
    assert summary.cells_removed == 1
    with percolator.Transaction(c) as txn:
        assert txn.get(T, b"small", "c:x") == b"v4"
        assert txn.get(T, b"large", "c:x") == big + b"4"
        assert txn.get(T, b"gone", "c:x") is None
        assert txn.get(T, b"back", "c:x") == b"new"
    # A cell removed entirely can be written again, and conflicts as before.
    put(c, b"gone", b"again")
    assert percolator.Snapshot(c).get(T, b"gone", "c:x") == b"again"
    again = c.gc(retention=0)
    assert again.versions_removed == 0


@pytest.mark.parametrize("pointer_by", ["committer", "lock-resolution"])
def test_a_pass_keeps_the_data_of_a_commit_across_its_safe_point(
    gc_cluster: percolator.Cluster, pointer_by: str,
) -> None:
    """A two-phase commit of a value too large to inline, to a new cell, starts below
    the safe point and commits after the pass drew its timestamp: its data lies below
    the safe point, the write record pointing to it above, and the cell has nothing
    below the safe point to keep. The pass must keep that data, or the committed value
    reads as absent. The record is written by the committer, or by lock resolution
    rolling a secondary forward (here the pass's own: the committer died after its
    commit point)."""
    c = gc_cluster
    c.one_phase_commit = False  # which inlines every value
    rolled = pointer_by == "lock-resolution"
    value = b"B" * 2000
    writer = percolator.Transaction(client_of(c) if rolled else c)
    if rolled:
        writer.set(T, b"primary", "c:x", b"p")
    writer.set(T, b"new", "c:x", value)

    def commit_once() -> None:  # at the pass's first step, after it drew its timestamp
        if writer.commit_ts is None:
            assert crash_commit(writer, CrashPoint("commit", 0)) if rolled else writer.commit()

    summary = collect(c, retention=0, max_txn_age=1e-9, before_step=commit_once)
    assert writer.commit_ts is not None
    assert writer.start_ts < summary.safe_point < writer.commit_ts
    assert summary.locks_resolved == (1 if rolled else 0)
    assert percolator.Snapshot(c).get(T, b"new", "c:x") == value
    assert summary.versions_removed == 0


def test_dry_run_counts_and_changes_nothing(gc_cluster: percolator.Cluster) -> None:
    c = gc_cluster
    for i in range(3):
        put(c, b"r", b"%d" % i)
    before = raw(c, b"r")
    dry = c.gc(retention=0, dry_run=True)
    assert dry.dry_run and dry.versions_removed == 2
    assert raw(c, b"r") == before
    assert internals(c).safe_point.fetch() == 0, "a dry run persists no safe point"
    assert c.gc(retention=0).versions_removed == 2


def test_a_running_transaction_holds_the_safe_point_back(gc_cluster: percolator.Cluster) -> None:
    c = gc_cluster
    put(c, b"r", b"1")
    reader = percolator.Snapshot(c)
    put(c, b"r", b"2")
    put(c, b"r", b"3")
    summary = c.gc(retention=0)
    assert summary.safe_point == reader.start_ts
    assert "this process" in summary.held_back_by
    assert reader.get(T, b"r", "c:x") == b"1"
    assert len(raw(c, b"r")["w:c:x"]) == 3  # 1 is what the reader sees: kept
    del reader
    assert c.gc(retention=0).versions_removed == 2


def test_a_closed_snapshot_stops_holding_the_safe_point_back(
    gc_cluster: percolator.Cluster,
) -> None:
    c = gc_cluster
    put(c, b"r", b"1")
    with percolator.Snapshot(c) as reader:
        put(c, b"r", b"2")
        assert c.gc(retention=0).safe_point == reader.start_ts
        assert reader.get(T, b"r", "c:x") == b"1"
    kept = reader  # still referenced, but closed: no longer a holder
    assert c.gc(retention=0).safe_point > kept.start_ts
    with pytest.raises(percolator.TransactionClosedError, match="closed"):
        kept.get(T, b"r", "c:x")
    writer = percolator.Transaction(c)
    writer.set(T, b"r", "c:x", b"3")
    writer.close()  # a Transaction's close is its rollback
    with pytest.raises(percolator.TransactionClosedError):
        writer.commit()
    assert percolator.Snapshot(c).get(T, b"r", "c:x") == b"2"


def test_the_too_old_error_names_a_snapshot_a_snapshot(tmp_path: Path) -> None:
    """The message calls the reader what the user made: a snapshot's says "snapshot"
    and to open a new one, a transaction's says "transaction" (the wording is the
    same on every backend: one embedded store)."""
    with percolator.connect(f"sqlite:{tmp_path / 'repo.db'}",
                            safe_point_refresh=REFRESH) as c:
        c.create_table(T)
        put(c, b"r", b"old")
        snapshot, transaction = percolator.Snapshot(c), percolator.Transaction(c)
        put(c, b"r", b"new")
        c.gc(retention=0, max_txn_age=1e-9)  # overtakes both
        for reader, what, remedy in ((snapshot, "snapshot", "open a new snapshot"),
                                     (transaction, "transaction", "start a new transaction")):
            with pytest.raises(percolator.SnapshotTooOldError) as info:
                reader.get(T, b"r", "c:x")
            assert str(info.value).startswith(f"{what} {reader.start_ts} is too old: ")
            assert f"; {remedy} (keep {what}s shorter" in str(info.value)
        with pytest.raises(percolator.SnapshotTooOldError,
                           match=f"^snapshot {snapshot.start_ts} is too old: "):
            percolator.Snapshot(c, start_ts=snapshot.start_ts)
        snapshot.close()
        transaction.close()


def test_a_snapshot_below_the_safe_point_raises_instead_of_reading(
    gc_cluster: percolator.Cluster,
) -> None:
    c = gc_cluster
    put(c, b"r", b"old")
    put(c, b"gone", b"x")
    old = percolator.Transaction(c)
    assert old.get(T, b"r", "c:x") == b"old"
    put(c, b"r", b"new")
    put(c, b"gone", None)
    # max_txn_age: `old` (running, this process) stops holding the safe point back.
    summary = c.gc(retention=0, max_txn_age=1e-9)
    assert summary.safe_point > old.start_ts
    assert raw(c, b"gone") == {} or list(raw(c, b"gone")) == ["l:c:x"]
    for read in (
        lambda: old.get(T, b"r", "c:x"),
        lambda: old.get(T, b"gone", "c:x"),  # removed entirely: must not read as absent
        lambda: old.get_row(T, b"r", ["c:x"]),
        lambda: list(old.scan(T)),
    ):
        with pytest.raises(percolator.SnapshotTooOldError) as info:
            read()
        assert str(old.start_ts) in str(info.value) and str(summary.safe_point) in str(info.value)
        assert info.value.start_ts == old.start_ts
        assert info.value.safe_point == summary.safe_point
        assert not percolator.is_retryable(info.value)
    with pytest.raises(percolator.SnapshotTooOldError):
        percolator.Snapshot(c, start_ts=old.start_ts)
    # Its own buffered writes need no store read; its commit is refused.
    old.set(T, b"r", "c:x", b"lost update")
    with pytest.raises(percolator.SnapshotTooOldError):
        old.commit()
    assert percolator.Snapshot(c).get(T, b"r", "c:x") == b"new"


TWO_HOURS = 7200.0


def test_a_young_transaction_holds_the_safe_point_back_past_an_older_one_overtaken(
    gc_cluster: percolator.Cluster,
) -> None:
    """Two transactions of this process: one began two hours ago, the other now. A pass
    with max_txn_age an hour overtakes the old one only; the young one keeps its
    snapshot."""
    c = gc_cluster
    put(c, b"r", b"1")
    old = percolator.Snapshot(c)
    old._began -= TWO_HOURS
    put(c, b"r", b"2")
    young = percolator.Snapshot(c)
    put(c, b"r", b"3")
    summary = c.gc(retention=0, max_txn_age=3600)
    assert summary.safe_point == young.start_ts
    assert summary.held_back_by == "this process"
    assert young.get(T, b"r", "c:x") == b"2"
    with pytest.raises(percolator.SnapshotTooOldError):
        old.get(T, b"r", "c:x")


OLD_AND_YOUNG = """
import sys, percolator
from percolator._internals import internals
cluster = percolator.connect(sys.argv[1], safe_point_refresh=float(sys.argv[2]))
old = percolator.Snapshot(cluster)
old._began -= 7200  # began two hours ago
young = percolator.Snapshot(cluster)
print(old.start_ts, young.start_ts, internals(cluster).coordination.current_owner(), flush=True)
sys.stdin.readline()
print(young.get("t", b"r", "c:x").decode(), flush=True)
try:
    old.get("t", b"r", "c:x")
except percolator.SnapshotTooOldError:
    print("too old", flush=True)
cluster.close()
"""


def test_a_young_transaction_in_another_process_holds_the_safe_point_back_past_an_older_one(
    gc_cluster: percolator.Cluster, store_url: str,
) -> None:
    """The same across processes: a client holding a transaction that began two hours
    ago and a young one publishes both, and a pass with max_txn_age an hour overtakes
    the old one only. Its oldest stays in the entry that older passes read, in the
    format they read."""
    c = gc_cluster
    put(c, b"r", b"1")
    child = subprocess.Popen(
        [sys.executable, "-c", OLD_AND_YOUNG, store_url, str(REFRESH)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        old_ts, young_ts, owner = child.stdout.readline().split()
        deadline = time.monotonic() + 60
        while True:  # its publisher may have run before the old one's start was set back
            holder = next((h for h in internals(c).safe_point.holders() if h.owner == owner), None)
            if holder is not None and time.time() - holder.began > TWO_HOURS - 60 and \
                    int(young_ts) in [ts for ts, _ in holder.younger]:
                break
            assert time.monotonic() < deadline, f"not published: {holder}"
            threading.Event().wait(REFRESH)
        assert holder.start_ts == int(old_ts)
        cells = internals(c).store.read_rows(META_TABLE, [b"gc"], [Read("m")])[b"gc"]
        oldest = cells[f"m:client/{owner}"][0][1]
        assert len(oldest) == 16 and struct.unpack(">Q", oldest[:8])[0] == int(old_ts)
        put(c, b"r", b"2")
        summary = c.gc(retention=0, max_txn_age=3600)
        assert summary.safe_point == int(young_ts)
        assert summary.held_back_by == f"client {owner}"
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "1"
        assert child.stdout.readline().strip() == "too old"
        assert child.wait(60) == 0
    finally:
        child.kill()
        child.wait()


def test_an_older_clients_entry_holds_the_safe_point_back_until_max_txn_age(
    gc_cluster: percolator.Cluster,
) -> None:
    """A client from before ``m:younger/`` publishes its oldest transaction only: a pass
    reads it as a client with nothing younger, held back by it within max_txn_age."""
    c = gc_cluster
    other = internals(client_of(c)).coordination
    column = f"m:client/{other.current_owner()}"
    put(c, b"r", b"1")
    start_ts = internals(c).timestamps.get_timestamp()
    put(c, b"r", b"2")

    def publish(began: float) -> None:
        record = struct.pack(">QQ", start_ts, int(began * 1000))
        internals(c).store.mutate_rows(META_TABLE, [Mutation(b"gc", [(column, 0, record)])])

    try:
        publish(time.time())
        (holder,) = internals(c).safe_point.holders()
        assert (holder.start_ts, holder.younger) == (start_ts, ())
        summary = c.gc(retention=0, max_txn_age=3600)
        assert (summary.safe_point, summary.held_back_by) == (start_ts, f"client {holder.owner}")
        publish(time.time() - TWO_HOURS)
        assert c.gc(retention=0, max_txn_age=3600).safe_point > start_ts
    finally:
        other.close()


@pytest.mark.parametrize("one_phase", [True, False], ids=["one-phase", "two-phase"])
def test_a_writer_overtaken_by_the_safe_point_never_commits(
    gc_cluster: percolator.Cluster, one_phase: bool,
) -> None:
    """The conflict that GC removed (a DELETE committed after our start, the whole cell
    gone) must not let an old writer commit: it is refused before its commit point."""
    c = gc_cluster
    c.one_phase_commit = one_phase
    put(c, b"r", b"1")
    writer = percolator.Transaction(c)
    assert writer.start_ts  # taken now (one that reads nothing could start over later)
    writer.set(T, b"r", "c:x", b"stale write")
    put(c, b"r", None)  # commits after the writer's start: a write-write conflict
    c.gc(retention=0, max_txn_age=1e-9)
    with pytest.raises(percolator.SnapshotTooOldError):
        writer.commit()
    assert percolator.Snapshot(c).get(T, b"r", "c:x") is None
    assert all(v[0][1][:1] == b"F" for n, v in raw(c, b"r").items() if n.startswith("l:"))


class ParkingStore:
    """The cluster's real store, with a parking place: the chosen thread (a thread, or
    a thread's name) stops at its next call of one of *methods* on *table* until the
    test lets it go: before the call, or with *after*, once the call has returned (a
    reply that arrives late)."""

    def __init__(
        self, store: Any, methods: tuple[str, ...] = ("read_rows", "set_unless"),
        table: str = T, after: bool = False,
    ) -> None:
        self._store = store
        self._methods = methods  # read_rows and set_unless: Bigtable's prewrite reads nothing
        self._table = table
        self._after = after
        self.thread: threading.Thread | str | None = None
        self.parked = threading.Event()
        self.go = threading.Event()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)  # AttributeError where the store lacks it
        if name not in self._methods:
            return attr

        def parking(table: str, *args: Any) -> Any:
            me = threading.current_thread()
            chosen = table == self._table and self.thread in (me, me.name)
            if chosen:
                self.thread = None
            if chosen and not self._after:
                self._park()
            result = attr(table, *args)
            if chosen and self._after:
                self._park()
            return result

        return parking

    def _park(self) -> None:
        self.parked.set()
        assert self.go.wait(60)


@pytest.mark.parametrize("collector_refresh", [0.5, 0.02], ids=["same", "faster-collector"])
def test_a_reader_parked_before_its_read_while_a_pass_removes_its_version(
    store_url: str, collector_refresh: float,
) -> None:
    """The race "reader passed its checks, a pass advances the safe point and removes
    the version, reader reads": the reader's cached safe point was fresh when it
    parked, and its read finds the version gone (the row's other column is there). It
    must raise, not return the row without it. The collector may trust its own cache
    for less time than the reader does: its pass must then wait out the reader's
    (announced) refresh, not its own."""
    refresh = 0.5  # long enough that the reader's cache is fresh when it parks
    with percolator.connect(store_url, safe_point_refresh=refresh) as c, \
            percolator.connect(store_url, safe_point_refresh=collector_refresh) as collector:
        c.create_table(T)
        put(c, b"r", b"seen")
        put(c, b"r", b"kept", column="c:y")
        reader = percolator.Snapshot(c)
        put(c, b"r", b"newer")
        parking = ParkingStore(internals(c).store)
        internals(c).store = parking
        outcome: list[object] = []

        def read() -> None:
            internals(c).safe_point.fetch()  # fresh when it parks
            parking.thread = threading.current_thread()
            try:
                outcome.append(reader.get_row(T, b"r", ["c:x", "c:y"]))
            except percolator.SnapshotTooOldError as e:
                outcome.append(e)

        thread = threading.Thread(target=read)
        thread.start()
        assert parking.parked.wait(60)
        # Another client (its own cache) runs the pass.
        summary = collect(collector, retention=0, max_txn_age=1e-9)
        assert summary.safe_point > reader.start_ts and summary.versions_removed == 1
        assert internals(collector).safe_point.grace() == 2 * refresh
        parking.go.set()
        thread.join(60)
        assert len(outcome) == 1
        assert isinstance(outcome[0], percolator.SnapshotTooOldError), outcome
        internals(c).store = parking._store
        c.drop_table(T)


def test_a_fetch_whose_reply_comes_late_counts_its_freshness_from_before_its_read(
    store_url: str,
) -> None:
    """The reader's fetch reads the safe point before a pass persists it, and its reply
    comes back only after the pass has waited its grace and removed the version (a
    stalled store call, a paused process). The cached value is as old as the read, not
    as the reply: stale by then, so the reader's check fetches again and raises
    instead of returning the row without the removed version."""
    refresh = 0.5
    with percolator.connect(store_url, safe_point_refresh=refresh) as c, \
            percolator.connect(store_url, safe_point_refresh=REFRESH) as collector:
        c.create_table(T)
        put(c, b"r", b"seen")
        put(c, b"r", b"kept", column="c:y")
        reader = percolator.Snapshot(c)
        put(c, b"r", b"newer")
        late = ParkingStore(internals(c).safe_point.store, ("read_rows",), META_TABLE, after=True)
        internals(c).safe_point.store = late
        outcome: list[object] = []

        def read() -> None:
            late.thread = threading.current_thread()
            internals(c).safe_point.fetch()  # reads the old safe point, returns after the pass
            try:
                outcome.append(reader.get_row(T, b"r", ["c:x", "c:y"]))
            except percolator.SnapshotTooOldError as e:
                outcome.append(e)

        thread = threading.Thread(target=read)
        thread.start()
        try:
            assert late.parked.wait(60)
            summary = collect(collector, retention=0, max_txn_age=1e-9)
            assert summary.safe_point > reader.start_ts and summary.versions_removed == 1
        finally:
            late.go.set()
            thread.join(60)
            internals(c).safe_point.store = late._store
        assert len(outcome) == 1
        assert isinstance(outcome[0], percolator.SnapshotTooOldError), outcome
        c.drop_table(T)


PASS = """
import sys, percolator
from percolator._gc import collect
cluster = percolator.connect(sys.argv[1], safe_point_refresh=float(sys.argv[2]))
print("ready", flush=True)
sys.stdin.readline()
collect(cluster, retention=0)
"""


class PassToKill:
    """A pass in another process, started and ready ahead (importing takes a while);
    :meth:`run_until` lets it go and kills it -9 once it has persisted the given safe
    point. Its refresh is a minute: it is then in two minutes of grace, removing
    nothing."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PASS, url, "60"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=ROOT, text=True)

    def __enter__(self) -> PassToKill:
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()

    def run_until(self, cluster: percolator.Cluster, safe_point: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + 60
        while internals(cluster).safe_point.fetch() != safe_point:
            assert self.proc.poll() is None, "the pass ended before persisting the safe point"
            assert time.monotonic() < deadline, "the pass did not persist the safe point"
            threading.Event().wait(0.005)
        self.proc.kill()
        self.proc.wait()


def test_a_pass_that_finds_the_safe_point_unchanged_still_waits_its_grace(store_url: str) -> None:
    """A pass persists the safe point P and is killed in its grace wait (or a second
    pass runs beside it). The next pass, held at P by the transaction that set it,
    finds P unchanged: it must still wait the grace before removing anything below P,
    or a reader below P whose cached safe point predates P but is still fresh reads the
    row with a version missing instead of getting SnapshotTooOldError."""
    refresh = 0.5
    with percolator.connect(store_url, safe_point_refresh=refresh) as c, \
            percolator.connect(store_url, safe_point_refresh=REFRESH) as collector:
        # The reader's publications lag (parked): no pass sees it, so P overtakes it.
        lagging = ParkingStore(internals(c).safe_point.store, ("mutate_rows",), META_TABLE)
        lagging.thread = "percolator-safe-point"
        internals(c).safe_point.store = lagging
        try:
            c.create_table(T)
            put(c, b"r", b"seen")
            put(c, b"r", b"kept", column="c:y")
            reader = percolator.Snapshot(c)
            put(c, b"r", b"newer")
            holder = percolator.Snapshot(collector)  # P: the collector's running transaction
            internals(collector).safe_point.publish()
            with PassToKill(store_url) as first:
                internals(c).safe_point.fetch()  # the reader's cache: fresh, from before P
                first.run_until(collector, holder.start_ts)
            assert raw(c, b"r")["w:c:x"][-1][1].endswith(b"seen"), "it removed nothing"
            summary = collect(collector, retention=0)
            assert summary.previous_safe_point == summary.safe_point == holder.start_ts
            assert summary.held_back_by.startswith("unchanged")
            assert summary.versions_removed == 1
            # the dead pass's is ignored
            assert internals(collector).safe_point.grace() == 2 * refresh
            with pytest.raises(percolator.SnapshotTooOldError):
                row = reader.get_row(T, b"r", ["c:x", "c:y"])
                pytest.fail(f"read {row!r}: a version was removed within the grace")
            holder.close()
        finally:
            lagging.go.set()
            internals(c).safe_point.store = lagging._store
        c.drop_table(T)


class ParkingTimestamps:
    """The cluster's real timestamp source; the chosen thread stops before it enters
    ``in_flight()`` (where the embedded store's one-phase commit begins its atomic step)."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.thread: threading.Thread | None = None
        self.parked = threading.Event()
        self.go = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def in_flight(self, atomically: Any) -> Any:
        if threading.current_thread() is self.thread:
            self.thread = None
            self.parked.set()
            assert self.go.wait(60)
        return self._source.in_flight(atomically)


@pytest.mark.parametrize("one_phase", [False, True], ids=["two-phase", "one-phase"])
def test_a_writer_parked_before_its_prewrite_while_a_pass_removes_its_conflict(
    store_url: str, backend: str, one_phase: bool,
) -> None:
    """The same race for a writer: its commit passed the first check, then a pass
    removes the DELETE it conflicts with (the whole cell), then it prewrites (or, in
    one phase, checks and writes) and finds no conflict. Its check after the prewrite
    (inside the atomic step) refuses the commit."""
    if one_phase and backend != "sqlite":
        pytest.skip("only the embedded store commits in one phase")
    with percolator.connect(store_url, safe_point_refresh=0.5) as c:
        c.one_phase_commit = one_phase
        c.create_table(T)
        put(c, b"r", b"1")
        writer = percolator.Transaction(c)
        assert writer.start_ts  # taken now (one that reads nothing could start over later)
        writer.set(T, b"r", "c:x", b"lost update")
        put(c, b"r", None)  # a conflict: committed after the writer's start
        parts = internals(c)
        parking: Any = (ParkingTimestamps(parts.timestamps) if one_phase
                        else ParkingStore(parts.store))
        if one_phase:
            internals(c).timestamps = parking
        else:
            internals(c).store = parking
        outcome: list[object] = []

        def commit() -> None:
            internals(c).safe_point.fetch()  # fresh when it parks
            parking.thread = threading.current_thread()
            try:
                outcome.append(writer.commit())
            except percolator.PercolatorError as e:
                outcome.append(e)

        thread = threading.Thread(target=commit)
        thread.start()
        assert parking.parked.wait(60)
        with percolator.connect(store_url, safe_point_refresh=0.5) as collector:  # own cache
            summary = collect(collector, retention=0, max_txn_age=1e-9)
        assert summary.cells_removed == 1
        parking.go.set()
        thread.join(60)
        if one_phase:
            internals(c).timestamps = parking._source
        else:
            internals(c).store = parking._store
        assert len(outcome) == 1
        assert isinstance(outcome[0], percolator.SnapshotTooOldError), outcome
        assert percolator.Snapshot(c).get(T, b"r", "c:x") is None
        c.drop_table(T)


READER = """
import sys, percolator
cluster = percolator.connect(sys.argv[1], safe_point_refresh=float(sys.argv[2]))
snap = percolator.Snapshot(cluster)
print(snap.start_ts, snap.get("t", b"r", "c:x").decode(), flush=True)
sys.stdin.readline()
print(snap.get("t", b"r", "c:x").decode(), flush=True)
cluster.close()
"""


def test_a_long_running_reader_in_another_process_keeps_its_snapshot(
    gc_cluster: percolator.Cluster, store_url: str,
) -> None:
    c = gc_cluster
    put(c, b"r", b"v0")
    child = subprocess.Popen(
        [sys.executable, "-c", READER, store_url, str(REFRESH)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        start_ts, first = child.stdout.readline().split()
        assert first == "v0"
        # Its publication (refreshed in the background) is what protects it.
        while not any(h.start_ts == int(start_ts) for h in internals(c).safe_point.holders()):
            threading.Event().wait(REFRESH)
        for i in range(1, 4):
            put(c, b"r", b"v%d" % i)
            summary = c.gc(retention=0)
            assert summary.safe_point == int(start_ts)
            assert "client " in summary.held_back_by
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "v0"
        assert child.wait(60) == 0
    finally:
        child.kill()
        child.wait()
    # Gone with its process: the next pass removes what it held.
    assert c.gc(retention=0).versions_removed == 3


def test_a_pass_leaves_the_cells_of_a_held_lock_alone(gc_cluster: percolator.Cluster) -> None:
    """A committed transaction whose committer died after its commit point leaves a
    lock on a secondary whose only older record is a DELETE: the pass must neither
    remove that lock (the cell looks deletable) nor anything its roll-forward needs."""
    c = gc_cluster
    put(c, b"s", b"old")
    put(c, b"s", None)
    older = percolator.Transaction(c)
    assert older.start_ts  # its snapshot, taken now: holds the safe point below the dead commit
    dead = percolator.Transaction(client_of(c))
    dead.set(T, b"p", "c:x", b"primary")
    dead.set(T, b"s", "c:x", b"secondary")
    assert crash_commit(dead, CrashPoint("commit", 0))  # committed, secondary locked
    summary = c.gc(retention=0)
    assert summary.safe_point == older.start_ts < dead.start_ts
    assert raw(c, b"s")["l:c:x"][0][1][:1] == b"L", "the held lock stays"
    older.rollback()
    assert percolator.Snapshot(c).get(T, b"s", "c:x") == b"secondary"
    c.gc(retention=0)
    assert percolator.Snapshot(c).get(T, b"s", "c:x") == b"secondary"


class DrawParking:
    """The cluster's real timestamp source; the chosen thread stops right after it drew
    a timestamp, before its caller has it."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.thread: threading.Thread | None = None
        self.parked = threading.Event()
        self.go = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def get_timestamp(self) -> int:
        ts: int = self._source.get_timestamp()
        if threading.current_thread() is self.thread:
            self.parked.set()
            assert self.go.wait(60)
        return ts


def test_a_pass_waits_for_a_transaction_of_its_process_drawing_its_start(store_url: str) -> None:
    """A transaction that drew its start timestamp but is not registered yet: a pass in
    the same process, even with retention 0, must not take a safe point above it."""
    with percolator.connect(store_url, safe_point_refresh=REFRESH) as c:
        c.create_table(T)
        put(c, b"r", b"1")
        parking = DrawParking(internals(c).timestamps)
        internals(c).timestamps = parking
        started: list[percolator.Snapshot] = []
        passes: list[object] = []
        begin = threading.Thread(target=lambda: started.append(percolator.Snapshot(c)))
        parking.thread = begin
        begin.start()
        assert parking.parked.wait(60)
        gc = threading.Thread(target=lambda: passes.append(c.gc(retention=0)))
        gc.start()
        gc.join(1.0)  # (without the wait, the pass is over by now)
        parking.go.set()
        begin.join(60)
        gc.join(60)
        internals(c).timestamps = parking._source
        (snapshot,) = started
        (summary,) = passes
        assert isinstance(summary, percolator._gc.GcSummary)
        assert summary.safe_point <= snapshot.start_ts
        put(c, b"r", b"2")
        c.gc(retention=0)
        assert snapshot.get(T, b"r", "c:x") == b"1"
        c.drop_table(T)


# --- bulk loads: one transaction written by workers in other processes ----------------------


def test_a_running_bulk_load_holds_the_safe_point_back(gc_cluster: percolator.Cluster) -> None:
    c = gc_cluster
    put(c, b"r", b"1")
    load = BulkLoad(c, T, "held")
    txn = load.begin({})
    assert isinstance(txn, LoadTxn)
    put(c, b"r", b"2")
    assert c.gc(retention=0).safe_point == txn.start_ts
    commit_ts = load.commit({})
    finish_rows(c, txn, list(prewrite_rows(c, txn, [])), commit_ts)
    assert c.gc(retention=0).safe_point > txn.start_ts  # released at its commit


def test_a_bulk_load_overtaken_by_the_safe_point_never_commits(
    gc_cluster: percolator.Cluster,
) -> None:
    """A DELETE committed after the load's start is its write-write conflict; a pass
    that (past max_txn_age) overtakes the load removes that cell entirely, so the
    workers' conflict check finds nothing. The driver's check before its commit point
    must refuse the commit, or the load would silently undo the delete."""
    c = gc_cluster
    put(c, b"r", b"1")
    load = BulkLoad(c, T, "overtaken")
    txn = load.begin({})
    assert isinstance(txn, LoadTxn)
    put(c, b"r", None)  # the conflict
    summary = collect(c, retention=0, max_txn_age=1e-9)
    assert summary.safe_point > txn.start_ts and summary.cells_removed == 1
    locked = list(prewrite_rows(c, txn, [(b"r", {"c:x": b"load"})]))  # sees no conflict
    with pytest.raises(percolator.SnapshotTooOldError) as caught:
        load.commit({})
    assert caught.value.start_ts == txn.start_ts
    load.abort()
    finish_rows(c, txn, locked, None)
    assert percolator.Snapshot(c).get(T, b"r", "c:x") is None
