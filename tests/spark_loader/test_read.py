"""``spark_loader.read_table`` and ``export`` on real Spark (``local[2]``) and real stores:
one snapshot across partitions under concurrent bank transfers, repeatable reads at a
given timestamp, locks of killed writers resolved, row-key ranges on every backend, the
export/load round trip, and bad input refused before Spark starts work."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import percolator
import spark_loader._spark
from percolator._encoding import Free, decode_lock
from percolator._internals import internals
from percolator._store import SPLIT_KEYS, Read, offered
from spark_loader import (
    ReadError,
    decode_columns,
    export_table,
    load_files,
    read_table,
    start_ts_of,
)
from spark_loader.__main__ import main
from tests._backends import BACKENDS, make_store_url, reports_split_keys
from tests._concurrency import hold_locks

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # pyspark on pandas 3
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
ACCOUNTS = 16
INITIAL = 1000


def _rows(df: Any) -> dict[bytes, tuple[bytes | None, ...]]:
    return {bytes(r[0]): tuple(None if v is None else bytes(v) for v in r[1:])
            for r in df.collect()}


# --- one snapshot, under concurrent writers ----------------------------------------------


def test_bank_total_holds_in_every_read_and_a_given_start_ts_repeats(
    spark: Any, tmp_path: Path
) -> None:
    """Bank transfers run in three other processes while ``read_table`` reads the
    accounts cut into one partition per account: every read sums to the invariant
    total (a reader drawing a timestamp per partition would see transfers half
    applied), and a read at the first read's ``start_ts`` gives exactly its rows
    although balances changed since."""
    url = f"sqlite://{tmp_path}/bank.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("accounts")
        cluster.create_table("transfers")
        with percolator.Transaction(cluster) as txn:
            for i in range(ACCOUNTS):
                txn.set("accounts", b"acct%03d" % i, "bal:v", str(INITIAL).encode())
    log = tmp_path / "committed.log"
    workers = [subprocess.Popen([sys.executable, "-m", "tests.transactions._bank_worker", url,
                                 str(ACCOUNTS), str(seed), str(log)], cwd=ROOT)
               for seed in (1, 2, 3)]
    splits = [b"acct%03d" % i for i in range(1, ACCOUNTS)]
    try:
        while not log.exists() or log.stat().st_size == 0:  # the writers are writing
            assert all(w.poll() is None for w in workers)
            time.sleep(0.05)
        first: dict[bytes, tuple[bytes | None, ...]] = {}
        first_ts = 0
        for attempt in range(2):
            df = read_table(spark, url, "accounts", ["bal:v"], splits=splits)
            assert df.rdd.getNumPartitions() == ACCOUNTS
            rows = _rows(df)
            assert len(rows) == ACCOUNTS
            assert sum(int(v[0] or b"0") for v in rows.values()) == ACCOUNTS * INITIAL
            if attempt == 0:
                first, first_ts = rows, start_ts_of(df)
        acknowledged = log.stat().st_size
        while log.stat().st_size == acknowledged:  # more transfers commit meanwhile
            time.sleep(0.05)
        again = read_table(spark, url, "accounts", ["bal:v"], start_ts=first_ts, splits=3)
        assert start_ts_of(again) == first_ts
        assert _rows(again) == first
        now = _rows(read_table(spark, url, "accounts", ["bal:v"], splits=3))
        assert now != first  # the writes did go on
    finally:
        for w in workers:
            w.kill()
            w.wait()


# --- locks of killed writers ---------------------------------------------------------------


_CRASHING_WRITER = """
import os, signal, sys
import percolator
from percolator._commit import CrashPoint, SimulatedCrash, commit_transaction
from percolator._encoding import Free, decode_lock
from percolator._store import Read
url, phase, value = sys.argv[1], sys.argv[2], sys.argv[3].encode()
cluster = percolator.connect(url)
txn = percolator.Transaction(cluster)
for i in range(10):
    txn.set("t", b"r%02d" % i, "f:v", value)
try:
    commit_transaction(txn, CrashPoint(phase, 5 if phase == "prewrite" else 0))
except SimulatedCrash:
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_locks_of_killed_writers_are_resolved(spark: Any, tmp_path: Path) -> None:
    """A writer killed during prewrite (locks, no commit) is rolled back and one killed
    right after its commit point is rolled forward, by the partitions that meet
    their locks: the DataFrame holds the old values of the first, the new of the
    second, and no lock is left."""
    url = f"sqlite://{tmp_path}/locks.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            for i in range(10):
                txn.set("t", b"r%02d" % i, "f:v", b"old")
        for phase, value in (("prewrite", "lost"), ("commit_point", "new")):
            done = subprocess.run([sys.executable, "-c", _CRASHING_WRITER, url, phase, value],
                                  cwd=ROOT, capture_output=True, timeout=60)
            assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
            assert not _all_free(cluster)  # the killed writer left locks
            df = read_table(spark, url, "t", ["f:v"], splits=[b"r03", b"r07"])
            want = b"old" if phase == "prewrite" else b"new"
            assert _rows(df) == {b"r%02d" % i: (want,) for i in range(10)}
            assert _all_free(cluster)


