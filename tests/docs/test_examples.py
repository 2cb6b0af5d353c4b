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
    PYTHON,
    ROOT,
    Block,
    MarkerError,
    blocks,
    located,
    pages,
)

SHELL_TIMEOUT = 120.0  # seconds; a CLI example takes one or two


def _run_python(block: Block, namespace: dict[str, Any]) -> None:
    exec(compile(located(block.code, block.line), str(block.path), "exec"), namespace)


def _run_shell(block: Block, directory: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    # The interpreter running the tests, and its console scripts, come first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
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
    _run_page(page, tmp_path, monkeypatch)


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore::FutureWarning")  # pyspark on pandas 3
@pytest.mark.parametrize("page", [p for p in pages() if _needs_spark(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_spark_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 spark: Any) -> None:
    """The page builds its session with ``SparkSession.builder...getOrCreate()``, which
    returns the test session's (started once for the run)."""
    _run_page(page, tmp_path, monkeypatch)


def _run_page(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's examples as printed, in order, in the empty directory *tmp_path*."""
    examples = _runnable(page)
    directory = tmp_path / "page"  # empty: pytest's own files stay out of the page's way
    directory.mkdir()
    monkeypatch.chdir(directory)
    namespace: dict[str, Any] = {"__name__": "__example__"}
    try:
        for block in examples:
            if block.lang == PYTHON:
                _run_python(block, namespace)
            else:
                _run_shell(block, directory)
        problems = _left_open(namespace)
        assert not problems, f"{page.relative_to(ROOT)} leaves: " + "; ".join(problems)
    finally:
        _close(namespace)


# The blocks that do not run, per page: each says why above it. A new one (or one
# fewer) changes this table, so that the blocks left unrun never grow unseen.
NO_RUN = {
    "README.md": 2,
    "docs/backends.md": 1,
    "docs/bigtable.md": 2,
    "docs/bulk-loading.md": 1,
    "docs/development.md": 2,
    "docs/fault-injection.md": 1,
    "docs/garbage-collection.md": 1,
    "docs/hbase.md": 2,
    "docs/index.md": 2,
    "docs/millwheel.md": 1,
    "docs/observers.md": 1,
    "docs/photon.md": 2,
    "docs/running-on-a-cluster.md": 10,
    "docs/spark.md": 7,
    "docs/testing.md": 1,
    "docs/tls.md": 6,
}


def test_every_page_has_valid_markers_and_its_count_of_unrun_blocks() -> None:
    """Markers parse on every page (a no-run without its reason, on a text block, or a
    hidden setup is an error), each block that does not run says why, and the number
    of such blocks per page is the one in ``NO_RUN``."""
    counted = {}
    for page in pages():
        unrun = [b for b in blocks(page) if b.no_run is not None]
        assert all(b.no_run for b in unrun)
        if unrun:
            counted[str(page.relative_to(ROOT))] = len(unrun)
    assert counted == NO_RUN


def test_a_marker_without_a_reason_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- no-run: -->\n```python\nraise SystemExit\n```\n")
    with pytest.raises(MarkerError, match="no-run needs a reason"):
        blocks(page)
    page.write_text("<!-- no_run: spelled wrong -->\n```python\npass\n```\n")
    with pytest.raises(MarkerError, match="unknown marker 'no_run'"):
        blocks(page)
    page.write_text("<!-- setup: x = 1 -->\n```python\nprint(x)\n```\n")
    with pytest.raises(MarkerError, match="hidden setup is not taken"):
        blocks(page)
    page.write_text("<!-- needs: spark -->\n<!-- an ordinary comment -->\n"
                    "```python\nprint(spark)\n```\n\n```\nnot code\n```\n")
    found = blocks(page)
    assert [(b.lang, b.needs, b.line) for b in found] == [
        ("python", "spark", 4), ("", None, 8)]
