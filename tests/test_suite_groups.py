"""How ``--dist loadgroup`` places the suite's tests (tests/conftest.py): the tests that
run Spark in their worker share one worker's session; those whose Spark runs in
processes of their own spread over every worker."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def _grouped(*files: str) -> set[str]:
    """The ids of the tests in *files* that carry an ``xdist_group`` mark."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
         "-m", "xdist_group", *files],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: none selected
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_spark_tests_are_grouped_only_when_spark_runs_in_their_worker() -> None:
    grouped = _grouped("tests/spark_loader/test_read.py", "tests/spark_loader/test_workers.py",
                       "tests/spark_loader/test_source.py", "tests/docs/test_examples.py")
    # test_read's tests take the session's SparkSession; test_workers' start drivers of
    # their own in subprocesses.
    assert any(i.startswith("tests/spark_loader/test_read.py::") for i in grouped), grouped
    # its drivers play a stream's tasks in processes of their own
    assert ("tests/spark_loader/test_source.py::test_stream_tasks_killed_mid_batch_and_"
            "replayed_write_every_row_once") not in grouped
    assert not any(i.startswith("tests/spark_loader/test_workers.py::") for i in grouped)
    # The docs' Spark pages run in one process of a module fixture: both on one worker
    # (or each worker that draws one runs them all again); the other pages spread.
    pages = {i for i in grouped if i.startswith("tests/docs/test_examples.py::")}
    assert pages == {"tests/docs/test_examples.py::test_spark_page_examples_run[docs/spark.md]",
                     "tests/docs/test_examples.py::test_spark_page_examples_run"
                     "[docs/bulk-loading.md]"}, pages


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    """``--dist loadgroup`` keeps an ``xdist_group``'s tests on one worker: a real
    two-worker session of tests that record the worker they ran on. (pytest 9.2 with
    pytest-xdist 3.8 spreads them, and every worker then starts the group's module
    services, a SparkSession or a five-JVM HBase, for itself: setup.cfg pins pytest.)"""
    seen = tmp_path / "seen"
    seen.mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the checkout's setup.cfg
    (tmp_path / "test_grouped.py").write_text(
        "import os, time, pytest\n"
        "@pytest.mark.parametrize('i', range(8))\n"
        "@pytest.mark.xdist_group('together')\n"
        "def test_grouped(i):\n"
        f"    (__import__('pathlib').Path({str(seen)!r}) / str(i)).write_text(\n"
        "        os.environ['PYTEST_XDIST_WORKER'])\n"
        "    time.sleep(0.05)\n"
        "@pytest.mark.parametrize('i', range(8))\n"
        "def test_free(i):\n"
        "    time.sleep(0.05)\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q",
         "-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {p.read_text() for p in seen.iterdir()}
    assert len(list(seen.iterdir())) == 8
    assert len(workers) == 1, f"the group ran on {sorted(workers)}"