def _all_free(cluster: percolator.Cluster) -> bool:
    locks = internals(cluster).store.scan("t", None, None, [Read("l")])
    return all(isinstance(decode_lock(c["l:f:v"][0][1]), Free) for _, c in locks)


# --- partitions, export and load back, on every backend --------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_ranges_spread_rows_and_export_round_trip(
    spark: Any, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    url = make_store_url(backend, request, tmp_path)
    values = {b"k%04d" % i: (b"v%d" % i, b"\xff\x00%d" % i if i % 3 else None)
              for i in range(300)}
    with percolator.connect(url) as cluster:
        cluster.create_table("src")
        with percolator.Transaction(cluster) as txn:
            for row, (a, b) in values.items():
                txn.set("src", row, "f:a", a)
                if b is not None:
                    txn.set("src", row, "g:b", b)
        df = read_table(spark, url, "src", splits=4)
        assert df.columns == ["row", "f:a", "g:b"]
        parts = df.rdd.glom().collect()
        sizes = [len(p) for p in parts]
        assert len(sizes) == 4 and sum(sizes) == 300 and min(sizes) >= 300 // 8, sizes
        assert {bytes(r[0]): (bytes(r[1]), None if r[2] is None else bytes(r[2]))
                for p in parts for r in p} == values
        # By default the store's own cut points, where it reports some.
        splitting = offered(internals(cluster).store, SPLIT_KEYS)
        store_keys = splitting.split_keys("src") if splitting is not None else []
        assert bool(store_keys) == reports_split_keys(backend)  # regions, tablet samples
        default = read_table(spark, url, "src", ["f:a"]).rdd.getNumPartitions()
        if backend == "bigtable":  # the emulator's samples vary from call to call
            assert default > 1
        else:
            assert default == (len(store_keys) + 1 if store_keys
                               else 2 * spark.sparkContext.defaultParallelism)
        out = str(tmp_path / "src.parquet")
        result = export_table(spark, url, "src", "parquet", out)
        assert (result.rows, result.columns) == (300, ("f:a", "g:b"))
        loaded = load_files(spark, out, "parquet", url, "copy", "row",
                            {"f:a": "f:a", "g:b": "g:b"})
        assert loaded.rows == 300
        assert _rows(read_table(spark, url, "copy")) == values
        if backend != "sqlite":
            for table in internals(cluster).store.list_tables():
                internals(cluster).store.drop_table(table)


def _docs(url: str) -> None:
    """50 rows of HTML (not ASCII) and a language in the table docs."""
    with percolator.connect(url) as cluster:
        cluster.create_table("docs")
        with percolator.Transaction(cluster) as txn:
            for i in range(50):
                txn.set("docs", b"d%03d" % i, "raw:html", "<p>é%d</p>".encode() % i)
                txn.set("docs", b"d%03d" % i, "meta:lang", b"en")


def test_export_cli_jsonl_round_trip(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The export command prints a summary, and the JSON lines hold the table. It runs
    in this process, on the session's SparkSession (the command takes the active one):
    that the command's own session has its workers run its interpreter, whatever
    ``python3`` PATH finds first, is the loader command's test (the same ``_spark`` of
    ``spark_loader/__main__.py``: test_loader.py's crash-after-the-commit-point test),
    and a driver of its own here cost a JVM's start."""
    from pyspark.sql import SparkSession

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)  # the command sets it by default
    # The command takes this thread's active session, and leaves it running (it stops
    # only one it made): the session's other tests go on with it.
    assert SparkSession.getActiveSession() is not None
    url = f"sqlite://{tmp_path}/repo.db"
    _docs(url)
    out = tmp_path / "docs.jsonl"
    assert main(["export", "--cluster", url, "--table", "docs", "--format", "jsonl",
                 "--output", str(out), "--master", "local[2]", "--splits", "3"]) == 0
    summary = capsys.readouterr().out
    assert "exported 50 rows of 'docs' (2 columns: meta:lang, raw:html)" in summary
    assert not spark.sparkContext._jsc.sc().isStopped()
    lines = [json.loads(line) for f in sorted(out.glob("part-*"))
             for line in f.read_text().splitlines()]
    # What the loader reads back (--row-key row --column raw:html=raw:html ...): the
    # parquet round trip through the loader runs on every backend above.
    assert sorted(lines, key=lambda r: r["row"]) == [
        {"row": f"d{i:03d}", "raw:html": f"<p>é{i}</p>", "meta:lang": "en"} for i in range(50)]


