"""ZooKeeper over TLS (its secureClientPort, client certificates required): liveness,
advisory locks, the observed registry and the published configuration, with the oracle's
TLS file paths (never their content) learnt from it; a clear TlsError, at once, for each
way the handshake cannot succeed.

The failing connections get a 60 s connect timeout under a 30 s pytest-timeout: a client
that retried until its timeout (kazoo's own behaviour) fails the test by timing out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import percolator
from oracle import OracleClient, OracleServer
from percolator import TlsConfig, TlsError
from percolator._internals import internals
from percolator._zk_client import make_client, start_client
from percolator._zookeeper import ZooKeeperCoordination, publish_config
from tests._tls import TestCA
from tests._zookeeper import TlsZooKeeper

pytestmark = pytest.mark.zk

ROOT = Path(__file__).resolve().parents[2]

LONG = 60.0


@pytest.fixture
def tls_oracle(tmp_path: object) -> Iterator[tuple[OracleServer, TlsConfig]]:
    """A mutual-TLS oracle of its own CA, and the client TlsConfig it accepts."""
    ca = TestCA(os.path.join(str(tmp_path), "oracle-ca"), "oracle CA")
    cert = ca.issue("oracle")
    server = OracleServer(
        "127.0.0.1:0",
        state_file=os.path.join(str(tmp_path), "ceiling"),
        tls=TlsConfig(ca=ca.ca, cert=cert.cert, key=cert.key),
    )
    server.start()
    try:
        yield server, ca.client_tls(ca.issue("client", client=True))
    finally:
        server.stop()


def wait_for(predicate: object, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def test_liveness_locks_and_config_over_tls(
    store_url: str, tls_zookeeper: TlsZooKeeper, tls_oracle: tuple[OracleServer, TlsConfig]
) -> None:
    server, oracle_tls = tls_oracle
    chroot = tls_zookeeper.chroot()
    zk_tls = tls_zookeeper.tls
    publish_config(
        chroot, store=store_url, oracle=f"grpcs://127.0.0.1:{server.port}",
        oracle_tls=oracle_tls, zookeeper_tls=zk_tls,
    )
    # Paths only, never key material, in ZooKeeper.
    hosts, _, path = chroot.partition("/")
    raw = make_client(hosts, session_timeout=10.0, tls=zk_tls)
    start_client(raw, hosts, 10.0, zk_tls)
    try:
        published = json.loads(raw.get(f"/{path}/percolator/config")[0])
    finally:
        raw.stop()
        raw.close()
    assert published["oracle_tls"] == {
        "ca": oracle_tls.ca, "cert": oracle_tls.cert, "key": oracle_tls.key
    }
    assert "PRIVATE KEY" not in json.dumps(published)

    with percolator.connect("zk://" + chroot, zookeeper_tls=zk_tls) as a, \
            percolator.connect("zk://" + chroot, zookeeper_tls=zk_tls) as b:
        # Config: store and oracle (with its TLS files) learnt from the TLS ZooKeeper.
        assert isinstance(internals(a).timestamps, OracleClient)
        with percolator.Transaction(a) as txn:
            txn.set("t", b"r3", "c:v", b"new")
        with percolator.Transaction(b) as txn:
            assert txn.get("t", b"r3", "c:v") == b"new"
        assert server._allocator.counters.served >= 3
        # The registry of observed columns: one client registers, the other's watch sees it.
        a.observe("t", "c:v")
        wait_for(lambda: ("t", "c:v") in b.observed_columns())
        # Advisory locks: a bucket leased by one process is refused to the other.
        ca_, cb = internals(a).coordination, internals(b).coordination
        assert ca_.try_advisory_lock("t/r1")
        assert not cb.try_advisory_lock("t/r1")
        # Liveness: each sees the other alive; a closed client is dead at once.
        owner_b = cb.current_owner()
        assert ca_.is_alive(owner_b) is True
        b.close()
        wait_for(lambda: ca_.is_alive(owner_b) is False)


@pytest.mark.timeout(30)
def test_plaintext_client_against_the_tls_port(tls_zookeeper: TlsZooKeeper) -> None:
    with pytest.raises(TlsError, match="speaks TLS but this client connects in plaintext"):
        ZooKeeperCoordination(tls_zookeeper.chroot(), connect_timeout=LONG)


@pytest.mark.timeout(30)
def test_client_without_certificate_is_refused(tls_zookeeper: TlsZooKeeper) -> None:
    with pytest.raises(TlsError) as info:
        ZooKeeperCoordination(
            tls_zookeeper.chroot(), connect_timeout=LONG, tls=TlsConfig(ca=tls_zookeeper.ca.ca)
        )
    assert "refused this client's TLS handshake" in str(info.value)
    assert "this client sent no certificate" in str(info.value)


@pytest.mark.timeout(30)
def test_client_trusting_another_ca(tls_zookeeper: TlsZooKeeper, tmp_path: object) -> None:
    other = TestCA(os.path.join(str(tmp_path), "other"))
    with pytest.raises(TlsError, match="this client does not trust the certificate of ZooKeeper"):
        ZooKeeperCoordination(
            tls_zookeeper.chroot(), connect_timeout=LONG,
            tls=other.client_tls(other.issue("c", client=True)),
        )


@pytest.mark.timeout(30)
def test_tls_client_against_a_plaintext_zookeeper(
    zk_chroot: str, tls_zookeeper: TlsZooKeeper
) -> None:
    with pytest.raises(TlsError, match="does not speak TLS"):
        ZooKeeperCoordination(zk_chroot, connect_timeout=LONG, tls=tls_zookeeper.tls)


def test_worker_over_tls_zookeeper_and_tls_oracle(
    tmp_path: Path, tls_zookeeper: TlsZooKeeper, tls_oracle: tuple[OracleServer, TlsConfig]
) -> None:
    """``python -m observers`` with ``--zookeeper-tls-*`` learns the store and the TLS oracle
    from the TLS ZooKeeper and processes a change (its flags reach connect). The oracle of
    the published configuration is its only timestamp source, so its commits went through
    mutual TLS to it too."""
    from observers import Worker, wait_for_observers
    from tests.observers import _app

    server, oracle_tls = tls_oracle
    chroot = tls_zookeeper.chroot()
    zk_tls = tls_zookeeper.tls
    url = f"sqlite:///{tmp_path}/worker.db"
    publish_config(
        chroot, store=url, oracle=f"grpcs://127.0.0.1:{server.port}",
        oracle_tls=oracle_tls, zookeeper_tls=zk_tls,
    )
    assert zk_tls.ca and zk_tls.cert and zk_tls.key
    with percolator.connect("zk://" + chroot, zookeeper_tls=zk_tls) as cluster:
        for table in ("docs", "log", "flaky"):
            cluster.create_table(table)
        Worker(cluster, _app.OBSERVERS).register()
        worker = subprocess.Popen(
            [sys.executable, "-m", "observers", "--cluster", "zk://" + chroot,
             "--observers", "tests.observers._app:OBSERVERS", "--threads", "2",
             "--zookeeper-tls-ca", zk_tls.ca, "--zookeeper-tls-cert", zk_tls.cert,
             "--zookeeper-tls-key", zk_tls.key, "--log-level", "WARNING"],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "worker.log", "ab"),  # noqa: SIM115
        )
        try:
            with percolator.Transaction(cluster) as txn:
                txn.set("docs", b"d1", "raw:v", b"hello")
            wait_for_observers(cluster, timeout=60)
            with percolator.Transaction(cluster) as txn:
                assert txn.get("docs", b"d1", "out:final") == b"hello"
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        finally:
            worker.terminate()
            worker.wait(30)


def test_status_command_over_tls_zookeeper(
    store_url: str, tls_zookeeper: TlsZooKeeper, capsys: pytest.CaptureFixture[str]
) -> None:
    from percolator.__main__ import main as percolator_main

    chroot = tls_zookeeper.chroot()
    zk_tls = tls_zookeeper.tls
    assert zk_tls.ca and zk_tls.cert and zk_tls.key
    publish_config(chroot, store=store_url, zookeeper_tls=zk_tls)
    flags = ["--zookeeper-tls-ca", zk_tls.ca, "--zookeeper-tls-cert", zk_tls.cert,
             "--zookeeper-tls-key", zk_tls.key]
    assert percolator_main(["status", "--cluster", "zk://" + chroot, *flags]) == 0
    assert "tables (1): t\n" in capsys.readouterr().out
    # Without the flags: a plaintext client against the TLS port, told so at once.
    assert percolator_main(["status", "--cluster", "zk://" + chroot]) == 2
    assert "speaks TLS but this client connects in plaintext" in capsys.readouterr().err
