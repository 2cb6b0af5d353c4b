"""The safe point's parts, one at a time, on the embedded store: a bulk load's hold, a
snapshot made at a given start timestamp, the (wall time, timestamp) log that a
retention reads, and the staircase of a client's running transactions.

tests/gc/test_gc.py asks the same of whole passes; these pin each decision down where
a pass would only show it in some runs (what a pass overtakes depends on ages and on
which transactions run when it looks).
"""

from __future__ import annotations

import json
import os
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
from percolator._encoding import META_TABLE
from percolator._internals import internals
from percolator._safe_point import (
    _RECORD,
    CLIENT_PREFIX,
    REFRESH_PREFIX,
    ROW,
    SAFE_POINT,
    TS_LOG,
    TS_LOG_ENTRIES,
    YOUNGER_PREFIX,
    Hold,
    Holder,
    SafePoint,
    oldest_since,
    staircase,
)
from percolator._store import Mutation, Read


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[percolator.Cluster]:
    with percolator.connect(f"sqlite:///{tmp_path}/db", safe_point_refresh=0.02) as c:
        c.create_table("t")
        yield c


def _safe_point(cluster: percolator.Cluster) -> SafePoint:
    return internals(cluster).safe_point


def _stored(sp: SafePoint) -> dict[str, bytes]:
    """The safe point row's cells as stored (newest values)."""
    cells = sp.store.read_rows(META_TABLE, [ROW], [Read("m")]).get(ROW, {})
    return {column: versions[0][1] for column, versions in cells.items()}


def _published(sp: SafePoint, start_ts: int) -> bool:
    """Whether this client's publication holds *start_ts* (waits for the publisher
    thread's next round, a minute at most)."""
    owner = sp.coordination.current_owner()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for holder in sp.holders():
            if holder.owner == owner and start_ts in (ts for ts, _ in holder.steps):
                return True
        time.sleep(sp.refresh / 2)
    return False


# --- the persisted safe point -------------------------------------------------------


def test_the_safe_point_only_moves_forward(cluster: percolator.Cluster) -> None:
    """``advance`` persists a timestamp above the one persisted, from the first (1) on;
    one at or below it changes nothing, not even the wall time recorded with it, and
    returns the one persisted (another client's pass may have gone further), which this
    client's checks then use."""
    sp = _safe_point(cluster)
    assert sp.read_record() is None
    assert sp.advance(1) == 1
    first = sp.read_record()
    assert first is not None and first[0] == 1
    # A pass on another host persisted 300 (and its wall time, as its clock says).
    sp.store.mutate_rows(META_TABLE, [Mutation(ROW, [(SAFE_POINT, 0, _RECORD.pack(300, 12345))])])
    assert sp.advance(200) == 300
    assert sp.read_record() == (300, 12345)
    assert sp.advance(300) == 300
    assert sp.read_record() == (300, 12345)
    with pytest.raises(percolator.SnapshotTooOldError) as too_old:
        sp.check(299)
    assert (too_old.value.start_ts, too_old.value.safe_point) == (299, 300)
    assert str(too_old.value).startswith("transaction 299 is too old: the garbage-collection "
                                         "safe point is 300")
    sp.check(300)  # at the safe point: its versions are kept
    assert sp.advance(400) == 400
    record = sp.read_record()
    assert record is not None and record[0] == 400
    assert abs(record[1] / 1000 - time.time()) < 3600, "persisted with its wall time"


