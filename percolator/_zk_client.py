"""The ZooKeeper client factory: the one place a ``KazooClient`` of percolator or the
oracle is made (:func:`make_client`) and started (:func:`start_client`), and the
parsing of ZooKeeper addresses.

Part of the shared base that the oracle server imports (with ``_errors``, ``_tls`` and
``metrics``) without loading the transaction library: it imports nothing of
percolator's but those. The coordination class built on it is
:mod:`percolator._zookeeper`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from percolator._errors import CoordinationError, InvalidArgument, TlsError
from percolator._tls import ZOOKEEPER_HELLO, TlsConfig, diagnose

__all__ = [
    "INSTALL_HINT",
    "QuietWhileStarting",
    "bounded_stop_handler",
    "make_client",
    "parse_auth",
    "parse_zookeeper_address",
    "start_client",
]

log = logging.getLogger(__name__)

INSTALL_HINT = "ZooKeeper coordination needs kazoo: pip install 'percolator-txn[zookeeper]'"


def _kazoo() -> Any:
    try:
        import kazoo.client
    except ImportError as e:
        raise CoordinationError(INSTALL_HINT) from e
    return kazoo.client


def parse_zookeeper_address(address: str) -> tuple[str, str]:
    """Split ``"host:port[,host:port...][/chroot]"`` into hosts and chroot ("" for the root).

    :raises InvalidArgument: if *address* is malformed.
    """
    if not isinstance(address, str) or not address:
        raise InvalidArgument(
            f"zookeeper must be a 'host:port[/chroot]' string, got {address!r}"
        )
    hosts, slash, rest = address.partition("/")
    chroot = (slash + rest).rstrip("/")
    for hp in hosts.split(","):
        host, colon, port = hp.rpartition(":")
        if not host or not colon or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(
                f"zookeeper address {address!r}: {hp!r} is not 'host:port'"
            )
    if any(not part for part in chroot.split("/")[1:]):
        raise InvalidArgument(f"zookeeper address {address!r} has a malformed chroot {chroot!r}")
    return hosts, chroot


def parse_auth(auth: str | None) -> tuple[str, str] | None:
    if auth is None:
        return None
    if not isinstance(auth, str) or ":" not in auth or auth.startswith(":"):
        raise InvalidArgument(f"zookeeper_auth must be 'user:password', got {auth!r}")
    user, _, password = auth.partition(":")
    return user, password


_STOP_GRACE = 2.0
"""Seconds a stopping client gives its callback threads before leaving them."""


def bounded_stop_handler() -> Any:
    """A kazoo threading handler whose ``stop()`` cannot hang.

    kazoo's handler joins its callback threads with no timeout, before the connection
    is stopped. A callback waiting for a reply from a server that is gone (kazoo's own
    ``DataWatch`` re-reads its node after a reconnect) then never returns, and
    ``KazooClient.stop()``, or kazoo's ``atexit`` hook at interpreter exit, waits for
    ever. These threads are daemons: this handler gives them :data:`_STOP_GRACE`
    seconds, then leaves them, so the connection is stopped and the process can end.
    Every ``KazooClient`` of percolator and the oracle uses it.
    """
    import atexit

    from kazoo.handlers import threading as kazoo_threading

    if not hasattr(kazoo_threading, "_STOP"):  # another kazoo layout: its own handler
        return kazoo_threading.SequentialThreadingHandler()

    class BoundedStopHandler(kazoo_threading.SequentialThreadingHandler):  # type: ignore[misc]
        def stop(self) -> None:
            h: Any = self  # kazoo's handler is untyped
            with h._state_change:
                if not h._running:
                    return
                h._running = False
                for work_queue in (h.completion_queue, h.callback_queue):
                    work_queue.put(kazoo_threading._STOP)
                deadline = time.monotonic() + _STOP_GRACE
                for worker in reversed(h._workers):
                    worker.join(max(0.0, deadline - time.monotonic()))
                    if worker.is_alive():
                        log.warning("a ZooKeeper callback is still running after %gs; "
                                    "leaving it", _STOP_GRACE)
                h._workers = []
                h.callback_queue = h.queue_impl()
                h.completion_queue = h.queue_impl()
                atexit.unregister(h.stop)

    return BoundedStopHandler()


def make_client(
    hosts: str,
    *,
    session_timeout: float,
    tls: TlsConfig | None = None,
    auth: tuple[str, str] | None = None,
    **options: Any,
) -> Any:
    """The one place a ``KazooClient`` of percolator or the oracle is made.

    *hosts* is ``"host:port[,...]"`` (no chroot); *tls* connects over TLS with its files
    (hostname checked, TLS 1.2+); *auth* (user, password) adds digest credentials and
    makes nodes it creates writable only by that user. The handler's ``stop()`` cannot
    hang (:func:`bounded_stop_handler`). Other *options* go to ``KazooClient``.
    """
    kc = _kazoo()
    if auth is not None:
        from kazoo.security import make_acl, make_digest_acl

        user, password = auth
        options["auth_data"] = [("digest", f"{user}:{password}")]
        options["default_acl"] = [
            make_digest_acl(user, password, all=True),
            make_acl("world", "anyone", read=True),
        ]
    if tls is not None:
        options.update(
            use_ssl=True,
            ca=tls.ca,
            certfile=tls.cert,
            keyfile=tls.key,
            verify_certs=True,
            check_hostname=True,
        )
    options.setdefault("logger", QuietWhileStarting())
    return kc.KazooClient(
        hosts=hosts, timeout=session_timeout, handler=bounded_stop_handler(), **options
    )


class QuietWhileStarting(logging.LoggerAdapter):  # type: ignore[type-arg]
    """kazoo's logger for one client. Until :func:`start_client` has connected it,
    kazoo's warnings (one "Connection dropped: socket connection error" per attempt,
    a dozen and more against an address where nothing listens) go to DEBUG: the start
    ends in one :class:`CoordinationError` that says it all. Once connected, kazoo
    logs as usual (a dropped connection of a running client is worth a warning)."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("kazoo.client"), {})
        self.starting = True

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if self.starting and logging.DEBUG < level <= logging.WARNING:
            level = logging.DEBUG
        super().log(level, msg, *args, **kwargs)


