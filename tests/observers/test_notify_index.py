"""The notification index (``percolator/_notify_index.py``) on Bigtable, where workers
find notifications through it, and idle workers (``observers/_worker.py``): entries
follow notifications, a worker never deletes the entry of a change still in flight,
tables from before the index keep their pending notifications, and sleeping
scanners wake for new work.

Each test runs on the embedded store too, declaring the index as Bigtable does
(``indexed-sqlite``): the index's decisions do not depend on the store, the suite
then checks them without the emulator, and ``scripts/mutation`` (the embedded store
only) reaches them."""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

import observers._scanner
import percolator
from observers import Observer, Worker, wait_for_observers
from percolator import (
    OracleUnavailable,
    Snapshot,
    StoreUnavailable,
    Transaction,
    TransactionBase,
    metrics,
)
from percolator._bulk import BulkLoad, LoadTxn, finish_rows, prewrite_rows
from percolator._commit_checks import _write_notifications
from percolator._encoding import FREE_TAG
from percolator._internals import internals
from percolator._notifications import (
    _NO_FAILURES,
    Quarantined,
    WaitTimeout,
    _failures_key,
    _read_failures,
    pending_notifications,
    quarantine,
    retry_quarantined,
)
from percolator._notify_index import (
    INDEX_TABLE,
    index_key,
    migrate,
    scan_index,
    settle,
    settle_rows,
    uses_index,
    write_entries,
)
from percolator._store import NOTIFY_INDEX, Mutation, Read
from percolator._two_phase import TwoPhaseCommit
from percolator.stores.sqlite import SqliteStore
from percolator.testing import CrashPoint, Interleaving, client_of, crash_commit
from tests._backends import BIGTABLE, backend_fixture, make_store_url


class Copy(Observer):
    table, column = "docs", "raw:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, "out:v", txn.get(self.table, row, column) or b"")


backend = backend_fixture([BIGTABLE, pytest.param("indexed-sqlite", id="indexed-sqlite")])


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> str:
    if backend == "bigtable":
        return make_store_url("bigtable", request, tmp_path)
    # Every embedded store the test opens declares the index (connect() then makes
    # its table); a test's own "older client" takes the declaration off its store.
    monkeypatch.setattr(SqliteStore, "capabilities", SqliteStore.capabilities | {NOTIFY_INDEX})
    return make_store_url("sqlite", request, tmp_path)


@pytest.fixture
def cluster_tables() -> tuple[str, ...]:
    return ("docs",)


def entries(cluster: percolator.Cluster) -> dict[tuple[str, bytes], set[str]]:
    return {(t, r): set(cols) for t, r, cols in scan_index(internals(cluster), None, None)}


def write(cluster: percolator.Cluster, row: bytes, value: bytes) -> None:
    with Transaction(cluster) as txn:
        txn.set("docs", row, "raw:v", value)


def test_entries_follow_notifications_and_go_once_processed(
    cluster: percolator.Cluster,
) -> None:
    assert uses_index(internals(cluster).store)
    Worker(cluster, [Copy]).register()
    write(cluster, b"a", b"1")
    with Transaction(cluster) as txn:  # a weak notification gets an entry too
        txn.notify("docs", b"b", "raw:v")
    assert entries(cluster) == {("docs", b"a"): {"raw:v"}, ("docs", b"b"): {"raw:v"}}
    with Worker(cluster, [Copy], threads=2):
        wait_for_observers(cluster, 60)
    assert Snapshot(cluster).get("docs", b"a", "out:v") == b"1"
    assert entries(cluster) == {}  # settled entries are deleted


@pytest.mark.parametrize("look_first", [True, False], ids=["looked-first", "deleted-first"])
def test_a_worker_keeps_the_entry_of_a_change_whose_lock_is_held(
    cluster: percolator.Cluster, look_first: bool
) -> None:
    """The race settle() closes: the committer has written the entry (before its
    commit point) but not yet the notify cell when a worker looks at the cell. A
    worker that deletes first must find the lock on its second look and write the
    entry back."""
    Worker(cluster, [Copy]).register()
    txn = Transaction(cluster)
    txn.set("docs", b"other", "misc:x", b"primary")
    txn.set("docs", b"k", "raw:v", b"late")
    committer = TwoPhaseCommit.of(txn)
    committer.prewrite()
    commit_ts = internals(cluster).timestamps.get_timestamp()
    _write_notifications(committer.write_set, committer.cells, commit_ts)
    seen = {c: ts for t, r, e in scan_index(internals(cluster), None, None) if r == b"k"
            for c, ts in e.items()}
    # a worker finds the entry, no notify cell yet: the entry must stay
    assert settle(internals(cluster), "docs", b"k", seen, look_first=look_first) == ["raw:v"]
    committer.commit_point(commit_ts)
    committer.commit_secondaries(commit_ts)
    assert ("docs", b"k") in entries(cluster)
    with Worker(cluster, [Copy], threads=2):
        wait_for_observers(cluster, 60)
    assert Snapshot(cluster).get("docs", b"k", "out:v") == b"late"


def test_a_stale_entry_of_a_rolled_back_change_is_deleted(cluster: percolator.Cluster) -> None:
    Worker(cluster, [Copy]).register()
    txn = Transaction(cluster)
    txn.set("docs", b"r", "raw:v", b"never")
    committer = TwoPhaseCommit.of(txn)
    committer.prewrite()
    _write_notifications(committer.write_set, committer.cells,
                         internals(cluster).timestamps.get_timestamp())
    committer.abort()
    assert ("docs", b"r") in entries(cluster)
    with Worker(cluster, [Copy], threads=2) as worker:
        while worker.stats["passes"] < 2:  # every scanner has passed over it
            time.sleep(0.01)
    assert entries(cluster) == {}
    assert Snapshot(cluster).get("docs", b"r", "out:v") is None


def test_a_quarantined_notification_put_back_gets_an_entry_at_its_new_version(
    cluster: percolator.Cluster,
) -> None:
    """Quarantine deletes the notify cell and leaves its entry, which a pass settles;
    the retry writes the cell again at a fresh timestamp and its entry with it, or the
    notification put back is found by no worker (scanners read the index only)."""
    Worker(cluster, [Copy]).register()
    write(cluster, b"q", b"1")
    [pending] = list(pending_notifications(cluster))
    quarantine(cluster, Quarantined("docs", b"q", "raw:v", "Copy", "boom", 3, False,
                                    time.time()), pending.timestamps[0])
    [(_, _, seen)] = scan_index(internals(cluster), None, None)
    assert settle(internals(cluster), "docs", b"q", seen) == []
    assert entries(cluster) == {}
    assert [q.row for q in retry_quarantined(cluster)] == [b"q"]
    [back] = list(pending_notifications(cluster))
    assert back.timestamps[0] > pending.timestamps[0]
    assert [(t, r, e) for t, r, e in scan_index(internals(cluster), None, None)] == [
        ("docs", b"q", {"raw:v": back.timestamps[0]})]


def test_an_index_scan_returns_its_range_and_each_row_key_whole(
    cluster: percolator.Cluster,
) -> None:
    """Scanners read the index from a random key to its end, then from its start to
    that key: the two ranges hold every entry once. A row key may hold NUL bytes (the
    index row's separator after the table name)."""
    Worker(cluster, [Copy]).register()
    rows = [b"a\0b", b"\0", b"r1", b"r2", b"r3"]
    for row in rows:
        write(cluster, row, b"1")
    keys = sorted(index_key("docs", row) for row in rows)
    host = internals(cluster)
    assert sorted((t, r) for t, r, _ in scan_index(host, None, None)) == sorted(
        ("docs", row) for row in rows)
    middle = keys[2]
    assert [index_key(t, r) for t, r, _ in scan_index(host, middle, None)] == keys[2:]
    assert [index_key(t, r) for t, r, _ in scan_index(host, None, middle)] == keys[:2]


