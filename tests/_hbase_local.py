"""A real HBase on this machine: standalone HBase 2.6 plus its Thrift1 server.

:class:`LocalHBase` starts HBase's standalone mode (master, region server and
ZooKeeper in one JVM, on the local file system, in a data directory of its own, on
free loopback ports, web UIs off, heap bounded) and a second JVM running the Thrift1
server happybase speaks, and waits until a happybase call is answered. It stops both
(``kill -9``) at :meth:`LocalHBase.stop`, at interpreter exit, and, through
``PR_SET_PDEATHSIG``, when the Python process that started them dies however it dies,
so nothing is left running. The fault tests use :meth:`kill_hbase`,
:meth:`kill_thrift`, :meth:`start_hbase` and :meth:`start_thrift` to kill and restart
either JVM on the same ports and data.

The jars come from Maven Central through the pom in ``deploy/hbase/pom.xml``
(:func:`classpath`): Maven keeps them in ``~/.m2``, and the resolved class path is
cached in ``~/.cache/percolator-hbase`` keyed by the pom's content, so a second run
neither calls Maven nor touches the network.

Every failure to start is :class:`HBaseStartError`, whose message says what failed:
Java missing, Maven missing or failing (its last lines), a port taken, or the JVM's
exit or silence with the last lines of its log.

For people and benchmarks::

    scripts/hbase            # prints PERCOLATOR_HBASE_THRIFT=127.0.0.1:PORT (Thrift1),
                             # PERCOLATOR_HBASE_THRIFT2=127.0.0.1:PORT2 (Thrift2, the
                             # store's hbase://...:PORT2?api=thrift2), runs until ^C
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POM = ROOT / "deploy" / "hbase" / "pom.xml"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "percolator-hbase"
START_SECONDS = 180.0
"""How long the JVMs may take to answer: ~15 s on an idle 2-core machine, several times
that while other test processes share the cores."""

HEAP = "-Xmx1g"
THRIFT_HEAP = "-Xmx384m"

# What bin/hbase adds on JDK 11+ (add_jdk11_jvm_flags / add_jdk17_jvm_flags): HBase's
# netty and its off-heap code reach into java.base.
JDK17_FLAGS = (
    "-Dorg.apache.hbase.thirdparty.io.netty.tryReflectionSetAccessible=true",
    "--add-modules", "jdk.unsupported",
    *(f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
        "java.io", "java.nio", "sun.nio.ch", "java.lang", "jdk.internal.ref",
        "java.lang.reflect", "java.util", "java.util.concurrent",
        "java.util.concurrent.atomic",
    )),
    *(f"--add-exports={p}=ALL-UNNAMED" for p in (
        "java.base/jdk.internal.misc", "java.base/sun.net.dns", "java.base/sun.net.util",
        "java.security.jgss/sun.security.krb5",
    )),
)

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:hbase.log.file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{ISO8601} %-5p [%t] %c{2}: %.1000m%n
rootLogger = INFO,file
logger.zookeeper.name = org.apache.zookeeper
logger.zookeeper.level = WARN
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = WARN
logger.hbase.name = org.apache.hadoop.hbase
logger.hbase.level = INFO
"""