class _RacingPasses:
    """The safe point's store, where another client's pass persists a new safe point
    just before each compare-and-set of this one (which then finds it changed)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.raced = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def check_and_set(self, table: str, row: bytes, column: str, expected: bytes | None,
                      value: bytes) -> bool:
        if column == SAFE_POINT:
            self.raced += 1
            record = _RECORD.pack(self.raced, 0)
            self._store.mutate_rows(META_TABLE, [Mutation(ROW, [(SAFE_POINT, 0, record)])])
        return bool(self._store.check_and_set(table, row, column, expected, value))


def test_a_safe_point_that_keeps_changing_under_every_try_is_an_error(
    cluster: percolator.Cluster,
) -> None:
    sp = _safe_point(cluster)
    racing = _RacingPasses(sp.store)
    sp.store = racing  # type: ignore[assignment]
    try:
        with pytest.raises(percolator.PercolatorError) as failed:
            sp.advance(10**6)
    finally:
        sp.store = racing._store
    assert str(failed.value) == "could not persist the safe point: it kept changing"
    record = sp.read_record()
    assert record is not None and record[0] == racing.raced < 10**6


def test_a_pass_with_no_client_announced_waits_twice_its_own_refresh(
    cluster: percolator.Cluster,
) -> None:
    sp = _safe_point(cluster)
    assert sp.store.read_rows(META_TABLE, [ROW], [Read("m")]) == {}, "no client announced"
    assert sp.grace() == 2 * sp.refresh


def test_a_pass_waits_twice_the_slowest_refresh_of_the_clients_not_known_dead(
    cluster: percolator.Cluster,
) -> None:
    """A client of an earlier boot is certainly dead: its announcement (however slow)
    is passed over, and the announcements after it still count; one whose liveness
    is unknown (another host's) counts."""
    sp = _safe_point(cluster)
    mine = sp.coordination.current_owner().split("/")
    dead = "/".join([*mine[:2], "an-earlier-boot", *mine[3:]])
    unknown = "~a client on another host"
    assert (sp.coordination.is_alive(dead), sp.coordination.is_alive(unknown)) == (False, None)
    sp.store.mutate_rows(META_TABLE, [Mutation(ROW, [
        (REFRESH_PREFIX + dead, 0, struct.pack(">d", 1000.0)),
        (REFRESH_PREFIX + unknown, 0, struct.pack(">d", 0.5)),
    ])])
    assert sp.grace() == 2 * 0.5


def test_a_client_announces_its_refresh_before_its_first_fetch_only(
    cluster: percolator.Cluster,
) -> None:
    """The announcement is written once, before the first fetch; the fetches after it
    (one per refresh interval in every process) only read. (Here the announcement is
    removed behind the client's back after the first fetch: a second fetch that
    announced again would put it back.)"""
    sp = _safe_point(cluster)
    column = REFRESH_PREFIX + sp.coordination.current_owner()
    assert column not in _stored(sp)
    sp.fetch()
    assert struct.unpack(">d", _stored(sp)[column]) == (sp.refresh,)
    sp.store.mutate_rows(META_TABLE, [Mutation(ROW, deletes=[(column, 0)])])
    sp.fetch()
    assert column not in _stored(sp)


def test_the_holders_are_what_each_client_published(cluster: percolator.Cluster) -> None:
    """A client's publication read back: its oldest transaction's start and wall time,
    the younger ones of its staircase with theirs (to the millisecond), and the
    coordinator's word on it (this client: alive)."""
    sp = _safe_point(cluster)
    old = percolator.Snapshot(cluster)
    old._began -= 7200
    middle = percolator.Snapshot(cluster)
    middle._began -= 3600
    young = percolator.Snapshot(cluster)
    sp.publish()
    (holder,) = sp.holders()
    assert holder == Holder(
        sp.coordination.current_owner(), old.start_ts, int(old._began * 1000) / 1000, True,
        tuple((s.start_ts, int(s._began * 1000) / 1000) for s in (middle, young)))
    owner = sp.coordination.current_owner()
    middle.close()
    young.close()
    sp.publish()
    assert sp.holders() == [Holder(owner, old.start_ts, holder.began, True)]
    assert YOUNGER_PREFIX + owner not in _stored(sp), "no younger ones: none stored"
    old.close()
    sp.publish()
    assert sp.holders() == []
    assert _stored(sp)[CLIENT_PREFIX + owner] == b"idle"
    sp.close()
    assert not {CLIENT_PREFIX + owner, YOUNGER_PREFIX + owner, REFRESH_PREFIX + owner} & set(
        _stored(sp)), "withdrawn when the client closes"


def test_a_client_publishes_nothing_before_it_runs_a_transaction(
    cluster: percolator.Cluster,
) -> None:
    """A client that has run no transaction has nothing to publish, not even ``idle``:
    a publication then writes nothing (every client of a store would write a cell)."""
    sp = _safe_point(cluster)
    sp.publish()
    owner = sp.coordination.current_owner()
    assert not {CLIENT_PREFIX + owner, YOUNGER_PREFIX + owner} & set(_stored(sp))


class _Waits:
    """The publisher's stop event, recording how long each round waits; the first
    round's wait ends the loop (as a close would)."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []
        self.waited = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        self.waited.set()
        return True

    def set(self) -> None:
        pass


def test_the_publisher_publishes_every_half_refresh(cluster: percolator.Cluster) -> None:
    """Twice per refresh interval (module docstring): a transaction begun just after a
    publication is published within half the interval a cached safe point is trusted."""
    sp = _safe_point(cluster)
    waits = _Waits()
    sp._stop = waits  # type: ignore[assignment]
    snapshot = percolator.Snapshot(cluster)
    try:
        assert waits.waited.wait(60)
        assert waits.timeouts == [sp.refresh / 2]
    finally:
        snapshot.close()


def test_a_forked_childs_close_leaves_its_parents_publication(
    cluster: percolator.Cluster,
) -> None:
    """A child forked from a client (it inherits the cluster) that closes before it
    ever published withdraws nothing of what its parent published: the parent's running
    transaction still holds the safe point back."""
    sp = _safe_point(cluster)
    running = percolator.Snapshot(cluster)
    sp.publish()
    owner = sp.coordination.current_owner()
    assert CLIENT_PREFIX + owner in _stored(sp)
    pid = os.fork()
    if pid == 0:  # the child: a transaction begun and closed, then the client closed
        code = 1
        try:
            percolator.Snapshot(cluster).close()
            sp.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [(h.owner, h.start_ts) for h in sp.holders()] == [(owner, running.start_ts)]
    running.close()


def test_a_forked_child_publishes_under_an_owner_of_its_own(
    cluster: percolator.Cluster,
) -> None:
    """A child forked from a client runs a transaction and publishes: under an owner id
    of its own (its pid, which names its liveness), so its publication leaves its
    parent's, and the parent's running transaction still holds the safe point back.
    With the parent's owner id, the child's idle publication replaced the parent's
    entry, and a pass elsewhere could overtake the parent's running transaction."""
    sp = _safe_point(cluster)
    running = percolator.Snapshot(cluster)
    sp.publish()
    owner = sp.coordination.current_owner()
    told, tell = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a transaction begun and ended, then its publication
        code = 1
        try:
            percolator.Snapshot(cluster).close()
            sp.publish()
            os.write(tell, sp.coordination.current_owner().encode())
            code = 0
        finally:
            os._exit(code)
    os.close(tell)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with os.fdopen(told, "rb") as pipe:
        child = pipe.read().decode()
    assert child.startswith("local/") and child != owner
    assert child.split("/")[3] == str(pid)
    assert sp.coordination.current_owner() == owner
    assert [(h.owner, h.start_ts) for h in sp.holders()] == [(owner, running.start_ts)]
    running.close()


def test_the_holders_come_oldest_first(cluster: percolator.Cluster) -> None:
    sp = _safe_point(cluster)
    sp.store.mutate_rows(META_TABLE, [Mutation(ROW, [
        (CLIENT_PREFIX + "~a", 0, _RECORD.pack(30, 3000)),
        (CLIENT_PREFIX + "~b", 0, _RECORD.pack(10, 1000)),
        (CLIENT_PREFIX + "~c", 0, _RECORD.pack(20, 2000)),
    ])])
    assert [(h.owner, h.start_ts) for h in sp.holders()] == [("~b", 10), ("~c", 20), ("~a", 30)]


def test_only_a_pruning_read_of_the_holders_removes_the_entries_of_dead_clients(
    cluster: percolator.Cluster,
) -> None:
    """``holders()`` (``percolator status``) leaves out a client known to be dead and
    removes nothing; ``holders(prune=True)`` (a pass) also removes its publication and
    its refresh announcement. An idle client's publication holds nothing back."""
    sp = _safe_point(cluster)
    assert sp.holders() == [], "nothing published yet"
    mine = sp.coordination.current_owner().split("/")
    dead = "/".join([*mine[:2], "an-earlier-boot", *mine[3:]])
    idle = "~an idle client on another host"
    columns = [CLIENT_PREFIX + dead, YOUNGER_PREFIX + dead, REFRESH_PREFIX + dead]
    sp.store.mutate_rows(META_TABLE, [Mutation(ROW, [
        (CLIENT_PREFIX + dead, 0, _RECORD.pack(10, 1000)),
        (YOUNGER_PREFIX + dead, 0, _RECORD.pack(20, 2000)),
        (REFRESH_PREFIX + dead, 0, struct.pack(">d", 1.0)),
        (CLIENT_PREFIX + idle, 0, b"idle"),
    ])])

    def stored() -> set[str]:
        return set(sp.store.read_rows(META_TABLE, [ROW], [Read("m")]).get(ROW, {}))

    assert sp.holders() == []
    assert set(columns) <= stored()
    assert sp.holders(prune=True) == []
    assert not set(columns) & stored()
    assert CLIENT_PREFIX + idle in stored(), "liveness unknown: left alone"


# --- a hold (a bulk load's driver) ---------------------------------------------------


def test_a_hold_holds_the_safe_point_from_its_draw_until_released(
    cluster: percolator.Cluster,
) -> None:
    """Kept alive by its owner (a bulk load's driver keeps it while workers write), a
    hold counts as running from its draw until :meth:`Hold.release`, not longer."""
    sp = _safe_point(cluster)
    hold = Hold()
    start_ts = sp.begin(hold, internals(cluster).timestamps.get_timestamp)
    assert hold.start_ts == start_ts
    assert [ts for ts, _ in sp.running()] == [start_ts]
    hold.release()
    assert sp.running() == []
    assert hold.start_ts == start_ts


def test_a_process_that_never_closes_its_cluster_still_exits(tmp_path: Path) -> None:
    """The publisher thread, started by the first transaction, is a daemon: a script
    that ends without closing its cluster exits (the interpreter would wait for any
    other thread, and the publisher runs until the cluster closes)."""
    script = ("import sys, threading, percolator\n"
              "cluster = percolator.connect(sys.argv[1])\n"
              "snapshot = percolator.Snapshot(cluster)\n"
              "print(*(t.name for t in threading.enumerate() if t.daemon), sep='\\n')\n")
    done = subprocess.run([sys.executable, "-c", script, f"sqlite:///{tmp_path}/db"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "percolator-safe-point" in done.stdout.splitlines(), "the daemon threads, by name"


def test_a_failed_draw_holds_nothing_and_keeps_no_pass_waiting(
    cluster: percolator.Cluster,
) -> None:
    """Even while its owner still holds it (a traceback kept, a retry loop's last
    attempt), a transaction whose draw failed is not running: it has no start
    timestamp to hold the point at."""
    sp = _safe_point(cluster)

    def unreachable() -> int:
        raise percolator.StoreUnavailable("the timestamps' store is gone")

    hold = Hold()
    with pytest.raises(percolator.StoreUnavailable):
        sp.begin(hold, unreachable)
    assert sp.running() == []  # and returns: no draw is in progress any more
    assert not hold._closed, "still open, still referenced"


def test_a_pass_waits_for_every_draw_in_progress_not_only_the_last_to_finish(
    cluster: percolator.Cluster,
) -> None:
    """Two draws in progress; the one begun second returns first. What a pass takes as
    this process's running transactions (:meth:`SafePoint.running`) waits for the
    other one as well, and holds it."""
    sp = _safe_point(cluster)
    draw = internals(cluster).timestamps.get_timestamp
    quick, slow = Hold(), Hold()
    slow._began = quick._began + 1  # younger, with the larger timestamp: on the staircase
    inside = {quick: threading.Event(), slow: threading.Event()}
    go = {quick: threading.Event(), slow: threading.Event()}

    def begin(hold: Hold) -> None:
        def parked() -> int:
            inside[hold].set()
            assert go[hold].wait(60)
            return draw()
        sp.begin(hold, parked)

    threads = {hold: threading.Thread(target=begin, args=(hold,)) for hold in (slow, quick)}
    for hold, thread in threads.items():
        thread.start()
        assert inside[hold].wait(60)
    go[quick].set()
    threads[quick].join(60)
    seen: list[list[tuple[int, float]]] = []
    looker = threading.Thread(target=lambda: seen.append(sp.running()))
    looker.start()
    looker.join(0.3)  # (a looker that does not wait has returned by now)
    go[slow].set()
    threads[slow].join(60)
    looker.join(60)
    assert quick.start_ts < slow.start_ts
    assert [ts for ts, _ in seen[0]] == [quick.start_ts, slow.start_ts]


class _Wait:
    def __init__(self) -> None:
        self.notified = threading.Event()
        self.go = threading.Event()


class _SteppedCondition:
    """The safe point's condition on its own lock, where a waiter that is notified goes
    back for the lock only when the test lets it (``go``): what happens between a
    wake-up and the waiter's return (another draw beginning) is the test's to choose."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.waits: list[_Wait] = []
        self._waiting: list[_Wait] = []
        self.arrived = threading.Semaphore(0)

    def wait(self) -> bool:
        this = _Wait()
        self.waits.append(this)
        self._waiting.append(this)
        self._lock.release()
        try:
            self.arrived.release()
            this.notified.wait(60)
            this.go.wait(60)
        finally:
            self._lock.acquire()
        return True

    def notify_all(self) -> None:
        for this in self._waiting:
            this.notified.set()
        self._waiting = []

    def let_all_go(self) -> None:
        for this in self.waits:
            this.notified.set()
            this.go.set()


def test_lookers_woken_while_another_draw_begins_are_woken_again_when_it_ends(
    cluster: percolator.Cluster,
) -> None:
    """Two lookers (:meth:`SafePoint.running`) wait for a draw; it ends and wakes them,
    and another draw begins before they take the lock again: both wait again, and the
    end of that draw wakes them both (the count of waiters must not drop to 0 while
    they wait, or nobody wakes them)."""
    sp = _safe_point(cluster)
    condition = _SteppedCondition(sp._lock)
    sp._drawn = condition  # type: ignore[assignment]
    draw = internals(cluster).timestamps.get_timestamp
    holds = [Hold(), Hold()]
    inside = [threading.Event(), threading.Event()]
    go = [threading.Event(), threading.Event()]

    def begin(i: int) -> None:
        def parked() -> int:
            inside[i].set()
            assert go[i].wait(60)
            return draw()
        sp.begin(holds[i], parked)

    drawers = [threading.Thread(target=begin, args=(i,)) for i in range(2)]
    seen: list[list[tuple[int, float]]] = []
    lookers = [threading.Thread(target=lambda: seen.append(sp.running())) for _ in range(2)]
    try:
        drawers[0].start()
        assert inside[0].wait(60)
        for looker in lookers:
            looker.start()
            assert condition.arrived.acquire(timeout=60)
        go[0].set()
        drawers[0].join(60)
        first_waits = condition.waits[:2]
        assert all(w.notified.is_set() for w in first_waits), "the first draw's end wakes both"
        drawers[1].start()
        assert inside[1].wait(60)
        for w in first_waits:  # back for the lock, with the second draw in progress
            w.go.set()
            assert condition.arrived.acquire(timeout=60), "a looker waits again"
        go[1].set()
        drawers[1].join(60)
        assert all(w.notified.is_set() for w in condition.waits[2:4]), \
            "the second draw's end wakes both lookers again"
    finally:
        go[0].set()
        go[1].set()
        condition.let_all_go()
        for thread in (*drawers, *lookers):
            if thread.ident is not None:
                thread.join(60)
    assert len(seen) == 2


def test_one_publisher_thread_per_client_started_by_its_first_transaction(
    cluster: percolator.Cluster,
) -> None:
    sp = _safe_point(cluster)
    assert sp._publisher is None
    first = percolator.Snapshot(cluster)
    publisher = sp._publisher
    assert publisher is not None and publisher.is_alive()
    second = percolator.Snapshot(cluster)
    assert sp._publisher is publisher
    first.close()
    second.close()


def test_a_closed_safe_point_starts_no_publisher_for_a_transaction_begun_after(
    cluster: percolator.Cluster,
) -> None:
    sp = _safe_point(cluster)
    sp.close()
    sp.begin(Hold(), internals(cluster).timestamps.get_timestamp)
    assert sp._publisher is None


def test_a_publication_that_hangs_does_not_hang_the_close(cluster: percolator.Cluster) -> None:
    """``close`` waits for a publication in progress (the store closes next), but only
    :attr:`SafePoint.CLOSE_WAIT` seconds: then it withdraws what it announced and
    returns, the publisher still in its store call."""
    sp = _safe_point(cluster)
    inside, go = threading.Event(), threading.Event()

    def hanging() -> None:
        inside.set()
        go.wait(120)

    sp.publish = hanging  # type: ignore[method-assign]
    sp.CLOSE_WAIT = 0.1
    snapshot = percolator.Snapshot(cluster)
    sp.fetch()  # announced: close withdraws the announcement
    publisher = sp._publisher
    assert publisher is not None and inside.wait(60)
    closer = threading.Thread(target=sp.close)
    try:
        closer.start()
        closer.join(60)
        assert not closer.is_alive(), "close waited for the hung publication"
        assert publisher.is_alive(), "the publication still hangs"
        owner = sp.coordination.current_owner()
        assert REFRESH_PREFIX + owner not in _stored(sp)
    finally:
        go.set()
        publisher.join(60)
        closer.join(60)
        snapshot.close()


# --- a snapshot at a given start timestamp (registered, not drawn) -------------------


def test_snapshots_at_given_start_timestamps_all_hold_the_safe_point_and_are_published(
    cluster: percolator.Cluster,
) -> None:
    """``Snapshot(start_ts=...)`` registers a transaction whose timestamp was drawn
    elsewhere: each one registered counts (a second does not make the first forgotten),
    the client's one publisher thread starts with the first and publishes them."""
    sp = _safe_point(cluster)
    draw = internals(cluster).timestamps.get_timestamp
    first_ts, second_ts = draw(), draw()
    assert sp._publisher is None, "nothing has begun yet"
    first = percolator.Snapshot(cluster, start_ts=first_ts)
    publisher = sp._publisher
    assert publisher is not None and publisher.is_alive()
    second = percolator.Snapshot(cluster, start_ts=second_ts)
    assert sp._publisher is publisher, "one publisher thread per client"
    assert _published(sp, first_ts)
    assert cluster.gc(retention=0).safe_point == first_ts
    first.close()
    assert [ts for ts, _ in sp.running()] == [second_ts]
    second.close()


def test_a_closed_safe_point_starts_no_publisher_for_a_registered_transaction(
    cluster: percolator.Cluster,
) -> None:
    sp = _safe_point(cluster)
    sp.close()
    hold = Hold()
    hold.start_ts = internals(cluster).timestamps.get_timestamp()
    sp.register(hold)
    assert sp._publisher is None


# --- the (wall time, timestamp) log that a retention reads ---------------------------


def _write_log(sp: SafePoint, entries: list[tuple[float, int]]) -> None:
    """The log as passes on hosts whose clocks differ may have left it."""
    sp.store.mutate_rows(META_TABLE, [Mutation(ROW, [(TS_LOG, 0, json.dumps(entries).encode())])])


def _logged(sp: SafePoint) -> list[int]:
    cells = sp.store.read_rows(META_TABLE, [ROW], [Read("m", ("ts_log",))])
    return [ts for _, ts in json.loads(cells[ROW][TS_LOG][0][1])]


def test_a_retention_takes_the_newest_timestamp_logged_at_least_that_long_ago(
    cluster: percolator.Cluster,
) -> None:
    """Of the entries noted at least *retention* seconds ago, the largest timestamp
    (a pass on a host whose clock runs ahead may have noted a smaller one later); None
    while none is that old."""
    sp = _safe_point(cluster)
    assert sp.timestamp_before(0) is None, "nothing logged yet"
    now = time.time()
    _write_log(sp, [(now - 7200, 100), (now - 3000, 250), (now - 2000, 200), (now - 600, 300)])
    assert sp.timestamp_before(1800) == 250
    assert sp.timestamp_before(2500) == 250
    assert sp.timestamp_before(5000) == 100
    assert sp.timestamp_before(300) == 300
    assert sp.timestamp_before(9000) is None


def test_a_pass_with_a_retention_keeps_what_was_current_that_long_ago(
    cluster: percolator.Cluster,
) -> None:
    sp = _safe_point(cluster)
    now = time.time()
    _write_log(sp, [(now - 7200, 100), (now - 600, 300)])
    summary = cluster.gc(retention=3600)
    assert (summary.safe_point, summary.held_back_by) == (100, "retention")
    assert _logged(sp)[:2] == [100, 300] and len(_logged(sp)) == 3, "the pass noted its own"
    summary = cluster.gc(retention=7300)
    assert summary.safe_point == 100
    assert summary.held_back_by == "retention (no timestamp logged that long ago yet)"


def test_the_log_keeps_its_first_entry_and_thins_out_its_older_half(
    cluster: percolator.Cluster,
) -> None:
    """Up to TS_LOG_ENTRIES entries are kept as noted; one more and every other entry
    of the older half goes, but the very first: long retentions coarsely, recent ones
    finely, and the oldest timestamp ever noted stays."""
    sp = _safe_point(cluster)
    for ts in range(1, TS_LOG_ENTRIES + 1):
        sp.note_time(ts)
    assert _logged(sp) == list(range(1, TS_LOG_ENTRIES + 1))
    sp.note_time(TS_LOG_ENTRIES + 1)
    half = (TS_LOG_ENTRIES + 1) // 2
    assert _logged(sp) == [1, *range(3, half, 2), *range(half + 1, TS_LOG_ENTRIES + 2)]
    assert sp.timestamp_before(0) == TS_LOG_ENTRIES + 1


# --- the staircase of a client's running transactions --------------------------------

RUNNING = [(50, 10.0), (30, 20.0), (70, 30.0), (40, 25.0), (60, 28.0)]
"""``(start_ts, began)``: 50 began first, but 30 began after it and starts below it."""


def test_the_staircase_keeps_each_transaction_that_starts_below_all_begun_after_it() -> None:
    steps = staircase(RUNNING)
    assert steps == [(30, 20.0), (40, 25.0), (60, 28.0), (70, 30.0)]
    assert staircase([]) == []
    assert staircase([(70, 30.0)]) == [(70, 30.0)]
    # Begun at the same instant, the younger of two adds nothing: both increase.
    assert staircase([(5, 1.0), (3, 1.0)]) == [(3, 1.0)]
    assert staircase([(3, 1.0), (5, 1.0)]) == [(3, 1.0)]
    # Two at one start timestamp (snapshots made at a given one): the younger stands
    # for both.
    assert staircase([(3, 1.0), (3, 2.0)]) == [(3, 2.0)]


@pytest.mark.parametrize("since", [0.0, 10.0, 15.0, 20.0, 22.0, 25.0, 26.0, 28.0, 30.0, 31.0])
def test_the_oldest_since_an_age_limit_is_on_the_staircase(since: float) -> None:
    """For every age limit, the oldest of the transactions that began within it (at or
    after *since*) is found on the staircase alone."""
    within = [ts for ts, began in RUNNING if began >= since]
    assert oldest_since(staircase(RUNNING), since) == (min(within) if within else None)


def test_a_holders_steps_are_its_oldest_then_its_younger() -> None:
    holder = Holder("owner", 30, 20.0, True, ((40, 25.0), (60, 28.0)))
    assert holder.steps == ((30, 20.0), (40, 25.0), (60, 28.0))
    assert Holder("older client", 30, 20.0, None).steps == ((30, 20.0),)
