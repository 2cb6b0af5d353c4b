"""Throwaway certificate authorities for the TLS tests (the ``cryptography`` package).

:class:`TestCA` makes a self-signed CA in a directory and issues certificates from it as
PEM files: a server certificate names ``127.0.0.1`` and ``localhost`` (the tests connect
by IP address, and hostnames are checked), a client certificate is for client auth.
Keys are written with mode 0600, as :class:`percolator.TlsConfig` requires. An *expired*
certificate was valid for a day, two days ago.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # pragma: no cover - the test extra installs it
    x509 = None  # type: ignore[assignment]

from percolator import TlsConfig
from tests._services import service_missing


def _require_cryptography() -> None:
    if x509 is None:
        service_missing("the TLS tests need 'cryptography': pip install -e '.[test]'")


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


@dataclass(frozen=True)
class Issued:
    """PEM files of one issued certificate: its chain and its key."""

    cert: str
    key: str


class TestCA:
    """A self-signed CA named *name* whose files live in *directory*."""

    __test__ = False  # not a pytest test class

    def __init__(
        self, directory: str, name: str = "percolator test CA", *, days: int = 2
    ) -> None:
        _require_cryptography()
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca = os.path.join(directory, "ca.pem")
        with open(self.ca, "wb") as f:
            f.write(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        *,
        client: bool = False,
        expired: bool = False,
        hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
        days: int = 1,
    ) -> Issued:
        """A certificate for *name* naming *hosts* (DNS names or IP addresses), for server
        auth or, with *client*, client auth, valid for *days*; written as ``<name>.pem``
        and ``<name>.key`` (0600)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        day = datetime.timedelta(days=1)
        if expired:
            not_before, not_after = now - 3 * day, now - 2 * day
        else:
            not_before, not_after = now - day / 24, now + days * day
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.SubjectAlternativeName([_san(h) for h in hosts]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        cert = builder.sign(self._key, hashes.SHA256())
        cert_path = os.path.join(self.directory, f"{name}.pem")
        key_path = os.path.join(self.directory, f"{name}.key")
        with open(cert_path, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        return Issued(cert=cert_path, key=key_path)

    def combined(self, issued: Issued) -> str:
        """One PEM file with *issued*'s key and certificate (ZooKeeper's PEM keystore)."""
        path = issued.cert[: -len(".pem")] + "-keystore.pem"
        with open(issued.key, "rb") as k, open(issued.cert, "rb") as c:
            data = k.read() + c.read()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path

    def client_tls(self, issued: Issued | None = None) -> TlsConfig:
        """A client TlsConfig trusting this CA, presenting *issued* if given."""
        if issued is None:
            return TlsConfig(ca=self.ca)
        return TlsConfig(ca=self.ca, cert=issued.cert, key=issued.key)
