"""The runner: the observer runs of a :class:`~observers.Worker`, and their commits.

It is handed a row's notify cells as the scanner read them (:meth:`Runner.run_cells`)
and runs, per dirty cell and per observer of its column, a transaction that reads the
column and the observer's acknowledgement, calls ``process`` if the column changed
since, writes the acknowledgement and commits, alone or, on the embedded store, with
the other runs of the scanner's pass in one group (:meth:`Runner.flush`,
``commit_group``). Failures back off (:mod:`observers._backoff`) and, counted across
the cluster, end in quarantine. A run that the store, the timestamp source or the
coordination service failed is no failure: its error ends the scanner's pass. The
transaction's side of the contract is :mod:`percolator._observer_hooks`."""

from __future__ import annotations

import contextlib
import enum
import logging
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from observers._backoff import Backoff
from observers._observer import Observer
from observers._store_turn import StoreTurn, Waits
from percolator import (
    Cluster,
    CommitUnknownError,
    CoordinationError,
    ObserverError,
    OracleUnavailable,
    PercolatorError,
    StoreUnavailable,
    is_retryable,
)
from percolator.ext import (
    NOTIFY,
    NOTIFY_WEAK,
    Mutation,
    NextStart,
    ObserverRun,
    Quarantined,
    RowCells,
    Settlement,
    ack_column,
    clear_failures,
    commit_group,
    commit_transaction,
    commits_in_one_phase,
    format_row,
    internals,
    quarantine,
    record_failure,
)
from percolator.metrics import inc as _inc
from percolator.metrics import observe as _observe

__all__ = [
    "GROUP_MAX", "RECENT_MAX", "RECENT_SECONDS", "CommitHook", "Group", "Indexed", "Notice",
    "Outcome", "Ran", "Recent", "Run", "Runner",
]

log = logging.getLogger("observers")

CommitHook = Callable[[Observer, str, bytes, str, int, int], None]
"""``on_commit(observer, table, row, column, change_ts, commit_ts)``."""

GROUP_MAX = 32
"""Observer transactions a scanner thread commits together on the embedded store
(one SQLite write transaction for up to this many; see ``commit_group``)."""
RECENT_MAX = 8192
"""Cells whose notification this worker process saw served lately (:class:`Recent`)."""
RECENT_SECONDS = 10.0
"""How long :class:`Recent` vouches for a cell served: longer than a scan's batch takes
to serve (seconds, even on a loaded machine), short enough that a notification it
should somehow not vouch for waits no longer than that for another pass."""


class Outcome:
    """How one observer run ended (the ``outcome`` label of its metrics)."""

    DEFERRED = "deferred"  # left in a group, committed by Runner.flush
    COMMITTED = "committed"
    SKIPPED = "skipped"  # its metrics label is "acked_already"
    CONFLICT = "conflict"
    TRANSIENT = "transient"
    FAILED = "failed"
    ABSENT = "absent"  # no notification at or below the run's snapshot (Notice)


class Ran(enum.Enum):
    """What :meth:`Runner.run_cells` did with a row's dirty cells. True but for NOTHING
    (the scanner's pass did work, or has met another scanner: it goes on either way)."""

    NOTHING = "nothing"  # no run, or runs that found nothing to do
    WORKED = "worked"  # runs ran
    MET = "met"  # a run found its notification served by another scanner meanwhile

    def __bool__(self) -> bool:
        return self is not Ran.NOTHING