class HBaseStartError(RuntimeError):
    """HBase could not be obtained or started; the message says what failed."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def java() -> str:
    """The ``java`` to run, JDK 11 or newer (``JAVA_HOME`` first, then ``PATH``)."""
    home = os.environ.get("JAVA_HOME")
    exe = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if home and (not exe or not os.access(exe, os.X_OK)):
        raise HBaseStartError(f"JAVA_HOME={home} has no bin/java (HBase 2.6 needs JDK 11+)")
    if not exe or not os.access(exe, os.X_OK):
        raise HBaseStartError(
            "java is not installed (HBase 2.6 needs JDK 11+): "
            "apt-get install openjdk-17-jre-headless"
        )
    return exe


def classpath(pom: Path = POM) -> str:
    """The class path of HBase and its Thrift server, resolved by Maven from *pom* once
    and cached under :data:`CACHE` (keyed by the pom's content)."""
    key = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    cached = CACHE / f"{key}.classpath"
    if cached.exists():
        cp = cached.read_text().strip()
        if cp and all(os.path.exists(jar) for jar in cp.split(os.pathsep)):
            return cp
    mvn = shutil.which("mvn")
    if mvn is None:
        raise HBaseStartError("mvn is not installed (it fetches HBase): apt-get install maven")
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    result = subprocess.run(
        [mvn, "-q", "-B", "-f", str(pom), "dependency:build-classpath",
         f"-Dmdep.outputFile={partial}"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )
    if result.returncode != 0 or not partial.exists():
        out = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise HBaseStartError(f"mvn could not resolve HBase from {pom} "
                              f"(exit {result.returncode}):\n{out}")
    partial.replace(cached)  # atomic: a concurrent resolver reads all or nothing
    return cached.read_text().strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_taken(port: int) -> bool:
    """Whether something listens on *port*. (With SO_REUSEADDR, as the JVMs bind: the
    connections a killed server leaves in TIME_WAIT do not stop its restart.)"""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


_PR_SET_PDEATHSIG = 1


def _own_group() -> None:  # pragma: no cover - runs in the child before exec
    os.setpgrp()  # ^C at the terminal reaches Python only, which stops the JVMs in order


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # The JVMs get SIGKILL when the process that started them dies, even by kill -9:
    # an interrupted or killed test run leaves no HBase behind.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setpgrp()  # and ^C at the terminal reaches Python only, which stops them in order


def _site_xml(properties: dict[str, str]) -> str:
    body = "".join(
        f"  <property><name>{k}</name><value>{v}</value></property>\n"
        for k, v in properties.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'


class LocalHBase:
    """A standalone HBase and its Thrift1 server in *data_dir* (a new temporary
    directory, removed at :meth:`stop`, if None). ``thrift_args`` are extra arguments
    of the Thrift server (e.g. ``["-f", "-c"]`` for framed transport and the compact
    protocol); ``site`` overrides or adds ``hbase-site.xml`` properties. The Thrift
    servers listen on *bind* (loopback unless told otherwise), on *thrift_port* and
    *thrift2_port* or free ports; the Thrift2 server (the store's ``api=thrift2``, the
    default of the suite's ``hbase`` backend) starts with the rest unless *thrift2* is
    False, else once :meth:`start_thrift2` is called.

    A ``detached`` HBase outlives the process that starts it (a pytest-xdist worker
    starting it for the whole run: ``tests._services.shared_service``); whoever started
    it stops it, from :meth:`describe`'s pids. :meth:`attached` describes, in another
    process, an HBase that runs already."""

    def __init__(
        self, data_dir: str | Path | None = None, *, thrift_args: Sequence[str] = (),
        site: dict[str, str] | None = None, bind: str = "127.0.0.1",
        thrift_port: int | None = None, thrift2_port: int | None = None,
        detached: bool = False, thrift2: bool = True,
    ) -> None:
        self.with_thrift2 = thrift2
        self._own_dir = data_dir is None
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix="percolator-hbase-"))
        self.thrift_args = list(thrift_args)
        self.bind = bind
        self.zk_port = _free_port()
        self.master_port = _free_port()
        self.regionserver_port = _free_port()
        self.thrift_port = thrift_port or _free_port()
        self.thrift2_port = thrift2_port or _free_port()
        self.site = {
            "hbase.cluster.distributed": "false",
            "hbase.rootdir": f"file://{self.dir}/root",
            "hbase.tmp.dir": str(self.dir / "tmp"),
            "hbase.zookeeper.quorum": "127.0.0.1",
            "hbase.zookeeper.property.dataDir": str(self.dir / "zk"),
            "hbase.zookeeper.property.clientPort": str(self.zk_port),
            "hbase.master.port": str(self.master_port),
            "hbase.regionserver.port": str(self.regionserver_port),
            "hbase.master.hostname": "127.0.0.1",
            "hbase.regionserver.hostname": "127.0.0.1",
            "hbase.master.info.port": "-1",
            "hbase.regionserver.info.port": "-1",
            "hbase.thrift.info.port": "-1",
            # The local file system has no hflush/hsync capability; HBase refuses to
            # write its WAL there unless told not to check.
            "hbase.unsafe.stream.capability.enforce": "false",
            # The Thrift server's own client gives up on a dead cluster within this, so
            # a call fails with IOError before the store's socket timeout (docs/hbase.md).
            "hbase.client.operation.timeout": "30000",
            # A DDL call waits for its procedure by polling at multiples of the pause:
            # at 10 ms (not 100) a table's create took 0.25 s instead of 0.64, its
            # drop 0.2 s instead of 0.45, and the suite makes some 2,000 of them. More
            # retries keep the time a call retries a dead cluster near 30 s (above).
            "hbase.client.pause": "10",
            "hbase.client.retries.number": "20",
            # The master holds a region's open/close 150 ms to batch them per server:
            # one region server, nothing to batch.
            "hbase.procedure.remote.dispatcher.delay.msec": "0",
            "zookeeper.session.timeout": "30000",
            # A test session leaves hundreds of small tables: with MSLAB each region's
            # memstore takes a 2 MB chunk per family on its first write, and 1 GB of
            # heap ran out after ~100 tables (OutOfMemoryError, region server abort).
            "hbase.hregion.memstore.mslab.enabled": "false",
            "hbase.hregion.compacting.memstore.type": "NONE",
            # One region server, started in the same JVM: the master need not wait
            # 4.5 s for more, nor the region server 3 s between reports.
            "hbase.master.wait.on.regionservers.mintostart": "1",
            "hbase.master.wait.on.regionservers.interval": "200",
            "hbase.master.wait.on.regionservers.timeout": "1000",
            "hbase.regionserver.msginterval": "1000",
            **(site or {}),
        }
        self.hbase: subprocess.Popen[bytes] | None = None
        self.thrift: subprocess.Popen[bytes] | None = None
        self.thrift2: subprocess.Popen[bytes] | None = None
        self.thrift2_shared = False
        """The Thrift2 server was started with the shared HBase, by another process."""
        self._cp = ""
        self._detached = detached
        self._attached_pids: tuple[int, ...] = ()
        if not detached:
            atexit.register(self.stop)

    def describe(self) -> dict[str, Any]:
        """What another process needs to use this HBase (:meth:`attached`) and to stop
        it (its JVMs' pids, each leading its process group, and its data directory)."""
        assert self.hbase is not None and self.thrift is not None
        return {
            "hostport": self.hostport, "dir": str(self.dir), "thrift_args": self.thrift_args,
            "ports": [self.zk_port, self.master_port, self.regionserver_port,
                      self.thrift_port],
            "thrift2_port": self.thrift2_port if self.thrift2 is not None else None,
            "pids": [self.hbase.pid, self.thrift.pid,
                     *([self.thrift2.pid] if self.thrift2 is not None else [])],
            "dirs": [str(self.dir)] if self._own_dir else [],
        }

    @classmethod
    def attached(cls, description: dict[str, Any]) -> LocalHBase:
        """The HBase of *description* (:meth:`describe`), started by another process:
        its ports and data directory (its ``conf/hbase-site.xml``), not its JVMs."""
        hbase = cls(description["dir"], thrift_args=description["thrift_args"],
                    detached=True)
        (hbase.zk_port, hbase.master_port, hbase.regionserver_port,
         hbase.thrift_port) = description["ports"]
        hbase._attached_pids = tuple(description["pids"])
        if description.get("thrift2_port"):
            hbase.thrift2_port = description["thrift2_port"]
            hbase.thrift2_shared = True
        return hbase

    @property
    def jvm_pids(self) -> tuple[int, int]:
        """The pids of HBase's JVM and of its Thrift1 server's, whichever process of
        the session started them."""
        if self.hbase is not None and self.thrift is not None:
            return self.hbase.pid, self.thrift.pid
        if len(self._attached_pids) < 2:
            raise RuntimeError("this HBase was neither started nor attached to here")
        return self._attached_pids[0], self._attached_pids[1]

    @property
    def hostport(self) -> str:
        """``host:port`` of the Thrift1 server (``PERCOLATOR_HBASE_THRIFT``)."""
        return f"127.0.0.1:{self.thrift_port}"

    @property
    def hostport2(self) -> str:
        """``host:port`` of the Thrift2 server (the store's ``thrift2=`` option)."""
        return f"127.0.0.1:{self.thrift2_port}"

    @property
    def hbase_log(self) -> Path:
        return self.dir / "logs" / "hbase.log"

    @property
    def thrift_log(self) -> Path:
        return self.dir / "logs" / "thrift.log"

    @property
    def thrift2_log(self) -> Path:
        return self.dir / "logs" / f"thrift2-{self.thrift2_port}.log"

    # -- starting ------------------------------------------------------------------

    def start(self, timeout: float = START_SECONDS) -> LocalHBase:
        """Start HBase and its Thrift server and wait until a happybase call that
        needs a region server (a scan of ``hbase:meta``) is answered."""
        self._cp = classpath()
        conf = self.dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        (conf / "hbase-site.xml").write_text(_site_xml(self.site))
        (conf / "log4j2.properties").write_text(LOG4J2)
        deadline = time.monotonic() + timeout
        self.start_hbase(deadline - time.monotonic())
        self.start_thrift(deadline - time.monotonic())
        if self.with_thrift2:
            self.start_thrift2(deadline - time.monotonic())
        return self

    def _jvm(self, heap: str, log: Path, main: str, *args: str,
             detached: bool | None = None) -> subprocess.Popen[bytes]:
        command = [
            java(), heap, "-XX:+UseG1GC", "-Djava.net.preferIPv4Stack=true",
            *JDK17_FLAGS,
            f"-Dhbase.log.file={log}", f"-Dhbase.log.dir={log.parent}",
            f"-Dlog4j.configurationFile=file:{self.dir}/conf/log4j2.properties",
            "-cp", f"{self.dir / 'conf'}{os.pathsep}{self._cp}", main, *args,
        ]
        with open(log.with_suffix(".out"), "ab") as out:  # the JVM's own stdout/stderr
            return subprocess.Popen(
                command, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=(_own_group if (self._detached if detached is None else detached)
                            else _die_with_parent),
            )

    def _failed(self, what: str, proc: subprocess.Popen[bytes], log: Path) -> HBaseStartError:
        state = (f"exited with {proc.returncode}" if proc.poll() is not None
                 else "did not answer in time")
        text = (f"{what} {state}; last lines of {log}:\n{_tail(log)}\n"
                f"-- {log.with_suffix('.out')}:\n{_tail(log.with_suffix('.out'), 10)}")
        return HBaseStartError(text)

    def start_hbase(self, timeout: float = START_SECONDS) -> None:
        """Start (or restart, on the same ports and data) the HBase JVM and wait until
        ZooKeeper answers; :meth:`wait_ready` waits for the regions."""
        for port in (self.zk_port, self.master_port, self.regionserver_port):
            if _port_taken(port):
                raise HBaseStartError(f"port {port} on 127.0.0.1 is taken (HBase's "
                                      f"ZooKeeper/master/region server needs it)")
        self.hbase = self._jvm(HEAP, self.hbase_log, "org.apache.hadoop.hbase.master.HMaster",
                               "start")
        deadline = time.monotonic() + timeout
        while not _zk_answers(self.zk_port):
            if self.hbase.poll() is not None or time.monotonic() > deadline:
                raise self._failed("HBase (HMaster start)", self.hbase, self.hbase_log)
            time.sleep(0.2)

    def start_thrift(self, timeout: float = START_SECONDS) -> None:
        """Start (or restart, on the same port) the Thrift1 server and wait until a
        happybase call that needs a region server is answered."""
        if _port_taken(self.thrift_port):
            raise HBaseStartError(f"port {self.thrift_port} on 127.0.0.1 is taken "
                                  f"(the Thrift server needs it)")
        self.thrift = self._jvm(
            THRIFT_HEAP, self.thrift_log, "org.apache.hadoop.hbase.thrift.ThriftServer",
            "-b", self.bind, "-p", str(self.thrift_port), *self.thrift_args, "start",
        )
        self.wait_ready(timeout)

    def start_thrift2(self, timeout: float = START_SECONDS) -> None:
        """Start (or restart, on the same port) the Thrift2 server, with the Thrift1
        server's transport and protocol, and wait until it accepts a connection (HBase
        behind it is already serving: :meth:`start` waited for that). It belongs to
        this process, also for an HBase :meth:`attached` from another one (each
        pytest-xdist worker that asks starts its own): it dies with it."""
        if (self.thrift2 is not None and self.thrift2.poll() is None) or self.thrift2_shared:
            return  # running, or started with the shared HBase by another process
        if not self._cp:
            self._cp = classpath()
        if self._detached and self.hbase is None:  # attached: it is this process's
            atexit.register(lambda: _kill(self.thrift2))
        if _port_taken(self.thrift2_port):
            raise HBaseStartError(f"port {self.thrift2_port} on 127.0.0.1 is taken "
                                  "(the Thrift2 server needs it)")
        self.thrift2 = self._jvm(
            THRIFT_HEAP, self.thrift2_log, "org.apache.hadoop.hbase.thrift2.ThriftServer",
            "-b", self.bind, "-p", str(self.thrift2_port), *self.thrift_args, "start",
            detached=self._detached and self.hbase is not None,
        )
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.thrift2_port), timeout=1).close()
                return
            if self.thrift2.poll() is not None or time.monotonic() > deadline:
                raise self._failed("the Thrift2 server", self.thrift2, self.thrift2_log)
            time.sleep(0.3)

    def wait_ready(self, timeout: float = START_SECONDS) -> None:
        """Wait until the Thrift server answers a scan of ``hbase:meta`` (which needs
        the master, the region server and the meta region)."""
        deadline = time.monotonic() + timeout
        while not self.answers():
            for what, proc, log in (("HBase (HMaster start)", self.hbase, self.hbase_log),
                                    ("the Thrift server", self.thrift, self.thrift_log)):
                if proc is None or proc.poll() is not None:
                    if proc is None:
                        raise HBaseStartError(f"{what} is not running")
                    raise self._failed(what, proc, log)
            if time.monotonic() > deadline:
                assert self.thrift is not None
                raise self._failed("the Thrift server (or HBase behind it)", self.thrift,
                                   self.thrift_log if self.thrift.poll() is not None
                                   else self.hbase_log)
            time.sleep(0.3)

    def answers(self) -> bool:
        """Whether the Thrift server answers a happybase call reaching a region server."""
        import happybase

        framed = "-f" in self.thrift_args or "-hsha" in self.thrift_args
        compact = "-c" in self.thrift_args
        connection = happybase.Connection(
            "127.0.0.1", self.thrift_port, timeout=5000, autoconnect=False,
            transport="framed" if framed else "buffered",
            protocol="compact" if compact else "binary",
        )
        try:
            connection.open()
            connection.tables()
            next(iter(connection.table("hbase:meta").scan(limit=1)), None)
            return True
        except Exception:
            return False
        finally:
            connection.close()

    # -- faults and stopping -------------------------------------------------------

    def kill_hbase(self) -> None:
        """``kill -9`` the HBase JVM (master, region server and ZooKeeper at once)."""
        _kill(self.hbase)

    def kill_thrift(self) -> None:
        """``kill -9`` the Thrift server alone."""
        _kill(self.thrift)

    def stop(self) -> None:
        """Kill the JVMs and remove the data directory if it was made here."""
        _kill(self.thrift2)
        _kill(self.thrift)
        _kill(self.hbase)
        if self._own_dir and self.dir.exists() and not os.environ.get("PERCOLATOR_HBASE_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalHBase:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def _zk_answers(port: int) -> bool:
    """Whether a ZooKeeper serves on *port* (the ``ruok`` four-letter word is not
    whitelisted by HBase's MiniZooKeeperCluster; ``srvr`` is)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"srvr")
            return s.recv(64).startswith(b"Zookeeper")
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/hbase``: start one, print where, run until interrupted."""
    import argparse

    parser = argparse.ArgumentParser(prog="scripts/hbase", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="data directory (kept); default: a temporary one")
    parser.add_argument("--thrift2", action="store_true",
                        help="start the Thrift2 server (the default; kept for old scripts)")
    parser.add_argument("--no-thrift2", dest="no_thrift2", action="store_true",
                        help="start no Thrift2 server (the store's api=thrift2 needs one)")
    parser.add_argument("--bind", default="127.0.0.1",
                        help="address the Thrift servers listen on (0.0.0.0 in a container)")
    parser.add_argument("--thrift-port", type=int, help="Thrift1 port (default: a free one)")
    parser.add_argument("--thrift2-port", type=int, help="Thrift2 port (default: a free one)")
    parser.add_argument("thrift_args", nargs="*",
                        help="extra Thrift server arguments after --, e.g. -- -f -c")
    args = parser.parse_args(argv)
    started = time.monotonic()
    hbase = LocalHBase(args.dir, thrift_args=args.thrift_args, bind=args.bind,
                       thrift_port=args.thrift_port, thrift2_port=args.thrift2_port,
                       thrift2=not args.no_thrift2)
    try:
        hbase.start()
    except HBaseStartError as e:
        print(f"scripts/hbase: {e}", file=sys.stderr)
        hbase.stop()
        return 1
    print(f"HBase {hbase.dir} ready in {time.monotonic() - started:.1f} s; logs in "
          f"{hbase.dir / 'logs'}", flush=True)
    print(f"PERCOLATOR_HBASE_THRIFT={hbase.hostport}", flush=True)
    if hbase.thrift2 is not None:
        print(f"PERCOLATOR_HBASE_THRIFT2={hbase.hostport2}", flush=True)
        print(f"store URL: hbase://{hbase.hostport2}?api=thrift2", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while hbase.hbase is not None and hbase.hbase.poll() is None:
            time.sleep(1)
    hbase.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
