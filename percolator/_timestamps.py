"""Timestamp sources: where start and commit timestamps come from.

Snapshot isolation needs timestamps that are unique and increase in real time
across every process: a timestamp drawn after another was returned (anywhere) is
larger. (On the embedded store a draw made while a one-phase commit is running may
be below that commit's timestamp, which nobody outside the commit has seen yet; see
:class:`HostTimestamps`.) Three sources satisfy :class:`TimestampSource`:

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
import importlib
import mmap
import os
import struct
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from percolator import _forks
from percolator._batching import BatchedDraws
from percolator._encoding import META_FAMILIES, META_TABLE
from percolator._errors import InvalidArgument, OracleUnavailable, StoreUnavailable
from percolator._presence import MARK_SIZE, Presence
from percolator._store import INCREMENT, Read, Store, offered

__all__ = [
    "ORACLES", "SPARE_MAX_AGE", "HostTimestamps", "NextStart", "SpareStarts", "StoreTimestamps",
    "TimestampSource", "open_oracle",
]

_ROW = b"timestamps"
_CEILING = "m:ceiling"
_IDENTITY = "m:identity"
_U64 = struct.Struct(">Q")
_monotonic = time.monotonic
MAX_BATCH = 10_000_000


class TimestampSource(Protocol):
    """Where a cluster draws its timestamps: strictly increasing across every client of
    the store, each drawn one above any commit timestamp already visible
    (:class:`StoreTimestamps`, :class:`HostTimestamps`, the oracle's client)."""

    def get_timestamp(self) -> int:
        """One new timestamp."""
        ...

    def get_timestamps(self, n: int) -> range:
        """*n* new consecutive timestamps, in one draw."""
        ...

    def close(self) -> None:
        """Release what the source holds (connections, files)."""
        ...


SPARE_MAX_AGE = 1.0
"""Seconds a spare start timestamp (:class:`SpareStarts`) stays usable: the older it
is, the more commits since it a transaction starting at it conflicts with."""


@dataclass(slots=True)
class NextStart:
    """A start timestamp a two-phase commit drew with its commit timestamp (one above
    it, in the same request) for the next transaction of its thread (0: none); see
    docs/timestamps.md, "A start timestamp drawn with the previous commit"."""

    ts: int = 0
    drawn: float = 0.0
    """``time.monotonic()`` when it was drawn."""
    generation: int = 0
    """``_forks.generation`` when it was drawn: a forked child must not use it too."""

    def fill(self, ts: int) -> None:
        """Hold *ts*, drawn now, for :meth:`take`."""
        # ts last: a transaction handed to another thread may commit there while its
        # own thread takes, which reads ts first.
        self.drawn, self.generation = time.monotonic(), _forks.generation
        self.ts = ts

    def take(self, below: int) -> int:
        """The held timestamp, once (0: none, or one that is stale, from before a fork,
        or under *below*, the cached safe point)."""
        ts, self.ts = self.ts, 0
        if (not ts or ts < below or self.generation != _forks.generation
                or time.monotonic() - self.drawn > SPARE_MAX_AGE):
            return 0
        return ts


class SpareStarts(threading.local):
    """Per thread, the :class:`NextStart` of a cluster's user transactions: each
    two-phase commit leaves one, and the thread's next transaction starts at it if it
    reads nothing (``Transaction``, percolator/_transaction.py)."""

    def __init__(self) -> None:
        self.next = NextStart()


ORACLES: dict[str, str] = {
    "grpc": "oracle:OracleClient",
    "grpcs": "oracle:OracleClient",
    "zk": "oracle:OracleClient",
}
"""Oracle target scheme -> ``module:callable`` that makes its client (a
:class:`TimestampSource`), imported only when a target of the scheme is used: found
the way :data:`percolator.stores.BACKENDS` finds store backends, so that the
transaction library does not import the oracle package (whose gRPC it does not need
otherwise)."""


def open_oracle(target: str, **options: Any) -> TimestampSource:
    """The client of the timestamp oracle at *target* (``grpc://``, ``grpcs://`` or
    ``zk://``), made with *options* by the entry of :data:`ORACLES` for its scheme.

    :raises InvalidArgument: *target* is not a str or its scheme has no entry.
    :raises OracleUnavailable: the client's packages (the ``oracle`` extra) are missing."""
    if not isinstance(target, str):
        raise InvalidArgument(f"oracle target must be a str, got {type(target).__name__}: "
                              f"{target!r}")
    scheme = target.partition("://")[0]
    entry = ORACLES.get(scheme)
    if entry is None:
        raise InvalidArgument(
            f"oracle target {target!r} must look like "
            + ", ".join(f"'{s}://...'" for s in ORACLES)
        )
    module_name, _, name = entry.partition(":")
    try:
        make = getattr(importlib.import_module(module_name), name)
    except ImportError as e:
        raise OracleUnavailable(
            f"the timestamp oracle's client ({target!r}) needs grpcio, which is not "
            f"installed ({e}): pip install 'percolator-txn[oracle]'"
        ) from e
    client: TimestampSource = make(
        target, **options
    )
    return client


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
    """Each request advances the persisted counter (the ceiling cell: the next timestamp
    to hand out, 8-byte big-endian) by the number of timestamps taken: linearizable
    across hosts. With the store's atomic ``increment``
    (:class:`~percolator._store.Incrementing`) that is one round trip; otherwise a read
    and a compare-and-set, two. Both ways work on the same cell, so clients of either
    kind can share a store. Concurrent draws of the process share one request
    (:class:`~percolator._batching.BatchedDraws`, as the oracle client batches its
    RPCs): a draw is served only by a request sent after it began."""

    def __init__(self, store: Store) -> None:
        self._ceiling = _Ceiling(store)
        counter = offered(store, INCREMENT)
        self._increment: Callable[[str, bytes, str, int], int] | None = (
            counter.increment if counter is not None else None)
        self._draws = BatchedDraws(
            self._advance, MAX_BATCH,
            lambda e: StoreUnavailable(f"the timestamp request was interrupted: {e!r}"),
        )

    def get_timestamp(self) -> int:
        """One new timestamp (:meth:`get_timestamps`)."""
        return self.get_timestamps(1)[0]

    def get_timestamps(self, n: int) -> range:
        """*n* new consecutive timestamps, from the store's counter (draws of
        concurrent threads share one increment)."""
        return self._draws.draw(_check_count(n))

    def _advance(self, n: int) -> int:
        """Take *n* timestamps from the store's counter; the first of them."""
        while True:
            if self._increment is not None:
                end = self._increment(META_TABLE, _ROW, _CEILING, n)
                if end - n >= 1:  # an absent counter counts from 0; timestamps start at 1
                    return end - n
                continue
            current, raw = self._ceiling.read()
            if self._ceiling.advance(raw, current + n):
                return current

    def close(self) -> None:
        """Nothing to release: the store belongs to the cluster."""


def process_alive(pid: int) -> bool:
    """Whether process *pid* exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def boot_id() -> bytes:
    """This boot's id: a page cache written before another boot may have lost writes."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return uuid.UUID(f.read().strip().decode()).bytes
    except (OSError, ValueError):
        return b"\0" * 16


class _SidecarLock:
    """:meth:`HostTimestamps._locked`: the process's lock, then the sidecar's flock. One
    object per source, state in the source (a class: it is taken two to four times a
    transaction, and a generator context manager costs three times as much).

    **A process alone on the sidecar keeps its flock between sections** (no other
    process has the sidecar open: :class:`~percolator._presence.Presence`) once it
    takes :attr:`HostTimestamps.HOT` sections within a tick of :class:`_Releaser`, and
    a section then costs no system call. Correctness never rests on that answer, which a
    newcomer may make stale at once: whoever touches the sidecar holds its flock, as
    before. The newcomer's first section waits in ``flock`` until this process lets go:
    at the end of its next section (it sees the newcomer's mark), or within two ticks
    of :class:`_Releaser` when it has no section meanwhile (it is idle, or its thread
    waits in SQLite for the newcomer's write transaction).
    """

    __slots__ = ("_source",)

    def __init__(self, source: HostTimestamps) -> None:
        self._source = source

    def __enter__(self) -> None:
        source = self._source
        source._lock.acquire()
        try:
            if source._generation != _forks.generation:
                # A forked child shares the parent's open file, and with it the flock:
                # its own opening makes the two exclude each other again.
                source._open()
            if source._holding:
                source._sections += 1
            else:
                fcntl.flock(source._fd, fcntl.LOCK_EX)
        except BaseException:
            source._lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        source = self._source
        try:
            if source._holding:
                if source._presence.newcomer():
                    source._holding = False
                    fcntl.flock(source._fd, fcntl.LOCK_UN)
            else:
                # Kept only at a rate where it pays for the releaser's looks (each wakes
                # a thread, tens of microseconds): HOT sections within a tick.
                now = _monotonic()
                if now - source._window_began > _Releaser.TICK:
                    source._window_began, source._window_sections = now, 0
                source._window_sections += 1
                if (source._window_sections >= source.HOT
                        and not source._presence.others_present()):
                    source._holding = True
                    _RELEASER.watch(source)
                else:
                    fcntl.flock(source._fd, fcntl.LOCK_UN)
        finally:
            source._lock.release()


class _Releaser:
    """One thread per process that lets go of the sidecar flocks kept between sections
    (:class:`_SidecarLock`) once their source had no section for a tick, or saw a
    newcomer: a process's idle source must not keep a newcomer waiting."""

    TICK = 0.02
    """Seconds between looks: a newcomer waits up to two for an idle holder."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._wake = threading.Condition(threading.Lock())
        self._watched: dict[HostTimestamps, int] = {}  # source -> its sections last seen
        self._thread: threading.Thread | None = None

    def watch(self, source: HostTimestamps) -> None:
        """Let go of *source*'s flock once it is idle (the caller holds its lock)."""
        with self._wake:
            self._watched[source] = -1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="percolator-sidecar-releaser", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        wake = self._wake
        while True:
            with wake:
                while not self._watched:
                    wake.wait()
                wake.wait(self.TICK)
                watched = list(self._watched.items())
            for source, seen in watched:
                now = source._let_go_if_idle(seen)
                with wake:
                    if now is None:
                        self._watched.pop(source, None)
                    elif source in self._watched:
                        self._watched[source] = now


_RELEASER = _Releaser()


class _InFlight:
    """:meth:`HostTimestamps.in_flight` (a class, not a generator context manager: every
    one-phase commit enters one)."""

    __slots__ = ("_first", "_source", "_step")

    def __init__(self, source: HostTimestamps,
                 atomically: Callable[[], AbstractContextManager[object]]) -> None:
        self._source = source
        self._step = atomically()
        self._first = 0
        """The first commit timestamp drawn (0: none yet), published in the slot."""

    def __enter__(self) -> Callable[[int], range | None]:
        self._step.__enter__()
        return self.draw

    def draw(self, n: int = 1) -> range | None:
        source = self._source
        with source._sidecar_lock:
            source._validate()
            taken = source._take_commit(n, first=not self._first)
            if taken is None:
                return None
            if not self._first:
                self._first = taken[0]  # published in the slot by _take_commit
        return taken

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        first = self._first
        try:
            if first and exc_type is None:  # the body returned: the COMMIT comes next
                try:
                    self._source._close_gap()
                except BaseException as e:
                    if not self._step.__exit__(type(e), e, e.__traceback__):
                        raise
                    return
            self._step.__exit__(exc_type, exc, tb)
        finally:
            if first:
                source = self._source
                with source._sidecar_lock:
                    nxt, in_flight, _, resume = source._state()
                    if in_flight == first:
                        source._put_state(nxt, 0, 0, resume)


class HostTimestamps:
    """Timestamps shared by every process of one host (see the module docstring).

    The sidecar holds ``magic, boot id, store identity``, which copy of the state is in
    use, two copies of the state ``next, in-flight timestamp, in-flight pid, resume``
    (:meth:`_put_state`: a ``kill -9`` leaves one whole) and the presence mark of the
    processes that have it open. A sidecar from an earlier boot (its page cache may
    have lost writes), of another store or of an older format is reset to the persisted
    ceiling, which is at or above every issued timestamp.

    **Start timestamps do not wait for a commit's critical section.** The embedded
    store's one-phase commit (:func:`percolator._one_phase._commit_one_phase`) writes no
    lock: it draws its commit timestamp inside SQLite's write transaction
    (:meth:`in_flight`), ``GAP`` above the next timestamp, and publishes it in the
    sidecar as *in flight* until its COMMIT has returned. SQLite has one writer at a
    time, so at most one commit is in flight per store file, and one slot holds it. A
    draw takes the sidecar lock only to count, and reads the slot with it: during a
    commit it takes its timestamps from the gap below that commit (above every visible
    commit, below the one in flight: no waiting), and only once the gap is used up
    does it take them above the commit and return once the commit is visible (its
    writes and COMMIT, not its conflict checks, which come before its draw). Either
    way the snapshot of a new start timestamp holds every commit below it. Two-phase
    commits draw their commit timestamp after their locks are written, and readers
    wait on those locks as Percolator does. docs/timestamps.md has the whole argument.
    """

    _MAGIC = b"PCTS0004"
    _HEADER = struct.Struct(">8s16s16s")
    _IN_USE_AT = _HEADER.size  # one byte: which of the two copies of the state is in use
    _STATE = struct.Struct(">QQQQ")
    """The state: ``next`` (the next timestamp to hand out to a draw), the in-flight
    slot (timestamp, pid) and ``resume`` (one above every commit timestamp drawn in
    flight). Two copies: see :meth:`_put_state`."""
    _COPIES_AT = _IN_USE_AT + 8
    _PRESENCE_AT = _COPIES_AT + 2 * _STATE.size  # who has the sidecar open (Presence)
    _SIZE = _PRESENCE_AT + MARK_SIZE
    _map: mmap.mmap
    _presence: Presence
    BLOCK = 1 << 24
    REFILL = BLOCK // 2
    """Room left in the persisted block below which a draw outside a commit persists a
    new ceiling, so that a commit's draw (which must not write the store) finds room."""
    GAP = 1024
    """Timestamps a one-phase commit leaves below its own, for the start timestamps
    drawn while it is in flight: those are below every timestamp of the commit, so
    they need not wait for it to be visible (docs/timestamps.md)."""
    HOT = 64
    """Sections within a tick of :class:`_Releaser` from which a process alone on the
    sidecar keeps its flock between them (below that rate the releaser's looks would
    cost more than the system calls they save)."""
    IN_FLIGHT_DEADLINE = 60.0
    """Seconds a draw waits for an in-flight commit (its process stopped, say) before
    giving up with :class:`~percolator.StoreUnavailable`."""

    def __init__(self, store: Store, sidecar_path: str) -> None:
        self._ceiling = _Ceiling(store)
        self._identity = self._ceiling.identity()
        self._boot = boot_id()
        self._lock = threading.Lock()
        self._known_ceiling = 0
        self._sidecar_lock = _SidecarLock(self)
        self._header = self._HEADER.pack(self._MAGIC, self._boot, self._identity)
        self.path = sidecar_path
        self._fd = -1
        self._open()

    def _open(self) -> None:
        """Open the sidecar (again, in a forked child: the parent's descriptors are
        closed here, not unlocked, so that the parent's flock ends with the parent)."""
        if self._fd >= 0:
            self._presence.forget()
            self._map.close()
            os.close(self._fd)
            self._fd = -1
        self._holding = False
        """Whether this process keeps the flock between sections (:class:`_SidecarLock`)."""
        self._sections = 0
        self._window_began, self._window_sections = float("-inf"), 0
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size < self._SIZE:
                    os.ftruncate(fd, self._SIZE)
                self._map = mmap.mmap(fd, self._SIZE)
            except BaseException:
                os.close(fd)
                raise
        except OSError as e:
            raise StoreUnavailable(f"cannot open timestamp file {self.path!r}: {e}") from e
        self._fd = fd
        self._presence = Presence(fd, self._map, self._PRESENCE_AT)
        self._generation = _forks.generation

    def _let_go_if_idle(self, seen: int) -> int | None:
        """For :class:`_Releaser`: let go of the flock kept between sections if no
        section began since the count *seen*, or a newcomer came; None once let go (or
        not kept), else the count now."""
        if not self._lock.acquire(blocking=False):
            return -1  # a section runs now: not idle
        try:
            if not self._holding:
                return None
            if self._sections != seen and not self._presence.newcomer():
                return self._sections
            self._holding = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            return None
        finally:
            self._lock.release()

    def _locked(self) -> _SidecarLock:
        """``with self._locked():`` this process's lock, then the sidecar's flock."""
        return self._sidecar_lock

    def get_timestamp(self) -> int:
        """One new timestamp from this host's block (:meth:`get_timestamps`)."""
        return self._draw(1)[0]  # every transaction's start: no count to check

    def get_timestamps(self, n: int) -> range:
        """*n* new consecutive timestamps from the block this host holds (persisted
        ahead in the store; the sidecar lock shares it among the host's processes)."""
        return self._draw(_check_count(n))

    def _draw(self, n: int) -> range:
        """Take *n* timestamps: below the commit in flight when its gap has room for
        them, else above every timestamp drawn so far (then, above a commit in flight,
        return once it is visible). Every transaction's start, so :meth:`_state` and
        :meth:`_put_state` are spelled out here."""
        copies, size = self._COPIES_AT, self._STATE.size
        while True:
            with self._sidecar_lock:
                mapped = self._map
                if mapped[: self._HEADER.size] != self._header:
                    self._validate()
                in_use = mapped[self._IN_USE_AT] & 1
                nxt, in_flight, pid, resume = self._STATE.unpack_from(
                    mapped, copies + size * in_use)
                start = nxt if in_flight and nxt + n <= in_flight else max(nxt, resume)
                stop = start + n
                if self._room(stop):
                    self._STATE.pack_into(mapped, copies + size * (in_use ^ 1),
                                          stop, in_flight, pid, resume)
                    mapped[self._IN_USE_AT] = in_use ^ 1
                    taken: range | None = range(start, stop)
                else:
                    taken = None
                low = self._known_ceiling - stop < self.REFILL
            if taken is None or low:
                self._refill(n)
            if taken is not None:
                break
        if in_flight and stop > in_flight:
            # Above a commit in flight (its gap was used up): wait until it is visible.
            self._wait_visible(in_flight, pid)
        return taken

    def _state(self) -> tuple[int, int, int, int]:
        """``(next, in-flight timestamp, in-flight pid, resume)``, from the copy in use
        (the caller holds both locks)."""
        mapped = self._map
        return self._STATE.unpack_from(  # type: ignore[return-value]
            mapped, self._COPIES_AT + self._STATE.size * (mapped[self._IN_USE_AT] & 1))

    def _put_state(self, nxt: int, in_flight: int, pid: int, resume: int) -> None:
        """Write the state so that a process killed at any instant leaves a whole one
        (the caller holds both locks): into the copy not in use, then one byte puts it
        in use. Written in place, a ``kill -9`` between ``struct.pack_into``'s zeroing
        of the bytes and its writing of them left ``next`` at 0, and the next process
        handed out every timestamp again."""
        mapped = self._map
        spare = (mapped[self._IN_USE_AT] & 1) ^ 1
        self._STATE.pack_into(mapped, self._COPIES_AT + self._STATE.size * spare,
                              nxt, in_flight, pid, resume)
        mapped[self._IN_USE_AT] = spare

    def _slot(self) -> tuple[int, int]:
        _, in_flight, pid, _ = self._state()
        return in_flight, pid

    def _set_slot(self, ts: int, pid: int) -> None:
        nxt, _, _, resume = self._state()
        self._put_state(nxt, ts, pid, resume)

    def _validate(self) -> None:
        """Reset a sidecar of an earlier boot or of another store to the persisted
        ceiling (the caller holds both locks). The header goes last: a process killed
        before it is whole leaves a sidecar the next one resets again."""
        mapped = self._map
        if mapped[: self._HEADER.size] != self._header:
            self._known_ceiling = self._ceiling.read()[0]
            self._STATE.pack_into(mapped, self._COPIES_AT, self._known_ceiling, 0, 0, 0)
            mapped[self._IN_USE_AT] = 0
            mapped[: self._HEADER.size] = self._header

    def _room(self, end: int) -> bool:
        """Whether timestamps below *end* are below the persisted ceiling. Never writes
        the store: a commit draws inside its write transaction, and a writer waiting
        for the store while holding the sidecar lock would deadlock with it."""
        if end > self._known_ceiling - self.REFILL:  # another process may have raised it
            self._known_ceiling = self._ceiling.read()[0]
        return end <= self._known_ceiling

    def _take_commit(self, n: int, first: bool) -> range | None:
        """*n* one-phase commit timestamps (the caller holds both locks and has
        validated the sidecar). The first draw of a commit (or group) leaves ``GAP``
        timestamps below them for the draws made while it is in flight, and publishes
        the first of them in the slot; a next one follows them. None when the
        persisted block has no room."""
        nxt, in_flight, pid, resume = self._state()
        if first:
            # No commit is in flight now (SQLite's single writer), so every earlier
            # one is visible: draws from here on are above all of them.
            nxt = max(nxt, resume)
            start = nxt + self.GAP
            in_flight, pid = start, _forks.pid
        else:
            start = resume
        if not self._room(start + n):
            return None
        self._put_state(nxt, in_flight, pid, start + n)
        return range(start, start + n)

    def _counters(self) -> tuple[int, int]:
        """``(next, resume)``: the next timestamp for a draw, and one above every commit
        timestamp drawn in flight."""
        nxt, _, _, resume = self._state()
        return nxt, resume

    def _refill(self, n: int) -> None:
        """Persist a ceiling a block above what is taken (outside the sidecar lock; two
        processes refilling at once only leave a gap)."""
        with self._locked():
            nxt = max(self._counters())
        self._known_ceiling = self._ceiling.raise_to_at_least(
            max(nxt + n + self.GAP, self._known_ceiling) + self.BLOCK)

    def _wait_visible(self, ts: int, pid: int) -> None:
        """Return once the commit at *ts* is no longer in flight: it cleared the slot,
        a later commit took it (SQLite's single writer: this one had committed), or its
        process died (SQLite rolled back whatever it had not committed)."""
        deadline = time.monotonic() + self.IN_FLIGHT_DEADLINE
        pause = 0.0
        while True:
            time.sleep(pause)
            with self._locked():
                if self._slot()[0] != ts:
                    return
                if pid != _forks.pid and not process_alive(pid):
                    self._set_slot(0, 0)
                    return
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"a commit at timestamp {ts} (process {pid}) has been in flight for "
                    f"{self.IN_FLIGHT_DEADLINE:.0f} s; is that process stopped?")
            pause = min(0.001, pause * 2 or 0.00005)

    def in_flight(
        self, atomically: Callable[[], AbstractContextManager[object]]
    ) -> AbstractContextManager[Callable[[int], range | None]]:
        """For one-phase commits: enters the store's write transaction (*atomically*)
        and yields a function that draws *n* commit timestamps inside it (a group
        sharing it draws one for each member). The first one drawn is published as in
        flight until this block ends, after the COMMIT: every later one is above it,
        so a start timestamp above any of them waits for the whole group.

        The gap left below the first one serves the draws made while the commit cannot
        be seen: it is closed (``next`` raised to ``resume``) just before the COMMIT.
        From the COMMIT on, anybody may read the commit's cells (a worker's scan of the
        notify family reads them raw), and a draw made after such a read must be above
        the commit, so from then on every draw waits for the commit instead.

        The draw writes nothing to the store; it returns None when the persisted block
        has no room (the commit then takes the two-phase path, whose draw persists
        room)."""
        return _InFlight(self, atomically)

    def _close_gap(self) -> None:
        """Hand out no more timestamps from the gap below the commit in flight: the
        next draws come from ``resume``, above it, and wait until it is visible."""
        with self._sidecar_lock:
            nxt, in_flight, pid, resume = self._state()
            if resume > nxt:
                self._put_state(resume, in_flight, pid, resume)

    def close(self) -> None:
        """Close the sidecar file (its lock released, this process no longer present)."""
        with self._lock:
            if self._fd >= 0:
                if self._holding and self._generation == _forks.generation:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                self._holding = False
                self._presence.forget()
                self._map.close()
                os.close(self._fd)
                self._fd = -1
