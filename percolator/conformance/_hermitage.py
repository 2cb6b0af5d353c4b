"""Isolation anomalies from Martin Kleppmann's Hermitage, as functions of a cluster.

Snapshot isolation prevents G0, G1a, G1b, G1c, OTV, PMP, P4 (lost update) and
G-single (read skew), and allows G2-item (write skew): the last case checks that it
commits. Each case starts from ``x = 10``, ``y = 20`` (rows 1 and 2 of its table, row
3 absent: :func:`seed`) and raises :class:`Anomaly` at the first step that differs
from what snapshot isolation gives. ``tests/transactions/test_hermitage.py`` runs
these same functions on every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from percolator._cluster import Cluster
from percolator._errors import ConflictError
from percolator._transaction import Transaction
from percolator.conformance._core import Anomaly, CheckResult, Target

V = "v:value"


@contextmanager
def _transactions(db: Cluster) -> Iterator[Callable[[], Transaction]]:
    """A factory of transactions, all rolled back at the end (a no-op for committed
    ones), so that a case stopped by an anomaly leaves no snapshot holding the
    cluster's garbage-collection safe point."""
    made: list[Transaction] = []

    def new() -> Transaction:
        made.append(Transaction(db))
        return made[-1]

    try:
        yield new
    finally:
        for txn in made:
            txn.rollback()


def _expect(kind: str, what: str, got: object, want: object) -> None:
    if got != want:
        raise Anomaly(kind, f"{what}: got {got!r}, snapshot isolation gives {want!r}")


def _expect_conflict(kind: str, what: str, txn: Transaction) -> None:
    try:
        txn.commit()
    except ConflictError:
        return
    raise Anomaly(kind, f"{what} committed; it must fail with ConflictError")


def _commit(what: str, txn: Transaction) -> None:
    try:
        txn.commit()
    except ConflictError as e:
        raise Anomaly("spurious conflict", f"{what} failed ({e}); nothing it wrote was "
                      "written by another transaction") from None


def _value(db: Cluster, table: str, row: bytes) -> bytes | None:
    with Transaction(db) as txn:
        return txn.get(table, row, V)


def seed(db: Cluster, table: str) -> None:
    """``x = 10``, ``y = 20``, row 3 absent."""
    with Transaction(db) as txn:
        txn.set(table, b"1", V, b"10")
        txn.set(table, b"2", V, b"20")
        txn.delete(table, b"3", V)


def g0_write_cycles(db: Cluster, t: str) -> None:
    with _transactions(db) as new:
        t1, t2 = new(), new()
        t1.set(t, b"1", V, b"11")
        t2.set(t, b"1", V, b"12")
        t1.set(t, b"2", V, b"21")
        _commit("T1", t1)
        t2.set(t, b"2", V, b"22")
        _expect_conflict("G0 write cycle", "T2, writing x and y after T1 committed both", t2)
    _expect("G0 write cycle", "x, y after T1 won", (_value(db, t, b"1"), _value(db, t, b"2")),
            (b"11", b"21"))


def g1a_aborted_reads(db: Cluster, t: str) -> None:
    with _transactions(db) as new:
        t1, t2 = new(), new()
        t1.set(t, b"1", V, b"101")
        _expect("G1a aborted read", "T2 reads x while T1 writes it", t2.get(t, b"1", V), b"10")
        t1.rollback()
        _expect("G1a aborted read", "T2 reads x after T1 rolled back", t2.get(t, b"1", V),
                b"10")
        _expect("G1a aborted read", "T2 scans after T1 rolled back",
                [v[V] for _, v in t2.scan(t)], [b"10", b"20"])


def g1b_intermediate_reads(db: Cluster, t: str) -> None:
    with _transactions(db) as new:
        t1, t2 = new(), new()
        t1.set(t, b"1", V, b"101")
        _expect("G1b intermediate read", "T2 reads x while T1 writes it", t2.get(t, b"1", V),
                b"10")
        t1.set(t, b"1", V, b"11")
        _commit("T1", t1)
        _expect("G1b intermediate read", "T2 (started before T1 committed) reads x",
                t2.get(t, b"1", V), b"10")
    _expect("G1b intermediate read", "x after T1 committed", _value(db, t, b"1"), b"11")


def g1c_circular_information_flow(db: Cluster, t: str) -> None:
    with _transactions(db) as new:
        t1, t2 = new(), new()
        t1.set(t, b"1", V, b"11")
        t2.set(t, b"2", V, b"22")
        _expect("G1c circular information flow", "T1 reads y written by open T2",
                t1.get(t, b"2", V), b"20")
        _expect("G1c circular information flow", "T2 reads x written by open T1",
                t2.get(t, b"1", V), b"10")
        _commit("T1", t1)
        _commit("T2", t2)


