"""Spark's Python workers that cannot import the package: read_table and the loader
fail on the driver, before any job of theirs, naming the workers' interpreter, what
it lacks and the fix; in local mode with no interpreter chosen, the workers run the
driver's and it just works. Real Spark (local mode), a bare virtualenv that sees
pyspark but not percolator as the workers' interpreter or as python3 on PATH. Both
in one driver process, one session after the other: its JVM starts once."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]

def _venv(where: Path, *paths: str) -> Path:
    """A virtualenv whose Python sees pyspark and py4j and *paths*, and no
    percolator of an installation: a plain path line does not run the site
    directory's own .pth files, among them an editable install's finder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    (next(where.glob("lib/python*/site-packages")) / "spark.pth").write_text(
        "".join(p + "\n" for p in (*paths, site.getsitepackages()[0])))
    return where / "bin" / "python"


def _bare_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def _imports(python: Path, env: dict[str, str], cwd: Path) -> dict[str, bool]:
    return {m: subprocess.run([str(python), "-c", f"import {m}"], cwd=cwd, env=env,
                              capture_output=True).returncode == 0
            for m in ("pyspark", "percolator")}


JUST_WORKS_THEN_REFUSED = textwrap.dedent("""
    import os, warnings
    from pyspark.sql import SparkSession
    import percolator
    import pyspark_percolator
    from spark_loader import load_dataframe, read_table

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spark = (SparkSession.builder.master("local[1]")
                 .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    # The source first: nothing of the library has run that could have set things up.
    pyspark_percolator.register(spark)
    (spark.createDataFrame([("a", "1")], "row string, `f:v` string").write
     .format("percolator").mode("append").option("url", {url!r}).option("table", "t").save())
    print("SOURCE", sorted(r["f:v"] for r in spark.read.format("percolator")
                          .option("url", {url!r}).option("columns", "f:v").load("t").collect()))
    rows = spark.createDataFrame([("b", "2")], "k string, v string")
    print("LOADED", load_dataframe(rows, {url!r}, "t", "k", {{"v": "f:v"}}).rows)
    print("READ", sorted(r["f:v"] for r in read_table(spark, {url!r}, "t", ["f:v"]).collect()))
    spark.stop()

    # Then a session whose workers run an interpreter without the package, as a script
    # started with PYSPARK_PYTHON set reads it (a new SparkContext of this process, in
    # the JVM the first one started: a second JVM would cost a minute of a loaded machine).
    os.environ["PYSPARK_PYTHON"] = {bare!r}
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
def test_local_workers_run_the_drivers_python_and_workers_without_the_package_are_refused(
    tmp_path: Path,
) -> None:
    """`app/bin/python script.py`, its virtualenv not on PATH, where `python3` (what
    Spark starts by default) lacks the package; nothing chooses the workers' Python.
    The library and a source registered with pyspark_percolator.register work: the
    workers run the driver's interpreter.

    Then the script's next session has PYSPARK_PYTHON name that bare interpreter:
    read_table and the loader fail on the driver, before any job of theirs, naming
    the workers' interpreter, what it lacks and the fix."""
    app = _venv(tmp_path / "app", str(ROOT))
    path_python = _venv(tmp_path / "bare")
    env = _bare_env()
    env["PATH"] = f"{path_python.parent}{os.pathsep}{env.get('PATH', '')}"
    assert _imports(app, env, tmp_path) == {"pyspark": True, "percolator": True}
    python3 = subprocess.run(["python3", "-c", "import sys; print(sys.prefix)"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
    assert python3 == str(tmp_path / "bare")
    assert _imports(Path("python3"), env, tmp_path) == {"pyspark": True, "percolator": False}
    url = f"sqlite://{tmp_path}/w.db"
    done = subprocess.run(
        [str(app), "-c", JUST_WORKS_THEN_REFUSED.format(url=url, bare=str(path_python))],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:].replace("\r", "")
    said = [line for line in done.stdout.splitlines() if line[:1].isupper()]
    assert said[:3] == ["SOURCE [b'1']", "LOADED 1", "READ [b'1', b'2']"], done.stdout
    refused = said[3:]
    assert len(refused) == 2 and all(line.startswith("REFUSED") for line in refused), said
    for line in refused:
        assert f"Spark's Python workers run {path_python}" in line
        assert "cannot import percolator (ModuleNotFoundError" in line
        assert f"PYSPARK_PYTHON={app}" in line
        assert "Install percolator-txn for that interpreter" in line
