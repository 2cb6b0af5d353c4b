"""Backend parametrization: one test body, run over every store backend.

``store_url`` gives a fresh, isolated repository URL on the backend of the current
parameter (sqlite: a new file; hbase: a real HBase through its Thrift2 server, the
store's ``api=thrift2``; hbase-thrift1: the same HBase through its Thrift1 server, as
happybase speaks it; bigtable: the cbtemulator), and ``cluster`` a connected
:class:`percolator.Cluster` on it, holding the tables ``cluster_tables`` names.
``PERCOLATOR_HBASE_THRIFT`` and ``PERCOLATOR_HBASE_THRIFT2`` name an HBase of your own
(``tests/_hbase.py``).

These are the only ``store_url`` and ``cluster`` fixtures; a module chooses among them
without writing its own:

- its backends: every one by default (``BACKENDS``); another list of this file
  (``SQLITE_AND_BIGTABLE``, ``WITH_THRIFT1``, ``WITH_FAULTS``, plus ``CAS_SQLITE``: the
  embedded store taking HBase's commit path) or a single backend with
  ``backend = backend_fixture(WITH_FAULTS)`` or ``backend = backend_fixture("sqlite")``
  in the module (a single backend is not a parameter: its tests' ids stay bare);
- its tables: by overriding ``cluster_tables``.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator._internals import internals
from percolator._store import Store

SQLITE = pytest.param("sqlite", id="sqlite")
HBASE = pytest.param("hbase", id="hbase", marks=pytest.mark.hbase)
BIGTABLE = pytest.param("bigtable", id="bigtable", marks=pytest.mark.bigtable)
BACKENDS = [SQLITE, HBASE, BIGTABLE]
SQLITE_AND_BIGTABLE = [SQLITE, BIGTABLE]
"""The embedded store and the Bigtable emulator, without HBase: for workloads of processes
killed and restarted, or of thousands of commits, whose table DDL and round trips
would take minutes on HBase. Bigtable is the store that finds notifications through
the index (``percolator/_notify_index.py``), SQLite the one that scans for them."""
HBASE_THRIFT1 = pytest.param("hbase-thrift1", id="hbase-thrift1", marks=pytest.mark.hbase)
"""The Thrift1 lane (happybase, for gateways that speak only Thrift1): the store
contract, the transaction tests and the fault tests run on it too (``WITH_THRIFT1``)."""
WITH_THRIFT1 = [*BACKENDS, HBASE_THRIFT1]
CAS_SQLITE = pytest.param("cas-sqlite", id="cas-sqlite")
"""The embedded store declaring neither its atomic steps nor its file (``ATOMICALLY``,
``EMBEDDED_FILE``), as HBase: no lock census, and a transaction's reads keep what its
two-phase prewrite would read, which then locks by compare-and-set from it
(``Snapshot._read_state``, ``TwoPhaseCommit._checked_before_locking``). The protocol's
races run on it too (``tests/transactions/test_interleavings.py``): that path is
otherwise HBase's alone, which ``scripts/mutation`` (the embedded store only) cannot
reach."""
WITH_FAULTS = [
    *BACKENDS,
    pytest.param("hbase-faults", id="hbase-faults", marks=pytest.mark.hbase),
]
"""Every backend, and HBase misbehaving as a real cluster does (``tests/_hbase.py``
``FAULTS``): for the workloads that must survive it (a module's own ``backend``
fixture takes these params)."""


def reports_split_keys(backend: str) -> bool:
    """Whether a new table of *backend* reports cut points once it holds a few hundred
    rows: the Bigtable emulator's samples and the HBase test server's regions (one per
    100 rows) do; SQLite does not, nor does a real HBase, which keeps a new table in
    one region until it grows to 10 GB (Thrift1 cannot create a pre-split table)."""
    from tests._hbase import is_real_hbase

    return backend in ("bigtable", "hbase-faults") or (
        backend in ("hbase", "hbase-thrift1") and not is_real_hbase())


def make_store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9]+", "_", request.node.name)[:30]
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/repo.db"
    if backend == "cas-sqlite":
        from percolator._store import ATOMICALLY, EMBEDDED_FILE
        from percolator.stores.sqlite import SqliteStore

        # Every embedded store the test opens (each client's) declares neither.
        request.getfixturevalue("monkeypatch").setattr(
            SqliteStore, "capabilities", SqliteStore.capabilities - {ATOMICALLY, EMBEDDED_FILE})
        return f"sqlite:///{tmp_path}/repo.db"
    if backend == "hbase":
        from tests._hbase import hbase_store_url

        return hbase_store_url(request.getfixturevalue("hbase_thrift2"), name, api="thrift2")
    if backend == "hbase-thrift1":
        from tests._hbase import hbase_store_url

        return hbase_store_url(request.getfixturevalue("hbase_thrift"), name)
    if backend == "hbase-faults":
        from tests._hbase import FAULTY_OPTIONS, hbase_store_url

        hostport = request.getfixturevalue("hbase_faulty_thrift")
        return hbase_store_url(hostport, name) + FAULTY_OPTIONS
    if backend == "bigtable":
        from tests._bigtable import bigtable_store_url

        return bigtable_store_url(request.getfixturevalue("bigtable_emulator"), name)
    raise AssertionError(backend)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def backend_fixture(backends: str | list[Any]) -> Any:
    """A module's own ``backend`` fixture (assign it to the name ``backend``): over a
    list of parameters (``SQLITE_AND_BIGTABLE``, ``WITH_FAULTS``, ...), or the one
    backend named, unparametrized."""
    if isinstance(backends, str):
        name = backends

        @pytest.fixture(name="backend")
        def one_backend() -> str:
            return name

        return one_backend

    @pytest.fixture(name="backend", params=backends)
    def each_backend(request: pytest.FixtureRequest) -> str:
        return str(request.param)

    return each_backend


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return make_store_url(backend, request, tmp_path)


def drop_tables(owner: percolator.Cluster | Store) -> None:
    """A test's teardown: drop every table of *owner* (a cluster or a store). Also on
    the session's own HBase: in a run that left its tables (some 600 by the end), that
    HBase's ZooKeeper calls timed out in the last tests, which passed on a fresh HBase.
    There a drop costs 0.2-2 s (a master procedure), so the tables go to
    :data:`_BACKGROUND_DROPS` and the next test starts meanwhile: each test's tables
    have a prefix of their own, nothing reuses them."""
    if isinstance(owner, percolator.Cluster):
        tables, store = owner.tables(), internals(owner).store
    else:
        tables, store = owner.list_tables(), owner
    url = getattr(store, "url", "")
    if url.startswith("hbase://") and tables:
        _BACKGROUND_DROPS.submit(url, tables)
        return
    for table in tables:
        store.drop_table(table)


class _BackgroundDrops:
    """One thread of this test process that drops tables through a store of its own."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[str, list[str]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, url: str, tables: list[str]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="test-table-drops",
                                                daemon=True)
                self._thread.start()
        self._queue.put((url, list(tables)))

    def _run(self) -> None:
        from percolator.stores import open_store

        while True:
            url, tables = self._queue.get()
            try:
                store = open_store(url)
                try:
                    for table in tables:
                        store.drop_table(table)
                finally:
                    store.close()
            except Exception as e:  # HBase stopped at the session's end, or a test killed it
                logging.getLogger(__name__).info("could not drop %s at %s: %s", tables, url, e)


