"""The hbase backend against a test server that misbehaves as a real cluster does
(``tests/hbase_thrift_server``: fault hooks). Each test starts its own server."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

import percolator
from percolator import Transaction
from percolator._bulk import BulkLoad, LoadTxn, finish_rows, prewrite_rows
from percolator._encoding import LOCK
from percolator._errors import (
    CommitUnknownError,
    InvalidArgument,
    StoreUnavailable,
    ValueTooLargeError,
)
from percolator._internals import internals
from percolator._store import Mutation, Read
from percolator.stores import open_store
from percolator.stores.hbase import _peer_closed
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
    with _bank("--fault", fault) as cluster, pytest.raises(
            CommitUnknownError, match=r"failed at the commit point of transaction .*"
                                      "may or may not have committed"):
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


@pytest.mark.parametrize("at", ["check", "create"])
def test_a_racing_create_table_is_an_existing_table(at: str) -> None:
    """Another client creates the table after the store found it missing: before the
    Thrift server's own tableExists check (AlreadyExists), or between that check and
    its createTable (IOError(TableExistsException)). Either way the table exists and
    is used; its families are checked as any existing table's."""
    with faulty_server("--fault", f"create-race:at={at}") as hostport:
        store = open_store(f"hbase://{hostport}")
        try:
            store.create_table("t", {"d": 0, "l": 1})
            store.mutate_rows("t", [Mutation(b"r", [("d:q", 1, b"v")])])
            store.create_table("t", {"d": 0, "l": 1})
            with pytest.raises(InvalidArgument, match="without families"):
                store.create_table("t", {"x": 0})
            assert store.list_tables() == ["t"]
            assert store.read_rows("t", [b"r"], [Read("d")]) == {b"r": {"d:q": [(1, b"v")]}}
        finally:
            store.close()


# ---- connections, scanners, request sizes, transports -------------------------------


def _wait_until_dropped(store: object) -> None:
    """Wait for the server to close every idle pooled connection of *store*."""
    idle = [c for _, c in store._pool._idle]  # type: ignore[attr-defined]
    assert idle
    while not all(_peer_closed(c) for c in idle):
        time.sleep(0.05)


def test_connections_the_server_dropped_while_idle_are_replaced() -> None:
    # hbase.thrift.server.socket.read.timeout: the server closes idle connections.
    with faulty_server("--idle-timeout", "0.3") as hostport:
        store = open_store(f"hbase://{hostport}")
        try:
            store.create_table("t", {"d": 0, "l": 1})
            store.mutate_rows("t", [Mutation(b"r", [("d:q", 5, b"v")])])
            pooled = [c for _, c in store._pool._idle]  # type: ignore[attr-defined]
            assert not any(_peer_closed(c) for c in pooled)
            store.list_tables()
            assert [c for _, c in store._pool._idle] == pooled  # reused, not replaced
            _wait_until_dropped(store)
            # A compare-and-set is not safe to send twice: it must not meet a dead one.
            assert store.check_and_set("t", b"r", "l:q", None, b"x")
            _wait_until_dropped(store)
            assert store.read_rows("t", [b"r"], [Read("d")]) == {b"r": {"d:q": [(5, b"v")]}}
        finally:
            store.close()


def test_a_scan_whose_scanner_expired_goes_on_after_its_last_row() -> None:
    # HBase 2.4+ forgets a scanner unused for 120 s (here 0.2 s): "scanner ID is invalid".
    rows = [b"r%02d" % i for i in range(7)]
    with faulty_server("--scanner-expiry", "0.2") as hostport:
        store = open_store(f"hbase://{hostport}")
        try:
            store.create_table("t", {"d": 0})
            store.mutate_rows("t", [Mutation(r, [("d:q", 1, r)]) for r in rows])
            got = []
            for row, cells in store.scan("t", None, None, [Read("d")], batch_size=2):
                got.append((row, cells["d:q"][0][1]))
                if len(got) in (2, 5):
                    time.sleep(0.3)  # the caller is slow: the server forgets the scanner
            assert got == [(r, r) for r in rows]
        finally:
            store.close()


def test_mutations_over_the_request_cap_are_split() -> None:
    # libthrift 0.14+ drops a request over maxMessageSize (100 MB) with its connection.
    rows = [b"r%02d" % i for i in range(20)]
    value = b"x" * 300
    with faulty_server("--max-request-bytes", "3000") as hostport:
        store = open_store(f"hbase://{hostport}?max_request_bytes=2000")
        try:
            store.create_table("t", {"d": 0})
            store.mutate_rows("t", [Mutation(r, [("d:q", 1, value)]) for r in rows])
            got = store.read_rows("t", rows, [Read("d")])
            assert got == {r: {"d:q": [(1, value)]} for r in rows}
            with pytest.raises(ValueTooLargeError, match="max_request_bytes=2000"):
                store.mutate_rows("t", [Mutation(b"big", [("d:q", 1, b"x" * 2500)])])
        finally:
            store.close()


