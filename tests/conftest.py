from __future__ import annotations

import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Fixture modules of the real services; each helper module owns one service.
pytest_plugins: list[str] = [
    "tests._backends",
    "tests._bigtable",
    "tests._zookeeper",
    "tests._hbase",
    "tests._spark",
    "tests._wheel",
]

# The JVMs the suite starts (HBase and its Thrift servers, the region administrator,
# Spark's driver) compile with C1 only: they live minutes, and C2's compilations were
# half their CPU. A standalone HBase with both Thrift servers: 33 s of CPU to ready and
# 50 s for 1,800 transactions and 24 DDLs, against 16 s and 22 s with C1 only.
# Production and bench/ leave it unset (tests/_hbase_local.py, jvm_options).
os.environ.setdefault("PERCOLATOR_JVM_OPTS", "-XX:TieredStopAtLevel=1")
# The same for the Spark drivers of the tests' own processes (the stream and change-feed
# drivers, killed and started again, each start a JVM): pyspark reads its spark-submit
# arguments from here. A Spark session at load 13 answered in 11 s instead of 37, and
# ran 50 small queries in 34 s instead of 73 (2026-11-28).
if os.environ["PERCOLATOR_JVM_OPTS"]:
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", shlex.join([
        "--driver-java-options", os.environ["PERCOLATOR_JVM_OPTS"], "pyspark-shell"]))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

settings.register_profile(
    "ci",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run soak tests marked slow")


def _xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands the tests to pytest-xdist workers (``-n N``)."""
    return not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    # The workers inherit this environment: where they publish the services they share
    # (tests/_services.py), and whose death stops those services.
    if _xdist_controller(config):
        from tests._services import CONTROLLER_ENV, SHARED_ENV

        os.environ[SHARED_ENV] = tempfile.mkdtemp(prefix="percolator-shared-")
        os.environ[CONTROLLER_ENV] = str(os.getpid())


def pytest_unconfigure(config: pytest.Config) -> None:
    # Also after ^C: the workers are gone by now, the services they shared are not.
    if _xdist_controller(config):
        from tests._services import SHARED_ENV, stop_shared_services

        if SHARED_ENV in os.environ:
            stop_shared_services(Path(os.environ.pop(SHARED_ENV)))


_STARTED = time.monotonic()
_WORKERS: dict[str, dict[str, float]] = {}
"""Per pytest-xdist worker (on the controller): seconds of tests run, tests, and when
its last test ended, for the summary that shows which worker the suite waited for."""
_WORKER_GROUPS: dict[str, set[str]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # set by xdist on the controller's copy
    if node is None:
        return
    worker = str(node.gateway.id)
    seen = _WORKERS.setdefault(worker, {"busy": 0.0, "tests": 0, "last": 0.0})
    seen["busy"] += report.duration
    seen["last"] = time.monotonic() - _STARTED
    if report.when == "call":
        seen["tests"] += 1
    for name, value in report.user_properties:
        if name == "xdist_group":
            _WORKER_GROUPS.setdefault(worker, set()).add(str(value))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _WORKERS:
        return
    # The suite lasts as long as its busiest worker: CONTRIBUTING.md, "Test suite time".
    terminalreporter.section("time per xdist worker")
    for worker, seen in sorted(_WORKERS.items(), key=lambda kv: -kv[1]["last"]):
        groups = ", ".join(sorted(_WORKER_GROUPS.get(worker, ()))) or "none"
        terminalreporter.write_line(
            f"{worker}: last test ended at {seen['last']:.0f} s; {seen['busy']:.0f} s in "
            f"{seen['tests']:.0f} tests; groups: {groups}")


GROUPS = {
    # One worker runs the tests of each: its module-scoped HBase, which they kill -9,
    # is started once, not once per worker (and not beside a dozen others).
    "tests/hbase/test_hbase_real_faults.py": "hbase-real-faults",
    # Its multi-server HBase (five JVMs) is started once, by one worker, for the module.
    "tests/hbase/test_hbase_multi_server.py": "hbase-multi-server",
    # Module fixtures that start servers: spread over workers, each worker that ran
    # one of their tests started its own (a TLS Thrift2 JVM; ZooKeeper, oracles and
    # network namespaces).
    "tests/hbase/test_hbase_thrift2_tls.py": "hbase-thrift2-tls",
    "tests/faults/test_must_hold.py": "faults-must-hold",
}
"""Files whose tests ``--dist loadgroup`` keeps on one xdist worker, and the group."""


def _uses_spark_session(item: pytest.Item) -> bool:
    """Whether the test runs Spark in its worker (the session-wide SparkSession or Spark
    Connect client, directly or through ``session``); the other Spark tests start their
    drivers in processes of their own, or use no Spark at all."""
    return bool({"spark", "spark_connect", "session"} & set(getattr(item, "fixturenames", ())))


def _uses_spark_connect(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    fixtures = getattr(item, "fixturenames", ())
    return "spark_connect" in fixtures or params.get("session") == "connect"


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = GROUPS.get(os.path.relpath(item.path, ROOT))
        if group is None and "spark" in item.keywords and _uses_spark_session(item):
            # A SparkSession lives in its worker: the classic tests share one worker's,
            # the Spark Connect ones (a server JVM and a thin client) run on another.
            # Tests whose Spark runs in processes of their own (the stream and
            # change-feed drivers, local workers, examples) spread over every worker.
            group = "spark-connect" if _uses_spark_connect(item) else "spark"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            item.user_properties.append(("xdist_group", group))  # for the worker summary
    # The cluster stores always commit in two phases (a lock-free one-phase commit is
    # unsafe there: tests/transactions/test_one_phase_cluster.py), so a one-phase
    # variant on them would run the two-phase one again, at HBase's DDL prices.
    same = pytest.mark.skip(reason="the cluster stores commit in two phases only: this is "
                            "the two-phase variant again")
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("one_phase") is True and params.get("backend") in (
                "hbase", "hbase-thrift1", "bigtable"):
            item.add_marker(same)
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --run-slow (or its bench/ script)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
