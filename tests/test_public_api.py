"""Each package's public names: one import surface with a sorted, complete __all__,
importable without any optional dependency."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import percolator
from percolator._internals import internals


def _isort_key(name: str) -> tuple[int, str]:
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


@pytest.mark.parametrize(
    "package", ["percolator", "percolator.ext", "oracle", "observers", "spark_loader"])
def test_all_is_sorted_and_complete(package: str) -> None:
    module = importlib.import_module(package)
    names = module.__all__
    # Sorted the way ruff (RUF022) sorts: CONSTANTS, then Classes, then functions.
    assert names == sorted(names, key=_isort_key), f"{package}.__all__ is not sorted"
    for name in names:
        assert hasattr(module, name), f"{package}.{name} is in __all__ but missing"
    public = {n for n in vars(module) if not n.startswith("_")}
    submodules = {n for n in public if type(getattr(module, n)).__name__ == "module"}
    assert public - submodules - {"annotations"} <= set(names) | {"__version__"}


def test_embedded_default_imports_no_optional_dependency() -> None:
    code = (
        "import sys, percolator, tempfile\n"
        "d = tempfile.mkdtemp()\n"
        "with percolator.connect(f'sqlite:///{d}/x.db') as c:\n"
        "    c.create_table('t')\n"
        "    with percolator.Transaction(c) as t: t.set('t', b'r', 'c:q', b'v')\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('kazoo', 'grpc', 'happybase', 'thriftpy2', 'google', 'pyspark', 'oracle',"
        " 'prometheus_client')]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


CLUSTER_SURFACE = {
    # what an application does with a repository (as FoundationDB's Database): tables,
    # transactions and snapshots, observed columns, garbage collection, its options, close
    "close", "closed", "create_table", "drop_table", "gc", "is_observed", "lock_ttl",
    "observe", "observed_columns", "one_phase_commit", "snapshot", "table_exists", "tables",
    "transaction", "url",
}


def test_the_cluster_shows_an_application_only_its_surface(tmp_path: Path) -> None:
    """The store, timestamps, coordination, counters and the worker's hooks are reached
    through percolator._internals.internals(cluster), not as public attributes: a new
    public name on Cluster fails here until it is added on purpose."""
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        public = {n for n in dir(cluster) if not n.startswith("_")}
        assert public == CLUSTER_SURFACE
        parts = internals(cluster)
        assert parts is internals(cluster) and parts.cluster is cluster
        assert cluster.url == parts.store.url == f"sqlite://{tmp_path}/repo.db"  # one / of the path
        cluster.create_table("t")
        assert cluster.table_exists("t") is True
        assert cluster.table_exists("nope") is False
        with pytest.raises(percolator.InvalidArgument):
            cluster.table_exists("bad name")
        with pytest.raises(percolator.UnknownTableError):
            parts.require_table("nope")
        with cluster.snapshot() as snap:
            assert snap.get("t", b"r", "c:q") is None
    with pytest.raises(percolator.InvalidArgument, match=r"needs a percolator\.Cluster"):
        internals(object())  # type: ignore[arg-type]
