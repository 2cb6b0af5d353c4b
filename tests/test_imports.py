"""The arrows between the packages: a package imports another one's public names from its
public path (``from percolator import InvalidArgument``, not ``percolator._errors``),
and another package's private modules only where they were made for that use (the
allow-list below). Every module is parsed, not imported, so every import counts:
top-level, in a function, under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from pathlib import Path

import percolator

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("percolator", "oracle", "observers", "spark_loader")

ALLOWED: dict[str, tuple[set[str], str]] = {
    "percolator._batching": ({"oracle"}, "batched timestamp draws, shared with the store counter"),
    "percolator._bulk": ({"spark_loader"}, "the bulk-load protocol, made for the loader"),
    "percolator._commit": ({"observers"}, "the worker commits its observers' transactions"),
    "percolator._encoding": ({"observers", "spark_loader"}, "the column layout and codecs"),
    "percolator._internals": ({"observers", "spark_loader"},
                               "a cluster's parts below its public face (store, timestamps)"),
    "percolator._lock_resolver": ({"spark_loader"},
                                  "the change feed resolves the locks it meets, as a reader"),
    "percolator._notifications": ({"observers"}, "notifications, acks and quarantine"),
    "percolator._notify_index": ({"observers"}, "the notification index the worker scans"),
    "percolator._observer_hooks": ({"observers"}, "the observer-transaction contract"),
    "percolator._pause": ({"oracle"}, "the interleaving harness's pause points"),
    "percolator._recipe_support": ({"observers"}, "what the recipes need of percolator's tables"),
    "percolator._store": ({"observers", "spark_loader"}, "the store contract"),
    "percolator._tls": ({"observers", "oracle", "spark_loader"}, "TLS checks, CLI flags"),
    "percolator._zk_client": ({"oracle"}, "the one ZooKeeper client factory"),
}
"""Internal module -> the other packages that may import it, and why. Short on purpose:
a name an application may use belongs in a package's ``__all__`` instead."""


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every absolute import in *path*."""
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name, []) for a in node.names)
    return found


def crossings(root: Path = ROOT) -> list[str]:
    """Every import in a package of a private name or module of another package that
    the allow-list does not permit, as ``file:line: what``."""
    public = {"percolator": set(percolator.__all__)}
    problems: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "_proto" in path.parts:  # generated gRPC code
                continue
            for line, module, names in _imports(path):
                owner = module.split(".")[0]
                if owner not in PACKAGES or owner == package:
                    continue
                where = f"{path.relative_to(root)}:{line}"
                for name in names:
                    if name.startswith("_"):
                        problems.append(f"{where}: private name {name} of {module}")
                if not _private(module):
                    continue
                allowed = ALLOWED.get(module)
                if allowed is None or package not in allowed[0]:
                    problems.append(f"{where}: private module {module} (not allowed for "
                                    f"{package}: tests/test_imports.py ALLOWED)")
                for name in names:
                    if name in public.get(owner, ()):
                        problems.append(f"{where}: {name} is public: import it from {owner}")
    return problems


def test_no_package_reaches_into_another_ones_private_parts() -> None:
    problems = crossings()
    assert not problems, "\n".join(problems)


def test_the_allow_list_names_only_modules_in_use() -> None:
    used = {
        module
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for _, module, _ in _imports(path)
        if module.split(".")[0] != package
    }
    assert set(ALLOWED) <= used, sorted(set(ALLOWED) - used)


def test_a_new_private_import_is_caught(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "observers" / "a.py").write_text(
        "from percolator._errors import InvalidArgument\n"
        "from percolator._gc import collect\n"
        "from percolator.metrics import _enabled\n"
        "def f():\n    import oracle._server\n"
    )
    problems = crossings(tmp_path)
    assert any("InvalidArgument is public" in p for p in problems), problems
    assert any("private module percolator._gc" in p for p in problems), problems
    assert any("private name _enabled" in p for p in problems), problems
    assert any("private module oracle._server" in p for p in problems), problems


def test_percolator_names_every_public_name_it_loads_lazily() -> None:
    assert set(percolator._PUBLIC) == set(percolator.__all__)
