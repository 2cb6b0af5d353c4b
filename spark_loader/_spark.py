"""Spark itself: what the loader and the reader ask of a session and of its Python
workers (PySpark importable, a classic session or Spark Connect, workers that can
import this package), and the clusters the workers' tasks use, one per process."""

from __future__ import annotations

import atexit
import os
import threading
from typing import TYPE_CHECKING, Any

import percolator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["check_workers", "executor_cluster", "is_connect", "local_workers_run_this_python",
           "require_classic", "require_pyspark"]


def require_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise percolator.InvalidArgument(
            "the bulk loader needs PySpark: pip install 'percolator-txn[spark]'"
        ) from None


_PROBE = """
def probe(_):
    import importlib, sys
    missing = []
    for name in ("percolator", "spark_loader"):
        try:
            importlib.import_module(name)
        except Exception as e:
            missing.append(f"{name} ({type(e).__name__}: {e})")
    yield sys.executable, sys.version.split()[0], missing
"""
"""What a worker is asked before a job: compiled outside any module of ours, so that
Spark's pickling sends it by value and a worker without the package can run it."""

_checked_apps: set[str] = set()


def is_connect(spark: object) -> bool:
    """Whether *spark* is a Spark Connect session (no sparkContext, no RDDs)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def require_classic(spark: object, what: str) -> None:
    """Refuse a Spark Connect session for *what*, which runs on RDDs."""
    if is_connect(spark):
        raise percolator.InvalidArgument(
            f"{what} needs a classic SparkSession (it runs on RDDs), got a Spark Connect "
            "session; there, write with df.write.format(\"percolator\").mode(\"append\")"
            ".option(\"url\", ...).option(\"table\", ...).option(\"loadId\", ...).save(), "
            "the same one-transaction load (see docs/spark.md)")


def local_workers_run_this_python(spark: SparkSession) -> bool:
    """In local mode, have Spark's Python workers run this interpreter, unless the
    user chose one (``PYSPARK_PYTHON``, ``spark.pyspark.python``); say whether it did.

    A session built in a script starts its workers with ``python3`` from PATH, which
    under cron, a unit file or ``venv/bin/python script.py`` is not the driver's
    interpreter and lacks the package. Local workers run on this machine and must be
    of the driver's Python version anyway, so this interpreter is the right one.
    PySpark reads ``sc.pythonExec`` each time it ships a Python function (RDD jobs,
    UDFs, ``spark.dataSource.register``); a data source Spark finds by its name is
    started by the JVM from its own environment, out of our reach.
    """
    import sys

    sc = spark.sparkContext
    if (not str(sc.master).startswith("local") or os.environ.get("PYSPARK_PYTHON")
            or sc.getConf().get("spark.pyspark.python")):
        return False
    sc.pythonExec = sys.executable
    return True


def check_workers(spark: SparkSession) -> None:
    """Fail fast, on the driver, when Spark's Python workers cannot import this
    package: run a one-task probe job (once per Spark application) and raise with the
    interpreter they run, what it could not import and the fix. Without it the first
    job fails with a ``ModuleNotFoundError`` deep in a Java stack trace. In local mode
    with no interpreter chosen, the workers run this one (see
    :func:`local_workers_run_this_python`) and the probe confirms it.

    :raises InvalidArgument: the workers' Python lacks ``percolator`` or ``spark_loader``.
    """
    local_workers_run_this_python(spark)
    sc = spark.sparkContext
    app = str(sc.applicationId)
    if app in _checked_apps:
        return
    namespace: dict[str, Any] = {"__name__": "percolator_worker_probe"}
    exec(compile(_PROBE, "<percolator worker probe>", "exec"), namespace)
    sc.setJobDescription("percolator: can the Python workers import percolator?")
    try:
        ((executable, version, missing),) = (
            sc.parallelize([0], 1).mapPartitions(namespace["probe"]).collect())
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
    if missing:
        import sys

        raise percolator.InvalidArgument(
            f"Spark's Python workers run {executable} (Python {version}), which cannot import "
            f"{' nor '.join(missing)}. Install percolator-txn for that interpreter (on every "
            "executor), or have Spark run one that has it: set PYSPARK_PYTHON in the "
            f"environment before the SparkSession starts (e.g. PYSPARK_PYTHON={sys.executable}"
            "; a session built in Python reads only that), or spark.pyspark.python with "
            "spark-submit; on a cluster, ship the package (spark-submit --py-files, or "
            "install it on the nodes)")
    _checked_apps.add(app)


# --- executors ---------------------------------------------------------------------------

_clusters: dict[tuple[str, tuple[tuple[str, Any], ...]], percolator.Cluster] = {}
_clusters_lock = threading.Lock()


def _close_clusters() -> None:
    for cluster in _clusters.values():
        cluster.close()
    _clusters.clear()


atexit.register(_close_clusters)


def executor_cluster(url: str, connect: tuple[tuple[str, Any], ...]) -> percolator.Cluster:
    """The cluster of this Python worker process for *url* and the ``connect`` options
    *connect* (``(name, value)`` pairs), connected at its first use and kept for the
    tasks that follow (Spark reuses its Python workers), closed when the process
    exits: what :func:`~spark_loader.read_table`'s tasks read through, for tasks of
    one's own."""
    key = (url, connect)
    with _clusters_lock:
        cluster = _clusters.get(key)
        if cluster is None or cluster.closed:
            cluster = percolator.connect(url, **dict(connect))
            _clusters[key] = cluster
        return cluster
