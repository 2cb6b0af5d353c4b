"""Replicated oracles elected through a real ZooKeeper: failover and fencing."""

from __future__ import annotations

import os
import signal
import time

import pytest

from oracle import OracleClient
from oracle._target import parse_zookeeper, zk_paths
from percolator._errors import OracleUnavailable
from tests._zookeeper import ZooKeeperServer
from tests.oracle.conftest import OracleProcess, Oracles, check_history, read_history

pytestmark = [pytest.mark.oracle, pytest.mark.zk]

SESSION_TIMEOUT = "1.5"


def start_replicas(oracles: Oracles, chroot: str, n: int) -> list[OracleProcess]:
    procs = [
        oracles.start("--zookeeper", chroot, "--session-timeout", SESSION_TIMEOUT) for _ in range(n)
    ]
    return procs


def wait_leader(procs: list[OracleProcess], timeout: float = 30.0) -> OracleProcess:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        leaders = [p for p in procs if p.process.poll() is None and p.is_leader()]
        if len(leaders) == 1:
            return leaders[0]
        time.sleep(0.05)
    logs = "\n".join(p.log() for p in procs)
    raise AssertionError(f"no single leader among {[p.address for p in procs]}:\n{logs}")


def published_leader(zookeeper: ZooKeeperServer, chroot: str) -> str | None:
    from kazoo.client import KazooClient

    target = parse_zookeeper(chroot)
    _, leader_path, _ = zk_paths(target.chroot)
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(timeout=10)
    try:
        data, _ = zk.get(leader_path) if zk.exists(leader_path) else (b"", None)
        return data.decode() or None
    finally:
        zk.stop()
        zk.close()


def test_failover_during_load_keeps_timestamps_unique_and_increasing(
    oracles: Oracles, zookeeper: ZooKeeperServer, zk_chroot: str, tmp_path: object
) -> None:
    procs = start_replicas(oracles, zk_chroot, 3)
    leader = wait_leader(procs)
    assert published_leader(zookeeper, zk_chroot) == leader.address
    stop = os.path.join(str(tmp_path), "stop")
    outs = [os.path.join(str(tmp_path), f"w{i}.txt") for i in range(2)]
    workers = [oracles.worker(f"zk://{zk_chroot}", out, threads=4, stop=stop) for out in outs]
    time.sleep(1.0)
    killed = []
    for _ in range(2):  # kill the leader twice, under load
        leader.kill()
        killed.append(leader)
        alive = [p for p in procs if p not in killed]
        leader = wait_leader(alive)
        assert published_leader(zookeeper, zk_chroot) == leader.address
        time.sleep(1.0)
    open(stop, "w").close()
    for w in workers:
        assert w.wait(60) == 0
    calls = read_history(outs)
    check_history(calls)
    with leader.status_client() as c:
        st = c.status()
    assert st.leader and st.mode == "zookeeper" and st.served > 0
    assert st.persisted_ceiling >= max(c[3] for c in calls)


def test_leader_whose_session_expires_stops_serving(oracles: Oracles, zk_chroot: str) -> None:
    procs = start_replicas(oracles, zk_chroot, 2)
    old = wait_leader(procs)
    other = next(p for p in procs if p is not old)
    with old.status_client() as c:
        before = c.get_timestamp()
    # Freeze the leader past its session timeout: ZooKeeper expires its session and the
    # standby takes over. When it wakes up it must not hand out a single timestamp more.
    os.kill(old.pid, signal.SIGSTOP)
    try:
        wait_leader([other])
    finally:
        os.kill(old.pid, signal.SIGCONT)
    with old.status_client(deadline=0.5) as c:
        with pytest.raises(OracleUnavailable, match="not leader"):
            c.get_timestamp()
        assert not c.status().leader
    with OracleClient(f"zk://{zk_chroot}", deadline=10) as c:
        after = c.get_timestamp()
    assert after > before
    # The deposed server stays a standby: still not serving.
    assert not old.is_leader() and other.is_leader()


def test_zk_client_waits_for_a_leader_then_raises_naming_the_target(zk_chroot: str) -> None:
    target = f"zk://{zk_chroot}"
    with OracleClient(target, deadline=0.5) as c, pytest.raises(OracleUnavailable) as info:
        c.get_timestamp()
    assert target in str(info.value) and "no oracle leader" in str(info.value)


def test_new_leader_starts_above_everything_served(oracles: Oracles, zk_chroot: str) -> None:
    procs = start_replicas(oracles, zk_chroot, 1)
    leader = wait_leader(procs)
    with OracleClient(f"zk://{zk_chroot}") as c:
        served = c.get_timestamps(5000)
        leader.kill()
        # A fresh server against the same ZooKeeper state resumes above the ceiling.
        procs = start_replicas(oracles, zk_chroot, 1)
        wait_leader(procs)
        assert c.get_timestamp() > served[-1]