class Recent:
    """Cells whose notify versions this worker process saw served lately, up to which
    timestamp: served by one of its runs (deleted, by the run's commit or after it),
    or found served by another worker (a run that read none left). A scanner whose
    batch, read before, still lists such a cell at or below that timestamp is behind
    another scanner: it skips the row without a run (which would draw a timestamp and
    read to find nothing) and moves on (Percolator §2.4's meeting). Only served
    versions are vouched for, and only for RECENT_SECONDS: a newer notification is
    above them, and a row skipped wrongly waits for a later pass, never for ever."""

    def __init__(self, limit: int = RECENT_MAX, seconds: float = RECENT_SECONDS) -> None:
        self._limit = limit
        self._seconds = seconds
        self._cells: dict[tuple[str, bytes, str], tuple[int, float]] = {}
        self._lock = threading.Lock()

    def add(self, table: str, row: bytes, column: str, newest: int) -> None:
        """The notify versions of the cell at or below *newest* are served."""
        key = (table, row, column)
        now = time.monotonic()
        with self._lock:
            held = self._cells.pop(key, None)
            self._cells[key] = (max(newest, held[0]) if held else newest, now)
            while len(self._cells) > self._limit:  # the oldest go first
                del self._cells[next(iter(self._cells))]

    def holds(self, table: str, row: bytes, cells: RowCells) -> bool:
        """Whether every notify cell of *cells* (``notify:<column>``: versions newest
        first) lists only versions served lately."""
        if not self._cells:
            return False
        now = time.monotonic()
        found = False
        with self._lock:
            for name, versions in cells.items():
                if not versions:
                    continue
                held = self._cells.get((table, row, name[len(NOTIFY) + 1 :]))
                if held is None or versions[0][0] > held[0] or now - held[1] > self._seconds:
                    return False
                found = True
        return found


class Indexed(enum.Enum):
    """What became of a row an index pass named (:meth:`Runner.run_noticed`), and so
    of its index entries. True for WORKED and KEPT (work was done)."""

    WORKED = "worked"  # runs ran: the entries go with the scanner's batch
    KEPT = "kept"  # runs ran, one failed: its notification stays, and the entries too
    SERVED = "served"  # absent, no notify version at all: with the batch too
    LATER = "later"  # absent, a notification above the run's snapshot: entries stay
    UNSETTLED = "unsettled"  # nothing ran, or not through the index path: settle alone

    def __bool__(self) -> bool:
        return self is Indexed.WORKED or self is Indexed.KEPT


_UNAVAILABLE = (StoreUnavailable, OracleUnavailable, CoordinationError)


def _given_up_on(outcome: str, error: BaseException | None) -> None:
    """Raise the error of a run that the store, the timestamp source or the
    coordination service failed (*outcome* TRANSIENT): the scanner's pass ends there
    and the scanner backs off. The next run of the pass would wait for the same
    service, as long (a dead HBase behind a live Thrift server answers each call after
    the store's deadline, two socket timeouts), and every row of the scan's batch
    (128) after it too, where the next pass, after the back-off, may find it back."""
    if outcome == Outcome.TRANSIENT and isinstance(error, _UNAVAILABLE):
        raise error


@dataclass(slots=True)
class Notice:
    """The notification a run read in its own first read: its newest notify version
    at or below the run's start_ts (0: none), whether one of those is weak, (an
    absent run) whether a version above start_ts was read, and the start_ts."""

    newest: int = 0
    weak: bool = False
    later: bool = False
    start_ts: int = 0


@dataclass(slots=True)
class Run:
    """An observer run whose transaction waits in a group for its commit."""

    txn: ObserverRun
    observer: Observer
    table: str
    row: bytes
    column: str
    change: int


@dataclass(slots=True)
class Group:
    """One scanner pass's observer transactions waiting to be committed together, and
    the advisory locks of their rows (held until then)."""

    runs: list[Run] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)