def otv_observed_transaction_vanishes(db: Cluster, t: str) -> None:
    kind = "OTV observed transaction vanishes"
    with _transactions(db) as new:
        t1, t2, t3 = new(), new(), new()
        t1.set(t, b"1", V, b"11")
        t1.set(t, b"2", V, b"19")
        t2.set(t, b"1", V, b"12")
        _commit("T1", t1)
        _expect(kind, "T3 (started before T1 committed) reads x", t3.get(t, b"1", V), b"10")
        t2.set(t, b"2", V, b"18")
        _expect(kind, "T3 reads y", t3.get(t, b"2", V), b"20")
        _expect_conflict(kind, "T2, writing x after T1 committed it", t2)
        _expect(kind, "T3 reads y again", t3.get(t, b"2", V), b"20")
        t4 = new()
        _expect(kind, "T4 (started after T1) reads x, y",
                (t4.get(t, b"1", V), t4.get(t, b"2", V)), (b"11", b"19"))


def pmp_predicate_many_preceders(db: Cluster, t: str) -> None:
    kind = "PMP predicate many preceders"
    with _transactions(db) as new:
        t1, t2 = new(), new()
        _expect(kind, "T1 scans for value 30", [r for r, v in t1.scan(t) if v[V] == b"30"], [])
        t2.set(t, b"3", V, b"30")
        _commit("T2", t2)
        _expect(kind, "T1 scans for value 30 after T2 inserted it",
                [r for r, v in t1.scan(t) if v[V] == b"30"], [])


def pmp_write_predicate(db: Cluster, t: str) -> None:
    kind = "PMP write predicate"
    with _transactions(db) as new:
        t1, t2 = new(), new()
        for row, values in t1.scan(t):
            t1.set(t, row, V, str(int(values[V]) + 10).encode())
        for row, values in t2.scan(t):
            if values[V] == b"20":
                t2.delete(t, row, V)
        _commit("T1", t1)
        _expect_conflict(kind, "T2, deleting y after T1 updated every row", t2)
        t3 = new()
        _expect(kind, "rows after T1 won", [v[V] for _, v in t3.scan(t)], [b"20", b"30"])


def p4_lost_update(db: Cluster, t: str) -> None:
    with _transactions(db) as new:
        t1, t2 = new(), new()
        _expect("P4 lost update", "T1 reads x", t1.get(t, b"1", V), b"10")
        _expect("P4 lost update", "T2 reads x", t2.get(t, b"1", V), b"10")
        t1.set(t, b"1", V, b"11")
        t2.set(t, b"1", V, b"11")
        _commit("T1", t1)
        _expect_conflict("P4 lost update", "T2, writing x after T1 committed it", t2)


def g_single_read_skew(db: Cluster, t: str) -> None:
    kind = "G-single read skew"
    with _transactions(db) as new:
        t1, t2 = new(), new()
        _expect(kind, "T1 reads x", t1.get(t, b"1", V), b"10")
        _expect(kind, "T2 reads x", t2.get_row(t, b"1", [V]), {V: b"10"})
        _expect(kind, "T2 reads y", t2.get(t, b"2", V), b"20")
        t2.set(t, b"1", V, b"12")
        t2.set(t, b"2", V, b"18")
        _commit("T2", t2)
        _expect(kind, "T1 reads y after T2 moved 2 from y to x", t1.get(t, b"2", V), b"20")
        _expect(kind, "T1 scans", dict(t1.scan(t)), {b"1": {V: b"10"}, b"2": {V: b"20"}})


def g2_item_write_skew_allowed(db: Cluster, t: str) -> None:
    """Two transactions read both rows and each writes a different one: no write-write
    conflict, so both commit. Snapshot isolation permits this (it is not
    serializable); applications that need the constraint must write a common cell."""
    with _transactions(db) as new:
        t1, t2 = new(), new()
        _expect("G2-item setup", "T1 reads x, y", (t1.get(t, b"1", V), t1.get(t, b"2", V)),
                (b"10", b"20"))
        _expect("G2-item setup", "T2 reads x, y", (t2.get(t, b"1", V), t2.get(t, b"2", V)),
                (b"10", b"20"))
        t1.set(t, b"1", V, b"11")
        t2.set(t, b"2", V, b"21")
        _commit("T1 (write skew is allowed under snapshot isolation)", t1)
        _commit("T2 (write skew is allowed under snapshot isolation)", t2)
    _expect("lost write", "x, y after both committed", (_value(db, t, b"1"), _value(db, t, b"2")),
            (b"11", b"21"))


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[Cluster, str], None]


CASES = [Case(f.__name__, f) for f in (
    g0_write_cycles, g1a_aborted_reads, g1b_intermediate_reads,
    g1c_circular_information_flow, otv_observed_transaction_vanishes,
    pmp_predicate_many_preceders, pmp_write_predicate, p4_lost_update, g_single_read_skew,
    g2_item_write_skew_allowed,
)]


def run_case(case: Case, db: Cluster, table: str) -> None:
    """Seed *table* and run *case* on it.

    :raises Anomaly: at the first step that snapshot isolation does not allow.
    """
    seed(db, table)
    case.run(db, table)


def check(target: Target, result: CheckResult) -> None:
    """Every case once, in one table reseeded before each."""
    table = target.table("hermitage")
    for case in CASES:
        try:
            run_case(case, target.cluster, table)
        except Anomaly as a:
            result.add(a.kind, f"{case.name}: {a.detail}")
        else:
            result.count("cases passed")
