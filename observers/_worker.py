"""Workers: scanner threads that find dirty cells in the notify family and run
their observers (Percolator §2.4; DESIGN.md §7).

Each scanner thread starts at a random row of a random observed table (drawn from
a sample of dirty rows seen so far), scans the notify family to the end and wraps
around. On a store with a notification index (Bigtable, where a family-filtered
scan reads the whole table: :mod:`percolator._notify_index`) it scans the index
instead, from a random place, and deletes the entries it finds settled. Before
working on a row it takes an advisory lock; when another scanner holds it, the
scanner jumps to a new random place (the paper's anti-clumping).

Idle workers leave the store alone: a scanner whose pass found nothing to do sleeps
``idle_max`` seconds (default 2, jittered). While one sleeps, a single lookout thread
per worker reads what is pending every ``poll_interval`` seconds (the index, or the
notify family of the observed tables: O(pending), nothing when all is done) and wakes
the scanners when it sees a notification its previous look did not; a commit in the
same process that makes a notification wakes them at once.

For each dirty cell the worker runs, per observer of the column, a transaction
that reads the column and the observer's acknowledgement ``_ack:<name>@<column>``
(the commit timestamp of the last change processed). It calls ``process`` only if
the column changed after that (or the notification is weak), writes the new
acknowledgement and commits: two runs for one change write the same
acknowledgement cell, so snapshot isolation lets at most one of them commit. The
notify versions at or below the newest one seen are deleted afterwards, so a
notification written meanwhile survives.

A failing observer is retried with exponential backoff (per worker process); after
``max_failures`` failures, counted in the store across all workers, the notification
is quarantined (see
:mod:`percolator._notifications`): ``percolator status`` shows it and
``percolator retry`` puts it back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from observers._observer import Observer, ObserverTransaction, check_observer
from observers._periodic import Periodic
from percolator._cluster import Cluster
from percolator._commit import commit_group, commit_transaction, one_phase_steps
from percolator._encoding import NOTIFY
from percolator._errors import (
    CommitUnknownError,
    CoordinationError,
    InvalidArgument,
    ObserverError,
    OracleUnavailable,
    PercolatorError,
    StoreUnavailable,
    is_retryable,
)
from percolator._internals import internals
from percolator._notifications import (
    NOTIFY_WEAK,
    Quarantined,
    ack_column,
    clear_failures,
    format_row,
    quarantine,
    record_failure,
    wait_until_idle,
)
from percolator._notify_index import migrate, scan_index, settle, uses_index
from percolator._store import Mutation, Read, RowCells
from percolator.metrics import inc as _inc
from percolator.metrics import observe as _observe

__all__ = ["CommitHook", "Worker", "wait_for_observers"]

log = logging.getLogger("observers")

CommitHook = Callable[[Observer, str, bytes, str, int, int], None]
"""``on_commit(observer, table, row, column, change_ts, commit_ts)``."""

_SAMPLE = 4096
GROUP_MAX = 32
"""Observer transactions a scanner thread commits together on the embedded store
(one SQLite write transaction for up to this many; see ``commit_group``)."""
SPLITS_REFRESH = 60.0
"""Seconds between two questions to the store for a table's split keys."""


@dataclass(slots=True)
class _Failures:
    count: int
    next_try: float


class _Outcome:
    DEFERRED = "deferred"  # left in a group, committed by _flush
    COMMITTED = "committed"
    SKIPPED = "skipped"  # its metrics label is "acked_already"
    CONFLICT = "conflict"
    TRANSIENT = "transient"
    FAILED = "failed"


def wait_for_observers(cluster: Cluster, timeout: float | None = 60.0) -> None:
    """Return when no notification is pending and no lock is held in any table of
    *cluster* (the observers have caught up), checking twice in a row. On a store
    with a notification index (Bigtable) each check costs O(pending notifications):
    it reads the index, and the locks it waits for are those of indexed cells (a
    committer writes its index entries before its commit point, so no other lock can
    still produce a notification).

    Quarantined notifications are not pending. *timeout* is in seconds (None: wait
    forever).

    .. warning:: blocks; notifications of columns that no running worker observes
       keep it waiting until the timeout.
    :raises WaitTimeout: after *timeout* seconds; the message lists what is still
        pending (``.pending``, ``.locks``).
    """
    wait_until_idle(cluster, timeout)



