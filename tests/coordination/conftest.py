from __future__ import annotations

import pytest

from tests._zookeeper import ZooKeeperServer


@pytest.fixture
def store_url(seeded_sqlite_url: str) -> str:
    """These tests' store: ``seeded_sqlite_url`` (tests/_backends.py)."""
    return seeded_sqlite_url


@pytest.fixture
def live_zookeeper(zookeeper: ZooKeeperServer) -> ZooKeeperServer:
    """The session ZooKeeper, started again if an earlier test left it down."""
    if not zookeeper.running:
        zookeeper.start()
    return zookeeper