def test_an_index_row_key_keeps_the_format_that_earlier_releases_wrote(
    cluster: percolator.Cluster,
) -> None:
    """The index row of a cell is part of the stored format: two lowercase hex digits
    of the low byte of crc32(table NUL row), then table NUL row. A worker settles an
    entry at the key it computes, so one that computed another key than the release
    that wrote the entry would never delete it."""
    Worker(cluster, [Copy]).register()
    write(cluster, b"r1", b"1")
    stored = [key for key, _ in internals(cluster).store.scan(INDEX_TABLE, None, None,
                                                             [Read("n")])]
    assert stored == [b"%02x" % (zlib.crc32(b"docs\0r1") & 0xFF) + b"docs\0r1"]


def test_a_table_from_before_the_index_keeps_its_pending_notifications(store_url: str) -> None:
    """A notification written without an index entry (the layout before it, or a
    client that does not write it) is found by the migration a worker runs once."""
    with percolator.connect(store_url) as old:
        store = internals(old).store
        store.capabilities = store.capabilities - {NOTIFY_INDEX}  # an older client
        old.create_table("docs")
        Worker(old, [Copy]).register()
        write(old, b"before", b"pending")
        notify = internals(old).store.read_rows("docs", [b"before"], [Read("n")])
        assert notify[b"before"]  # the old layout: a notify cell, no entry
    with percolator.connect(store_url) as cluster:
        assert entries(cluster) == {}
        with Worker(cluster, [Copy], threads=2):
            wait_for_observers(cluster, 60)
        assert Snapshot(cluster).get("docs", b"before", "out:v") == b"pending"
        assert migrate(internals(cluster), "docs") == 0  # once per table
        assert entries(cluster) == {}


def test_sleeping_scanners_wake_for_a_change_made_in_another_process(store_url: str) -> None:
    """Scanners that found nothing sleep for idle_max (here an hour): the lookout sees
    the new entry and wakes them. (A commit through another Cluster object does not
    ring this process's bell, as one in another process would not.)"""
    with percolator.connect(store_url) as cluster, percolator.connect(store_url) as other:
        cluster.create_table("docs")
        worker = Worker(cluster, [Copy], threads=2, idle_max=3600, poll_interval=0.02)
        with worker:
            while worker.stats["idle"] < 2:  # both scanners went to sleep
                time.sleep(0.01)
            write(other, b"x", b"woken")
            wait_for_observers(cluster, 60)
            assert worker.stats["wakeups"] >= 1
        assert Snapshot(cluster).get("docs", b"x", "out:v") == b"woken"


def test_a_local_commit_wakes_sleeping_scanners_without_the_lookout(store_url: str) -> None:
    with percolator.connect(store_url) as cluster:
        cluster.create_table("docs")
        worker = Worker(cluster, [Copy], threads=2, idle_max=3600, poll_interval=3600)
        with worker:
            while worker.stats["idle"] < 2:
                time.sleep(0.01)
            write(cluster, b"y", b"rung")
            wait_for_observers(cluster, 60)
        assert Snapshot(cluster).get("docs", b"y", "out:v") == b"rung"


def test_a_bulk_load_of_an_observed_column_is_observed(cluster: percolator.Cluster) -> None:
    """Bulk loads (the Spark loader) write notify cells when they release their cells:
    their index entries go in at prewrite, while the locks are held."""
    Worker(cluster, [Copy]).register()
    load = BulkLoad(cluster, "docs", "bulk")
    txn = load.begin({})
    assert isinstance(txn, LoadTxn)
    locked = list(prewrite_rows(cluster, txn, [(b"b1", {"raw:v": b"loaded"}),
                                               (b"b2", {"misc:x": b"unobserved"})]))
    assert entries(cluster) == {("docs", b"b1"): {"raw:v"}}
    finish_rows(cluster, txn, locked, load.commit({}))
    with Worker(cluster, [Copy], threads=2):
        wait_for_observers(cluster, 60)
    assert Snapshot(cluster).get("docs", b"b1", "out:v") == b"loaded"


