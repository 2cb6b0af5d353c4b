"""The garbage-collection safe point: below it, old versions may be gone.

Garbage collection (:mod:`percolator._gc`) keeps, for every cell, the newest version
at or below the **safe point** and removes what is older. A transaction whose start
timestamp is below the safe point could need a removed version, so it must read and
commit nothing more: it raises :class:`~percolator.SnapshotTooOldError`.

Where it lives. One cell of the meta table, ``(b"gc", "m:safe_point")``: the
timestamp and the wall time when it was persisted. It only moves forward (a
compare-and-set that refuses to go back). Every client caches it and reads it again
when its copy is older than :attr:`SafePoint.refresh` seconds (one store read per
interval per process, never one per transaction read).

What holds it back. Every client publishes the start timestamp (and start time) of
its oldest running transaction in the same row, ``m:client/<owner id>``, and in
``m:younger/<owner id>`` those of its younger transactions that start below every
transaction begun after them (:func:`staircase`), refreshed by a background thread
every ``refresh / 2`` seconds while they change. Garbage collection takes the minimum
of the start timestamps of those transactions that are younger than ``max_txn_age``
and whose owner is alive (the coordinator's liveness: a pid check on the embedded
store, the ZooKeeper session in a cluster; entries of dead owners are removed), and
of the timestamp that was current ``retention`` seconds ago (from a small log of
``(wall time, timestamp)`` pairs that each pass appends to). The younger ones are
what a pass needs when a client's oldest transaction is past its ``max_txn_age``:
whatever that age, the client's oldest transaction within it is one of them, so the
pass overtakes only the transactions older than it. ``m:client/`` keeps the format
that passes before ``m:younger/`` read (they see only the oldest), and a client
before it publishes no ``m:younger/`` (its younger transactions do not hold a pass
that overtakes its oldest).

Why a reader never returns a removed version (the race "reader checks, GC advances
and deletes, reader reads"). Correctness does not rest on the publications, which
lag: it rests on two rules.

1. **Readers check after they read.** Every store read of a transaction is followed
   by a check of its start timestamp against the cached safe point; writers check
   after their prewrite and before their commit point (the embedded store's
   one-phase commit checks inside its atomic step).
2. **GC waits a grace period.** A pass persists its safe point *P* (done at instant
   *W*), then waits ``G = 2 * refresh`` before it reads or deletes anything below
   *P*.

Say a read at start timestamp *S < P* returned a state from which the pass removed
something; the removal happened after ``W + G``, so the read ended after ``W + G``
and the check after it runs at some instant ``C > W + G``. The cached value was
fetched by a read that started at instant *F*. If ``F > W`` the fetch saw *P* (or
more) and the check raises. If ``F < W`` then ``C - F > G > refresh``: the cache is
stale at *C*, the check fetches again, sees *P* and raises. The clocks compared are
each process's monotonic clock over intervals, so hosts' wall clocks never enter.

The same argument covers writers. A transaction *X* with ``S < P`` whose prewrite
ended after ``W + G`` fails its check before its commit point, so it never commits;
one whose check came earlier had its conflict checks and reads before the pass looked
at anything, and its locks are in place when the pass reads the cells, so the pass
leaves those cells alone (see :mod:`percolator._gc`). A pass therefore removes only
versions that no transaction that can still commit or return a read will need.

Clients need not agree on :attr:`SafePoint.refresh` (``connect(safe_point_refresh=...)``).
Before its first fetch each client announces its refresh (``m:refresh/<owner id>``),
and a pass, *after* persisting *P*, reads the announcements of owners not known to be
dead and waits twice the largest (and at least twice its own). A client whose cached
value predates *W* fetched it before *W*, so it announced before *W*, and the pass's
read after *W* sees the announcement: its *G* exceeds that client's refresh, which is
all the argument above uses.
"""

from __future__ import annotations

import json
import logging
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from percolator import _forks
from percolator._encoding import META_TABLE
from percolator._errors import PercolatorError, SnapshotTooOldError
from percolator._store import Mutation, Read, Store

if TYPE_CHECKING:
    from percolator._coordination import Coordination

__all__ = ["Hold", "Holder", "Running", "SafePoint", "oldest_since", "staircase"]

log = logging.getLogger(__name__)

ROW = b"gc"
SAFE_POINT = "m:safe_point"
TS_LOG = "m:ts_log"
CLIENT_PREFIX = "m:client/"
YOUNGER_PREFIX = "m:younger/"
"""A client's younger transactions that hold the safe point back (:func:`staircase`)."""
REFRESH_PREFIX = "m:refresh/"
"""A client's :attr:`SafePoint.refresh`, announced before its first fetch."""
_REFRESH = struct.Struct(">d")
_RECORD = struct.Struct(">QQ")
"""``(timestamp, wall time in ms)``: the safe point, or a client's running transaction."""
_IDLE = b"idle"
"""A client's publication while it runs no transaction."""
TS_LOG_ENTRIES = 64


