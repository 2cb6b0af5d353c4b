from __future__ import annotations

import pytest

import percolator
from tests._zookeeper import ZooKeeperServer


@pytest.fixture
def store_url(tmp_path: object) -> str:
    """A fresh embedded store with table ``t`` seeded: rows r1, r2 hold ``c:v = old``."""
    url = f"sqlite:///{tmp_path}/repo.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"r1", "c:v", b"old")
            txn.set("t", b"r2", "c:v", b"old")
    return url


@pytest.fixture
def live_zookeeper(zookeeper: ZooKeeperServer) -> ZooKeeperServer:
    """The session ZooKeeper, started again if an earlier test left it down."""
    if not zookeeper.running:
        zookeeper.start()
    return zookeeper
