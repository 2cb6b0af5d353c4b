"""The lock census of an embedded store: whether any lock cell may be held.

A transactional read must look at a cell's lock, because a transaction that locked
the cell may have committed below the reader's start timestamp without having
written the cell's write record yet. On the embedded store a commit takes one
SQLite transaction and leaves no lock (one-phase commit); locks appear only in
two-phase commits (a cell found locked, a crash test) and bulk loads, and are gone
again once those finish or are resolved. When the census says that no lock can be
held, a read skips the lock family: one B-tree lookup instead of two.

The census is one flag in a small memory-mapped file next to the store, shared by
every process of the host (the embedded store serves one host):

* a **taker** (a two-phase prewrite, a bulk load's prewrite) holds a *shared*
  ``flock`` on the file while it sets the flag and writes its locks
  (:meth:`LockCensus.taking`);
* a **sweep** (:meth:`LockCensus.sweep`) takes the ``flock`` *exclusively*, without
  waiting: it gets it only when no taker is between setting the flag and having
  written its locks (the kernel drops the ``flock`` of a killed process). Holding
  it, the sweep looks for non-FREE lock cells in the store (a partial index of
  them: the question costs the held locks, not the table) and clears the flag
  only if there are none;
* a **reader** that finds the flag clear after drawing its start timestamp skips
  the lock family.

Why a reader may skip: a transaction T whose commit is below the reader's start
set the flag before its prewrite, so before drawing its commit timestamp, so before
the reader drew its start timestamp and read the flag. For the flag to read clear,
a sweep must have cleared it after T set it; that sweep held the ``flock``
exclusively, so T had finished writing its locks, and it found none left: every
lock of T had been released, with its write record, which the reader sees. A taker
that sets the flag after the reader read it commits above the reader's start.

A file from an earlier boot (its page cache may have lost the last flag write) or a
new file starts with the flag set; the first sweep clears it.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from percolator import _forks
from percolator._errors import StoreUnavailable
from percolator._timestamps import boot_id

__all__ = ["LockCensus"]

log = logging.getLogger(__name__)

_SIZE = 32  # flag byte, 15 reserved, 16-byte boot id
_BOOT = slice(16, 32)


class LockCensus:
    """The flag shared by the host's processes (see the module docstring)."""

    def __init__(
        self, path: str, *, min_sweep_interval: float = 1.0, max_sweep_interval: float = 60.0
    ) -> None:
        self.path = path
        self.min_sweep_interval = min_sweep_interval
        self.max_sweep_interval = max_sweep_interval
        self._interval = min_sweep_interval
        self._takers = 0
        self._takers_lock = threading.Lock()
        self._sweep_lock = threading.Lock()
        self._last_sweep = float("-inf")
        self._generation = _forks.generation
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(self._fd).st_size < _SIZE:
                os.ftruncate(self._fd, _SIZE)
            self._map = mmap.mmap(self._fd, _SIZE)
            self.flag = self._map
            """The shared flag: ``flag[0] == 0`` is :meth:`clean`, for a reader's hot
            path that cannot spare a method call (the same byte, read the same way)."""
            # No flock here (a taker of this very process may hold it): setting the
            # flag is always safe, so racing openers may both do it.
            boot = boot_id()
            if self._map[_BOOT] != boot:  # a new file, or written before a reboot
                self._map[0] = 1
                self._map[_BOOT] = boot
        except OSError as e:
            raise StoreUnavailable(f"cannot open lock census file {path!r}: {e}") from e

    def clean(self) -> bool:
        """True when no lock cell can be held: a reader that drew its start timestamp
        before asking may skip the lock family."""
        return self.flag[0] == 0

    def _after_fork(self) -> None:
        """In a forked child: the inherited descriptor shares the parent's flock (and
        its takers count), so take a descriptor of our own."""
        fd = os.open(self.path, os.O_RDWR)
        os.close(self._fd)  # the parent's flock stays: its descriptor is still open
        self._fd = fd
        self._takers = 0
        self._takers_lock = threading.Lock()
        self._sweep_lock = threading.Lock()
        self._generation = _forks.generation

    @contextmanager
    def taking(self) -> Iterator[None]:
        """Around writing new locks: hold the shared ``flock`` and set the flag."""
        if self._generation != _forks.generation:
            self._after_fork()
        with self._takers_lock:
            if self._takers == 0:
                fcntl.flock(self._fd, fcntl.LOCK_SH)  # per open file: one for all threads
            self._takers += 1
        try:
            self._map[0] = 1
            yield
        finally:
            with self._takers_lock:
                self._takers -= 1
                if self._takers == 0:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def sweep(self, no_locks: Callable[[], bool], *, force: bool = False) -> bool:
        """Clear the flag if no taker is writing locks and *no_locks()* says no lock
        cell is held. At most once per ``min_sweep_interval`` per process (a sweep
        asks every lock family) unless *force*; the interval doubles, up to
        ``max_sweep_interval``, while sweeps find locks left (a dead transaction's lock
        that nobody reads stays until a reader or a worker meets it). Returns whether
        the flag is clear."""
        if self.clean():
            return True
        now = time.monotonic()
        if not force and now - self._last_sweep < self._interval:
            return False
        with self._sweep_lock:
            self._last_sweep = now
            # Another open file description: our own takers' shared flock must block it.
            fd = os.open(self.path, os.O_RDWR)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False  # a taker is writing locks
                if not no_locks():
                    self._interval = min(self._interval * 2, self.max_sweep_interval)
                    return False
                self._interval = self.min_sweep_interval
                self._map[0] = 0
                log.debug("lock census: no lock held in %s", self.path)
                return True
            finally:
                os.close(fd)  # drops the flock

    def close(self) -> None:
        if self._fd >= 0:
            self._map.close()
            os.close(self._fd)
            self._fd = -1
