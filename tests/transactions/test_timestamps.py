"""The embedded timestamp allocator: unique, increasing in real time across processes,
never reissued after kill -9, restart or a lost sidecar file."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator._encoding import WRITE
from percolator._internals import internals
from percolator._store import INCREMENT, Read
from percolator._timestamps import (
    MAX_BATCH,
    ORACLES,
    HostTimestamps,
    StoreTimestamps,
    _Ceiling,
    boot_id,
    open_oracle,
    process_alive,
)
from percolator.stores import open_store
from percolator.stores.sqlite import SqliteStore
from tests._concurrency import ParkedAfterCommit

ROOT = Path(__file__).resolve().parents[2]


def _worker(db: Path, out: Path, threads: int, count: int,
            *mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.transactions._ts_worker",
            str(db),
            str(out),
            str(threads),
            str(count),
            *mode,
        ],
        cwd=ROOT,
    )


def _calls(paths: list[Path]) -> list[tuple[str, int, int, int]]:
    calls = []
    for path in paths:
        # A killed writer may leave half a line, even one of four fields ("... 26" of
        # "... 2621"): only whole lines count.
        for line in path.read_text().split("\n")[:-1]:
            parts = line.split()
            if len(parts) == 4:
                calls.append(
                    (f"{path.name}/{parts[0]}", int(parts[1]), int(parts[2]), int(parts[3]))
                )
    return calls


def _wait_for_lines(paths: list[Path], lines: int, timeout: float = 60) -> None:
    """Wait until every file in *paths* holds at least *lines* lines (a loaded machine
    may take seconds to start a process)."""
    deadline = time.monotonic() + timeout
    while any(not p.exists() or p.read_bytes().count(b"\n") < lines for p in paths):
        assert time.monotonic() < deadline, f"fewer than {lines} lines in {paths}"
        time.sleep(0.05)


def check_linearizable(calls: list[tuple[str, int, int, int]]) -> None:
    stamps = [c[3] for c in calls]
    assert len(stamps) == len(set(stamps)), "a timestamp was issued twice"
    by_caller: dict[str, list[int]] = {}
    for caller, _, _, ts in calls:
        by_caller.setdefault(caller, []).append(ts)
    for seq in by_caller.values():
        assert seq == sorted(seq), "timestamps went backwards for one caller"
    # A call that began after another returned must get a larger timestamp.
    ordered = sorted(calls, key=lambda c: c[1])
    returned = sorted(calls, key=lambda c: c[2])
    best = 0
    j = 0
    for caller, invoked, _, ts in ordered:
        while j < len(returned) and returned[j][2] < invoked:
            best = max(best, returned[j][3])
            j += 1
        assert ts > best, f"{caller} got {ts} after {best} had been returned"


def test_processes_and_threads_draw_unique_real_time_ordered_timestamps(tmp_path: Path) -> None:
    db = tmp_path / "repo.db"
    percolator.connect(f"sqlite:///{db}").close()
    outs = [tmp_path / f"w{i}.txt" for i in range(4)]
    procs = [_worker(db, out, threads=4, count=500) for out in outs]
    for p in procs:
        assert p.wait(120) == 0
    calls = _calls(outs)
    assert len(calls) == 4 * 4 * 500
    check_linearizable(calls)


def test_start_and_one_phase_commit_timestamps_are_unique_and_real_time_ordered(
    tmp_path: Path,
) -> None:
    """Start timestamps drawn while a one-phase commit is in flight come from below it
    (the commit's gap); still, every start or commit timestamp is unique, and a
    transaction begun after a commit returned (in any process) starts above it."""
    db = tmp_path / "repo.db"
    percolator.connect(f"sqlite:///{db}").close()
    outs = [tmp_path / f"w{i}.txt" for i in range(3)]
    procs = [_worker(db, out, 3, 150, "transactions") for out in outs]
    for p in procs:
        assert p.wait(120) == 0
    calls = _calls(outs)
    assert len(calls) == 3 * 3 * 150 * 2
    check_linearizable(calls)


def test_kill_9_and_restart_never_reissue(tmp_path: Path) -> None:
    db = tmp_path / "repo.db"
    percolator.connect(f"sqlite:///{db}").close()
    outs = []
    for round_ in range(3):
        out = tmp_path / f"round{round_}.txt"
        outs.append(out)
        files = [out.with_suffix(f".{i}") for i in range(2)]
        procs = [_worker(db, f, threads=2, count=0) for f in files]
        _wait_for_lines(files, 40)  # each process has been drawing for a while
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
    files = sorted(tmp_path.glob("round*.*"))
    calls = _calls(files)
    assert len(calls) > 100
    check_linearizable(calls)
    # After every process died, a new one starts above everything issued.
    store = SqliteStore(str(db))
    source = HostTimestamps(store, str(db) + "-ts")
    assert source.get_timestamp() > max(c[3] for c in calls)
    source.close()
    store.close()


_KILLED_MID_WRITE = """
import os, signal, struct, sys
from percolator._timestamps import HostTimestamps
from percolator.stores.sqlite import SqliteStore

class KilledHere:
    def __index__(self):
        os.kill(os.getpid(), signal.SIGKILL)

class KilledMidWrite(struct.Struct):
    def pack_into(self, buffer, offset, *values):
        # struct.pack_into zeroes the bytes, then converts and writes the values in
        # order: this process dies in between, as a kill -9 may land there
        super().pack_into(buffer, offset, KilledHere(), *values[1:])

class NoWriteStep:
    def __enter__(self): return None
    def __exit__(self, *exc): return None

store = SqliteStore(sys.argv[1])
source = HostTimestamps(store, sys.argv[1] + "-ts")
print(source.get_timestamps(100)[-1], flush=True)
source._STATE = KilledMidWrite(HostTimestamps._STATE.format)
if sys.argv[2] == "start":
    source.get_timestamp()
else:
    with source.in_flight(NoWriteStep) as draw:
        draw(1)
"""


@pytest.mark.parametrize("draw", ["start", "commit"])
def test_a_process_killed_while_it_writes_the_sidecar_leaves_it_whole(
    tmp_path: Path, draw: str,
) -> None:
    """A ``kill -9`` can land anywhere in a write of the sidecar's state, even between
    ``struct.pack_into``'s zeroing of the bytes and its writing of them: the next draw
    is still above every timestamp handed out (written in place, ``next`` was left 0)."""
    db = str(tmp_path / "db")
    child = subprocess.run([sys.executable, "-c", _KILLED_MID_WRITE, db, draw], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    handed_out = int(child.stdout)
    store = SqliteStore(db)
    source = HostTimestamps(store, db + "-ts")
    try:
        assert source.get_timestamp() > handed_out
    finally:
        source.close()
        store.close()


class _Stopped(Exception):
    """Where a kill -9 would have stopped the process."""


class _StopsHere:
    def __index__(self) -> int:
        raise _Stopped


class _StoppedMidWrite(struct.Struct):
    def pack_into(self, buffer: Any, offset: int, *values: Any) -> None:
        # as _KILLED_MID_WRITE's, in this process: the bytes are zeroed, then it stops
        super().pack_into(buffer, offset, _StopsHere(), *values[1:])


def test_a_write_of_the_sidecar_stopped_midway_leaves_the_state_in_use_whole(
    tmp_path: Path,
) -> None:
    """The in-process twin of the kill -9 test above: whichever copy of the state is in
    use, a write stopped between zeroing its bytes and writing them leaves that copy as
    it was (the write goes to the other copy, which one byte then puts in use)."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    try:
        for _ in range(2):  # from one copy in use, then from the other
            before = source._state()
            source._STATE = _StoppedMidWrite(HostTimestamps._STATE.format)
            with pytest.raises(_Stopped), source._locked():
                source._put_state(before[0] + 5, 0, 0, before[3])
            del source._STATE  # the class's again
            with source._locked():
                assert source._state() == before
                source._put_state(before[0] + 1, 0, 0, before[3])
                assert source._state() == (before[0] + 1, 0, 0, before[3])
    finally:
        source.close()
        store.close()


def test_a_fresh_store_hands_out_timestamps_from_1(tmp_path: Path) -> None:
    """No ceiling persisted yet counts as 1, the first timestamp, in both sources."""
    store, other = SqliteStore(str(tmp_path / "db")), SqliteStore(str(tmp_path / "other"))
    source = HostTimestamps(other, str(tmp_path / "other-ts"))
    try:
        assert StoreTimestamps(store).get_timestamps(3) == range(1, 4)
        assert source.get_timestamp() == 1
    finally:
        source.close()
        other.close()
        store.close()


def test_a_commit_never_draws_above_the_persisted_ceiling(tmp_path: Path) -> None:
    """A one-phase commit draws inside its write transaction, where it must not write
    the store: when the persisted block has no room for all it asks, it gets None (and
    commits in two phases) rather than timestamps above the ceiling, which a restart from
    the ceiling would hand out again. What fits below the ceiling it gets."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    try:
        source.get_timestamp()
        ceiling = source._ceiling.read()[0]
        with source._locked():  # the next commit's first timestamp: one below the ceiling
            source._put_state(ceiling - 1 - source.GAP, 0, 0, 0)
        with source.in_flight(contextlib.nullcontext) as draw:
            assert draw(2) is None
            assert draw(1) == range(ceiling - 1, ceiling)
    finally:
        source.close()
        store.close()


def test_a_commit_finds_the_room_another_process_persisted(tmp_path: Path) -> None:
    """The ceiling this process knows may be stale: another process raised it. A commit
    whose draw would pass the known ceiling reads the persisted one first, and draws
    below it (else it would go two-phase for nothing)."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    try:
        source.get_timestamp()
        known = source._ceiling.read()[0]
        source._ceiling.raise_to_at_least(known + 100)  # as another process's refill
        with source._locked():  # the next commit's first timestamp: the known ceiling
            source._put_state(known - source.GAP, 0, 0, 0)
        with source.in_flight(contextlib.nullcontext) as draw:
            assert draw(1) == range(known, known + 1)
    finally:
        source.close()
        store.close()


@pytest.mark.parametrize("count", [1, 2 * HostTimestamps.GAP,
                                   pytest.param(None, id="fits-leaving-less-than-REFILL")])
def test_a_refill_leaves_room_for_the_draw_and_a_commits_gap_above_it(
    tmp_path: Path, count: int | None,
) -> None:
    """A draw that persists a new ceiling (here a block of 6 past what it needs) makes
    room for what it takes and, above that, for a one-phase commit's draw ``GAP`` up,
    which must find room without writing the store (else it goes two-phase). A draw
    that fits below the ceiling but leaves less than ``REFILL`` above it (*count*
    None) persists one too."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    source.BLOCK, source.REFILL = 6, 3
    try:
        if count is None:
            source.get_timestamp()
            with source._locked():
                nxt = max(source._counters())
            count = source._ceiling.read()[0] - nxt - source.REFILL + 1
        taken = source.get_timestamps(count)
        with source.in_flight(contextlib.nullcontext) as draw:
            assert draw(1) == range(taken[-1] + 1 + source.GAP, taken[-1] + 2 + source.GAP)
    finally:
        source.close()
        store.close()


def test_a_draw_leaving_refill_room_below_the_ceiling_persists_none(tmp_path: Path) -> None:
    """A draw writes the store only once the room left below the persisted ceiling is
    under ``REFILL`` (above: a store write per draw for nothing); one that leaves
    exactly ``REFILL`` persists no new ceiling."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    source.BLOCK, source.REFILL = 6, 3
    try:
        nxt = source.get_timestamp() + 1
        ceiling = source._ceiling.read()[0]
        taken = source.get_timestamps(ceiling - nxt - source.REFILL)
        assert taken.stop == ceiling - source.REFILL
        assert source._ceiling.read()[0] == ceiling
    finally:
        source.close()
        store.close()


def test_a_commits_second_draw_follows_its_first_above_the_slot(tmp_path: Path) -> None:
    """A block of ``in_flight`` may draw more than once: the first draw is published in
    the slot (GAP above the next start timestamp), each later one follows the last."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    try:
        start = source.get_timestamp()
        with source.in_flight(contextlib.nullcontext) as draw:
            first, second = draw(2), draw(3)
            assert first is not None and second is not None
            assert first[0] == start + 1 + source.GAP
            assert second == range(first[-1] + 1, first[-1] + 4)
            with source._locked():
                assert source._slot() == (first[0], os.getpid())
        with source._locked():
            assert source._slot() == (0, 0)
    finally:
        source.close()
        store.close()


def test_a_draw_of_a_commits_whole_gap_is_handed_out_at_once_and_the_next_waits(
    tmp_path: Path,
) -> None:
    """The ``GAP`` timestamps below a commit in flight are handed out without waiting
    for it, the last of them too (one below the commit's); the next draw is above the
    commit and waits until it is visible (here, as this commit never ends, until
    ``IN_FLIGHT_DEADLINE``: StoreUnavailable)."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    source.IN_FLIGHT_DEADLINE = 0.05
    try:
        start = source.get_timestamp()
        with source.in_flight(contextlib.nullcontext) as draw:
            first = draw(1)
            assert first is not None and first[0] == start + 1 + source.GAP
            assert source.get_timestamps(source.GAP) == range(start + 1, first[0])
            with pytest.raises(percolator.StoreUnavailable, match=f"timestamp {first[0]} "):
                source.get_timestamp()
    finally:
        source.close()
        store.close()


def test_a_lost_or_foreign_sidecar_resumes_above_the_persisted_ceiling(tmp_path: Path) -> None:
    db = str(tmp_path / "repo.db")
    store = SqliteStore(db)
    source = HostTimestamps(store, db + "-ts")
    issued = [source.get_timestamp() for _ in range(1000)]
    source.close()
    # A reboot loses the page cache: the sidecar may be stale or gone.
    os.unlink(db + "-ts")
    again = HostTimestamps(store, db + "-ts")
    assert again.get_timestamp() > max(issued)
    again.close()
    # A sidecar written for another boot (stale counter) is not trusted.
    with open(db + "-ts", "r+b") as f:
        f.seek(8)
        f.write(b"\x00" * 16)  # a different boot id
        f.seek(40)
        f.write((1).to_bytes(8, "big"))  # a counter far below what was issued
    third = HostTimestamps(store, db + "-ts")
    assert third.get_timestamp() > max(issued)
    third.close()
    store.close()


def test_store_timestamps_are_unique_under_threads(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "repo.db"))
    source = StoreTimestamps(store)
    got: list[int] = []
    lock = threading.Lock()

    def draw() -> None:
        for _ in range(200):
            ts = source.get_timestamp()
            with lock:
                got.append(ts)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 800
    block = source.get_timestamps(5)
    assert len(block) == 5 and block[0] > max(got)
    store.close()


@pytest.mark.parametrize("count", [0, -1, 10_000_001, 1.5, True])
def test_bad_counts(tmp_path: Path, count: object) -> None:
    store = SqliteStore(str(tmp_path / "repo.db"))
    source = HostTimestamps(store, str(tmp_path / "repo.db-ts"))
    with pytest.raises(percolator.InvalidArgument, match="count"):
        source.get_timestamps(count)  # type: ignore[arg-type]
    source.close()
    store.close()


def test_a_count_is_refused_naming_what_was_given_and_up_to_max_batch_is_drawn(
    tmp_path: Path,
) -> None:
    store = SqliteStore(str(tmp_path / "repo.db"))
    source = HostTimestamps(store, str(tmp_path / "repo.db-ts"))
    try:
        with pytest.raises(percolator.InvalidArgument) as refused:
            source.get_timestamps(1.5)  # type: ignore[arg-type]
        assert str(refused.value) == "count must be an int, got float: 1.5"
        with pytest.raises(percolator.InvalidArgument) as refused:
            source.get_timestamps(MAX_BATCH + 1)
        assert str(refused.value) == (
            f"count must be between 1 and {MAX_BATCH}, got {MAX_BATCH + 1}")
        assert len(source.get_timestamps(MAX_BATCH)) == MAX_BATCH
    finally:
        source.close()
        store.close()


class _Counted:
    """A real store seen through a proxy that counts its calls, with or without its
    optional ``increment`` (as an older client, or a store without one, would use it)."""

    def __init__(self, store: Any, *, increment: bool = True) -> None:
        self._store = store
        self._increment = increment
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        if name == "increment" and not self._increment:
            raise AttributeError(name)
        if name == "capabilities" and not self._increment:
            return self._store.capabilities - {INCREMENT}
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


def test_a_persisted_ceiling_at_or_above_the_minimum_is_not_written_again(
    tmp_path: Path,
) -> None:
    """Raising the ceiling to at least a value it already has is one read: no
    compare-and-set of the cell to its own value (a new version on HBase)."""
    store = SqliteStore(str(tmp_path / "db"))
    counted = _Counted(store)
    ceiling = _Ceiling(counted)  # type: ignore[arg-type]
    try:
        assert ceiling.raise_to_at_least(5) == 5
        counted.calls.clear()
        assert (ceiling.raise_to_at_least(5), ceiling.raise_to_at_least(3)) == (5, 5)
        assert counted.calls == {"read_rows": 2}
    finally:
        store.close()


def test_store_timestamps_are_linearizable_on_every_backend(store_url: str) -> None:
    store = open_store(store_url)
    source = StoreTimestamps(store)
    calls: list[tuple[str, int, int, int]] = []
    lock = threading.Lock()

    def draw(name: str) -> None:
        for _ in range(40):
            t0 = time.monotonic_ns()
            ts = source.get_timestamp()
            t1 = time.monotonic_ns()
            with lock:
                calls.append((name, t0, t1, ts))

    threads = [threading.Thread(target=draw, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 160 and min(c[3] for c in calls) >= 1
    check_linearizable(calls)
    block = source.get_timestamps(5)
    assert len(block) == 5 and block[0] > max(c[3] for c in calls)
    store.close()


def test_store_timestamps_take_one_increment_where_the_store_has_one(store_url: str) -> None:
    store = open_store(store_url)
    counted = _Counted(store)
    source = StoreTimestamps(counted)  # type: ignore[arg-type]
    source.get_timestamp()  # the first draw may find no counter yet
    counted.calls.clear()
    source.get_timestamp()
    source.get_timestamps(10)
    if hasattr(store, "increment"):  # hbase, bigtable: one round trip per call
        assert counted.calls == {"increment": 2}
    else:
        assert counted.calls == {"read_rows": 2, "check_and_set": 2}
    store.close()


def test_store_timestamps_with_and_without_increment_share_the_counter(store_url: str) -> None:
    store = open_store(store_url)
    if not hasattr(store, "increment"):
        store.close()
        pytest.skip(f"{type(getattr(store, '_store', store)).__name__} has no increment()")
    new = StoreTimestamps(store)
    old = StoreTimestamps(_Counted(store, increment=False))  # type: ignore[arg-type]
    drawn = []
    for i in range(30):
        source = (new, old)[i % 3 == 0]
        drawn.extend(source.get_timestamps(1 + i % 4))
    assert drawn == sorted(drawn) and len(set(drawn)) == len(drawn)
    assert drawn[0] >= 1
    store.close()



class _SlowCommitStore:
    """The cluster's store; a one-phase commit's writes (inside its atomic step, after
    its commit timestamp is drawn) start once *proceed* is set (at most 10 s), whether
    they go through ``mutate_rows`` or, a row at a time, ``put_row``."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.writing = threading.Event()
        self.proceed = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _park(self, table: str) -> None:
        if getattr(self._store._local, "atomic", False) and table == "t":
            self.writing.set()
            self.proceed.wait(10)

    def mutate_rows(self, table: str, mutations: Any) -> None:
        self._park(table)
        self._store.mutate_rows(table, mutations)

    def put_row(self, table: str, row: bytes, puts: Any) -> None:
        self._park(table)
        self._store.put_row(table, row, puts)


def _slow_two_cell_commit(tmp_path: Path, gap: int) -> tuple[
        percolator.Cluster, _SlowCommitStore, threading.Thread, threading.Event, list[int]]:
    """A cluster whose commit of new values to cells x and y is parked inside its
    write transaction, after its draw, before its writes, until the test sets
    ``proceed``; the commit is started in a thread and is parked when this returns."""
    cluster = percolator.connect(f"sqlite://{tmp_path}/db")
    cluster.create_table("t")
    with percolator.Transaction(cluster) as txn:
        txn.set("t", b"x", "c:v", b"old")
        txn.set("t", b"y", "c:v", b"old")
    internals(cluster).timestamps.GAP = gap  # type: ignore[attr-defined]
    slow = _SlowCommitStore(internals(cluster).store)
    internals(cluster).store = slow  # type: ignore[assignment]
    committed = threading.Event()
    commit_ts: list[int] = []

    def write() -> None:
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"x", "c:v", b"new")
            txn.set("t", b"y", "c:v", b"new")
        commit_ts.append(txn.commit_ts)
        committed.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert slow.writing.wait(10)
    return cluster, slow, writer, committed, commit_ts


def test_a_snapshot_begun_while_a_one_phase_commit_is_in_flight_holds_none_of_it(
    tmp_path: Path,
) -> None:
    """A start timestamp drawn while a one-phase commit is in flight comes from the gap
    the commit left below its own timestamp: it is handed out at once (no waiting for
    the commit) and its snapshot holds none of the commit, before or after the COMMIT.
    A transaction begun after the commit returned holds all of it."""
    cluster, slow, writer, committed, commit_ts = _slow_two_cell_commit(tmp_path, gap=1024)
    with cluster:
        reader = percolator.Transaction(cluster)
        first = reader.get("t", b"x", "c:v")
        assert not committed.is_set(), "the start timestamp waited for the commit"
        slow.proceed.set()
        assert committed.wait(10)
        writer.join(10)
        second = reader.get("t", b"y", "c:v")
        assert (first, second) == (b"old", b"old")
        assert reader.start_ts < commit_ts[0]
        after = percolator.Transaction(cluster)
        assert after.start_ts > commit_ts[0]
        assert (after.get("t", b"x", "c:v"), after.get("t", b"y", "c:v")) == (b"new", b"new")


def test_a_snapshot_begun_once_the_gap_is_used_up_waits_and_holds_all_of_it(
    tmp_path: Path,
) -> None:
    """With a gap of one timestamp, the first start timestamp drawn during the commit
    takes it; the next one is above the commit's timestamp and is handed out only once
    that commit is visible: its snapshot holds both of its cells, never one. (Without
    the wait, it reads x before the COMMIT and y after it.)"""
    cluster, slow, writer, committed, commit_ts = _slow_two_cell_commit(tmp_path, gap=1)
    with cluster:
        below = percolator.Transaction(cluster)
        assert not committed.is_set()
        # The next begin waits for the commit, so the commit goes on from a timer.
        threading.Timer(0.3, slow.proceed.set).start()
        above = percolator.Transaction(cluster)  # its start timestamp is above the commit's
        first = above.get("t", b"x", "c:v")
        assert committed.wait(10)
        writer.join(10)
        second = above.get("t", b"y", "c:v")
        assert (first, second) == (b"new", b"new")
        assert below.start_ts < commit_ts[0] < above.start_ts
        assert (below.get("t", b"x", "c:v"), below.get("t", b"y", "c:v")) == (b"old", b"old")


def test_a_commit_in_flight_in_a_dead_process_holds_nobody_back(tmp_path: Path) -> None:
    """A committer killed between its draw and its COMMIT leaves its timestamp in the
    sidecar's in-flight slot; SQLite rolled its write back, so draws go on."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    below = source.get_timestamp()
    with source._locked():
        source._set_slot(below, dead.pid)
    t0 = time.monotonic()
    assert source.get_timestamp() > below
    assert time.monotonic() - t0 < source.IN_FLIGHT_DEADLINE
    assert source._slot() == (0, 0)
    source.close()
    store.close()


def test_a_commit_in_flight_too_long_is_a_clear_error(tmp_path: Path) -> None:
    """A committer stopped (SIGSTOP) after its draw: a draw gives up after
    IN_FLIGHT_DEADLINE with StoreUnavailable naming the process, instead of hanging."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    source.IN_FLIGHT_DEADLINE = 0.3
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        below = source.get_timestamp()
        with source._locked():
            source._set_slot(below, stopped.pid)
        with pytest.raises(percolator.StoreUnavailable, match=f"process {stopped.pid}"):
            source.get_timestamp()
        assert stopped.poll() is None, "asking whether the committer lives signalled it"
    finally:
        stopped.kill()
        stopped.wait()
        source.close()
        store.close()


def test_a_draw_waiting_for_a_commit_in_flight_looks_at_once_then_at_least_every_ms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A draw above a commit in flight (of this process: no liveness to ask) looks at
    the slot at once, then after pauses that start at tens of microseconds and grow
    to a millisecond, no more: it neither spins nor oversleeps the commit's end."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    below = source.get_timestamp()
    with source._locked():
        source._set_slot(below, os.getpid())
    drawing, real_sleep = threading.get_ident(), time.sleep
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        if threading.get_ident() == drawing:
            pauses.append(seconds)
            if len(pauses) == 12:  # the commit is visible
                with source._locked():
                    source._set_slot(0, 0)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    try:
        assert source.get_timestamp() > below
    finally:
        monkeypatch.undo()
        source.close()
        store.close()
    assert len(pauses) == 12 and pauses == sorted(pauses)
    assert pauses[0] == 0
    assert 0 < pauses[1] < pauses[-1] <= 0.001


def test_commits_and_draws_across_refills_neither_deadlock_nor_repeat(tmp_path: Path) -> None:
    """With a tiny block, draws persist the ceiling again and again while one-phase
    commits draw inside SQLite's write transaction. A draw never writes the store
    while it holds the sidecar lock (a commit holding the write lock waits for that
    lock: both would wait forever), and a commit whose draw finds the block spent goes
    two-phase. Threads of two processes; every value committed is read back."""
    db = tmp_path / "db"
    procs = [subprocess.Popen(
        [sys.executable, "-c", _REFILL_WORKER, str(db), str(i)], cwd=ROOT)
        for i in range(2)]
    try:
        assert [p.wait(60) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
    with percolator.connect(f"sqlite://{db}") as cluster:
        rows = dict(percolator.Transaction(cluster).scan("t"))
    assert len(rows) == 2 * 3 * 40


_REFILL_WORKER = """
import sys, threading
import percolator
from percolator._timestamps import HostTimestamps
from percolator._internals import internals
HostTimestamps.BLOCK, HostTimestamps.REFILL = 6, 3
db, me = sys.argv[1], sys.argv[2]
with percolator.connect(f"sqlite://{db}") as cluster:
    cluster.create_table("t")
    def work(thread):
        for i in range(40):
            with percolator.Transaction(cluster) as txn:
                txn.set("t", f"{me}-{thread}-{i}".encode(), "c:v", b"1")
            internals(cluster).timestamps.get_timestamps(2)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in threads: t.start()
    for t in threads: t.join()
"""


def test_a_forked_child_does_not_share_its_parents_sidecar_lock(tmp_path: Path) -> None:
    """A child forked while its parent holds the sidecar's flock must wait for it: it
    reopens the sidecar (its inherited descriptor shares the parent's open file, and
    with it the flock, so both could count at once and hand out one timestamp twice)."""
    import fcntl

    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    first = source.get_timestamp()
    read_end, write_end = os.pipe()
    with source._lock:
        source._holding = False  # this flock is the test's: nothing lets go of it but the test
    fcntl.flock(source._fd, fcntl.LOCK_EX)  # the parent is counting
    pid = os.fork()
    if pid == 0:  # the child draws and reports
        try:
            os.write(write_end, b"%d\n" % source.get_timestamp())
        finally:
            os._exit(0)
    try:
        os.close(write_end)
        os.set_blocking(read_end, False)
        time.sleep(0.5)
        with pytest.raises(BlockingIOError):
            os.read(read_end, 64)  # still waiting for the parent's lock
        fcntl.flock(source._fd, fcntl.LOCK_UN)
        os.set_blocking(read_end, True)
        assert int(os.read(read_end, 64)) > first
    finally:
        os.waitpid(pid, 0)
        os.close(read_end)
        source.close()
        store.close()


def test_a_draw_after_a_commit_is_visible_is_above_it_even_while_its_slot_is_set(
    tmp_path: Path,
) -> None:
    """Between a one-phase commit's COMMIT and the clearing of its in-flight slot,
    anybody may read the commit's cells (a worker's scan of the notify family reads
    them raw). A start timestamp drawn after such a read must be above the commit, so
    that its snapshot holds what was read: the gap below the commit is closed before
    the COMMIT, and the draw waits until the slot is cleared. (With the gap still
    open, the draw returns at once, below the commit, and the snapshot misses the
    value that was just read raw.)"""
    cluster = percolator.connect(f"sqlite://{tmp_path}/db")
    cluster.create_table("t")
    commit_ts: list[int] = []

    def write() -> None:
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"x", "c:v", b"new")
        commit_ts.append(txn.commit_ts)

    writer = threading.Thread(target=write)
    parked = ParkedAfterCommit(internals(cluster).store, writer)
    internals(cluster).store = parked  # type: ignore[assignment]
    with cluster:
        writer.start()
        assert parked.committed.wait(10)
        raw = parked.read_rows("t", [b"x"], [Read(WRITE, ("c:v",))])
        assert raw[b"x"], "the COMMIT is done: the write record can be read raw"
        began: list[percolator.Transaction] = []
        reader = threading.Thread(target=lambda: began.append(percolator.Transaction(cluster)))
        reader.start()
        reader.join(0.5)
        assert not began, "a start timestamp was handed out while the commit's slot was set"
        parked.proceed.set()
        reader.join(10)
        writer.join(10)
        assert began[0].start_ts > commit_ts[0]
        assert began[0].get("t", b"x", "c:v") == b"new"


# --- open_oracle: the client of an oracle target, by its scheme's entry in ORACLES ---------


class RecordedOracle:
    """An oracle client that records how it was made (registered in ORACLES by the
    tests below, as a package registers its scheme)."""

    def __init__(self, target: str, **options: Any) -> None:
        self.target, self.options = target, options


def test_an_oracle_target_is_opened_by_its_schemes_entry_with_the_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheme is what comes before the first ``://`` (the rest is the client's to
    read, ``://`` and all); its entry names ``module:callable``, called with the whole
    target and the options."""
    monkeypatch.setitem(ORACLES, "recorded", f"{__name__}:RecordedOracle")
    client = open_oracle("recorded://host:1/path://x", deadline=2.5, tls=None)
    assert isinstance(client, RecordedOracle)
    assert (client.target, client.options) == ("recorded://host:1/path://x",
                                               {"deadline": 2.5, "tls": None})


def test_an_oracle_target_that_is_not_a_str_is_refused_naming_its_type() -> None:
    with pytest.raises(percolator.InvalidArgument) as refused:
        open_oracle(7)  # type: ignore[arg-type]
    assert str(refused.value) == "oracle target must be a str, got int: 7"


def test_an_oracle_target_of_no_registered_scheme_is_refused_naming_the_schemes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(ORACLES, "recorded", f"{__name__}:RecordedOracle")
    for target in ("http://recorded://x", "://recorded"):
        with pytest.raises(percolator.InvalidArgument) as refused:
            open_oracle(target)
        assert str(refused.value) == (
            f"oracle target {target!r} must look like 'grpc://...', 'grpcs://...', "
            "'zk://...', 'recorded://...'")


def test_an_oracle_scheme_whose_client_is_not_installed_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(ORACLES, "missing", "a_module_that_is_not_installed:Client")
    with pytest.raises(percolator.OracleUnavailable) as missing:
        open_oracle("missing://host:1")
    assert str(missing.value).startswith(
        "the timestamp oracle's client ('missing://host:1') needs grpcio, which is not "
        "installed (No module named 'a_module_that_is_not_installed'): "
        "pip install 'percolator-txn[oracle]'")


def test_a_process_this_one_may_not_signal_counts_as_alive() -> None:
    """A commit in flight in another user's process is waited for, not cleared:
    ``os.kill(pid, 0)`` on a process this one may not signal raises PermissionError,
    and the process exists. (As root, asked from a child that drops to nobody; asked
    here too, where pid 1 may be signalled or not, both alive.)"""
    assert process_alive(1)
    if os.geteuid() != 0:
        if os.stat("/proc/1").st_uid == os.geteuid():
            pytest.skip("pid 1 is this user's: no process of another user to ask about")
        return
    child = os.fork()
    if child == 0:
        code = 2
        try:
            os.setuid(65534)
            code = 0 if process_alive(1) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "pid 1 counted as dead"


# --- boot_id: a sidecar (and an owner id, a lock census) written before a reboot ------


def test_the_boot_id_is_this_boots_as_the_kernel_tells_it() -> None:
    """A sidecar written in another boot is reset (its page cache may have lost writes):
    the id must be the kernel's, one per boot, the same in every process of the host."""
    path = Path("/proc/sys/kernel/random/boot_id")
    if not path.exists():
        pytest.skip("no /proc/sys/kernel/random/boot_id on this system")
    assert boot_id() == uuid.UUID(path.read_text().strip()).bytes


def test_a_boot_id_that_cannot_be_read_is_sixteen_zero_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without /proc (or with something else there) the id is all zeros, the size of a
    real one: the sidecar's header keeps its layout."""
    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError("no /proc here (test)")

    monkeypatch.setattr("percolator._timestamps.open", unreadable, raising=False)
    assert boot_id() == b"\0" * 16
    monkeypatch.setattr("percolator._timestamps.open",
                        lambda *args, **kwargs: io.BytesIO(b"not a uuid\n"), raising=False)
    assert boot_id() == b"\0" * 16


@pytest.mark.parametrize("where", ["no such directory", "/dev/null"],
                         ids=["no-directory", "dev-null"])
def test_a_sidecar_that_cannot_be_opened_is_a_clear_error(tmp_path: Path, where: str) -> None:
    """A path in no directory cannot be opened; /dev/null opens but cannot be sized:
    StoreUnavailable either way, naming the path, and no descriptor left open."""
    store = SqliteStore(str(tmp_path / "db"))
    path = str(tmp_path / where / "db-ts") if where[0] != "/" else where
    try:
        descriptors = sorted(os.listdir("/proc/self/fd"))
        with pytest.raises(percolator.StoreUnavailable) as failed:
            HostTimestamps(store, path)
        assert str(failed.value).startswith(f"cannot open timestamp file {path!r}: ")
        assert sorted(os.listdir("/proc/self/fd")) == descriptors
    finally:
        store.close()


_STDIN_CLOSED = """
import os, sys
from percolator._timestamps import HostTimestamps
from percolator.stores.sqlite import SqliteStore
store = SqliteStore(sys.argv[1])
HostTimestamps(store, sys.argv[1] + "-ts").close()  # the store's meta rows exist: no new file
os.close(0)  # as a daemon's standard input
source = HostTimestamps(store, sys.argv[1] + "-ts")
opened_as = source._fd
source.get_timestamp()

def sidecar_descriptors():  # the source's and its map's
    sidecar = os.path.realpath(sys.argv[1] + "-ts")
    return sum(os.path.realpath(f"/proc/self/fd/{fd}") == sidecar
               for fd in os.listdir("/proc/self/fd"))

held = sidecar_descriptors()
child = os.fork()
if child == 0:  # its first section opens the sidecar again, closing what it inherited
    source.get_timestamp()
    os._exit(sidecar_descriptors() - held)
_, status = os.waitpid(child, 0)
source.close()
source.close()  # again: closes nothing (not this process's standard output)
try:
    os.fstat(0)
    print(opened_as, "open", os.waitstatus_to_exitcode(status))
except OSError:
    print(opened_as, "closed", os.waitstatus_to_exitcode(status))
"""


def test_a_sidecar_opened_as_descriptor_0_is_closed_too(tmp_path: Path) -> None:
    """A process with its standard input closed (a daemon) opens the sidecar as
    descriptor 0, which its close closes as any other (its lock and presence go); a
    second close closes nothing. A forked child opening the sidecar again closes the
    descriptor 0 it inherited: it holds as many of the sidecar as its parent. (In a
    process of its own: closing this one's descriptor 0 could hand it to a file
    another thread opens meanwhile.)"""
    done = subprocess.run([sys.executable, "-c", _STDIN_CLOSED, str(tmp_path / "db")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "closed", "0"]


_REOPEN_FAILS = """
import os, sys
from percolator._errors import StoreUnavailable
from percolator._timestamps import HostTimestamps
from percolator.stores.sqlite import SqliteStore
store = SqliteStore(sys.argv[1])
source = HostTimestamps(store, sys.argv[1] + "-ts")
os.remove(sys.argv[1] + "-ts")
os.mkdir(sys.argv[1] + "-ts")  # no file can be opened there now
try:
    source._open()  # again, as a forked child's first section does
except StoreUnavailable:
    print("refused")
source.close()  # the source is closed: nothing more to close
os.fstat(1)
print("closed nothing else")
"""


def test_a_sidecar_that_cannot_be_opened_again_leaves_the_source_closed(
    tmp_path: Path,
) -> None:
    """Opening the sidecar again (a forked child does, at its first section) closes
    what the source held first; when the opening then fails, the source is left
    closed, and its close closes nothing (not some other file now at a number it
    held). (In a process of its own: what it could close is this process's output.)"""
    done = subprocess.run([sys.executable, "-c", _REOPEN_FAILS, str(tmp_path / "db")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["refused", "closed nothing else"]


def test_the_sidecar_is_made_readable_by_all_and_writable_by_its_owner(tmp_path: Path) -> None:
    """Mode 0o644 (less the umask): other users' processes of the host may look, and
    nobody may run it."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    try:
        umask = os.umask(0)
        os.umask(umask)
        assert os.stat(tmp_path / "db-ts").st_mode & 0o777 == 0o644 & ~umask
    finally:
        source.close()
        store.close()
