"""Timestamp sources: where start and commit timestamps come from.

Snapshot isolation needs timestamps that are unique and increase in real time
across every process: a timestamp drawn after another was returned (anywhere) is
larger. Three sources satisfy :class:`TimestampSource`:

* :class:`HostTimestamps` (embedded default): a counter in a small memory-mapped
  sidecar file, guarded by ``flock``, shared by every process on the host. The upper
  end of the current block is persisted in the store (compare-and-set on a meta
  cell) *before* any timestamp in the block is handed out, so a restart, a
  ``kill -9`` or a reboot resumes above it and never reissues.
* :class:`StoreTimestamps`: a counter cell in the store, one atomic ``increment`` per
  call where the store offers it (Bigtable, HBase), else a read and a compare-and-set;
  correct across hosts without any server, one or two round trips per call; for
  remote stores without an oracle.
* ``oracle.OracleClient``: the batched gRPC oracle (distributed mode).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from percolator._encoding import META_FAMILIES, META_TABLE
from percolator._errors import InvalidArgument, StoreUnavailable
from percolator._store import Read, Store

__all__ = ["HostTimestamps", "StoreTimestamps", "TimestampSource"]

_ROW = b"timestamps"
_CEILING = "m:ceiling"
_IDENTITY = "m:identity"
_U64 = struct.Struct(">Q")
MAX_BATCH = 10_000_000


class TimestampSource(Protocol):
    def get_timestamp(self) -> int: ...

    def get_timestamps(self, n: int) -> range: ...

    def close(self) -> None: ...


def _check_count(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool):
        raise InvalidArgument(f"count must be an int, got {type(n).__name__}: {n!r}")
    if not 1 <= n <= MAX_BATCH:
        raise InvalidArgument(f"count must be between 1 and {MAX_BATCH}, got {n}")
    return n


class _Ceiling:
    """The persisted upper end of all timestamps ever handed out, in the meta table."""

    def __init__(self, store: Store) -> None:
        self.store = store
        store.create_table(META_TABLE, META_FAMILIES)

    def read(self) -> tuple[int, bytes | None]:
        """The persisted ceiling (1 when none yet) and its raw cell value."""
        cells = self.store.read_rows(META_TABLE, [_ROW], [Read("m", ("ceiling",))])
        versions = cells.get(_ROW, {}).get(_CEILING)
        if not versions:
            return 1, None
        return _U64.unpack(versions[0][1])[0], versions[0][1]

    def advance(self, raw: bytes | None, new: int) -> bool:
        """Compare-and-set the ceiling from *raw* (as read) to *new*."""
        return self.store.check_and_set(META_TABLE, _ROW, _CEILING, raw, _U64.pack(new))

    def raise_to_at_least(self, minimum: int) -> int:
        """Persist a ceiling >= *minimum*; return the persisted value."""
        while True:
            current, raw = self.read()
            if current >= minimum:
                return current
            if self.advance(raw, minimum):
                return minimum

    def identity(self) -> bytes:
        """A random id of this store, created once (tells sidecars of other stores apart)."""
        while True:
            cells = self.store.read_rows(META_TABLE, [_ROW], [Read("m", ("identity",))])
            versions = cells.get(_ROW, {}).get(_IDENTITY)
            if versions:
                return versions[0][1]
            self.store.check_and_set(META_TABLE, _ROW, _IDENTITY, None, uuid.uuid4().bytes)


class StoreTimestamps:
    """Each call advances the persisted counter (the ceiling cell: the next timestamp to
    hand out, 8-byte big-endian) by the number of timestamps taken: linearizable across
    hosts. With the store's atomic ``increment`` (:class:`~percolator._store.Incrementing`)
    that is one round trip; otherwise a read and a compare-and-set, two. Both ways work
    on the same cell, so clients of either kind can share a store."""

    def __init__(self, store: Store) -> None:
        self._ceiling = _Ceiling(store)
        self._increment: Callable[[str, bytes, str, int], int] | None = getattr(
            store, "increment", None
        )

    def get_timestamp(self) -> int:
        return self.get_timestamps(1)[0]

    def get_timestamps(self, n: int) -> range:
        n = _check_count(n)
        while True:
            if self._increment is not None:
                end = self._increment(META_TABLE, _ROW, _CEILING, n)
                if end - n >= 1:  # an absent counter counts from 0; timestamps start at 1
                    return range(end - n, end)
                continue
            current, raw = self._ceiling.read()
            if self._ceiling.advance(raw, current + n):
                return range(current, current + n)

    def close(self) -> None:
        """Nothing to release: the store belongs to the cluster."""


def boot_id() -> bytes:
    """This boot's id: a page cache written before another boot may have lost writes."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return uuid.UUID(f.read().strip().decode()).bytes
    except (OSError, ValueError):
        return b"\0" * 16


