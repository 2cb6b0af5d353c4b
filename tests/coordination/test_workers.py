"""Observer workers on ZooKeeper coordination ride out ZooKeeper's faults: a restart of
the ZooKeeper server and the expiry of the worker's own session. Nothing is lost, no
change commits twice, and no notification is quarantined for the outage."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import percolator
from observers import Observer, Worker, wait_for_observers
from percolator import TransactionBase
from percolator._internals import internals
from percolator._notifications import quarantined
from tests._zookeeper import ZooKeeperServer

pytestmark = pytest.mark.zk


class Copy(Observer):
    table, column = "docs", "in:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set("docs", row, "out:v", txn.get("docs", row, "in:v") or b"")


def _write(cluster: percolator.Cluster, row: bytes, value: bytes) -> None:
    """Commit, waiting out the ZooKeeper outage as an application would."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with percolator.Transaction(cluster) as txn:
                txn.set("docs", row, "in:v", value)
            return
        except (percolator.CoordinationError, percolator.ConflictError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# kazoo's ChildrenWatch re-reads its children in a handler thread when its watch fires;
# if the session expires at that moment the read raises SessionExpiredError there,
# uncaught (kazoo catches only ConnectionClosedError), and kazoo itself sets the watch
# again once the new session is up (allow_session_lost). What this test checks, that
# the worker carries on, holds either way; only that thread's exception is ignored.
@pytest.mark.filterwarnings(
    "ignore:Exception in thread .*_get_children:pytest.PytestUnhandledThreadExceptionWarning"
)
def test_worker_survives_zookeeper_restart_and_session_expiry(
    live_zookeeper: ZooKeeperServer, zk_chroot: str, store_url: str
) -> None:
    options = {"zookeeper": zk_chroot, "zookeeper_session_timeout": 2.0}
    worker_cluster = percolator.connect(store_url, **options)  # type: ignore[arg-type]
    writer = percolator.connect(store_url, **options)  # type: ignore[arg-type]
    worker_cluster.create_table("docs")
    commits: list[tuple[bytes, int]] = []
    lock = threading.Lock()

    def on_commit(
        observer: Observer, table: str, row: bytes, column: str, change: int, commit_ts: int
    ) -> None:
        with lock:
            commits.append((row, change))

    # Strict quarantine: two strikes would be enough to quarantine a notification.
    worker = Worker(
        worker_cluster, [Copy()], threads=2, on_commit=on_commit, max_failures=2, retry_delay=0.05
    )
    worker.start()
    final: dict[bytes, bytes] = {}
    try:
        for i in range(60):
            row = b"doc%d" % (i % 10)
            final[row] = b"v%d" % i
            _write(writer, row, final[row])
            if i == 20:
                # Down for longer than the sessions last: every session is lost.
                live_zookeeper.stop()
                time.sleep(3.5)
                live_zookeeper.start()
            if i == 40:
                client = internals(worker_cluster).coordination.client  # type: ignore[attr-defined]
                reconnected = time.monotonic() + 30
                while (
                    not (client.connected and client.client_id) and time.monotonic() < reconnected
                ):
                    time.sleep(0.05)  # the outage above cost the worker its session
                live_zookeeper.expire_session(client)
            time.sleep(0.02)
        wait_for_observers(writer, timeout=90)
    finally:
        worker.stop()
    snapshot = percolator.Transaction(writer)
    for row, value in final.items():
        assert snapshot.get("docs", row, "out:v") == value
    twice = [key for key, n in Counter(commits).items() if n > 1]
    assert not twice, f"changes committed twice: {twice}"
    assert not list(quarantined(writer))
    worker_cluster.close()
    writer.close()
