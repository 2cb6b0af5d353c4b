"""``scripts/mutation``'s bookkeeping: which lines of ``mutation/killed.txt`` and
``equivalent.txt`` answer which mutant (the mutation runs themselves are not part of
the suite; see CONTRIBUTING.md, "Mutation testing")."""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "mutation"

BEFORE = """--- percolator/_cas.py
+++ percolator/_cas.py
@@ -1,3 +1,3 @@
-    if holds:
+    if not holds:
"""
AFTER_AN_EDIT = BEFORE.replace("holds", "applied")


def _script() -> ModuleType:
    loader = SourceFileLoader("mutation_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader("mutation_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    loader.exec_module(module)
    return module


def test_a_fingerprint_is_of_the_changed_lines_only() -> None:
    mutation = _script()
    moved = BEFORE.replace("@@ -1,3 +1,3 @@", "@@ -40,4 +40,4 @@\n     lock = read(cell)")
    assert mutation.fingerprint(moved) == mutation.fingerprint(BEFORE)
    assert mutation.fingerprint(AFTER_AN_EDIT) != mutation.fingerprint(BEFORE)
    assert len(mutation.fingerprint(BEFORE)) == 10


def test_a_line_whose_mutant_now_makes_another_change_is_stale() -> None:
    mutation = _script()
    name = "percolator._cas.x_lock_cas__mutmut_51"
    old = (name, mutation.fingerprint(BEFORE))
    current = (name, mutation.fingerprint(AFTER_AN_EDIT))
    elsewhere = ("percolator._cas.x_lock_cas__mutmut_99", "0123456789")
    diffs = {name: AFTER_AN_EDIT}
    assert mutation.stale_lines(diffs, [current, old, elsewhere]) == [old]
    assert mutation.stale_lines(diffs, [current, elsewhere]) == []
