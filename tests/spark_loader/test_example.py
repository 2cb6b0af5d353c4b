"""examples/spark_pipeline.py, run as a user runs it: files -> writeStream.format(
"percolator") -> an observer -> the change feed -> Parquet. The script checks its own
output (every row once, uppercased) and exits 1 if it is wrong."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark_loader.test_source import SPARK_SLOW_START

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 1-4 min of two streaming queries here: scripts/test --run-slow
@pytest.mark.timeout(1200)
def test_the_spark_pipeline_example_runs_and_delivers_every_row_once(tmp_path: Path) -> None:
    for _ in range(2):  # a second run only after Spark's slow-start failure
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "spark_pipeline.py"), "--files", "2",
             "--rows", "7", "--keep", str(tmp_path / "work")],
            cwd=tmp_path, env=dict(os.environ),
            capture_output=True, text=True, timeout=1100)
        if SPARK_SLOW_START not in done.stdout + done.stderr:
            break
        (tmp_path / "work").rename(tmp_path / f"failed-start-{os.urandom(4).hex()}")
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-5000:]
    assert re.search(r"^warm-up file: 7 rows in the change feed's output [\d.]+ s after "
                     r"landing", out, re.M), out
    for f in (0, 1):
        assert re.search(rf"^file {f}: 7 rows in the change feed's output [\d.]+ s after "
                         r"landing$", out, re.M), out
    assert re.search(r"^21 e:upper changes in .*, each row once, uppercased; latency from "
                     r"landing over 2 files: median [\d.]+ s, max [\d.]+ s$", out, re.M), out
