"""Every example in README.md and docs/ runs, from the wheel installed into a fresh
virtualenv (tests/_wheel.py), as a new user would run it (tests/docs/_examples.py says
how a page is run and which markers a block may carry): a broken example fails here,
with a traceback into the Markdown file.

Each page runs once, in a process of its own (the Spark pages share one, and its
JVM): the virtualenv's interpreter runs tests/docs/_page_runner.py, which runs the
page's blocks in order in an empty directory, the shell blocks with the virtualenv's
``python`` and console scripts first on ``PATH``, and reports the block that failed,
what the page left running, and where each of our modules it imported came from (the
wheel, never the checkout)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests._hbase_local import jvm_options
from tests._spark import require_spark
from tests._wheel import WheelVenv
from tests.docs._examples import (
    ROOT,
    Block,
    MarkerError,
    blocks,
    pages,
)

RUNNER = Path(__file__).with_name("_page_runner.py")
PAGE_TIMEOUT = 300.0  # seconds; a page takes a few, a Spark page starts a JVM
# Not errors in a page, as for the whole suite (setup.cfg's filterwarnings), and
# FutureWarning from pyspark on pandas 3 on the Spark pages.
IGNORED_WARNINGS = ("DeprecationWarning", "ResourceWarning")
SPARK_IGNORED_WARNINGS = (*IGNORED_WARNINGS, "FutureWarning")


def _runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.is_example and b.no_run is None]


def _needs_spark(page: Path) -> bool:
    return any(b.needs == "spark" for b in _runnable(page))


@pytest.mark.parametrize("page", [p for p in pages() if _runnable(p) and not _needs_spark(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page: Path, tmp_path: Path, wheel_venv: WheelVenv) -> None:
    _run_page(page, tmp_path, wheel_venv, wheel_venv.env(), IGNORED_WARNINGS)


SPARK_PAGES = [p for p in pages() if _needs_spark(p)]


@pytest.fixture(scope="module")
def spark_pages_run(wheel_venv: WheelVenv, tmp_path_factory: pytest.TempPathFactory
                    ) -> dict[Path, Outcome]:
    """The Spark pages, run one after the other by one process of the virtualenv (one
    JVM: the first page's ``SparkSession.builder.getOrCreate()`` starts a local Spark,
    the next page's returns it, as a reader's second script in one session would);
    each page in its own empty directory and namespace. Its Python workers are the
    virtualenv's (they find ``format("percolator")`` in the wheel), and the
    environment sizes it like the suite's session (two cores, UI off)."""
    require_spark()
    env = wheel_venv.env()
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=str(wheel_venv.python),
        PYSPARK_DRIVER_PYTHON=str(wheel_venv.python),
        PYSPARK_SUBMIT_ARGS=shlex.join([
            "--master", "local[2]", "--driver-memory", "1g",
            *(["--driver-java-options", " ".join(jvm_options())] if jvm_options() else []),
            "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
            "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.default.parallelism=2",
            "pyspark-shell"]),
    )
    outcomes = _run_pages(SPARK_PAGES, tmp_path_factory.mktemp("spark-pages"), wheel_venv,
                          env, SPARK_IGNORED_WARNINGS)
    return dict(zip(SPARK_PAGES, outcomes, strict=True))


