"""The hbase backend against a test server that misbehaves as a real cluster does
(``tests/hbase_thrift_server``: fault hooks). Each test starts its own server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

import percolator
from percolator import Transaction
from percolator._errors import CommitUnknownError
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
