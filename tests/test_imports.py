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
    return [(line, module, names) for line, module, names, _ in _typed_imports(path)]


def _typed_imports(path: Path) -> list[tuple[int, str, list[str], bool]]:
    """``(line, module, names, for_typing_only)`` of every absolute import in *path*;
    the flag is true under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    found: list[tuple[int, str, list[str], bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [a.name for a in node.names], typing_only))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name, [], typing_only) for a in node.names)
        for child in ast.iter_child_nodes(node):
            guarded = (isinstance(node, ast.If) and child in node.body
                       and ast.unparse(node.test).endswith("TYPE_CHECKING"))
            visit(child, typing_only or guarded)

    visit(ast.parse(path.read_text(), str(path)), False)
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


GRAPH_PACKAGES = (*PACKAGES, "pyspark_percolator")


def import_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """From the parsed imports under *root* (any checkout): the edges between the
    packages, and between percolator's modules (a subpackage, ``stores``, is one node;
    ``from percolator import X`` counts as an edge to the module ``__init__`` takes X
    from). A target is suffixed ``*`` when only ``TYPE_CHECKING`` imports make the edge."""
    init = root / "percolator" / "__init__.py"
    defined_in = {name: module.split(".")[1]
                  for _, module, names, _ in _typed_imports(init)
                  if module.startswith("percolator.") for name in names}
    runtime: dict[str, dict[str, set[str]]] = {"packages": {}, "percolator": {}}
    typing: dict[str, dict[str, set[str]]] = {"packages": {}, "percolator": {}}
    for package in GRAPH_PACKAGES:
        paths = [root / f"{package}.py"] if package == "pyspark_percolator" else sorted(
            p for p in (root / package).rglob("*.py") if "_proto" not in p.parts)
        for path in paths:
            if not path.exists():
                continue
            node = path.relative_to(root / "percolator").parts[0].removesuffix(".py") \
                if package == "percolator" else None
            for _, module, names, typing_only in _typed_imports(path):
                parts = module.split(".")
                edges = typing if typing_only else runtime
                if parts[0] in GRAPH_PACKAGES and parts[0] != package:
                    edges["packages"].setdefault(package, set()).add(parts[0])
                if node is None or parts[0] != "percolator":
                    continue
                targets = {parts[1]} if len(parts) > 1 else {
                    defined_in.get(name, name) for name in names}
                edges["percolator"].setdefault(node, set()).update(targets - {node})
    graphs = []
    for kind in ("packages", "percolator"):
        graph = {a: set(b) for a, b in runtime[kind].items()}
        for a, targets in typing[kind].items():
            graph.setdefault(a, set()).update(
                f"{b}*" for b in targets if b not in runtime[kind].get(a, set()))
        graphs.append(graph)
    return graphs[0], graphs[1]


def test_percolator_imports_no_other_package() -> None:
    # connect() finds the oracle client by its scheme (percolator._timestamps.ORACLES),
    # as it finds store backends, so the arrows point one way: into percolator.
    packages, _ = import_graph()
    assert "percolator" not in packages, packages["percolator"]
    assert packages["oracle"] == {"percolator"}


def test_the_graph_marks_edges_made_only_for_type_checking(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "percolator" / "__init__.py").write_text(
        "from percolator._errors import InvalidArgument\n")
    (tmp_path / "percolator" / "_a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from percolator import InvalidArgument\n"
        "if TYPE_CHECKING:\n    from percolator._b import B\n    import oracle\n"
        "def f():\n    from percolator._c import C\n")
    packages, modules = import_graph(tmp_path)
    assert packages == {"percolator": {"oracle*"}}
    assert modules["_a"] == {"_errors", "_b*", "_c"}


def _print_graph(root: Path) -> None:
    packages, modules = import_graph(root)
    for title, graph in (("packages", packages), ("inside percolator", modules)):
        print(f"# {title} (* = TYPE_CHECKING only)")
        for a in sorted(graph):
            if graph[a]:
                print(f"{a} -> {', '.join(sorted(graph[a]))}")


if __name__ == "__main__":  # python -m tests.test_imports [checkout]
    import sys

    _print_graph(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
