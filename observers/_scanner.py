"""The scanner: the scanner threads of a :class:`~observers.Worker` find dirty rows
(the notify family, or the notification index) from random places, spread out when
they meet (Percolator §2.4), sleep when idle and are woken by a lookout thread or a
local commit. A row found is handed to the :class:`~observers._runner.Runner` with
the notify cells the scan read; the scanner settles the index entries of the rows it
served. A scanner meets another when a row's advisory lock is taken, when its batch
lists a row served lately in this process (:meth:`Runner.served_lately`), or when a
run finds its notification served already (by another process's scanner, whose
advisory locks this one may not see): it leaves the rest of its batch and scans on
from past it, a random stretch further."""

from __future__ import annotations

import collections
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from observers._runner import GROUP_MAX, Group, Indexed, Ran, Runner
from observers._store_turn import StoreTurn
from percolator import Cluster, PercolatorError
from percolator.ext import (
    NOTIFY,
    SPLIT_KEYS,
    Read,
    RowCells,
    internals,
    offered,
    scan_index,
    settle,
    settle_rows,
    uses_index,
)
from percolator.metrics import observe as _observe

__all__ = ["Bell", "Handed", "Scanner", "Served", "Spread"]

log = logging.getLogger("observers")

SAMPLE = 4096
"""Rows of each table a worker remembers, to start passes at."""
SAMPLE_READ = 1024
"""Rows of the notify family a worker reads to start at, before it has seen any, on
a store that reports no split keys (one HBase region, the embedded store): its
scanners, and those of workers started with it, then start all over the first of
them, where they all began at the first row."""
SCAN_BATCH = 64
"""Rows a family pass reads per scan of the notify family. It serves them, then scans
again after the last one: a fresh read, without the rows other scanners served
meanwhile, where one scan's batches of 128 went stale while their rows were served
(2-3 s each on HBase) and a scanner behind another ran its rows again to find them
served (absent runs: a timestamp and a read each). One scan call per 64 rows, 0.016
per notification."""
SPLITS_REFRESH = 60.0
"""Seconds between two questions to the store for a table's split keys."""
SETTLE_MAX = 256
"""Processed rows whose notification index entries a scanner settles together: two
store calls (a deletion and a re-check read) per batch, 0.008 per notification at 256
where 32 cost 0.06 (BENCHMARKS.md, issue 37). Kept well below ``SERVED_MAX`` / the
scanner threads, so that a batch's entries are still remembered as served when it is
settled. A larger batch leaves served entries longer in the index (a superset of the
pending notifications): a scanner of another worker process that meets one makes a
run that finds nothing (a read, counted as an ``absent`` run; its start timestamp and
its entry's settling go with the scanner's next run and batch), and a crash leaves
them to a later look."""
SERVED_MAX = 8192
"""Index entries a worker remembers having served (:class:`Served`)."""
HANDOFF_MAX = 64
"""New pending rows a lookout's look may hand to sleeping scanners, one row each
(:meth:`Scanner.lookout_thread`); more wake every scanner for passes of their own (a
burst: the passes' batches serve it for fewer calls)."""
SETTLE_DELAY = 1.0
"""Seconds the index entries of rows served from a lookout's hand-off may wait to be
settled together (at most ``SETTLE_MAX`` rows): at a trickle each such row is served
alone, and settling each alone cost a deletion and a re-check read per notification.
Meanwhile the entries stay in the index, where this worker's lookout and scanners know
them as served (:class:`Served`)."""


def _first_rows(scan: Iterator[tuple[bytes, RowCells]],
                count: int) -> list[tuple[bytes, RowCells]]:
    """The first *count* rows of *scan*, which is then closed (an HBase scanner is let go
    of at once, not when the iterator is collected)."""
    try:
        return list(itertools.islice(scan, count))
    finally:
        close = getattr(scan, "close", None)
        if close is not None:
            close()