class _Waits:
    """How long an observer's code waits per run (wall time beyond its thread's CPU
    time), measured on runs that keep the store turn (where no other scanner competes
    for the GIL): its runs let go of the turn once that is :attr:`WAITING` seconds on
    average, and every :attr:`PROBE`-th run keeps it, to measure again."""

    WAITING = 0.0005
    PROBE = 32

    def __init__(self) -> None:
        self.mean = 0.0
        self.runs = 0

    def release(self) -> bool:
        """Whether the next run should let go of the turn (called holding it)."""
        self.runs += 1
        return self.mean >= self.WAITING and self.runs % self.PROBE != 0

    def measured(self, wall: float, cpu: float) -> None:
        """A run that kept the turn took *wall* seconds, *cpu* of them on its thread."""
        self.mean += 0.25 * (max(wall - cpu, 0.0) - self.mean)


class _StoreTurn:
    """On a single-writer store, the scanners of one process take turns at the store
    work: store work of several threads at once only hands the GIL back and forth at
    every SQLite call and lock (4 threads drained at 0.42x the rate of 1). A scanner
    lets go of the turn while the code of an observer that waits (on I/O, say) runs
    (:class:`_Waits`); one that keeps it through observer code that then takes longer
    than :attr:`LEND_AFTER` (a slow call, a hang) loses it to a waiting scanner, so a
    slow run never stalls the others. Only an order, for speed: a scanner that does
    store work without the turn (stopping) is still correct."""

    LEND_AFTER = 0.01

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holder: int | None = None
        self._watcher: int | None = None
        self._in_observer_since: float | None = None

    def take(self, stop: threading.Event) -> bool:
        """Wait for the turn; False (without it) once *stop* is set. One waiter at a
        time looks every LEND_AFTER whether the holder's observer code is slow; the
        others sleep until woken (or a second, to see *stop*)."""
        me = threading.get_ident()
        with self._cond:
            while self._holder is not None and self._holder != me:
                since = self._in_observer_since
                if since is not None and time.monotonic() - since >= self.LEND_AFTER:
                    break  # the holder is in slow observer code: it lends the turn
                if stop.is_set():
                    if self._watcher == me:
                        self._watcher = None
                    return False
                if self._watcher is None:
                    self._watcher = me
                if self._watcher == me:
                    self._cond.wait(self.LEND_AFTER)
                else:
                    self._cond.wait(1.0)
            if self._watcher == me:
                self._watcher = None
                self._cond.notify()  # another waiter becomes the watcher
            self._holder, self._in_observer_since = me, None
            return True

    def give(self) -> None:
        with self._cond:
            if self._holder == threading.get_ident():
                self._holder = self._in_observer_since = None
                self._cond.notify()

    @contextlib.contextmanager
    def observer_code(self, waits: _Waits, stop: threading.Event) -> Iterator[None]:
        """Around an observer's own code: let go of the turn if the observer waits,
        else keep it (lending it if the code turns out slow), and measure."""
        if waits.release():
            self.give()
            try:
                yield
            finally:
                self.take(stop)
            return
        with self._cond:
            self._in_observer_since = time.monotonic()
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            waits.measured(time.perf_counter() - began, time.thread_time() - cpu)
            with self._cond:
                kept = self._holder == threading.get_ident()
                if kept:
                    self._in_observer_since = None
            if not kept:
                self.take(stop)


class _Spread:
    """The anti-clumping state of one scan pass (Percolator §2.4): a scanner that meets
    another on a row skips a random stretch ahead; after a few meetings it ends the
    pass, so that the next one starts at a new random place."""

    def __init__(self, threads: int, held: int = 1) -> None:
        self.threads = threads
        self.held = held  # rows another scanner may hold at once (a group: GROUP_MAX)
        self.skip = 0
        self.meetings = 0

    def skipping(self) -> bool:
        """Whether to pass this row by (inside a stretch being skipped)."""
        if self.skip:
            self.skip -= 1
            return True
        return False

    def met(self) -> bool:
        """Another scanner holds the row: True when the pass should end."""
        self.meetings += 1
        if self.meetings >= 4:
            return True
        self.skip = random.randint(self.held, self.held + 16 * self.threads)
        return False

