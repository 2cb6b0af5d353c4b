"""The Thrift2 store over TLS against a real HBase Thrift2 server with certificates
made here (docs/tls.md, "HBase"). HBase's Thrift servers serve TLS on their HTTP
transport only (``hbase.regionserver.thrift.http`` with ``hbase.thrift.ssl.enabled`` and
a keystore), so the store speaks Thrift over HTTPS (``transport=https``).

The module starts one more Thrift2 server (a JVM) on the session's HBase, with its
``hbase-site.xml`` plus the TLS settings: the suite's own HBase, or the one whose conf
directory ``PERCOLATOR_HBASE_CONF`` names (with ``PERCOLATOR_HBASE_THRIFT``). The
server's certificate names ``localhost`` only, so ``127.0.0.1`` is a wrong host.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import percolator
from percolator import TlsError
from percolator._store import Mutation, Read
from percolator.stores import open_store
from tests._backends import drop_tables
from tests._hbase import ENV, hbase_store_url
from tests._services import free_port, service_missing, stop_process
from tests._tls import TestCA

pytestmark = pytest.mark.hbase

PASSWORD = "percolator-test"


def _conf_dir(request: pytest.FixtureRequest) -> Path:
    chosen = os.environ.get("PERCOLATOR_HBASE_CONF")
    if chosen:
        return Path(chosen)
    if os.environ.get(ENV):
        pytest.skip(f"{ENV} names another HBase and PERCOLATOR_HBASE_CONF not its conf "
                    "directory: a TLS Thrift2 server for it cannot be started here")
    hbase = request.getfixturevalue("local_hbase")
    return Path(hbase.dir) / "conf"


@pytest.fixture(scope="module")
def tls_server(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, TestCA]]:
    """``(port, CA)`` of a Thrift2 server over HTTPS on the session's HBase."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        BestAvailableEncryption,
        load_pem_private_key,
        pkcs12,
    )

    from tests._hbase_local import JDK17_FLAGS, classpath, java, jvm_options

    base = tmp_path_factory.mktemp("hbase-tls")
    ca = TestCA(str(base / "ca"))
    issued = ca.issue("hbase-thrift", hosts=("localhost",))
    keystore = base / "thrift.p12"
    keystore.write_bytes(pkcs12.serialize_key_and_certificates(
        b"thrift", load_pem_private_key(Path(issued.key).read_bytes(), None),
        x509.load_pem_x509_certificate(Path(issued.cert).read_bytes()), None,
        BestAvailableEncryption(PASSWORD.encode())))
    conf = base / "conf"
    shutil.copytree(_conf_dir(request), conf)
    settings = {
        "hbase.regionserver.thrift.http": "true", "hbase.thrift.ssl.enabled": "true",
        "hbase.thrift.ssl.keystore.store": str(keystore),
        "hbase.thrift.ssl.keystore.type": "PKCS12",
        "hbase.thrift.ssl.keystore.password": PASSWORD,
        "hbase.thrift.ssl.keystore.keypassword": PASSWORD,
    }
    site = conf / "hbase-site.xml"
    site.write_text(site.read_text().replace("</configuration>", "".join(
        f"  <property><name>{k}</name><value>{v}</value></property>\n"
        for k, v in settings.items()) + "</configuration>"))
    port = free_port()
    log = base / "thrift2-tls.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [java(), "-Xmx256m", *JDK17_FLAGS, *jvm_options(), f"-Dhbase.log.dir={base}",
             "-Dhbase.log.file=thrift2-tls.log", "-cp", f"{conf}{os.pathsep}{classpath()}",
             "org.apache.hadoop.hbase.thrift2.ThriftServer", "-b", "127.0.0.1",
             "-p", str(port), "start"],
            cwd=base, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    service_missing(f"the TLS Thrift2 server did not start: "
                                    f"{log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.3)
        yield port, ca
    finally:
        stop_process(server)


def _url(host: str, port: int, name: str) -> str:
    return hbase_store_url(f"{host}:{port}", name, api="thrift2") + "&transport=https&timeout=30"


def test_the_store_works_over_tls_with_the_server_verified(
    tls_server: tuple[int, TestCA], request: pytest.FixtureRequest,
) -> None:
    port, ca = tls_server
    store = open_store(_url("localhost", port, request.node.name), tls=ca.client_tls())
    try:
        store.create_table("t", {"d": 0, "l": 1})
        store.mutate_rows("t", [Mutation(b"r", puts=[("d:c", 5, b"secret")])])
        assert store.check_and_set("t", b"r", "l:c", None, b"L", [("d:c", 6, b"more")])
        assert store.read_rows("t", [b"r"], [Read("d", versions=None)]) == {
            b"r": {"d:c": [(6, b"more"), (5, b"secret")]}}
        assert [row for row, _ in store.scan("t", None, None, [Read("d")])] == [b"r"]
        drop_tables(store)
    finally:
        store.close()
    # The same through the url's paths instead of a TlsConfig, and through connect.
    store = open_store(_url("localhost", port, "paths") + f"&tls_ca={ca.ca}")
    store.close()
    with percolator.connect(_url("localhost", port, "cluster"), tls=ca.client_tls()) as c:
        c.create_table("bank")
        with percolator.Transaction(c) as txn:
            txn.set("bank", b"alice", "bal:amount", b"100")
        assert percolator.Snapshot(c).get("bank", b"alice", "bal:amount") == b"100"
        drop_tables(c)


def test_a_server_signed_by_an_unknown_ca_is_a_tls_error(
    tls_server: tuple[int, TestCA], tmp_path: Path,
) -> None:
    port, _ = tls_server
    stranger = TestCA(str(tmp_path / "other"), "another CA")
    with pytest.raises(TlsError, match="does not trust the certificate of the HBase Thrift2 "
                                       "server at localhost"):
        open_store(_url("localhost", port, "unknown_ca"), tls=stranger.client_tls())


def test_a_certificate_for_another_host_is_a_tls_error(tls_server: tuple[int, TestCA]) -> None:
    port, ca = tls_server
    with pytest.raises(TlsError, match=r"does not trust .*name 127\.0\.0\.1"):
        open_store(_url("127.0.0.1", port, "wrong_host"), tls=ca.client_tls())


def test_plaintext_to_a_tls_server_and_tls_to_a_plaintext_one_say_so(
    tls_server: tuple[int, TestCA], hbase_thrift2: str,
) -> None:
    port, ca = tls_server
    with pytest.raises(TlsError, match="speaks TLS but this client connects in plaintext: "
                                       "give the store transport=https"):
        open_store(hbase_store_url(f"localhost:{port}", "plain", api="thrift2") + "&timeout=10")
    with pytest.raises(TlsError, match="does not speak TLS"):
        open_store(hbase_store_url(hbase_thrift2, "tls", api="thrift2")
                   + "&transport=https&timeout=10", tls=ca.client_tls())


def test_tls_options_need_the_thrift2_https_transport(tls_server: tuple[int, TestCA]) -> None:
    from percolator import InvalidArgument

    port, ca = tls_server
    with pytest.raises(InvalidArgument, match="need api=thrift2 and transport=https"):
        open_store(f"hbase://localhost:{port}", tls=ca.client_tls())
    with pytest.raises(InvalidArgument, match="need transport=https"):
        open_store(f"hbase://localhost:{port}?api=thrift2&transport=http", tls=ca.client_tls())
    with pytest.raises(InvalidArgument, match=r"tls must be a percolator\.TlsConfig"):
        open_store(f"hbase://localhost:{port}?api=thrift2&transport=https", tls="ca.pem")