class Served:
    """Index entries ``(table, row, column, ts)`` of rows this worker's scanners ran:
    settled, or to be settled with their scanner's batch. Another scanner that meets
    one (in a batch of the index it read before, or before the settling) skips the
    row: running it again would cost a timestamp and two reads to find nothing. An
    entry names one write of the index (a notification still pending at the settling
    gets a new entry, at a new timestamp), so skipping it never skips new work; a
    batch whose settling failed is forgotten, for a later look to settle."""

    def __init__(self, limit: int = SERVED_MAX) -> None:
        self._limit = limit
        self._entries: dict[tuple[str, bytes, str, int], None] = {}
        self._lock = threading.Lock()

    def holds(self, table: str, row: bytes, entries: dict[str, int]) -> bool:
        """Whether every one of the row's *entries* was served here."""
        with self._lock:
            return all((table, row, c, ts) in self._entries for c, ts in entries.items())

    def add(self, table: str, row: bytes, entries: dict[str, int]) -> None:
        with self._lock:
            for column, ts in entries.items():
                self._entries[(table, row, column, ts)] = None
            while len(self._entries) > self._limit:  # the oldest go first
                del self._entries[next(iter(self._entries))]

    def forget(self, processed: list[tuple[str, bytes, dict[str, int]]]) -> None:
        with self._lock:
            for table, row, entries in processed:
                for column, ts in entries.items():
                    self._entries.pop((table, row, column, ts), None)


class Spread:
    """The anti-clumping state of one scan pass (Percolator §2.4): a scanner that meets
    another on a row skips a random stretch ahead; after a few meetings it ends the
    pass, so that the next one starts at a new random place. (A family pass meets
    another on a row whose advisory lock is held, or that was served since its scan,
    and skips from past its batch: :meth:`Scanner._table_pass_rows`.)"""

    def __init__(self, threads: int, held: int = 1) -> None:
        self.threads = threads
        self.held = held  # rows another scanner may hold at once (a group: GROUP_MAX)
        self.skip = 0
        self.meetings = 0

    def skipping(self) -> bool:
        """Whether to pass this row by (inside a stretch being skipped)."""
        if self.skip:
            self.skip -= 1
            return True
        return False

    def met(self) -> bool:
        """Another scanner holds the row: True when the pass should end."""
        self.meetings += 1
        if self.meetings >= 4:
            return True
        self.skip = random.randint(self.held, self.held + 16 * self.threads)
        return False


Handed = tuple[str, bytes, dict[str, int], float]
"""A pending row a lookout hands to a scanner: ``(table, row, {column: newest ts},
time.monotonic() when the look began)``."""


class Bell:
    """Wakes sleeping scanners: a counter of rings (every scanner wakes for a pass of
    its own) and rows handed over (one scanner wakes per row, and serves it without a
    pass), with a condition to wait on both."""

    def __init__(self) -> None:
        self.rung = 0
        self._handed: collections.deque[Handed] = collections.deque()
        self._cond = threading.Condition()

    def set(self) -> None:
        with self._cond:
            self.rung += 1
            self._cond.notify_all()

    def hand(self, rows: list[Handed]) -> None:
        """Hand *rows* over, waking one sleeping scanner per row."""
        with self._cond:
            self._handed.extend(rows)
            self._cond.notify(len(rows))

    def take(self) -> Handed | None:
        """A row handed over and not taken yet, if any."""
        with self._cond:
            return self._handed.popleft() if self._handed else None

    def wait(self, seen: int, timeout: float) -> bool:
        """Wait up to *timeout* seconds for a ring after the count *seen* or a row
        handed over; True if one came."""
        with self._cond:
            return self._cond.wait_for(lambda: self.rung != seen or bool(self._handed),
                                       timeout)


