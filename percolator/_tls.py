"""TLS settings shared by the oracle (gRPC) and ZooKeeper (kazoo) paths, and a probe
that says why a TLS connection cannot work.

A :class:`TlsConfig` holds *paths* (a CA bundle, a certificate chain, a private key),
never key material, so it can be published in ZooKeeper and read on every host. Private
keys are checked like PostgreSQL checks its own: a key that anyone but its owner (and
its group, read-only) may read is refused.

When a connection fails, gRPC and kazoo only say that it did, and retry until a
deadline. :func:`diagnose` opens one TLS (or plaintext-detecting) handshake of its own
with the same settings, in a short timeout, and turns what it sees into a sentence that
names the side that refused and why: this client does not trust the server's
certificate, the server refused ours (missing, expired, unknown CA), or one side speaks
TLS and the other does not. Callers raise :class:`~percolator._errors.TlsError` with it
at once, instead of hanging until their deadline.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import stat
import time
from dataclasses import dataclass
from typing import Any

from percolator._errors import InvalidArgument

__all__ = ["TlsConfig", "diagnose"]

log = logging.getLogger(__name__)

#: First bytes of an HTTP/2 connection (the client preface and an empty SETTINGS frame):
#: sent after a handshake with a gRPC server, which answers with its SETTINGS at once, or
#: with a TLS alert when it refuses our certificate after the handshake (TLS 1.3).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""The HTTP/2 connection preface and an empty SETTINGS frame: what :func:`diagnose`
sends a gRPC server (the oracle) after the TLS handshake to learn whether it accepts
this client's certificate."""
#: A four-letter word ZooKeeper answers (or closes on) at once, for the same purpose.
ZOOKEEPER_HELLO = b"isro"


def _check_file(path: object, what: str) -> str:
    if not isinstance(path, str) or not path:
        raise InvalidArgument(f"{what} must be a file path string, got {path!r}")
    if not os.path.isfile(path):
        raise InvalidArgument(f"{what} {path!r} does not exist or is not a file")
    if not os.access(path, os.R_OK):
        raise InvalidArgument(f"{what} {path!r} is not readable by this process")
    return path


def check_private_key(path: str, what: str = "private key") -> None:
    """Refuse a private key file that others may read or anyone but its owner may write.

    The rule of PostgreSQL: at most ``u=rw,g=r`` (0640); ``chmod 600`` is the usual fix.

    :raises InvalidArgument: naming the file, its mode and the fix.
    """
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & (stat.S_IRWXO | stat.S_IWGRP | stat.S_IXGRP):
        raise InvalidArgument(
            f"{what} {path!r} has mode {mode:04o}: other users may read or change it; "
            f"run 'chmod 600 {path}' (group read, 0640, is the most allowed)"
        )


