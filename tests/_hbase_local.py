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
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POM = ROOT / "deploy" / "hbase" / "pom.xml"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "percolator-hbase"
START_SECONDS = 280.0
"""How long the JVMs may take to answer: ~15 s on an idle 2-core machine, several times
that while other test processes share the cores. Beside two CPU hogs (load 40-60 on 2
cores, 2026-11-29) a standalone HBase had not answered after 180 s (its master was
still connecting to its ZooKeeper), and every hbase test of the run skipped. Below the
300 s hang guard of the first test, whose setup starts it (setup.cfg, pytest-timeout)."""

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


def tail(path: Path, lines: int = 30) -> str:
    """The last *lines* of the log at *path* (for an error message)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


JVM_OPTIONS_ENV = "PERCOLATOR_JVM_OPTS"


def jvm_options() -> list[str]:
    """Extra options for every JVM the test launchers start (``PERCOLATOR_JVM_OPTS``,
    split on whitespace). Unset, HBase runs as it would in production, fully
    JIT-compiled (``scripts/hbase``, bench/). The test suite sets
    ``-XX:TieredStopAtLevel=1`` (tests/conftest.py): its JVMs live minutes, and C2's
    compilations were half their CPU (CONTRIBUTING.md, "Test suite time")."""
    return os.environ.get(JVM_OPTIONS_ENV, "").split()


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


_PORTS = random.Random()  # its own: a test seeding the module's would repeat our choices


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _free_port() -> int:
    """A port nothing listens on, chosen below the kernel's ephemeral range. A port
    from ``bind(0)`` is an ephemeral one, which the kernel may hand to any outgoing
    connection before the server meant for it binds it: HBase's own connections took
    the port chosen for its Thrift2 server once ("port ... is taken")."""
    high = _ephemeral_low() - 1
    for _ in range(100):
        port = _PORTS.randint(min(20000, high - 1000), high)
        if not _port_taken(port):
            return port
    with socket.socket() as s:  # a crowded range: the kernel's choice after all
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


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # The JVMs get SIGKILL when the process that started them dies, even by kill -9:
    # an interrupted or killed test run leaves no HBase behind.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setpgrp()  # and ^C at the terminal reaches Python only, which stops them in order


DIE_WITH_PARENT: list[str] = (
    ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
)
"""A command prefix that makes a child die with the process that started it
(PR_SET_PDEATHSIG, set by util-linux ``setpriv`` before it execs the command). Not a
``preexec_fn``: code run between fork and exec can deadlock once the parent has threads
(py4j, gRPC, kazoo all start some). Here, not in ``tests/_zookeeper.py``, because
``scripts/hbase`` runs this module with the standard library alone."""


def _spawned(command: list[str], *, die_with_parent: bool = True,
             ) -> tuple[list[str], dict[str, Any]]:
    """*command* and the Popen options that put it in a session (and process group) of
    its own (^C at the terminal reaches Python only, which stops the JVMs in order) and, with
    *die_with_parent*, make it die with its starter (PR_SET_PDEATHSIG, set by util-linux
    ``setpriv`` before it execs the command: :data:`DIE_WITH_PARENT`). Not a
    ``preexec_fn`` where ``setpriv`` exists: Python code run between fork and exec in a
    process whose gRPC threads run can abort the child (a fresh clone's suite,
    2026-11-29: the multi-server master "exited with -6" after gRPC's "epoll_wait error:
    Bad file descriptor")."""
    if not die_with_parent:
        return command, {"start_new_session": True}
    if DIE_WITH_PARENT:
        return [*DIE_WITH_PARENT, *command], {"start_new_session": True}
    return command, {"preexec_fn": _die_with_parent}


LOCAL_SESSION = "zookeeper.session.timeout.localHBaseCluster"
"""The ``hbase-site.xml`` property that sets a standalone HBase's own ZooKeeper session."""
STANDALONE_SESSION_MS = 60_000
"""``scripts/hbase``'s standalone HBase keeps its ZooKeeper session this long, in ms: with
HBase's 10 s, a pause of 8 s at load 24-50 on 2 cores expired its master's session and
the master aborted (three times, 2026-11-29); a restart after a crash waits this long
for the new master (docs/hbase.md)."""


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
            # A standalone HBase gives its master and region server the ZooKeeper session
            # of this property, not of zookeeper.session.timeout (HMasterCommandLine;
            # HBase's default 10 s). A restart on the same data waits out the killed
            # master's session before the new master becomes active, so HBases the tests
            # kill keep 10 s; the suite's own and scripts/hbase's take longer ones
            # (SESSION_SITE in tests/_hbase.py, STANDALONE_SESSION_MS below).
            LOCAL_SESSION: "10000",
            # HBase's clients (the Thrift server's, the master's) give ZooKeeper 10 s
            # to answer by default: at load 27-47 on 2 cores a fresh clone's run failed
            # 8 tests with "Zookeeper LIST could not be completed in 10000 ms".
            "zookeeper.registry.async.get.timeout": "60000",
            "hbase.zookeeper.sync.timeout.millis": "60000",
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
        # Its ZooKeeper grants at most 20 ticks (40 s) unless told to grant more.
        self.site.setdefault("hbase.zookeeper.property.maxSessionTimeout",
                             str(max(40_000, int(self.site[LOCAL_SESSION]))))
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
             detached: bool | None = None, conf: Path | None = None,
             ) -> subprocess.Popen[bytes]:
        command = [
            java(), heap, "-XX:+UseG1GC", "-Djava.net.preferIPv4Stack=true",
            *JDK17_FLAGS, *jvm_options(),
            f"-Dhbase.log.file={log}", f"-Dhbase.log.dir={log.parent}",
            f"-Dlog4j.configurationFile=file:{self.dir}/conf/log4j2.properties",
            "-cp", f"{conf or self.dir / 'conf'}{os.pathsep}{self._cp}", main, *args,
        ]
        argv, options = _spawned(
            command, die_with_parent=not (self._detached if detached is None else detached))
        with open(log.with_suffix(".out"), "ab") as out:  # the JVM's own stdout/stderr
            return subprocess.Popen(
                argv, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, **options,
            )

    def _failed(self, what: str, proc: subprocess.Popen[bytes], log: Path) -> HBaseStartError:
        state = (f"exited with {proc.returncode}" if proc.poll() is not None
                 else "did not answer in time")
        text = (f"{what} {state}; last lines of {log}:\n{tail(log)}\n"
                f"-- {log.with_suffix('.out')}:\n{tail(log.with_suffix('.out'), 10)}")
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
            atexit.register(lambda: kill(self.thrift2))
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
        try:
            import happybase
        except ImportError:  # scripts/hbase outside the project's virtualenv
            return _meta_get_answers(self.thrift_port, self.thrift_args)

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
        kill(self.hbase)

    def kill_thrift(self) -> None:
        """``kill -9`` the Thrift server alone."""
        kill(self.thrift)

    def stop(self) -> None:
        """Kill the JVMs and remove the data directory if it was made here."""
        kill(self.thrift2)
        kill(self.thrift)
        kill(self.hbase)
        if self._own_dir and self.dir.exists() and not os.environ.get("PERCOLATOR_HBASE_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalHBase:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


CLUSTER_SITE = ROOT / "deploy" / "hbase" / "cluster-site.xml"
"""The multi-server settings the launcher and docker-compose.yml share."""
CLUSTER_START_SECONDS = 600.0
"""How long a multi-server HBase may take to answer: 60 s at load 24, 100-235 s at
load 15-47 on 2 cores (five JVMs starting at once)."""
ZK_HEAP = "-Xmx128m"
MASTER_HEAP = "-Xmx512m"
REGIONSERVER_HEAP = "-Xmx768m"


def read_site(path: Path = CLUSTER_SITE) -> dict[str, str]:
    """The properties of an ``hbase-site.xml``-style file, in order."""
    import xml.etree.ElementTree as ET

    return {prop.findtext("name", "").strip(): prop.findtext("value", "").strip()
            for prop in ET.parse(path).getroot().iter("property")}


def _zoo_cfg(data_dir: Path, port: int, bind: str) -> str:
    # admin.enableServer=false: ZooKeeper's admin server would take port 8080.
    return (f"tickTime=2000\ndataDir={data_dir}\nclientPort={port}\n"
            f"clientPortAddress={bind}\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=*\nmaxClientCnxns=0\nmaxSessionTimeout=60000\n")


class LocalHBaseCluster(LocalHBase):
    """A multi-server HBase in *data_dir*: ZooKeeper, an HMaster and *region_servers*
    HRegionServers, each its own JVM, plus the Thrift1 server (and the Thrift2 server
    on :meth:`start_thrift2`), on the local file system, with the settings of
    ``deploy/hbase/cluster-site.xml``. Every JVM dies with the process that started it.

    Its ports are chosen once and kept in ``DIR/cluster.json``: started again on the
    same *data_dir* (``scripts/hbase --region-servers N --dir DIR``), it has the same
    addresses and the same data. :meth:`kill_region_server` and
    :meth:`start_region_server` kill -9 and restart one region server on its port;
    :meth:`admin` administers the regions (tests/_hbase_local.py's
    :class:`RegionAdmin`)."""

    def __init__(
        self, data_dir: str | Path | None = None, *, region_servers: int = 2,
        thrift_args: Sequence[str] = (), site: dict[str, str] | None = None,
        bind: str = "127.0.0.1", thrift_port: int | None = None,
        thrift2_port: int | None = None, thrift2: bool = True,
    ) -> None:
        # set before anything can fail: stop() runs at exit whatever happens below
        self.zookeeper: subprocess.Popen[bytes] | None = None
        self.region_servers: list[subprocess.Popen[bytes] | None] = []
        self._admin: RegionAdmin | None = None
        self._pids: dict[str, int] = {}
        super().__init__(data_dir, thrift_args=thrift_args, bind=bind,
                         thrift_port=thrift_port, thrift2_port=thrift2_port, thrift2=thrift2)
        saved = self.dir / "cluster.json"
        ports = json.loads(saved.read_text()) if saved.exists() else {}
        if ports and len(ports["regionservers"]) != region_servers:
            raise HBaseStartError(
                f"{self.dir} holds an HBase of {len(ports['regionservers'])} region servers "
                f"(cluster.json), not {region_servers}: start it with --region-servers "
                f"{len(ports['regionservers'])}, or use another --dir")
        self.zk_port = ports.get("zookeeper") or self.zk_port
        self.master_port = ports.get("master") or self.master_port
        self.regionserver_ports: list[int] = ports.get("regionservers") or [
            _free_port() for _ in range(region_servers)]
        self.thrift_port = thrift_port or ports.get("thrift") or self.thrift_port
        self.thrift2_port = thrift2_port or ports.get("thrift2") or self.thrift2_port
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps({
            "zookeeper": self.zk_port, "master": self.master_port,
            "regionservers": self.regionserver_ports, "thrift": self.thrift_port,
            "thrift2": self.thrift2_port}))
        self.site = {
            **read_site(),
            "hbase.rootdir": f"file://{self.dir}/root",
            "hbase.tmp.dir": str(self.dir / "tmp"),
            "hbase.zookeeper.quorum": "127.0.0.1",
            "hbase.zookeeper.property.clientPort": str(self.zk_port),
            "hbase.master.port": str(self.master_port),
            "hbase.master.hostname": "127.0.0.1",
            "hbase.regionserver.hostname": "127.0.0.1",
            # The master waits for every region server before it assigns regions: none
            # piles up on the first one to report.
            "hbase.master.wait.on.regionservers.mintostart": str(region_servers),
            **(site or {}),
        }
        self.region_servers = [None] * region_servers

    def log(self, name: str) -> Path:
        """The log file of one process: ``zookeeper``, ``master``, ``rs0``...,
        ``thrift``, ``thrift2``."""
        return self.dir / "logs" / f"{name}.log"

    @property
    def hbase_log(self) -> Path:
        return self.log("master")

    @property
    def thrift2_log(self) -> Path:
        return self.log("thrift2")

    def logs(self) -> dict[str, Path]:
        """Every process's log file, by process."""
        names = ["zookeeper", "master", *(f"rs{i}" for i in range(len(self.region_servers))),
                 "thrift", "thrift2"]
        return {name: self.log(name) for name in names}

    def _write_conf(self) -> None:
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        conf = self.dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "hbase-site.xml").write_text(_site_xml(self.site))
        (conf / "log4j2.properties").write_text(LOG4J2)
        (conf / "zoo.cfg").write_text(_zoo_cfg(self.dir / "zk", self.zk_port, "127.0.0.1"))
        for i, port in enumerate(self.regionserver_ports):
            rs_conf = self.dir / f"conf-rs{i}"
            rs_conf.mkdir(exist_ok=True)
            (rs_conf / "hbase-site.xml").write_text(_site_xml({
                **self.site, "hbase.regionserver.port": str(port),
                "hbase.tmp.dir": str(self.dir / f"tmp-rs{i}")}))

    def start(self, timeout: float = CLUSTER_START_SECONDS) -> LocalHBaseCluster:
        self._cp = classpath()
        self._write_conf()
        deadline = time.monotonic() + timeout
        self.start_hbase(deadline - time.monotonic())
        self.start_thrift(deadline - time.monotonic())
        if self.with_thrift2:
            self.start_thrift2(deadline - time.monotonic())
        return self

    def start_hbase(self, timeout: float = CLUSTER_START_SECONDS) -> None:
        """Start ZooKeeper, the master and every region server; :meth:`wait_ready`
        waits for the regions."""
        for port in (self.zk_port, self.master_port, *self.regionserver_ports):
            if _port_taken(port):
                raise HBaseStartError(f"port {port} on 127.0.0.1 is taken (HBase's "
                                      f"ZooKeeper/master/region servers need it)")
        self.zookeeper = self._jvm(ZK_HEAP, self.log("zookeeper"),
                                   "org.apache.zookeeper.server.ZooKeeperServerMain",
                                   str(self.dir / "conf" / "zoo.cfg"))
        deadline = time.monotonic() + timeout
        while not _zk_answers(self.zk_port):
            if self.zookeeper.poll() is not None or time.monotonic() > deadline:
                raise self._failed("ZooKeeper", self.zookeeper, self.log("zookeeper"))
            time.sleep(0.2)
        self.hbase = self._jvm(MASTER_HEAP, self.log("master"),
                               "org.apache.hadoop.hbase.master.HMaster", "start")
        for i in range(len(self.region_servers)):
            self.start_region_server(i)

    def start_region_server(self, index: int) -> None:
        """Start (or restart, on its port) region server *index*; it registers with the
        master by itself (:meth:`RegionAdmin.servers` lists it once it has)."""
        port = self.regionserver_ports[index]
        if _port_taken(port):
            raise HBaseStartError(f"port {port} on 127.0.0.1 is taken (region server "
                                  f"{index} needs it)")
        self.region_servers[index] = self._jvm(
            REGIONSERVER_HEAP, self.log(f"rs{index}"),
            "org.apache.hadoop.hbase.regionserver.HRegionServer", "start",
            conf=self.dir / f"conf-rs{index}")

    def kill_region_server(self, index: int) -> None:
        """``kill -9`` region server *index* (started here, or by the launcher of an
        :meth:`attach`-ed cluster)."""
        proc = self.region_servers[index]
        if proc is None and f"rs{index}" in self._pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pids.pop(f"rs{index}"), signal.SIGKILL)
            # Not our child to reap: returned once its port is free for a restart.
            deadline = time.monotonic() + 30
            while _port_taken(self.regionserver_ports[index]) and time.monotonic() < deadline:
                time.sleep(0.05)
        kill(proc)

    def record_pids(self) -> None:
        """Write every running JVM's pid to ``DIR/pids.json`` (:meth:`attach` reads it)."""
        procs = {"zookeeper": self.zookeeper, "master": self.hbase, "thrift": self.thrift,
                 "thrift2": self.thrift2,
                 **{f"rs{i}": p for i, p in enumerate(self.region_servers)}}
        pids = {**self._pids, **{name: p.pid for name, p in procs.items()
                                 if p is not None and p.poll() is None}}
        (self.dir / "pids.json").write_text(json.dumps(pids))

    @classmethod
    def attach(cls, data_dir: str | Path) -> LocalHBaseCluster:
        """The cluster a ``scripts/hbase --region-servers N --dir DIR`` runs already
        (``PERCOLATOR_HBASE_CLUSTER=DIR`` for the multi-server tests: no start of its
        own). Region servers it restarts outlive this process."""
        directory = Path(data_dir)
        ports = json.loads((directory / "cluster.json").read_text())
        cluster = cls(directory, region_servers=len(ports["regionservers"]))
        cluster._detached = True
        cluster._own_dir = False
        with contextlib.suppress(OSError):
            cluster._pids = json.loads((directory / "pids.json").read_text())
        cluster._cp = classpath()
        return cluster

    def wait_ready(self, timeout: float = CLUSTER_START_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while not self.answers():
            for what, proc in (("ZooKeeper", self.zookeeper), ("the master", self.hbase),
                               ("the Thrift server", self.thrift)):
                if proc is None or proc.poll() is not None:
                    name = {"ZooKeeper": "zookeeper", "the master": "master"}.get(what, "thrift")
                    if proc is None:
                        raise HBaseStartError(f"{what} is not running")
                    raise self._failed(what, proc, self.log(name))
            if time.monotonic() > deadline:
                raise HBaseStartError(
                    f"the Thrift server (or HBase behind it) did not answer in {timeout:.0f} s;"
                    f" last lines of {self.log('master')}:\n{tail(self.log('master'))}")
            time.sleep(0.3)

    def kill_hbase(self) -> None:
        """``kill -9`` every HBase JVM but the Thrift servers."""
        for proc in self.region_servers:
            kill(proc)
        kill(self.hbase)
        kill(self.zookeeper)

    def admin(self) -> RegionAdmin:
        """The region administrator of this cluster (one JVM, started on first use)."""
        if self._admin is None or not self._admin.alive():
            self._admin = RegionAdmin(self, CLUSTER_START_SECONDS)
        return self._admin

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
        if self._pids:  # attached: restarted region servers are left running
            self.record_pids()
            return
        kill(self.thrift2)
        kill(self.thrift)
        self.kill_hbase()
        super().stop()

    def __enter__(self) -> LocalHBaseCluster:
        return self.start()


ADMIN_SOURCE = ROOT / "deploy" / "hbase" / "RegionAdmin.java"


def admin_classes() -> Path:
    """The directory of ``RegionAdmin.class``, compiled from
    ``deploy/hbase/RegionAdmin.java`` with javac against HBase's class path once and
    cached under :data:`CACHE` (keyed by the source and the class path)."""
    cp = classpath()
    key = hashlib.sha256(ADMIN_SOURCE.read_bytes() + cp.encode()).hexdigest()[:16]
    out = CACHE / f"admin-{key}"
    if (out / "RegionAdmin.class").exists():
        return out
    javac = shutil.which("javac")
    if javac is None:
        raise HBaseStartError("javac is not installed (it compiles the region "
                              "administrator): apt-get install openjdk-17-jdk-headless")
    partial = CACHE / f"admin-{key}.{os.getpid()}.tmp"
    partial.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([javac, "-nowarn", "-cp", cp, "-d", str(partial), str(ADMIN_SOURCE)],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if result.returncode != 0:
        raise HBaseStartError(f"javac could not compile {ADMIN_SOURCE}:\n{result.stderr[-2000:]}")
    with contextlib.suppress(OSError):  # a concurrent compiler won: its classes are the same
        partial.rename(out)
    shutil.rmtree(partial, ignore_errors=True)
    return out


class RegionAdminError(RuntimeError):
    """HBase refused or failed an administrative command; the message is HBase's."""


class Region:
    """One region as :meth:`RegionAdmin.regions` lists it."""

    def __init__(self, table: str, encoded: str, start_key: str, server: str) -> None:
        self.table, self.encoded, self.start_key, self.server = table, encoded, start_key, server

    @property
    def port(self) -> int:
        """The port of the region server holding it (``-1`` if none does)."""
        return int(self.server.split(",")[1]) if self.server != "-" else -1

    def __repr__(self) -> str:
        return f"Region({self.table} {self.start_key!r} {self.encoded} on {self.server})"


class RegionAdmin:
    """``deploy/hbase/RegionAdmin.java`` running against *cluster*: HBase's own Admin
    API (move, split, the servers and their regions) from Python, one command at a
    time over the JVM's stdin and stdout."""

    def __init__(self, cluster: LocalHBase, timeout: float = START_SECONDS) -> None:
        command = [
            java(), "-Xmx256m", "-Djava.net.preferIPv4Stack=true", *JDK17_FLAGS,
            *jvm_options(), f"-Dhbase.log.file={cluster.dir / 'logs' / 'admin.log'}",
            f"-Dlog4j.configurationFile=file:{cluster.dir}/conf/log4j2.properties",
            "-cp", os.pathsep.join([str(cluster.dir / "conf"), str(admin_classes()),
                                    classpath()]),
            "RegionAdmin",
        ]
        argv, options = _spawned(command)
        self._proc: subprocess.Popen[str] = subprocess.Popen(
            argv, cwd=cluster.dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, **options)
        self._lock = threading.Lock()
        # Its JVM connects to the cluster before it says "ready": under load that took
        # minutes; a JVM that never says it fails here, with its log, not in a hang.
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        if not ready:
            kill(self._proc)  # type: ignore[arg-type]
            log = cluster.dir / "logs" / "admin.log"
            raise HBaseStartError(f"the region administrator did not start in {timeout:.0f} s;"
                                  f" last lines of {log}:\n{tail(log)}")
        first = self._readline()
        if first != "ready":
            raise HBaseStartError(f"the region administrator did not start: {first!r}")

    def alive(self) -> bool:
        return self._proc.poll() is None

    def _readline(self) -> str:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RegionAdminError(f"the region administrator exited ({self._proc.poll()})")
        return line.rstrip("\n")

    def command(self, *words: str) -> list[str]:
        """Run one command (RegionAdmin.java's list); its output lines."""
        with self._lock:
            assert self._proc.stdin is not None
            self._proc.stdin.write(" ".join(words) + "\n")
            self._proc.stdin.flush()
            head = self._readline()
            if head.startswith("err "):
                raise RegionAdminError(f"{' '.join(words)}: {head[4:]}")
            return [self._readline() for _ in range(int(head.split()[1]))]

    def servers(self) -> list[str]:
        """The live region servers, ``host,port,startcode`` each."""
        return self.command("servers")

    def regions(self, table_regex: str) -> list[Region]:
        """The online regions of the tables whose names match *table_regex*."""
        return [Region(*line.split("\t")) for line in self.command("regions", table_regex)]

    def move(self, region: Region, server: str) -> None:
        """Move *region* to *server*; returns once it is open there."""
        self.command("move", region.encoded, server)

    def split(self, table: str, key: str) -> None:
        """Split *table*'s region holding *key* at *key*; returns once both halves are
        online."""
        self.command("split", table, key)

    def balancer(self, on: bool) -> None:
        self.command("balancer", "on" if on else "off")

    def wait_assigned(self, seconds: int = 300) -> None:
        """Wait until no region is in transition."""
        self.command("wait-assigned", str(seconds))

    def close(self) -> None:
        kill(self._proc)  # type: ignore[arg-type]


def kill(proc: subprocess.Popen[bytes] | None) -> None:
    """Kill *proc* if it still runs, and reap it."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def _meta_get_answers(port: int, thrift_args: Sequence[str]) -> bool:
    """Whether the Thrift1 server on *port* answers ``getRow("hbase:meta", "-")`` (which
    needs the master, a region server and the meta region), spoken by hand: the
    launcher runs without happybase too (buffered transport, binary protocol only)."""
    if "-f" in thrift_args or "-hsha" in thrift_args or "-c" in thrift_args:
        return False  # framed or compact: only happybase speaks them here

    def string(value: bytes) -> bytes:
        return len(value).to_bytes(4, "big") + value

    call = (b"\x80\x01\x00\x01" + string(b"getRow") + (1).to_bytes(4, "big")
            + b"\x0b\x00\x01" + string(b"hbase:meta")       # 1: tableName
            + b"\x0b\x00\x02" + string(b"-")                # 2: row (not empty)
            + b"\x0d\x00\x03\x0b\x0b" + (0).to_bytes(4, "big")  # 3: attributes, empty
            + b"\x00")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(call)
            reply = b""
            while len(reply) < 64:
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
                name_end = 8 + int.from_bytes(reply[4:8], "big") if len(reply) >= 8 else 0
                if name_end and len(reply) >= name_end + 7:
                    break
    except OSError:
        return False
    if len(reply) < 8 or reply[3] != 2:  # not a REPLY (an EXCEPTION or nothing)
        return False
    name_end = 8 + int.from_bytes(reply[4:8], "big")
    field = reply[name_end + 4:name_end + 7]  # after the sequence id: type, field id
    return len(field) == 3 and field[1:] == b"\x00\x00"  # field 0: success, 1: IOError


def _zk_answers(port: int) -> bool:
    """Whether a ZooKeeper serves on *port* (the ``ruok`` four-letter word is not
    whitelisted by HBase's MiniZooKeeperCluster; ``srvr`` is)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"srvr")
            return s.recv(64).startswith(b"Zookeeper")
    except OSError:
        return False


ROLES = ("zookeeper", "master", "regionserver", "thrift")


def run_role(role: str, data_dir: Path, zookeeper: str, hostname: str, port: int,
             bind: str, thrift_port: int, thrift2_port: int | None,
             thrift_args: Sequence[str]) -> int:
    """One process of a multi-server HBase whose others run elsewhere (a container of
    ``docker-compose.yml`` each): the settings of ``deploy/hbase/cluster-site.xml``
    plus this one's address, ZooKeeper's and the root directory (*data_dir*/root, a
    volume every HBase container mounts). The JVM runs in the foreground; ``thrift``
    runs the Thrift1 server and, with *thrift2_port*, the Thrift2 server, and exits
    when either does."""
    zk_host, _, zk_port = zookeeper.rpartition(":")
    site = {
        **read_site(),
        "hbase.rootdir": f"file://{data_dir}/root",
        "hbase.tmp.dir": str(data_dir / f"tmp-{hostname}"),
        "hbase.zookeeper.quorum": zk_host,
        "hbase.zookeeper.property.clientPort": zk_port,
        "hbase.master.hostname": hostname if role == "master" else "",
        "hbase.regionserver.hostname": hostname if role == "regionserver" else "",
        "hbase.master.port": str(port) if role == "master" else "16000",
        "hbase.regionserver.port": str(port) if role == "regionserver" else "16020",
    }
    site = {k: v for k, v in site.items() if v}
    conf = data_dir / f"conf-{hostname}"
    (conf / "logs").mkdir(parents=True, exist_ok=True)
    (conf / "hbase-site.xml").write_text(_site_xml(site))
    (conf / "log4j2.properties").write_text(LOG4J2.replace(
        "appender.file.type = File", "appender.file.type = Console").replace(
        "appender.file.fileName = ${sys:hbase.log.file}\n", ""))
    (conf / "zoo.cfg").write_text(_zoo_cfg(data_dir / "zk", port, bind))
    cp = f"{conf}{os.pathsep}{classpath()}"
    jvm = [java(), "-XX:+UseG1GC", "-Djava.net.preferIPv4Stack=true", *JDK17_FLAGS,
           f"-Dlog4j.configurationFile=file:{conf}/log4j2.properties", "-cp", cp]
    mains = {
        "zookeeper": [ZK_HEAP, "org.apache.zookeeper.server.ZooKeeperServerMain",
                      str(conf / "zoo.cfg")],
        "master": [MASTER_HEAP, "org.apache.hadoop.hbase.master.HMaster", "start"],
        "regionserver": [REGIONSERVER_HEAP,
                         "org.apache.hadoop.hbase.regionserver.HRegionServer", "start"],
    }
    if role in mains:
        heap, *rest = mains[role]
        os.execv(jvm[0], [jvm[0], heap, *jvm[1:], *rest])
    servers = [("org.apache.hadoop.hbase.thrift.ThriftServer", thrift_port)]
    if thrift2_port:
        servers.append(("org.apache.hadoop.hbase.thrift2.ThriftServer", thrift2_port))
    spawned = [_spawned([jvm[0], THRIFT_HEAP, *jvm[1:], main, "-b", bind, "-p", str(p),
                         *thrift_args, "start"]) for main, p in servers]
    procs = [subprocess.Popen(argv, **options) for argv, options in spawned]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while all(proc.poll() is None for proc in procs):
            time.sleep(1)
    finally:
        for proc in procs:
            kill(proc)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/hbase``: start one, print where, run until interrupted or until one of
    its JVMs dies (then stop the others, say which died and where it logged, exit 1)."""
    import argparse

    parser = argparse.ArgumentParser(prog="scripts/hbase", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="data directory (kept, with its ports: start again "
                        "with the same --dir for the same data and addresses); default: a "
                        "temporary one, removed at exit")
    parser.add_argument("--region-servers", type=int, default=0, metavar="N",
                        help="a multi-server HBase: ZooKeeper, an HMaster and N "
                        "HRegionServers, each its own JVM (default: standalone, one JVM)")
    parser.add_argument("--thrift2", action="store_true",
                        help="start the Thrift2 server (the default; kept for old scripts)")
    parser.add_argument("--no-thrift2", dest="no_thrift2", action="store_true",
                        help="start no Thrift2 server (the store's api=thrift2 needs one)")
    parser.add_argument("--bind", default="127.0.0.1",
                        help="address the Thrift servers listen on (0.0.0.0 in a container)")
    parser.add_argument("--thrift-port", type=int, help="Thrift1 port (default: the one "
                        "--dir used last, else a free one)")
    parser.add_argument("--thrift2-port", type=int, help="Thrift2 port (default: as "
                        "--thrift-port)")
    parser.add_argument("--admin", metavar="COMMAND",
                        help="run one region-administration command against the "
                        "multi-server HBase running in --dir and exit: 'servers', "
                        "'regions REGEX', 'move ENCODED host,port,startcode', "
                        "'split TABLE KEY', 'balancer on|off' (deploy/hbase/RegionAdmin.java)")
    parser.add_argument("--role", choices=ROLES,
                        help="run one process of a multi-server HBase whose others run "
                        "elsewhere (docker-compose.yml), in the foreground, with "
                        "deploy/hbase/cluster-site.xml's settings; needs --dir (a volume "
                        "shared by the HBase processes), --zookeeper, --hostname")
    parser.add_argument("--zookeeper", default="zookeeper:2181",
                        help="with --role: ZooKeeper's host:port")
    parser.add_argument("--hostname", default="localhost",
                        help="with --role: the name other processes reach this one by")
    parser.add_argument("--port", type=int, default=0,
                        help="with --role: the master's (16000), a region server's "
                        "(16020) or ZooKeeper's (2181) port")
    parser.add_argument("thrift_args", nargs="*",
                        help="extra Thrift server arguments after --, e.g. -- -f -c")
    args = parser.parse_args(argv)
    if args.role:
        if not args.dir:
            parser.error("--role needs --dir (the volume the HBase processes share)")
        default_port = {"zookeeper": 2181, "master": 16000, "regionserver": 16020}
        return run_role(args.role, Path(args.dir), args.zookeeper, args.hostname,
                        args.port or default_port.get(args.role, 0), args.bind,
                        args.thrift_port or 9090,
                        (args.thrift2_port or 9091) if args.thrift2 else None,
                        args.thrift_args)
    if args.admin:
        if not args.dir or not (Path(args.dir) / "cluster.json").exists():
            parser.error("--admin needs the --dir of a running "
                         "scripts/hbase --region-servers N")
        try:
            admin = RegionAdmin(LocalHBaseCluster.attach(args.dir))
            print("\n".join(admin.command(*args.admin.split())))
        except (HBaseStartError, RegionAdminError) as e:
            print(f"scripts/hbase: {e}", file=sys.stderr)
            return 1
        admin.close()
        return 0
    started = time.monotonic()
    hbase: LocalHBase
    try:
        if args.region_servers > 0:
            hbase = LocalHBaseCluster(
                args.dir, region_servers=args.region_servers, thrift_args=args.thrift_args,
                bind=args.bind, thrift_port=args.thrift_port, thrift2_port=args.thrift2_port,
                thrift2=not args.no_thrift2)
        else:
            saved = Path(args.dir) / "thrift.json" if args.dir else None
            ports = json.loads(saved.read_text()) if saved and saved.exists() else {}
            hbase = LocalHBase(args.dir, thrift_args=args.thrift_args, bind=args.bind,
                               thrift_port=args.thrift_port or ports.get("thrift"),
                               thrift2_port=args.thrift2_port or ports.get("thrift2"),
                               thrift2=not args.no_thrift2,
                               site={LOCAL_SESSION: str(STANDALONE_SESSION_MS)})
            if saved:
                saved.parent.mkdir(parents=True, exist_ok=True)
                saved.write_text(json.dumps({"thrift": hbase.thrift_port,
                                             "thrift2": hbase.thrift2_port}))
        hbase.start()
    except HBaseStartError as e:
        print(f"scripts/hbase: {e}", file=sys.stderr)
        with contextlib.suppress(UnboundLocalError):
            hbase.stop()
        return 1
    kept = ("kept" if args.dir else "removed at exit: --dir DIR keeps it")
    print(f"HBase {hbase.dir} ready in {time.monotonic() - started:.1f} s (data {kept})",
          flush=True)
    processes: dict[str, subprocess.Popen[bytes] | None]
    if isinstance(hbase, LocalHBaseCluster):
        processes = {"zookeeper": hbase.zookeeper, "master": hbase.hbase,
                     **{f"rs{i}": p for i, p in enumerate(hbase.region_servers)},
                     "thrift": hbase.thrift, "thrift2": hbase.thrift2}
        logs = hbase.logs()
        print(f"ZooKeeper 127.0.0.1:{hbase.zk_port}; conf {hbase.dir / 'conf'}", flush=True)
    else:
        processes = {"hbase": hbase.hbase, "thrift": hbase.thrift, "thrift2": hbase.thrift2}
        logs = {"hbase": hbase.hbase_log, "thrift": hbase.thrift_log,
                "thrift2": hbase.thrift2_log}
    for name, proc in processes.items():
        if proc is not None:
            print(f"  {name:9} pid {proc.pid:<7} logs {logs[name]}", flush=True)
    if isinstance(hbase, LocalHBaseCluster):
        hbase.record_pids()
    print(f"PERCOLATOR_HBASE_THRIFT={hbase.hostport}", flush=True)
    if hbase.thrift2 is not None:
        print(f"PERCOLATOR_HBASE_THRIFT2={hbase.hostport2}", flush=True)
        print(f"store URL: hbase://{hbase.hostport2}?api=thrift2", flush=True)
    died = ""
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while not died:
            time.sleep(1)
            for name, proc in list(processes.items()):
                if proc is None or proc.poll() is None:
                    continue
                if name.startswith("rs"):  # the cluster outlives a region server
                    print(f"scripts/hbase: region server {name} exited with "
                          f"{proc.returncode} (its regions reopen on the others); log: "
                          f"{logs[name]}", file=sys.stderr, flush=True)
                    del processes[name]
                else:
                    died = name
    hbase.stop()
    if died:
        proc = processes[died]
        assert proc is not None
        print(f"scripts/hbase: {died} exited with {proc.returncode}; stopped the others. "
              f"Its log: {logs[died]} (last lines below)\n{tail(logs[died], 15)}",
              file=sys.stderr)
        if args.dir:
            print(f"Start it again on the same data and ports: scripts/hbase --dir {args.dir}"
                  + (f" --region-servers {args.region_servers}" if args.region_servers else ""),
                  file=sys.stderr)
        else:
            print("Its data was in a temporary directory, now removed (--dir DIR keeps it).",
                  file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
