"""Whether another process has a shared file open: what lets a process alone on its
embedded store skip the machinery that only keeps processes apart (the writers' turn
of :mod:`percolator.stores.sqlite`, the timestamp sidecar's ``flock`` of
:class:`percolator._timestamps.HostTimestamps`).

Each holder of a :class:`Presence` holds a shared open-file-description lock on one
byte of the file while it is open (the kernel drops it when the process dies,
``kill -9`` included), and on arrival writes random bytes over the eight bytes at that
offset: the others, which compare those bytes with what they saw last (a memory
read), look again at once (one ``F_OFD_GETLK``: is a lock held by another open file
description?). A departure is noticed within :attr:`Presence.RECHECK` seconds.
Where open-file-description locks are missing (not Linux), or anything fails, others
are assumed present.

An answer is a hint, never a guarantee: a newcomer may arrive just after it. Whoever
skips machinery on it must stay correct when the hint is wrong (the writers' turn is
only an order; the sidecar keeps its ``flock`` held while it skips taking it).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time

__all__ = ["Presence"]

_FLOCK = struct.Struct("hhqqi4x")
"""Linux's ``struct flock`` (64-bit): type, whence, start, length, pid."""
_OFD_GETLK: int = getattr(fcntl, "F_OFD_GETLK", -1)
_OFD_SETLK: int = getattr(fcntl, "F_OFD_SETLK", -1)
MARK_SIZE = 8


class Presence:
    """This open file's presence at byte *at* of the file open as *fd* and mapped as
    *mapped* (at least ``at + 8`` bytes): its lock taken and its mark written here."""

    RECHECK = 1.0
    """Seconds an answer is trusted when no newcomer has marked the file."""

    def __init__(self, fd: int, mapped: mmap.mmap | None, at: int) -> None:
        self._fd = fd
        self._at = at
        self._mark_end = at + MARK_SIZE
        self._map: mmap.mmap | None = None
        self._seen = b""
        self._checked = float("-inf")
        self._others = True
        if mapped is None or _OFD_GETLK < 0 or _OFD_SETLK < 0:
            return
        try:
            fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_RDLCK, 0, at, 1, 0))
            # after the lock: who sees the mark sees the lock
            mapped[at:self._mark_end] = os.urandom(MARK_SIZE)
        except OSError:
            return  # others assumed present
        self._map = mapped

    def others_present(self) -> bool:
        """Whether another open file description (another process, in practice) has
        the file's presence lock."""
        mapped = self._map
        if mapped is None:
            return True
        mark = mapped[self._at:self._mark_end]
        now = time.monotonic()
        if mark == self._seen and now - self._checked < self.RECHECK:
            return self._others
        self._seen, self._checked = mark, now
        try:
            answer = fcntl.fcntl(self._fd, _OFD_GETLK,
                                 _FLOCK.pack(fcntl.F_WRLCK, 0, self._at, 1, 0))
            self._others = _FLOCK.unpack(answer)[0] != fcntl.F_UNLCK
        except OSError:
            self._others = True
        return self._others

    def newcomer(self) -> bool:
        """Whether somebody arrived since :meth:`others_present` last answered (a memory
        read: cheap enough for every step of a hot path)."""
        mapped = self._map
        return mapped is None or mapped[self._at:self._mark_end] != self._seen

    def forget(self) -> None:
        """Stop reading the map (the owner is about to close it)."""
        self._map = None
