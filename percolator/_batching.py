"""Batched timestamp draws: the concurrent callers of one process share one request.

At most one request is in flight per :class:`BatchedDraws`. A caller that finds none
in flight sends one for itself; callers that arrive while it is out queue up, and the
*next* request is sent for all of them (each gets its own range of the block). So
batching grows with load, and a caller never receives a timestamp from a request sent
before it arrived: if a draw returned ``t`` (in any thread or process) before another
draw began, that draw returns more than ``t``. Spare timestamps are discarded, never
cached (a local block of timestamps would break that rule: docs/timestamps.md).

A request counts as out until its block has been handed to all of its callers. The
hand-out is a chain: the caller that sent the request wakes the second caller of its
batch, which wakes the third, and so on; the last one wakes the first queued caller,
which sends the next request for everybody queued by then. So each sleeping thread is
woken exactly once and by one thread (no herd fighting for the GIL), and a caller that
was just served and calls again at once joins the next request instead of being sent
alone ahead of the callers still being woken: with T threads calling in a loop,
requests carry T callers, not T/2.

Used by the oracle client (one RPC per request) and by
:class:`~percolator._timestamps.StoreTimestamps` (one increment of the store's counter).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable

from percolator import _forks

__all__ = ["BatchedDraws"]


class _Waiter:
    """One draw: what it asked for, what it got, the lock it sleeps on."""

    __slots__ = ("count", "drive", "error", "first", "next", "wake")

    def __init__(self, count: int) -> None:
        self.count = count
        self.first = -1
        self.error: BaseException | None = None
        self.drive = False  # woken to send the next request rather than with a result
        self.next: _Waiter | None = None  # the caller of the same request to wake after this one
        self.wake = threading.Lock()  # held until this caller is woken
        self.wake.acquire()


class BatchedDraws:
    """Draws of consecutive timestamps, concurrent ones sent as one request.

    :param send: sends one request for *n* timestamps and returns the first of them
        (the block is ``[first, first + n)``); raises what the request raised.
    :param max_count: the most timestamps one request may ask for.
    :param interrupted: the error given to the other callers of a request whose sender
        was interrupted (``KeyboardInterrupt``), from what interrupted it.
    """

    def __init__(
        self,
        send: Callable[[int], int],
        max_count: int,
        interrupted: Callable[[BaseException], BaseException],
    ) -> None:
        self._send = send
        self._max_count = max_count
        self._interrupted = interrupted
        self._lock = threading.Lock()  # guards _pending, _busy, _closed
        self._pending: deque[_Waiter] = deque()
        # A request is out, or its block is still being handed out: callers queue.
        self._busy = False
        self._closed: BaseException | None = None
        self._generation = _forks.generation

    def draw(self, n: int) -> range:
        """*n* consecutive timestamps from a request sent after this call began.

        Once closed, it raises the error :meth:`close` was given; a request that
        failed raises its error in every caller it served.
        """
        w = _Waiter(n)
        with self._lock:
            if self._closed is not None:
                raise self._closed
            if self._generation != _forks.generation:
                # A forked child: the parent's callers are not here to hand on.
                self._pending.clear()
                self._busy = False
                self._generation = _forks.generation
            self._pending.append(w)
            drive = not self._busy
            self._busy = True
        interrupted: BaseException | None = None
        if not drive:
            interrupted = self._sleep(w)
            drive = w.drive
        if drive:
            self._drive()  # w is first in the queue, so first in the batch it sends
        self._hand_on(w)
        if interrupted is not None:
            raise interrupted
        if w.error is not None:
            raise w.error
        return range(w.first, w.first + w.count)

    def close(self, error: BaseException) -> None:
        """Later draws raise *error*."""
        with self._lock:
            self._closed = error

    @staticmethod
    def _sleep(w: _Waiter) -> BaseException | None:
        """Wait until *w* is woken; returns an exception that interrupted the wait, if any.

        Other callers depend on this one to pass the block or the next request on, so an
        interruption (KeyboardInterrupt in the main thread) is raised only after that.
        """
        interrupted: BaseException | None = None
        while True:
            try:
                w.wake.acquire()
                return interrupted
            except BaseException as e:  # rare: keep waiting, raise it afterwards
                interrupted = interrupted or e

    def _drive(self) -> None:
        """Send one request for the callers queued now and give each its range (or the
        error). The first of them is the calling thread; :meth:`_hand_on` then wakes the
        others."""
        batch: list[_Waiter] = []
        total = 0
        with self._lock:
            while self._pending and total + self._pending[0].count <= self._max_count:
                w = self._pending.popleft()
                batch.append(w)
                total += w.count
        try:
            first = self._send(total)
            for w in batch:
                w.first = first
                first += w.count
        except Exception as e:
            for w in batch:
                w.error = e
        except BaseException as e:  # KeyboardInterrupt in the sending thread: its own
            batch[0].error = e
            for w in batch[1:]:
                w.error = self._interrupted(e)
        for a, b in itertools.pairwise(batch):
            a.next = b

    def _hand_on(self, w: _Waiter) -> None:
        """*w* has its result: wake the next caller of its batch, or after the last one,
        the first queued caller to send the next request (or mark the batcher idle)."""
        nxt = w.next
        if nxt is not None:
            nxt.wake.release()
            return
        with self._lock:
            if self._pending:
                d = self._pending[0]
                d.drive = True
                d.wake.release()
            else:
                self._busy = False
