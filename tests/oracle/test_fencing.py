"""A deposed oracle leader, paused right before it persists its ceiling, wakes after
the new leader persisted: its write must be refused (fencing), deterministically.

Servers run in this process (real gRPC, a real ZooKeeper) so that the old leader's
allocator thread can be parked at the named pause point ``oracle.persist``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from oracle import OracleClient, OracleServer
from oracle._proto import timestamp_oracle_pb2 as pb
from oracle._proto import timestamp_oracle_pb2_grpc as pb_grpc
from oracle._target import parse_zookeeper, zk_paths
from percolator import OracleUnavailable
from percolator.testing import PausePoint
from tests._zookeeper import ZooKeeperServer

pytestmark = [pytest.mark.oracle, pytest.mark.zk]

BLOCK = 10


@pytest.fixture
def servers(zk_chroot: str) -> Iterator[list[OracleServer]]:
    started: list[OracleServer] = []
    yield started
    for server in started:
        server.stop(grace=0)


def start_server(servers: list[OracleServer], zk_chroot: str) -> OracleServer:
    server = OracleServer("127.0.0.1:0", zookeeper=zk_chroot, block_size=BLOCK,
                          session_timeout=4.0)
    server.start()
    servers.append(server)
    return server


def wait_leading(server: OracleServer, timeout: float = 30.0) -> OracleClient:
    client = OracleClient(f"grpc://{server.address}", deadline=30.0)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if client.status().leader:
                return client
        except OracleUnavailable:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{server.address} did not become leader")


def ceiling(zookeeper: ZooKeeperServer, zk_chroot: str) -> int:
    from kazoo.client import KazooClient

    _, _, ceiling_path = zk_paths(parse_zookeeper(zk_chroot).chroot)
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(timeout=10)
    try:
        return int(zk.get(ceiling_path)[0])
    finally:
        zk.stop()
        zk.close()


def depose(zookeeper: ZooKeeperServer, zk_chroot: str) -> None:
    """Remove the leader's election node, as ZooKeeper does when its session
    expires; the leader, paused, has not noticed."""
    from kazoo.client import KazooClient

    election_path, _, _ = zk_paths(parse_zookeeper(zk_chroot).chroot)
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(timeout=10)
    try:
        for child in zk.get_children(election_path):
            zk.delete(f"{election_path}/{child}")
    finally:
        zk.stop()
        zk.close()


def test_a_deposed_leader_cannot_persist_after_its_successor(
    servers: list[OracleServer], zookeeper: ZooKeeperServer, zk_chroot: str
) -> None:
    """Guards ``version=self._version`` in ``_ZooKeeperLeadership._persist``: without
    it the old leader's late write lowers the ceiling below what the new leader
    served, the old leader serves timestamps the new one served too, and a third
    leader, after the second dies, serves them again."""
    old = start_server(servers, zk_chroot)
    old_client = wait_leading(old)
    issued: list[int] = list(old_client.get_timestamps(BLOCK // 2))
    late: dict[str, object] = {}

    def ask_past_the_block() -> None:
        # One RPC, no client retries: what the old leader itself answers.
        with grpc.insecure_channel(old.address) as channel:
            stub = pb_grpc.TimestampOracleStub(channel)
            try:
                r = stub.GetTimestamps(pb.GetTimestampsRequest(count=2 * BLOCK), timeout=60)
                late["served"] = list(range(r.first, r.first + r.count))
            except grpc.RpcError as e:
                late["error"] = e.code()

    with PausePoint("oracle.persist") as point:
        asker = threading.Thread(target=ask_past_the_block)
        asker.start()
        assert point.reached(), "the old leader never tried to persist its ceiling"
        depose(zookeeper, zk_chroot)
        new = start_server(servers, zk_chroot)
        new_client = wait_leading(new)
        for _ in range(4):  # several blocks: the new leader persists past its start
            issued += new_client.get_timestamps(BLOCK)
        point.release()
        asker.join(timeout=60)
    assert not asker.is_alive()
    assert late.get("error") == grpc.StatusCode.FAILED_PRECONDITION, late
    assert ceiling(zookeeper, zk_chroot) >= max(issued)

    old.stop(grace=0)  # (fenced, it would stand for election again)
    new.stop(grace=0)  # dies before its next persist
    third = start_server(servers, zk_chroot)
    issued += wait_leading(third).get_timestamps(BLOCK)
    assert len(set(issued)) == len(issued), "a timestamp was served twice"
    assert issued == sorted(issued)

