"""The public test harness keeps its promises."""

from __future__ import annotations

import percolator
from percolator.testing import client_of, temporary_cluster


def test_closing_a_client_declares_it_dead_and_leaves_the_cluster_open() -> None:
    with temporary_cluster() as cluster:
        cluster.create_table("t")
        client = client_of(cluster)
        owner = client.coordination.current_owner()
        assert cluster.coordination.is_alive(owner)
        client.close()
        assert cluster.coordination.is_alive(owner) is False
        with percolator.Transaction(cluster) as txn:  # the shared store is still open
            txn.set("t", b"r", "c:q", b"v")
        assert percolator.Transaction(cluster).get("t", b"r", "c:q") == b"v"
