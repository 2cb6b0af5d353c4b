"""How ``--dist loadgroup`` places the suite's tests (tests/conftest.py): the tests that
run Spark in their worker share one worker's session; those whose Spark runs in
processes of their own spread over every worker."""
from __future__ import annotations

import subprocess
import sys

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
    grouped = _grouped("tests/spark_loader/test_read.py", "tests/spark_loader/test_workers.py")
    # test_read's tests take the session's SparkSession; test_workers' start drivers of
    # their own in subprocesses.
    assert any(i.startswith("tests/spark_loader/test_read.py::") for i in grouped), grouped
    # its export command runs Spark in a process of its own
    assert ("tests/spark_loader/test_read.py::test_export_cli_jsonl_round_trip_with_a_"
            "foreign_python3_on_path") not in grouped
    assert not any(i.startswith("tests/spark_loader/test_workers.py::") for i in grouped)
