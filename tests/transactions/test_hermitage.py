"""Isolation anomalies from Martin Kleppmann's Hermitage, on every backend.

Snapshot isolation prevents G0, G1a, G1b, G1c, OTV, PMP, P4 (lost update) and
G-single (read skew), and allows G2-item (write skew): the last test documents it.
Each test seeds ``x = 10``, ``y = 20`` (rows 1 and 2 of table ``test``).
"""

from __future__ import annotations

import pytest

import percolator
from percolator import Cluster, Transaction

V = "v:value"


@pytest.fixture
def db(cluster: Cluster) -> Cluster:
    cluster.create_table("test")
    with Transaction(cluster) as txn:
        txn.set("test", b"1", V, b"10")
        txn.set("test", b"2", V, b"20")
    return cluster


def value(db: Cluster, row: bytes) -> bytes | None:
    return Transaction(db).get("test", row, V)


def test_g0_write_cycles_prevented(db: Cluster) -> None:
    t1, t2 = Transaction(db), Transaction(db)
    t1.set("test", b"1", V, b"11")
    t2.set("test", b"1", V, b"12")
    t1.set("test", b"2", V, b"21")
    t1.commit()
    t2.set("test", b"2", V, b"22")
    with pytest.raises(percolator.ConflictError):
        t2.commit()
    assert (value(db, b"1"), value(db, b"2")) == (b"11", b"21")


def test_g1a_aborted_reads_prevented(db: Cluster) -> None:
    t1, t2 = Transaction(db), Transaction(db)
    t1.set("test", b"1", V, b"101")
    assert t2.get("test", b"1", V) == b"10"
    t1.rollback()
    assert t2.get("test", b"1", V) == b"10"
    assert [v[V] for _, v in t2.scan("test")] == [b"10", b"20"]


def test_g1b_intermediate_reads_prevented(db: Cluster) -> None:
    t1, t2 = Transaction(db), Transaction(db)
    t1.set("test", b"1", V, b"101")
    assert t2.get("test", b"1", V) == b"10"
    t1.set("test", b"1", V, b"11")
    t1.commit()
    assert t2.get("test", b"1", V) == b"10"
    assert value(db, b"1") == b"11"


def test_g1c_circular_information_flow_prevented(db: Cluster) -> None:
    t1, t2 = Transaction(db), Transaction(db)
    t1.set("test", b"1", V, b"11")
    t2.set("test", b"2", V, b"22")
    assert t1.get("test", b"2", V) == b"20"
    assert t2.get("test", b"1", V) == b"10"
    t1.commit()
    t2.commit()


def test_otv_observed_transaction_vanishes_prevented(db: Cluster) -> None:
    t1, t2, t3 = Transaction(db), Transaction(db), Transaction(db)
    t1.set("test", b"1", V, b"11")
    t1.set("test", b"2", V, b"19")
    t2.set("test", b"1", V, b"12")
    t1.commit()
    assert t3.get("test", b"1", V) == b"10"  # t3 started before t1 committed
    t2.set("test", b"2", V, b"18")
    assert t3.get("test", b"2", V) == b"20"
    with pytest.raises(percolator.ConflictError):
        t2.commit()
    assert t3.get("test", b"2", V) == b"20"
    t4 = Transaction(db)
    assert (t4.get("test", b"1", V), t4.get("test", b"2", V)) == (b"11", b"19")


def test_pmp_predicate_many_preceders_prevented(db: Cluster) -> None:
    t1, t2 = Transaction(db), Transaction(db)
    assert [r for r, v in t1.scan("test") if v[V] == b"30"] == []
    t2.set("test", b"3", V, b"30")
    t2.commit()
    assert [r for r, v in t1.scan("test") if v[V] == b"30"] == []


def test_pmp_write_predicate_prevented(db: Cluster) -> None:
    t1, t2 = Transaction(db), Transaction(db)
    for row, values in t1.scan("test"):
        t1.set("test", row, V, str(int(values[V]) + 10).encode())
    for row, values in t2.scan("test"):
        if values[V] == b"20":
            t2.delete("test", row, V)
    t1.commit()
    with pytest.raises(percolator.ConflictError):
        t2.commit()
    assert [v[V] for _, v in Transaction(db).scan("test")] == [b"20", b"30"]


def test_p4_lost_update_prevented(db: Cluster) -> None:
    t1, t2 = Transaction(db), Transaction(db)
    assert t1.get("test", b"1", V) == b"10"
    assert t2.get("test", b"1", V) == b"10"
    t1.set("test", b"1", V, b"11")
    t2.set("test", b"1", V, b"11")
    t1.commit()
    with pytest.raises(percolator.ConflictError):
        t2.commit()


def test_g_single_read_skew_prevented(db: Cluster) -> None:
    t1, t2 = Transaction(db), Transaction(db)
    assert t1.get("test", b"1", V) == b"10"
    assert t2.get_row("test", b"1", [V]) == {V: b"10"}
    assert t2.get("test", b"2", V) == b"20"
    t2.set("test", b"1", V, b"12")
    t2.set("test", b"2", V, b"18")
    t2.commit()
    assert t1.get("test", b"2", V) == b"20"
    assert dict(t1.scan("test")) == {b"1": {V: b"10"}, b"2": {V: b"20"}}


def test_g2_item_write_skew_is_allowed_under_snapshot_isolation(db: Cluster) -> None:
    """Two transactions read both rows and each writes a different one: no write-write
    conflict, so both commit. Snapshot isolation permits this (it is not
    serializable); applications that need the constraint must write a common cell."""
    t1, t2 = Transaction(db), Transaction(db)
    assert (t1.get("test", b"1", V), t1.get("test", b"2", V)) == (b"10", b"20")
    assert (t2.get("test", b"1", V), t2.get("test", b"2", V)) == (b"10", b"20")
    t1.set("test", b"1", V, b"11")
    t2.set("test", b"2", V, b"21")
    t1.commit()
    t2.commit()
    assert (value(db, b"1"), value(db, b"2")) == (b"11", b"21")
