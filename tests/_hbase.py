"""HBase's Thrift1 server for the suite: a real HBase, or the in-repo test server.

``hbase_thrift`` (session scope) yields ``"host:port"`` of a real HBase's Thrift1
server: ``PERCOLATOR_HBASE_THRIFT`` if set (an HBase of your own, e.g. from ``docker
compose up``), otherwise a standalone HBase 2.6 started by ``tests/_hbase_local.py``
the first time a test asks for it (once per session, ~30 s) and killed at the end of
the session. Under pytest-xdist the workers of a run share one such HBase, started by
the first that needs it (``tests._services.shared_service``; CONTRIBUTING.md, "Test
suite time"). A failure to obtain or start it (Java, Maven, a port, the JVM's log)
fails the run in CI and skips the test elsewhere, with that reason.
``PERCOLATOR_HBASE_THRIFT=test-server`` runs the same tests against the Python test
server of ``tests/hbase_thrift_server`` instead (no Java needed; the fault tests and
``test_thrift_server.py``, which holds the test server to HBase's behaviour, use it
anyway). ``hbase_store_url(hostport, name)`` gives a store URL isolated from every
other test (its own table prefix), so tests never assume an empty server. Missing
happybase/thriftpy2 fails in CI and skips elsewhere. ``PERCOLATOR_HBASE_THRIFT2`` names
the Thrift2 server of an HBase of your own (the ``hbase`` backend's), and
``PERCOLATOR_HBASE_CONF`` its conf directory, from which the TLS tests start a Thrift2
server over HTTPS on it (``tests/hbase/test_hbase_thrift2_tls.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from tests._hbase_local import LOCAL_SESSION
from tests._services import (
    free_port,
    service_missing,
    shared_service,
    stop_process,
    xdist_worker,
)

if TYPE_CHECKING:
    from tests._hbase_local import LocalHBase

ENV = "PERCOLATOR_HBASE_THRIFT"
STARTUP_SECONDS = 30.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def require_hbase_client() -> None:
    """Fail in CI, skip elsewhere, if the Thrift client libraries are missing."""
    try:
        import happybase  # noqa: F401
        import thriftpy2  # noqa: F401
    except ImportError:
        service_missing(
            "happybase/thriftpy2 are not installed: pip install 'percolator-txn[hbase]' thriftpy2"
        )


def _answers(hostport: str, transport: str = "buffered", protocol: str = "binary") -> bool:
    """Whether a Thrift1 server at *hostport* answers ``getTableNames`` (within 10 s: a
    shared HBase with hundreds of tables took over 2 s at a load of 26, and every hbase
    test of the session skipped)."""
    import happybase

    host, _, port = hostport.rpartition(":")
    connection = happybase.Connection(
        host, int(port), timeout=10_000, autoconnect=False, transport=transport,
        protocol=protocol,
    )
    try:
        connection.open()
        connection.tables()
        return True
    except Exception:
        return False
    finally:
        connection.close()




def start_test_server(
    *namespaces: str, options: Sequence[str] = (), transport: str = "buffered",
    protocol: str = "binary",
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``python -m tests.hbase_thrift_server`` on a free port with *namespaces*
    and its command-line *options* (faults: see ``tests/hbase_thrift_server/server.py``),
    speaking *transport* and *protocol*.

    Returns the process and ``host:port``; the caller kills the process (an atexit
    hook does so as a last resort).
    """
    require_hbase_client()
    port = free_port()
    args = [sys.executable, "-m", "tests.hbase_thrift_server", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--transport", transport, "--protocol", protocol]
    for ns in namespaces:
        args += ["--namespace", ns]
    args += list(options)
    hostport = f"127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:  # the server's output, quoted if it dies
        proc = subprocess.Popen(
            args, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        atexit.register(stop_process, proc)
        deadline = time.monotonic() + STARTUP_SECONDS
        while not _answers(hostport, transport, protocol):
            if proc.poll() is not None:
                log.seek(0)
                output = log.read().decode(errors="replace")
                pytest.fail(f"the HBase test server exited with {proc.returncode}: {output}")
            if time.monotonic() > deadline:
                stop_process(proc)
                pytest.fail(f"the HBase test server did not answer on {hostport} in time")
            time.sleep(0.05)
    return proc, hostport


TEST_SERVER = "test-server"
"""The value of ``PERCOLATOR_HBASE_THRIFT`` that picks the Python test server."""
SESSION_SITE = {"zookeeper.session.timeout": "120000", LOCAL_SESSION: "120000"}
"""The session's HBase (never killed: the fault tests start their own) keeps its
ZooKeeper sessions for 2 minutes: its master's and region server's
(``zookeeper.session.timeout.localHBaseCluster``, HBase's 10 s by default in a standalone
HBase, whatever ``zookeeper.session.timeout`` says) and its Thrift servers'. At load
24-60 on 2 cores the JVM paused for 8 s and more, the master's session expired, and the
master aborted (2026-11-28 and 29). A killed HBase would wait that long for its old
master's session on restart, so the fault tests' HBases keep HBase's 10 s."""
_SESSION_HBASE: list[LocalHBase] = []
"""The standalone HBase of this session, once started (:func:`local_hbase`)."""


@pytest.fixture(scope="session")
def hbase_thrift() -> Iterator[str]:
    """``host:port`` of a real HBase's Thrift1 server for the whole session (or of the
    test server with ``PERCOLATOR_HBASE_THRIFT=test-server``)."""
    require_hbase_client()
    chosen = os.environ.get(ENV)
    if chosen == TEST_SERVER:
        yield from _test_server_for_session()
        return
    if chosen:
        if not _answers(chosen):
            service_missing(f"{ENV}={chosen} is set but no HBase Thrift1 server answers there")
        yield chosen
        return
    from tests._hbase_local import LocalHBase

    if xdist_worker():  # one HBase for all the workers of the run
        hbase = LocalHBase.attached(shared_service("hbase", _start_shared))
        _SESSION_HBASE.append(hbase)
        yield hbase.hostport
        return
    hbase = _start(LocalHBase(site=SESSION_SITE))
    _SESSION_HBASE.append(hbase)
    try:
        yield hbase.hostport
    finally:
        _SESSION_HBASE.remove(hbase)
        hbase.stop()


def _start(hbase: LocalHBase) -> LocalHBase:
    from tests._hbase_local import HBaseStartError

    try:
        return hbase.start()
    except HBaseStartError as e:
        hbase.stop()
        service_missing(f"could not start a standalone HBase: {e}")


def _start_shared() -> dict[str, Any]:
    from tests._hbase_local import LocalHBase

    return _start(LocalHBase(detached=True, site=SESSION_SITE)).describe()


@pytest.fixture(scope="session")
def local_hbase(hbase_thrift: str) -> LocalHBase:
    """The standalone HBase this session started (its launcher: data directory, JVMs),
    for what needs more than its Thrift address (Omid's client speaks HBase's native
    RPC and finds it through its ``hbase-site.xml``)."""
    for hbase in _SESSION_HBASE:
        if hbase.hostport == hbase_thrift:
            return hbase
    pytest.skip(f"{ENV} names another HBase: this test needs the standalone HBase the "
                "suite starts itself (its ZooKeeper and native RPC)")


@pytest.fixture(scope="session")
def hbase_thrift2(hbase_thrift: str) -> str:
    """``host:port`` of the session HBase's Thrift2 server (the ``hbase`` backend's
    ``api=thrift2``, the Thrift1 store's ``thrift2=`` option), which the suite's HBase
    starts with the rest; with ``PERCOLATOR_HBASE_THRIFT`` naming another HBase,
    ``PERCOLATOR_HBASE_THRIFT2`` names its Thrift2 server."""
    from tests._hbase_local import HBaseStartError

    for hbase in _SESSION_HBASE:
        if hbase.hostport == hbase_thrift:
            try:
                hbase.start_thrift2()
            except HBaseStartError as e:
                service_missing(f"could not start HBase's Thrift2 server: {e}")
            return hbase.hostport2
    chosen = os.environ.get(ENV + "2")
    if not chosen:
        pytest.skip(f"{ENV} names another HBase and {ENV}2 names no Thrift2 server for it "
                    "(the Python test server has none)")
    return chosen


@pytest.fixture(scope="session")
def hbase_test_server() -> Iterator[str]:
    """``host:port`` of the Python test server (with the ``percolator_test``
    namespace), for the tests that hold it to HBase's behaviour."""
    yield from _test_server_for_session()


def _test_server_for_session() -> Iterator[str]:
    proc, hostport = start_test_server("percolator_test")
    try:
        yield hostport
    finally:
        stop_process(proc)


FAULTS = (
    # Lock-cell compare-and-sets (LOCKED, COMMITTED, FREE, ROLLED_BACK values): one in
    # five applied and answered False, one in seven applied and its connection dropped.
    "--fault", "cas-replay:prefix=4c,43,46,52:every=5",
    "--fault", "cas-drop:prefix=4c,43,46,52:every=7",
    # Two servers behind a round-robin proxy; connections idle for 2 s closed (the
    # store keeps them 1 s at most: FAULTY_OPTIONS); scanners forgotten after 1 s unused.
    "--servers", "2", "--idle-timeout", "2", "--scanner-expiry", "1",
)
"""The faults of the ``hbase-faults`` backend (``tests/_backends.py``)."""
FAULTY_OPTIONS = "&idle_timeout=1"


@pytest.fixture(scope="session")
def hbase_faulty_thrift() -> Iterator[str]:
    """``host:port`` of a test server playing :data:`FAULTS`, for the whole session."""
    proc, hostport = start_test_server(options=FAULTS)
    try:
        yield hostport
    finally:
        stop_process(proc)


def is_real_hbase() -> bool:
    """Whether ``hbase_thrift`` is a real HBase (the default) rather than the test server."""
    return os.environ.get(ENV) != TEST_SERVER


def unique_name(name: str) -> str:
    """A table-name-safe version of *name* with a random suffix."""
    slug = re.sub(r"[^a-zA-Z0-9]+", "_", name).strip("_")[:24] or "t"
    return f"{slug}_{uuid.uuid4().hex[:8]}"


def hbase_store_url(hostport: str, unique_name_: str, api: str = "thrift1") -> str:
    """An ``hbase://`` URL on *hostport* (a Thrift1 server, or a Thrift2 one with
    *api* ``thrift2``) whose tables no other test sees: the table prefix is derived
    from *unique_name_* plus a random suffix."""
    url = f"hbase://{hostport}?table_prefix={unique_name(unique_name_)}&pool_size=4"
    return url + ("&api=thrift2" if api == "thrift2" else "")


@contextlib.contextmanager
def faulty_server(
    *options: str, transport: str = "buffered", protocol: str = "binary"
) -> Iterator[str]:
    """A test server of its own started with the command-line *options* (its faults),
    for the duration of the ``with``; yields ``host:port``."""
    proc, hostport = start_test_server(options=options, transport=transport, protocol=protocol)
    try:
        yield hostport
    finally:
        stop_process(proc)


@contextlib.contextmanager
def hbase_for_bench(kind: str = "hbase") -> Iterator[str]:
    """``host:port`` of a Thrift1 server for a benchmark, for the duration of the
    ``with``: *kind* ``"hbase"`` is ``PERCOLATOR_HBASE_THRIFT`` if set, otherwise a
    standalone HBase of its own (``tests/_hbase_local.py``); ``"test-server"`` is the
    Python test server."""
    if kind == TEST_SERVER:
        proc, hostport = start_test_server()
        try:
            yield hostport
        finally:
            stop_process(proc)
        return
    if kind != "hbase":
        raise ValueError(f"kind must be 'hbase' or {TEST_SERVER!r}, got {kind!r}")
    chosen = os.environ.get(ENV)
    if chosen and chosen != TEST_SERVER:
        yield chosen
        return
    with hbase_servers_for_bench() as (thrift1, _):
        yield thrift1


@contextlib.contextmanager
def hbase_servers_for_bench() -> Iterator[tuple[str, str]]:
    """``(Thrift1, Thrift2)`` ``host:port`` of one real HBase for a benchmark:
    ``PERCOLATOR_HBASE_THRIFT`` and ``PERCOLATOR_HBASE_THRIFT2`` if set, otherwise a
    standalone HBase of its own with both servers, fully JIT-compiled (the test
    suite's JVM options are the suite's: ``PERCOLATOR_JVM_OPTS`` is unset here)."""
    chosen = os.environ.get(ENV)
    if chosen and chosen != TEST_SERVER:
        thrift2 = os.environ.get(ENV + "2")
        if not thrift2:
            raise SystemExit(f"{ENV}={chosen} is set: set {ENV}2 to its "
                             "HBase's Thrift2 server too")
        yield chosen, thrift2
        return
    from tests._hbase_local import LocalHBase

    with LocalHBase() as hbase:
        yield hbase.hostport, hbase.hostport2
