"""The arrows between the packages and between the modules of the library.

* A package imports another one's public names from its public path (``from percolator
  import InvalidArgument``, not ``percolator._errors``); code that extends percolator
  (observers, oracle, spark_loader, the benchmarks) takes what it needs from
  :mod:`percolator.ext`. Any import of a private module or name of another package
  fails :func:`test_no_package_reaches_into_another_ones_private_parts` (no
  allow-list). ``pyspark_percolator.py`` is spark_loader's entry point under the name
  PySpark looks for, so it counts as part of spark_loader; ``bench/`` may not import
  the private parts of any of them.
* No two modules of the library import each other, directly or round a circle
  (:func:`circles`): a circle loads only in one order, and a function-level import
  that keeps it loadable hides it.

Every module is parsed, not imported, so every import counts: top-level, in a
function, under ``TYPE_CHECKING``. For the circles, imports under ``TYPE_CHECKING`` do
not count: they never run (every module that has them starts with ``from __future__
import annotations``, so no annotation is evaluated at import), and a type checker
has no trouble with circles; they are shown, marked ``*``, by ``python -m
tests.test_imports``. Imports inside functions do count: they run, only later.

``python -m tests.test_imports [CHECKOUT]`` prints the private imports across
packages, the import circles, and the graph between percolator's modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import percolator

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("percolator", "oracle", "observers", "spark_loader")
ENTRY_POINTS = {"pyspark_percolator": "spark_loader"}
"""Top-level modules that belong to a package: module -> package."""
CHECKED_TOOLS = {"bench": ("percolator", "observers", "oracle", "spark_loader")}
"""Directories of tools that are not packages of the library -> the packages whose
private parts they may not import."""
LAZY = ("percolator", "percolator.ext")
"""Modules that load their names at first use (PEP 562) from the modules their
``TYPE_CHECKING`` imports name: ``from percolator.ext import X`` imports the module
that defines X."""


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


def _sources(root: Path) -> list[tuple[str, Path]]:
    """``(package, path)`` of every parsed file: the library's packages, their entry
    points and the checked tools (generated gRPC code left out)."""
    found = [(package, path) for package in (*PACKAGES, *CHECKED_TOOLS)
             for path in sorted((root / package).rglob("*.py")) if "_proto" not in path.parts]
    found += [(package, root / f"{module}.py") for module, package in ENTRY_POINTS.items()
              if (root / f"{module}.py").exists()]
    return found


def crossings(root: Path = ROOT) -> list[str]:
    """Every import in a package (or a checked tool) of a private name or module of
    another package, as ``file:line: what``."""
    public = {"percolator": set(percolator.__all__)}
    problems: list[str] = []
    for package, path in _sources(root):
        guarded = CHECKED_TOOLS.get(package, PACKAGES)
        for line, module, names in _imports(path):
            owner = module.split(".")[0]
            if owner not in guarded or owner == package:
                continue
            where = f"{path.relative_to(root)}:{line}"
            for name in names:
                if name.startswith("_"):
                    problems.append(f"{where}: private name {name} of {module}")
            if not _private(module):
                continue
            problems.append(f"{where}: private module {module}"
                            + (" (percolator.ext has what extensions need)"
                               if owner == "percolator" else ""))
            for name in names:
                if name in public.get(owner, ()):
                    problems.append(f"{where}: {name} is public: import it from {owner}")
    return problems


def test_no_package_reaches_into_another_ones_private_parts() -> None:
    problems = crossings()
    assert not problems, "\n".join(problems)


def test_a_new_private_import_is_caught(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "observers" / "a.py").write_text(
        "from percolator._errors import InvalidArgument\n"
        "from percolator._store import Read\n"
        "from percolator.metrics import _enabled\n"
        "def f():\n    import oracle._server\n"
    )
    (tmp_path / "bench" / "b.py").write_text(
        "from percolator._internals import internals\n"
        "from spark_loader._read import plan_ranges\n")
    (tmp_path / "pyspark_percolator.py").write_text(
        "from spark_loader._source import register\nfrom oracle._client import C\n")
    problems = crossings(tmp_path)
    assert any("InvalidArgument is public" in p for p in problems), problems
    # no module is allowed any more, not even the store contract's
    assert any("a.py:2: private module percolator._store" in p for p in problems), problems
    assert any("private name _enabled" in p for p in problems), problems
    assert any("private module oracle._server" in p for p in problems), problems
    assert any("b.py:1: private module percolator._internals" in p for p in problems), problems
    # a tool may not reach into any package; the entry point is spark_loader's own
    assert any("b.py:2: private module spark_loader._read" in p for p in problems), problems
    assert not any("spark_loader._source" in p for p in problems), problems
    assert any("pyspark_percolator.py:2: private module oracle._client" in p
               for p in problems), problems


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


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """The runtime imports between the library's modules (every module of its packages
    and their entry points, a subpackage's modules each on their own): importer ->
    {imported: where, as ``file:line``}. Imports inside functions count; those under
    ``TYPE_CHECKING`` do not (see the module docstring). ``from P import X`` goes to
    the module P.X where there is one, to the module defining X where P loads its
    names lazily (:data:`LAZY`), else to P. A module's parent packages, which Python
    imports first, are not edges: a package's ``__init__`` that imports its modules
    would otherwise close a circle with each of them."""
    files = {_module_name(root, path): path for package, path in _sources(root)
             if package not in CHECKED_TOOLS}
    lazy: dict[str, dict[str, str]] = {}
    for module in LAZY:
        path = files.get(module)
        if path is not None:
            lazy[module] = {name: source for _, source, names, typing_only in
                            _typed_imports(path) if typing_only for name in names}
    graph: dict[str, dict[str, str]] = {}
    for module, path in files.items():
        edges = graph.setdefault(module, {})
        for line, imported, names, typing_only in _typed_imports(path):
            if typing_only or imported.split(".")[0] not in (*PACKAGES, *ENTRY_POINTS):
                continue
            targets = {f"{imported}.{n}" if f"{imported}.{n}" in files
                       else lazy[imported].get(n, imported) if imported in lazy
                       else imported for n in names} or {imported}
            for target in targets - {module}:
                if target in files:
                    edges.setdefault(target, f"{path.relative_to(root)}:{line}")
    return graph


def circles(root: Path = ROOT) -> list[list[str]]:
    """The import circles among the library's modules: each a strongly connected set
    of :func:`module_graph` (sorted), as lines ``a -> b (file:line)`` of its edges."""
    graph = module_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                inside = set(members)
                found.append([f"{a} -> {b} ({graph[a][b]})" for a in sorted(inside)
                              for b in sorted(graph[a]) if b in inside])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_among_the_librarys_modules(package: str) -> None:
    found = [c for c in circles() if c[0].split(".")[0] in (package, *(
        m for m, owner in ENTRY_POINTS.items() if owner == package))]
    assert not found, "import circles:\n" + "\n\n".join("\n".join(c) for c in found)


def test_a_circle_is_found_also_through_a_function_level_import(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "percolator" / "__init__.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    from percolator._b import B\n")
    (tmp_path / "percolator" / "ext.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    from percolator._c import C\n")
    (tmp_path / "percolator" / "_a.py").write_text("from percolator import B\n")
    (tmp_path / "percolator" / "_b.py").write_text("def f():\n    from percolator._a import A\n")
    (tmp_path / "percolator" / "_c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from observers._x import X\n")
    (tmp_path / "observers" / "__init__.py").write_text("from observers._x import X\n")
    (tmp_path / "observers" / "_x.py").write_text("from percolator.ext import C\n")
    found = circles(tmp_path)
    # _a -> _b through percolator's lazy name, _b -> _a inside a function: a circle;
    # _c -> _x only for type checking, and observers/_x's parent package: none.
    assert found == [["percolator._a -> percolator._b (percolator/_a.py:1)",
                      "percolator._b -> percolator._a (percolator/_b.py:2)"]]
    assert module_graph(tmp_path)["observers._x"] == {"percolator._c": "observers/_x.py:1"}


def _print_graph(root: Path) -> None:
    packages, modules = import_graph(root)
    for title, graph in (("packages", packages), ("inside percolator", modules)):
        print(f"# {title} (* = TYPE_CHECKING only)")
        for a in sorted(graph):
            if graph[a]:
                print(f"{a} -> {', '.join(sorted(graph[a]))}")


def main(root: Path) -> int:
    """Print the private imports across packages and the import circles (exit 1 if
    any), then the graph between percolator's modules."""
    problems, found = crossings(root), circles(root)
    print(f"# private imports across packages: {len(problems)}")
    print("\n".join(problems))
    print(f"# import circles among the library's modules: {len(found)}")
    for circle in found:
        print("\n".join(circle) + "\n")
    _print_graph(root)
    return 1 if problems or found else 0


if __name__ == "__main__":  # python -m tests.test_imports [checkout]
    import sys

    sys.exit(main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT))
