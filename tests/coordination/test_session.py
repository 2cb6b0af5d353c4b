"""Session states: expiry (LOST) and a ZooKeeper restart while clients commit."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest

import percolator
from percolator._internals import internals
from tests._concurrency import hold_locks
from tests._zookeeper import ZooKeeperServer
from tests.coordination._helpers import child, lock_of, read_line

pytestmark = pytest.mark.zk


def _wait(predicate: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_expired_session_drops_the_identity_and_registers_a_new_one(
    store_url: str, live_zookeeper: ZooKeeperServer
) -> None:
    chroot = live_zookeeper.create_chroot()
    with percolator.connect(
        store_url, zookeeper=chroot, zookeeper_session_timeout=2.0
    ) as worker, percolator.connect(store_url, zookeeper=chroot) as other:
        old = internals(worker).coordination.current_owner()
        # A transaction of the old identity is stranded mid-commit.
        txn = worker.transaction()
        txn.set("t", b"r1", "c:v", b"stranded")
        hold_locks(txn)
        assert lock_of(worker, "t", b"r1", "c:v") is not None

        live_zookeeper.expire_session(internals(worker).coordination.client)
        _wait(lambda: internals(worker).coordination.stats["sessions_lost"] == 1, "LOST")
        new = internals(worker).coordination.current_owner()  # waits for the re-registration
        assert new != old
        assert internals(worker).coordination.stats["registrations"] == 2
        _wait(lambda: internals(other).coordination.is_alive(old) is False,
              "the old owner to be dead")
        assert internals(other).coordination.is_alive(new) is True

        # Its stranded lock is rolled back at once; the worker carries on as the new owner.
        with other.transaction() as reader:
            assert reader.get("t", b"r1", "c:v") == b"old"
        with worker.transaction() as txn2:
            txn2.set("t", b"r2", "c:v", b"after")
        assert lock_of(worker, "t", b"r1", "c:v") is None
        with other.transaction() as reader:
            assert reader.get("t", b"r2", "c:v") == b"after"


def test_a_client_paused_past_its_session_cannot_commit_its_locks(
    store_url: str, live_zookeeper: ZooKeeperServer
) -> None:
    """A client stopped (SIGSTOP: a long GC pause) between its prewrite and its commit
    point, past its 2 s session: woken, it still believes itself connected, yet its
    commit raises and commits nothing, even though nobody touched its locks meanwhile
    (issue 21). Its confirmation of the session before the commit point is a round
    trip in which it learns that the session expired (or, when kazoo noticed the
    dropped connection first, that it is suspended: it cannot confirm either way)."""
    chroot = live_zookeeper.create_chroot()
    with percolator.connect(store_url, zookeeper=chroot) as other, \
            child("hold", store_url, chroot) as proc:
        owner = read_line(proc, "HELD")
        assert lock_of(other, "t", b"r1", "c:v") is not None
        proc.send_signal(signal.SIGSTOP)
        _wait(lambda: internals(other).coordination.is_alive(owner) is False,
              "its session to expire")
        assert lock_of(other, "t", b"r1", "c:v") is not None  # untouched
        proc.send_signal(signal.SIGCONT)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        outcome = read_line(proc, "OUTCOME")
        assert outcome.startswith("CoordinationError"), outcome
        assert "expired" in outcome or "suspended" in outcome, outcome
        with other.transaction() as reader:
            assert (reader.get("t", b"r1", "c:v"), reader.get("t", b"r2", "c:v")) == (
                b"old", b"old")


def test_zookeeper_restart_loses_nothing_and_rolls_back_no_live_lock(
    store_url: str, live_zookeeper: ZooKeeperServer, caplog: pytest.LogCaptureFixture
) -> None:
    hosts, _, path = live_zookeeper.create_chroot().partition("/")
    # kazoo waits up to session_timeout / len(hosts) for a connect handshake, so a
    # reconnect that reaches the port while the restarting server is not yet serving
    # can hang for the whole session timeout and then find its session expired (seen
    # in CI). Naming the one server four times gives it a 4-server ensemble's connect
    # timeout; the 40 s sessions outlive a JVM restart on a loaded machine.
    target = ",".join([hosts] * 4) + "/" + path
    clusters = [
        percolator.connect(store_url, zookeeper=target, zookeeper_session_timeout=40.0)
        for _ in range(3)
    ]
    stop = threading.Event()
    committed = [0] * len(clusters)
    errors: list[BaseException] = []

    @percolator.transactional
    def increment(txn: percolator.Transaction, row: bytes) -> None:
        value = txn.get("t", row, "c:n")
        for other in range(len(clusters)):  # meets the others' locks: resolution runs
            txn.get("t", b"counter%d" % other, "c:n")
        txn.set("t", row, "c:n", b"%d" % (int(value or b"0") + 1))

    def work(i: int) -> None:
        row = b"counter%d" % i
        while not stop.is_set():
            try:
                increment(clusters[i], row)
                committed[i] += 1
            except percolator.CoordinationError:
                continue  # paused too long while suspended: take new work later
            except BaseException as e:
                errors.append(e)
                return

    caplog.set_level(logging.INFO, logger="percolator._lock_resolver")
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(clusters))]
    try:
        for t in threads:
            t.start()
        _wait(lambda: min(committed) >= 5, "commits before the restart")
        before = list(committed)
        live_zookeeper.restart()
        _wait(lambda: all(internals(c).coordination.suspended is False for c in clusters),
              "reconnection")
        _wait(lambda: all(a > b + 5 for a, b in zip(committed, before, strict=True)),
              "commits after the restart")
    finally:
        stop.set()
        for t in threads:
            t.join()
    try:
        assert not errors, errors
        for i, cluster in enumerate(clusters):
            assert internals(cluster).coordination.stats["sessions_lost"] == 0
            assert internals(cluster).coordination.stats["registrations"] == 1
            with cluster.transaction() as txn:  # nothing lost
                assert txn.get("t", b"counter%d" % i, "c:n") == b"%d" % committed[i]
        assert not [r for r in caplog.records if "rolled back transaction" in r.getMessage()]
        assert any(internals(c).coordination.stats["suspended"] for c in clusters)
    finally:
        for cluster in clusters:
            cluster.close()