def test_status_and_wait_read_the_index_not_the_table(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pending_notifications`` (``percolator status``, metrics) and ``wait`` cost
    O(pending) on Bigtable: once a table is migrated they read its index entries and
    the rows they name, never a scan of the table; a table not yet migrated is
    scanned, so a notification from before the index is still seen."""
    with percolator.connect(store_url) as old:
        store = internals(old).store
        store.capabilities = store.capabilities - {NOTIFY_INDEX}  # an older client
        old.create_table("docs")
        Worker(old, [Copy]).register()
        write(old, b"before", b"pending")
    with percolator.connect(store_url) as cluster:
        assert [(p.table, p.row) for p in pending_notifications(cluster)] == [
            ("docs", b"before")]  # unmigrated: found by a scan
        Worker(cluster, [Copy]).register()  # migrates
        with Transaction(cluster) as txn:
            for i in range(40):  # unobserved: no notification, no entry
                txn.set("docs", b"quiet%02d" % i, "other:v", b"x")
        write(cluster, b"n0", b"1")
        write(cluster, b"n1", b"1")
        crashed = Transaction(client_of(cluster))
        crashed.set("docs", b"n2", "raw:v", b"1")
        crashed.set("docs", b"n3", "raw:v", b"1")
        assert crash_commit(crashed, CrashPoint("commit_point"))  # a secondary stays locked

        scanned: list[str] = []
        scan = internals(cluster).store.scan

        def recording_scan(table: str, *args: object, **kwargs: object) -> object:
            scanned.append(table)
            return scan(table, *args, **kwargs)

        monkeypatch.setattr(internals(cluster).store, "scan", recording_scan)
        pending = {p.row for p in pending_notifications(cluster)}
        with pytest.raises(WaitTimeout) as timed_out:
            wait_for_observers(cluster, timeout=0)
        locked = {lk.row for lk in timed_out.value.locks}
        assert len(locked) == 1 and not pending & locked  # the crashed secondary
        assert pending | locked == {b"before", b"n0", b"n1", b"n2", b"n3"}
        assert set(scanned) == {INDEX_TABLE}, scanned
        monkeypatch.undo()
        with Worker(cluster, [Copy], threads=2):
            wait_for_observers(cluster, 60)
        for row in (b"n2", b"n3", b"before"):
            assert Snapshot(cluster).get("docs", row, "out:v") is not None
        assert list(pending_notifications(cluster)) == []


def test_pending_notifications_of_one_table_find_every_entry_of_it_and_no_other(
    cluster: percolator.Cluster,
) -> None:
    """``pending_notifications`` asked for one table reads the index, where the entries
    of two tables interleave (buckets spread them), in batches of rows: every pending
    notification of that table, past the other table's entries and past a batch's
    end, and none of the other table."""
    cluster.create_table("other")
    docs = [b"d%03d" % i for i in range(120)]  # more than one batch of rows (100)
    with Transaction(cluster) as txn:
        for row in docs:
            txn.notify("docs", row, "raw:v")
        for i in range(30):
            txn.notify("other", b"o%02d" % i, "raw:v")
    for table in ("docs", "other"):
        migrate(internals(cluster), table)  # as a worker does: the index then answers
    assert {p.row for p in pending_notifications(cluster, ["docs"])} == set(docs)
    assert {p.table for p in pending_notifications(cluster)} == {"docs", "other"}


def test_a_settle_looks_first_and_leaves_a_busy_cells_entry_as_written(
    cluster: percolator.Cluster,
) -> None:
    """``settle`` (as a worker calls it on a row it could not process) looks at the
    cell before deleting anything: the entry of a cell whose live committer holds its
    lock (entry written, commit point not yet made) stays as written, at its
    timestamp. Deleted and written back, it would carry a new timestamp, which a
    worker's lookout takes for new work."""
    Worker(cluster, [Copy]).register()
    with Interleaving(cluster) as world:
        writer = client_of(cluster)
        writer.one_phase_commit = False
        txn = Transaction(writer)
        txn.set("docs", b"p", "misc:x", b"primary")
        txn.set("docs", b"k", "raw:v", b"late")
        committer = world.actor("committer", txn.commit, clients=[writer])
        committer.run_until(lambda s: s.matches("timestamp"))
        committer.step()  # drew its commit timestamp
        committer.run_until(lambda s: s.matches("check_and_set", row=b"p"))  # the commit point
        written = entries_at(cluster)[("docs", b"k")]
        assert settle(internals(cluster), "docs", b"k", written) == ["raw:v"]
        assert entries_at(cluster)[("docs", b"k")] == written
        committer.finish()
    with Worker(cluster, [Copy], threads=1):
        wait_for_observers(cluster, 60)
    assert Snapshot(cluster).get("docs", b"k", "out:v") == b"late"


def test_settling_resolves_a_dead_committers_lock_and_keeps_its_entry(
    cluster: percolator.Cluster,
) -> None:
    """The committer died after its commit point, k's lock still held (entry written,
    notify cell not yet): settling k resolves the lock as a reader would (rolled
    forward, which writes the notify cell), keeps the entry, and the change is
    observed."""
    Worker(cluster, [Copy]).register()
    dying = Transaction(client_of(cluster))
    dying.set("docs", b"p", "misc:x", b"primary")
    dying.set("docs", b"k", "raw:v", b"late")
    assert crash_commit(dying, CrashPoint("commit_point")) is True
    written = entries_at(cluster)[("docs", b"k")]
    assert settle(internals(cluster), "docs", b"k", written) == ["raw:v"]
    lock = internals(cluster).store.read_rows("docs", [b"k"], [Read("l", ("raw:v",))])
    assert lock[b"k"]["l:raw:v"][0][1][:1] == FREE_TAG  # rolled forward
    with Worker(cluster, [Copy], threads=1):
        wait_for_observers(cluster, 60)
    assert Snapshot(cluster).get("docs", b"k", "out:v") == b"late"


@pytest.mark.parametrize("look_first", [True, False], ids=["looked-first", "deleted-first"])
def test_rows_settled_together_keep_a_held_entry_behind_a_lock_of_another_rows_column(
    cluster: percolator.Cluster, look_first: bool
) -> None:
    """settle_rows of rows a (raw:v, settled) and k (its entry on raw:w), where k's live
    committer holds k's locks on raw:v and raw:w: the read for the batch returns k's
    raw:v lock too (a column of a's); passing over it, the re-check must still see
    k's raw:w lock and keep its entry."""
    Worker(cluster, [Copy, CopyW]).register()
    write(cluster, b"a", b"1")
    with Worker(cluster, [Copy, CopyW], threads=1):
        wait_for_observers(cluster, 60)
    stale = internals(cluster).timestamps.get_timestamp()
    write_entries(internals(cluster), [("docs", b"a", "raw:v")], stale)  # a settled cell
    with Interleaving(cluster) as world:
        writer = client_of(cluster)
        writer.one_phase_commit = False
        txn = Transaction(writer)
        txn.set("docs", b"p", "misc:x", b"primary")
        txn.set("docs", b"k", "raw:v", b"v")
        txn.set("docs", b"k", "raw:w", b"w")
        committer = world.actor("committer", txn.commit, clients=[writer])
        committer.run_until(lambda s: s.matches("timestamp"))
        committer.step()  # drew its commit timestamp
        committer.run_until(lambda s: s.matches("check_and_set", row=b"p"))  # the commit point
        held = {"raw:w": entries_at(cluster)[("docs", b"k")]["raw:w"]}
        batch = [("docs", b"a", {"raw:v": stale}), ("docs", b"k", held)]
        kept = settle_rows(internals(cluster), batch, look_first=look_first)
        assert kept == {("docs", b"a"): [], ("docs", b"k"): ["raw:w"]}
        assert "raw:w" in entries_at(cluster)[("docs", b"k")]
        committer.finish()
    with Worker(cluster, [Copy, CopyW], threads=1):
        wait_for_observers(cluster, 60)
    assert Snapshot(cluster).get("docs", b"k", "out:w") == b"w"


def entries_at(cluster: percolator.Cluster) -> dict[tuple[str, bytes], dict[str, int]]:
    return {(t, r): cols for t, r, cols in scan_index(internals(cluster), None, None)}


class CountingIndexWrites:
    """The cluster's store, counting calls that delete index entries, reads of the
    data table's notify cells, and all reads of the data table."""

    def __init__(self, store: object) -> None:
        self._store = store
        self.deletions = 0
        self.reads = 0
        self.docs_reads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def mutate_rows(self, table: str, mutations: list[Mutation]) -> None:
        if table == INDEX_TABLE and any(m.deletes for m in mutations):
            self.deletions += 1
        self._store.mutate_rows(table, mutations)  # type: ignore[attr-defined]

    def read_rows(self, table: str, rows: list[bytes], reads: list[Read]) -> object:
        self.reads += table == "docs" and any(r.family == "n" for r in reads)
        self.docs_reads += table == "docs"
        return self._store.read_rows(table, rows, reads)  # type: ignore[attr-defined]


@pytest.mark.parametrize("look_first", [True, False], ids=["looked-first", "deleted-first"])
def test_rows_settled_together_keep_the_entry_of_a_change_whose_lock_is_held(
    cluster: percolator.Cluster, look_first: bool
) -> None:
    """settle_rows, several rows at once: the row whose committer holds its lock (entry
    written, notify cell not yet) keeps its entry; the settled rows' entries go; one
    deletion and one read for all of them (fails without the read after the
    deletion: the held row's entry is lost)."""
    Worker(cluster, [Copy]).register()
    for row in (b"a", b"b"):
        write(cluster, row, b"1")
    with Worker(cluster, [Copy], threads=1):
        wait_for_observers(cluster, 60)
    write_entries(internals(cluster), [("docs", b"a", "raw:v"), ("docs", b"b", "raw:v")],
                  internals(cluster).timestamps.get_timestamp())  # stale entries of settled cells
    txn = Transaction(cluster)
    txn.set("docs", b"other", "misc:x", b"primary")
    txn.set("docs", b"k", "raw:v", b"late")
    committer = TwoPhaseCommit.of(txn)
    committer.prewrite()
    commit_ts = internals(cluster).timestamps.get_timestamp()
    _write_notifications(committer.write_set, committer.cells, commit_ts)
    seen = list(scan_index(internals(cluster), None, None))
    assert {r for _, r, _ in seen} == {b"a", b"b", b"k"}
    counting = CountingIndexWrites(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        kept = settle_rows(internals(cluster), seen, look_first=look_first)
    finally:
        internals(cluster).store = counting._store  # type: ignore[assignment]
    assert kept == {("docs", b"a"): [], ("docs", b"b"): [], ("docs", b"k"): ["raw:v"]}
    assert counting.deletions == 1 and counting.reads == (2 if look_first else 1)
    assert entries(cluster) == {("docs", b"k"): {"raw:v"}}
    committer.commit_point(commit_ts)
    committer.commit_secondaries(commit_ts)
    with Worker(cluster, [Copy], threads=2):
        wait_for_observers(cluster, 60)
    assert Snapshot(cluster).get("docs", b"k", "out:v") == b"late"
    assert entries(cluster) == {}


class CopyW(Observer):
    table, column = "docs", "raw:w"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, "out:w", txn.get(self.table, row, column) or b"")


@pytest.mark.parametrize("look_first", [True, False], ids=["looked-first", "deleted-first"])
def test_rows_settled_together_on_different_columns_keep_the_entry_of_a_held_lock(
    cluster: percolator.Cluster, look_first: bool
) -> None:
    """settle_rows with rows observed on different columns: the batch's first row
    settled on raw:v, the next one's committer holding its lock on raw:w (entry
    written, notify cell not yet). Each row's re-check must read its own columns: the
    held row keeps its entry, and its change is observed.

    Catches the re-check that reads, per table, the columns of the batch's first row
    only (``columns = rows[first]`` in ``settle_rows``'s ``busy``): it misses the lock
    on raw:w, deletes the entry for good, and the observer never runs for the change
    (the index is how a Bigtable worker finds it)."""
    Worker(cluster, [Copy, CopyW]).register()
    write(cluster, b"a", b"1")
    with Worker(cluster, [Copy, CopyW], threads=1):
        wait_for_observers(cluster, 60)
    stale = internals(cluster).timestamps.get_timestamp()
    write_entries(internals(cluster), [("docs", b"a", "raw:v")], stale)  # a settled cell
    txn = Transaction(cluster)
    txn.set("docs", b"other", "misc:x", b"primary")
    txn.set("docs", b"k", "raw:w", b"late")
    committer = TwoPhaseCommit.of(txn)
    committer.prewrite()
    commit_ts = internals(cluster).timestamps.get_timestamp()
    _write_notifications(committer.write_set, committer.cells, commit_ts)
    held = {c: ts for _, r, e in scan_index(internals(cluster), None, None) if r == b"k"
            for c, ts in e.items()}
    assert list(held) == ["raw:w"]
    batch = [("docs", b"a", {"raw:v": stale}), ("docs", b"k", held)]  # a first
    kept = settle_rows(internals(cluster), batch, look_first=look_first)
    assert kept == {("docs", b"a"): [], ("docs", b"k"): ["raw:w"]}
    assert entries(cluster) == {("docs", b"k"): {"raw:w"}}
    committer.commit_point(commit_ts)
    committer.commit_secondaries(commit_ts)
    with Worker(cluster, [Copy, CopyW], threads=1):
        wait_for_observers(cluster, 60)
    assert Snapshot(cluster).get("docs", b"k", "out:w") == b"late"
    assert entries(cluster) == {}


def test_a_pass_settles_the_entries_of_the_rows_it_processed_together(
    cluster: percolator.Cluster
) -> None:
    """Twelve rows notified before the worker starts: its first pass processes them
    all and deletes their entries in one call, not one per row (fails with
    SETTLE_MAX = 1)."""
    Worker(cluster, [Copy]).register()
    with Transaction(cluster) as txn:
        for i in range(12):
            txn.set("docs", b"r%02d" % i, "raw:v", b"%d" % i)
    counting = CountingIndexWrites(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        with Worker(cluster, [Copy], threads=1):
            wait_for_observers(cluster, 60)
    finally:
        internals(cluster).store = counting._store  # type: ignore[assignment]
    assert entries(cluster) == {}
    assert 1 <= counting.deletions <= 2
    assert all(Snapshot(cluster).get("docs", b"r%02d" % i, "out:v") == b"%d" % i
               for i in range(12))


def test_a_scanner_skips_a_row_another_scanner_of_its_worker_served(
    cluster: percolator.Cluster,
) -> None:
    """Scanner B reads the index (two rows), serves the first row it meets and is
    parked before the other's entry; scanner A (the test's thread, same worker)
    skips B's row, serves the other and settles its entry. B, going on with the entry
    it read, skips the row (``Served``): no run, so no timestamp and no read of the
    row's cells.

    Catches the mutant without ``Served.holds`` in ``_index_scan``: B runs the row
    again, a read (and a timestamp) to find its notification gone (with four scanner
    threads on the Bigtable emulator, 7.6 store calls per notification instead of 4.0);
    and B's row noted as served under another table: A runs it again, an absent run."""
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    write(cluster, b"r1", b"1")
    write(cluster, b"r2", b"2")
    absent = absent_runs()
    with Interleaving(cluster) as world:
        b = world.actor("B", worker._scanner.index_pass)
        b.run_until(lambda s: s.matches("timestamp"))  # B's run of its first row
        b.run_until(lambda s: s.matches("scan", table=INDEX_TABLE))  # the second's entry
        parked = len(b.steps)
        assert worker._scanner.index_pass()  # A: skips B's row, serves the other and settles it
        b.finish()
    again = [str(s) for s in b.steps[parked:]
             if s.op == "timestamp" or s.matches("read_rows", column="w:raw:v")]
    assert not again, again  # (its run would begin at the start its first commit drew)
    assert absent_runs() == absent  # nor did A run B's row
    assert entries(cluster) == {}
    assert Snapshot(cluster).get("docs", b"r1", "out:v") == b"1"
    assert Snapshot(cluster).get("docs", b"r2", "out:v") == b"2"


def test_an_index_pass_costs_one_read_per_row_and_settles_many_rows_in_one_call(
    cluster: percolator.Cluster,
) -> None:
    """200 rows notified before a one-thread worker starts: each run reads its
    notification with its cells (one read of the row), and the pass settles the rows'
    index entries in one deletion and one re-check read per SETTLE_MAX (256) rows,
    so its upkeep costs about 0.01 store calls per notification (the Copier's 4.0 on
    the Bigtable emulator, BENCHMARKS.md).

    Catches the mutant SETTLE_MAX = 32 (seven deletions and re-check reads: 0.07 calls
    per notification, the 4.1 before) and the run reading its notification apart
    (``Scanner.serve_indexed`` going through ``Scanner.serve_row``: two reads per row)."""
    n = 200
    Worker(cluster, [Copy]).register()
    with Transaction(cluster) as txn:
        for i in range(n):
            txn.set("docs", b"r%03d" % i, "raw:v", b"%d" % i)
    counting = CountingIndexWrites(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        with Worker(cluster, [Copy], threads=1) as worker:
            # Not wait_for_observers: its polls read the notify cells too.
            deadline = time.monotonic() + 120
            while worker.stats["committed"] < n and time.monotonic() < deadline:
                time.sleep(0.01)
        # Stopped: the pass settled what it processed on its way out.
    finally:
        internals(cluster).store = counting._store  # type: ignore[assignment]
    assert entries(cluster) == {}
    assert 1 <= counting.deletions <= 2
    # The runs' reads (with their notifications) and the settling's re-checks.
    assert n < counting.docs_reads <= n + 2
    assert all(Snapshot(cluster).get("docs", b"r%03d" % i, "out:v") == b"%d" % i
               for i in range(n))


def absent_runs() -> float:
    """Observer runs that found no notification at or below their snapshot, so far."""
    return float(metrics.snapshot()[0].get(("percolator_observer_runs_total", ("Copy", "absent")),
                                           0))


def test_rows_served_from_hand_offs_settle_their_entries_together_when_due(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows a look hands over are served one at a time (as sleeping scanners would
    serve them); their index entries wait, known as served, until SETTLE_MAX rows wait
    (three here) or the first of them waited SETTLE_DELAY (an hour here, then none),
    and go in one deletion; a forced settling (the worker's stop) takes what waits.

    A row handed over again meanwhile (by a look before the settling) is not run
    again: its entries are known as served (``Served``), where a run would draw a
    timestamp and read to find nothing (an absent run). A handed row whose
    notification another worker served (an absent run) waits with the batch too.

    Catches ``_defer_settling`` that does not note when its first row began to wait
    (the first hand-off then settled at once, alone), ``settle_deferred`` settling
    before either bound, and ``serve_handed`` not asking ``Served``."""
    monkeypatch.setattr(observers._scanner, "SETTLE_DELAY", 3600.0)
    monkeypatch.setattr(observers._scanner, "SETTLE_MAX", 3)
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    scanner = worker._scanner
    rows = [b"r%d" % i for i in range(5)]
    for row in rows[:3]:
        write(cluster, row, row)
    scanner.look(frozenset())
    handed = [scanner.bell.take() for _ in range(3)]
    counting = CountingIndexWrites(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        absent = absent_runs()
        for i, handoff in enumerate(handed[:2]):
            assert handoff is not None
            scanner.serve_handed(*handoff)
            scanner.serve_handed(*handoff)  # handed again: known as served, no run
            scanner.settle_deferred()  # neither bound reached: nothing to do
            assert counting.deletions == 0, i
        assert absent_runs() == absent and worker.stats["committed"] == 2
        assert {r for _, r in entries(cluster)} == set(rows[:3])
        assert handed[2] is not None
        scanner.serve_handed(*handed[2])  # the third waiting: settled, the three at once
        assert counting.deletions == 1
        assert entries(cluster) == {}

        write(cluster, rows[3], rows[3])
        scanner.look(frozenset())
        fourth = scanner.bell.take()
        assert fourth is not None
        scanner.serve_handed(*fourth)
        assert {r for _, r in entries(cluster)} == {rows[3]}  # waits, alone
        write(cluster, b"elsewhere", b"x")
        served_elsewhere(cluster, [b"elsewhere"])  # its entry left in the index
        scanner.look(frozenset())
        sixth = scanner.bell.take()
        assert sixth is not None and sixth[1] == b"elsewhere" and scanner.bell.take() is None
        scanner.serve_handed(*sixth)  # an absent run: its entry waits with the other
        assert absent_runs() == absent + 1
        assert {r for _, r in entries(cluster)} == {rows[3], b"elsewhere"}
        reads = counting.docs_reads
        worker.stop()  # settles what waits
        assert entries(cluster) == {} and counting.deletions == 2
        # no look before the deletion (the rows were just served): one read, after it
        assert counting.docs_reads - reads == 1

        monkeypatch.setattr(observers._scanner, "SETTLE_DELAY", 0.0)
        write(cluster, rows[4], rows[4])
        scanner.look(frozenset())
        fifth = scanner.bell.take()
        assert fifth is not None
        scanner.serve_handed(*fifth)  # due as soon as it waits
        assert entries(cluster) == {} and counting.deletions == 3
    finally:
        internals(cluster).store = counting._store  # type: ignore[assignment]
    with Snapshot(cluster) as snap:
        assert [snap.get("docs", row, "out:v") for row in rows] == rows


def _one_row_handed_over(
    cluster: percolator.Cluster,
) -> tuple[Worker, tuple[str, bytes, dict[str, int], float]]:
    """A worker (not started) whose lookout has handed over the one row written."""
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    write(cluster, b"r", b"1")
    worker._scanner.look(frozenset())
    handoff = worker._scanner.bell.take()
    assert handoff is not None
    return worker, handoff


class IndexDeletionsFail(CountingIndexWrites):
    """The cluster's store, whose deletions of index entries fail (store unavailable)."""

    def mutate_rows(self, table: str, mutations: list[Mutation]) -> None:
        if table == INDEX_TABLE and any(m.deletes for m in mutations):
            raise StoreUnavailable("index deletions fail here")
        super().mutate_rows(table, mutations)


def test_hand_offs_whose_settling_fails_are_forgotten_as_served_and_settled_later(
    cluster: percolator.Cluster,
) -> None:
    """A batch of served hand-offs whose settling fails raises the store's error and
    is no longer known as served: a later pass runs its rows (finding them served, an
    absent run) and settles their entries, which would otherwise stay for good (a pass
    skips the entries it knows as served)."""
    worker, handoff = _one_row_handed_over(cluster)
    scanner = worker._scanner
    failing = IndexDeletionsFail(internals(cluster).store)
    internals(cluster).store = failing  # type: ignore[assignment]
    try:
        scanner.serve_handed(*handoff)
        with pytest.raises(StoreUnavailable, match="index deletions fail here"):
            scanner.settle_deferred(force=True)
    finally:
        internals(cluster).store = failing._store  # type: ignore[assignment]
    [(table, row, written)] = scan_index(internals(cluster), None, None)
    assert not scanner._served.holds(table, row, written)
    assert worker.stats["committed"] == 1
    scanner.index_pass()
    assert entries(cluster) == {}


class CopyToo(Copy):
    """A second observer of the column: its rows are served by reading their cells."""


def test_a_handed_row_found_served_with_nothing_to_run_has_its_entry_settled_at_once(
    cluster: percolator.Cluster,
) -> None:
    """Two observers of the column (no run reads its own notification: the row's notify
    cells are read first): a handed row whose notification another worker served has
    no cell to run, and its stale entry is settled then and there, not with a batch;
    so is such a row's entry that an index pass meets."""
    worker = Worker(cluster, [Copy, CopyToo], threads=1)
    worker.register()
    write(cluster, b"r", b"x")
    served_elsewhere(cluster, [b"r"])
    worker._scanner.look(frozenset())
    handed = worker._scanner.bell.take()
    assert handed is not None and handed[1] == b"r"
    worker._scanner.serve_handed(*handed)
    assert entries(cluster) == {}
    assert worker.stats["committed"] == 0
    write(cluster, b"q", b"y")
    served_elsewhere(cluster, [b"q"])
    assert not worker._scanner.index_pass()  # and so does a pass that meets one
    assert entries(cluster) == {}


def test_an_index_pass_meets_a_held_row_serves_the_rest_and_settles_settle_max_at_a_time(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An index pass from the first index row (the scanner's random draws set by the
    test: the start, and the shortest stretch skipped at a meeting, one row): the first
    row's advisory lock is held (as another scanner of the process would hold it), so
    the pass counts a meeting, skips the next row and goes on; it serves the other three
    and settles their entries SETTLE_MAX (two here) at a time: two deletions. The
    entries of the two rows passed by stay."""
    monkeypatch.setattr(observers._scanner, "SETTLE_MAX", 2)
    monkeypatch.setattr(observers._scanner, "random",
                        SimpleNamespace(randrange=lambda n: 0, randint=lambda lo, hi: lo))
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    for i in range(5):
        write(cluster, b"r%d" % i, b"%d" % i)
    first, second = [row for _, row, _ in scan_index(internals(cluster), None, None)][:2]
    coordination = internals(cluster).coordination
    key = f"docs/{first.hex()}"
    assert coordination.try_advisory_lock(key)
    counting = CountingIndexWrites(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        worked = worker._scanner.index_pass()
    finally:
        internals(cluster).store = counting._store  # type: ignore[assignment]
        coordination.release_advisory_lock(key)
    assert worked, dict(worker.stats)
    assert worker.stats["meetings"] == 1 and worker.stats["committed"] == 3
    assert counting.deletions == 2
    assert entries(cluster) == {("docs", first): {"raw:v"}, ("docs", second): {"raw:v"}}


def test_a_run_that_finds_its_notification_served_is_in_the_run_metrics(
    cluster: percolator.Cluster,
) -> None:
    """An index pass's run that finds no notification at or below its snapshot (served
    already: here by the run before it) draws a timestamp and reads the row: it is
    counted as ``percolator_observer_runs_total{outcome="absent"}`` and timed in
    ``percolator_observer_run_duration_seconds`` (docs/metrics.md). Fails if
    ``Runner.run_noticed`` returns before recording an absent run, as it did."""
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    write(cluster, b"r1", b"1")
    name = worker._runner.by_column[("docs", "raw:v")][0].name

    def runs() -> tuple[float, float, int]:
        values, hists = metrics.snapshot()
        counts, _ = hists.get(("percolator_observer_run_duration_seconds", (name,)), ([], 0))
        return (values.get(("percolator_observer_runs_total", (name, "absent")), 0),
                values.get(("percolator_observer_runs_total", (name, "committed")), 0),
                sum(counts))

    absent, committed, timed = runs()
    assert worker._scanner.serve_indexed("docs", b"r1", ["raw:v"])
    assert runs() == (absent, committed + 1, timed + 1)
    assert not worker._scanner.serve_indexed("docs", b"r1", ["raw:v"])  # served: absent
    assert runs() == (absent + 1, committed + 1, timed + 2)
    assert Snapshot(cluster).get("docs", b"r1", "out:v") == b"1"


def served_elsewhere(cluster: percolator.Cluster, rows: list[bytes]) -> None:
    """The rows' notifications served by another worker whose batch has not settled
    their entries yet: the notify cells gone, the index entries left."""
    internals(cluster).store.mutate_rows("docs", [
        Mutation(row, deletes=[("n:raw:v", internals(cluster).timestamps.get_timestamp())])
        for row in rows])


class CountingDraws:
    """The cluster's timestamp source, counting the timestamps drawn from it."""

    def __init__(self, timestamps: object) -> None:
        self._timestamps = timestamps
        self.count = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._timestamps, name)

    def get_timestamp(self) -> int:
        self.count += 1
        return self._timestamps.get_timestamp()  # type: ignore[attr-defined, no-any-return]


def test_absent_runs_settle_their_entries_in_the_batch_and_reuse_their_start(
    cluster: percolator.Cluster,
) -> None:
    """Twenty rows whose notifications another worker served, their entries still in
    the index: one pass of this worker makes twenty absent runs, each one read of its
    row, all at the first run's start timestamp (an absent run read nothing and wrote
    nothing: its start is handed to the next run), and settles their entries with one
    deletion and one re-check read.

    Catches two mutants: an absent run's entry settled alone (``settle`` in
    ``_index_scan``, as before: 2 more reads and a deletion per run), and the absent
    run's start timestamp not handed on (``held.ts = txn.start_ts`` removed in
    ``Runner._transaction``: a timestamp request per run)."""
    n = 20
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    rows = [b"r%02d" % i for i in range(n)]
    with Transaction(cluster) as txn:
        for row in rows:
            txn.set("docs", row, "raw:v", b"x")
    served_elsewhere(cluster, rows)
    assert {r for _, r in entries(cluster)} == set(rows)
    name = worker._runner.by_column[("docs", "raw:v")][0].name
    absent = metrics.snapshot()[0].get(("percolator_observer_runs_total", (name, "absent")), 0)
    counting = CountingIndexWrites(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    draws = CountingDraws(internals(cluster).timestamps)
    internals(cluster).timestamps = draws  # type: ignore[assignment]
    try:
        assert not worker._scanner.index_pass()  # no work done
    finally:
        internals(cluster).store = counting._store  # type: ignore[assignment]
        internals(cluster).timestamps = draws._timestamps  # type: ignore[assignment]
    assert metrics.snapshot()[0][("percolator_observer_runs_total", (name, "absent"))] == (
        absent + n)
    assert entries(cluster) == {}
    assert counting.deletions == 1
    assert counting.docs_reads == n + 1  # the runs' reads, one re-check of them all
    assert draws.count == 1  # one draw
    assert Snapshot(cluster).get("docs", rows[0], "out:v") is None


def test_a_notification_written_before_an_absent_runs_batch_is_settled_survives(
    cluster: percolator.Cluster,
) -> None:
    """An absent run (its notification served elsewhere) leaves the row's entry to its
    pass's batch; a new notification of the row is committed after the run's read,
    before the batch is settled. Its entry, here written below the stale one (as a
    commit timestamp drawn before the stale entry was written is, so the deletion
    reaches it), must come back from the re-check read after the deletion, and the
    change is observed.

    Catches the mutant that settles an absent run's entry without the read after the
    deletion (``_index_scan`` deleting the entry with ``mutate_rows`` itself, or
    ``settle_rows`` with ``again = {}``): the entry is lost and the change is never
    observed (the index is how this worker finds it)."""
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    write(cluster, b"r", b"old")
    served_elsewhere(cluster, [b"r"])
    # The stale entry above the commit timestamp the new change will draw.
    write_entries(internals(cluster), [("docs", b"r", "raw:v")],
                  internals(cluster).timestamps.get_timestamp() + 1_000_000)
    with Interleaving(cluster) as world:
        scanner = world.actor("scanner", worker._scanner.index_pass)
        scanner.run_until(lambda s: s.matches("read_rows", table="docs"))
        scanner.step()  # the absent run's read
        scanner.run_until(lambda s: s.matches("mutate_rows", table=INDEX_TABLE))
        write(cluster, b"r", b"new")  # not an actor: commits at once
        scanner.finish()
    assert ("docs", b"r") in entries(cluster)
    assert worker._scanner.index_pass()
    assert Snapshot(cluster).get("docs", b"r", "out:v") == b"new"
    assert entries(cluster) == {}


class Recording(Copy):
    """Copy, noting the rows it runs on, in order."""

    def __init__(self) -> None:
        self.rows: list[bytes] = []

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        self.rows.append(row)
        super().process(txn, row, column)


def row_in_bucket(wanted: Callable[[bytes], bool]) -> bytes:
    """A row of ``docs`` whose index row's bucket (its first two bytes) is *wanted*."""
    return next(row for row in (b"r%d" % i for i in range(100_000))
                if wanted(index_key("docs", row)[:2]))


def test_an_index_pass_begins_at_a_bucket_drawn_from_the_256_and_wraps_around(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An index row begins with its bucket, ``b"00"`` to ``b"ff"`` (``index_key``); a
    pass begins at a bucket drawn from the 256 (set by the test: ``b"ab"``, then the
    last one drawn, ``b"ff"``), serves the rows from there on in index order, then
    wraps around to the first row and stops where it began.

    Catches a start in another format (``b"AB"`` or ``b"XXabXX"``, which sort below
    ``b"a0"``: the row in bucket ``a6`` would come first), a draw from 257 buckets
    (the last, ``b"100"``, sorts below ``b"30"``) and a first range from the index's
    first row instead of the start."""
    rows = [row_in_bucket(lambda b: b < b"a0"), row_in_bucket(lambda b: b"a0" <= b < b"ab"),
            row_in_bucket(lambda b: b"ab" <= b < b"ff"), row_in_bucket(lambda b: b == b"ff")]
    observer = Recording()
    worker = Worker(cluster, [observer], threads=1)
    worker.register()
    in_order = sorted(rows, key=lambda row: index_key("docs", row))
    for draw, expected in ((lambda n: 0xAB, in_order[2:] + in_order[:2]),
                           (lambda n: n - 1, in_order[3:] + in_order[:3])):
        for row in rows:
            write(cluster, row, b"%d" % len(observer.rows))
        monkeypatch.setattr(observers._scanner, "random",
                            SimpleNamespace(randrange=draw, randint=lambda lo, hi: lo))
        observer.rows.clear()
        assert worker._scanner.index_pass()
        assert observer.rows == expected
        assert entries(cluster) == {}


def test_an_index_pass_passes_by_the_entries_of_tables_its_worker_does_not_observe(
    cluster: percolator.Cluster,
) -> None:
    """Workers of other tables share the index: a look hands over the rows of its
    worker's table only, and a pass serves those and leaves the entries of a table
    its worker does not observe where they are (fails if the look or the pass asks
    the table's observed columns with no default: a TypeError ends it)."""
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    write(cluster, b"r", b"1")
    write_entries(internals(cluster), [("pages", b"p", "raw:v")],
                  internals(cluster).timestamps.get_timestamp())
    worker._scanner.look(frozenset())
    handed = worker._scanner.bell.take()
    assert handed is not None and handed[:2] == ("docs", b"r")
    assert worker._scanner.bell.take() is None
    assert worker._scanner.index_pass()
    assert worker.stats["committed"] == 1
    assert entries(cluster) == {("pages", b"p"): {"raw:v"}}
    assert Snapshot(cluster).get("docs", b"r", "out:v") == b"1"


def test_an_index_pass_that_ends_on_its_meetings_says_it_found_work(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight rows, each held by another scanner (their advisory locks taken); the
    test sets the scanner's draws (the shortest stretch skipped at a meeting: one
    row). The pass meets a held row four times (a row skipped after each) and ends
    there, a jump: it answers True, so that its scanner begins a new pass at once, at
    a new random place, instead of sleeping with work left (fails if it answers
    False: nothing was served). Nothing ran; every entry stays."""
    monkeypatch.setattr(observers._scanner, "random",
                        SimpleNamespace(randrange=lambda n: 0, randint=lambda lo, hi: lo))
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    rows = [b"r%d" % i for i in range(8)]
    for row in rows:
        write(cluster, row, b"x")
    coordination = internals(cluster).coordination
    keys = [f"docs/{row.hex()}" for row in rows]
    assert all(coordination.try_advisory_lock(key) for key in keys)
    try:
        assert worker._scanner.index_pass()
    finally:
        for key in keys:
            coordination.release_advisory_lock(key)
    assert (worker.stats["meetings"], worker.stats["jumps"]) == (4, 1)
    assert worker.stats["committed"] == 0
    assert {row for _, row in entries(cluster)} == set(rows)


class AlwaysFails(Copy):
    """Raises on every run."""

    def __init__(self) -> None:
        self.runs = 0

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        self.runs += 1
        raise ValueError("boom")


def test_an_index_pass_passes_by_a_row_backing_off_without_reading_it(
    cluster: percolator.Cluster,
) -> None:
    """A row whose observer failed here backs off (for an hour): the next pass neither
    runs it nor reads its notify cells to run them; it only settles its entry, whose
    look finds the notification still pending (one read), and leaves it. Fails if the
    pass asks the back-off of another table, row or columns, or not at all (the row's
    notify cells read, to be passed by in the runner)."""
    observer = AlwaysFails()
    worker = Worker(cluster, [observer], threads=1, retry_delay=3600.0, max_failures=10)
    worker.register()
    write(cluster, b"r", b"1")
    worker._scanner.index_pass()
    assert observer.runs == 1 and worker._runner.backoff.waiting("docs", b"r", "raw:v")
    assert entries(cluster) == {("docs", b"r"): {"raw:v"}}
    counting = CountingIndexWrites(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        assert not worker._scanner.index_pass()
    finally:
        internals(cluster).store = counting._store  # type: ignore[assignment]
    assert observer.runs == 1
    assert counting.docs_reads == 1 and counting.deletions == 0
    assert entries(cluster) == {("docs", b"r"): {"raw:v"}}


def test_an_index_pass_settles_the_entries_of_hand_offs_waiting_to_be_settled(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row served from a lookout's hand-off leaves its entry waiting (known as
    served, so the pass passes it by) until SETTLE_DELAY, an hour here; the end of an
    index pass settles it anyway, whatever the bounds (fails if the pass's last
    settling is not forced: the entry stays for the hour)."""
    monkeypatch.setattr(observers._scanner, "SETTLE_DELAY", 3600.0)
    worker, handed = _one_row_handed_over(cluster)
    scanner = worker._scanner
    scanner.serve_handed(*handed)
    assert worker.stats["committed"] == 1
    assert entries(cluster) == {("docs", b"r"): {"raw:v"}}  # waiting
    assert not scanner.index_pass()  # nothing left to run
    assert entries(cluster) == {}


class Starts(Copy):
    """Copy, noting the start timestamp of each run."""

    def __init__(self) -> None:
        self.starts: list[int] = []

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        self.starts.append(txn.start_ts)
        super().process(txn, row, column)


def test_a_handed_row_runs_at_the_held_start_drawn_at_or_after_the_look_began(
    cluster: percolator.Cluster,
) -> None:
    """A scanner holds a start timestamp its previous commit drew (here filled by the
    test, above the notifying commit). A handed row's run begins at it when it was
    drawn at the very clock reading the look began at, or after; one drawn before
    the look began is dropped, and the run draws afresh (fails with the held start
    dropped at the look's own instant too)."""
    observer = Starts()
    worker = Worker(cluster, [observer], threads=1)
    worker.register()
    scanner = worker._scanner
    for i, kept in enumerate((True, False)):
        write(cluster, b"r", b"%d" % i)
        held = worker._runner.next_start()
        held.fill(internals(cluster).timestamps.get_timestamp())
        held_ts = held.ts
        scanner.look(frozenset())
        handed = scanner.bell.take()
        assert handed is not None
        table, row, found, _ = handed
        # The look began at the held start's own clock reading, then just after it.
        looked = held.drawn if kept else math.nextafter(held.drawn, math.inf)
        scanner.serve_handed(table, row, found, looked)
        assert (observer.starts[-1] == held_ts) == kept, i
        assert observer.starts[-1] >= held_ts
    assert worker.stats["committed"] == 2


def test_a_handed_row_runs_twice_at_most_and_is_left_when_both_meet_a_newer_notification(
    cluster: percolator.Cluster,
) -> None:
    """A handed row whose notification another worker served; each time this
    scanner's run has drawn its start, the other worker serves what is there and a
    newer notification is committed (above the start). Both runs find only a
    notification above their snapshot (absent runs); the scanner stops after the
    second (fails with a third run) and leaves the entry, whose notification a later
    pass serves."""
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    scanner = worker._scanner
    write(cluster, b"r", b"0")
    served_elsewhere(cluster, [b"r"])
    scanner.look(frozenset())
    handed = scanner.bell.take()
    assert handed is not None
    absent = absent_runs()
    with Interleaving(cluster) as world:
        actor = world.actor("scanner", lambda: scanner.serve_handed(*handed))
        for i in (1, 2):
            actor.run_until(lambda s: s.op == "timestamp")
            actor.step()  # the run's start drawn
            served_elsewhere(cluster, [b"r"])
            write(cluster, b"r", b"%d" % i)
        actor.finish()
    assert absent_runs() == absent + 2
    assert worker.stats["committed"] == 0
    assert ("docs", b"r") in entries(cluster)
    assert scanner.index_pass()
    assert Snapshot(cluster).get("docs", b"r", "out:v") == b"2"
    assert entries(cluster) == {}


class DrawsFail:
    """The cluster's timestamp source, unreachable: every draw fails."""

    def __init__(self, source: object) -> None:
        self._source = source

    def __getattr__(self, name: str) -> object:
        return getattr(self._source, name)

    def get_timestamp(self) -> int:
        raise OracleUnavailable("no oracle answered (the test's)")


def test_an_index_pass_ends_at_a_run_whose_timestamp_source_is_unavailable(
    cluster: percolator.Cluster,
) -> None:
    """The timestamp source is unreachable: the first run of an index pass fails
    for it, and the pass ends there with its error (its scanner backs off) rather
    than wait for the same source on each of its other rows. No failure is counted
    against the notification, and every entry stays (fails if the run's error is
    not raised: the pass goes on to the other rows)."""
    worker = Worker(cluster, [Copy], threads=1)
    worker.register()
    for row in (b"r1", b"r2"):
        write(cluster, row, b"x")
    transient = ("percolator_observer_runs_total", ("Copy", "transient"))
    before = metrics.snapshot()[0].get(transient, 0)
    host = internals(cluster)
    draws = host.timestamps
    host.timestamps = DrawsFail(draws)  # type: ignore[assignment]
    try:
        with pytest.raises(OracleUnavailable):
            worker._scanner.index_pass()
    finally:
        host.timestamps = draws
    assert metrics.snapshot()[0].get(transient, 0) == before + 1  # one run, not two
    assert not worker._runner.backoff and worker.stats["failures"] == 0
    assert {row for _, row in entries(cluster)} == {b"r1", b"r2"}


class FailsOnce(Copy):
    """Copy, but its first run raises."""

    def __init__(self) -> None:
        self.runs = 0

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        self.runs += 1
        if self.runs == 1:
            raise ValueError("boom")
        super().process(txn, row, column)


def test_a_row_whose_run_failed_keeps_its_index_entry_as_written(
    cluster: percolator.Cluster,
) -> None:
    """A failed run leaves its notification, so the row's entry stays as its committer
    wrote it: not deleted with the pass's batch and written back, which left the index
    without it for a moment, long enough for wait_for_observers to see no work and
    return while the notification waited for its retry (seen under load on Bigtable).
    Both ways a row is run: its first failure through the run that reads its own
    notification, the next through the row's notify cells (a failure to clear)."""
    observer = AlwaysFails()
    worker = Worker(cluster, [observer], threads=1, retry_delay=0.0, max_failures=10)
    worker.register()
    write(cluster, b"r", b"1")
    written = list(scan_index(internals(cluster), None, None))
    counting = CountingIndexWrites(internals(cluster).store)
    internals(cluster).store = counting  # type: ignore[assignment]
    try:
        assert worker._scanner.index_pass()
        assert worker._scanner.index_pass()
    finally:
        internals(cluster).store = counting._store  # type: ignore[assignment]
    assert observer.runs == 2 and worker.stats["failures"] == 2
    assert counting.deletions == 0
    assert list(scan_index(internals(cluster), None, None)) == written


def test_a_row_that_failed_is_served_with_its_failures_cleared_once_its_retry_is_due(
    cluster: percolator.Cluster,
) -> None:
    """A row's observer failed (retry due at once here): the next pass runs it again,
    and the success clears the row's back-off in this worker and its failure count in
    the cluster (a row with failures to clear is served by reading its notify cells
    and running them: fails if it goes the run-noticed way, whose commit deletes the
    notification but clears nothing)."""
    observer = FailsOnce()
    worker = Worker(cluster, [observer], threads=1, retry_delay=0.0)
    worker.register()
    write(cluster, b"r", b"1")
    assert worker._scanner.index_pass()
    assert observer.runs == 1 and worker._runner.backoff
    assert _read_failures(cluster, _failures_key("docs", b"r"), "raw:v") not in (
        None, _NO_FAILURES)
    assert worker._scanner.index_pass()
    assert observer.runs == 2 and worker.stats["committed"] == 1
    assert not worker._runner.backoff
    assert _read_failures(cluster, _failures_key("docs", b"r"), "raw:v") == _NO_FAILURES
    assert entries(cluster) == {}
    assert Snapshot(cluster).get("docs", b"r", "out:v") == b"1"


def test_an_index_pass_passes_by_a_row_its_worker_served_and_serves_the_rows_after_it(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first row of the index was served by another scanner of the worker, whose
    batch has not settled its entry yet (``Served``): the pass passes it by without a
    run and serves the rows after it in the same range (fails if it ends the range
    there: they would wait for a later pass). The scanner's draws set by the test: the
    pass begins at the first bucket, so its first range is the whole index."""
    monkeypatch.setattr(observers._scanner, "random",
                        SimpleNamespace(randrange=lambda n: 0, randint=lambda lo, hi: lo))
    observer = Recording()
    worker = Worker(cluster, [observer], threads=1)
    worker.register()
    rows = sorted([b"r1", b"r2", b"r3"], key=lambda row: index_key("docs", row))
    for row in rows:
        write(cluster, row, row)
    first = rows[0]
    entry = entries_at(cluster)[("docs", first)]
    assert worker._runner.run_noticed(observer, "docs", first, "raw:v")  # the other scanner
    worker._scanner._served.add("docs", first, entry)
    observer.rows.clear()
    assert worker._scanner.index_pass()
    assert observer.rows == rows[1:]
    assert entries(cluster) == {("docs", first): {"raw:v"}}  # the other scanner's to settle


def test_a_row_served_by_reading_its_notify_cells_runs_its_workers_columns_only(
    cluster: percolator.Cluster,
) -> None:
    """Two observers of raw:v, so that a pass reads the row's notify cells and runs
    them (``Scanner.serve_row``), and a row notified on raw:v and on raw:w, which
    another worker observes: the pass runs raw:v's observers and leaves raw:w's
    notification and entry to the other worker (fails if the read asks for every
    notify column: this worker has no observer of raw:w)."""
    Worker(cluster, [CopyW]).register()
    worker = Worker(cluster, [Copy, CopyToo], threads=1)
    worker.register()
    with Transaction(cluster) as txn:
        txn.set("docs", b"r", "raw:v", b"v")
        txn.set("docs", b"r", "raw:w", b"w")
    assert worker._scanner.index_pass()
    assert worker.stats["committed"] == 2
    assert entries(cluster) == {("docs", b"r"): {"raw:w"}}
    assert Snapshot(cluster).get("docs", b"r", "out:v") == b"v"
    assert Snapshot(cluster).get("docs", b"r", "out:w") is None
