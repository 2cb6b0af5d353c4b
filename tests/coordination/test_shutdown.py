"""A ZooKeeper client whose server is gone must still close.

kazoo's handler joins its callback threads with no timeout before stopping the
connection; a callback waiting for a reply (kazoo's DataWatch re-reads its node after a
reconnect) then hangs ``close()``, and kazoo's ``atexit`` hook (the same ``stop()``) the
interpreter's exit: a CI run passed every test and then never ended.
``bounded_stop_handler`` prevents it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from percolator._zookeeper import ZooKeeperCoordination
from tests._services import service_missing
from tests._zookeeper import ZooKeeperServer, java_available


def block_a_callback(coordination: ZooKeeperCoordination, started: threading.Event) -> None:
    """Run, in kazoo's callback thread, a read that waits for the (gone) server."""
    from kazoo.protocol.states import Callback

    client = coordination.client

    def read() -> None:
        started.set()
        client.get("/")  # queued until a connection that never comes

    client.handler.dispatch_callback(Callback("watch", read, ()))


@pytest.fixture
def own_zookeeper() -> Iterator[ZooKeeperServer]:
    """A private server: these tests kill it."""
    missing = java_available()
    if missing is not None:
        service_missing(missing)  # a failure in CI, a skip elsewhere
    server = ZooKeeperServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def test_close_returns_while_a_callback_waits_for_a_dead_server(
    own_zookeeper: ZooKeeperServer,
) -> None:
    coordination = ZooKeeperCoordination(own_zookeeper.hosts, session_timeout=30.0)
    own_zookeeper.kill()
    # The callback thread is busy either with this read or, before it, with kazoo's
    # DataWatch of the shared configuration re-reading its node: both wait for ever.
    block_a_callback(coordination, threading.Event())
    closer = threading.Thread(target=coordination.close, daemon=True)
    closer.start()
    closer.join(120)  # a hang detector, not a speed limit: stock kazoo never returns
    assert not closer.is_alive(), "close() hangs on a callback blocked by a dead server"
