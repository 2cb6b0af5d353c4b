"""Embedded mode (no ZooKeeper): a killed process's locks are resolved at once (pid gone)."""

from __future__ import annotations

import signal
import sys
import time

import percolator
from percolator._internals import internals
from tests.coordination._helpers import child, lock_of, read_line


def test_killed_local_owner_is_resolved_at_once(store_url: str) -> None:
    with child("lock", store_url, "-", "60") as proc:
        owner = read_line(proc, "LOCKED ")
        with percolator.connect(store_url, lock_ttl=60.0) as cluster:
            primary = lock_of(cluster, "t", b"r1", "c:v")
            assert primary is not None and primary.owner == owner
            assert internals(cluster).coordination.is_alive(owner) is True
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert internals(cluster).coordination.is_alive(owner) is False
            with cluster.transaction() as txn:
                assert txn.get("t", b"r2", "c:v") == b"old"
            assert time.time() * 1000 < primary.wall_ms + primary.ttl_ms
            assert lock_of(cluster, "t", b"r1", "c:v") is None
            assert lock_of(cluster, "t", b"r2", "c:v") is None


def test_embedded_mode_imports_no_kazoo(store_url: str) -> None:
    import subprocess

    code = (
        "import sys, percolator\n"
        f"c = percolator.connect({store_url!r})\n"
        "c.close()\n"
        "assert 'kazoo' not in sys.modules, 'kazoo imported in embedded mode'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_local_owner_of_another_boot_or_reused_pid_is_dead(store_url: str) -> None:
    """A reboot kills every owner of the previous boot even where pids repeat, and a pid
    now held by another process (another start time) is not its former owner."""
    with percolator.connect(store_url) as cluster:
        owner = internals(cluster).coordination.current_owner()
        kind, host, boot, pid, started, nonce = owner.split("/")
        assert internals(cluster).coordination.is_alive(owner) is True
        other_boot = "00000000-0000-4000-8000-" + boot[-12:][::-1]
        assert other_boot != boot
        assert internals(cluster).coordination.is_alive(
            "/".join((kind, host, other_boot, pid, started, nonce))) is False
        assert internals(cluster).coordination.is_alive(
            "/".join((kind, host, boot, pid, str(int(started) + 1), nonce))) is False
