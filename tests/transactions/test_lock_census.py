"""The embedded store's lock census: reads skip the lock family only while no lock can
be held; a sweep clears the census only when no taker is writing locks (across
processes, and a killed taker's flock is released by the kernel) and no lock is left."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import percolator
from percolator import Cluster, Transaction
from percolator import _lock_census as lock_census_module
from percolator._bulk import BulkLoad, LoadTxn, finish_rows, prewrite_rows
from percolator._encoding import WRITE
from percolator._internals import internals
from percolator._lock_census import LockCensus
from percolator._store import Read
from percolator.testing import CrashPoint, client_of, crash_commit
from tests._backends import make_store_url

T, C = "accounts", "bal:amount"
ROOT = Path(__file__).resolve().parents[2]


class _FamiliesRead:
    """Records the families of every read_rows (and newest_at) call."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.families: list[tuple[str, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_rows(self, table: str, rows: Any, reads: Any) -> Any:
        self.families.append(tuple(r.family for r in reads))
        return self._store.read_rows(table, rows, reads)

    def newest_at(self, table: str, row: bytes, family: str, *args: Any) -> Any:
        self.families.append((family,))
        return self._store.newest_at(table, row, family, *args)


def _families_of_a_get(cluster: Cluster, row: bytes) -> tuple[bytes | None, tuple[str, ...]]:
    proxy = _FamiliesRead(internals(cluster).store)
    internals(cluster).store = proxy  # type: ignore[assignment]
    try:
        value = Transaction(cluster).get(T, row, C)
    finally:
        internals(cluster).store = proxy._store
    return value, proxy.families[0]


def test_reads_skip_locks_only_while_none_can_be_held(sqlite_cluster: Cluster) -> None:
    cluster = sqlite_cluster
    census = internals(cluster).lock_census
    assert census is not None
    cluster.create_table(T)
    with Transaction(cluster) as txn:  # one phase: no lock
        txn.set(T, b"alice", C, b"1")
    internals(cluster).sweep_locks(force=True)
    assert census.clean()
    assert _families_of_a_get(cluster, b"alice") == (b"1", ("w",))

    dying = Transaction(client_of(cluster))
    dying.set(T, b"bob", C, b"primary")
    dying.set(T, b"alice", C, b"2")  # a secondary, left locked by the crash
    assert crash_commit(dying, CrashPoint("commit_point")) is True
    assert not census.clean()
    internals(cluster).sweep_locks(force=True)  # a lock is left: the census stays set
    assert not census.clean()
    # the read looks at the lock and rolls the committed secondary forward
    assert _families_of_a_get(cluster, b"alice") == (b"2", ("l", "w"))
    internals(cluster).sweep_locks(force=True)
    assert census.clean()
    assert _families_of_a_get(cluster, b"alice") == (b"2", ("w",))


def test_a_row_read_skips_the_lock_family_while_the_census_is_clean(
    sqlite_cluster: Cluster,
) -> None:
    """As ``get``, a ``get_row`` (a row read through the store's read_rows) asks for
    the write family alone while no lock can be held, and the lock family with it once
    one may be."""
    cluster = sqlite_cluster
    census = internals(cluster).lock_census
    assert census is not None
    cluster.create_table(T)
    with Transaction(cluster) as txn:
        txn.set(T, b"alice", C, b"1")
    for clean in (True, False):
        if clean:
            internals(cluster).sweep_locks(force=True)
        else:
            with internals(cluster).taking_locks():  # as a prewrite does: may hold one
                pass
        assert census.clean() is clean
        proxy = _FamiliesRead(internals(cluster).store)
        internals(cluster).store = proxy  # type: ignore[assignment]
        try:
            assert Transaction(cluster).get_row(T, b"alice", [C]) == {C: b"1"}
        finally:
            internals(cluster).store = proxy._store
        assert proxy.families == [("w",) if clean else ("l", "w")]


def test_a_snapshots_reads_of_a_set_of_columns_are_made_once_for_up_to_64_sets(
    sqlite_cluster: Cluster,
) -> None:
    """The store reads of a snapshot's row read depend on its columns and the census:
    made once per set of columns, kept for the first 64 sets (a snapshot reading ever
    new columns keeps no more), made afresh beyond."""
    internals(sqlite_cluster).sweep_locks(force=True)  # clean, and stays so: one key
    snapshot = percolator.Snapshot(sqlite_cluster)
    sets = [(f"c:{i}",) for i in range(65)]
    made = [snapshot._reads(columns) for columns in sets]
    assert made[-1] == [Read(WRITE, sets[-1], max_ts=snapshot.start_ts)]
    kept = [snapshot._reads(columns) is first for columns, first in zip(
        sets, made, strict=True)]
    assert kept == [True] * 64 + [False]


