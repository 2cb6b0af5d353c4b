"""Embedded mode: a repository in one local file (``sqlite://PATH``), with no server.

A store that declares ``EMBEDDED_FILE`` (:mod:`percolator._store`; the SQLite store)
makes :func:`~percolator.connect` build the rest of the cluster from files beside it,
so that every process on the host that opens the same file shares them:

* ``PATH-locks``: the coordinator's advisory locks
  (:class:`~percolator._coordination.LocalCoordination`, ``fcntl`` byte ranges);
* ``PATH-ts``: the timestamp source (:class:`~percolator._timestamps.HostTimestamps`,
  a memory-mapped block of timestamps and the commits in flight);
* ``PATH-census``: the lock census (:class:`~percolator._lock_census.LockCensus`,
  whether any lock may be held, so reads can skip the lock family);
* ``PATH-write.lock`` and ``PATH-writers``: the store's own writers' turn
  (``percolator/stores/sqlite.py``), next to SQLite's ``-wal`` and ``-shm``.

Every sidecar name is chosen here and nowhere else.
"""

from __future__ import annotations

from percolator._coordination import LocalCoordination
from percolator._lock_census import LockCensus
from percolator._store import EMBEDDED_FILE, Store, offered
from percolator._timestamps import HostTimestamps

__all__ = [
    "WRITERS_SUFFIX",
    "WRITE_LOCK_SUFFIX",
    "embedded_file",
    "local_coordination",
    "lock_census",
    "timestamps",
]

LOCKS_SUFFIX = "-locks"
TIMESTAMPS_SUFFIX = "-ts"
CENSUS_SUFFIX = "-census"
WRITE_LOCK_SUFFIX = "-write.lock"
WRITERS_SUFFIX = "-writers"


def embedded_file(store: Store) -> str | None:
    """The file of an embedded *store*, or None for any other store."""
    file = offered(store, EMBEDDED_FILE)
    return file.path if file is not None else None


def local_coordination(store: Store) -> LocalCoordination:
    """Coordination among the host's processes: on an embedded *store*, with advisory
    locks in its ``-locks`` file; elsewhere (no ZooKeeper named), this process's only."""
    path = embedded_file(store)
    return LocalCoordination(path + LOCKS_SUFFIX if path else None)


def timestamps(store: Store) -> HostTimestamps | None:
    """The timestamp source of an embedded *store* (its ``-ts`` file); None elsewhere."""
    path = embedded_file(store)
    return HostTimestamps(store, path + TIMESTAMPS_SUFFIX) if path else None


def lock_census(store: Store) -> LockCensus | None:
    """The lock census of an embedded *store* (its ``-census`` file); None elsewhere.
    Every client of an embedded store keeps it, however the cluster was built."""
    path = embedded_file(store)
    return LockCensus(path + CENSUS_SUFFIX) if path else None
