"""The coordination contract: liveness of lock owners and advisory locks.

Lock resolution asks "is the owner of this lock still alive?" (Percolator §2.2:
workers hold a token in a lock service); scanners ask for cheap, non-persisted
advisory locks (§2.4). :class:`LocalCoordination` answers both for processes on
one host (the embedded mode); the ZooKeeper implementation answers them for a
cluster.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import uuid
import zlib
from typing import Protocol

from percolator import _forks
from percolator._errors import CoordinationError
from percolator._timestamps import boot_id

__all__ = ["Coordination", "LocalCoordination", "ObservedRegistry"]


class ObservedRegistry(Protocol):
    """The observed ``(table, column)`` pairs kept by the coordination service itself
    and watched, so that every client learns a registration at once (ZooKeeper). A
    coordination without one leaves them to the cluster's meta table, polled."""

    def register_observed(self, table: str, column: str) -> None: ...

    def observed_columns(self, timeout: float = 5.0) -> frozenset[tuple[str, str]]: ...


class Coordination(Protocol):
    """Who is alive, and advisory locks among clients: what a cluster asks of its
    coordinator (:class:`LocalCoordination` for one host, ZooKeeper for many). Every
    call is cheap in the steady state; correctness never rests on an advisory lock."""

    @property
    def observed_registry(self) -> ObservedRegistry | None:
        """The registry of observed columns this coordination keeps, or None."""
        ...

    def current_owner(self) -> str:
        """This client's owner id, to put in the locks it takes. Called at the start of
        every commit, so it must be cheap (no round trip in the steady state); it may
        wait a bounded time while the coordinator reconnects.

        :raises CoordinationError: when the identity is not (or no longer) registered,
            so that nothing commits under a lost identity.
        """
        ...

    def confirm_owner(self, owner: str) -> None:
        """Make sure *owner* (this client's id when the commit began) is still this
        client's live identity, just before a two-phase commit's commit point: a
        client whose session expired holds locks that others may already treat as
        abandoned, and must not commit them. Cheap in the steady state (the
        ZooKeeper implementation asks the server at most once per third of the
        session timeout).

        :raises CoordinationError: the identity is gone or cannot be confirmed.
        """
        ...

    def is_alive(self, owner: str) -> bool | None:
        """True if *owner* is alive, False if it is certainly dead, None if unknown
        (then only the lock's ttl decides). Called for every lock found pending, so it
        is answered from memory in the steady state; False must be final (owner ids
        are never reused)."""
        ...

    def try_advisory_lock(self, key: str) -> bool:
        """Take the advisory lock *key* without waiting; True if taken.

        Advisory only (nothing is persisted, correctness never depends on it): a key is
        exclusive among the threads of this process and, at the granularity of a hash
        bucket of keys, among processes. Keys may collide into one bucket, so a refusal
        means "someone is busy near here: go elsewhere". Refused while the coordinator
        is disconnected (pause new work). Cheap: the ZooKeeper implementation leases a
        whole bucket with one ephemeral node and then serves the bucket's keys from
        memory.
        """
        ...

    def release_advisory_lock(self, key: str) -> None:
        """Release *key* (a no-op if it is not held by this process)."""
        ...

    def close(self) -> None:
        """Give up this client's identity and its advisory locks."""
        ...


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _process_start(pid: int) -> str | None:
    """Start time of *pid* in clock ticks since boot (tells a reused pid apart)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after it.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return fields[19].decode()


_closed_owners: set[str] = set()
_closed_lock = threading.Lock()


class LocalCoordination:
    """Coordination among processes on one host.

    An owner id is ``local/<host>/<boot id>/<pid>/<process start>/<nonce>``. An owner
    is dead when its host booted again, when its pid is gone or now belongs to
    another process, or when it was closed in this very process. Owners on other
    hosts are unknown. Advisory locks are ``fcntl`` byte-range locks on a sidecar
    file, hashed into buckets: free, cross-process, released when a process dies.
    """

    BUCKETS = 1 << 20
    observed_registry: ObservedRegistry | None = None

    def __init__(self, lock_file: str | None = None) -> None:
        self._host = socket.gethostname()
        self._boot = str(uuid.UUID(bytes=boot_id()))
        self._become_owner()
        self._lock_fd = -1
        if lock_file is not None:
            self._lock_fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)

    def _become_owner(self) -> None:
        """A new owner id for this process, holding no advisory lock."""
        self._pid = _forks.pid
        self._owner = "/".join(
            ("local", self._host, self._boot, str(self._pid),
             _process_start(self._pid) or "?", uuid.uuid4().hex[:12])
        )
        self._held: dict[int, str] = {}
        self._held_lock = threading.Lock()

    def current_owner(self) -> str:
        if self._pid != _forks.pid:
            # A child forked from this client: its pid names its liveness, and its
            # safe-point publication must not overwrite its parent's. The parent's
            # fcntl locks are not the child's (POSIX does not inherit them).
            self._become_owner()
        return self._owner

    def confirm_owner(self, owner: str) -> None:
        if owner != self.current_owner():
            raise CoordinationError(f"lock owner {owner!r} is not this client's ({self._owner!r}): "
                                    "a transaction begun in another process (a parent this "
                                    "one was forked from) cannot commit here")
        with _closed_lock:
            if owner in _closed_owners:
                raise CoordinationError(f"the coordinator of owner {owner!r} was closed: "
                                        "its locks may be rolled back; not committing them")

    def is_alive(self, owner: str) -> bool | None:
        parts = owner.split("/")
        if len(parts) != 6 or parts[0] != "local" or parts[1] != self._host:
            return None
        _, _, boot, pid, started, _ = parts
        if boot != self._boot:
            return False
        with _closed_lock:
            if owner in _closed_owners:
                return False
        return _process_start(int(pid)) == started

    def _bucket(self, key: str) -> int:
        return zlib.crc32(key.encode()) % self.BUCKETS

    def try_advisory_lock(self, key: str) -> bool:
        bucket = self._bucket(key)
        self.current_owner()  # a forked child starts holding none
        with self._held_lock:
            if bucket in self._held:
                return False
            if self._lock_fd >= 0:
                try:
                    fcntl.lockf(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, bucket)
                except OSError:
                    return False
            self._held[bucket] = key
            return True

    def release_advisory_lock(self, key: str) -> None:
        bucket = self._bucket(key)
        with self._held_lock:
            if self._held.get(bucket) != key:
                return
            del self._held[bucket]
            if self._lock_fd >= 0:
                fcntl.lockf(self._lock_fd, fcntl.LOCK_UN, 1, bucket)

    def close(self) -> None:
        """Declare this owner dead: its remaining locks may be rolled back at once."""
        owner = self.current_owner()  # a forked child's, never its parent's
        with _closed_lock:
            _closed_owners.add(owner)
        with self._held_lock:
            self._held.clear()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