# One worker runs every Spark page: the module fixture that runs them all is then run
# once per run, not once by each worker that draws one of the pages (two workers each
# started a JVM and ran both pages: 76 and 84 s of set-up in a 4-worker run).
@pytest.mark.xdist_group("spark-pages")
@pytest.mark.spark
@pytest.mark.timeout(PAGE_TIMEOUT * len(SPARK_PAGES) + 60)  # the fixture runs them all
@pytest.mark.parametrize("page", SPARK_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_spark_page_examples_run(page: Path, spark_pages_run: dict[Path, Outcome],
                                 wheel_venv: WheelVenv) -> None:
    _check(spark_pages_run[page], wheel_venv)


@dataclass
class Outcome:
    """How one page ran: the runner's result, or why there is none."""

    name: str
    result: dict[str, Any] | None
    output: str  # the runner's stdout and stderr (of all the pages it ran)
    trouble: str = ""


def _run_page(page: Path, tmp_path: Path, venv: WheelVenv, env: dict[str, str],
              ignored_warnings: tuple[str, ...]) -> None:
    """The page's examples as printed, in order, in an empty directory, by the
    virtualenv's interpreter (tests/docs/_page_runner.py)."""
    (outcome,) = _run_pages([page], tmp_path, venv, env, ignored_warnings)
    _check(outcome, venv)


def _run_pages(pages: list[Path], tmp_path: Path, venv: WheelVenv, env: dict[str, str],
               ignored_warnings: tuple[str, ...]) -> list[Outcome]:
    """*pages*, one after the other, by one process of the virtualenv's interpreter."""
    requests = []
    for number, page in enumerate(pages):
        directory = tmp_path / f"page-{number}" / "page"  # empty: pytest's files elsewhere
        directory.mkdir(parents=True)
        requests.append({
            "directory": str(directory),
            "result": str(directory.parent / "result.json"),
            "blocks": [{"where": b.where, "path": str(b.path), "line": b.line,
                        "lang": b.lang, "code": b.code} for b in _runnable(page)],
        })
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"ignore_warnings": list(ignored_warnings),
                                   "pages": requests}))
    runner = subprocess.Popen([str(venv.python), str(RUNNER), str(request)],
                              cwd=requests[0]["directory"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timeout = PAGE_TIMEOUT * len(pages)
    trouble = ""
    try:
        output, _ = runner.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(runner.pid, signal.SIGKILL)  # and what the page started (a JVM)
        output, _ = runner.communicate()
        trouble = f"still runs after {timeout:.0f} s"
    outcomes = []
    for page, asked in zip(pages, requests, strict=True):
        name = str(page.relative_to(ROOT) if page.is_relative_to(ROOT) else page)
        result_file = Path(asked["result"])
        if result_file.exists():
            outcomes.append(Outcome(name, json.loads(result_file.read_text()), output))
        else:
            outcomes.append(Outcome(name, None, output, trouble or (
                f"the page runner exited {runner.returncode} without its result")))
    return outcomes


def _check(outcome: Outcome, venv: WheelVenv) -> None:
    """Fail the test as the page failed: its failing block (a traceback into the
    Markdown file), what it left open, or a module not the wheel's."""
    result, name = outcome.result, outcome.name
    if result is None:
        pytest.fail(f"{name}: {outcome.trouble}\n{outcome.output}", pytrace=False)
    if result["failed"]:
        pytest.fail(f"{result['failed']}: {result['error']}\n--- the runner's output\n"
                    f"{outcome.output}", pytrace=False)
    assert not result["left_open"], f"{name} leaves: " + "; ".join(result["left_open"])
    not_the_wheels = {module: file for module, file in result["modules"].items()
                      if not (file and Path(file).is_relative_to(venv.prefix))}
    assert not not_the_wheels, f"{name} imported these from outside the wheel: {not_the_wheels}"


def test_a_failing_block_is_reported_at_its_line_and_what_a_page_leaves_open(
    tmp_path: Path, wheel_venv: WheelVenv
) -> None:
    """A failing block fails the page with a traceback into the Markdown file (its
    line there), and a page that leaves a transaction open fails though every block
    ran: the guarantees of the runner, in the wheel's virtualenv."""
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```python\nx = 1\n```\n\nText.\n\n```python\n"
                    "y = x + 1\nraise ValueError('broken example')\n```\n")
    with pytest.raises(pytest.fail.Exception) as failed:
        _run_page(page, tmp_path / "one", wheel_venv, wheel_venv.env(), IGNORED_WARNINGS)
    report = str(failed.value)
    assert report.startswith(f"{page}:10: Traceback")
    assert f'File "{page}", line 11' in report and "ValueError: broken example" in report
    page.write_text("```python\nimport percolator\n"
                    "cluster = percolator.connect('sqlite:repo.db')\n"
                    "snap = percolator.Snapshot(cluster)\n```\n")
    with pytest.raises(AssertionError, match=r"leaves: a transaction or snapshot of "
                       r"'cluster' is still open \(start_ts \d+\)"):
        _run_page(page, tmp_path / "two", wheel_venv, wheel_venv.env(), IGNORED_WARNINGS)


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
