"""``percolator.TlsConfig``: files checked at the door, keys others may read refused,
paths (never content) in its JSON form, and bad TLS arguments refused by the entry points."""

from __future__ import annotations

import os

import pytest

import percolator
from percolator import InvalidArgument, TlsConfig
from tests._tls import TestCA


@pytest.fixture
def ca(tmp_path: object) -> TestCA:
    return TestCA(os.path.join(str(tmp_path), "ca"))


def test_cert_and_key_go_together(ca: TestCA) -> None:
    issued = ca.issue("c", client=True)
    with pytest.raises(InvalidArgument, match="cert and key go together"):
        TlsConfig(ca=ca.ca, cert=issued.cert)
    with pytest.raises(InvalidArgument, match="cert and key go together"):
        TlsConfig(key=issued.key)


def test_missing_files_are_named(ca: TestCA, tmp_path: object) -> None:
    missing = os.path.join(str(tmp_path), "nope.pem")
    with pytest.raises(InvalidArgument, match=r"TLS ca .*nope\.pem.* does not exist"):
        TlsConfig(ca=missing)
    with pytest.raises(InvalidArgument, match="must be a file path string"):
        TlsConfig(ca=42)  # type: ignore[arg-type]


def test_world_readable_or_group_writable_key_is_refused(ca: TestCA) -> None:
    issued = ca.issue("c", client=True)
    for mode in (0o604, 0o660, 0o644, 0o666):
        os.chmod(issued.key, mode)
        with pytest.raises(InvalidArgument, match=f"mode {mode:04o}"):
            TlsConfig(cert=issued.cert, key=issued.key)
    for mode in (0o600, 0o400, 0o640):
        os.chmod(issued.key, mode)
        assert TlsConfig(cert=issued.cert, key=issued.key).key == issued.key


def test_json_form_is_paths_only(ca: TestCA) -> None:
    issued = ca.issue("c", client=True)
    tls = ca.client_tls(issued)
    data = tls.to_json()
    assert data == {"ca": ca.ca, "cert": issued.cert, "key": issued.key}
    assert TlsConfig.from_json(data) == tls
    assert TlsConfig.from_json({"ca": ca.ca}) == TlsConfig(ca=ca.ca)
    with pytest.raises(InvalidArgument, match="keys among ca, cert, key"):
        TlsConfig.from_json({"ca": ca.ca, "pem": "-----BEGIN"})
    with pytest.raises(InvalidArgument):
        TlsConfig.from_json("ca.pem")


def test_entry_points_refuse_anything_but_a_tls_config(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    with pytest.raises(InvalidArgument, match=r"oracle_tls must be a percolator\.TlsConfig"):
        percolator.connect(url, oracle_tls="/etc/ca.pem")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"zookeeper_tls must be a percolator\.TlsConfig"):
        percolator.connect(url, zookeeper_tls={"ca": "x"})  # type: ignore[arg-type]


def test_grpcs_target_parses_as_tls() -> None:
    from oracle._target import GrpcTarget, parse_target

    assert parse_target("grpcs://h:7070") == GrpcTarget("h:7070", tls=True)
    assert parse_target("grpc://h:7070") == GrpcTarget("h:7070", tls=False)
    assert str(parse_target("grpcs://h:7070")) == "grpcs://h:7070"
    with pytest.raises(InvalidArgument, match="grpcs://host:port"):
        parse_target("https://h:7070")


def test_the_loader_command_line_takes_tls_to_the_oracle_and_zookeeper(
    ca: TestCA, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m spark_loader`` (load and export) has the worker's TLS options, and
    checks the files on the driver before any Spark job (a missing or unsafe key is
    exit 2 with the reason)."""
    pytest.importorskip("pyspark")
    from spark_loader.__main__ import _connect_options, _export_parser, _parser, main

    issued = ca.issue("loader", client=True)
    tls = ["--oracle", "zk://127.0.0.1:2181/p", "--oracle-tls-ca", ca.ca,
           "--zookeeper", "127.0.0.1:2181/p", "--zookeeper-tls-ca", ca.ca,
           "--zookeeper-tls-cert", issued.cert, "--zookeeper-tls-key", issued.key]
    load = _parser().parse_args(["--cluster", "sqlite:///x.db", "--table", "t", "--input", "f",
                                 "--format", "jsonl", "--row-key", "k", "--column", "v=c:v",
                                 *tls])
    options = _connect_options(load, lock_ttl=5.0)
    assert options["oracle_tls"] == TlsConfig(ca=ca.ca)
    assert options["zookeeper_tls"] == TlsConfig(ca=ca.ca, cert=issued.cert, key=issued.key)
    assert options["lock_ttl"] == 5.0 and options["zookeeper"] == "127.0.0.1:2181/p"
    export = _export_parser().parse_args(["--cluster", "sqlite:///x.db", "--table", "t",
                                          "--format", "jsonl", "--output", "o", *tls])
    assert _connect_options(export)["zookeeper_tls"] == options["zookeeper_tls"]

    os.chmod(issued.key, 0o644)
    assert main(["export", "--cluster", "sqlite:///x.db", "--table", "t", "--format", "jsonl",
                 "--output", "o", *tls]) == 2
    assert "mode 0644" in capsys.readouterr().err