class Runner:
    """Runs the observers of *by_column* (``(table, column)``: its observers, in
    order) on *cluster* and commits their transactions. Shared by the scanner threads
    of one worker: *count* adds to the worker's stats; *backoff* holds this process's
    failing cells; *stop* is set when the worker stops (a lock wait is then cut
    short); *store_turn* (on a single-writer store with several scanners) is let go
    while an observer that waits runs (*waits*: per observer name); *on_commit* and
    *max_failures* are the :class:`~observers.Worker`'s. *recent*, given where several
    scanner threads share the runner, remembers the cells served lately, for
    :meth:`served_lately`."""

    def __init__(
        self,
        cluster: Cluster,
        by_column: dict[tuple[str, str], list[Observer]],
        *,
        backoff: Backoff,
        count: Callable[..., None],
        stop: threading.Event,
        store_turn: StoreTurn | None,
        waits: dict[str, Waits],
        on_commit: CommitHook | None,
        max_failures: int,
        recent: Recent | None = None,
    ) -> None:
        self.cluster = cluster
        self.by_column = by_column
        self.backoff = backoff
        self._count = count
        self._stop = stop
        self._store_turn = store_turn
        self._waits = waits
        self.on_commit = on_commit
        self.max_failures = max_failures
        self._next_starts = threading.local()  # .next: this scanner thread's NextStart
        self._recent = recent

    def next_start(self) -> NextStart:
        """This scanner thread's :class:`NextStart`: a start timestamp left by its
        previous run's commit, for its next run."""
        held: NextStart | None = getattr(self._next_starts, "next", None)
        if held is None:
            held = self._next_starts.next = NextStart()
        return held

    def commits_in_groups(self) -> bool:
        """Whether observer commits can share a store write (the embedded store's
        one-phase commits)."""
        return GROUP_MAX > 1 and commits_in_one_phase(self.cluster)

    def run_cells(self, table: str, row: bytes, cells: RowCells,
                  group: Group | None = None) -> Ran:
        """Run the observers of every dirty cell of *row*, given its notify *cells*
        (``notify:<column>``: every version, newest first) as the scanner read them;
        what was done (:class:`Ran`). With *group*, a run whose commit can delete its
        notification is left in the group, to be committed with others
        (:meth:`flush`).

        The cells only name the dirty columns: the scanner read them before it took
        the row's advisory lock, and another worker may have served them meanwhile,
        or a newer notification may have come. Each run reads the notification again
        in its own first read (:meth:`ObserverRun.get_row_notified`, the same store
        call as its read of the column and the acknowledgement), after its start
        timestamp, and serves what that read found at or below it: a notification
        served already is absent (a weak one would otherwise be run a second time,
        since its run does not look at the acknowledgement), and one committed after
        the start timestamp stays for a later pass. A run that found its notification
        served already (absent) tells the scanner it met another
        (:attr:`Ran.MET`), and the cell is remembered as served (:meth:`served_lately`)."""
        ran = Ran.NOTHING
        for name, versions in cells.items():
            column = name[len(NOTIFY) + 1 :]
            if not versions:
                continue
            if self.backoff.waiting(table, row, column):
                continue
            handed = versions[0][0]
            observers = self.by_column[(table, column)]
            # One observer and no failure to clear: its commit may delete the
            # notification itself (one-phase commits do, in their atomic step).
            settle = len(observers) == 1 and not self.backoff
            served: int | None = None  # the newest version every run served (0: not all)
            settled = False
            outcome = Outcome.ABSENT
            for observer in observers:
                notice = Notice()
                began = time.perf_counter()
                outcome, error, settled = self._run_observer(
                    observer, table, row, column, notice, settle=settle,
                    group=group if settle else None)
                if outcome == Outcome.ABSENT and not notice.later:
                    # Served by another scanner between the scan and the run: no version
                    # is left, those handed included. (One acknowledged already may be
                    # a crashed run's, whose notification stayed: no meeting.)
                    ran = Ran.MET
                    self._remember(table, row, column, handed)
                elif ran is Ran.NOTHING:
                    ran = Ran.WORKED
                if outcome == Outcome.ABSENT and notice.later and notice.start_ts < handed:
                    # The scanner read the notification before this start timestamp was
                    # drawn: every timestamp source draws above what was read before
                    # the draw (docs/timestamps.md). Should one not, the notification
                    # stays for a later pass rather than being lost.
                    log.error("%s on %s/%s/%s: snapshot %d is below the notification %d; "
                              "leaving it for a later pass", observer.name, table,
                              format_row(row), column, notice.start_ts, handed)
                # A run that failed before it read the notification counts its failure
                # against the one the scanner read.
                newest, weak = ((notice.newest, notice.weak) if notice.newest else
                                (handed, any(v == NOTIFY_WEAK for _, v in versions)))
                if not self._ended(observer, table, row, column, began, outcome, error,
                                   weak, newest):
                    served = 0
                elif served is None or served > notice.newest:
                    served = notice.newest
                _given_up_on(outcome, error)
                if outcome == Outcome.FAILED:
                    break
            if served and not settled:
                self._served_notification(table, row, column, served)
                self._remember(table, row, column, served)
            elif served and outcome != Outcome.DEFERRED:  # its commit deleted it
                self._remember(table, row, column, served)
        return ran

    def served_lately(self, table: str, row: bytes, cells: RowCells) -> bool:
        """Whether every notify version of *cells* (a scanner's read of *row*) was
        served lately, by this process's runs or found served by another's
        (:class:`Recent`): a scanner that meets such a row is behind another."""
        return self._recent is not None and self._recent.holds(table, row, cells)

    def _remember(self, table: str, row: bytes, column: str, newest: int) -> None:
        if self._recent is not None:
            self._recent.add(table, row, column, newest)

    def sole_observer(self, table: str, columns: Iterable[str]) -> Observer | None:
        """The observer for :meth:`run_noticed` of a row with notifications of
        *columns*: one column with one observer, when no failure is to be cleared (the
        common case); else None (the row's notify cells are to be read and run with
        :meth:`run_cells`)."""
        wanted = list(columns)
        if len(wanted) != 1 or self.backoff:
            return None
        observers = self.by_column.get((table, wanted[0]), [])
        return observers[0] if len(observers) == 1 else None

    def run_noticed(self, observer: Observer, table: str, row: bytes,
                    column: str) -> Indexed:
        """Run *observer* on a cell the notification index (or a lookout's look) named,
        without its notify cells: the run draws its start timestamp first and reads
        the notification with its own first read (:meth:`ObserverRun.get_row_notified`),
        one store call where the notify read and the run's read were two. The answer
        tells the scanner what to do with the row's index entries (:class:`Indexed`)."""
        notice = Notice()
        began = time.perf_counter()
        outcome, error, settled = self._run_observer(
            observer, table, row, column, notice, settle=True, spare=True)
        if (self._ended(observer, table, row, column, began, outcome, error, notice.weak,
                        notice.newest) and not settled):
            self._served_notification(table, row, column, notice.newest)
        _given_up_on(outcome, error)
        if outcome != Outcome.ABSENT:
            return Indexed.WORKED
        # An absent run did no work: its notification was served already (by another
        # worker, whose batch has not settled the entry yet), or is newer than its
        # snapshot (then the entry must stay, and costs nothing left alone).
        return Indexed.LATER if notice.later else Indexed.SERVED

    def flush(self, group: Group) -> None:
        """Commit the group's observer transactions together (``commit_group``: one
        SQLite write transaction), then account for each as a single run would, and
        let go of the rows' advisory locks."""
        runs, keys = group.runs, group.keys
        group.runs, group.keys = [], []
        try:
            if not runs:
                return
            outcomes = commit_group([run.txn for run in runs])
            for run, outcome in zip(runs, outcomes, strict=True):
                self._account(run, outcome)
        finally:
            for key in keys:
                internals(self.cluster).coordination.release_advisory_lock(key)

    def _account(self, run: Run, outcome: int | PercolatorError) -> None:
        name = run.observer.name
        if isinstance(outcome, PercolatorError):
            # The notification stays: a later pass runs the observer again.
            if is_retryable(outcome):
                self._count("conflicts")
                _inc("percolator_observer_runs_total", name, Outcome.CONFLICT)
            else:
                log.warning("%s on %s/%s/%s: %s; will retry", name, run.table,
                            format_row(run.row), run.column, outcome)
                _inc("percolator_observer_runs_total", name, Outcome.TRANSIENT)
            return
        self._count(Outcome.COMMITTED)
        _inc("percolator_observer_runs_total", name, Outcome.COMMITTED)
        settlement = run.txn.settlement
        if settlement is not None:
            if not settlement.done:  # committed in two phases
                self._delete_notification(run.table, run.row, run.column, settlement.newest)
            self._remember(run.table, run.row, run.column, settlement.newest)
        self._committed(run.observer, run.table, run.row, run.column, run.change, outcome)

    def _ended(
        self, observer: Observer, table: str, row: bytes, column: str, began: float,
        outcome: str, error: BaseException | None, weak: bool, newest: int,
    ) -> bool:
        """Record how one run ended (its duration; its outcome, but for a run left in
        a group, whose commit counts it) and count a failure against the notification
        (*newest*, *weak*: the versions it was for; 0 when the run failed before it
        read them). True if the run leaves the notification served as far as it goes:
        it committed, had nothing to do, or waits in a group."""
        _observe("percolator_observer_run_duration_seconds", time.perf_counter() - began,
                 observer.name)
        if outcome == Outcome.DEFERRED:
            return True
        _inc("percolator_observer_runs_total", observer.name,
             "acked_already" if outcome == Outcome.SKIPPED else outcome)
        if outcome == Outcome.FAILED:
            assert error is not None
            if newest:
                self._failed(observer, table, row, column, weak, newest, error)
            else:  # failed before it read the notification: nothing to count it against
                log.warning("%s on %s/%s/%s: %s; will retry", observer.name, table,
                            format_row(row), column, error)
            return False
        return outcome == Outcome.COMMITTED or outcome == Outcome.SKIPPED

    def _served_notification(self, table: str, row: bytes, column: str, newest: int) -> None:
        """The runs of a cell ended served and their commits did not delete its
        notification: clear its failures, if any, and delete it (versions up to
        *newest*)."""
        if self.backoff.clear(table, row, column):
            clear_failures(self.cluster, table, row, column)
        self._delete_notification(table, row, column, newest)

    def _run_observer(
        self, observer: Observer, table: str, row: bytes, column: str, notice: Notice,
        *, settle: bool, group: Group | None = None, spare: bool = False,
    ) -> tuple[str, BaseException | None, bool]:
        """Run one observer transaction, retrying conflicts a few times. The run reads
        the notification itself and fills *notice*. With *settle*, its commit may
        delete the notification; the third value tells whether it did (or, for a run
        left in *group*, that the group's commit will see to it). With *spare*, it
        may begin at a start timestamp its thread's previous commit drew
        (:class:`NextStart`)."""
        for attempt in range(4):
            if attempt:
                time.sleep(random.uniform(0, 0.005 * 2**attempt))
            try:
                outcome, settled = self._transaction(observer, table, row, column, notice,
                                                     settle, group, spare)
            except ObserverError as e:
                return Outcome.FAILED, e.__cause__ or e, False
            except CommitUnknownError:
                log.warning("commit outcome of %s on %s/%s/%s unknown; will look again",
                            observer.name, table, format_row(row), column)
                return Outcome.TRANSIENT, None, False
            except _UNAVAILABLE as e:
                # Not the observer's fault: keep the notification, count no failure
                # towards quarantine; the caller raises it (_given_up_on), so that the
                # scanner ends its pass and backs off.
                log.warning("%s on %s/%s/%s: %s; will retry", observer.name, table,
                            format_row(row), column, e)
                return Outcome.TRANSIENT, e, False
            except PercolatorError as e:
                if self._stop.is_set():  # a lock wait cut short: the next pass retries
                    return Outcome.TRANSIENT, None, False
                if not is_retryable(e):
                    return Outcome.FAILED, e, False
                self._count("conflicts")
                continue
            if outcome != Outcome.DEFERRED and outcome != Outcome.ABSENT:
                self._count(outcome)
            return outcome, None, settled
        return Outcome.CONFLICT, None, False

    def _transaction(
        self, observer: Observer, table: str, row: bytes, column: str, notice: Notice,
        settle: bool, group: Group | None, spare: bool,
    ) -> tuple[str, bool]:
        held: NextStart | None = None
        if not spare:
            txn = ObserverRun(self.cluster)
        else:
            # The run reads its notification after its start timestamp (step 2 of
            # percolator/_observer_hooks.py): it may begin at one its thread's previous
            # commit drew (step 5), and leaves one for the next.
            held = self.next_start()
            spare_ts, held.ts = held.ts, 0
            txn = ObserverRun(self.cluster, start_ts=spare_ts or None)
            txn.pass_start_on(held)
        notice.newest, notice.weak, notice.later = 0, False, False  # a retry reads again
        notice.start_ts = txn.start_ts
        try:
            outcome, settled = self._observe(txn, observer, table, row, column, settle,
                                             group, notice)
        except BaseException:
            # Its error travels on (to the log, whose handlers may keep the record and
            # so the traceback's frames): the run must not hold the safe point meanwhile.
            txn.close()
            raise
        if held is not None and outcome == Outcome.ABSENT and not notice.later:
            # It read, found nothing and wrote nothing: its start timestamp is as good
            # for the next run as a fresh draw (step 5 of percolator/_observer_hooks.py;
            # docs/timestamps.md). One that read a notification above it is stale: the
            # next run draws afresh, or it would leave that notification too.
            held.ts = txn.start_ts
        return outcome, settled

    def _observe(
        self, txn: ObserverRun, observer: Observer, table: str, row: bytes,
        column: str, settle: bool, group: Group | None, notice: Notice,
    ) -> tuple[str, bool]:
        txn.stop_waiting_on(self._stop)
        ack = ack_column(observer.name, column)
        txn.internal_columns(True)
        values, versions = txn.get_row_notified(table, row, [column, ack], column)
        # A version above start_ts was committed after the draw: its change is not
        # in this snapshot, so this run must not serve (delete) it. (Versions come
        # newest first: one loop, no list, on every run's path.)
        start_ts, newest, weak = txn.start_ts, 0, False
        for ts, value in versions:
            if ts <= start_ts:
                if not newest:
                    newest = ts
                if value == NOTIFY_WEAK:
                    weak = True
                    break
        if not newest:
            notice.later = bool(versions)
            txn.close()
            return Outcome.ABSENT, False
        notice.newest, notice.weak = newest, weak
        change = txn.change_version(table, row, column)
        acked = int(values.get(ack, b"0"))
        if change <= acked and not weak:
            txn.close()  # nothing to commit
            return Outcome.SKIPPED, False
        txn.internal_columns(False)
        turn = self._store_turn
        try:
            with (turn.observer_code(self._waits[observer.name], self._stop)
                  if turn is not None else contextlib.nullcontext()):
                observer.process(txn, row, column)
        except PercolatorError as e:
            if is_retryable(e):
                raise
            raise ObserverError(
                f"observer {observer.name} failed on {table}/{format_row(row)}/{column}: {e}"
            ) from e
        except Exception as e:
            raise ObserverError(
                f"observer {observer.name} failed on {table}/{format_row(row)}/{column}: "
                f"{type(e).__name__}: {e}"
            ) from e
        txn.internal_columns(True)
        txn.set(table, row, ack, str(max(change, acked)).encode())
        if settle:
            txn.settle_on_commit(Settlement(table, row, column, notice.newest))
            if group is not None:
                group.runs.append(Run(txn, observer, table, row, column, change))
                return Outcome.DEFERRED, True
        commit_ts = commit_transaction(txn)
        self._committed(observer, table, row, column, change, commit_ts)
        return Outcome.COMMITTED, txn.settled

    def _failed(
        self, observer: Observer, table: str, row: bytes, column: str, weak: bool,
        newest: int, error: BaseException,
    ) -> None:
        self._count("failures")
        count = record_failure(self.cluster, table, row, column, newest)  # cluster-wide
        delay = self.backoff.failed(table, row, column)  # this process's back-off
        where = f"{table}/{format_row(row)}/{column}"
        if count < self.max_failures:
            log.warning("observer %s failed on %s (%d/%d), retrying in %.2fs: %s",
                        observer.name, where, count, self.max_failures, delay, error)
            return
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        quarantine(
            self.cluster,
            Quarantined(table, row, column, observer.name, text, count, weak, time.time()),
            newest,
        )
        self.backoff.clear(table, row, column)
        clear_failures(self.cluster, table, row, column)
        self._count("quarantined")
        _inc("percolator_observer_runs_total", observer.name, "quarantined")
        log.error("observer %s failed %d times on %s: notification quarantined "
                  "(see `percolator status`, `percolator retry`): %s",
                  observer.name, count, where, text)

    def _delete_notification(self, table: str, row: bytes, column: str, newest: int) -> None:
        """Delete the notify versions of the cell at or below *newest*, the newest one
        the runs just made served (a later notification stays)."""
        internals(self.cluster).store.mutate_rows(
            table, [Mutation(row, deletes=[(f"{NOTIFY}:{column}", newest)])])

    def _committed(self, observer: Observer, table: str, row: bytes, column: str,
                   change: int, commit_ts: int) -> None:
        """Tell the ``on_commit`` hook, if any, of a committed run."""
        if self.on_commit is not None:
            try:
                self.on_commit(observer, table, row, column, change, commit_ts)
            except Exception:
                log.exception("on_commit hook failed")
