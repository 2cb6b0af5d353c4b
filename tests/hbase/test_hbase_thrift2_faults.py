"""Faults of the Thrift2 data path on a real HBase (the session's): a connection the
network drops, an answer lost after ``checkAndMutate`` applied, the same call applied
twice (HBase's own client retries it without a nonce), a ``createTable`` whose answers
never come (on both gateways) and one of a table not enabled, and a scanner the server
forgot. A small TCP relay between the store and the real Thrift server
(``tests/_thrift_relay.py``) plays the network's part; the server and HBase behind it
are real (docs/hbase.md, "Failures and how they are met").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import percolator
from percolator import StoreUnavailable, Transaction
from percolator._cas import lock_cas
from percolator._internals import internals
from percolator._store import Mutation, Read, Store
from percolator.stores import open_store
from tests._backends import drop_tables
from tests._hbase import hbase_store_url
from tests._thrift_relay import Relay

pytestmark = pytest.mark.hbase

T = "t"


@pytest.fixture
def relay(hbase_thrift2: str) -> Iterator[Relay]:
    r = Relay(hbase_thrift2)
    yield r
    r.close()


@pytest.fixture
def store(relay: Relay, request: pytest.FixtureRequest) -> Iterator[Store]:
    s = open_store(hbase_store_url(relay.hostport, request.node.name, api="thrift2"))
    s.create_table(T, {"l": 1, "d": 0, "w": 0})
    yield s
    drop_tables(s)
    s.close()


def _lock(store: Store, row: bytes) -> list[bytes]:
    return [v for _, v in store.read_rows(T, [row], [Read("l")]).get(row, {}).get("l:c", [])]


def test_a_lost_answer_of_an_applied_check_and_mutate_is_store_unavailable_not_false(
    store: Store, relay: Relay,
) -> None:
    relay.fault = "drop"
    with pytest.raises(StoreUnavailable):
        store.check_and_set(T, b"r", "l:c", None, b"LOCKED", [("d:c", 5, b"data")])
    assert relay.played == 1
    assert _lock(store, b"r") == [b"LOCKED"], "it applied: only its answer was lost"
    # The protocol's compare-and-set reads the cell again and knows it won.
    relay.fault = "drop"
    assert lock_cas(store, T, b"r", "l:c", b"LOCKED", b"FREE", [("w:c", 6, b"record")])
    assert relay.played == 2
    assert store.read_rows(T, [b"r"], [Read("w"), Read("d")]) == {
        b"r": {"w:c": [(6, b"record")], "d:c": [(5, b"data")]}}


def test_a_replayed_check_and_mutate_answers_false_and_the_protocol_reads_again(
    store: Store, relay: Relay,
) -> None:
    relay.fault = "replay"
    assert store.check_and_set(T, b"r", "l:c", None, b"LOCKED") is False, (
        "HBase applied the first attempt and answers the second no")
    assert _lock(store, b"r") == [b"LOCKED"]
    relay.fault = "replay"
    assert lock_cas(store, T, b"r", "l:c", b"LOCKED", b"FREE")
    assert relay.played == 2 and _lock(store, b"r") == [b"FREE"]


def test_reads_and_writes_go_on_over_a_dropped_connection(store: Store, relay: Relay) -> None:
    """A connection dropped after a safe call (a write at explicit timestamps) sent it
    once more on a new connection; the pool then replaces the dead one."""
    relay.method = b"mutateRow"
    relay.fault = "drop"
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 1, b"one")])])
    assert relay.played == 1
    assert store.read_rows(T, [b"r"], [Read("d")]) == {b"r": {"d:c": [(1, b"one")]}}


@pytest.mark.parametrize("fault", ["drop", "replay"])
def test_a_transaction_whose_commit_point_answer_is_lost_commits_once(
    relay: Relay, fault: str, request: pytest.FixtureRequest,
) -> None:
    """The commit point's ``checkAndMutate`` applies and its answer is lost (``drop``:
    StoreUnavailable) or is that of a second send (``replay``: False, the lock already
    changed by the first): the transaction reports its commit, once. With the commit
    point taking the store's answer as its outcome, ``replay`` fails with
    ConflictError."""
    with percolator.connect(hbase_store_url(relay.hostport, request.node.name,
                                            api="thrift2")) as cluster:
        cluster.one_phase_commit = False
        cluster.create_table("bank")
        txn = Transaction(cluster)
        txn.set("bank", b"alice", "bal:amount", b"100")
        original = internals(cluster).store.check_and_set
        calls = 0

        def lose_the_commit_points_answer(*args: object, **kwargs: object) -> bool:
            nonlocal calls
            calls += 1
            if calls == 2:  # the prewrite's, then the commit point's
                relay.fault = fault
            return original(*args, **kwargs)  # type: ignore[arg-type]

        internals(cluster).store.check_and_set = lose_the_commit_points_answer  # type: ignore[method-assign]
        txn.commit()
        assert relay.played == 1
        internals(cluster).store.check_and_set = original  # type: ignore[method-assign]
        assert Transaction(cluster).get("bank", b"alice", "bal:amount") == b"100"
        drop_tables(cluster)


@pytest.mark.parametrize("api", ["thrift2", "thrift1"])
def test_a_create_table_whose_answers_never_come_returns_once_the_table_is_usable(
    api: str, request: pytest.FixtureRequest,
) -> None:
    """Every ``createTable`` reaches HBase and its answer never comes back (the relay
    closes the connection at once, as a socket timeout on a slow create does), the
    store's resend on a new connection included: HBase creates the table on its own.
    ``create_table`` returns once the table is there and enabled, and the table is
    used at once. (It raised ``StoreUnavailable`` after the second lost answer, and a
    caller that went on met a table still being created.)"""
    relay = Relay(request.getfixturevalue("hbase_thrift2" if api == "thrift2" else
                                          "hbase_thrift"))
    relay.method, relay.fault, relay.repeat = b"createTable", "cut", True
    try:
        with percolator.connect(hbase_store_url(relay.hostport, request.node.name,
                                                api=api)) as cluster:
            cluster.create_table("bank")
            assert relay.played >= 2, "both sends of the create were cut"
            relay.fault = None
            with Transaction(cluster) as txn:
                txn.set("bank", b"alice", "bal:amount", b"100")
            assert Transaction(cluster).get("bank", b"alice", "bal:amount") == b"100"
            cluster.create_table("bank")  # again: it exists, with the same families
            drop_tables(cluster)
    finally:
        relay.close()


def test_create_table_of_an_existing_table_not_enabled_returns_once_it_is(
    hbase_thrift: str, request: pytest.FixtureRequest,
) -> None:
    """A table that exists but is disabled (as while another client creates it, or an
    operator alters it): ``create_table`` asks whether it is enabled until it is, and
    returns only then; the table is used at once. (It returned at once, its families
    checked, the table still disabled.)"""
    import happybase

    relay = Relay(hbase_thrift)
    url = hbase_store_url(relay.hostport, request.node.name, api="thrift1")
    try:
        with percolator.connect(url) as cluster:
            cluster.create_table("bank")
            physical = internals(cluster).store._name("bank")  # type: ignore[attr-defined]
            host, _, port = hbase_thrift.rpartition(":")
            raw = happybase.Connection(host, int(port))
            raw.disable_table(physical)
            relay.method, relay.fault, relay.repeat = b"isTableEnabled", "count", True
            creating = threading.Thread(target=cluster.create_table, args=("bank",))
            creating.start()
            deadline = time.monotonic() + 120
            while relay.played == 0 and creating.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert relay.played > 0 and creating.is_alive(), "create_table did not wait"
            raw.enable_table(physical)
            raw.close()
            creating.join(timeout=300)
            assert not creating.is_alive()
            relay.fault = None
            with Transaction(cluster) as txn:
                txn.set("bank", b"alice", "bal:amount", b"100")
            assert Transaction(cluster).get("bank", b"alice", "bal:amount") == b"100"
            drop_tables(cluster)
    finally:
        relay.close()


def test_a_scanner_the_server_forgot_is_opened_again_after_the_last_row(
    store: Store, hbase_thrift2: str,
) -> None:
    rows = [b"r%03d" % i for i in range(30)]
    store.mutate_rows(T, [Mutation(r, puts=[("d:c", 1, r)]) for r in rows])
    other = open_store(hbase_store_url(hbase_thrift2, "other", api="thrift2"))
    try:
        before = _probe_scanner(other)
        scan = store.scan(T, None, None, [Read("d")], batch_size=10)
        first = [next(scan)[0] for _ in range(10)]  # its first batch, scanner open
        after = _probe_scanner(other)
        # The server forgets it, as its expiry does ("Invalid scanner Id" next time):
        # the scanners opened between the probes are closed from another connection.
        forgotten = [i for i in range(before, after + 1) if _close_scanner(other, i)]
    finally:
        other.close()
    assert len(forgotten) >= 3  # the probes and the scan's
    assert first + [row for row, _ in scan] == rows


def _probe_scanner(store: Store) -> int:
    """The id of a new scanner of the server (ids count up)."""
    from percolator.stores._hbase_thrift2 import _t2

    return int(store._call(None, lambda client: client.openScanner(  # type: ignore[attr-defined]
        b"hbase:meta", _t2.TScan(caching=1))))


def _close_scanner(store: Store, scanner_id: int) -> bool:
    from percolator.stores._hbase_thrift2 import ANSWERED

    def close(client: object) -> bool:
        try:
            client.closeScanner(scanner_id)  # type: ignore[attr-defined]
            return True
        except ANSWERED:
            return False  # not one of the server's scanners (any more)

    return bool(store._call(None, close))  # type: ignore[attr-defined]
