"""A cluster's internal parts: what percolator's own modules, the observers' worker, the
recipes, ``spark_loader``, the benchmarks and the tests reach below the public
:class:`~percolator.Cluster`, and applications do not.

The public Cluster is what an application needs (as FoundationDB's ``Database``: make
tables, run transactions and snapshots, observe columns, collect garbage, set its few
options, close); :func:`internals` gives the rest, one object per cluster::

    parts = internals(cluster)
    parts.store.read_rows(...)        # the raw store, below the transactions
    parts.wakeups.append(bell.set)    # a local commit that notifies wakes a worker

Nothing here is a stable API: it changes with the library.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from percolator._encoding import FREE_TAG, LOCK
from percolator._errors import InvalidArgument, PercolatorError
from percolator._lock_census import LockCensus
from percolator._lock_resolver import CommitsInFlight
from percolator._retry import RetryPolicy
from percolator._safe_point import SafePoint
from percolator._store import EMBEDDED_FILE, Store, offered
from percolator._timestamps import SpareStarts, TimestampSource

if TYPE_CHECKING:
    from percolator._cluster import Cluster
    from percolator._coordination import Coordination
    from percolator._one_phase import _OnePhaseSteps

__all__ = ["Internals", "internals"]

log = logging.getLogger(__name__)


class Internals:
    """The parts of one :class:`~percolator.Cluster` below its public face."""

    __slots__ = ("cluster", "coordination", "in_flight", "lock_census", "lock_wait_policy",
                 "one_phase", "read_predictions", "safe_point", "spare_starts", "stats",
                 "store", "timestamps", "wakeups")

    def __init__(
        self,
        cluster: Cluster,
        store: Store,
        timestamps: TimestampSource,
        coordination: Coordination,
        *,
        lock_wait_policy: RetryPolicy,
        safe_point: SafePoint,
        lock_census: LockCensus | None,
    ) -> None:
        self.cluster = cluster
        self.store = store
        self.timestamps = timestamps
        self.coordination = coordination
        self.lock_wait_policy = lock_wait_policy
        """How long a read waits for a live lock (deadline: ``connect(lock_wait=...)``)."""
        self.safe_point = safe_point
        """The garbage-collection safe point and this client's publication of its oldest
        running transaction (:mod:`percolator._safe_point`)."""
        self.lock_census = lock_census
        """Embedded store only: whether any lock may be held (reads skip the lock
        family when none can be; see :mod:`percolator._lock_census`)."""
        self.stats: dict[str, int] = {
            "commits": 0, "conflicts": 0, "rollbacks": 0, "locks_resolved": 0,
        }
        self.read_predictions: dict[tuple[str, str], tuple[str, ...]] = {}
        """(table, a row's first column read) -> the columns transactions went on to
        read in that row: a later first read of the column fetches them with it in one
        store call (Percolator §2.5). Learned by this client, never persisted."""
        self.spare_starts = SpareStarts()
        """Per thread, the start timestamp the thread's last two-phase commit drew for
        its next transaction, used if that one reads nothing (docs/timestamps.md)."""
        self.in_flight = CommitsInFlight()
        """This client's two-phase commits under way: a read of this process that meets
        the lock of one learns from its committer what it sees (:class:`CommitsInFlight`)."""
        self.wakeups: list[Callable[[], None]] = []
        """Called after each commit that makes a notification (workers of this process
        register here, so that a local change wakes their idle scanners at once)."""
        self.one_phase: tuple[Store, TimestampSource, _OnePhaseSteps | None] | None = None
        """The store and timestamp source the one-phase commit's steps were last looked
        up on, and those steps (:func:`percolator._one_phase.one_phase_steps`): looked
        up again only when either is another object (tests swap them)."""

    def for_client(self, cluster: Cluster, coordination: Coordination) -> Internals:
        """The parts of *cluster*, another identity on the same store and timestamps
        (:func:`percolator.testing.client_of`): its own coordination and counters."""
        parts = Internals.__new__(Internals)
        for name in Internals.__slots__:
            setattr(parts, name, getattr(self, name))
        parts.cluster, parts.coordination = cluster, coordination
        parts.stats = dict.fromkeys(self.stats, 0)
        parts.spare_starts = SpareStarts()
        parts.in_flight = CommitsInFlight(watched=self.in_flight.watched)
        return parts

    def require_table(self, name: str) -> str:
        """*name*, validated, once it is known to exist.

        :raises InvalidArgument: for a malformed name.
        :raises UnknownTableError: unless it exists."""
        return self.cluster._require_table(name)

    def wake_observers(self) -> None:
        """Wake this process's idle workers: a commit made a notification."""
        for wake in list(self.wakeups):
            wake()

    def taking_locks(self) -> AbstractContextManager[None]:
        """Around writing new lock cells (two-phase prewrites, bulk loads): tells the
        lock census, if any, that a lock may be held."""
        census = self.lock_census
        return census.taking() if census is not None else nullcontext()

    def sweep_locks(self, *, force: bool = False) -> None:
        """Embedded store: clear the lock census if no lock is held any more (rate
        limited, see :meth:`LockCensus.sweep`). Called after two-phase commits, lock
        resolution and bulk loads."""
        census = self.lock_census
        if census is None or census.clean():
            return
        try:
            census.sweep(lambda: not self.any_lock_held(), force=force)
        except PercolatorError:
            log.warning("lock census sweep failed; reads keep checking locks", exc_info=True)

    def any_lock_held(self) -> bool:
        """Embedded store: whether any lock cell of any table is not FREE (the census's
        question, answered from an index of the held locks)."""
        file = offered(self.store, EMBEDDED_FILE)
        return file is not None and file.any_untagged(LOCK, FREE_TAG)


def internals(cluster: Cluster) -> Internals:
    """The internal parts of *cluster*.

    :raises InvalidArgument: when *cluster* is not a :class:`~percolator.Cluster`."""
    try:
        parts: Internals = cluster._internals
    except AttributeError:
        raise InvalidArgument(
            f"internals() needs a percolator.Cluster, got {type(cluster).__name__}"
        ) from None
    return parts