class Running(Protocol):
    """What the safe point needs of a running transaction (a Snapshot, or a Hold)."""

    start_ts: int
    _began: float
    _closed: bool


class Hold:
    """Holds the safe point at or below :attr:`start_ts` for something that is not a
    :class:`~percolator.Snapshot` but reads and writes at a start timestamp all the
    same (a bulk load's driver: its workers check for conflicts in other processes),
    until :meth:`release`."""

    __slots__ = ("__weakref__", "_began", "_closed", "start_ts")

    def __init__(self) -> None:
        self.start_ts = 0
        self._began = time.time()
        self._closed = False

    def release(self) -> None:
        self._closed = True


def staircase(running: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """Of the ``(start_ts, began)`` of running transactions, those that start below
    every transaction that began after them, oldest first (both increase). For any
    age limit, the oldest transaction that began within it is one of these:
    :func:`oldest_since` finds it."""
    steps: list[tuple[int, float]] = []
    for start_ts, began in sorted(running, key=lambda r: (-r[1], r[0])):  # youngest first
        if not steps or start_ts < steps[-1][0]:
            steps.append((start_ts, began))
    steps.reverse()
    return steps


def oldest_since(steps: Iterable[tuple[int, float]], since: float) -> int | None:
    """The smallest start timestamp of the transactions that began at or after wall
    time *since* (None: none did)."""
    return min((start_ts for start_ts, began in steps if began >= since), default=None)


@dataclass(frozen=True, slots=True)
class Holder:
    """A client's published running transactions: its oldest, and the younger ones of
    its :func:`staircase`."""

    owner: str
    start_ts: int
    """The oldest transaction's."""
    began: float
    """Wall time (seconds) when the oldest transaction began."""
    alive: bool | None
    """The coordinator's word on the owner (None: unknown, e.g. another host)."""
    younger: tuple[tuple[int, float], ...] = ()
    """``(start_ts, began)`` of the younger transactions that hold the safe point back
    once the oldest is past a pass's ``max_txn_age`` (none from older clients)."""

    @property
    def steps(self) -> tuple[tuple[int, float], ...]:
        return ((self.start_ts, self.began), *self.younger)


class SafePoint:
    """One client's view of the safe point, and its publication of its oldest running
    transaction (see the module docstring)."""

    CLOSE_WAIT = 60.0
    """Seconds :meth:`close` waits for a publication in progress (the store closes next)
    before it goes on: a store that hangs must not hang the close."""

    def __init__(self, store: Store, coordination: Coordination, *, refresh: float = 1.0) -> None:
        self.store = store
        self.coordination = coordination
        self.refresh = refresh
        """Seconds a cached safe point is trusted; a pass waits twice this."""
        self._value = 0
        self._fetched = float("-inf")
        self._reset()
        self._closed = False

    def _reset(self) -> None:
        self._generation = _forks.generation
        self._announced = False
        self._lock = threading.Lock()
        self._drawn = threading.Condition(self._lock)
        self._drawing = 0
        self._waiting = 0
        """Transactions of this process between asking for a start timestamp and
        being registered with it: :meth:`running` waits for them."""
        self._running: weakref.WeakSet[Running] = weakref.WeakSet()
        self._published: tuple[tuple[int, int], ...] | None = None
        self._stored = False
        """Whether this client ever wrote its publication (idle or not): close()
        withdraws it then, also when the last one written says idle."""
        self._publishing = threading.Lock()
        """One publication at a time: two interleaved could leave an older one stored
        while :attr:`_published` says the newer, which would then never be written."""
        self._publisher: threading.Thread | None = None
        self._stop = threading.Event()

    # --- the persisted safe point ---------------------------------------------------

    def check(self, start_ts: int, what: str = "transaction") -> None:
        """Raise :class:`SnapshotTooOldError` if *start_ts* is below the safe point
        (*what* names its reader in the message: a transaction, or a snapshot)."""
        if time.monotonic() - self._fetched > self.refresh:  # the cache is stale
            self.fetch()
        if start_ts < self._value:
            raise SnapshotTooOldError(start_ts, self._value, what)

    def fetch(self) -> int:
        """Read the persisted safe point now (one store read) and cache it."""
        if not self._announced or self._generation != _forks.generation:
            self._announce()
        started = time.monotonic()  # before the read: see the module docstring
        record = self.read_record()
        value = record[0] if record is not None else 0
        with self._lock:
            self._value = max(self._value, value)
            self._fetched = max(self._fetched, started)
        return self._value

    def _announce(self) -> None:
        if self._generation != _forks.generation:
            self._reset()  # a forked child: announces under its own owner id
        owner = self.coordination.current_owner()
        self.store.mutate_rows(META_TABLE, [
            Mutation(ROW, [(REFRESH_PREFIX + owner, 0, _REFRESH.pack(self.refresh))])])
        self._announced = True

    def grace(self) -> float:
        """How long a pass waits after persisting the safe point before it reads or
        removes anything below it: twice the largest refresh announced by a client
        not known to be dead, and at least twice this client's. Read it *after*
        persisting (see the module docstring)."""
        cells = self.store.read_rows(META_TABLE, [ROW], [Read("m")]).get(ROW, {})
        slowest = self.refresh
        for column, versions in cells.items():
            if column.startswith(REFRESH_PREFIX) and versions:
                if self.coordination.is_alive(column[len(REFRESH_PREFIX):]) is False:
                    continue
                slowest = max(slowest, _REFRESH.unpack(versions[0][1])[0])
        if slowest > self.refresh:
            log.info("a client refreshes its safe point every %.3gs: waiting %.3gs",
                     slowest, 2 * slowest)
        return 2 * slowest

    def read_record(self) -> tuple[int, int] | None:
        """The persisted ``(safe point, wall time in ms when persisted)``, or None."""
        cells = self.store.read_rows(META_TABLE, [ROW], [Read("m", ("safe_point",))])
        versions = cells.get(ROW, {}).get(SAFE_POINT)
        if not versions:
            return None
        ts, wall_ms = _RECORD.unpack(versions[0][1])
        return ts, wall_ms

    def advance(self, ts: int) -> int:
        """Persist *ts* as the safe point unless it is not above the current one;
        return the safe point now persisted."""
        for _ in range(100):
            cells = self.store.read_rows(META_TABLE, [ROW], [Read("m", ("safe_point",))])
            versions = cells.get(ROW, {}).get(SAFE_POINT)
            raw = versions[0][1] if versions else None
            old = _RECORD.unpack(raw)[0] if raw is not None else 0
            if ts <= old:
                ts = old
                break
            new = _RECORD.pack(ts, int(time.time() * 1000))
            if self.store.check_and_set(META_TABLE, ROW, SAFE_POINT, raw, new):
                break
        else:
            raise PercolatorError("could not persist the safe point: it kept changing")
        with self._lock:
            self._value = max(self._value, ts)
        return ts

    # --- the (wall time, timestamp) log -------------------------------------------------

    def _log(self) -> tuple[bytes | None, list[tuple[float, int]]]:
        cells = self.store.read_rows(META_TABLE, [ROW], [Read("m", ("ts_log",))])
        versions = cells.get(ROW, {}).get(TS_LOG)
        if not versions:
            return None, []
        return versions[0][1], [(float(w), int(t)) for w, t in json.loads(versions[0][1])]

    def note_time(self, ts: int) -> None:
        """Append ``(now, ts)`` to the log; *ts* must have been drawn before now."""
        now = time.time()
        for _ in range(10):
            raw, entries = self._log()
            entries.append((now, ts))
            entries.sort()
            while len(entries) > TS_LOG_ENTRIES:
                # Thin out the oldest half, keeping the very first: the log covers long
                # retentions coarsely and recent ones finely.
                del entries[1 : len(entries) // 2 : 2]
            new = json.dumps(entries).encode()
            if self.store.check_and_set(META_TABLE, ROW, TS_LOG, raw, new):
                return

    def timestamp_before(self, seconds_ago: float) -> int | None:
        """The newest logged timestamp noted at least *seconds_ago* ago: every
        transaction that began later has a larger start timestamp. None if none is."""
        limit = time.time() - seconds_ago
        found = None
        for wall, ts in self._log()[1]:
            if wall <= limit:
                found = ts if found is None else max(found, ts)
        return found

    # --- publication of the oldest running transaction ---------------------------------

    def begin(self, txn: Running, draw: Callable[[], int]) -> int:
        """Draw *txn*'s start timestamp with *draw* and count *txn* as running (until
        it is closed or forgotten), so that no pass of this process can take a safe
        point above a timestamp drawn but not yet registered."""
        if self._generation != _forks.generation:
            self._reset()  # a forked child: no publisher thread, maybe a held lock
        with self._lock:
            self._drawing += 1
        drawn = False
        try:
            txn.start_ts = draw()
            drawn = True
        finally:
            with self._lock:
                self._drawing -= 1
                if drawn:  # one whose draw failed has no start_ts to hold the point at
                    self._running.add(txn)
                if self._waiting and not self._drawing:
                    self._drawn.notify_all()
                if self._publisher is None and not self._closed:
                    self._start_publisher()
        return txn.start_ts

    def register(self, txn: Running) -> None:
        """Count *txn* as running until it is closed or forgotten."""
        if self._generation != _forks.generation:
            self._reset()
        with self._lock:
            self._running.add(txn)
            if self._publisher is None and not self._closed:
                self._start_publisher()

    def _start_publisher(self) -> None:
        self._publisher = threading.Thread(
            target=self._publish_loop, name="percolator-safe-point", daemon=True
        )
        self._publisher.start()

    def running(self) -> list[tuple[int, float]]:
        """The :func:`staircase` of this process's open transactions. Call it after
        drawing the timestamp it is compared with: it waits for the transactions
        drawing theirs (which may be smaller) to register."""
        with self._lock:
            while self._drawing:
                self._waiting += 1
                try:
                    self._drawn.wait()
                finally:
                    self._waiting -= 1
            live = [(t.start_ts, t._began) for t in self._running if not t._closed]
        return staircase(live)

    def publish(self) -> None:
        """Publish this client's running transactions if they changed: the oldest in
        ``m:client/`` (the format of passes that read nothing else), the rest of the
        :func:`staircase` in ``m:younger/`` (absent when there is none)."""
        with self._publishing:
            self._publish()

    def _publish(self) -> None:
        steps = tuple((ts, int(began * 1000)) for ts, began in self.running()) or None
        if steps == self._published:
            return
        owner = self.coordination.current_owner()
        oldest = _IDLE if steps is None else _RECORD.pack(*steps[0])
        younger = b"".join(_RECORD.pack(*step) for step in steps[1:]) if steps else b""
        column = YOUNGER_PREFIX + owner
        self.store.mutate_rows(META_TABLE, [Mutation(  # one row: a pass reads both of a moment
            ROW, [(CLIENT_PREFIX + owner, 0, oldest)] + ([(column, 0, younger)] if younger else []),
            deletes=[] if younger else [(column, 0)])])
        self._published, self._stored = steps, True

    def _publish_loop(self) -> None:
        stop = self._stop
        while not stop.wait(self.refresh / 2):
            try:
                self.publish()
            except Exception:  # the next round tries again; a pass only sees it later
                log.debug("could not publish the running transactions", exc_info=True)

    def holders(self, *, prune: bool = False) -> list[Holder]:
        """Every client's published running transactions (idle ones left out); with
        *prune*, the entries of owners known to be dead are removed."""
        cells = self.store.read_rows(META_TABLE, [ROW], [Read("m")]).get(ROW, {})
        dead = []
        oldest: dict[str, tuple[int, float, bool | None]] = {}
        younger: dict[str, tuple[tuple[int, float], ...]] = {}
        for column, versions in cells.items():
            prefix = next((p for p in (CLIENT_PREFIX, YOUNGER_PREFIX, REFRESH_PREFIX)
                           if column.startswith(p)), None)
            if prefix is None or not versions or (prefix == REFRESH_PREFIX and not prune):
                continue
            owner = column[len(prefix):]
            alive = self.coordination.is_alive(owner)
            if alive is False:
                dead.append(column)
                continue
            raw = versions[0][1]
            if prefix == YOUNGER_PREFIX:
                younger[owner] = tuple((ts, ms / 1000) for ts, ms in _RECORD.iter_unpack(raw))
            elif prefix == CLIENT_PREFIX and raw != _IDLE:
                ts, wall_ms = _RECORD.unpack(raw)
                oldest[owner] = ts, wall_ms / 1000, alive
        found = [Holder(owner, ts, began, alive, younger.get(owner, ()))
                 for owner, (ts, began, alive) in oldest.items()]
        if prune and dead:
            self.store.mutate_rows(
                META_TABLE, [Mutation(ROW, deletes=[(column, 0) for column in dead])]
            )
        return sorted(found, key=lambda h: h.start_ts)

    def close(self) -> None:
        """Stop publishing and withdraw this client's publication (best effort)."""
        self._closed = True
        self._stop.set()
        publisher = self._publisher
        if publisher is not None and publisher is not threading.current_thread():
            # The store closes next, and an SQLite connection closed under a write in
            # progress on another thread crashes the process (seen in a suite run).
            publisher.join(timeout=self.CLOSE_WAIT)
        withdrawn = [prefix for prefix, done in ((CLIENT_PREFIX, self._stored),
                                                 (YOUNGER_PREFIX, self._stored),
                                                 (REFRESH_PREFIX, self._announced)) if done]
        if withdrawn:
            try:
                owner = self.coordination.current_owner()
                self.store.mutate_rows(META_TABLE, [
                    Mutation(ROW, deletes=[(prefix + owner, 0) for prefix in withdrawn])])
            except Exception:  # its owner's death removes it anyway
                log.debug("could not withdraw the safe point publication", exc_info=True)
