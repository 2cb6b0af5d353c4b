"""The hbase backend against a test server that misbehaves as a real cluster does
(``tests/hbase_thrift_server``: fault hooks). Each test starts its own server."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

import percolator
from percolator import Transaction
from percolator._errors import CommitUnknownError, InvalidArgument
from percolator._store import Mutation, Read
from percolator.stores import open_store
from tests._concurrency import run_concurrently
from tests._hbase import faulty_server, require_hbase_client

pytestmark = pytest.mark.hbase

COMMITTED = "43"
"""Hex of b"C", the first byte of a COMMITTED lock value: the commit point's new value."""
LOCKED = "4c"
"""Hex of b"L", the first byte of a LOCKED lock value: a prewrite's new value."""


@pytest.fixture(autouse=True)
def _client_libraries() -> None:
    require_hbase_client()


@contextlib.contextmanager
def _bank(*options: str) -> Iterator[percolator.Cluster]:
    """alice 100, bob 0, on a test server of its own started with *options*."""
    with faulty_server(*options) as hostport, percolator.connect(f"hbase://{hostport}") as c:
        c.create_table("bank")
        with Transaction(c) as txn:
            txn.set("bank", b"alice", "bal:v", b"100")
            txn.set("bank", b"bob", "bal:v", b"0")
        yield c


def _balances(cluster: percolator.Cluster) -> dict[bytes, int]:
    return {row: int(v["bal:v"]) for row, v in Transaction(cluster).scan("bank")}


def _transfer(cluster: percolator.Cluster, amount: int) -> int:
    """Move *amount* from alice to bob; returns how many times the body ran."""
    runs = []

    @percolator.transactional
    def transfer(txn: percolator.Transaction) -> None:
        runs.append(1)
        alice = int(txn.get("bank", b"alice", "bal:v") or b"0")
        bob = int(txn.get("bank", b"bob", "bal:v") or b"0")
        txn.set("bank", b"alice", "bal:v", str(alice - amount).encode())
        txn.set("bank", b"bob", "bal:v", str(bob + amount).encode())

    transfer(cluster)
    return len(runs)


@pytest.mark.parametrize(
    "fault",
    [
        # checkAndPut applied, its answer lost, HBase's client retried: False.
        # (skip=1: the commit point of the accounts' opening.)
        f"cas-replay:prefix={COMMITTED}:skip=1:times=1",
        # checkAndPut applied, then the connection dropped without an answer
        f"cas-drop:prefix={COMMITTED}:skip=1:times=1",
        # the same at the prewrite of the secondary (skip=3: two locks of the opening,
        # the transfer's primary)
        f"cas-replay:prefix={LOCKED}:skip=3:times=1",
        f"cas-drop:prefix={LOCKED}:skip=3:times=1",
    ],
)
def test_transfer_commits_once_when_a_compare_and_set_answer_is_lost(fault: str) -> None:
    with _bank("--fault", fault) as cluster:
        assert _transfer(cluster, 60) == 1, "a lost answer cost a conflict and a retry"
        assert _balances(cluster) == {b"alice": 40, b"bob": 60}


def test_commit_point_whose_outcome_cannot_be_told_is_commit_unknown() -> None:
    # The connection drops before the compare-and-set applies: reading the primary
    # again shows our lock, which proves nothing (the call may still be on its way).
    fault = f"cas-drop:prefix={COMMITTED}:skip=1:times=1:apply=0"
    with _bank("--fault", fault) as cluster, pytest.raises(CommitUnknownError):
        _transfer(cluster, 60)


# ---- several Thrift servers behind a load balancer ----------------------------------


def test_scans_behind_a_round_robin_balancer_return_exactly_their_rows() -> None:
    # Two Thrift servers of the same tables behind a round-robin TCP proxy: scanner ids
    # belong to one server, and both servers hand out the same ids. A client with
    # connections to both scans two tables in small batches from several threads.
    rows = {name: [b"%s%03d" % (name.encode(), i) for i in range(24)] for name in ("a", "b")}
    with faulty_server("--servers", "2", "--latency", "0.001") as hostport:
        store = open_store(f"hbase://{hostport}?pool_size=2")
        try:
            for name in rows:
                store.create_table(name, {"d": 1})
                store.mutate_rows(name, [Mutation(r, [("d:q", 1, r)]) for r in rows[name]])

            def scan(i: int) -> None:
                name = "ab"[i % 2]
                for _ in range(3):
                    got = []
                    for row, _ in store.scan(name, None, None, [Read("d")], batch_size=2):
                        got.append(row)
                        time.sleep(0.001)  # the caller's work on a row: others go on meanwhile
                    assert got == rows[name]

            run_concurrently(scan, 8)
        finally:
            store.close()


# ---- tables -------------------------------------------------------------------------


def test_a_racing_create_table_is_an_existing_table() -> None:
    # Another client created the table between the Thrift server's tableExists check and
    # its createTable: IOError(TableExistsException), not AlreadyExists.
    with faulty_server("--fault", "create-race") as hostport:
        store = open_store(f"hbase://{hostport}")
        try:
            store.create_table("t", {"d": 0, "l": 1})
            store.create_table("t", {"d": 0, "l": 1})
            with pytest.raises(InvalidArgument, match="without families"):
                store.create_table("t", {"x": 0})
            assert store.list_tables() == ["t"]
        finally:
            store.close()
