"""Lock owners in ZooKeeper: a dead owner's locks go at once, a live owner's wait for the ttl."""

from __future__ import annotations

import signal
import time

import pytest

import percolator
from percolator._internals import internals
from percolator._retry import LOCK_WAIT
from tests.coordination._helpers import child, lock_of, read_line

pytestmark = pytest.mark.zk


def test_killed_owner_is_resolved_within_the_session_timeout_not_the_ttl(
    store_url: str, zk_chroot: str
) -> None:
    with percolator.connect(
        store_url, zookeeper=zk_chroot, zookeeper_session_timeout=2.0, lock_ttl=60.0
    ) as cluster, child("lock", store_url, zk_chroot, "60") as proc:
        owner = read_line(proc, "LOCKED ")
        primary = lock_of(cluster, "t", b"r1", "c:v")
        assert primary is not None and primary.owner == owner
        assert primary.ttl_ms == 60_000
        assert internals(cluster).coordination.is_alive(owner) is True

        proc.send_signal(signal.SIGKILL)  # mid-commit: both cells locked, nothing committed
        proc.wait()
        # The read blocks on r2's lock until ZooKeeper expires the dead owner's session.
        with cluster.transaction() as txn:
            assert txn.get("t", b"r2", "c:v") == b"old"
            assert txn.get("t", b"r1", "c:v") == b"old"
        # ... which happened long before the lock's ttl ran out.
        assert time.time() * 1000 < primary.wall_ms + primary.ttl_ms
        assert internals(cluster).coordination.is_alive(owner) is False
        assert lock_of(cluster, "t", b"r1", "c:v") is None
        assert lock_of(cluster, "t", b"r2", "c:v") is None
        assert internals(cluster).stats["locks_resolved"] >= 2


def test_slow_but_live_owner_is_not_rolled_back_before_its_ttl(
    store_url: str, zk_chroot: str
) -> None:
    with percolator.connect(
        store_url, zookeeper=zk_chroot, zookeeper_session_timeout=2.0, lock_wait=0.5
    ) as cluster, child("lock", store_url, zk_chroot, "4") as proc:
        owner = read_line(proc, "LOCKED ")
        primary = lock_of(cluster, "t", b"r1", "c:v")
        assert primary is not None and primary.owner == owner

        with pytest.raises(percolator.LockedError):  # alive and within its ttl: left alone
            cluster.transaction().get("t", b"r2", "c:v")
        assert lock_of(cluster, "t", b"r1", "c:v") == primary
        assert internals(cluster).coordination.is_alive(owner) is True

        internals(cluster).lock_wait_policy = LOCK_WAIT.with_(deadline=30.0)
        with cluster.transaction() as txn:
            assert txn.get("t", b"r2", "c:v") == b"old"
        # Rolled back only once its wall time was past the ttl, its owner still running.
        assert time.time() * 1000 >= primary.wall_ms + primary.ttl_ms
        assert proc.poll() is None
        assert internals(cluster).coordination.is_alive(owner) is True
        assert lock_of(cluster, "t", b"r1", "c:v") is None


def test_closed_owner_is_dead_at_once(store_url: str, zk_chroot: str) -> None:
    with percolator.connect(store_url, zookeeper=zk_chroot) as observer:
        other = percolator.connect(store_url, zookeeper=zk_chroot)
        owner = internals(other).coordination.current_owner()
        assert internals(observer).coordination.is_alive(owner) is True
        other.close()
        deadline = time.monotonic() + 10
        while internals(observer).coordination.is_alive(owner) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert internals(observer).coordination.is_alive(owner) is False


def test_liveness_is_served_from_the_watch_cache(store_url: str, zk_chroot: str) -> None:
    with percolator.connect(store_url, zookeeper=zk_chroot) as a, percolator.connect(
        store_url, zookeeper=zk_chroot
    ) as b:
        owner = internals(b).coordination.current_owner()
        while internals(a).coordination.is_alive(owner) is not True:
            time.sleep(0.01)
        ops = internals(a).coordination.stats["zk_ops"]
        for _ in range(1000):
            assert internals(a).coordination.is_alive(owner) is True
            assert internals(a).coordination.current_owner()
        for i in range(20):
            with a.transaction() as txn:
                txn.set("t", b"r%d" % i, "c:v", b"x")
        assert internals(a).coordination.stats["zk_ops"] == ops
        # Owners of other namespaces, and embedded owners, are unknown rather than dead.
        assert internals(a).coordination.is_alive("zk/otherclusterid/o-123") is None
        assert internals(a).coordination.is_alive("local/h/b/1/2/x") is None