class Scanner:
    """The scanner and lookout threads of a :class:`~observers.Worker` (the worker
    starts them on :meth:`scanner_thread` and :meth:`lookout_thread`): they find the
    rows to serve in the tables of *columns* (table: its observed columns) and hand
    them to *runner*. *threads* is how many scanner threads run (the anti-clumping
    skips scale with it); *idle_max* and *poll_interval* are the worker's; *count*
    adds to its stats; *stop* is set when it stops; *store_turn* (on a single-writer
    store with several scanners) is taken around each pass and each row served."""

    def __init__(
        self,
        cluster: Cluster,
        runner: Runner,
        columns: dict[str, tuple[str, ...]],
        *,
        threads: int,
        idle_max: float,
        poll_interval: float,
        count: Callable[..., None],
        stop: threading.Event,
        store_turn: StoreTurn | None,
    ) -> None:
        self.cluster = cluster
        self.runner = runner
        self.columns = columns
        self.threads = threads
        self.idle_max = idle_max
        self.poll_interval = poll_interval
        self._count = count
        self._stop = stop
        self._store_turn = store_turn
        self.bell = Bell()
        self._sample: dict[str, list[bytes]] = {t: [] for t in columns}
        self._splits: dict[str, tuple[float, list[bytes]]] = {}
        self._sampled: dict[str, float] = {}  # table: when its sample was last read
        self._sleeping = 0  # scanner threads asleep (the lookout looks meanwhile)
        self._sleeping_lock = threading.Lock()
        self._indexed = uses_index(internals(cluster).store)
        self._served = Served()
        self._passed_at = 0.0  # when a scanner of the worker last began a pass
        # served hand-offs' rows whose entries wait to be settled
        self._unsettled: list[tuple[str, bytes, dict[str, int]]] = []
        self._unsettled_since = 0.0
        self._unsettled_lock = threading.Lock()

    def remember(self, table: str, row: bytes) -> None:
        sample = self._sample[table]
        if len(sample) < SAMPLE:
            sample.append(row)
        else:
            sample[random.randrange(SAMPLE)] = row

    def random_start(self, table: str) -> bytes | None:
        """Where a pass over *table* begins: half the time (always, before any row is
        seen) a random tablet or region boundary where the store tells them (Percolator
        §2.4: scanners start at random tablets), else a random row seen before."""
        splits = self._split_keys(table)
        sample = self._sample[table]
        if splits and (not sample or random.random() < 0.5):
            self._count("split_starts")
            return random.choice(splits)
        try:
            return random.choice(sample) if sample else None
        except IndexError:
            return None

    def _split_keys(self, table: str) -> list[bytes]:
        """The store's split keys of *table* (``split_keys``: Bigtable's SampleRowKeys,
        HBase's region start keys), asked again at most every SPLITS_REFRESH seconds."""
        splitting = offered(internals(self.cluster).store, SPLIT_KEYS)
        if splitting is None:
            return []
        asked, keys = self._splits.get(table, (None, []))
        now = time.monotonic()
        if asked is None or now - asked > SPLITS_REFRESH:
            self._splits[table] = (now, keys)  # one asker at a time, the others go on
            try:
                keys = list(splitting.split_keys(table))
            except PercolatorError as e:
                log.debug("split keys of %s unknown (%s)", table, e)
            self._splits[table] = (now, keys)
        return keys

    def scanner_thread(self) -> None:
        """A scanner thread's life: passes, rows handed over, sleep; until *stop*."""
        pass_due = True  # a first pass, then one per ring, or when idle long enough
        while not self._stop.is_set():
            rung = self.bell.rung
            handed = self.bell.take()
            if handed is not None:
                turn = self._store_turn
                if turn is not None and not turn.take(self._stop):
                    break  # stopping
                try:
                    self.serve_handed(*handed)
                except PercolatorError:
                    log.warning("handed row failed; a later pass retries it", exc_info=True)
                except Exception:
                    log.exception("scanner error on a handed row")
                finally:
                    if turn is not None:
                        turn.give()
                continue
            worked = False
            if pass_due:
                self._passed_at = time.monotonic()
                try:
                    began = time.perf_counter()
                    turn = self._store_turn
                    if turn is not None and not turn.take(self._stop):
                        break  # stopping
                    try:
                        worked = self.scan_pass()
                    finally:
                        if turn is not None:
                            turn.give()
                    _observe("percolator_notification_scan_duration_seconds",
                             time.perf_counter() - began)
                except PercolatorError:
                    log.warning("scan failed; backing off", exc_info=True)
                except Exception:
                    log.exception("scanner error; backing off")
                self._count("passes")
                if worked:
                    continue
            # Nothing to do: sleep long (the lookout or a local commit rings when work
            # arrives, or hands a row over), but be back when a failed notification
            # may be tried again.
            self._count("idle")
            wait = random.uniform(self.idle_max / 2, self.idle_max)
            due = self.runner.backoff.next_due()
            if due is not None:
                wait = min(wait, max(due - time.monotonic(), 0.0) + 0.001)
            with self._sleeping_lock:
                self._sleeping += 1
            try:
                woken = self.bell.wait(rung, wait)
            finally:
                with self._sleeping_lock:
                    self._sleeping -= 1
            # A ring asks every scanner for a pass; a row handed over is served alone.
            # Waking without either, a scanner passes if a failure is due or no other
            # scanner of the worker passed for half of idle_max: the lookout finds new
            # work, so the scanners' timed passes only look for what it left (a row
            # handed over that a scanner could not serve), and one of them does.
            now = time.monotonic()
            pass_due = (self.bell.rung != rung if woken else
                        (due is not None and due <= now)
                        or now - self._passed_at >= self.idle_max / 2)

    def serve_handed(self, table: str, row: bytes, entries: dict[str, int],
                      looked: float) -> None:
        """Serve one row a lookout handed over, as a pass would serve it (advisory lock,
        back-off of failures), without a pass. The run reads the notification in its
        own first read (:meth:`serve_indexed`: the lookout read only the newest
        version). It begins at the start its thread's previous commit drew only if that
        was drawn after the look began (*looked*): one drawn before is most likely
        below the notification, which the run would find above its snapshot and leave.
        A run that does (a start drawn before the notifying commit's, whose index entry
        the look read before its commit point) runs again at a fresh start. On the
        index the row's entries join the worker's batch settled within SETTLE_DELAY
        (:meth:`_defer_settling`)."""
        key = f"{table}/{row.hex()}"
        coordination = internals(self.cluster).coordination
        if self._indexed and self._served.holds(table, row, entries):
            return
        if not coordination.try_advisory_lock(key):
            self._count("meetings")
            return
        try:
            if self.runner.backoff.all_waiting(table, row, entries):
                return
            held = self.runner.next_start()
            if held.drawn < looked:
                held.ts = 0
            for _ in range(2):
                done = self.serve_indexed(table, row, entries)
                if done is not Indexed.LATER:
                    break
                held.ts = 0  # a LATER run leaves none; a fresh start for the next
            if not self._indexed:
                return  # served runs deleted their notify cells
            if done is Indexed.WORKED or done is Indexed.SERVED:
                self._served.add(table, row, entries)
                self._defer_settling(table, row, entries)
            elif done is Indexed.UNSETTLED:
                settle(internals(self.cluster), table, row, entries)
        finally:
            coordination.release_advisory_lock(key)

    def _defer_settling(self, table: str, row: bytes, entries: dict[str, int]) -> None:
        with self._unsettled_lock:
            if not self._unsettled:
                self._unsettled_since = time.monotonic()
            self._unsettled.append((table, row, entries))
        self.settle_deferred()

    def settle_deferred(self, force: bool = False) -> None:
        """Settle the entries of rows served from hand-offs together, once SETTLE_MAX
        of them wait or the first waited SETTLE_DELAY seconds (or now, with *force*)."""
        with self._unsettled_lock:
            if not self._unsettled or (not force and (
                    len(self._unsettled) < SETTLE_MAX
                    and time.monotonic() - self._unsettled_since < SETTLE_DELAY)):
                return
            batch, self._unsettled = self._unsettled, []
        try:
            settle_rows(internals(self.cluster), batch, look_first=False)
        except BaseException:
            self._served.forget(batch)  # left in the index for a later look to settle
            raise

    def lookout_thread(self) -> None:
        """Every ``poll_interval`` seconds while a scanner sleeps, read what is pending
        (O(pending notifications)). New rows (a notification the previous look did not
        see, not served here) are handed to the sleeping scanners, one scanner per row,
        which serve them without a pass of their own; more than HANDOFF_MAX of them
        ring every scanner for passes. Busy scanners need no lookout. It also settles
        the batch of served hand-offs when due (:meth:`settle_deferred`)."""
        seen: frozenset[tuple[str, bytes, str, int]] = frozenset()
        while not self._stop.wait(self.poll_interval):
            try:
                self.settle_deferred()
            except PercolatorError:
                log.debug("settling failed", exc_info=True)
            if not self._sleeping:
                seen = frozenset()  # look afresh once they sleep again
                continue
            seen = self.look(seen)

    def look(
        self, seen: frozenset[tuple[str, bytes, str, int]],
    ) -> frozenset[tuple[str, bytes, str, int]]:
        """One look of the lookout: read what is pending, hand the rows of
        notifications not in *seen* (the previous look's) and not served here over to
        the scanners, or ring them all when there are more than HANDOFF_MAX such rows.
        Returns what this look saw (*seen* again if it failed)."""
        looked = time.monotonic()
        try:
            found = frozenset(self.pending())
        except PercolatorError:
            log.debug("lookout failed", exc_info=True)
            return seen
        rows: dict[tuple[str, bytes], dict[str, int]] = {}
        for table, row, column, ts in found - seen:
            rows.setdefault((table, row), {})[column] = ts
        handed = [(table, row, entries, looked) for (table, row), entries in rows.items()
                  if not (self._indexed and self._served.holds(table, row, entries))]
        if handed:
            self._count("wakeups")
            if len(handed) > HANDOFF_MAX:
                self.bell.set()
            else:
                self.bell.hand(handed)
        return found

    def pending(self) -> Iterator[tuple[str, bytes, str, int]]:
        """``(table, row, column, newest notify or index timestamp)`` of the pending
        notifications of the observed columns."""
        if self._indexed:
            host = internals(self.cluster)
            for table, row, entries in scan_index(host, None, None, batch_size=1000):
                observed = self.columns.get(table, ())
                for column, ts in entries.items():
                    if column in observed:
                        yield table, row, column, ts
            return
        for table, columns in self.columns.items():
            for row, cells in internals(self.cluster).store.scan(table, None, None,
                                                      [Read(NOTIFY, columns)], batch_size=1000):
                for name, versions in cells.items():
                    yield table, row, name[len(NOTIFY) + 1 :], versions[0][0]

    def scan_pass(self) -> bool:
        """One pass over the index or the notify family; True if it did work."""
        if self._indexed:
            return self.index_pass()
        return self._family_pass()

    def index_pass(self) -> bool:
        """One pass over the notification index from a random place, wrapping around
        (anti-clumping as in :meth:`_family_pass`). The entries of rows it processed
        are settled together, up to ``SETTLE_MAX`` rows at a time and at the end of the
        pass (``settle_rows``: one deletion and one read per table for all of them,
        where each row took both), and so are those of rows whose run found the
        notification served already (absent: another worker's batch had not settled
        them yet); deleting first is safe as ever, the read after the deletion writing
        back the entry of a notification committed meanwhile. A row whose run met a
        notification above its snapshot keeps its entry untouched (the notification is
        pending), and so does a row whose run failed (:attr:`Indexed.KEPT`). An entry
        left a little longer, or left by a pass that failed, only costs a later look
        (the index is a superset of the pending notifications)."""
        processed: list[tuple[str, bytes, dict[str, int]]] = []
        try:
            worked = self._index_scan(processed)
            self._settle_processed(processed)
            self.settle_deferred(force=True)
        finally:
            self._served.forget(processed)  # left unsettled: a failed pass
            # A scanner that goes to sleep would wake with a stale snapshot, whose
            # runs would leave the newer notifications it came for: draw afresh.
            self.runner.next_start().ts = 0
        return worked

    def _settle_processed(self, processed: list[tuple[str, bytes, dict[str, int]]]) -> None:
        """Settle the index entries of the *processed* rows together, and clear it."""
        if processed:
            settle_rows(internals(self.cluster), processed, look_first=False)
            processed.clear()

    def _index_scan(self, processed: list[tuple[str, bytes, dict[str, int]]]) -> bool:
        """:meth:`_index_pass` but the last settling: the rows it processed and did not
        settle yet are left in *processed*."""
        start = b"%02x" % random.randrange(256)
        worked = False
        spread = Spread(self.threads)
        served = self._served
        for lo, hi in ((start, None), (None, start)):
            for table, row, entries in scan_index(internals(self.cluster), lo, hi):
                if self._stop.is_set():
                    return worked
                observed = self.columns.get(table, ())
                mine = {c: ts for c, ts in entries.items() if c in observed}
                if not mine or spread.skipping():
                    continue
                if served.holds(table, row, mine):
                    continue
                key = f"{table}/{row.hex()}"
                if not internals(self.cluster).coordination.try_advisory_lock(key):
                    if self._met(spread):
                        return True
                    continue
                try:
                    done = (Indexed.UNSETTLED
                            if self.runner.backoff.all_waiting(table, row, mine)
                            else self.serve_indexed(table, row, mine))
                    worked = worked or bool(done)
                    if done is Indexed.WORKED or done is Indexed.SERVED:
                        # An absent run's entry too: deleted with the batch, re-checked
                        # after the deletion as every entry is (settle_rows).
                        processed.append((table, row, mine))
                        served.add(table, row, mine)
                    elif done is Indexed.UNSETTLED:
                        settle(internals(self.cluster), table, row, mine)
                finally:
                    internals(self.cluster).coordination.release_advisory_lock(key)
                if len(processed) >= SETTLE_MAX:
                    self._settle_processed(processed)

        return worked

    def _family_pass(self) -> bool:
        """One pass over the observed tables in random order, each from a random row,
        wrapping around; it ends with the first table where it did work. Returns
        whether it did any. (A pass over one random table only, then sleep, left work
        in the other tables to the next wake-up: when observers watch several tables,
        as a pipeline's stages do, a woken scanner often looked in the wrong one.)"""
        tables = list(self.columns)
        random.shuffle(tables)
        return any(self._table_pass(table) for table in tables)

    def _table_pass(self, table: str) -> bool:
        """One pass over *table* from a random row, wrapping around. A scanner that
        finds another on its row skips a random stretch ahead; after a few such
        meetings in one pass it jumps to a new random place (a new pass), so scanners
        spread out instead of clumping."""
        group = Group() if self.runner.commits_in_groups() else None
        try:
            return self._table_pass_rows(table, group)
        finally:
            if group is not None:
                self.runner.flush(group)

    def _table_pass_rows(self, table: str, group: Group | None) -> bool:
        """The rows of :meth:`_table_pass`, read SCAN_BATCH at a time (each batch a
        scan of its own, from past the previous one), served by :meth:`_serve_batch`."""
        reads = [Read(NOTIFY, self.columns[table], versions=None)]
        store = internals(self.cluster).store
        if not self._sample[table] and not self._split_keys(table):
            self._read_sample(table, reads)
        start = self.random_start(table)
        ranges = [(start, None), (None, start)] if start is not None else [(None, None)]
        worked = False
        spread = Spread(self.threads, GROUP_MAX if group is not None else 1)
        for lo, hi in ranges:
            while True:
                asked = spread.skip + SCAN_BATCH
                batch = _first_rows(store.scan(table, lo, hi, reads, batch_size=asked), asked)
                if self._stop.is_set():
                    return worked
                served, ended = self._serve_batch(table, batch, group, spread)
                worked = worked or served
                if ended:
                    return True  # a new pass starts at a new random place
                if len(batch) < asked:
                    break  # the range is done
                lo = batch[-1][0] + b"\x00"  # the next row after the batch
                if hi is not None and lo >= hi:
                    break
        return worked

    def _serve_batch(self, table: str, batch: list[tuple[bytes, RowCells]],
                     group: Group | None, spread: Spread) -> tuple[bool, bool]:
        """Serve the rows of one scan's *batch*, but those *spread* skips; whether
        anything was done, and whether the pass ends (its scanner met others too often).

        A row whose advisory lock is held, or that this worker process served since
        the scan (:meth:`Runner.served_lately`), is another scanner's meeting, and
        costs nothing: the scanner skips a random stretch of its batch. A run that
        finds its notification served already (another process's scanner, whose
        advisory locks this one does not see) tells that the batch is stale where the
        other has been: the scanner leaves the rest of it, and scans on from past it,
        a random stretch further, rather than run the other's rows again (a timestamp
        and a read each, to find nothing)."""
        coordination = internals(self.cluster).coordination
        worked = False
        for row, cells in batch:
            if self._stop.is_set():
                break
            self.remember(table, row)
            if spread.skipping() or self.runner.backoff.all_waiting(
                    table, row, [name[len(NOTIFY) + 1 :] for name in cells]):
                continue
            key = f"{table}/{row.hex()}"
            if (self.runner.served_lately(table, row, cells)
                    or not coordination.try_advisory_lock(key)):
                if self._met(spread):
                    return True, True
                continue
            deferred = False
            waiting = len(group.runs) if group is not None else 0
            ran = Ran.NOTHING
            try:
                ran = self.runner.run_cells(table, row, cells, group)
                deferred = group is not None and len(group.runs) > waiting
            finally:
                if deferred:  # held until the group is committed
                    assert group is not None
                    group.keys.append(key)
                else:
                    coordination.release_advisory_lock(key)
            if group is not None and len(group.runs) >= GROUP_MAX:
                self.runner.flush(group)
            if ran is Ran.MET:
                return True, self._met(spread)
            worked = worked or bool(ran)
        return worked, False

    def _read_sample(self, table: str, reads: list[Read]) -> None:
        """Remember the first SAMPLE_READ rows of the notify family (one scan), to
        start passes at (see SAMPLE_READ); at most once per SPLITS_REFRESH seconds
        while none is found (an idle worker's passes)."""
        now = time.monotonic()
        read = self._sampled.get(table)
        if read is not None and now - read < SPLITS_REFRESH:
            return
        self._sampled[table] = now
        store = internals(self.cluster).store
        for row, _ in _first_rows(store.scan(table, None, None, reads,
                                             batch_size=SAMPLE_READ), SAMPLE_READ):
            self.remember(table, row)

    def _met(self, spread: Spread) -> bool:
        """Another scanner holds the row: count the meeting; True when the pass should
        end (a jump)."""
        self._count("meetings")
        if spread.met():
            self._count("jumps")
            return True
        return False

    def serve_row(self, table: str, row: bytes, group: Group | None = None) -> bool:
        """Read the notify cells of *row* and hand them to the runner
        (:meth:`Runner.run_cells`); True if anything was done. A pass over the notify
        family needs no such read: its scan read the cells."""
        cells = internals(self.cluster).store.read_rows(
            table, [row], [Read(NOTIFY, self.columns[table], versions=None)]
        ).get(row, {})
        return bool(self.runner.run_cells(table, row, cells, group))

    def serve_indexed(self, table: str, row: bytes, columns: Iterable[str]) -> Indexed:
        """Serve a row the notification index (or a lookout's look) named with
        *columns*. The common case, one such column with one observer and no failure
        to clear, runs without a read of the notify cells
        (:meth:`Runner.run_noticed`: the run reads the notification in its own first
        read); otherwise as :meth:`serve_row`. The answer tells the pass what to do
        with the row's entries (:class:`Indexed`)."""
        wanted = list(columns)
        observer = self.runner.sole_observer(table, wanted)
        if observer is None:
            done = Indexed.WORKED if self.serve_row(table, row) else Indexed.UNSETTLED
        else:
            done = self.runner.run_noticed(observer, table, row, wanted[0])
        if done is Indexed.WORKED and self.runner.backoff.failing(table, row, wanted):
            # A run failed and left its notification. Settled with the batch (deleted,
            # then written back), its entry would be missing for a moment, and a wait
            # for idle observers (wait_until_idle) that looked then would return.
            return Indexed.KEPT
        return done
