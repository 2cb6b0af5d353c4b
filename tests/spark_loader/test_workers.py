"""Spark's Python workers that cannot import the package: read_table and the loader
fail on the driver, before any job of theirs, naming the workers' interpreter, what
it lacks and the fix. Real Spark (local mode) whose workers run a bare virtualenv
that sees pyspark but not percolator."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import percolator

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys, warnings
    sys.path.insert(0, {root!r})   # this checkout, for the driver only (not PYTHONPATH)
    from pyspark.sql import SparkSession
    from spark_loader import load_dataframe, read_table
    import percolator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spark = (SparkSession.builder.master("local[1]")
                 .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    rows = spark.createDataFrame([("a", "1")], "k string, v string")
    for attempt in (lambda: read_table(spark, {url!r}, "t", ["f:v"]).collect(),
                    lambda: load_dataframe(rows, {url!r}, "t", "k", {{"v": "f:v"}})):
        try:
            attempt()
        except percolator.InvalidArgument as e:
            print("REFUSED:", e)
        else:
            print("NOT REFUSED")
    spark.stop()
""")


@pytest.mark.timeout(600)
def test_workers_without_the_package_are_refused_on_the_driver(tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    worker = venv / "bin" / "python"
    # pyspark and py4j, not percolator: a plain path line does not run the site
    # directory's own .pth files, among them the editable install's finder.
    (next(venv.glob("lib/python*/site-packages")) / "spark.pth").write_text(
        site.getsitepackages()[0] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env["PYSPARK_PYTHON"] = str(worker)  # what a session built in a script reads
    for module, status in (("pyspark", 0), ("percolator", 1)):
        assert subprocess.run([str(worker), "-c", f"import {module}"], cwd=tmp_path, env=env,
                              capture_output=True).returncode == status, module
    url = f"sqlite://{tmp_path}/w.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(root=str(ROOT), url=url)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 2, done.stdout[-3000:] + done.stderr[-6000:].replace("\r", "")
    for line in refused:
        assert f"Spark's Python workers run {worker}" in line
        assert "cannot import percolator (ModuleNotFoundError" in line
        assert f"PYSPARK_PYTHON={sys.executable}" in line
        assert "Install percolator-txn for that interpreter" in line
