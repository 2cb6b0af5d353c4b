"""Shared configuration in ZooKeeper: store, oracle and the registry of observed columns."""

from __future__ import annotations

import json

import pytest

import percolator
from percolator._internals import internals
from percolator._zookeeper import publish_config
from tests.coordination._helpers import child, read_line

pytestmark = pytest.mark.zk


def test_a_client_learns_the_store_from_the_zookeeper_address_alone(
    store_url: str, zk_chroot: str
) -> None:
    with pytest.raises(percolator.CoordinationError, match="publish_config"):
        percolator.connect("zk://" + zk_chroot)
    publish_config(zk_chroot, store=store_url)
    with percolator.connect("zk://" + zk_chroot) as cluster:
        # the store shows its url with one / before an absolute path (sqlite:////tmp/x
        # is sqlite:///tmp/x)
        assert internals(cluster).store.url == store_url.replace("sqlite:////", "sqlite:///")
        assert type(internals(cluster).coordination).__name__ == "ZooKeeperCoordination"
        with cluster.transaction() as txn:
            assert txn.get("t", b"r1", "c:v") == b"old"
        assert internals(cluster).coordination.config() == {"store": store_url, "oracle": None}


def test_bad_arguments_are_refused_at_the_door(zk_chroot: str) -> None:
    with pytest.raises(percolator.InvalidArgument, match="two ZooKeeper namespaces"):
        percolator.connect("zk://" + zk_chroot, zookeeper="127.0.0.1:1/other")
    with pytest.raises(percolator.InvalidArgument, match="host:port"):
        percolator.connect("zk://nohost/chroot")
    with pytest.raises(percolator.InvalidArgument, match="store url"):
        publish_config(zk_chroot, store="not a url")
    with pytest.raises(percolator.InvalidArgument, match="zookeeper_auth"):
        percolator.connect("sqlite:///tmp/x.db", zookeeper=zk_chroot, zookeeper_auth="nocolon")


def test_two_processes_see_a_newly_observed_column_without_restarting(
    store_url: str, zk_chroot: str
) -> None:
    publish_config(zk_chroot, store=store_url)
    url = "zk://" + zk_chroot
    with child("watch", url) as first, child("watch", url) as second:
        assert json.loads(read_line(first, "OBSERVED ")) == []
        assert json.loads(read_line(second, "OBSERVED ")) == []
        with percolator.connect("zk://" + zk_chroot) as cluster:
            cluster.observe("t", "c:v")
            assert cluster.observed_columns() == {("t", "c:v")}
            # Each watcher prints the change it got from its watch (they never poll ZooKeeper).
            assert json.loads(read_line(first, "OBSERVED ")) == [["t", "c:v"]]
            assert json.loads(read_line(second, "OBSERVED ")) == [["t", "c:v"]]
            # A commit to the newly observed column now sets its notify cell.
            with cluster.transaction() as txn:
                txn.set("t", b"r1", "c:v", b"new")
            cells = internals(cluster).store.read_rows("t", [b"r1"], [percolator._store.Read("n")])
            assert cells[b"r1"].get("n:c:v")


def test_observe_registers_in_zookeeper_only_with_zookeeper_coordination(
    store_url: str, zk_chroot: str, tmp_path: object
) -> None:
    # The coordination declares its registry (Coordination.observed_registry); a
    # cluster that missed it would keep the column in its meta table only.
    publish_config(zk_chroot, store=store_url)
    with percolator.connect("zk://" + zk_chroot) as cluster:
        cluster.observe("t", "c:v")
        registry = internals(cluster).coordination.observed_registry
        assert registry is not None
        assert registry.observed_columns() == {("t", "c:v")}
    with percolator.connect(f"sqlite:///{tmp_path}/local.db") as local:
        local.create_table("t")
        local.observe("t", "c:v")
        assert internals(local).coordination.observed_registry is None
        assert local.observed_columns() == {("t", "c:v")}
