"""A session-wide local Spark (``local[2]``) for the loader tests (DESIGN.md §3)."""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests._services import service_missing


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A ``SparkSession`` on ``local[2]`` with the UI off, shared by the session."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        service_missing("PySpark is not installed: pip install 'percolator-txn[spark]'")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        service_missing("Java is not installed (PySpark needs a JDK 17): apt-get install "
                        "openjdk-17-jre-headless")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pyspark's version checks of pandas and friends
        session = (
            SparkSession.builder.master("local[2]")
            .appName("percolator-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.driver.memory", "1g")
            .config("spark.python.worker.reuse", "true")
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