_BACKGROUND_DROPS = _BackgroundDrops()


@pytest.fixture
def cluster_tables() -> tuple[str, ...]:
    """The tables ``cluster`` creates before the test: none; a module whose tests all
    start from the same tables overrides this fixture."""
    return ()


@pytest.fixture
def cluster(store_url: str, cluster_tables: tuple[str, ...]) -> Iterator[percolator.Cluster]:
    with percolator.connect(store_url) as c:
        for table in cluster_tables:
            c.create_table(table)
        yield c
        drop_tables(c)


@pytest.fixture
def sqlite_cluster(tmp_path: Path) -> Iterator[percolator.Cluster]:
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as c:
        yield c


@pytest.fixture
def seeded_sqlite_url(tmp_path: Path) -> str:
    """A fresh embedded store with table ``t`` seeded: rows r1, r2 hold ``c:v = old``
    (the lock-resolution and coordination tests start from it)."""
    return seeded(f"sqlite:///{tmp_path}/repo.db")


@pytest.fixture
def seeded_cas_sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """``seeded_sqlite_url`` on the embedded store taking HBase's path (``CAS_SQLITE``)."""
    return seeded(make_store_url("cas-sqlite", request, tmp_path))


def seeded(url: str) -> str:
    """*url*, its table ``t`` seeded: rows r1, r2 hold ``c:v = old``."""
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"r1", "c:v", b"old")
            txn.set("t", b"r2", "c:v", b"old")
    return url
