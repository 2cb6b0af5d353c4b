"""Every example in README.md and docs/ runs (tests/docs/_examples.py says how a page
is run and which markers a block may carry): a broken example fails here, with a
traceback into the Markdown file."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import Worker
from percolator._internals import internals
from tests.docs._examples import (
    EXAMPLE_DIR,
    PYTHON,
    ROOT,
    Block,
    MarkerError,
    blocks,
    located,
    pages,
)

SHELL_TIMEOUT = 120.0  # seconds; a CLI example takes one or two


def _run_python(block: Block, namespace: dict[str, Any], directory: Path) -> None:
    for code in block.setup:
        exec(compile(code.replace(EXAMPLE_DIR, f"{directory}/"),
                     f"{block.where} (setup)", "exec"), namespace)
    code = located(block.code.replace(EXAMPLE_DIR, f"{directory}/"), block.line)
    exec(compile(code, str(block.path), "exec"), namespace)


def _run_shell(block: Block, directory: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    # The interpreter running the tests, and its console scripts, come first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code.replace(EXAMPLE_DIR, f"{directory}/")],
        cwd=directory, env=env, capture_output=True, text=True, timeout=SHELL_TIMEOUT,
    )
    if done.returncode:
        pytest.fail(f"{block.where}: the shell example exited {done.returncode}\n"
                    f"{block.code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}",
                    pytrace=False)


def _left_open(namespace: dict[str, Any]) -> list[str]:
    """What the page leaves running: a worker's threads, or a transaction or snapshot
    that holds garbage collection back (the docs close what they open). Garbage in
    reference cycles (a failed run's traceback) is collected first: only what the
    page still holds counts."""
    gc.collect()
    problems = []
    for name, value in namespace.items():
        if isinstance(value, Worker) and any(t.is_alive() for t in value._threads):
            problems.append(f"worker {name!r} is still running")
        if isinstance(value, percolator.Cluster) and not value._closed:
            running = internals(value).safe_point.running()
            if running:
                problems.append(f"a transaction or snapshot of {name!r} is still open "
                                f"(start_ts {running[0][0]}): it holds garbage collection back")
    return problems


def _close(namespace: dict[str, Any]) -> None:
    for value in list(namespace.values()):
        if isinstance(value, Worker):
            value.stop(10)
    for value in list(namespace.values()):
        if isinstance(value, percolator.Cluster):
            value.close()


def _runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.is_example and b.no_run is None]


def _needs_spark(page: Path) -> bool:
    return any(b.needs == "spark" for b in _runnable(page))


@pytest.mark.parametrize("page", [p for p in pages() if _runnable(p) and not _needs_spark(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run_page(page, tmp_path, monkeypatch, {})


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore::FutureWarning")  # pyspark on pandas 3
@pytest.mark.parametrize("page", [p for p in pages() if _needs_spark(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_spark_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 spark: Any) -> None:
    _run_page(page, tmp_path, monkeypatch, {"spark": spark})


def _run_page(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              given_names: dict[str, Any]) -> None:
    examples = _runnable(page)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__example__", "percolator": percolator,
                                 **given_names}
    given = namespace["cluster"] = percolator.connect(f"sqlite:///{tmp_path}/repo.db")
    try:
        for block in examples:
            if block.lang == PYTHON:
                _run_python(block, namespace, tmp_path)
            else:
                _run_shell(block, tmp_path)
        problems = _left_open(namespace)
        assert not problems, f"{page.relative_to(ROOT)} leaves: " + "; ".join(problems)
    finally:
        _close(namespace)
        given.close()


def test_every_page_has_valid_markers() -> None:
    """Markers parse on every page (a no-run without its reason, or on a text block, is
    an error), and each block that does not run says why."""
    for page in pages():
        for block in blocks(page):
            if block.no_run is not None:
                assert block.no_run, block.where


def test_a_marker_without_a_reason_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- no-run: -->\n```python\nraise SystemExit\n```\n")
    with pytest.raises(MarkerError, match="no-run needs a reason"):
        blocks(page)
    page.write_text("<!-- no_run: spelled wrong -->\n```python\npass\n```\n")
    with pytest.raises(MarkerError, match="unknown marker 'no_run'"):
        blocks(page)
    page.write_text("<!-- setup: x = 1 -->\n<!-- an ordinary comment -->\n"
                    "```python\nprint(x)\n```\n\n```\nnot code\n```\n")
    found = blocks(page)
    assert [(b.lang, b.setup, b.line) for b in found] == [
        ("python", ["x = 1\n"], 4), ("", [], 8)]
