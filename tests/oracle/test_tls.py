"""The oracle over TLS: mutual TLS, failover between TLS oracles elected through a TLS
ZooKeeper, and a clear, fast TlsError for each way a handshake cannot succeed.

"Fast" is checked without a timing threshold: every failing client has a 60 s deadline
and the test a 30 s pytest-timeout, so a client that retried until its deadline (the
behaviour before the handshake probe) fails the test by timing out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from oracle import OracleClient, OracleServer
from oracle._target import parse_published, parse_zookeeper, zk_paths
from percolator import InvalidArgument, TlsConfig, TlsError
from tests._tls import Issued, TestCA
from tests._zookeeper import TlsZooKeeper
from tests.oracle.conftest import ROOT, OracleProcess, Oracles, check_history, read_history

pytestmark = pytest.mark.oracle

LONG_DEADLINE = 60.0


@pytest.fixture
def ca(tmp_path: object) -> TestCA:
    return TestCA(os.path.join(str(tmp_path), "ca"))


def server_args(ca: TestCA, server: Issued, *, mutual: bool = True) -> list[str]:
    args = ["--tls-cert", server.cert, "--tls-key", server.key]
    return [*args, "--tls-client-ca", ca.ca] if mutual else args


def test_timestamps_over_mutual_tls(oracles: Oracles, ca: TestCA, tmp_path: object) -> None:
    client = ca.issue("client", client=True)
    proc = oracles.start(
        "--state-file", os.path.join(str(tmp_path), "ceiling"),
        *server_args(ca, ca.issue("oracle")),
        tls=ca.client_tls(client),
    )
    proc.wait_serving()
    assert "TLS with client certificates required (mutual TLS)" in proc.log()
    outs = [os.path.join(str(tmp_path), f"w{i}.txt") for i in range(2)]
    tls_args = ("--oracle-tls-ca", ca.ca, "--oracle-tls-cert", client.cert,
                "--oracle-tls-key", client.key)
    workers = [
        oracles.worker(f"grpcs://{proc.address}", out, threads=4, count=100, extra=tls_args)
        for out in outs
    ]
    for w in workers:
        assert w.wait(60) == 0
    calls = read_history(outs)
    assert len(calls) == 800
    check_history(calls)


def test_plaintext_server_says_so_in_its_log(oracles: Oracles, tmp_path: object) -> None:
    proc = oracles.start("--state-file", os.path.join(str(tmp_path), "ceiling"))
    proc.wait_serving()
    assert "PLAINTEXT (no TLS" in proc.log()


@pytest.fixture
def tls_server(ca: TestCA, tmp_path: object) -> Iterator[OracleServer]:
    """An in-process oracle requiring client certificates of *ca*."""
    server_cert = ca.issue("oracle")
    server = OracleServer(
        "127.0.0.1:0",
        state_file=os.path.join(str(tmp_path), "tls-ceiling"),
        tls=TlsConfig(ca=ca.ca, cert=server_cert.cert, key=server_cert.key),
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def draw_fails(target: str, tls: TlsConfig | None) -> str:
    with (
        OracleClient(target, deadline=LONG_DEADLINE, tls=tls) as c,
        pytest.raises(TlsError) as info,
    ):
        c.get_timestamp()
    return str(info.value)


@pytest.mark.timeout(30)
def test_client_trusting_another_ca_says_it_does_not_trust_the_server(
    tls_server: OracleServer, tmp_path: object
) -> None:
    other = TestCA(os.path.join(str(tmp_path), "other"))
    message = draw_fails(
        f"grpcs://127.0.0.1:{tls_server.port}", other.client_tls(other.issue("c", client=True))
    )
    assert "this client does not trust the certificate of the oracle" in message
    assert "unable to get local issuer certificate" in message and other.ca in message


@pytest.mark.timeout(30)
def test_expired_server_certificate_is_named(
    ca: TestCA, tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    expired = ca.issue("old-oracle", expired=True)
    server = OracleServer(
        "127.0.0.1:0",
        state_file=os.path.join(str(tmp_path), "ceiling"),
        tls=TlsConfig(cert=expired.cert, key=expired.key),
    )
    server.start()
    try:
        message = draw_fails(f"grpcs://127.0.0.1:{server.port}", ca.client_tls())
    finally:
        server.stop()
    assert "does not trust the certificate of the oracle" in message
    assert "certificate has expired" in message
    # ... and the server said so in its own log when it started.
    assert f"the server certificate {expired.cert} expired at" in caplog.text


@pytest.mark.timeout(30)
def test_client_without_certificate_is_told_the_server_requires_one(
    tls_server: OracleServer, ca: TestCA
) -> None:
    message = draw_fails(f"grpcs://127.0.0.1:{tls_server.port}", ca.client_tls())
    assert "refused this client's TLS handshake" in message
    assert "this client sent no certificate" in message


@pytest.mark.timeout(30)
def test_expired_client_certificate_is_refused_and_named(
    tls_server: OracleServer, ca: TestCA
) -> None:
    expired = ca.issue("old-client", client=True, expired=True)
    message = draw_fails(f"grpcs://127.0.0.1:{tls_server.port}", ca.client_tls(expired))
    assert "refused this client's TLS handshake" in message
    assert f"this client's certificate {expired.cert!r} expired at" in message


@pytest.mark.timeout(30)
def test_client_certificate_of_another_ca_is_refused(
    tls_server: OracleServer, ca: TestCA, tmp_path: object
) -> None:
    other = TestCA(os.path.join(str(tmp_path), "other"))
    stranger = other.issue("stranger", client=True)
    message = draw_fails(
        f"grpcs://127.0.0.1:{tls_server.port}",
        TlsConfig(ca=ca.ca, cert=stranger.cert, key=stranger.key),
    )
    assert "refused this client's TLS handshake" in message
    assert "does not accept this client's certificate" in message


@pytest.mark.timeout(30)
def test_plaintext_client_against_tls_server(tls_server: OracleServer) -> None:
    message = draw_fails(f"grpc://127.0.0.1:{tls_server.port}", None)
    assert "speaks TLS but this client connects in plaintext" in message


@pytest.mark.timeout(30)
def test_tls_client_against_plaintext_server(ca: TestCA, tmp_path: object) -> None:
    server = OracleServer("127.0.0.1:0", state_file=os.path.join(str(tmp_path), "ceiling"))
    server.start()
    try:
        message = draw_fails(f"grpcs://127.0.0.1:{server.port}", ca.client_tls())
    finally:
        server.stop()
    assert "does not speak TLS (it answers in plaintext)" in message


def test_tls_settings_with_a_plaintext_target_are_refused(ca: TestCA) -> None:
    with pytest.raises(InvalidArgument, match=re.escape("use 'grpcs://127.0.0.1:7070'")):
        OracleClient("grpc://127.0.0.1:7070", tls=ca.client_tls())


def test_key_file_others_may_read_is_refused(ca: TestCA, tmp_path: object) -> None:
    server = ca.issue("oracle")
    os.chmod(server.key, 0o644)
    with pytest.raises(InvalidArgument, match=r"mode 0644.*chmod 600"):
        TlsConfig(cert=server.cert, key=server.key)
    os.chmod(server.key, 0o640)  # group read is allowed (a key owned by root:ssl-cert)
    TlsConfig(cert=server.cert, key=server.key)


def test_server_command_line_refuses_an_unsafe_key_without_printing_it(
    ca: TestCA, tmp_path: object
) -> None:
    server = ca.issue("oracle")
    os.chmod(server.key, 0o604)
    with open(server.key) as f:
        key_body = f.read().splitlines()[1]
    r = subprocess.run(
        [sys.executable, "-m", "oracle", "--listen", "127.0.0.1:0",
         "--state-file", os.path.join(str(tmp_path), "ceiling"), *server_args(ca, server)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2
    assert "chmod 600" in r.stderr and key_body not in r.stderr + r.stdout


def test_client_ca_without_certificate_is_a_usage_error(ca: TestCA, tmp_path: object) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "oracle", "--listen", "127.0.0.1:0",
         "--state-file", os.path.join(str(tmp_path), "ceiling"), "--tls-client-ca", ca.ca],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2 and "--tls-client-ca needs --tls-cert and --tls-key" in r.stderr


# -- replicated TLS oracles elected through a TLS ZooKeeper --------------------------------


def published(tls_zookeeper: TlsZooKeeper, chroot: str) -> str | None:
    from percolator._zk_client import make_client, start_client

    _, leader_path, _ = zk_paths(parse_zookeeper(chroot).chroot)
    zk = make_client(tls_zookeeper.hosts, session_timeout=10.0, tls=tls_zookeeper.tls)
    start_client(zk, tls_zookeeper.hosts, 10.0, tls_zookeeper.tls)
    try:
        data = zk.get(leader_path)[0] if zk.exists(leader_path) else b""
        return data.decode() or None
    finally:
        zk.stop()
        zk.close()


def zk_tls_args(tls_zookeeper: TlsZooKeeper) -> list[str]:
    tls = tls_zookeeper.tls
    assert tls.ca and tls.cert and tls.key
    return ["--zookeeper-tls-ca", tls.ca, "--zookeeper-tls-cert", tls.cert,
            "--zookeeper-tls-key", tls.key]


def wait_leader(procs: list[OracleProcess], timeout: float = 60.0) -> OracleProcess:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        leaders = [p for p in procs if p.process.poll() is None and p.is_leader()]
        if len(leaders) == 1:
            return leaders[0]
        time.sleep(0.05)
    raise AssertionError("no single leader:\n" + "\n".join(p.log() for p in procs))


@pytest.mark.zk
def test_failover_between_tls_oracles_through_tls_zookeeper(
    oracles: Oracles, tls_zookeeper: TlsZooKeeper, ca: TestCA, tmp_path: object
) -> None:
    chroot = tls_zookeeper.chroot()
    client = ca.issue("client", client=True)
    client_tls = ca.client_tls(client)
    procs = [
        oracles.start(
            "--zookeeper", chroot, "--session-timeout", "1.5",
            *server_args(ca, ca.issue(f"oracle-{i}")), *zk_tls_args(tls_zookeeper),
            tls=client_tls,
        )
        for i in range(2)
    ]
    leader = wait_leader(procs)
    # The leader node says TLS, in a form a plaintext client of any version cannot use.
    assert published(tls_zookeeper, chroot) == f"grpcs://{leader.address}"
    stop = os.path.join(str(tmp_path), "stop")
    outs = [os.path.join(str(tmp_path), f"w{i}.txt") for i in range(2)]
    extra = ("--oracle-tls-ca", ca.ca, "--oracle-tls-cert", client.cert,
             "--oracle-tls-key", client.key, *zk_tls_args(tls_zookeeper))
    workers = [
        oracles.worker(f"zk://{chroot}", out, threads=4, stop=stop, extra=extra) for out in outs
    ]
    time.sleep(1.0)
    leader.kill()
    successor = wait_leader([p for p in procs if p is not leader])
    assert published(tls_zookeeper, chroot) == f"grpcs://{successor.address}"
    time.sleep(1.0)
    open(stop, "w").close()
    for w in workers:
        assert w.wait(60) == 0
    calls = read_history(outs)
    check_history(calls)
    with successor.status_client() as c:
        assert c.status().served > 0


@pytest.mark.zk
@pytest.mark.timeout(60)
def test_tls_client_refuses_a_plaintext_leader(
    oracles: Oracles, zk_chroot: str, ca: TestCA
) -> None:
    procs = [oracles.start("--zookeeper", zk_chroot, "--session-timeout", "1.5")]
    wait_leader(procs)
    with (
        OracleClient(f"zk://{zk_chroot}", deadline=LONG_DEADLINE, tls=ca.client_tls()) as c,
        pytest.raises(TlsError, match=r"is plaintext .* but this client requires TLS"),
    ):
        c.get_timestamp()


def test_published_leader_formats() -> None:
    # Plaintext leaders of every version publish a bare host:port.
    assert parse_published("10.0.0.1:7070") == parse_published("grpc://10.0.0.1:7070")
    assert not parse_published("10.0.0.1:7070").tls
    assert parse_published("grpcs://10.0.0.1:7070").tls
    with pytest.raises(InvalidArgument):
        parse_published("zk://10.0.0.1:2181/x")
