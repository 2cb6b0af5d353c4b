"""A public test harness: embedded clusters, simulated committer crashes, and
deterministic interleavings of actors (transactions, lock resolvers, workers) at
their store calls, plus named pause points in components' own threads. A guide with
examples that run: docs/testing.md.

::

    import percolator
    from percolator.testing import (
        CrashPoint, Interleaving, client_of, crash_commit, temporary_cluster)

    with temporary_cluster() as cluster:               # removed afterwards
        cluster.create_table("bank")
        client = client_of(cluster)                    # a second identity that can die
        client.one_phase_commit = False                # a store call per commit step
        txn = percolator.Transaction(client)
        txn.set("bank", b"alice", "bal:v", b"40")
        crash_commit(txn, CrashPoint("commit_point"))  # dies right after its commit point

        with Interleaving(cluster) as world:           # one store call at a time
            other = client_of(cluster)                 # inside: its calls are the world's
            other.one_phase_commit = False
            txn = percolator.Transaction(other)
            txn.set("bank", b"bob", "bal:v", b"60")
            t1 = world.actor("T1", txn.commit, clients=[other])
            t1.run_until(lambda step: step.matches("timestamp"))
            ...                                        # others run while T1 is parked
            t1.finish()
"""
from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from percolator._cluster import Cluster, connect
from percolator._commit import CrashPoint, SimulatedCrash, commit_transaction
from percolator._coordination import LocalCoordination
from percolator._interleaving import Actor, Interleaving, InterleavingError, Step
from percolator._internals import internals
from percolator._pause import PausePoint
from percolator._transaction import TransactionBase

__all__ = [
    "Actor",
    "CrashPoint",
    "Interleaving",
    "InterleavingError",
    "PausePoint",
    "SimulatedCrash",
    "Step",
    "client_of",
    "crash_commit",
    "kill_client",
    "temporary_cluster",
]


@contextmanager
def temporary_cluster(**options: object) -> Iterator[Cluster]:
    """An embedded cluster in a fresh temporary directory, removed afterwards."""
    directory = tempfile.mkdtemp(prefix="percolator-")
    try:
        with connect(f"sqlite:///{directory}/repo.db", **options) as cluster:  # type: ignore[arg-type]
            yield cluster
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class _Client(Cluster):
    """A second identity on another cluster's store and timestamps (see client_of)."""

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        internals(self).coordination.close()


def client_of(cluster: Cluster) -> Cluster:
    """Another client of the same repository with an identity of its own, so that
    it can "die" (:func:`crash_commit`) while *cluster* lives on. Shares the
    store and timestamps of *cluster*; closing it does not close them."""
    client = _Client.__new__(_Client)
    client.__dict__.update(cluster.__dict__)
    client._lock = threading.Lock()
    client._internals = internals(cluster).for_client(client, LocalCoordination())
    return client


def kill_client(client: Cluster) -> None:
    """Declare *client* (one from :func:`client_of`) dead, as if its process were
    killed: its liveness ends, so a reader meeting its locks resolves them at once, and
    its own next commit step raises :class:`CoordinationError`."""
    internals(client).coordination.close()


def crash_commit(txn: TransactionBase, point: CrashPoint) -> bool:
    """Commit *txn* but die at *point*: the store is left exactly as a killed
    process would leave it, and the transaction's owner is declared dead.

    Returns True if the commit reached its commit point (so, once its locks are
    resolved, it is wholly visible), False if not (wholly invisible). A
    :class:`ConflictError` propagates as from ``commit()``.
    """
    try:
        commit_transaction(txn, point)
    except SimulatedCrash:
        kill_client(txn.cluster)
        return txn.commit_ts is not None
    return True