@pytest.mark.parametrize("backend", ["sqlite", "cas-sqlite"])
def test_a_read_that_skips_the_locks_still_refuses_a_start_below_the_safe_point(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str,
) -> None:
    """The clean census's read (``get``'s own, in line) checks the safe point after
    reading, as the read that looks at the locks does (``_check_safe_point``; the
    embedded store taking HBase's path has no census): once a garbage-collection pass
    overtook a transaction or a snapshot, its read raises SnapshotTooOldError naming
    it, whether its client's cached safe point is already above the start (the pass
    was this client's) or the client never fetched it (another client's pass: a cache
    never fetched is stale)."""
    url = make_store_url(backend, request, tmp_path)
    with percolator.connect(url, safe_point_refresh=0.02) as mine, \
            percolator.connect(url, safe_point_refresh=0.02) as other:
        mine.create_table(T)
        with Transaction(mine) as txn:
            txn.set(T, b"alice", C, b"old")
        readers = [(Transaction(mine), "transaction"), (Transaction(other), "transaction"),
                   (percolator.Snapshot(other), "snapshot")]
        starts = [old.start_ts for old, _ in readers]  # drawn now, not on first use
        with Transaction(mine) as txn:
            txn.set(T, b"alice", C, b"new")
        safe_point = mine.gc(retention=0, max_txn_age=1e-9).safe_point  # overtakes all
        internals(mine).sweep_locks(force=True)  # the file is shared: other's too
        assert safe_point > max(starts)
        for old, what in readers:
            census = internals(old.cluster).lock_census
            assert (census is not None and census.clean()) if backend == "sqlite" else (
                census is None)
            with pytest.raises(percolator.SnapshotTooOldError) as too_old:
                old.get(T, b"alice", C)
            assert (too_old.value.start_ts, too_old.value.safe_point) == (
                old.start_ts, safe_point)
            assert str(too_old.value).startswith(f"{what} {old.start_ts} is too old: ")
            old.close()
        # A snapshot asked for at a start the pass overtook is refused as it is made.
        with pytest.raises(percolator.SnapshotTooOldError,
                           match=f"^snapshot {starts[0]} is too old: "):
            percolator.Snapshot(other, start_ts=starts[0])


def test_a_load_keeps_the_census_set_until_its_locks_are_released(
    sqlite_cluster: Cluster,
) -> None:
    cluster = sqlite_cluster
    census = internals(cluster).lock_census
    assert census is not None
    cluster.create_table(T)
    load = BulkLoad(cluster, T, "census")
    txn = load.begin({})
    assert isinstance(txn, LoadTxn)
    locked = list(prewrite_rows(cluster, txn, [(b"alice", {C: b"loaded"})]))
    internals(cluster).sweep_locks(force=True)
    assert not census.clean()
    commit_ts = load.commit({})
    internals(cluster).sweep_locks(force=True)
    assert not census.clean()  # the cell is still locked (committed, not released)
    assert Transaction(cluster).get(T, b"alice", C) == b"loaded"  # rolls it forward
    finish_rows(cluster, txn, locked, commit_ts)
    internals(cluster).sweep_locks(force=True)
    assert census.clean()
    assert Transaction(cluster).get(T, b"alice", C) == b"loaded"


def test_takers_of_one_process_hold_the_census_until_the_last_one_leaves(
    tmp_path: Path,
) -> None:
    census = LockCensus(str(tmp_path / "census"))
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    release_second = threading.Event()

    def first() -> None:
        with census.taking():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with census.taking():
            second_in.set()
            release_second.wait(10)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    assert first_out.wait(10)
    assert census.sweep(lambda: True, force=True) is False  # the second still takes
    assert not census.clean()
    release_second.set()
    for t in threads:
        t.join(10)
    assert census.sweep(lambda: True, force=True) is True
    assert census.clean()
    with census.taking():
        assert not census.clean()
    assert census.sweep(lambda: False, force=True) is False  # a lock is left


