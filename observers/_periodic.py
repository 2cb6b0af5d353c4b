"""Periodic, cluster-singleton tasks: run something every N seconds on one process of
the cluster at a time (garbage collection in workers; stream recipes' maintenance).

Each :class:`Periodic` wakes now and then, takes the advisory lock ``periodic/<name>``
(the coordination layer: ``fcntl`` on one host, ZooKeeper in a cluster) and, holding
it, runs the task if the last run recorded in the store (the meta table, so every
process of the cluster sees it) finished at least *interval* seconds ago. So however
many workers run, the task runs about once per interval, by one of them at a time.
The lock is advisory: a task must be safe to run twice at once (garbage collection
is), the lock only keeps that from being the rule.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from percolator import Cluster, InvalidArgument
from percolator.ext import internals, last_task_run, record_task_run

__all__ = ["Periodic"]

log = logging.getLogger(__name__)


class Periodic:
    """Run *task* every *interval* seconds, one process of the cluster at a time.

    *name* identifies the task across the cluster (every worker that runs a task of
    the same name shares its schedule and its lock). :meth:`start` runs it from a
    daemon thread until :meth:`stop`; :meth:`run_once` runs it now if it is due and
    nobody else is running it. An exception from *task* is logged and the task is
    tried again at the next interval.

    ::

        gc = Periodic(cluster, "gc", lambda: cluster.gc(retention=600), interval=600)
        gc.start()
        ...
        gc.stop()

    :attr:`runs` counts the runs of this process, :attr:`failures` the failed ones.
    """

    def __init__(
        self, cluster: Cluster, name: str, task: Callable[[], object], *, interval: float
    ) -> None:
        if not isinstance(cluster, Cluster):
            raise InvalidArgument(f"Periodic needs a percolator.Cluster, got {cluster!r:.80}")
        if not isinstance(name, str) or not name or any(ord(c) < 32 for c in name):
            raise InvalidArgument(f"name must be a non-empty printable str, got {name!r}")
        if not callable(task):
            raise InvalidArgument(f"task must be callable, got {task!r:.80}")
        if not isinstance(interval, int | float) or isinstance(interval, bool) or interval <= 0:
            raise InvalidArgument(f"interval must be a positive number of seconds, "
                                  f"got {interval!r}")
        self.cluster = cluster
        self.name = name
        self.task = task
        self.interval = float(interval)
        self.runs = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def last_run(self) -> float | None:
        """Wall time when the task last finished anywhere in the cluster, or None."""
        return last_task_run(self.cluster, self.name)

    def due(self) -> bool:
        """Whether *interval* seconds have passed since the last run by any process
        of the cluster (or it never ran)."""
        last = self.last_run()
        return last is None or time.time() - last >= self.interval

    def run_once(self) -> bool:
        """Run the task now if it is due and no other process (or thread) holds its
        lock; return whether it ran (successfully or not).

        .. warning:: blocks while the task runs.
        """
        coordination = internals(self.cluster).coordination
        key = f"periodic/{self.name}"
        if not coordination.try_advisory_lock(key):
            return False
        try:
            if not self.due():
                return False
            try:
                self.task()
                self.runs += 1
            except Exception:
                self.failures += 1
                log.exception("periodic task %r failed; trying again in %.0fs",
                              self.name, self.interval)
            # Recorded after a failure too: a failing task is not retried at once by
            # every worker in turn.
            record_task_run(self.cluster, self.name, time.time())
            return True
        finally:
            coordination.release_advisory_lock(key)

    def start(self) -> None:
        """Run the task periodically from a daemon thread; returns at once."""
        if self._thread is not None:
            raise InvalidArgument(f"periodic task {self.name!r} is already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"periodic-{self.name}",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        # Wake a few times per interval (at most every minute) at random moments, so
        # that workers started together do not all look at once.
        nap = min(self.interval, 60.0) / 2
        while not self._stop.wait(random.uniform(nap / 2, nap)):
            try:
                self.run_once()
            except Exception:  # the store or the coordinator failed us: next time
                log.warning("periodic task %r: could not check its schedule", self.name,
                            exc_info=True)

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread after its current run (waiting at most *timeout* seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __repr__(self) -> str:
        return f"<observers.Periodic {self.name!r} every {self.interval:g}s>"