def test_decode_columns_reads_the_cells_as_text(spark: Any, tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/repo.db"
    _docs(url)
    assert [r.asDict() for r in decode_columns(read_table(spark, url, "docs", ["raw:html"],
                                                          splits=[b"d010"])).take(1)] == \
        [{"row": "d000", "raw:html": "<p>é0</p>"}]


# --- bad input ----------------------------------------------------------------------------------


def test_bad_input_is_refused_before_spark_starts(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if this were the application's first read: the workers' probe (a job, once per
    # application) must also wait for the driver's checks, whichever test ran first.
    monkeypatch.setattr(spark_loader._spark, "_checked_apps", set())
    url = f"sqlite://{tmp_path}/repo.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"r", "f:v", b"\xff")
        now = internals(cluster).timestamps.get_timestamp()
    sc = spark.sparkContext
    group = f"bad-input-{tmp_path.name}"  # counted by group: Spark keeps only the last 1,000 jobs
    sc.setJobGroup(group, "bad input: no job may run")
    with pytest.raises(percolator.UnknownTableError, match="'nope' does not exist"):
        read_table(spark, url, "nope")
    with pytest.raises(percolator.InvalidArgument, match="bad column"):
        read_table(spark, url, "t", ["nocolon"])
    with pytest.raises(percolator.InvalidArgument, match="columns must be a list"):
        read_table(spark, url, "t", "f:v")  # type: ignore[arg-type]
    with pytest.raises(percolator.InvalidArgument, match="is in the future"):
        read_table(spark, url, "t", start_ts=now + 10_000)
    with pytest.raises(percolator.InvalidArgument, match="start_ts must be a positive int"):
        read_table(spark, url, "t", start_ts=-1)
    with pytest.raises(percolator.InvalidArgument, match="split keys must be non-empty bytes"):
        read_table(spark, url, "t", splits=["a"])  # type: ignore[list-item]
    with pytest.raises(percolator.InvalidArgument, match="unknown export format 'csv'"):
        export_table(spark, url, "t", "csv", str(tmp_path / "out"))
    (tmp_path / "exists").mkdir()
    with pytest.raises(percolator.InvalidArgument, match="exists already"):
        export_table(spark, url, "t", "parquet", str(tmp_path / "exists"))
    assert main(["export", "--cluster", url, "--table", "nope", "--format", "parquet",
                 "--output", str(tmp_path / "o")]) == 2
    assert "table 'nope' does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["export", "--cluster", url, "--table", "t", "--format", "xml", "--output", "o"])
    assert e.value.code == 2
    assert list(sc.statusTracker().getJobIdsForGroup(group)) == []  # no job ran for any
    sc.setLocalProperty("spark.jobGroup.id", None)
    # A value that is not UTF-8 fails a JSON export in the executor, naming the row.
    assert main(["export", "--cluster", url, "--table", "t", "--format", "jsonl",
                 "--output", str(tmp_path / "j")]) == 1
    err = capsys.readouterr().err
    assert "ReadError: row b'r': the value of f:v is not UTF-8 text" in err, err[-2000:]


def test_a_partition_error_names_table_timestamp_and_range(spark: Any, tmp_path: Path) -> None:
    """A read that fails in an executor (here: a live writer's lock outlasting the lock
    wait) fails the action with a ReadError naming the table, start_ts and range."""
    url = f"sqlite://{tmp_path}/repo.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"a", "f:v", b"1")
            txn.set("t", b"z", "f:v", b"1")
        live = percolator.Transaction(cluster)  # its owner (this process) stays alive
        live.set("t", b"z", "f:v", b"2")
        hold_locks(live)
        df = read_table(spark, url, "t", ["f:v"], splits=[b"m"],
                        connect_options={"lock_wait": 0.2})
        ts = start_ts_of(df)
        with pytest.raises(Exception, match=rf"ReadError: reading table 't' at start_ts {ts} "
                                            r"\(rows \[b'm', None\)\) failed: LockedError"):
            df.collect()
        assert issubclass(ReadError, percolator.PercolatorError)


def test_the_suites_spark_drivers_take_its_jvm_options(spark: Any) -> None:
    """Every Spark driver the suite starts, in its own process or in a test's driver
    subprocess, runs with ``PERCOLATOR_JVM_OPTS`` (C1 only: its JVM answers in a
    third of the time), given through ``PYSPARK_SUBMIT_ARGS`` by tests/conftest.py:
    the session's own JVM says so."""
    from tests._hbase_local import jvm_options

    options = jvm_options()
    assert options
    arguments = spark.sparkContext._jvm.java.lang.management.ManagementFactory \
        .getRuntimeMXBean().getInputArguments()
    assert set(options) <= {str(a) for a in arguments}
