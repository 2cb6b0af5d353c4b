"""Snapshot isolation against a reference model: random interleaved transactions.

Up to four transactions are open at once; each does gets, get_rows, scans, sets and
deletes over two tables, then commits, rolls back, or *crashes* at a step of its
commit (:func:`percolator.testing.crash_commit`: its owner is dead, its locks are left
for whoever meets them). :class:`Model` is the list of committed write sets with their
commit timestamps:

* every read equals the model's snapshot at the reader's start_ts, overlaid with the
  reader's own writes (a crashed transaction is wholly visible once its locks are
  resolved if it reached the commit point, else wholly invisible);
* a commit fails with ConflictError exactly when a transaction that committed after
  our start wrote one of our cells (first committer wins).

At the end a fresh transaction reads exactly the model's state and no lock is left.
:func:`check` drives it with a seeded random generator (the same seed gives the same
choices; the cluster's timestamps and timing differ); the hypothesis state machine
of ``tests/transactions/test_snapshot_isolation.py`` uses the same :class:`Model` and
adds garbage-collection passes, which a conformance run must not make on a shared
cluster (a pass moves the cluster-wide safe point).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from percolator._cluster import Cluster
from percolator._commit import CrashPoint
from percolator._errors import ConflictError
from percolator._transaction import Transaction
from percolator.conformance._core import Anomaly, CheckResult, Target, unresolved_locks
from percolator.testing import client_of, crash_commit

TABLES = ("ta", "tb")
ROWS = (b"r1", b"r2", b"r3")
COLUMNS = ("c:x", "c:y")
Key = tuple[str, bytes, str]
"""(table as the model names it, row, column)."""

CRASH_POINTS = [
    CrashPoint("prewrite", 0),
    CrashPoint("prewrite", 1),
    CrashPoint("prewrite", 2),
    CrashPoint("commit_point"),
    CrashPoint("commit", 0),
    CrashPoint("commit", 1),
]
MAX_OPEN = 4


@dataclass
class Open:
    """An open transaction and the writes it buffered, as the model sees them."""

    txn: Transaction
    writes: dict[Key, bytes | None] = field(default_factory=dict)


@dataclass
class Model:
    """Snapshot isolation's answer for every read and commit: the committed write sets
    with their commit timestamps."""

    history: list[tuple[int, dict[Key, bytes | None]]] = field(default_factory=list)

    def snapshot(self, start_ts: int, own: dict[Key, bytes | None] | None = None
                 ) -> dict[Key, bytes]:
        """The state a transaction that started at *start_ts* sees, with its *own*
        buffered writes over it (None: a delete)."""
        state: dict[Key, bytes | None] = {}
        for commit_ts, writes in sorted(self.history, key=lambda h: h[0]):
            if commit_ts < start_ts:
                state.update(writes)
        state.update(own or {})
        return {k: v for k, v in state.items() if v is not None}

    def conflicts(self, start_ts: int, writes: dict[Key, bytes | None]) -> bool:
        """Whether a transaction that committed after *start_ts* wrote one of *writes*."""
        return any(commit_ts > start_ts and w.keys() & writes.keys()
                   for commit_ts, w in self.history)

    def committed(self, commit_ts: int, writes: dict[Key, bytes | None]) -> None:
        if writes:
            self.history.append((commit_ts, dict(writes)))

    def rows(self, start_ts: int, own: dict[Key, bytes | None], table: str,
             start: bytes | None = None, stop: bytes | None = None
             ) -> list[tuple[bytes, dict[str, bytes]]]:
        """What a scan of *table* over ``[start, stop)`` returns."""
        found: dict[bytes, dict[str, bytes]] = {}
        for (t, r, c), v in sorted(self.snapshot(start_ts, own).items()):
            if t == table and (start is None or r >= start) and (stop is None or r < stop):
                found.setdefault(r, {})[c] = v
        return sorted(found.items())


class Driver:
    """One random walk: each step picks an action the way the hypothesis machine's
    rules do, and checks its outcome against the model. A walk owns the rows of
    *walk* (``w<walk>r1``...) in both tables, so walks share the tables but not the
    model; its scans stay within its rows."""

    def __init__(self, cluster: Cluster, names: dict[str, str], walk: int,
                 rng: random.Random, result: CheckResult) -> None:
        self.cluster, self.names, self.rng, self.result = cluster, names, rng, result
        self.model = Model()
        self.open: list[Open] = []
        prefix = b"w%d" % walk
        self.rows = tuple(prefix + r for r in ROWS)
        self.keys: list[Key] = [(t, r, c) for t in TABLES for r in self.rows for c in COLUMNS]
        self.bounds = (prefix, prefix + b"\xff")

    def step(self) -> None:
        actions: list[tuple[float, Callable[[], None]]] = [
            (1.0 if len(self.open) < MAX_OPEN else 0.0, self.begin)]
        if self.open:
            actions += [(2, self.get), (1, self.get_row), (1, self.scan), (3, self.write),
                        (1.5, self.commit), (0.3, self.rollback), (0.5, self.crash)]
        if len(self.open) >= 2:
            actions.append((0.7, self.write_in_every_open_transaction))
        weights = [w for w, _ in actions]
        self.rng.choices([a for _, a in actions], weights)[0]()

    def _pick(self) -> Open:
        return self.rng.choice(self.open)

    def _read(self, what: str, h: Open, got: object, want: object) -> None:
        if got != want:
            raise Anomaly("snapshot read", f"{what} in transaction {h.txn.start_ts}: got "
                          f"{got!r}, the snapshot at its start timestamp holds {want!r}")
        self.result.count("reads checked")

    def begin(self) -> None:
        # Another client of the cluster (an identity of its own), so that the
        # transaction can die at a step of its commit while the others live on.
        self.open.append(Open(Transaction(client_of(self.cluster))))

    def get(self) -> None:
        h = self._pick()
        key = self.rng.choice(self.keys)
        table, row, column = key
        got = h.txn.get(self.names[table], row, column)
        self._read(f"get {key}", h, got, self.model.snapshot(h.txn.start_ts, h.writes).get(key))

    def get_row(self) -> None:
        h = self._pick()
        table, row = self.rng.choice(TABLES), self.rng.choice(self.rows)
        want = {c: v for (t, r, c), v in self.model.snapshot(h.txn.start_ts, h.writes).items()
                if (t, r) == (table, row)}
        got = h.txn.get_row(self.names[table], row, list(COLUMNS))
        self._read(f"get_row {table}/{row!r}", h, got, want)

    def scan(self) -> None:
        h = self._pick()
        table = self.rng.choice(TABLES)
        start = self.rng.choice((self.bounds[0], *self.rows))
        stop = self.rng.choice((*self.rows, self.bounds[1]))
        got = list(h.txn.scan(self.names[table], start, stop))
        self._read(f"scan {table} [{start!r}, {stop!r})", h, got,
                   self.model.rows(h.txn.start_ts, h.writes, table, start, stop))

    def write(self) -> None:
        h = self._pick()
        key = self.rng.choice(self.keys)
        table, row, column = key
        if self.rng.random() < 0.2:
            h.txn.delete(self.names[table], row, column)
            h.writes[key] = None
        else:
            value = self.rng.randbytes(self.rng.randint(0, 4))
            h.txn.set(self.names[table], row, column, value)
            h.writes[key] = value

    def write_in_every_open_transaction(self) -> None:
        """Contended cells: without this, random writes rarely collide."""
        key = self.rng.choice(self.keys[:3])
        table, row, column = key
        value = self.rng.randbytes(self.rng.randint(1, 2))
        for h in self.open:
            h.txn.set(self.names[table], row, column, value)
            h.writes[key] = value

    def _conflict_expected(self, h: Open) -> bool:
        return self.model.conflicts(h.txn.start_ts, h.writes)

    def commit(self) -> None:
        h = self._pick()
        self.open.remove(h)
        expect_conflict = self._conflict_expected(h)
        try:
            commit_ts = h.txn.commit()
        except ConflictError as e:
            if not expect_conflict:
                raise Anomaly("spurious conflict", f"transaction {h.txn.start_ts} failed "
                              f"({e}); no transaction that committed after its start wrote "
                              "any of its cells") from None
            self.result.count("conflicts")
            return
        if expect_conflict:
            raise Anomaly("lost update", f"transaction {h.txn.start_ts} committed at "
                          f"{commit_ts}; a transaction that committed after its start wrote "
                          "one of its cells, so it must have failed with ConflictError")
        self.result.count("commits")
        if h.writes and commit_ts <= h.txn.start_ts:
            raise Anomaly("timestamps", f"transaction {h.txn.start_ts} committed at "
                          f"{commit_ts}, not after its start: are timestamps repeating?")
        self.model.committed(commit_ts, h.writes)

    def rollback(self) -> None:
        h = self._pick()
        self.open.remove(h)
        h.txn.rollback()

    def crash(self) -> None:
        h = self._pick()
        self.open.remove(h)
        point = self.rng.choice(CRASH_POINTS)
        expect_conflict = self._conflict_expected(h)
        try:
            reached = crash_commit(h.txn, point)
        except ConflictError:
            if not expect_conflict:
                raise Anomaly("spurious conflict", f"transaction {h.txn.start_ts} (to crash "
                              f"at {point}) failed with ConflictError; no transaction that "
                              "committed after its start wrote any of its cells") from None
            return
        self.result.count(f"crashes at {point.phase}")
        if reached and h.writes:
            if expect_conflict:
                raise Anomaly("lost update", f"transaction {h.txn.start_ts} reached its "
                              "commit point although a transaction that committed after "
                              "its start wrote one of its cells")
            assert h.txn.commit_ts is not None
            self.model.committed(h.txn.commit_ts, h.writes)

    def finish(self) -> None:
        """Roll back what is open; then a fresh transaction must read the model's state
        (resolving every crashed transaction's locks), and no lock may be left."""
        for h in self.open:
            h.txn.rollback()
        self.open.clear()
        with Transaction(self.cluster) as final:
            for table in TABLES:
                got = list(final.scan(self.names[table], *self.bounds))
                want = self.model.rows(final.start_ts, {}, table)
                if got != want:
                    raise Anomaly("final state", f"table {table} holds {got!r}; the "
                                  f"committed transactions give {want!r}")
        left = unresolved_locks(self.cluster, list(self.names.values()), *self.bounds)
        if left:
            raise Anomaly("unresolved lock", f"{len(left)} lock(s) left after every "
                          f"transaction ended and a full read: {left[:3]}")


MAX_ANOMALIES = 10
"""A walk that met this many anomalies stops: the cluster is not conformant, and its
model no longer predicts anything useful."""


LOCK_TTL = 0.5
"""Seconds this check's client honours a lock whose owner's liveness it cannot learn.
A crashed transaction's owner is an identity of this process (``client_of``), which
ZooKeeper coordination does not know: a reader that meets its lock waits out the ttl.
Only crashed transactions leave locks for others to meet here (every other commit
runs to its end before the next step), so a short ttl rolls back no live one."""


def check(target: Target, result: CheckResult) -> None:
    """Random walks of 40 steps each until the deadline (at least one)."""
    names = {t: target.table(f"si_{t}") for t in TABLES}
    with target.connection.connect(lock_ttl=LOCK_TTL) as cluster:
        walk = 0
        while walk == 0 or target.remaining() > 0:
            driver = Driver(cluster, names, walk, target.rng, result)
            try:
                for _ in range(40):
                    driver.step()
            except Anomaly as a:
                result.add(a.kind, a.detail)
            finally:
                try:
                    driver.finish()
                except Anomaly as a:
                    result.add(a.kind, a.detail)
            walk += 1
            result.count("walks")
            if result.anomaly_count() >= MAX_ANOMALIES:
                break
