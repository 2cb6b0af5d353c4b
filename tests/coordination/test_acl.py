"""Digest ACLs: the percolator namespace of a shared ZooKeeper is closed to others."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

import percolator
from percolator._internals import internals
from percolator._zookeeper import publish_config

pytestmark = pytest.mark.zk


def test_namespace_is_writable_only_with_the_credentials(store_url: str, zk_chroot: str) -> None:
    publish_config(zk_chroot, store=store_url, zookeeper_auth="app:secret")
    with percolator.connect("zk://" + zk_chroot, zookeeper_auth="app:secret") as cluster:
        cluster.observe("t", "c:v")
        assert internals(cluster).coordination.try_advisory_lock("t/1")
        hosts, _, chroot = zk_chroot.partition("/")
        stranger = KazooClient(hosts=hosts)
        stranger.start(timeout=10)
        try:
            base = f"/{chroot}/percolator"
            assert stranger.get(f"{base}/config")[0]  # readable
            with pytest.raises(NoAuthError):
                stranger.create(f"{base}/owners/o-fake", b"", ephemeral=True)
            with pytest.raises(NoAuthError):
                stranger.set(f"{base}/config", b"{}")
            with pytest.raises(NoAuthError):
                stranger.create(f"{base}/observed/evil", b"")
        finally:
            stranger.stop()
            stranger.close()
        # Without the credentials a client cannot even register.
        with pytest.raises(percolator.CoordinationError, match="zookeeper_auth"):
            percolator.connect("zk://" + zk_chroot)
