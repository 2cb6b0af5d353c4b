"""Each package's public names: one import surface with a sorted, complete __all__,
importable without any optional dependency."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


def _isort_key(name: str) -> tuple[int, str]:
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


@pytest.mark.parametrize("package", ["percolator", "oracle", "observers", "spark_loader"])
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
