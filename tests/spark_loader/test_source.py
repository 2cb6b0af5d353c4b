"""``format("percolator")``, the Python data source, on real Spark (``local[2]``) and
SQLite files: found without registration, one snapshot across partitions under
concurrent bank transfers, row-key filters pushed down (and right whether pushdown is
on or off), typed values, the snapshot-too-old error raised while planning, and bad
options refused with a clear message."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator._gc import collect
from percolator._internals import internals
from percolator._store import Read
from tests._concurrency import hold_locks
from tests.spark_loader._stream_batches import (
    assert_every_row_once,
    kill_when_parked,
    write_batch_files,
)

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def _read(spark: Any, url: str, table: str, **options: Any) -> Any:
    reader = spark.read.format("percolator").option("url", url).option("table", table)
    schema = options.pop("schema", None)
    if schema is not None:
        reader = reader.schema(schema)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@contextlib.contextmanager
def _pushdown(spark: Any, on: bool) -> Iterator[None]:
    before = spark.conf.get(PUSHDOWN)
    spark.conf.set(PUSHDOWN, "true" if on else "false")
    try:
        yield
    finally:
        spark.conf.set(PUSHDOWN, before)


@pytest.fixture(params=["classic", "connect"])
def session(request: pytest.FixtureRequest) -> Any:
    """The session-wide classic SparkSession, then the Spark Connect one."""
    return request.getfixturevalue("spark" if request.param == "classic" else "spark_connect")


def test_found_without_registration_and_registered(session: Any, tmp_path: Path) -> None:
    """``format("percolator")`` works as soon as the package is installed (Spark finds
    ``pyspark_percolator.DefaultSource``), and ``spark.dataSource.register`` of the class
    works too; values read as bytes by default."""
    url = f"sqlite://{tmp_path}/t.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            for i in range(5):
                txn.set("t", b"r%d" % i, "f:v", b"v%d" % i)
    want = {(b"r%d" % i, b"v%d" % i) for i in range(5)}
    df = _read(session, url, "t", columns="f:v")
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("row", "binary"), ("f:v", "binary")]
    assert {(bytes(r[0]), bytes(r[1])) for r in df.collect()} == want
    from pyspark_percolator import DefaultSource

    session.dataSource.register(DefaultSource)
    again = session.read.format("percolator").option("cluster", url).option("columns", "f:v")
    assert {(bytes(r[0]), bytes(r[1])) for r in again.load("t").collect()} == want


def test_typed_schema_reads_values_as_the_loader_writes_them(session: Any, tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/typed.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"a", "c:s", "é".encode())
            txn.set("t", b"a", "c:n", b"42")
            txn.set("t", b"a", "c:x", b"2.5")
            txn.set("t", b"a", "c:b", b"true")
            txn.set("t", b"b", "c:n", b"-7")
            txn.set("t", b"c", "d:n", b"seven")
    df = _read(session, url, "t", schema="row string, `c:s` string, `c:n` long, "
               "`c:x` double, `c:b` boolean")
    assert sorted(tuple(r) for r in df.collect()) == [
        ("a", "é", 42, 2.5, True), ("b", None, -7, None, None)]
    bad = _read(session, url, "t", schema="row binary, `d:n` long")
    with pytest.raises(Exception, match=r"row b'c', column d:n: value b'seven' does not read"):
        bad.collect()


def test_a_partition_longer_than_an_arrow_batch_reads_every_row(
    spark: Any, tmp_path: Path
) -> None:
    """The reader hands Spark Arrow record batches of ARROW_BATCH_ROWS rows: one
    partition of two and a half batches reads every row once, in key order, typed; a
    timestamp field (read row by row: Arrow would take a naive time as UTC) too."""
    from spark_loader._batch_read import ARROW_BATCH_ROWS

    url = f"sqlite://{tmp_path}/long.db"
    n = ARROW_BATCH_ROWS * 5 // 2
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            for i in range(n):
                txn.set("t", b"r%06d" % i, "c:n", b"%d" % i)
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"r000001", "c:t", b"2026-11-26T10:00:00")
    got = _read(spark, url, "t", schema="row string, `c:n` long",
                numPartitions=1).collect()
    assert [tuple(r) for r in got] == [(f"r{i:06d}", i) for i in range(n)]
    timed = _read(spark, url, "t", schema="row string, `c:t` timestamp",
                  numPartitions=1).collect()
    assert [(r[0], str(r[1])) for r in timed] == [("r000001", "2026-11-26 10:00:00")]


# --- one snapshot, under concurrent writers -------------------------------------------------


def test_every_partition_reads_at_one_snapshot_under_bank_transfers(
    spark: Any, tmp_path: Path
) -> None:
    """Transfers run in three processes while the accounts are read cut into one
    partition per account: every read sums to the invariant total (a partition
    drawing its own timestamp would see transfers half applied), and a read at a
    ``startTs`` drawn earlier gives the balances of then although they changed."""
    accounts, initial = 16, 1000
    url = f"sqlite://{tmp_path}/bank.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("accounts")
        cluster.create_table("transfers")
        with percolator.Transaction(cluster) as txn:
            for i in range(accounts):
                txn.set("accounts", b"acct%03d" % i, "bal:v", str(initial).encode())
    log = tmp_path / "committed.log"
    workers = [subprocess.Popen([sys.executable, "-m", "tests.transactions._bank_worker", url,
                                 str(accounts), str(seed), str(log)], cwd=ROOT)
               for seed in (1, 2, 3)]
    schema = "row string, `bal:v` long"
    try:
        while not log.exists() or log.stat().st_size == 0:
            assert all(w.poll() is None for w in workers)
            time.sleep(0.05)
        from pyspark_percolator import snapshot_ts

        ts = snapshot_ts(url)
        then = {r[0]: r[1] for r in _read(spark, url, "accounts", schema=schema,
                                          startTs=ts).collect()}
        for _ in range(3):
            df = _read(spark, url, "accounts", schema=schema, numPartitions=accounts)
            assert df.rdd.getNumPartitions() == accounts
            rows = df.collect()
            assert len(rows) == accounts
            assert sum(r[1] for r in rows) == accounts * initial
        acknowledged = log.stat().st_size
        while log.stat().st_size == acknowledged:
            time.sleep(0.05)
        again = _read(spark, url, "accounts", schema=schema, startTs=ts, numPartitions=3)
        assert {r[0]: r[1] for r in again.collect()} == then
        assert sum(then.values()) == accounts * initial
        now = _read(spark, url, "accounts", schema=schema).collect()
        assert {r[0]: r[1] for r in now} != then
    finally:
        for w in workers:
            w.kill()
            w.wait()


# --- pushdown ---------------------------------------------------------------------------------

KEYS = ["a", "r1", "r1\x00", "r10", "r19", "r1\xff", "r2", "r20", "s"]
FILTERS = [
    ("row = 'r1'", lambda k: k == "r1"),
    ("row in ('r10', 'r2', 'zz')", lambda k: k in ("r10", "r2", "zz")),
    ("row > 'r1'", lambda k: k > "r1"),
    ("row >= 'r1' and row < 'r2'", lambda k: "r1" <= k < "r2"),
    ("row <= 'r10'", lambda k: k <= "r10"),
    ("row like 'r1%'", lambda k: k.startswith("r1")),
    ("row like 'r1%' and row <> 'r10'", lambda k: k.startswith("r1") and k != "r10"),
]


@pytest.mark.parametrize("pushdown", [True, False])
def test_row_key_filters_give_the_same_rows_with_and_without_pushdown(
    spark: Any, tmp_path: Path, pushdown: bool
) -> None:
    url = f"sqlite://{tmp_path}/keys.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            for k in KEYS:
                txn.set("t", k.encode(), "f:v", b"x")
    with _pushdown(spark, pushdown):
        for where, keep in FILTERS:
            df = _read(spark, url, "t", schema="row string, `f:v` binary", numPartitions=3)
            got = sorted(r[0] for r in df.where(where).collect())
            assert got == sorted(k for k in KEYS if keep(k)), where


def test_pushed_down_filters_do_not_read_other_rows(spark: Any, tmp_path: Path) -> None:
    """A live writer holds locks on rows ``z*``: a read of ``row < 'm'``, ``row = 'b'``
    or ``row like 'a%'`` never meets them when pushed down (a read of the whole table
    waits the lock wait, then fails)."""
    url = f"sqlite://{tmp_path}/live.db"
    # A long lock ttl: the lock must stay live however slow the Spark jobs are.
    with percolator.connect(url, lock_ttl=3600) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            for k in (b"a1", b"a2", b"b", b"z1", b"z2"):
                txn.set("t", k, "f:v", b"old")
        held = percolator.Transaction(cluster)
        held.set("t", b"z1", "f:v", b"new")
        hold_locks(held)

        def df() -> Any:  # a new DataFrame per query: see docs/spark.md on Spark 4.3's reuse
            return _read(spark, url, "t", schema="row string, `f:v` string", lockWait="0.5")

        with _pushdown(spark, True):
            assert sorted(r[0] for r in df().where("row < 'm'").collect()) == ["a1", "a2", "b"]
            assert [tuple(r) for r in df().where("row = 'b'").collect()] == [("b", "old")]
            assert sorted(r[0] for r in df().where("row like 'a%'").collect()) == ["a1", "a2"]
            with pytest.raises(Exception, match="LockedError"):
                df().collect()


# --- errors -----------------------------------------------------------------------------------


def test_a_snapshot_below_the_gc_safe_point_fails_while_planning(
    spark: Any, tmp_path: Path
) -> None:
    """The error names the read's timestamp and the safe point, and comes from the
    driver's planning (Spark's "Failed to generate Python data source read
    partitions"), before any task runs."""
    url = f"sqlite://{tmp_path}/gc.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"r", "f:v", b"1")
        old = internals(cluster).timestamps.get_timestamp()
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"r", "f:v", b"2")
        summary = collect(cluster, retention=0)
        assert summary.safe_point > old
    with pytest.raises(Exception) as caught:
        _read(spark, url, "t", columns="f:v", startTs=str(old)).collect()
    text = str(caught.value)
    assert "Failed to generate Python data source read partitions" in text
    assert f"snapshot {old} is too old" in text  # the read is a Snapshot
    assert f"safe point is {summary.safe_point}" in text


