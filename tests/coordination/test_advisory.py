"""Advisory locks for the observer scanners: hash-bucket leases in ZooKeeper."""

from __future__ import annotations

import time

import pytest

from percolator._zookeeper import ZooKeeperCoordination

pytestmark = pytest.mark.zk


def test_bucket_leases_exclude_other_processes_and_are_free_inside_one(zk_chroot: str) -> None:
    a = ZooKeeperCoordination(zk_chroot, advisory_buckets=4, lease_idle=0.3)
    b = ZooKeeperCoordination(zk_chroot, advisory_buckets=4, lease_idle=0.3)
    try:
        keys = [f"t/{i}" for i in range(64)]
        bucket0 = [k for k in keys if a._bucket(k) == a._bucket(keys[0])]
        assert len(bucket0) > 2
        assert a.try_advisory_lock(bucket0[0])
        assert not a.try_advisory_lock(bucket0[0])  # exclusive inside the process too
        ops = a.stats["zk_ops"]
        for key in bucket0[1:]:  # same bucket: already leased, no ZooKeeper write
            assert a.try_advisory_lock(key)
            a.release_advisory_lock(key)
        assert a.stats["zk_ops"] == ops
        assert not b.try_advisory_lock(bucket0[1])  # another process: refused
        a.release_advisory_lock(bucket0[0])
        # After lease_idle of disuse a gives the lease back and b may take it.
        deadline = time.monotonic() + 20
        while not b.try_advisory_lock(bucket0[1]):
            assert time.monotonic() < deadline, "lease never given back"
            time.sleep(0.05)
        assert not a.try_advisory_lock(bucket0[2])
        b.release_advisory_lock(bucket0[1])
    finally:
        a.close()
        b.close()


def test_a_closed_holder_gives_its_leases_back(zk_chroot: str) -> None:
    a = ZooKeeperCoordination(zk_chroot, advisory_buckets=1, lease_idle=30)
    b = ZooKeeperCoordination(zk_chroot, advisory_buckets=1, lease_idle=30)
    try:
        assert a.try_advisory_lock("x")
        assert not b.try_advisory_lock("y")
        a.close()
        b._busy.clear()  # forget the refusal it remembers for lease_idle
        assert b.try_advisory_lock("y")
    finally:
        a.close()
        b.close()
