"""A real ZooKeeper for the test suite (DESIGN.md section 3), and its pytest fixtures.

:class:`ZooKeeperServer` runs Debian's ``zookeeper`` package as a standalone server::

    java -cp /usr/share/java/zookeeper.jar:/etc/zookeeper/conf \\
        org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg

with ``admin.enableServer=false``, ``4lw.commands.whitelist=*``, a temporary dataDir and a
free loopback port; it is ready when the four-letter command ``srvr`` answers
``Mode: standalone``. ``tickTime`` is 500 ms, so sessions may be as short as 1 s
(``minSessionTimeout=1000``) and fault tests stay fast.

Fixtures (registered through ``pytest_plugins`` in ``tests/conftest.py``):

* ``zookeeper`` (session scope): the running :class:`ZooKeeperServer`. Tests that stop,
  kill or restart it must leave it running (call :meth:`ZooKeeperServer.start` again).
* ``zk_chroot`` (function scope): a fresh chroot that exists, as a connection string
  ``"127.0.0.1:PORT/test-<hex>"``; pass it to kazoo (``KazooClient(hosts=zk_chroot)``) or
  build ``"zk://" + zk_chroot`` for the oracle client.
* ``tls_zookeeper`` (session scope, started only by the tests that ask for it): a second
  server with a ``secureClientPort`` (Netty, PEM key and trust stores from a throwaway CA,
  client certificates required) besides its plaintext port; a :class:`TlsZooKeeper`.

No orphans: the java process gets ``PR_SET_PDEATHSIG=SIGKILL`` (it dies with the process
that started it, even after a ``kill -9`` of pytest), and every server still running at
interpreter exit is killed by an ``atexit`` hook. When java or the jar is missing the
fixture fails in CI and skips elsewhere (:func:`tests._services.service_missing`).

Mark tests that use it ``@pytest.mark.zk``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from tests._hbase_local import DIE_WITH_PARENT
from tests._services import free_port, service_missing

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
ZOOKEEPER_CONF_DIR = "/etc/zookeeper/conf"
#: Debian's zookeeper.jar lists only part of Netty in its manifest; its Netty connection
#: factory (needed for TLS) also needs these, and slf4j-simple makes it log.
NETTY_JARS = [
    f"/usr/share/java/{name}.jar"
    for name in ("netty-codec", "netty-resolver", "netty-transport-native-unix-common",
                 "slf4j-simple")
]
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
INSTALL_HINT = "install Java and ZooKeeper: apt-get install -y default-jre-headless zookeeper"

T = TypeVar("T")
_live: weakref.WeakSet[ZooKeeperServer] = weakref.WeakSet()


def four_letter(hosts: str, command: str, timeout: float = 2.0) -> str:
    """Send a four-letter word (``srvr``, ``stat``, ``cons``...) to ``host:port``; '' on error."""
    host, _, port = hosts.partition("/")[0].split(",")[0].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.sendall(command.encode("ascii"))
            chunks = []
            while True:
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(data)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return ""


def java_available() -> str | None:
    """Why ZooKeeper cannot run here, or None when java and the jar are present."""
    if shutil.which("java") is None:
        return f"java not found on PATH; {INSTALL_HINT}"
    if not os.path.exists(ZOOKEEPER_JAR):
        return f"{ZOOKEEPER_JAR} not found; {INSTALL_HINT}"
    return None


class ZooKeeperServer:
    """One standalone ZooKeeper server process on a free loopback port.

    :param port: client port (default: a free one, kept across restarts).
    :param tick_time: ZooKeeper ``tickTime`` in milliseconds.
    :param min_session_timeout: smallest session timeout granted, in milliseconds.
    :param host: address to bind the client port to (default loopback).
    :param netns: run inside this Linux network namespace (``ip netns exec``; the fault
        suite's ``tests/faults/_netns.py``); probes and helpers connect from inside it.

    :meth:`start`, :meth:`stop` (SIGTERM, then SIGKILL), :meth:`kill` (SIGKILL) and
    :meth:`restart` (same port and data directory, so the data survives);
    :attr:`hosts` is ``"127.0.0.1:PORT"``; :meth:`expire_session` expires a kazoo
    client's session the way a long network partition would. :meth:`cleanup` kills the
    process and removes the data directory.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        tick_time: int = 500,
        min_session_timeout: int = 1000,
        secure: tuple[str, str] | None = None,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        self.host = host
        self.netns = netns
        # (a free port of the host namespace is free in a fresh namespace too)
        self.port = port or free_port()
        # (PEM key store: server key and certificate; PEM trust store: the CA of clients)
        self.secure = secure
        self.secure_port = free_port() if secure else None
        self.tick_time = tick_time
        self.min_session_timeout = min_session_timeout
        self.workdir = tempfile.mkdtemp(prefix="percolator-zk-")
        self.data_dir = os.path.join(self.workdir, "data")
        os.makedirs(self.data_dir)
        self.config_path = os.path.join(self.workdir, "zoo.cfg")
        self.log_path = os.path.join(self.workdir, "zookeeper.log")
        self.process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        _live.add(self)

    @property
    def hosts(self) -> str:
        """The connection string ``"HOST:PORT"``."""
        return f"{self.host}:{self.port}"

    @property
    def secure_hosts(self) -> str:
        """The TLS connection string ``"HOST:SECURE_PORT"``."""
        assert self.secure_port is not None, "not started with secure=..."
        return f"{self.host}:{self.secure_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _write_config(self) -> None:
        with open(self.config_path, "w") as f:
            f.write(
                f"tickTime={self.tick_time}\n"
                f"minSessionTimeout={self.min_session_timeout}\n"
                "maxSessionTimeout=60000\n"
                f"dataDir={self.data_dir}\n"
                f"clientPort={self.port}\n"
                f"clientPortAddress={self.host}\n"
                "admin.enableServer=false\n"
                "4lw.commands.whitelist=*\n"
                "maxClientCnxns=0\n"
                "autopurge.purgeInterval=0\n"
            )
            if self.secure is not None:
                keystore, truststore = self.secure
                f.write(
                    f"secureClientPort={self.secure_port}\n"
                    f"secureClientPortAddress={self.host}\n"
                    "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
                    f"ssl.keyStore.location={keystore}\n"
                    "ssl.keyStore.type=PEM\n"
                    f"ssl.trustStore.location={truststore}\n"
                    "ssl.trustStore.type=PEM\n"
                    "ssl.clientAuth=need\n"
                    "ssl.enabledProtocols=TLSv1.3,TLSv1.2\n"
                )

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until ``srvr`` answers ``Mode: standalone``.

        :raises RuntimeError: if it exits or is not ready within *timeout* seconds (the
            message ends with the tail of its log).
        """
        with self._lock:
            if self.running:
                return
            self._write_config()
            cmd = [
                "java",
                "-Xms32m",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                f"-Dzookeeper.log.dir={self.workdir}",
                "-Dzookeeper.root.logger=INFO,CONSOLE",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-cp",
                ":".join([ZOOKEEPER_JAR, ZOOKEEPER_CONF_DIR, *(NETTY_JARS if self.secure else [])]),
                MAIN_CLASS,
                self.config_path,
            ]
            with open(self.log_path, "ab") as log:
                netns = ["ip", "netns", "exec", self.netns] if self.netns else []
                self.process = subprocess.Popen(
                    [*DIE_WITH_PARENT, *netns, *cmd],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"ZooKeeper exited at start:\n{self.log_tail()}")
            if "Mode: standalone" in self.four_letter("srvr"):
                return
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"ZooKeeper not ready after {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM), escalating to SIGKILL after *timeout* seconds."""
        with self._lock:
            p = self.process
            if p is None:
                return
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            self.process = None

    def kill(self) -> None:
        """Kill the server with SIGKILL (a crash); :meth:`start` brings it back with its data."""
        with self._lock:
            p = self.process
            if p is None:
                return
            if p.poll() is None:
                p.kill()
            p.wait()
            self.process = None

    def restart(self, timeout: float = 60.0) -> None:
        """Stop and start again on the same port with the same data directory."""
        self.stop()
        self.start(timeout)

    def cleanup(self) -> None:
        """Kill the process and delete its data directory."""
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _inside(self, fn: Callable[[], T]) -> T:
        """Run *fn* where the server's address is reachable (inside its namespace)."""
        if self.netns is None:
            return fn()
        from tests.faults._netns import run_in_netns

        return run_in_netns(self.netns, fn)

    def four_letter(self, command: str, timeout: float = 2.0) -> str:
        """:func:`four_letter` to this server (from inside its namespace)."""
        return self._inside(lambda: four_letter(self.hosts, command, timeout))

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def expire_session(self, client: Any, timeout: float = 10.0) -> None:
        """Expire the ZooKeeper session of a started kazoo client *client*.

        Opens a second connection with the same session id and password and closes it,
        which ends the session on the server; *client* then sees ``KazooState.LOST``. See
        :meth:`expire_session_id` for a session held by another process.
        """
        session_id, password = client.client_id
        self.expire_session_id(session_id, password, timeout)

    def expire_session_id(self, session_id: int, password: bytes, timeout: float = 10.0) -> None:
        """Expire the session *session_id* (with its *password*) on this server."""
        from kazoo.client import KazooClient

        def expire() -> None:
            other = KazooClient(hosts=self.hosts, client_id=(session_id, password),
                                timeout=timeout)
            other.start(timeout=timeout)
            try:
                other.stop()
            finally:
                other.close()

        self._inside(expire)

    def create_chroot(self, name: str | None = None) -> str:
        """Create a fresh chroot node; return the connection string ``hosts/chroot``."""
        from kazoo.client import KazooClient

        path = "/" + (name or f"test-{uuid.uuid4().hex[:12]}")

        def create() -> None:
            zk = KazooClient(hosts=self.hosts, timeout=10.0)
            zk.start(timeout=30)
            try:
                zk.ensure_path(path)
            finally:
                zk.stop()
                zk.close()

        self._inside(create)
        return f"{self.hosts}{path}"

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


@atexit.register
def _kill_all() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.cleanup()


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper for the whole test session (see the module docstring)."""
    missing = java_available()
    if missing is not None:
        service_missing(missing)
    try:
        import kazoo  # noqa: F401
    except ImportError:
        service_missing("kazoo is not installed: pip install 'kazoo>=2.9'")
    server = ZooKeeperServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def zk_chroot(zookeeper: ZooKeeperServer) -> str:
    """A fresh, existing chroot ``"127.0.0.1:PORT/test-<hex>"`` on the session ZooKeeper."""
    if not zookeeper.running:
        zookeeper.start()
    return zookeeper.create_chroot()


class TlsZooKeeper:
    """A :class:`ZooKeeperServer` with a TLS port, its CA and a client certificate."""

    def __init__(self, directory: str) -> None:
        from tests._tls import TestCA

        self.ca = TestCA(os.path.join(directory, "ca"), "zookeeper test CA")
        server = self.ca.issue("zookeeper-server")
        self.client_cert = self.ca.issue("zookeeper-client", client=True)
        self.server = ZooKeeperServer(secure=(self.ca.combined(server), self.ca.ca))

    @property
    def hosts(self) -> str:
        """The TLS connection string."""
        return self.server.secure_hosts

    @property
    def tls(self) -> Any:
        """A client TlsConfig that ZooKeeper accepts (mutual TLS)."""
        return self.ca.client_tls(self.client_cert)

    def chroot(self) -> str:
        """A fresh chroot on the TLS port: ``"127.0.0.1:SECURE_PORT/test-<hex>"``."""
        return self.server.create_chroot().replace(self.server.hosts, self.hosts, 1)


@pytest.fixture(scope="session")
def tls_zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsZooKeeper]:
    """A ZooKeeper with a secureClientPort and a throwaway CA (see the module docstring)."""
    missing = java_available()
    if missing is not None:
        service_missing(missing)
    zk = TlsZooKeeper(str(tmp_path_factory.mktemp("tls-zookeeper")))
    try:
        zk.server.start()
        yield zk
    finally:
        zk.server.cleanup()