class HostTimestamps:
    """Timestamps shared by every process of one host (see the module docstring).

    The sidecar holds ``magic, boot id, store identity, next``. A sidecar from an
    earlier boot (its page cache may have lost writes) or of another store is
    reset to the persisted ceiling, which is at or above every issued timestamp.
    """

    _MAGIC = b"PCTS0001"
    _LAYOUT = struct.Struct(">8s16s16sQ")
    BLOCK = 100_000

    def __init__(self, store: Store, sidecar_path: str) -> None:
        self._ceiling = _Ceiling(store)
        self._identity = self._ceiling.identity()
        self._boot = boot_id()
        self._lock = threading.Lock()
        self._known_ceiling = 0
        try:
            self._fd = os.open(sidecar_path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(self._fd).st_size < self._LAYOUT.size:
                os.ftruncate(self._fd, self._LAYOUT.size)
            self._map = mmap.mmap(self._fd, self._LAYOUT.size)
        except OSError as e:
            raise StoreUnavailable(f"cannot open timestamp file {sidecar_path!r}: {e}") from e
        self.path = sidecar_path

    def get_timestamp(self) -> int:
        return self.get_timestamps(1)[0]

    def get_timestamps(self, n: int) -> range:
        n = _check_count(n)
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                return self._reserve(n)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _reserve(self, n: int, *, persist: bool = True) -> range:
        """Take *n* timestamps; the caller holds both locks. The ceiling is persisted
        first when the block is spent (unless *persist* is False: then the caller
        made room beforehand, see :meth:`exclusive`)."""
        magic, boot, identity, nxt = self._LAYOUT.unpack(self._map[: self._LAYOUT.size])
        if (magic, boot, identity) != (self._MAGIC, self._boot, self._identity):
            assert persist, "exclusive() validated the sidecar"
            nxt = self._ceiling.raise_to_at_least(1)
            self._known_ceiling = nxt
        end = nxt + n
        if end > self._known_ceiling:
            assert persist, "exclusive() made room in the block"
            self._known_ceiling = self._ceiling.read()[0]
            if end > self._known_ceiling:
                self._known_ceiling = self._ceiling.raise_to_at_least(
                    max(end, self._known_ceiling) + self.BLOCK
                )
        self._map[: self._LAYOUT.size] = self._LAYOUT.pack(
            self._MAGIC, self._boot, self._identity, end
        )
        return range(nxt, end)

    @contextmanager
    def exclusive(self, draws: int = 1) -> Iterator[Callable[[], int]]:
        """Hold the host's timestamp lock for the block and yield a function that
        draws a timestamp (at most *draws* times) without persisting anything.

        No process of the host gets a timestamp until the block ends, so a commit made
        visible inside it at a timestamp drawn inside it is seen by every transaction
        that starts afterwards: the embedded store's one-phase commit relies on it.
        """
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                # Validate the sidecar and persist room for the draws, then give them back.
                room = self._reserve(draws)
                self._map[: self._LAYOUT.size] = self._LAYOUT.pack(
                    self._MAGIC, self._boot, self._identity, room.start
                )
                left = [draws]

                def draw() -> int:
                    if left[0] <= 0:
                        raise RuntimeError("exclusive(): more draws than announced")
                    left[0] -= 1
                    return self._reserve(1, persist=False)[0]

                yield draw
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                self._map.close()
                os.close(self._fd)
                self._fd = -1
