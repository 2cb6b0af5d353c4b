"""Commit: Percolator's two-phase commit, or one atomic step where the store allows.

Two-phase commit (every store), store round trips for a transaction writing N cells:

* prewrite: one batched read of lock + newer write records per table, then one
  compare-and-set per cell (carrying its data where the store is atomic per row);
  where the store offers ``set_unless`` (Bigtable), one conditional mutation per cell
  instead, whose guards are the conflict conditions themselves, and no read (a cell
  whose guards match is then read to learn why); the cells in the primary's row are
  locked together, in one such mutation whose guards are all of theirs;
* commit: one timestamp, the commit point (one CAS of the primary, carrying its
  write record on atomic stores, and there also the write records and FREE locks of
  the secondaries in its row: invariant A makes them ours to write until the
  primary is decided, and this CAS decides it), then one CAS per other secondary
  (non-atomic stores: one batched write of all write records first).

A single-cell transaction on Bigtable: 2 conditional mutations + 2 timestamps (one
``increment`` each without an oracle); so is a transaction of any number of cells in
one row (an observer's output and acknowledgement). A lock-free one-phase commit is
not possible there: its commit timestamp is drawn before its one mutation lands, and a
reader whose start timestamp is above it, reading before it lands, finds neither a
lock nor a record (TiKV's one-phase commit relies on the store tracking the newest
read timestamp, ``max_ts``, which Bigtable and HBase do not).

One-phase commit (the embedded store, see :func:`_commit_one_phase`): one read per row and
one write per table inside one SQLite write transaction, plus the two timestamps, for any N;
only the writes and the COMMIT hold back start timestamps drawn meanwhile.

Write records of a put carry the value (up to ``INLINE_MAX_BYTES`` in a two-phase
commit, always in a one-phase one), so a read needs the lock and the record only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from percolator import metrics as _metrics
from percolator._commit_checks import (
    _COMMITTED,
    CrashPoint,
    SimulatedCrash,
    WriteSet,
    _conflict,
    _read_prewrite_state,
    _record,
    _write_notifications,
)
from percolator._errors import (
    ConflictError,
    InvalidArgument,
    PercolatorError,
    SnapshotTooOldError,
)
from percolator._internals import internals
from percolator._one_phase import (
    GroupMember,
    _commit_one_phase,
    _one_phase_check,
    _one_phase_write,
    one_phase_steps,
)
from percolator._store import Mutation
from percolator._two_phase import (
    TwoPhaseCommit,
    _finish_two_phase,
    committed_anyway,
    free_locks_may_stay,
)
from percolator.metrics import observe as _observe

if TYPE_CHECKING:
    from percolator._cluster import Cluster
    from percolator._transaction import TransactionBase

__all__ = [
    "CrashPoint",
    "SimulatedCrash",
    "commit_group",
    "commit_transaction",
    "commits_in_one_phase",
    "committed_anyway",
    "free_locks_may_stay",
    "one_phase_steps",
]

log = logging.getLogger("percolator._commit")

_perf_counter = time.perf_counter


def commit_transaction(
    txn: TransactionBase, crash: CrashPoint | None = None,
    again: Callable[[], None] | None = None,
) -> int:
    """Commit *txn* (see the module docstring); *crash* is for test harnesses only
    (a commit with a crash point always takes the two-phase path). *again*, where
    given, is called when the commit conflicts or its start timestamp is below the
    safe point (nothing of it committed), to make *txn* ready for one more attempt,
    which is the one the metrics count."""
    began = _perf_counter()
    ws = txn._write_set()
    try:
        try:
            commit_ts = _commit_write_set(ws, crash)
        except (ConflictError, SnapshotTooOldError) as first:
            if again is None:
                raise
            if isinstance(first, ConflictError):  # counted where it was met; not the app's
                ws.parts.stats["conflicts"] -= 1
            again()
            commit_ts = _commit_write_set(txn._write_set(), crash)
    except BaseException as e:
        _record(ws.kind, began, e)
        raise
    if _metrics._enabled:  # _record's, in line: every transaction's commit comes here
        next(_COMMITTED[ws.kind])
        _observe("percolator_commit_duration_seconds", _perf_counter() - began, ws.kind)
    return commit_ts


def _commit_write_set(ws: WriteSet, crash: CrashPoint | None) -> int:
    """Commit what a transaction handed over (*ws*): in one phase where the store can
    (and no crash point is set), else in two."""
    txn, parts = ws.txn, ws.parts
    if not ws.writes:
        if ws.weak:
            commit_ts = parts.timestamps.get_timestamp()
            _write_notifications(ws, [], commit_ts)
            parts.wake_observers()
        else:
            commit_ts = txn.start_ts
        txn.commit_ts = commit_ts
        return commit_ts
    # Before anything (an overtaken transaction is told so, not sent into conflicts
    # with what GC left), and again where it counts, after the prewrite.
    parts.safe_point.check(txn.start_ts)
    steps = one_phase_steps(ws.cluster, parts) if crash is None else None
    if steps is not None:
        try:
            one_phase = _commit_one_phase(ws, steps)
        except ConflictError:
            parts.stats["conflicts"] += 1
            raise
        if one_phase is not None:
            commit_ts, notifies = one_phase
            txn.commit_ts = commit_ts
            parts.stats["commits"] += 1
            if notifies:
                parts.wake_observers()
            return commit_ts
    return _finish_two_phase(TwoPhaseCommit(ws, crash))


def _open_write_set(txn: TransactionBase) -> WriteSet:
    """*txn*'s write set, handed over now.

    :raises TransactionClosedError: *txn* is closed (committed or rolled back)."""
    if txn.closed:
        txn._check_open()
    return txn._write_set()


def commits_in_one_phase(cluster: Cluster) -> bool:
    """Whether *cluster*'s commits take one atomic step of its store (the embedded
    store, with ``one_phase_commit`` on): then :func:`commit_group` commits its
    transactions together in one store write, and a worker gathers its observer runs
    into groups for it."""
    return one_phase_steps(cluster) is not None


def commit_group(txns: Sequence[TransactionBase]) -> list[int | PercolatorError]:
    """Commit several transactions of one cluster made by this thread, each as if
    alone, and return each one's commit timestamp or the error its commit raised.

    Where the store commits in one phase (the embedded store), they share one SQLite
    write transaction: each makes its own conflict checks (which see the commits
    before it in the group) and draws its own commit timestamp, and one that
    conflicts writes nothing and leaves the others be; the group spares a write
    transaction (BEGIN, COMMIT, the writers' turn) per commit. A store failure in the
    step fails every transaction of it (none committed). One that meets a lock, and
    every one elsewhere, is committed on its own afterwards.
    """
    if not txns:
        return []
    cluster = txns[0].cluster
    if any(t.cluster is not cluster for t in txns):
        raise InvalidArgument("commit_group: every transaction must be of one cluster")
    parts = internals(cluster)
    began = time.perf_counter()
    results: list[int | PercolatorError | None] = [None] * len(txns)
    steps = one_phase_steps(cluster, parts)
    grouped: list[tuple[int, GroupMember]] = []
    handed: dict[int, WriteSet] = {}
    if steps is not None:
        for i, txn in enumerate(txns):
            if txn.closed:
                continue
            ws = handed[i] = txn._write_set()
            if not ws.writes:
                continue
            try:
                parts.safe_point.check(txn.start_ts)
            except PercolatorError as e:
                results[i] = e
                continue
            grouped.append((i, GroupMember.of(ws)))
    if grouped:
        assert steps is not None
        try:
            with steps.in_flight(steps.atomically) as draw:
                # Every check first, then every draw and write: the commit timestamps
                # are in flight (holding back other clients' start timestamps) only
                # for the writes. A member that writes a cell an earlier member
                # writes conflicts with it, as it would meet its record in the store.
                checked: list[tuple[int, GroupMember, dict[int, Any]]] = []
                taken: set[tuple[str, bytes, str]] = set()
                state = _read_prewrite_state(parts.store, [
                    (member.write_set.txn.start_ts, member.cells) for _, member in grouped])
                for i, member in grouped:
                    try:
                        unlocked = _one_phase_check(member, state)
                        cells = {(c.table, c.row, c.column) for c in member.cells}
                        if not taken.isdisjoint(cells):
                            first = next(c for c in member.cells
                                         if (c.table, c.row, c.column) in taken)
                            raise _conflict(member.write_set.txn.start_ts, first.table,
                                            first.row, first.column,
                                            "written by a transaction committed with it", None)
                    except ConflictError as e:
                        parts.stats["conflicts"] += 1
                        results[i] = e
                        continue
                    if unlocked:
                        taken |= cells
                        checked.append((i, member, state))
                batch: dict[str, list[Mutation]] = {}
                # None: no room left in the block; they go on their own (two-phase).
                stamps = draw(len(checked)) if checked else None
                for (i, member, found), commit_ts in zip(checked, stamps or (), strict=False):
                    _one_phase_write(member, found, commit_ts, batch)
                    results[i] = commit_ts
                for table, mutations in batch.items():  # one write per table for all
                    parts.store.mutate_rows(table, mutations)
        except PercolatorError as e:  # rolled back: none of the group committed
            for i, _ in grouped:
                if not isinstance(results[i], ConflictError):
                    results[i] = e
    members = dict(grouped)
    outcomes: list[int | PercolatorError] = []
    for i, txn in enumerate(txns):
        result = results[i]
        member_i = members.get(i)
        if isinstance(result, int):
            assert member_i is not None
            txn.commit_ts = result
            parts.stats["commits"] += 1
            if member_i.notifies:
                parts.wake_observers()
        elif result is None:  # not grouped, or met a lock: on its own
            try:
                if member_i is not None:  # its cells, made once, go on in two phases
                    result = _finish_two_phase(TwoPhaseCommit(
                        member_i.write_set, None, (member_i.cells, member_i.notifies)))
                else:
                    ws = handed.get(i) or _open_write_set(txn)
                    result = _commit_write_set(ws, None)
            except PercolatorError as e:
                result = e
        _record(txn._kind, began, result if isinstance(result, PercolatorError) else None)
        outcomes.append(result)
    return outcomes