def test_a_taker_in_another_process_blocks_sweeps_until_it_is_killed(tmp_path: Path) -> None:
    path = str(tmp_path / "census")
    census = LockCensus(path)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {str(ROOT)!r})
            from percolator._lock_census import LockCensus
            with LockCensus({path!r}).taking():
                print("taking", flush=True)
                time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "taking"
        assert census.sweep(lambda: True, force=True) is False
        assert not census.clean()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert census.sweep(lambda: True, force=True) is True
        assert census.clean()
    finally:
        child.kill()
        child.wait()


def test_a_census_written_before_a_reboot_starts_set(tmp_path: Path) -> None:
    path = str(tmp_path / "census")
    census = LockCensus(path)
    assert not census.clean()  # a new file
    assert census.sweep(lambda: True, force=True) and census.clean()
    census.close()
    assert LockCensus(path).clean()  # same boot: kept
    with open(path, "r+b") as f:  # as if written during another boot
        f.seek(16)
        f.write(b"\x00" * 16)
    assert not LockCensus(path).clean()


def test_remote_stores_have_no_census(cluster: Cluster, backend: str) -> None:
    assert (internals(cluster).lock_census is not None) == (backend == "sqlite")


def test_sweeps_are_rate_limited_unless_forced_and_back_off_while_locks_are_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Powers of two: the census's clock, moved by the test, adds up exactly.
    census = LockCensus(str(tmp_path / "census"), min_sweep_interval=1 / 16,
                        max_sweep_interval=1 / 4)
    clock = [1024.0]  # moved by the test only: the same on a loaded machine
    monkeypatch.setattr(lock_census_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    calls: list[float] = []

    def locks_left() -> bool:
        calls.append(clock[0])
        return False

    attempts = 0
    while len(calls) < 5 and attempts < 1000:
        assert census.sweep(locks_left) is False
        attempts += 1
        clock[0] += 1 / 64
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # each sweep that finds locks doubles the interval, up to the cap, however many
    # sweeps are asked in between
    assert len(calls) == 5 and attempts > len(calls), attempts
    assert gaps == [1 / 8, 1 / 4, 1 / 4, 1 / 4], gaps
    assert census._interval == census.max_sweep_interval  # doubled up to the cap, no further
    n = len(calls)
    census.sweep(locks_left, force=True)
    assert len(calls) == n + 1
    assert census.sweep(lambda: True, force=True) is True  # and a clean sweep resets it
    assert census._interval == census.min_sweep_interval


def test_status_shows_the_census_and_sweeps_when_no_lock_is_held(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/repo.db"

    def status() -> str:
        return subprocess.run(
            [sys.executable, "-m", "percolator", "status", "--cluster", url],
            capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout

    with percolator.connect(url) as cluster:
        cluster.create_table(T)
        dying = Transaction(client_of(cluster))
        dying.set(T, b"alice", C, b"1")
        assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
        shown = status()
        assert "locks held: 1" in shown and "lock census: set" in shown
        assert Transaction(cluster).get(T, b"alice", C) is None  # rolls the lock back
        shown = status()
        assert "locks held: 0" in shown and "lock census: clear" in shown
        assert internals(cluster).lock_census is not None and internals(cluster).lock_census.clean()


def test_a_child_forked_while_its_parent_takes_holds_the_census_itself(
    tmp_path: Path,
) -> None:
    census = LockCensus(str(tmp_path / "census"))
    go_read, go_write = os.pipe()
    in_read, in_write = os.pipe()
    with census.taking():
        pid = os.fork()
        if pid == 0:  # the child: takes once the parent has stopped taking
            code = 1
            try:
                os.read(go_read, 1)
                with census.taking():
                    os.write(in_write, b"i")
                    os.read(go_read, 1)
                code = 0
            finally:
                os._exit(code)
    try:
        os.write(go_write, b"g")  # the parent has left taking()
        assert os.read(in_read, 1) == b"i"
        assert census.sweep(lambda: True, force=True) is False  # the child takes
        os.write(go_write, b"g")
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 0
        assert census.sweep(lambda: True, force=True) is True
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_a_cluster_built_by_hand_on_the_embedded_store_keeps_the_census(
    sqlite_cluster: Cluster,
) -> None:
    by_hand = Cluster(internals(sqlite_cluster).store, internals(sqlite_cluster).timestamps,
                      internals(sqlite_cluster).coordination)
    assert internals(by_hand).lock_census is not None
    assert internals(by_hand).lock_census.path == (  # type: ignore[union-attr]
        f"{internals(sqlite_cluster).store.path}-census")  # type: ignore[attr-defined]
    internals(by_hand).lock_census.close()
