"""The examples in the docstrings of public names (the literal blocks after ``::``,
which the API reference shows as code) are Python that names nothing undefined.

They are checked, not run: many show a call that blocks (``Worker.run()``) or needs a
service. What an example may use without defining it is what ``doctest`` would give
it, the public names of the package that documents it (and the package itself, as
``photon`` for ``observers.photon``), plus ``percolator`` and an open ``cluster``;
anything else it uses, it imports or defines, so that a reader can copy it.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs._examples import ROOT
from tests.docs.test_site import API_PAGES, _require

_LITERAL = re.compile(r"::[ \t]*\n[ \t]*\n(?P<body>(?:[ \t]+\S.*\n|[ \t]*\n)+)")


def _examples() -> Iterator[tuple[str, str, str]]:
    """(package, object path, code) of every literal block in a public docstring."""
    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    for top in sorted({name.split(".")[0] for name in API_PAGES}):
        loader.load(top)
    loader.resolve_aliases(external=False)
    for package in API_PAGES:
        module = loader.modules_collection[package]
        objects = [(package, module)]
        for name in importlib.import_module(package).__all__:
            obj = module[name]
            target = obj.final_target if obj.is_alias else obj
            objects.append((f"{package}.{name}", target))
            if target.is_class:
                objects += [(f"{package}.{name}.{m}", member)
                            for m, member in target.members.items()
                            if not m.startswith("_") and not member.is_alias]
        for path, obj in objects:
            if obj.docstring is None:
                continue
            for found in _LITERAL.finditer(obj.docstring.value + "\n"):
                yield package, path, textwrap.dedent(found["body"])


def _prelude(package: str) -> str:
    names = importlib.import_module(package).__all__
    parent, _, last = package.rpartition(".")
    lines = ["import percolator", "cluster = percolator.connect('sqlite:///tmp/x.db')"]
    lines.append(f"from {parent} import {last}" if parent else f"import {package}")
    lines.append(f"from {package} import {', '.join(names)}")
    return "\n".join(lines) + "\n"


def test_docstring_examples_name_nothing_undefined(tmp_path: Path) -> None:
    _require("griffe")
    files: dict[str, tuple[str, str]] = {}
    for i, (package, path, code) in enumerate(_examples()):
        prelude = _prelude(package)
        file = tmp_path / f"example_{i:03d}.py"
        file.write_text(prelude + code)
        files[file.name] = (path, code)
    assert len(files) >= 20, "the docstrings' examples were not found"
    # Undefined names and syntax errors only: an example may import more than it uses.
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821",
         "--output-format", "json", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    if done.returncode not in (0, 1):
        pytest.fail(f"ruff failed: {done.stderr}")
    problems = []
    for found in json.loads(done.stdout):
        path, code = files[Path(found["filename"]).name]
        problems.append(f"{path}: {found['message']}\n{textwrap.indent(code, '    ')}")
    assert not problems, "docstring examples that cannot run as written:\n" + "\n".join(
        problems)


@pytest.mark.parametrize("module", ["percolator.testing"])
def test_module_docstring_examples_run(module: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples of modules whose example needs no service or fixed path are run,
    not only checked for names: a guide's first example must work as written."""
    examples = list(_LITERAL.finditer(importlib.import_module(module).__doc__ or ""))
    assert examples, f"{module}'s docstring has no example"
    monkeypatch.chdir(tmp_path)
    for found in examples:
        code = textwrap.dedent(found["body"])
        exec(compile(code, f"{module} docstring", "exec"), {"__name__": "__example__"})
