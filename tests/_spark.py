"""A session-wide local Spark (``local[2]``) for the loader tests (DESIGN.md §3)."""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests._services import in_ci, service_missing


def require_pyspark_module() -> None:
    """At the top of a test module that imports PySpark's data source classes but starts
    no Spark (no JVM): fails in CI and skips the module elsewhere without PySpark."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        reason = "PySpark is not installed: pip install 'percolator-txn[spark]'"
        if in_ci():
            pytest.fail(f"required service missing in CI: {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)


def require_spark() -> None:
    """PySpark and Java are here, or the test fails in CI and skips elsewhere."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        service_missing("PySpark is not installed: pip install 'percolator-txn[spark]'")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        service_missing("Java is not installed (PySpark needs a JDK 17): apt-get install "
                        "openjdk-17-jre-headless")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A ``SparkSession`` on ``local[2]`` with the UI off, shared by the session."""
    require_spark()
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


_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"
"""Set by pyspark in the process once a Spark Connect session is made; while it is set,
pyspark treats every session of the process as a Connect one (``is_remote()``), which
breaks the classic session the other tests share in the same worker."""


@pytest.fixture(autouse=True)
def _spark_api_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """Connect mode on for the tests that use the Spark Connect session, off for every
    other test of the process."""
    callspec = getattr(request.node, "callspec", None)
    connect = "spark_connect" in request.fixturenames or (
        callspec is not None and callspec.params.get("session") == "connect")
    if connect:
        os.environ[_CONNECT_MODE] = "1"
    else:
        os.environ.pop(_CONNECT_MODE, None)
    yield
    os.environ.pop(_CONNECT_MODE, None)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def spark_connect() -> Iterator[Any]:
    """A Spark Connect session (``SparkSession.builder.remote``) on a local Connect
    server (``local[2]``, tests/_spark_connect_server.py) started once per session.
    Skipped off CI when pyspark's Connect client or the server cannot start (with the
    reason); under CI=true that fails instead."""
    import collections
    import contextlib
    import subprocess
    import sys
    import threading
    import time
    from pathlib import Path

    try:
        import pyspark.sql.connect.session  # noqa: F401  (needs pandas, grpcio...)
    except ImportError as e:
        service_missing(f"Spark Connect's client cannot be imported ({e}): "
                        "pip install 'percolator-txn[spark]' (pyspark[connect])")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        service_missing("Java is not installed (Spark Connect's server needs a JDK 17)")
    root = Path(__file__).resolve().parents[1]
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests._spark_connect_server", str(port)], cwd=root,
        # Not in Connect mode itself (the autouse _spark_api_mode may have set it for
        # the test that asked first): it builds the classic session that serves.
        env={**{k: v for k, v in os.environ.items() if k != _CONNECT_MODE},
             "PYTHONPATH": str(root), "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert server.stdout is not None
        said = []
        for line in server.stdout:  # Spark's warnings, then "ready" (or its error and EOF)
            said.append(line.decode())
            if line.strip() == b"ready":
                break
        else:
            server.wait()
            service_missing(f"the Spark Connect server did not start: {''.join(said)[-2000:]}")
        tail: collections.deque[str] = collections.deque(said[-20:], maxlen=40)
        out = server.stdout

        def drain() -> None:  # never lets the server block on a full pipe
            for line in out:
                tail.append(line.decode(errors="replace"))

        threading.Thread(target=drain, daemon=True).start()
        from pyspark.sql import SparkSession

        deadline = time.monotonic() + 120
        while True:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    session = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").create()
                session.range(1).collect()
                break
            except Exception as e:  # the gRPC port may not answer yet
                if server.poll() is not None:
                    service_missing(f"the Spark Connect server exited ({server.returncode}) "
                                    f"after it was ready: {''.join(tail)[-2000:]}")
                if time.monotonic() > deadline:
                    service_missing(f"Spark Connect at port {port} did not answer: {e}; "
                                    f"its last lines: {''.join(tail)[-2000:]}")
                time.sleep(1)
        try:  # the mode stays on only while a test uses it (_spark_api_mode)
            yield session
        finally:
            os.environ[_CONNECT_MODE] = "1"
            session.stop()
            os.environ.pop(_CONNECT_MODE, None)
    finally:
        import signal

        with contextlib.suppress(ProcessLookupError):  # it may have died on its own
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