#: How long a connection attempt runs before a handshake of our own looks for a TLS
#: mismatch (kazoo itself only retries until the timeout).
_DIAGNOSE_AFTER = 1.0


def start_client(client: Any, hosts: str, timeout: float, tls: TlsConfig | None) -> None:
    """Start *client* (made by :func:`make_client` for *hosts*) within *timeout* seconds.

    If it is not connected after a second, a TLS probe of each host looks for a reason
    that retrying cannot fix (untrusted certificate, plaintext against TLS...).

    :raises TlsError: for such a reason, at once.
    :raises CoordinationError: when no server answered within *timeout*.
    """
    event = client.start_async()
    deadline = time.monotonic() + timeout
    quiet = client.logger if isinstance(client.logger, QuietWhileStarting) else None
    try:
        _wait_connected(client, hosts, timeout, tls, deadline, event)
    finally:
        if quiet is not None:
            quiet.starting = False


def _wait_connected(client: Any, hosts: str, timeout: float, tls: TlsConfig | None,
                    deadline: float, event: Any) -> None:
    event.wait(min(timeout, _DIAGNOSE_AFTER))
    if not client.connected:
        for hp in hosts.split(","):
            host, _, port = hp.rpartition(":")
            problem = diagnose(
                (host.strip("[]"), int(port)),
                tls,
                peer=f"ZooKeeper at {hp}",
                hello=ZOOKEEPER_HELLO,
                timeout=min(2.0, max(0.1, deadline - time.monotonic())),
            )
            if problem is not None:
                _stop_quietly(client)
                raise TlsError(problem)
        event.wait(max(0.0, deadline - time.monotonic()))
    if not client.connected:
        _stop_quietly(client)
        raise CoordinationError(
            f"cannot reach ZooKeeper at {hosts!r} within {timeout:g}s "
            f"({'TLS' if tls else 'plaintext'}); check the address and that the ensemble is up"
        )


def _stop_quietly(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.stop()
    with contextlib.suppress(Exception):
        client.close()
