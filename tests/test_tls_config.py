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