class Worker:
    """Runs *observers* on *cluster* with *threads* scanner threads. Left out, it
    picks what measured fastest for an observer that only uses the store: 1 on the
    embedded store, and 4 on remote stores, whose round trips threads overlap. On the
    embedded store the scanners of a process take turns at the store work (its runs
    hold the GIL for about three quarters of their time, and the rest comes in pieces
    shorter than a GIL hand-off), so more threads neither help nor hurt an observer
    that only uses the store, and help one that waits on something else, whose runs
    let the other scanners work meanwhile (bench/scaling.py: 4 threads drain at about
    0.9x the rate of 1 with the first kind, 3x with an observer that waits 1 ms).
    More worker processes use more cores.

    *observers* are :class:`Observer` subclasses (instantiated with no arguments)
    or instances. At :meth:`start` the worker creates their tables if needed and
    registers their columns as observed, so that commits to them set notify cells.

    *max_failures* bounds how often a failing notification is tried, counted across
    every worker of the cluster (in the store), before it is quarantined; this worker
    waits *retry_delay* seconds after its first failure of it and twice as long after
    each next one (at most *max_retry_delay*).
    *idle_max* is how long a scanner that found nothing to do sleeps unless woken; the
    lookout looks for new work every *poll_interval* seconds meanwhile. *on_commit*,
    if given, is called after each committed observer transaction with
    ``(observer, table, row, column, change_ts, commit_ts)`` (from the scanner
    thread; keep it quick). *tasks* are :class:`Periodic` tasks that run while the
    worker runs (``python -m observers`` adds garbage collection).

    :attr:`stats` counts ``committed`` runs, ``skipped`` notifications (already
    acknowledged: duplicate work the acks rejected), ``conflicts``, ``failures``,
    ``quarantined``, ``meetings`` (a scanner found another on its row and jumped),
    ``passes``, ``idle`` passes and lookout ``wakeups``.

    Any number of workers, in any processes and hosts, may run the same observers on
    one repository: they spread over the pending rows, and at most one observer
    transaction commits per change however they race or crash. One worker object is
    started and stopped from one thread; its scanners are its own threads.

    ::

        from observers.demo import Clusterer, DocumentProcessor   # the demo's observers

        worker = Worker(cluster, [DocumentProcessor, Clusterer], threads=4)
        worker.run()          # blocks; SIGTERM or SIGINT stops it cleanly

        with Worker(cluster, [DocumentProcessor]):   # or in the background
            ...
            wait_for_observers(cluster)

    :raises InvalidArgument: for no observers, an observer whose table or column is
        missing or bad, two observers of one name, or a bad number (threads,
        max_failures, or a negative number of seconds).
    """

    def __init__(
        self,
        cluster: Cluster,
        observers: Iterable[Observer | type[Observer]],
        *,
        threads: int | None = None,
        max_failures: int = 5,
        retry_delay: float = 0.5,
        max_retry_delay: float = 60.0,
        idle_max: float = 2.0,
        poll_interval: float = 0.05,
        on_commit: CommitHook | None = None,
        tasks: Iterable[Periodic] = (),
    ) -> None:
        if not isinstance(cluster, Cluster):
            raise InvalidArgument(f"Worker needs a percolator.Cluster, got {cluster!r:.80}")
        if threads is None:
            threads = 1 if getattr(internals(cluster).store, "single_writer", False) else 4
        if not isinstance(threads, int) or threads < 1:
            raise InvalidArgument(f"threads must be an int >= 1 or None, got {threads!r}")
        if not isinstance(max_failures, int) or max_failures < 1:
            raise InvalidArgument(f"max_failures must be an int >= 1, got {max_failures!r}")
        for arg, value in (("retry_delay", retry_delay), ("max_retry_delay", max_retry_delay),
                           ("idle_max", idle_max), ("poll_interval", poll_interval)):
            if not isinstance(value, int | float) or value < 0:
                raise InvalidArgument(f"{arg} must be a number of seconds >= 0, got {value!r}")
        self.cluster = cluster
        self.observers: list[Observer] = []
        for item in observers:
            if isinstance(item, type) and issubclass(item, Observer):
                item.check()
                self.observers.append(item())
            elif isinstance(item, Observer):
                check_observer(item)
                self.observers.append(item)
            else:
                raise InvalidArgument(
                    f"observers must be Observer subclasses or instances, got {item!r:.80}"
                )
        if not self.observers:
            raise InvalidArgument("a Worker needs at least one observer")
        names = [o.name for o in self.observers]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"observer names must be unique, got {sorted(names)}")
        self._by_column: dict[tuple[str, str], list[Observer]] = {}
        for o in self.observers:
            self._by_column.setdefault((o.table, o.column), []).append(o)
        self._columns: dict[str, tuple[str, ...]] = {}
        for table, column in self._by_column:
            self._columns[table] = (*self._columns.get(table, ()), column)
        self.threads = threads
        self._store_turn = (_StoreTurn() if threads > 1 and getattr(
            internals(cluster).store, "single_writer", False) else None)
        self._waits = {o.name: _Waits() for o in self.observers}
        self.max_failures = max_failures
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.idle_max = idle_max
        self.poll_interval = poll_interval
        self.on_commit = on_commit
        self.stats: Counter[str] = Counter()
        self._stats_lock = threading.Lock()
        self._failures: dict[tuple[str, bytes, str], _Failures] = {}
        self._failures_lock = threading.Lock()
        self._sample: dict[str, list[bytes]] = {t: [] for t in self._columns}
        self._splits: dict[str, tuple[float, list[bytes]]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.tasks = list(tasks)
        for task in self.tasks:
            if not isinstance(task, Periodic):
                raise InvalidArgument(f"tasks must be observers.Periodic, got {task!r:.80}")
        self._bell = _Bell()
        self._sleeping = 0
        self._indexed = uses_index(internals(cluster).store)

    # --- life cycle -----------------------------------------------------------------

    def register(self) -> None:
        """Create the observed tables if missing and register the observed columns."""
        for table, column in self._by_column:
            self.cluster.create_table(table)
            self.cluster.observe(table, column)
        for table in self._columns:
            found = migrate(self.cluster, table)
            if found:
                log.info("indexed %d pending notification(s) of %s", found, table)

    def start(self) -> None:
        """Register the observers and start the scanner threads; returns at once."""
        self._stop.clear()
        self._start()

    def _start(self) -> None:
        # Leaves the stop event alone: run() may be asked to stop while registering.
        if self._threads:
            raise InvalidArgument("this worker is already started")
        self.register()
        internals(self.cluster).wakeups.append(self._bell.set)
        for i in range(self.threads):
            thread = threading.Thread(target=self._scanner, name=f"observers-scanner-{i}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        for task in self.tasks:
            task.start()
        lookout = threading.Thread(target=self._lookout, name="observers-lookout", daemon=True)
        lookout.start()
        self._threads.append(lookout)
        log.info("worker started: %d scanner thread(s), observers %s", self.threads,
                 ", ".join(f"{o.name} ({o.table}/{o.column})" for o in self.observers))

    def stop(self, timeout: float | None = None) -> None:
        """Ask the scanners to stop after their current transaction and wait for them
        (at most *timeout* seconds each)."""
        self._stop.set()
        self._bell.set()
        for task in self.tasks:
            task.stop(timeout)
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []
        if self._bell.set in internals(self.cluster).wakeups:
            internals(self.cluster).wakeups.remove(self._bell.set)
        log.info("worker stopped: %s", dict(self.stats))

    def run(self) -> None:
        """:meth:`start`, then block until SIGTERM or SIGINT (when called from the main
        thread) or :meth:`stop` from another thread, then stop cleanly: each scanner
        finishes its current observer transaction. A second signal exits the process
        at once (status 128 + the signal), for an observer that hangs: its transaction
        is abandoned as a crashed client's would be, and its notification stays.

        .. warning:: blocks.
        """
        previous: dict[int, Any] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if self._stop.is_set():
                log.warning("signal %d again: exiting without waiting for the scanners",
                            signum)
                os._exit(128 + signum)
            log.info("signal %d: stopping (send it again to exit at once)", signum)
            self._stop.set()

        self._stop.clear()  # before the handlers: a signal from now on is kept
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[int(sig)] = signal.signal(sig, on_signal)
        try:
            self._start()
            while not self._stop.wait(0.5):
                pass
        finally:
            self.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] += n

    # --- scanning -------------------------------------------------------------------

    def _remember(self, table: str, row: bytes) -> None:
        sample = self._sample[table]
        if len(sample) < _SAMPLE:
            sample.append(row)
        else:
            sample[random.randrange(_SAMPLE)] = row

    def _random_start(self, table: str) -> bytes | None:
        """Where a pass over *table* begins: half the time (always, before any row is
        seen) a random tablet or region boundary where the store tells them (Percolator
        §2.4: scanners start at random tablets), else a random row seen before."""
        splits = self._split_keys(table)
        sample = self._sample[table]
        if splits and (not sample or random.random() < 0.5):
            self._count("split_starts")
            return random.choice(splits)
        try:
            return random.choice(sample) if sample else None
        except IndexError:
            return None

    def _split_keys(self, table: str) -> list[bytes]:
        """The store's split keys of *table* (``split_keys``: Bigtable's SampleRowKeys,
        HBase's region start keys), asked again at most every SPLITS_REFRESH seconds."""
        split_keys = getattr(internals(self.cluster).store, "split_keys", None)
        if split_keys is None:
            return []
        asked, keys = self._splits.get(table, (None, []))
        now = time.monotonic()
        if asked is None or now - asked > SPLITS_REFRESH:
            self._splits[table] = (now, keys)  # one asker at a time, the others go on
            try:
                keys = list(split_keys(table))
            except PercolatorError as e:
                log.debug("split keys of %s unknown (%s)", table, e)
            self._splits[table] = (now, keys)
        return keys

    def _scanner(self) -> None:
        while not self._stop.is_set():
            rung = self._bell.rung
            try:
                began = time.perf_counter()
                turn = self._store_turn
                if turn is not None and not turn.take(self._stop):
                    break  # stopping
                try:
                    worked = self._scan_pass()
                finally:
                    if turn is not None:
                        turn.give()
                _observe("percolator_notification_scan_duration_seconds",
                         time.perf_counter() - began)
            except PercolatorError:
                log.warning("scan failed; backing off", exc_info=True)
                worked = False
            except Exception:
                log.exception("scanner error; backing off")
                worked = False
            self._count("passes")
            if worked:
                continue
            # Nothing to do: sleep long (the lookout or a local commit rings when work
            # arrives), but be back when a failed notification may be tried again.
            self._count("idle")
            wait = random.uniform(self.idle_max / 2, self.idle_max)
            if self._failures:
                with self._failures_lock:
                    due = min((f.next_try for f in self._failures.values()), default=None)
                if due is not None:
                    wait = min(wait, max(due - time.monotonic(), 0.0) + 0.001)
            with self._stats_lock:
                self._sleeping += 1
            try:
                self._bell.wait(rung, wait)
            finally:
                with self._stats_lock:
                    self._sleeping -= 1

    def _lookout(self) -> None:
        """Every ``poll_interval`` seconds while a scanner sleeps, read what is pending
        (O(pending notifications)) and wake the scanners if it holds a notification the
        previous look did not: new work. Busy scanners need no lookout."""
        seen: frozenset[tuple[str, bytes, str, int]] = frozenset()
        while not self._stop.wait(self.poll_interval):
            if not self._sleeping:
                seen = frozenset()  # look afresh once they sleep again
                continue
            try:
                found = frozenset(self._pending())
            except PercolatorError:
                log.debug("lookout failed", exc_info=True)
                continue
            if found - seen:
                self._count("wakeups")
                self._bell.set()
            seen = found

    def _pending(self) -> Iterator[tuple[str, bytes, str, int]]:
        """``(table, row, column, newest notify or index timestamp)`` of the pending
        notifications of the observed columns."""
        if self._indexed:
            for table, row, entries in scan_index(self.cluster, None, None, batch_size=1000):
                observed = self._columns.get(table, ())
                for column, ts in entries.items():
                    if column in observed:
                        yield table, row, column, ts
            return
        for table, columns in self._columns.items():
            for row, cells in internals(self.cluster).store.scan(table, None, None,
                                                      [Read(NOTIFY, columns)], batch_size=1000):
                for name, versions in cells.items():
                    yield table, row, name[len(NOTIFY) + 1 :], versions[0][0]

    def _scan_pass(self) -> bool:
        if self._indexed:
            return self._index_pass()
        return self._family_pass()

    def _index_pass(self) -> bool:
        """One pass over the notification index from a random place, wrapping around
        (anti-clumping as in :meth:`_family_pass`)."""
        start = b"%02x" % random.randrange(256)
        worked = False
        spread = _Spread(self.threads)
        for lo, hi in ((start, None), (None, start)):
            for table, row, entries in scan_index(self.cluster, lo, hi):
                if self._stop.is_set():
                    return worked
                observed = self._columns.get(table, ())
                mine = {c: ts for c, ts in entries.items() if c in observed}
                if not mine or spread.skipping():
                    continue
                key = f"{table}/{row.hex()}"
                if not internals(self.cluster).coordination.try_advisory_lock(key):
                    if self._met(spread):
                        return True
                    continue
                try:
                    done = not self._backing_off_columns(table, row, mine) and (
                        self._process_row(table, row))
                    worked = worked or done
                    settle(self.cluster, table, row, mine, look_first=not done)
                finally:
                    internals(self.cluster).coordination.release_advisory_lock(key)
        return worked

    def _family_pass(self) -> bool:
        """One pass over the observed tables in random order, each from a random row,
        wrapping around; it ends with the first table where it did work. Returns
        whether it did any. (A pass over one random table only, then sleep, left work
        in the other tables to the next wake-up: when observers watch several tables,
        as a pipeline's stages do, a woken scanner often looked in the wrong one.)"""
        tables = list(self._columns)
        random.shuffle(tables)
        return any(self._table_pass(table) for table in tables)

    def _table_pass(self, table: str) -> bool:
        """One pass over *table* from a random row, wrapping around. A scanner that
        finds another on its row skips a random stretch ahead; after a few such
        meetings in one pass it jumps to a new random place (a new pass), so scanners
        spread out instead of clumping."""
        group = _Group() if self._commits_in_groups() else None
        try:
            return self._table_pass_rows(table, group)
        finally:
            if group is not None:
                self._flush(group)

    def _table_pass_rows(self, table: str, group: _Group | None) -> bool:
        reads = [Read(NOTIFY, self._columns[table], versions=None)]
        start = self._random_start(table)
        ranges = [(start, None), (None, start)] if start is not None else [(None, None)]
        worked = False
        spread = _Spread(self.threads, GROUP_MAX if group is not None else 1)
        coordination = internals(self.cluster).coordination
        for lo, hi in ranges:
            store = internals(self.cluster).store
            for row, cells in store.scan(table, lo, hi, reads, batch_size=128):
                if self._stop.is_set():
                    return worked
                self._remember(table, row)
                if spread.skipping() or self._backing_off(table, row, cells):
                    continue
                key = f"{table}/{row.hex()}"
                if not coordination.try_advisory_lock(key):
                    if self._met(spread):
                        return True  # a new pass starts at a new random place
                    continue
                deferred = False
                waiting = len(group.runs) if group is not None else 0
                try:
                    if self._process_row(table, row, group):
                        worked = True
                    deferred = group is not None and len(group.runs) > waiting
                finally:
                    if deferred:  # held until the group is committed
                        assert group is not None
                        group.keys.append(key)
                    else:
                        coordination.release_advisory_lock(key)
                if group is not None and len(group.runs) >= GROUP_MAX:
                    self._flush(group)
        return worked

    def _commits_in_groups(self) -> bool:
        """Whether observer commits can share a store write (the embedded store's
        one-phase commits)."""
        return GROUP_MAX > 1 and one_phase_steps(self.cluster) is not None

    def _flush(self, group: _Group) -> None:
        """Commit the group's observer transactions together (``commit_group``: one
        SQLite write transaction), then account for each as a single run would, and
        let go of the rows' advisory locks."""
        runs, keys = group.runs, group.keys
        group.runs, group.keys = [], []
        try:
            if not runs:
                return
            outcomes = commit_group([run.txn for run in runs])
            for run, outcome in zip(runs, outcomes, strict=True):
                self._account(run, outcome)
        finally:
            for key in keys:
                internals(self.cluster).coordination.release_advisory_lock(key)

    def _account(self, run: _Run, outcome: int | PercolatorError) -> None:
        name = run.observer.name
        if isinstance(outcome, PercolatorError):
            # The notification stays: a later pass runs the observer again.
            if is_retryable(outcome):
                self._count("conflicts")
                _inc("percolator_observer_runs_total", name, _Outcome.CONFLICT)
            else:
                log.warning("%s on %s/%s/%s: %s; will retry", name, run.table,
                            format_row(run.row), run.column, outcome)
                _inc("percolator_observer_runs_total", name, _Outcome.TRANSIENT)
            return
        self._count(_Outcome.COMMITTED)
        _inc("percolator_observer_runs_total", name, _Outcome.COMMITTED)
        if not run.txn._settled:  # committed in two phases: the worker deletes it
            assert run.txn._settles is not None
            self._delete_notification(run.table, run.row, run.column, run.txn._settles[3])
        self._committed(run.observer, run.table, run.row, run.column, run.change, outcome)

    def _delete_notification(self, table: str, row: bytes, column: str, newest: int) -> None:
        """Delete the notify versions of the cell at or below *newest*, the newest one
        the runs just made served (a later notification stays)."""
        internals(self.cluster).store.mutate_rows(
            table, [Mutation(row, deletes=[(f"{NOTIFY}:{column}", newest)])])

    def _committed(self, observer: Observer, table: str, row: bytes, column: str,
                   change: int, commit_ts: int) -> None:
        """Tell the ``on_commit`` hook, if any, of a committed run."""
        if self.on_commit is not None:
            try:
                self.on_commit(observer, table, row, column, change, commit_ts)
            except Exception:
                log.exception("on_commit hook failed")

    def _met(self, spread: _Spread) -> bool:
        """Another scanner holds the row: count the meeting; True when the pass should
        end (a jump)."""
        self._count("meetings")
        if spread.met():
            self._count("jumps")
            return True
        return False

    def _backing_off(self, table: str, row: bytes, cells: RowCells) -> bool:
        return self._backing_off_columns(table, row, [n[len(NOTIFY) + 1 :] for n in cells])

    def _backing_off_columns(self, table: str, row: bytes, columns: Iterable[str]) -> bool:
        if not self._failures:
            return False
        now = time.monotonic()
        with self._failures_lock:
            for column in columns:
                failure = self._failures.get((table, row, column))
                if failure is None or failure.next_try <= now:
                    return False
        return True

    # --- processing -----------------------------------------------------------------

    def _process_row(self, table: str, row: bytes, group: _Group | None = None) -> bool:
        """Run the observers of every dirty cell of *row*; True if anything was done.
        With *group*, a run whose commit can delete its notification is left in the
        group, to be committed with others (:meth:`_flush`)."""
        cells = internals(self.cluster).store.read_rows(
            table, [row], [Read(NOTIFY, self._columns[table], versions=None)]
        ).get(row, {})
        worked = False
        for name, versions in cells.items():
            column = name[len(NOTIFY) + 1 :]
            if not versions:
                continue
            newest = versions[0][0]
            weak = any(value == NOTIFY_WEAK for _, value in versions)
            key = (table, row, column)
            if self._failures:
                with self._failures_lock:
                    failure = self._failures.get(key)
                if failure is not None and failure.next_try > time.monotonic():
                    continue
            done = True
            settled = False
            observers = self._by_column[(table, column)]
            # One observer and no failure to clear: its commit may delete the
            # notification itself (one-phase commits do, in their atomic step).
            settle = newest if len(observers) == 1 and not self._failures else None
            for observer in observers:
                began = time.perf_counter()
                outcome, error, settled = self._run_observer(
                    observer, table, row, column, weak, newest, settle,
                    group if settle is not None else None)
                _observe("percolator_observer_run_duration_seconds",
                         time.perf_counter() - began, observer.name)
                worked = True
                if outcome == _Outcome.DEFERRED:  # the caller holds the row for the group
                    continue
                _inc("percolator_observer_runs_total", observer.name,
                     "acked_already" if outcome == _Outcome.SKIPPED else outcome)
                if outcome == _Outcome.FAILED:
                    done = False
                    assert error is not None
                    self._failed(observer, table, row, column, weak, newest, error)
                    break
                if outcome != _Outcome.COMMITTED and outcome != _Outcome.SKIPPED:
                    done = False
            if done and not settled:
                if self._failures:
                    with self._failures_lock:
                        failed_here = self._failures.pop(key, None)
                    if failed_here is not None:
                        clear_failures(self.cluster, table, row, column)
                self._delete_notification(table, row, column, newest)
        return worked

    def _run_observer(
        self, observer: Observer, table: str, row: bytes, column: str, weak: bool,
        newest: int, settle: int | None = None, group: _Group | None = None,
    ) -> tuple[str, BaseException | None, bool]:
        """Run one observer transaction, retrying conflicts a few times, for the
        notification versions up to *newest* (the newest one read). With *settle*
        (the newest notification version read), its commit may delete the
        notification; the third value tells whether it did (or, for a run left in
        *group*, that the group's commit will see to it)."""
        for attempt in range(4):
            if attempt:
                time.sleep(random.uniform(0, 0.005 * 2**attempt))
            try:
                outcome, settled = self._transaction(observer, table, row, column, weak,
                                                     newest, settle, group)
            except ObserverError as e:
                return _Outcome.FAILED, e.__cause__ or e, False
            except CommitUnknownError:
                log.warning("commit outcome of %s on %s/%s/%s unknown; will look again",
                            observer.name, table, format_row(row), column)
                return _Outcome.TRANSIENT, None, False
            except (StoreUnavailable, OracleUnavailable, CoordinationError) as e:
                # Not the observer's fault: keep the notification, count no failure
                # towards quarantine, and let the scanner back off.
                log.warning("%s on %s/%s/%s: %s; will retry", observer.name, table,
                            format_row(row), column, e)
                time.sleep(0.1)
                return _Outcome.TRANSIENT, None, False
            except PercolatorError as e:
                if self._stop.is_set():  # a lock wait cut short: the next pass retries
                    return _Outcome.TRANSIENT, None, False
                if not is_retryable(e):
                    return _Outcome.FAILED, e, False
                self._count("conflicts")
                continue
            if outcome != _Outcome.DEFERRED:
                self._count(outcome)
            return outcome, None, settled
        return _Outcome.CONFLICT, None, False

    def _transaction(
        self, observer: Observer, table: str, row: bytes, column: str, weak: bool,
        newest: int, settle: int | None, group: _Group | None = None,
    ) -> tuple[str, bool]:
        txn = ObserverTransaction(self.cluster)
        if txn.start_ts < newest:
            # The notification was read raw, from a commit newer than this snapshot:
            # the run could not see the change it is for, and would skip it and
            # delete its notification. Every timestamp source draws above what was
            # read before the draw (docs/timestamps.md); should one not, the
            # notification stays for a later pass rather than being lost.
            txn.close()
            log.error("%s on %s/%s/%s: snapshot %d is below the notification %d; "
                      "leaving it for a later pass", observer.name, table, format_row(row),
                      column, txn.start_ts, newest)
            return _Outcome.TRANSIENT, False
        try:
            return self._observe(txn, observer, table, row, column, weak, settle, group)
        except BaseException:
            # Its error travels on (to the log, whose handlers may keep the record and
            # so the traceback's frames): the run must not hold the safe point meanwhile.
            txn.close()
            raise

    def _observe(
        self, txn: ObserverTransaction, observer: Observer, table: str, row: bytes,
        column: str, weak: bool, settle: int | None, group: _Group | None,
    ) -> tuple[str, bool]:
        txn._stop_waiting = self._stop
        ack = ack_column(observer.name, column)
        txn._internal_columns = True
        values = txn.get_row(table, row, [column, ack])
        change = txn.change_version(table, row, column)
        acked = int(values.get(ack, b"0"))
        if change <= acked and not weak:
            txn._closed = True
            return _Outcome.SKIPPED, False
        txn._internal_columns = False
        turn = self._store_turn
        try:
            with (turn.observer_code(self._waits[observer.name], self._stop)
                  if turn is not None else contextlib.nullcontext()):
                observer.process(txn, row, column)
        except PercolatorError as e:
            if is_retryable(e):
                raise
            raise ObserverError(
                f"observer {observer.name} failed on {table}/{format_row(row)}/{column}: {e}"
            ) from e
        except Exception as e:
            raise ObserverError(
                f"observer {observer.name} failed on {table}/{format_row(row)}/{column}: "
                f"{type(e).__name__}: {e}"
            ) from e
        txn._internal_columns = True
        txn.set(table, row, ack, str(max(change, acked)).encode())
        if settle is not None:
            txn._settles = (table, row, f"{NOTIFY}:{column}", settle)
            if group is not None:
                group.runs.append(_Run(txn, observer, table, row, column, change))
                return _Outcome.DEFERRED, True
        commit_ts = commit_transaction(txn)
        self._committed(observer, table, row, column, change, commit_ts)
        return _Outcome.COMMITTED, txn._settled

    def _failed(
        self, observer: Observer, table: str, row: bytes, column: str, weak: bool,
        newest: int, error: BaseException,
    ) -> None:
        self._count("failures")
        key = (table, row, column)
        count = record_failure(self.cluster, table, row, column, newest)  # cluster-wide
        with self._failures_lock:
            failure = self._failures.get(key) or _Failures(0, 0.0)
            failure.count += 1  # this process's back-off
            delay = min(self.retry_delay * 2 ** (failure.count - 1), self.max_retry_delay)
            failure.next_try = time.monotonic() + delay * random.uniform(0.8, 1.2)
            self._failures[key] = failure
        where = f"{table}/{format_row(row)}/{column}"
        if count < self.max_failures:
            log.warning("observer %s failed on %s (%d/%d), retrying in %.2fs: %s",
                        observer.name, where, count, self.max_failures, delay, error)
            return
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        quarantine(
            self.cluster,
            Quarantined(table, row, column, observer.name, text, count, weak, time.time()),
            newest,
        )
        with self._failures_lock:
            self._failures.pop(key, None)
        clear_failures(self.cluster, table, row, column)
        self._count("quarantined")
        _inc("percolator_observer_runs_total", observer.name, "quarantined")
        log.error("observer %s failed %d times on %s: notification quarantined "
                  "(see `percolator status`, `percolator retry`): %s",
                  observer.name, count, where, text)


@dataclass(slots=True)
class _Run:
    """An observer run whose transaction waits in a group for its commit."""

    txn: ObserverTransaction
    observer: Observer
    table: str
    row: bytes
    column: str
    change: int


@dataclass(slots=True)
class _Group:
    """One scanner pass's observer transactions waiting to be committed together, and
    the advisory locks of their rows (held until then)."""

    runs: list[_Run] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)


class _Bell:
    """Wakes sleeping scanners: a counter of rings and a condition to wait on it."""

    def __init__(self) -> None:
        self.rung = 0
        self._cond = threading.Condition()

    def set(self) -> None:
        with self._cond:
            self.rung += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> bool:
        """Wait up to *timeout* seconds for a ring after the count *seen*; True if
        one came."""
        with self._cond:
            return self._cond.wait_for(lambda: self.rung != seen, timeout)


def load_observers(spec: str) -> Sequence[Observer | type[Observer]]:
    """The observers named by *spec*, ``"package.module:NAME"`` (a list of observer
    classes or instances, or a single one).

    :raises InvalidArgument: when *spec* is malformed or names nothing suitable.
    """
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(f"bad observers spec {spec!r}: expected 'package.module:NAME'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InvalidArgument(f"cannot import {module_name!r} from {spec!r}: {e}") from e
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise InvalidArgument(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(value, Observer) or (isinstance(value, type) and issubclass(value, Observer)):
        return [value]
    if isinstance(value, list | tuple):
        return list(value)
    raise InvalidArgument(f"{spec!r} is not a list of observers: {value!r:.80}")