@dataclass(frozen=True)
class TlsConfig:
    """Where the TLS files of one network path are (paths only, never their content).

    :param ca: PEM bundle of the certificate authorities trusted to sign the *peer's*
        certificate; None trusts the system's roots.
    :param cert: PEM certificate chain presented by this side (a client certificate for
        mutual TLS); give it together with *key*.
    :param key: PEM private key of *cert*; must not be readable by other users.
    :raises InvalidArgument: for a missing or unreadable file, *cert* without *key* (or
        the reverse), or a key file others may read.

    The server's certificate must name the host the client connects to (a DNS name or IP
    address in its subjectAltName): hostnames are always checked. TLS 1.2 is the oldest
    version used.
    """

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if self.ca is not None:
            _check_file(self.ca, "TLS ca")
        if (self.cert is None) != (self.key is None):
            raise InvalidArgument(
                f"TLS cert and key go together: got cert={self.cert!r}, key={self.key!r}"
            )
        if self.cert is not None and self.key is not None:
            _check_file(self.cert, "TLS cert")
            check_private_key(_check_file(self.key, "TLS key"), "TLS key")

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """The contents of (ca, cert, key), None where not configured."""

        def load(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return load(self.ca), load(self.cert), load(self.key)

    def to_json(self) -> dict[str, str]:
        """The paths as a JSON-able dict (what ``publish_config`` stores)."""
        return {k: v for k, v in (("ca", self.ca), ("cert", self.cert), ("key", self.key)) if v}

    @classmethod
    def from_json(cls, data: object, *, what: str = "TLS configuration") -> TlsConfig:
        """The inverse of :meth:`to_json`.

        :raises InvalidArgument: for anything but a dict of the three path keys.
        """
        if not isinstance(data, dict) or not set(data) <= {"ca", "cert", "key"}:
            raise InvalidArgument(
                f"{what} must be a dict with keys among ca, cert, key; got {data!r}"
            )
        return cls(ca=data.get("ca"), cert=data.get("cert"), key=data.get("key"))

    def __repr__(self) -> str:
        return f"TlsConfig(ca={self.ca!r}, cert={self.cert!r}, key={self.key!r})"

    def client_context(self, *, alpn: list[str] | None = None) -> ssl.SSLContext:
        """A verifying client context with these files (TLS 1.2+, hostname checked)."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None:
            ctx.load_cert_chain(self.cert, self.key)
        if alpn:
            ctx.set_alpn_protocols(alpn)
        return ctx


def check_tls(value: object, what: str) -> TlsConfig | None:
    """*value* if it is None or a :class:`TlsConfig`.

    :raises InvalidArgument: otherwise, quoting it.
    """
    if value is None or isinstance(value, TlsConfig):
        return value
    raise InvalidArgument(
        f"{what} must be a percolator.TlsConfig(ca=..., cert=..., key=...) or None, "
        f"got {value!r}"
    )


_ALERT_MEANING = {
    "CERTIFICATE_REQUIRED": "it requires a client certificate and this client sent none "
    "(give cert= and key=)",
    "UNKNOWN_CA": "it does not trust this client's certificate (not signed by a CA it "
    "trusts)",
    "BAD_CERTIFICATE": "it does not accept this client's certificate (none was sent though "
    "it requires one, or it is not signed by a CA it trusts)",
    "CERTIFICATE_UNKNOWN": "it cannot verify this client's certificate (expired, not valid "
    "yet, or not signed by a CA it trusts)",
    "CERTIFICATE_EXPIRED": "this client's certificate has expired (or is not valid yet)",
    "CERTIFICATE_REVOKED": "this client's certificate is revoked",
    "UNSUPPORTED_CERTIFICATE": "it does not support this client's certificate",
    "HANDSHAKE_FAILURE": "no common TLS version or cipher, or a client certificate it "
    "requires is missing",
    "PROTOCOL_VERSION": "it does not accept TLS 1.2 or newer",
    "ACCESS_DENIED": "it denies this client",
}


def _alert(e: ssl.SSLError) -> str | None:
    reason = str(getattr(e, "reason", "") or "")
    if "ALERT" not in reason:
        return None
    for key, meaning in _ALERT_MEANING.items():
        if reason.endswith(key):
            return meaning
    return reason.lower().replace("_", " ")


def _not_tls(e: BaseException) -> bool:
    """Whether a handshake error means the peer answered, but not in TLS."""
    if isinstance(e, ssl.SSLEOFError | ssl.SSLZeroReturnError | ConnectionResetError):
        return True
    reason = str(getattr(e, "reason", "") or "")
    return reason in _NOT_TLS_REASONS


_NOT_TLS_REASONS = frozenset({
    "WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING", "RECORD_LAYER_FAILURE",
    "HTTP_REQUEST", "PACKET_LENGTH_TOO_LONG", "UNEXPECTED_RECORD",
})


def validity_problem(cert: str) -> str | None:
    """"expired at ..." or "is not valid before ..." for the first certificate of the PEM
    file *cert*, or None (valid now, or not decodable: the handshake reports that).
    Read with the ssl module's certificate decoder: no extra dependency."""
    try:
        decoded = ssl._ssl._test_decode_cert(cert)  # type: ignore[attr-defined]
        not_before = ssl.cert_time_to_seconds(decoded["notBefore"])
        not_after = ssl.cert_time_to_seconds(decoded["notAfter"])
    except Exception:
        return None
    now = time.time()
    if now > not_after:
        return f"expired at {decoded['notAfter']}"
    if now < not_before:
        return f"is not valid before {decoded['notBefore']}"
    return None


def _own_certificate_problem(tls: TlsConfig) -> str:
    """'; this client's certificate ... expired ...' when it is out of its validity period,
    '; this client sent no certificate' without one, else ''."""
    if tls.cert is None:
        return "; this client sent no certificate (give cert= and key=)"
    problem = validity_problem(tls.cert)
    return "" if problem is None else f"; this client's certificate {tls.cert!r} {problem}"


def diagnose(
    address: tuple[str, int],
    tls: TlsConfig | None,
    *,
    peer: str,
    timeout: float = 2.0,
    hello: bytes = b"",
    answers_hello: bool = False,
    alpn: list[str] | None = None,
) -> str | None:
    """Why a connection to *address* with *tls* (None: plaintext) cannot work, or None.

    With *tls*, one verifying handshake with its files, then *hello* is sent and one
    byte awaited (a server that refuses our certificate after a TLS 1.3 handshake says
    so then, or, if it always *answers_hello*, by closing without a word, as gRPC does).
    Without, one handshake that verifies nothing, to learn whether the peer speaks TLS.
    *peer* names the server in the message ("the oracle at h:p").
    None means nothing wrong was seen: unreachable, slow, or fine.
    """
    first = _probe(address, tls, peer, timeout, hello, answers_hello, alpn)
    if first is None:
        return None
    # A server that is going away may reset a connection in the middle of a handshake,
    # just like one that refuses it: only a verdict seen twice is reported.
    time.sleep(0.1)
    again = _probe(address, tls, peer, timeout, hello, answers_hello, alpn)
    return first if again == first else None


def _probe(
    address: tuple[str, int],
    tls: TlsConfig | None,
    peer: str,
    timeout: float,
    hello: bytes,
    answers_hello: bool,
    alpn: list[str] | None,
) -> str | None:
    host, port = address
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None  # down or unreachable: not a TLS problem, the caller retries
    with raw:
        if tls is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            if alpn:
                ctx.set_alpn_protocols(alpn)
            try:
                with ctx.wrap_socket(raw, server_hostname=host):
                    pass
            except ssl.SSLError as e:
                if _alert(e) is None:
                    return None  # it does not speak TLS either: not our diagnosis
            except OSError:
                return None
            return (
                f"{peer} speaks TLS but this client connects in plaintext: configure TLS "
                "for this path (a grpcs:// target or oracle_tls=TlsConfig(...) for the "
                "oracle, zookeeper_tls=TlsConfig(...) for ZooKeeper)"
            )
        try:
            ctx = tls.client_context(alpn=alpn)
        except (OSError, ssl.SSLError) as e:
            return f"this client cannot load its TLS files {tls!r}: {e}"
        try:
            conn = ctx.wrap_socket(raw, server_hostname=host)
        except ssl.SSLCertVerificationError as e:
            return (
                f"this client does not trust the certificate of {peer}: "
                f"{e.verify_message} (trusted CAs: {tls.ca or 'the system roots'}; the "
                f"certificate must be signed by one of them, be valid now and name {host})"
            )
        except ssl.SSLError as e:
            meaning = _alert(e)
            if meaning is not None:
                return _refused(peer, f"{meaning} [{e.reason}]", tls)
            if _not_tls(e):
                return (
                    f"{peer} does not speak TLS (it answers in plaintext) but this client "
                    "requires TLS: start the server with TLS, or connect without TLS"
                )
            return f"TLS handshake with {peer} failed: {e}"
        except (ConnectionResetError, BrokenPipeError) as e:
            return (
                f"{peer} closed the connection during the TLS handshake ({e}): it may not "
                "speak TLS, or refuses this client"
            )
        except OSError:
            return None  # timeout: slow, not a clear refusal
        with conn:
            # In TLS 1.3 the server checks our certificate after the client's side of
            # the handshake is done: its verdict comes with the answer to *hello*.
            if not hello:
                return None
            try:
                conn.sendall(hello)
                data = conn.recv(1)
            except ssl.SSLError as e:
                meaning = _alert(e)
                if meaning is not None:
                    return _refused(peer, f"{meaning} [{e.reason}]", tls)
                data = b""
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            except OSError:
                return None  # timeout: slow, not a clear refusal
            if not data and answers_hello:
                return _refused(
                    peer, "it closed the connection right after the handshake, without "
                    "answering (it does not accept this client's certificate)", tls
                )
    return None


def _refused(peer: str, why: str, tls: TlsConfig) -> str:
    return f"{peer} refused this client's TLS handshake: {why}{_own_certificate_problem(tls)}"


def add_zookeeper_tls_arguments(parser: Any, prefix: str = "zookeeper") -> None:
    """``--{prefix}-tls-ca/-cert/-key`` on a command line: *prefix* ``zookeeper`` (the
    oracle's and the worker's) or ``oracle`` (the worker's)."""
    what = "ZooKeeper" if prefix == "zookeeper" else "the oracle"
    group = parser.add_argument_group(f"TLS to {what}")
    group.add_argument(f"--{prefix}-tls-ca", metavar="FILE",
                       help=f"connect to {what} over TLS, trusting this CA bundle")
    group.add_argument(f"--{prefix}-tls-cert", metavar="FILE",
                       help=f"client certificate for {what} (mutual TLS)")
    group.add_argument(f"--{prefix}-tls-key", metavar="FILE",
                       help="private key of that certificate (mode 0600 or 0640)")


def zookeeper_tls_from_arguments(args: Any, prefix: str = "zookeeper") -> TlsConfig | None:
    """The :class:`TlsConfig` of :func:`add_zookeeper_tls_arguments`'s options, or None.

    :raises InvalidArgument: for missing or unsafe files.
    """
    attr = prefix.replace("-", "_")
    ca = getattr(args, f"{attr}_tls_ca")
    cert = getattr(args, f"{attr}_tls_cert")
    key = getattr(args, f"{attr}_tls_key")
    if ca is None and cert is None and key is None:
        return None
    return TlsConfig(ca=ca, cert=cert, key=key)


def describe_server(tls: Any) -> str:
    """How a server's log line names its transport."""
    if tls is None:
        return "PLAINTEXT (no TLS: anyone who can reach the port can use it; see docs/tls.md)"
    return "TLS" + (" with client certificates required (mutual TLS)" if tls.ca else "")