def test_framed_transport_and_compact_protocol_are_url_options() -> None:
    with faulty_server(transport="framed", protocol="compact") as hostport:
        store = open_store(f"hbase://{hostport}?transport=framed&protocol=compact")
        try:
            store.create_table("t", {"d": 0, "l": 1})
            store.mutate_rows("t", [Mutation(b"r", [("d:q", 5, b"v")])])
            assert store.check_and_set("t", b"r", "l:q", None, b"x")
            assert [row for row, _ in store.scan("t", None, None, [Read("d")])] == [b"r"]
        finally:
            store.close()
        # happybase's defaults (buffered, binary) cannot talk to that server
        with pytest.raises(StoreUnavailable):
            open_store(f"hbase://{hostport}?timeout=5").list_tables()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("transport=http", "transport='http'.*not supported.*socket mode"),
        ("transport=kerberos", "transport='kerberos'.*Kerberos.*not supported"),
        ("transport=zmq", "transport='zmq'.*must be one of"),
        ("protocol=json", "protocol='json'.*must be one of"),
        ("compression=brotli2", "compression='BROTLI2'"),
        ("idle_timeout=0", "idle_timeout"),
        ("max_request_bytes=x", "max_request_bytes"),
    ],
)
def test_bad_connection_options_are_refused(query: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        open_store(f"hbase://127.0.0.1:1?{query}")


def test_the_client_timeout_is_a_url_option() -> None:
    # A slow cluster (each call 1 s here, a region move on a real one): a timeout below
    # it fails, the default (120 s, above the Thrift server's own retries) waits.
    with faulty_server("--latency", "1") as hostport:
        with pytest.raises(StoreUnavailable, match="timed out"):
            open_store(f"hbase://{hostport}?timeout=0.2").list_tables()
        store = open_store(f"hbase://{hostport}")
        try:
            assert store.list_tables() == []
        finally:
            store.close()


@pytest.mark.parametrize(
    "fault",
    [
        f"cas-replay:prefix={COMMITTED}:skip=1:times=1",
        f"cas-drop:prefix={COMMITTED}:skip=1:times=1",
    ],
)
def test_a_lost_commit_answer_after_a_cleaner_rolled_the_commit_forward_is_a_commit(
    fault: str,
) -> None:
    # The commit CAS applied; before its committer reads the primary again, a reader
    # meets the secondary's lock, finds the primary COMMITTED and rolls both forward
    # (the primary becomes FREE): the cell no longer holds the committer's value, and
    # only the primary's write record tells that the commit happened.
    with _bank("--fault", fault) as cluster:
        cleaner = percolator.connect(internals(cluster).store.url)
        store = internals(cluster).store
        read_rows = store.read_rows
        cleaned = []

        def read_then_clean(table: str, rows: Any, reads: Any) -> Any:
            if not cleaned and len(reads) == 1 and reads[0].family == LOCK:  # lock_cas
                cleaned.append(Transaction(cleaner).get("bank", b"bob", "bal:v"))
            return read_rows(table, rows, reads)

        store.read_rows = read_then_clean  # type: ignore[method-assign]
        try:
            assert _transfer(cluster, 60) == 1
        finally:
            cleaner.close()
        assert cleaned == [b"60"]  # the reader saw the commit (it rolled it forward)
        assert _balances(cluster) == {b"alice": 40, b"bob": 60}


# ---- the bulk loader's commit point --------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        # Before, a replayed False at the commit point was "rolled back by a cleaner;
        # nothing is visible", and the loader then rolled back every cell of a load
        # whose primary had committed.
        f"cas-replay:prefix={COMMITTED}:times=1",
        f"cas-drop:prefix={COMMITTED}:times=1",
        # a cell's prewrite (skip=1: the load's primary), and its release
        f"cas-replay:prefix={LOCKED}:skip=1:times=1",
        "cas-replay:prefix=46:skip=1:times=1",
    ],
)
def test_a_bulk_load_whose_answers_are_lost_commits(fault: str) -> None:
    rows = [(b"r%d" % i, {"raw:html": b"page %d" % i}) for i in range(5)]
    with faulty_server("--fault", fault) as hostport, \
            percolator.connect(f"hbase://{hostport}") as cluster:
        cluster.create_table("docs")
        load = BulkLoad(cluster, "docs", "lost-answer")
        txn = load.begin({})
        assert isinstance(txn, LoadTxn)
        locked = list(prewrite_rows(cluster, txn, rows))
        commit_ts = load.commit({})
        finish_rows(cluster, txn, locked, commit_ts)
        snapshot = Transaction(cluster)
        assert {r: snapshot.get("docs", r, "raw:html") for r, _ in rows} == {
            r: cells["raw:html"] for r, cells in rows
        }
