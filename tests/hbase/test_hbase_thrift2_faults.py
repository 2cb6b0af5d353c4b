"""Faults of the Thrift2 data path on a real HBase (the session's): a connection the
network drops, an answer lost after ``checkAndMutate`` applied, the same call applied
twice (HBase's own client retries it without a nonce), and a scanner the server
forgot. A small TCP relay between the store and the real Thrift2 server plays the
network's part; the server and HBase behind it are real (docs/hbase.md, "Failures
and how they are met").
"""

from __future__ import annotations

import contextlib
import socket
import threading
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

pytestmark = pytest.mark.hbase

T = "t"


class Relay:
    """A TCP relay to *target*. Thrift's client waits for each answer before its next
    request, so the relay passes a request on and then the answer back, except for the
    first request that names :attr:`method` once :attr:`fault` is set: ``"drop"`` sends
    it, takes HBase's answer and closes the client's connection (the answer is lost);
    ``"replay"`` sends it twice and returns the second answer (a retry of an applied
    call)."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.hostport = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.method = b"checkAndMutate"
        self.fault: str | None = None
        self.played = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _take_fault(self, request: bytes) -> str | None:
        with self._lock:
            if self.fault is None or self.method not in request:
                return None
            fault, self.fault = self.fault, None
            self.played += 1
            return fault

    @staticmethod
    def _answer(server: socket.socket) -> bytes:
        """HBase's whole answer: what arrives until the line is quiet (loopback)."""
        server.settimeout(None)
        answer = server.recv(1 << 20)
        server.settimeout(0.05)
        with contextlib.suppress(TimeoutError):
            while more := server.recv(1 << 20):
                answer += more
        return answer

    def _serve(self, client: socket.socket) -> None:
        server = socket.create_connection(self.target)
        with contextlib.suppress(OSError):
            while request := client.recv(1 << 20):
                fault = self._take_fault(request)
                server.sendall(request)
                answer = self._answer(server)
                if fault == "replay":
                    server.sendall(request)
                    answer = self._answer(server)
                elif fault == "drop":
                    break  # the call applied; its answer never arrives
                client.sendall(answer)
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


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


def test_a_transaction_whose_commit_point_answer_is_lost_commits_once(
    relay: Relay, request: pytest.FixtureRequest,
) -> None:
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
                relay.fault = "drop"
            return original(*args, **kwargs)  # type: ignore[arg-type]

        internals(cluster).store.check_and_set = lose_the_commit_points_answer  # type: ignore[method-assign]
        txn.commit()
        assert relay.played == 1
        internals(cluster).store.check_and_set = original  # type: ignore[method-assign]
        assert Transaction(cluster).get("bank", b"alice", "bal:amount") == b"100"
        drop_tables(cluster)


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
