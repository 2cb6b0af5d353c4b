"""Snapshot isolation against a reference model, with committer crashes (hypothesis).

Up to four transactions are open at once; each does gets, get_rows, scans, sets and
deletes over two tables, then commits, rolls back, or *crashes* at a step of its
commit (after the primary's prewrite, after some secondaries, right after the commit
point, midway through the secondaries). A crashed transaction's owner is dead, so
its locks are resolved by whoever meets them.

The model (``percolator.conformance._si.Model``, which ``python -m
percolator.conformance`` also checks a deployment's cluster against, without the
garbage collection) is the list of committed write sets with their commit timestamps:

* every read equals the model's snapshot at the reader's start_ts, overlaid with
  the reader's own writes (crashed transactions included once their locks are
  resolved: wholly visible if they reached the commit point, else wholly invisible);
* a commit fails with ConflictError exactly when a transaction that committed after
  our start wrote one of our cells (first committer wins).

Garbage-collection passes run at arbitrary moments, some abandoned at a random step
(as if killed there), some overtaking every open transaction (``max_txn_age``):

* a pass never overtakes an open transaction unless told to;
* a transaction below the safe point gets SnapshotTooOldError from every read that
  goes to the store and from its commit, never a stale or missing value;
* the others read exactly the model, whatever passes removed or left half done;
* at the end, after a full pass, every cell keeps at most its one visible version.

The same machine runs on every backend (``backend`` fixture).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

import percolator
from percolator import SnapshotTooOldError, Transaction
from percolator._gc import GcSummary, collect
from percolator._internals import internals
from percolator.conformance._si import CRASH_POINTS, Model
from percolator.testing import CrashPoint, client_of, crash_commit
from tests._backends import WITH_FAULTS, backend_fixture, drop_tables
from tests._services import in_ci

TABLES = ("ta", "tb")
ROWS = (b"r1", b"r2", b"r3")
COLUMNS = ("c:x", "c:y")
KEYS = [(t, r, c) for t in TABLES for r in ROWS for c in COLUMNS]
Key = tuple[str, bytes, str]
_T = TypeVar("_T")

_names = itertools.count()
exercised: collections.Counter[str] = collections.Counter()


class GcCrash(Exception):
    """Abandons a garbage-collection pass at a step, as if its process died there."""


@dataclass
class Open:
    txn: Transaction
    writes: dict[Key, bytes | None] = field(default_factory=dict)


backend = backend_fixture(WITH_FAULTS)


class FreshRows:
    """Where the examples write: the same two tables for every example of a run, each
    example under a row prefix of its own (``<n>/``, its scans bounded to it), so that
    an example starts from empty rows as it would from new tables. On HBase a table's
    creation and its drop cost seconds of the master's procedures, and two new tables
    per example (over 300 in a run) made this the suite's slowest test there.
    Garbage-collection passes go over the earlier examples' rows too: those hold
    what their own final full pass left, so a pass changes nothing there."""

    def __init__(self, cluster: percolator.Cluster) -> None:
        self.tables = {t: f"x{next(_names)}" for t in TABLES}
        for name in self.tables.values():
            cluster.create_table(name)
        self.examples = itertools.count()

    def take(self) -> bytes:
        return b"%d/" % next(self.examples)


def make_machine(cluster: percolator.Cluster) -> type[RuleBasedStateMachine]:
    fresh = FreshRows(cluster)

    class SnapshotIsolation(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.names = fresh.tables
            self.prefix = fresh.take()
            self.model = Model()
            self.open: list[Open] = []
            self.safe_point = internals(cluster).safe_point.fetch()

        # --- this example's rows ------------------------------------------------------

        def row(self, row: bytes) -> bytes:
            return self.prefix + row

        def bounds(self, start: bytes | None, stop: bytes | None) -> tuple[bytes, bytes]:
            """The store's bounds of a scan of ``[start, stop)`` of this example's rows."""
            return (self.prefix + (start or b""),
                    self.prefix + (stop if stop is not None else b"\xff"))

        def unprefixed(self, rows: Iterable[tuple[bytes, _T]]) -> list[tuple[bytes, _T]]:
            return [(row[len(self.prefix):], cells) for row, cells in rows]

        # --- the model (percolator.conformance._si, shared with the conformance run) --

        def snapshot(self, handle: Open) -> dict[Key, bytes]:
            return self.model.snapshot(handle.txn.start_ts, handle.writes)

        def conflicts(self, handle: Open) -> bool:
            return self.model.conflicts(handle.txn.start_ts, handle.writes)

        def pick(self, i: int) -> Open:
            return self.open[i % len(self.open)]

        def too_old(self, handle: Open) -> bool:
            return handle.txn.start_ts < self.safe_point

        # --- rules ------------------------------------------------------------------

        @precondition(lambda self: len(self.open) < 4)
        @rule()
        def begin(self) -> None:
            self.open.append(Open(Transaction(client_of(cluster))))

        @precondition(lambda self: self.open)
        @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS))
        def get(self, i: int, key: Key) -> None:
            h = self.pick(i)
            table, row, column = key
            if self.too_old(h) and key not in h.writes:
                with pytest.raises(SnapshotTooOldError):
                    h.txn.get(self.names[table], self.row(row), column)
                exercised["too old"] += 1
                return
            assert h.txn.get(self.names[table], self.row(row), column) == self.snapshot(h).get(key)

        @precondition(lambda self: self.open)
        @rule(i=st.integers(0, 3), table=st.sampled_from(TABLES), row=st.sampled_from(ROWS))
        def get_row(self, i: int, table: str, row: bytes) -> None:
            h = self.pick(i)
            expected = {c: v for (t, r, c), v in self.snapshot(h).items() if (t, r) == (table, row)}
            if self.too_old(h) and any((table, row, c) not in h.writes for c in COLUMNS):
                with pytest.raises(SnapshotTooOldError):
                    h.txn.get_row(self.names[table], self.row(row), list(COLUMNS))
                exercised["too old"] += 1
                return
            assert h.txn.get_row(self.names[table], self.row(row), list(COLUMNS)) == expected

        @precondition(lambda self: self.open)
        @rule(
            i=st.integers(0, 3),
            table=st.sampled_from(TABLES),
            start=st.sampled_from((None, *ROWS)),
            stop=st.sampled_from((None, *ROWS)),
        )
        def scan(self, i: int, table: str, start: bytes | None, stop: bytes | None) -> None:
            h = self.pick(i)
            expected = self.model.rows(h.txn.start_ts, h.writes, table, start, stop)
            if self.too_old(h):
                with pytest.raises(SnapshotTooOldError):
                    list(h.txn.scan(self.names[table], *self.bounds(start, stop)))
                exercised["too old"] += 1
                return
            assert self.unprefixed(h.txn.scan(self.names[table], *self.bounds(start, stop))
                                   ) == expected

        @precondition(lambda self: self.open)
        @rule(
            i=st.integers(0, 3),
            key=st.sampled_from(KEYS),
            value=st.none() | st.binary(min_size=0, max_size=4),
        )
        def write(self, i: int, key: Key, value: bytes | None) -> None:
            h = self.pick(i)
            table, row, column = key
            if value is None:
                h.txn.delete(self.names[table], self.row(row), column)
            else:
                h.txn.set(self.names[table], self.row(row), column, value)
            h.writes[key] = value

        @precondition(lambda self: len(self.open) >= 2)
        @rule(key=st.sampled_from(KEYS[:3]), value=st.binary(min_size=1, max_size=2))
        def write_in_every_open_transaction(self, key: Key, value: bytes) -> None:
            """Contended cells: without this, random writes rarely collide."""
            table, row, column = key
            for h in self.open:
                h.txn.set(self.names[table], self.row(row), column, value)
                h.writes[key] = value

        @precondition(lambda self: self.open)
        @rule(i=st.integers(0, 3))
        def commit(self, i: int) -> None:
            h = self.pick(i)
            self.open.remove(h)
            if self.too_old(h) and h.writes:
                with pytest.raises(SnapshotTooOldError):
                    h.txn.commit()
                exercised["too old commit"] += 1
                return
            expect_conflict = self.conflicts(h)
            try:
                commit_ts = h.txn.commit()
            except percolator.ConflictError:
                assert expect_conflict, "spurious conflict"
                exercised["conflict"] += 1
                return
            assert not expect_conflict, "lost update: commit should have conflicted"
            exercised["commit"] += 1
            if h.writes:
                assert commit_ts > h.txn.start_ts
            self.model.committed(commit_ts, h.writes)

        @precondition(lambda self: self.open)
        @rule(i=st.integers(0, 3))
        def rollback(self, i: int) -> None:
            h = self.pick(i)
            self.open.remove(h)
            h.txn.rollback()

        @precondition(lambda self: self.open)
        @rule(i=st.integers(0, 3), point=st.sampled_from(CRASH_POINTS))
        def crash(self, i: int, point: CrashPoint) -> None:
            h = self.pick(i)
            self.open.remove(h)
            if self.too_old(h) and h.writes:
                with pytest.raises(SnapshotTooOldError):
                    crash_commit(h.txn, point)
                exercised["too old commit"] += 1
                return
            expect_conflict = self.conflicts(h)
            try:
                reached = crash_commit(h.txn, point)
            except percolator.ConflictError:
                assert expect_conflict, "spurious conflict"
                return
            if point.phase != "prewrite" and h.writes:
                assert reached == (not expect_conflict)
            exercised[f"crash {point.phase} reached={reached}"] += 1
            if reached and h.writes:
                assert not expect_conflict
                assert h.txn.commit_ts is not None
                self.model.committed(h.txn.commit_ts, h.writes)

        @precondition(lambda self: self.open)  # else it would be every other step
        @rule(crash_at=st.none() | st.integers(0, 5), overtake=st.booleans())
        def gc(self, crash_at: int | None, overtake: bool) -> None:
            steps = itertools.count()

            def before_step() -> None:
                if next(steps) == crash_at:
                    raise GcCrash

            tables = list(self.names.values())
            try:
                summary = collect(cluster, retention=0, max_txn_age=1e-9 if overtake else 1e6,
                                  tables=tables, before_step=before_step)
            except GcCrash:
                exercised["gc abandoned"] += 1
            else:
                exercised["gc"] += 1
                if not overtake:
                    assert all(summary.safe_point <= h.txn.start_ts
                               for h in self.open if not self.too_old(h))
            self.safe_point = internals(cluster).safe_point.fetch()

        def teardown(self) -> None:
            for h in self.open:
                h.txn.rollback()
            self.open.clear()
            # Once every lock is resolved, the store holds exactly the model's state.
            summary = collect(cluster, retention=0, tables=list(self.names.values()))
            final = Transaction(cluster)
            try:
                self.check_final(final, summary)
            finally:
                # Closed even when a check fails and its traceback lives on: an open
                # transaction would hold the safe point back in every later example.
                final.rollback()

        def check_final(self, final: Transaction, summary: GcSummary) -> None:
            snapshot = self.snapshot(Open(final))
            for table in TABLES:
                got = {
                    (table, r, c): v
                    for r, vs in self.unprefixed(final.scan(self.names[table],
                                                            *self.bounds(None, None)))
                    for c, v in vs.items()
                }
                assert got == {k: v for k, v in snapshot.items() if k[0] == table}
            for table in TABLES:
                locks = internals(cluster).store.scan(
                    self.names[table], *self.bounds(None, None), [percolator._store.Read("l")]
                )
                for _, cells in locks:
                    for versions in cells.values():
                        assert versions[0][1][:1] == b"F", "a lock was left unresolved"
            # After a full pass, a cell keeps only its visible version (small values
            # are inlined in write records: no data cells), a deleted one nothing;
            # rollback records newer than the kept version stay (the store deletes by
            # timestamp range: they go once a newer version is kept).
            for table in TABLES:
                name = self.names[table]
                for row, cells in self.unprefixed(internals(cluster).store.scan(
                    name, *self.bounds(None, None),
                    [percolator._store.Read("w", versions=None),
                     percolator._store.Read("d", versions=None)]
                )):
                    for column, versions in cells.items():
                        key = (table, row, column[2:])
                        assert column.startswith("w:"), (key, versions)
                        kept = [(ts, v) for ts, v in versions if v[:1] != b"R"]
                        assert len(kept) == 1 and kept[0][1][:1] == b"V", (
                            key, versions, summary.safe_point, summary.held_back_by)
                        assert key in snapshot
                        assert all(ts > kept[0][0] for ts, v in versions if v[:1] == b"R")

    return SnapshotIsolation


@pytest.fixture
def gc_cluster(store_url: str) -> Iterator[percolator.Cluster]:
    """A short safe-point refresh: every pass waits twice it."""
    with percolator.connect(store_url, safe_point_refresh=0.002) as c:
        yield c
        drop_tables(c)


# Up to five explorations (below) of 60 examples each on a cluster store: 313 s on
# HBase in a fresh CI run at load ~12, past the suite's 300 s hang guard.
@pytest.mark.timeout(900)
def test_snapshot_isolation_state_machine(gc_cluster: percolator.Cluster, backend: str) -> None:
    machine = make_machine(gc_cluster)
    examples = 150 if backend == "sqlite" else 60
    exercised.clear()
    # CI replays one fixed exploration first; elsewhere every run explores anew. An
    # exploration that did not meet every case below explores again, at random (at
    # most four times): the fixed one changes whenever the machine's rules do, and on
    # a remote store with few examples a run can miss a case (a fresh CI run once met
    # no conflict in three explorations of Bigtable).
    for attempt in range(5):
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=30,
                deadline=None,
                derandomize=in_ci() and attempt == 0,
            ),
        )
        if exercised["conflict"] and exercised["gc abandoned"] and (
            exercised["too old"] + exercised["too old commit"]
        ):
            break
    # The run must have met what it claims to check.
    assert exercised["conflict"] > 0, exercised
    assert exercised["crash commit reached=True"] + exercised["crash commit_point reached=True"] > 0
    assert exercised["gc"] > 0 and exercised["gc abandoned"] > 0, exercised
    assert exercised["too old"] + exercised["too old commit"] > 0, exercised
    if backend == "sqlite":  # enough examples to be sure to meet every case
        assert exercised["crash prewrite reached=False"] > 0, exercised