@pytest.mark.parametrize(("options", "message"), [
    ({"table": "t", "columns": "f:v"}, "option url .* is required"),
    ({"url": "URL", "columns": "f:v"}, "option table is required"),
    ({"url": "URL", "table": "t", "columns": "f:v", "colums": "x"},
     r"unknown option\(s\) \['colums'\]"),
    ({"url": "URL", "table": "t", "columns": "fv"}, "bad column name 'fv'"),
    ({"url": "URL", "table": "t", "columns": "f:v", "startTs": "soon"},
     "option startts must be an integer"),
    ({"url": "URL", "table": "t"}, "name the columns to read"),
    ({"url": "URL", "table": "nope", "columns": "f:v"}, "nope"),
])
def test_bad_options_are_refused_with_a_clear_message(
    spark: Any, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    url = f"sqlite://{tmp_path}/o.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
    reader = spark.read.format("percolator")
    for key, value in options.items():
        reader = reader.option(key, value.replace("URL", url))
    with pytest.raises(Exception, match=message):
        reader.load().collect()


# --- batch write --------------------------------------------------------------------------------


def _people(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(rows, "row string, `p:name` string, `p:age` long, "
                                       "`p:blob` binary")


def test_append_writes_the_dataframe_and_sends_malformed_rows_to_rejects(
    session: Any, tmp_path: Path
) -> None:
    """Every good row reads back typed as written; a row without a key is a reject
    with the reason in the rejects file, the rest commit (no maxRejects)."""
    url = f"sqlite://{tmp_path}/w.db"
    rows = [("ann", "Ann", 31, b"\x00\xff"), ("bob", "Bob", None, None),
            (None, "Nobody", 1, None), ("cy", "Cy", -4, b"")]
    rejects = tmp_path / "rejects.jsonl"
    (_people(session, rows).repartition(2).write.format("percolator").mode("append")
     .option("url", url).option("table", "people").option("rejectsPath", str(rejects))
     .save())
    back = _read(session, url, "people", schema="row string, `p:name` string, `p:age` long, "
                                               "`p:blob` binary")
    assert sorted(tuple(r) for r in back.collect()) == [
        ("ann", "Ann", 31, b"\x00\xff"), ("bob", "Bob", None, None), ("cy", "Cy", -4, b"")]
    lines = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert [r["reason"] for r in lines] == ["missing row key field 'row'"]
    assert json.loads(lines[0]["line"])["p:name"] == "Nobody"


def test_a_write_over_max_rejects_leaves_nothing_visible(spark: Any, tmp_path: Path) -> None:
    """The good rows were prewritten by their tasks, but the load is rolled back at
    its primary: a read sees none of them (and is not blocked by their locks)."""
    url = f"sqlite://{tmp_path}/all.db"
    rows = [(f"k{i}", f"n{i}", i, None) for i in range(20)] + [(None, "bad", 0, None)]
    writer = (_people(spark, rows).repartition(3).write.format("percolator").mode("append")
              .option("url", url).option("table", "people").option("maxRejects", "0"))
    with pytest.raises(Exception, match=r"nothing of it is visible: 1 rejects, more than "
                                        r"maxRejects 0; first: missing row key field"):
        writer.save()
    assert _read(spark, url, "people", columns="p:name,p:age", lockWait="1").count() == 0


def test_a_rerun_with_the_same_load_id_writes_nothing(session: Any, tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/rerun.db"

    def write(rows: list[tuple[Any, ...]]) -> None:
        (_people(session, rows).write.format("percolator").mode("append").option("url", url)
         .option("table", "people").option("loadId", "nightly-2026-11-26").save())

    write([("ann", "Ann", 31, None)])
    with percolator.connect(url) as cluster, percolator.Transaction(cluster) as txn:
        txn.set("people", b"ann", "p:name", b"Ann B.")  # changed since the load
    write([("ann", "Ann", 31, None), ("zed", "Zed", 1, None)])
    back = _read(session, url, "people", schema="row string, `p:name` string")
    assert sorted(tuple(r) for r in back.collect()) == [("ann", "Ann B.")]


def test_overwrite_is_refused_with_the_reason(spark: Any, tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/o.db"
    writer = (_people(spark, [("a", "A", 1, None)]).write.format("percolator")
              .mode("overwrite").option("url", url).option("table", "people"))
    with pytest.raises(Exception, match=r"mode overwrite is refused: .* use mode\(\"append\"\)"):
        writer.save()


# --- streaming write, exactly once -------------------------------------------------------------


# 1-2 min of one streaming query in the session (54 s at load 15 after the session's
# start): scripts/test --run-slow. Its Spark-free part runs by default:
# tests/spark_loader/test_stream_write.py (CONTRIBUTING.md).
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_spark_stream_writes_each_micro_batch_as_one_load(spark: Any, tmp_path: Path) -> None:
    """Two files, a micro-batch each, through writeStream in the session's Spark: the
    writer's Spark half, which the Spark-free tests of tests/spark_loader/
    test_stream_write.py play without: each task reads its query run and batch from
    Spark's micro-batch properties (without them every write is refused), so each
    batch is one load of its own, committed once, and every row is in the table."""
    from tests.spark_loader._stream_driver import stream_into

    url = f"sqlite://{tmp_path}/s.db"
    source = tmp_path / "in"
    write_batch_files(source, 2)
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
    stream_into(spark, url, "t", str(source), str(tmp_path / "checkpoint"))
    assert_every_row_once(url, "t", 2)


def _stream(url: str, source: Path, checkpoint: Path, env: dict[str, str] | None = None
            ) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark_loader._stream_driver", url, "t", str(source),
         str(checkpoint)],
        cwd=ROOT, env={**os.environ, **(env or {})}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


# 4-18 min of Spark streaming here: scripts/test --run-slow. Its fast twin, run by
# default: test_stream_tasks_killed_mid_batch_and_replayed_write_every_row_once (CONTRIBUTING.md).
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_stream_killed_mid_batch_and_restarted_writes_every_row_once(tmp_path: Path) -> None:
    """Three files, one micro-batch each. The driver is killed -9 (with its JVM and
    workers) while a task of batch 1 holds its prewritten rows; the query restarted
    from its checkpoint replays batch 1 (rolling back the dead run's attempt), and
    is killed again right after the commit point of batch 2, before Spark records
    the batch done; the next restart replays batch 2, which finds its load committed
    and writes nothing. Every row is in the table and every cell has exactly one
    write record: no batch committed twice, none lost (the tests share their batches
    and checks: tests/spark_loader/_stream_batches.py; the Spark-cluster test runs
    the same query on a standalone cluster)."""
    url = f"sqlite://{tmp_path}/s.db"
    source, checkpoint, park = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "park"
    write_batch_files(source, 3)
    with percolator.connect(url) as cluster:
        cluster.create_table("t")

    def driver(env: dict[str, str]) -> subprocess.Popen[bytes]:
        return _stream(url, source, checkpoint, env)

    kill_when_parked(driver, park, "prewritten-1", 600)  # killed mid-batch 1
    with percolator.connect(url) as cluster:
        assert percolator.Snapshot(cluster).get("t", b"k0-0", "v:n") == b"0"  # batch 0 done
        assert percolator.Snapshot(cluster).get("t", b"k1-0", "v:n") is None
    # the replay of 1 commits; killed after committing batch 2
    kill_when_parked(driver, park, "committed-2", 600)
    with percolator.connect(url) as cluster:
        assert percolator.Snapshot(cluster).get("t", b"k2-0", "v:n") == b"200"
    for _ in range(2):  # Spark replays batch 2 (not recorded done), then has nothing to do
        again = _stream(url, source, checkpoint)
        out, _ = again.communicate(timeout=600)
        assert again.returncode == 0, out.decode()[-3000:]
    assert_every_row_once(url, "t", 3)


def test_stream_tasks_killed_mid_batch_and_replayed_write_every_row_once(
    tmp_path: Path,
) -> None:
    """The fast twin of the test above, run by default: the same micro-batches, kills
    and replays, with a driver process that plays the tasks and the commit of each
    batch through the writer (``tests/spark_loader/_stream_tasks.py``) instead of
    Spark's jobs, on the same parking points. Killed -9 while a task of batch 1 holds
    its prewritten rows; the next run replays batch 1 (rolling the dead run's attempt
    back) and is killed -9 after the commit of batch 2, before recording it done; the
    last run replays batch 2, which finds its load committed and writes nothing.
    Every row is in the table, every cell has one write record, and each batch is
    one load. What stays with the slow test is Spark's half: the micro-batch
    properties a task reads its run and batch from, and Spark's own replay."""
    url = f"sqlite://{tmp_path}/s.db"
    done, park = tmp_path / "done", tmp_path / "park"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")

    def driver(run: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark_loader._stream_tasks", url, "t", str(done),
             run, "3"], cwd=ROOT, env={**os.environ, **(env or {})}, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    kill_when_parked(lambda env: driver("run1", env), park, "prewritten-1", 120)
    with percolator.connect(url) as cluster:  # batch 0 done; killed mid-batch 1
        assert percolator.Snapshot(cluster).get("t", b"k0-0", "v:n") == b"0"
        assert percolator.Snapshot(cluster).get("t", b"k1-0", "v:n") is None
    # replays 1; killed after committing 2
    kill_when_parked(lambda env: driver("run2", env), park, "committed-2", 120)
    assert done.read_text().split() == ["0", "1"]  # batch 2 not recorded done
    last = driver("run3")
    out, _ = last.communicate(timeout=120)
    assert last.returncode == 0, out.decode()[-3000:]
    assert_every_row_once(url, "t", 3)


# --- streaming read: the change feed -----------------------------------------------------------


def _feed(url: str, output: Path, checkpoint: Path, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark_loader._feed_driver", url, "accounts", str(output),
         str(checkpoint), mode],
        cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


SPARK_SLOW_START = "Python worker failed to connect back"
"""Spark gives the Python worker of a streaming source 10 s to start (hard-coded in
PythonWorkerFactory); on a loaded machine it may not, and the query fails before it
reads anything: such a run is restarted like a killed one."""


def _check_exit(driver: subprocess.Popen[bytes]) -> int:
    """The exit status of a finished feed driver: 0, killed, or a slow start of
    Spark's; any other failure fails the test with the driver's output."""
    out = driver.communicate()[0].decode()
    assert driver.returncode in (0, -signal.SIGKILL) or SPARK_SLOW_START in out, out[-3000:]
    return driver.returncode


def _batches_written(output: Path) -> int:
    log = output / "_spark_metadata"
    return len([p for p in log.iterdir() if p.name.isdigit()]) if log.is_dir() else 0


def _committed_cells(url: str, table: str) -> list[tuple[bytes, str, int]]:
    """Every committed (row, column, commit_ts) of *table*, from its write records."""
    with percolator.connect(url) as cluster:
        return sorted((row, name[2:], ts)
                      for row, cells in internals(cluster).store.scan(table, None, None,
                                                           [Read("w", versions=None)])
                      for name, versions in cells.items()
                      for ts, record in versions if record[:1] != b"R")


# 4-18 min of Spark streaming here: scripts/test --run-slow. Its fast twin, run by
# default: test_the_change_feed_batches_deliver_every_commit_once_across_kills (CONTRIBUTING.md).
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_change_feed_delivers_every_commit_once_across_kills_and_restarts(
    spark: Any, tmp_path: Path
) -> None:
    """Bank transfers commit in three processes the whole time. The change feed of the
    accounts table runs into Parquet (an exactly-once sink), is killed -9 with its JVM
    after some micro-batches, restarted from its checkpoint, killed again; then the
    writers stop and a last run (availableNow) catches up. Every committed cell of the
    table is in the output exactly once, with its value: no batch skipped a commit, or
    delivered one twice, across the restarts."""
    accounts, initial = 8, 1000
    url = f"sqlite://{tmp_path}/bank.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("accounts")
        cluster.create_table("transfers")
        with percolator.Transaction(cluster) as txn:
            for i in range(accounts):
                txn.set("accounts", b"acct%03d" % i, "bal:v", str(initial).encode())
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    log = tmp_path / "committed.log"
    workers = [subprocess.Popen([sys.executable, "-m", "tests.transactions._bank_worker", url,
                                 str(accounts), str(seed), str(log)], cwd=ROOT)
               for seed in (1, 2, 3)]
    try:
        kills = 0
        for _ in range(8):  # a run Spark itself ends (see _run_feed) is restarted too
            if kills == 2:
                break
            driver = _feed(url, output, checkpoint, "processingTime")
            try:
                wanted = _batches_written(output) + 3
                deadline = time.monotonic() + 600
                while _batches_written(output) < wanted and driver.poll() is None:
                    assert all(w.poll() is None for w in workers)
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
                kills += driver.poll() is None
            finally:
                os.killpg(driver.pid, signal.SIGKILL)
                _check_exit(driver)
        assert kills == 2
    finally:
        for w in workers:
            w.kill()
            w.wait()
    for _ in range(3):
        last = _feed(url, output, checkpoint, "availableNow")
        last.wait(timeout=600)
        if _check_exit(last) == 0:
            break
    assert last.returncode == 0
    got = spark.read.parquet(str(output)).collect()
    delivered = sorted((bytes(r["row"]), r["column"], r["commit_ts"]) for r in got)
    committed = _committed_cells(url, "accounts")
    assert len(committed) > accounts * 10  # the writers were busy meanwhile
    assert delivered == committed
    with percolator.connect(url) as cluster:
        final = {r: v["bal:v"] for r, v in percolator.Snapshot(cluster).scan("accounts")}
    newest = {}
    for r in sorted(got, key=lambda r: r["commit_ts"]):
        newest[bytes(r["row"])] = bytes(r["value"])
    assert newest == final


def test_the_change_feed_batches_deliver_every_commit_once_across_kills(
    tmp_path: Path,
) -> None:
    """The fast twin of the test above, run by default: the change feed's own code
    (``PercolatorChangeFeed``: latestOffset, partitions, read) driven batch by batch
    as Spark's micro-batch loop drives it, without Spark's jobs, while bank transfers
    commit in two writer processes (in two phases: each commit leaves a window between
    its commit timestamp and its write records). One writer is killed -9 (its locks left behind
    for the feed's safe end to resolve) and started again; every third batch the feed
    object is thrown away and a new one goes on from the offset, as a restarted query
    from its checkpoint, after reading again a batch whose output it lost (the same
    ends: the same records). Then the writers are killed and an availableNow run
    catches up. Every committed cell of the table is delivered exactly once."""
    from spark_loader._change_feed import _ts_of
    from spark_loader._source import PercolatorDataSource

    accounts = 6
    url = f"sqlite://{tmp_path}/bank.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("accounts")
        cluster.create_table("transfers")
        with percolator.Transaction(cluster) as txn:
            for i in range(accounts):
                txn.set("accounts", b"acct%03d" % i, "bal:v", b"1000")
    source = PercolatorDataSource({"url": url, "table": "accounts", "readChangeFeed": "true",
                                   "startingTs": "earliest", "numPartitions": "2"})
    log = tmp_path / "committed.log"

    def writer(seed: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "tests.transactions._bank_worker", url,
                                 str(accounts), str(seed), str(log), "two-phase"], cwd=ROOT)

    def committed() -> int:
        return len(log.read_bytes().split()) if log.exists() else 0

    feed = source.streamReader(source.schema())
    offset = feed.initialOffset()
    delivered: list[tuple[bytes, str, int]] = []

    def batch() -> bool:
        nonlocal offset
        end = feed.latestOffset(offset, None)
        got = [(bytes(r[0]), r[1], r[3]) for part in feed.partitions(offset, end)
               for r in feed.read(part)]
        delivered.extend(got)
        moved = end != offset
        offset = end
        return moved

    writers = [writer(1), writer(2)]
    try:
        for step in range(1, 400):
            if step == 4 or step % 3 == 0:
                # a restart: the batch's output lost, the batch read again by a new feed
                end = feed.latestOffset(offset, None)
                lost = [tuple(r) for part in feed.partitions(offset, end)
                        for r in feed.read(part)]
                feed = source.streamReader(source.schema())
                assert [tuple(r) for part in feed.partitions(offset, end)
                        for r in feed.read(part)] == lost
            batch()
            if step == 4:
                os.kill(writers[0].pid, signal.SIGKILL)  # mid-transfer, most likely
                writers[0].wait()
                writers[0] = writer(3)
            if step > 8 and committed() > 40:
                break
            time.sleep(0.02)
    finally:
        for w in writers:
            w.kill()
            w.wait()
    assert committed() > 40  # the writers were busy meanwhile
    feed = source.streamReader(source.schema())
    feed.prepareForTriggerAvailableNow()
    assert feed.target is not None
    for _ in range(100):  # the killed writers' locks resolved, batches reach the target
        batch()
        if _ts_of(offset) >= feed.target:
            break
    assert _ts_of(offset) == feed.target
    assert sorted(delivered) == _committed_cells(url, "accounts")


# 4-18 min of Spark streaming here: scripts/test --run-slow. Its fast twin, run by
# default: test_micro_batches_written_then_read_back_through_the_change_feed (CONTRIBUTING.md).
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_stream_written_then_read_back_through_the_change_feed(
    session: Any, tmp_path: Path
) -> None:
    """In the session (classic and Spark Connect): JSON files -> writeStream.format(
    "percolator") -> the table; its change feed (readStream, availableNow) ->
    Parquet: every written cell once, at the commit timestamp of its micro-batch's
    transaction, string-typed as the schema asks; a second availableNow run of the
    feed from its checkpoint adds only a later commit."""
    url = f"sqlite://{tmp_path}/rt.db"
    source = tmp_path / "in"
    source.mkdir()
    for batch in range(2):
        with open(source / f"f{batch}.json", "w") as f:
            f.writelines(json.dumps({"row": f"k{batch}-{i}", "v:n": batch * 10 + i}) + "\n"
                         for i in range(5))
        os.utime(source / f"f{batch}.json", (batch + 1, batch + 1))
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
    rows = (session.readStream.schema("row string, `v:n` long").option("maxFilesPerTrigger", 1)
            .json(str(source)))
    (rows.writeStream.format("percolator").option("url", url).option("table", "t")
     .option("checkpointLocation", str(tmp_path / "cp-write")).trigger(availableNow=True)
     .start().awaitTermination())
    output = tmp_path / "feed"

    def feed() -> list[tuple[str, str, str, int]]:
        for attempt in range(3):  # a run failing on Spark's slow start is run again
            try:
                (session.readStream.format("percolator").option("url", url)
                 .option("table", "t").option("readChangeFeed", "true")
                 .option("startingTs", "earliest")
                 .schema("row string, column string, value string, commit_ts long").load()
                 .writeStream.format("parquet")
                 .option("checkpointLocation", str(tmp_path / "cp-feed"))
                 .trigger(availableNow=True).start(str(output)).awaitTermination())
                break
            except Exception as e:
                if SPARK_SLOW_START not in str(e) or attempt == 2:
                    raise
        found = [tuple(r) for r in session.read.parquet(str(output)).collect()]
        return sorted(found, key=lambda r: (r[0], r[1], r[3]))

    got = feed()
    assert [(r, c, v) for r, c, v, _ in got] == sorted(
        (f"k{b}-{i}", "v:n", str(b * 10 + i)) for b in range(2) for i in range(5))
    assert len({ts for *_, ts in got}) == 2  # one transaction per micro-batch
    with percolator.connect(url) as cluster, percolator.Transaction(cluster) as txn:
        txn.delete("t", b"k0-0", "v:n")
    again = feed()
    added = [r for r in again if r not in got]
    assert len(again) == len(got) + 1 and [(r, c, v) for r, c, v, _ in added] == [
        ("k0-0", "v:n", None)]
