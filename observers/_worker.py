"""Workers: scanner threads that find dirty cells in the notify family and run
their observers (Percolator §2.4; DESIGN.md §7).

Each scanner thread starts at a random row of a random observed table (drawn from
a sample of dirty rows seen so far), scans the notify family to the end and wraps
around. On a store with a notification index (Bigtable, where a family-filtered
scan reads the whole table: :mod:`percolator._notify_index`) it scans the index
instead, from a random place, and deletes the entries it finds settled. Before
working on a row it takes an advisory lock; when another scanner holds it, the
scanner jumps to a new random place (the paper's anti-clumping). A scanner of the
notify family reads 64 rows per scan and also meets another on a row that its
process served since the scan, or whose run finds its notification served already
(another process's scanner, whose advisory locks it does not see without
ZooKeeper): it leaves the rest of its batch and scans on from past it.

Idle workers leave the store alone: a scanner whose pass found nothing to do sleeps
``idle_max`` seconds (default 2, jittered). While one sleeps, a single lookout thread
per worker reads what is pending every ``poll_interval`` seconds (default 0.08; the
index, or the notify family of the observed tables: O(pending), nothing when all is
done). The rows of notifications its previous look did not see it hands to the
sleeping scanners, one row to one scanner, which serves it without a pass of its own
(changes that arrive one at a time cost no scan but the look's); more than a few
dozen at once wake every scanner for passes, as a commit in the same process that
makes a notification does. Waking with nothing to do, one scanner of the worker
passes every ``idle_max / 2`` seconds or so, for what a hand-off left.

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

:class:`Worker` (configuration and life cycle) owns two parts and starts their
threads: a :class:`~observers._scanner.Scanner` (its scanner and lookout threads find
the rows to serve) hands each row, with the notify cells its scan read, to a
:class:`~observers._runner.Runner` (the observer runs and their commits, alone or in
groups). Both share the worker's :class:`~observers._backoff.Backoff` (failing cells)
and, on a single-writer store with several scanners, its
:class:`~observers._store_turn.StoreTurn`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from types import FrameType
from typing import Any

from observers._backoff import Backoff
from observers._observer import Observer, check_observer
from observers._periodic import Periodic
from observers._recipes import load_object
from observers._runner import CommitHook, Recent, Runner
from observers._scanner import Scanner
from observers._store_turn import StoreTurn, Waits
from percolator import Cluster, InvalidArgument, PercolatorError
from percolator.ext import SINGLE_WRITER, declares, internals, migrate, wait_until_idle

__all__ = ["CommitHook", "Worker", "wait_for_observers"]

log = logging.getLogger("observers")


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
    lookout looks for new work every *poll_interval* seconds meanwhile, which trades
    the store calls of its looks (one scan each) for how soon a change from another
    process is observed (half of it, on average, plus the run). *on_commit*,
    if given, is called after each committed observer transaction with
    ``(observer, table, row, column, change_ts, commit_ts)`` (from the scanner
    thread; keep it quick). *tasks* are :class:`Periodic` tasks that run while the
    worker runs (``python -m observers`` adds garbage collection).

    :attr:`stats` counts ``committed`` runs, ``skipped`` notifications (already
    acknowledged: duplicate work the acks rejected), ``conflicts``, ``failures``,
    ``quarantined``, ``meetings`` (a scanner found another on its row, or its batch's
    row served since its scan, and jumped; or left a row handed over to it),
    ``passes``, ``idle`` (a scanner went to sleep with nothing to do) and lookout
    ``wakeups`` (looks that handed rows over or rang).

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
        poll_interval: float = 0.08,
        on_commit: CommitHook | None = None,
        tasks: Iterable[Periodic] = (),
    ) -> None:
        if not isinstance(cluster, Cluster):
            raise InvalidArgument(f"Worker needs a percolator.Cluster, got {cluster!r:.80}")
        if threads is None:
            threads = 1 if declares(internals(cluster).store, SINGLE_WRITER) else 4
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
        self.max_failures = max_failures
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.idle_max = idle_max
        self.poll_interval = poll_interval
        self.on_commit = on_commit
        self.tasks = list(tasks)
        for task in self.tasks:
            if not isinstance(task, Periodic):
                raise InvalidArgument(f"tasks must be observers.Periodic, got {task!r:.80}")
        self.stats: Counter[str] = Counter()
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        store_turn = (StoreTurn() if threads > 1 and declares(
            internals(cluster).store, SINGLE_WRITER) else None)
        self._runner = Runner(
            cluster, self._by_column, backoff=Backoff(retry_delay, max_retry_delay),
            count=self._count, stop=self._stop, store_turn=store_turn,
            waits={o.name: Waits() for o in self.observers}, on_commit=on_commit,
            max_failures=max_failures,
            # Scanner threads that pass at once may read rows another just served; those
            # that take turns at a single-writer store pass one at a time.
            recent=Recent() if threads > 1 and store_turn is None else None)
        self._scanner = Scanner(
            cluster, self._runner, self._columns, threads=threads, idle_max=idle_max,
            poll_interval=poll_interval, count=self._count, stop=self._stop,
            store_turn=store_turn)

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] += n

    # --- life cycle -----------------------------------------------------------------

    def register(self) -> None:
        """Create the observed tables if missing and register the observed columns."""
        for table, column in self._by_column:
            self.cluster.create_table(table)
            self.cluster.observe(table, column)
        for table in self._columns:
            found = migrate(internals(self.cluster), table)
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
        bell = self._scanner.bell
        internals(self.cluster).wakeups.append(bell.set)
        for i in range(self.threads):
            thread = threading.Thread(target=self._scanner.scanner_thread,
                                      name=f"observers-scanner-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        for task in self.tasks:
            task.start()
        lookout = threading.Thread(target=self._scanner.lookout_thread,
                                   name="observers-lookout", daemon=True)
        lookout.start()
        self._threads.append(lookout)
        log.info("worker started: %d scanner thread(s), observers %s", self.threads,
                 ", ".join(f"{o.name} ({o.table}/{o.column})" for o in self.observers))

    def stop(self, timeout: float | None = None) -> None:
        """Ask the scanners to stop after their current transaction and wait for them
        (at most *timeout* seconds each)."""
        self._stop.set()
        self._scanner.bell.set()
        for task in self.tasks:
            task.stop(timeout)
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []
        try:
            self._scanner.settle_deferred(force=True)
        except PercolatorError:
            log.warning("could not settle served index entries; a later look will",
                        exc_info=True)
        wakeups = internals(self.cluster).wakeups
        if self._scanner.bell.set in wakeups:
            wakeups.remove(self._scanner.bell.set)
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


def load_observers(spec: str) -> Sequence[Observer | type[Observer]]:
    """The observers named by *spec*, ``"package.module:NAME"`` (a list of observer
    classes or instances, or a single one).

    :raises InvalidArgument: when *spec* is malformed or names nothing suitable.
    """
    value = load_object(spec, "observers spec")
    if isinstance(value, Observer) or (isinstance(value, type) and issubclass(value, Observer)):
        return [value]
    if isinstance(value, list | tuple):
        return list(value)
    raise InvalidArgument(f"{spec!r} is not a list of observers: {value!r:.80}")
