"""The PySpark bulk loader on real Spark (``local[2]``): formats, atomic visibility,
crashes and reruns, rejects, observers, and a remote backend."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator._bulk import LOADS_TABLE, BulkLoad, LoadTxn, prewrite_rows
from percolator._encoding import MAX_VALUE_BYTES, Free, Lock, decode_lock, decode_write
from percolator._internals import internals
from percolator._store import Read
from spark_loader import LoadError, load_dataframe, load_files
from tests._backends import backend_fixture
from tests._concurrency import hold_locks
from tests._services import free_port

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # pyspark on pandas 3
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = {"html": "raw:html", "lang": "meta:lang"}


def records(n: int, tag: str = "") -> list[dict[str, Any]]:
    return [{"url": f"u{i:05d}", "html": f"<p>{tag}{i}</p>", "lang": "en"} for i in range(n)]


def write_jsonl(path: Path, recs: list[dict[str, Any]], extra: tuple[str, ...] = ()) -> str:
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
        for line in extra:
            f.write(line + "\n")
    return str(path)


backend = backend_fixture("sqlite")


def visible(cluster: percolator.Cluster, table: str = "docs") -> dict[bytes, dict[str, bytes]]:
    with percolator.Transaction(cluster) as txn:
        return dict(txn.scan(table))


def expected(recs: list[dict[str, Any]]) -> dict[bytes, dict[str, bytes]]:
    return {r["url"].encode(): {"raw:html": r["html"].encode(), "meta:lang": b"en"}
            for r in recs}


def assert_clean(cluster: percolator.Cluster, table: str = "docs") -> None:
    """No lock left and every cell has exactly one PUT write record."""
    store = internals(cluster).store
    for row, cells in store.scan(table, None, None, [Read("l"), Read("w", versions=None)]):
        for name, versions in cells.items():
            if name.startswith("l:"):
                assert isinstance(decode_lock(versions[0][1]), Free), (row, name)
            else:
                puts = [v for _, v in versions if decode_write(v)[0].value == b"P"]
                assert len(puts) == 1, (row, name, versions)


# --- formats ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_load_each_format(spark: Any, tmp_path: Path, store_url: str, cluster: percolator.Cluster,
                          fmt: str) -> None:
    recs = records(300)
    path = tmp_path / f"in.{fmt}"
    if fmt == "jsonl":
        write_jsonl(path, recs)
    elif fmt == "csv":
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, ["url", "html", "lang"])
            w.writeheader()
            w.writerows(recs)
    else:
        spark.createDataFrame(recs).write.parquet(str(path))
    result = load_files(spark, str(path), fmt, store_url, "docs", "url", COLUMNS)
    assert (result.rows, result.cells, result.rejects) == (300, 600, 0)
    assert result.commit_ts is not None and not result.already_loaded
    assert visible(cluster) == expected(recs)
    assert_clean(cluster)


def test_dataframe_api_and_idempotent_rerun(spark: Any, store_url: str,
                                            cluster: percolator.Cluster) -> None:
    recs = records(200)
    df = spark.createDataFrame(recs)
    first = load_dataframe(df, store_url, "docs", "url", COLUMNS, load_id="df-1")
    assert (first.rows, first.cells) == (200, 400)
    again = load_dataframe(df, store_url, "docs", "url", COLUMNS, load_id="df-1")
    assert again.already_loaded and again.commit_ts == first.commit_ts
    assert (again.rows, again.cells) == (200, 400)
    assert visible(cluster) == expected(recs)
    assert_clean(cluster)  # exactly one write record per cell: nothing written twice
    # a different load id is a new load: a newer version of the same cells
    third = load_dataframe(spark.createDataFrame(records(200, "v2-")), store_url, "docs", "url",
                           COLUMNS, load_id="df-2")
    assert third.commit_ts is not None and third.commit_ts > (first.commit_ts or 0)
    assert visible(cluster) == expected(records(200, "v2-"))


# --- atomic visibility -------------------------------------------------------------------------


def test_reader_racing_a_load_sees_all_or_nothing(spark: Any, tmp_path: Path, store_url: str,
                                                  cluster: percolator.Cluster) -> None:
    recs = records(400)
    path = write_jsonl(tmp_path / "in.jsonl", recs)
    cluster.create_table("docs")
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = load_files(spark, path, "jsonl", store_url, "docs", "url", COLUMNS,
                                           batch_cells=40,
                                           test_hooks={"batch_delay": 0.05})
        except BaseException as e:  # pragma: no cover - reported below
            outcome["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    seen: list[int] = []
    full = expected(recs)
    while thread.is_alive():
        got = visible(cluster)
        assert got in ({}, full), f"a reader saw {len(got)} of {len(full)} rows"
        seen.append(len(got))
        time.sleep(0.05)
    thread.join()
    assert "error" not in outcome, outcome.get("error")
    assert len(seen) >= 3  # the reader really raced the load
    assert visible(cluster) == full


# --- crashes --------------------------------------------------------------------------------


def _loader_cmd(url: str, path: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spark_loader", "--cluster", url, "--table", "docs",
            "--input", path, "--format", "jsonl", "--row-key", "url",
            "--column", "html=raw:html", "--column", "lang=meta:lang",
            "--master", "local[2]", "--partitions", "2", *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(ROOT))
    return env


def _locks_of_load(cluster: percolator.Cluster) -> int:
    if "docs" not in cluster.tables():
        return 0
    n = 0
    for _, cells in internals(cluster).store.scan("docs", None, None, [Read("l")]):
        n += sum(isinstance(decode_lock(v[0][1]), Lock) for v in cells.values())
    return n


# The loader is a Spark driver of its own (a JVM, Python workers): on a 2-core machine
# running the suite's other services it took over two minutes to write its first locks.
@pytest.mark.timeout(900)
def test_killed_load_leaves_nothing_and_rerun_completes(
    spark: Any, tmp_path: Path, store_url: str, cluster: percolator.Cluster
) -> None:
    recs = records(600)
    path = write_jsonl(tmp_path / "in.jsonl", recs)
    proc = subprocess.Popen(
        _loader_cmd(store_url, path, "--batch-cells", "50", "--test-batch-delay", "0.2"),
        env=_env(), cwd=tmp_path, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 480
        while _locks_of_load(cluster) < 100:
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "the loader wrote no locks in time"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and Python workers
        proc.wait()
    time.sleep(0.5)
    assert _locks_of_load(cluster) >= 100
    # The driver is dead: a reader rolls its locks back at once and sees nothing.
    assert visible(cluster) == {}
    result = load_files(spark, path, "jsonl", store_url, "docs", "url", COLUMNS)
    assert not result.already_loaded and result.rows == 600
    assert visible(cluster) == expected(recs)
    assert_clean(cluster)


@pytest.mark.timeout(900)
def test_crash_after_the_commit_point_rerun_finishes(tmp_path: Path, spark: Any, store_url: str,
                                                     cluster: percolator.Cluster) -> None:
    """The loader's command dies right after its commit point; a rerun finds the load
    committed and rolls its leftover locks forward.

    The command runs as a new user starts it, its virtualenv not activated:
    `venv/bin/python -m spark_loader` from elsewhere, with `python3` on PATH another
    interpreter (one without pyspark or this package) and no PYTHONPATH. Spark's
    executors must run the loader's own Python, not whatever `python3` PATH finds
    first: else no task of the load runs, and it never reaches its commit point. (One
    driver for both: each one's JVM costs a minute of a loaded 2-core machine.)"""
    other = tmp_path / "bin"
    other.mkdir()
    (other / "python3").symlink_to("/usr/bin/python3")
    env = {k: v for k, v in _env().items() if k not in ("PYSPARK_PYTHON", "PYTHONPATH")}
    env["PATH"] = f"{other}:{env['PATH']}"
    recs = records(300)
    path = write_jsonl(tmp_path / "in.jsonl", recs)
    # As `venv/bin/python -m spark_loader` run from elsewhere: the package is found by the
    # loader's interpreter (here through its sys.path), not through PYTHONPATH or the cwd.
    driver = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
              "from spark_loader.__main__ import main; sys.exit(main())")
    command = _loader_cmd(store_url, path, "--test-crash-after-commit",
                          "--metrics-port", str(free_port()))
    command[1:3] = ["-c", driver, str(ROOT)]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, timeout=480)
    assert done.returncode == 137, done.stderr.decode()[-3000:]
    assert _locks_of_load(cluster) == 600  # committed, nothing released yet
    # A rerun finds the committed load and rolls its leftover locks forward.
    result = load_files(spark, path, "jsonl", store_url, "docs", "url", COLUMNS)
    assert result.already_loaded and result.rows == 300
    assert _locks_of_load(cluster) == 0
    assert visible(cluster) == expected(recs)
    assert_clean(cluster)


# --- conflicts with live transactions (no Spark needed) --------------------------------------


def test_newer_write_fails_the_load_and_live_lock_is_waited_for(tmp_path: Path) -> None:
    with percolator.connect(f"sqlite://{tmp_path}/repo.db", lock_wait=0.5) as cluster:
        cluster.create_table("docs")
        load = BulkLoad(cluster, "docs", "conflict-test")
        txn = load.begin({})
        assert isinstance(txn, LoadTxn)
        with percolator.Transaction(cluster) as t:  # commits after the load started
            t.set("docs", b"r1", "raw:html", b"newer")
        with pytest.raises(percolator.ConflictError, match=r"r1.*committed at"):
            list(prewrite_rows(cluster, txn, [(b"r0", {"raw:html": b"a"}),
                                              (b"r1", {"raw:html": b"b"})]))
        load.abort()

        live = percolator.Transaction(cluster)
        live.set("docs", b"r2", "raw:html", b"live")
        hold_locks(live)
        load2 = BulkLoad(cluster, "docs", "locked-test")
        txn2 = load2.begin({})
        assert isinstance(txn2, LoadTxn)
        with pytest.raises(percolator.LockedError, match="locked by live transaction"):
            list(prewrite_rows(cluster, txn2, [(b"r2", {"raw:html": b"c"})]))
        load2.abort()
        with percolator.Transaction(cluster) as t:
            assert t.get("docs", b"r0", "raw:html") is None
            assert t.get("docs", b"r1", "raw:html") == b"newer"


# --- bad input ----------------------------------------------------------------------------------


def test_rejects_are_counted_written_and_bounded(spark: Any, tmp_path: Path, store_url: str,
                                                 cluster: percolator.Cluster) -> None:
    recs = records(50)
    bad = [
        "{not json",
        json.dumps({"html": "no key"}),
        json.dumps({"url": "", "html": "empty key"}),
        json.dumps({"url": "big", "html": "x" * (MAX_VALUE_BYTES + 1)}),
        json.dumps({"url": "u00003", "html": "a different value"}),
        json.dumps(recs[4]),  # an identical duplicate is not a reject
        "[1, 2]",
    ]
    path = write_jsonl(tmp_path / "in.jsonl", recs, tuple(bad))
    rejects = tmp_path / "rejects.jsonl"
    with pytest.raises(LoadError, match="7 rejects, more than --max-rejects 2") as info:
        load_files(spark, path, "jsonl", store_url, "docs", "url", COLUMNS, max_rejects=2,
                   rejects_path=str(rejects))
    assert info.value.result is not None and info.value.result.rejects == 7
    assert visible(cluster) == {}  # nothing of a failed load is visible...
    assert _locks_of_load(cluster) == 0  # ...and no lock is left behind

    result = load_files(spark, path, "jsonl", store_url, "docs", "url", COLUMNS, max_rejects=10,
                        rejects_path=str(rejects))
    assert (result.rows, result.rejects) == (49, 7)
    lines = [json.loads(line) for line in rejects.read_text().splitlines()]
    reasons = sorted(r["reason"].split(":")[0].split(" (")[0] for r in lines)
    assert len(lines) == 7
    assert any(r.startswith("malformed JSON") for r in reasons)
    assert "missing row key field 'url'" in reasons
    assert "empty row key field 'url'" in reasons
    assert any("over the limit" in r["reason"] for r in lines)
    assert sum(r.startswith("duplicate row key 'u00003'") for r in reasons) == 2
    assert any(r.startswith("not a JSON object") for r in reasons)
    assert all(r["line"] for r in lines)  # the source line is kept
    want = expected(recs)
    del want[b"u00003"]
    assert visible(cluster) == want


def test_unknown_table_field_and_unreachable_store(spark: Any, tmp_path: Path,
                                                   store_url: str) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", records(5))
    with pytest.raises(LoadError, match="unknown table"):
        load_files(spark, path, "jsonl", store_url, "nope", "url", COLUMNS, create_table=False)
    csv_path = tmp_path / "in.csv"
    csv_path.write_text("url,html\nu1,x\n")
    with pytest.raises(LoadError, match=r"unknown field\(s\) \['lang'\]"):
        load_files(spark, str(csv_path), "csv", store_url, "docs", "url", COLUMNS)
    with pytest.raises(percolator.InvalidArgument, match="bad column"):
        load_files(spark, path, "jsonl", store_url, "docs", "url", {"html": "nocolon"})
    missing = f"sqlite://{tmp_path}/no/such/dir/repo.db"
    with pytest.raises(LoadError, match=f"cannot reach the store sqlite://{tmp_path}/no/such"):
        load_files(spark, path, "jsonl", missing, "docs", "url", COLUMNS)


# --- observers -----------------------------------------------------------------------------------


def test_loaded_rows_trigger_observers(spark: Any, tmp_path: Path, store_url: str,
                                       cluster: percolator.Cluster) -> None:
    from observers import Observer, Worker, wait_for_observers

    class Lengths(Observer):
        table, column = "docs", "raw:html"

        def process(self, txn: Any, row: bytes, column: str) -> None:
            html = txn.get("docs", row, column)
            txn.set("docs", row, "derived:length", str(len(html)).encode())

    recs = records(40)
    path = write_jsonl(tmp_path / "in.jsonl", recs)
    with Worker(cluster, [Lengths], threads=2):
        result = load_files(spark, path, "jsonl", store_url, "docs", "url", COLUMNS)
        assert result.rows == 40
        wait_for_observers(cluster, timeout=60)
    with percolator.Transaction(cluster) as txn:
        for r in recs:
            assert txn.get("docs", r["url"].encode(), "derived:length") == \
                str(len(r["html"])).encode()


def test_observe_option_writes_notify_cells(spark: Any, tmp_path: Path, store_url: str,
                                           cluster: percolator.Cluster) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", records(20))
    result = load_files(spark, path, "jsonl", store_url, "docs", "url", COLUMNS,
                        observe=["meta:lang"])
    assert ("docs", "meta:lang") in cluster.observed_columns()
    notified = {row for row, _ in internals(cluster).store.scan("docs", None, None, [Read("n")])}
    assert len(notified) == 20
    cells = internals(cluster).store.scan("docs", None, None, [Read("n")])
    assert all(set(c) == {"n:meta:lang"} and c["n:meta:lang"][0][0] == result.commit_ts
               for _, c in cells)
    assert LOADS_TABLE not in cluster.tables()  # internal, hidden from users


# --- a remote backend ----------------------------------------------------------------------


@pytest.mark.bigtable
def test_load_into_bigtable_emulator(spark: Any, tmp_path: Path, bigtable_emulator: str) -> None:
    from tests._bigtable import bigtable_store_url

    remote = bigtable_store_url(bigtable_emulator, "spark_loader")
    recs = records(150)
    path = write_jsonl(tmp_path / "in.jsonl", recs, ("{bad",))
    result = load_files(spark, path, "jsonl", remote, "docs", "url", COLUMNS)
    assert (result.rows, result.rejects) == (150, 1)
    again = load_files(spark, path, "jsonl", remote, "docs", "url", COLUMNS)
    assert again.already_loaded
    with percolator.connect(remote) as c:
        assert visible(c) == expected(recs)
        assert_clean(c)


@pytest.mark.hbase
def test_load_into_hbase(spark: Any, tmp_path: Path, hbase_thrift: str) -> None:
    """HBase has no batched compare-and-set: the loader takes one ``checkAndPut`` per
    cell (its puts batched before), with the same outcome."""
    from tests._hbase import hbase_store_url

    remote = hbase_store_url(hbase_thrift, "spark_loader")
    recs = records(150)
    path = write_jsonl(tmp_path / "in.jsonl", recs, ("{bad",))
    result = load_files(spark, path, "jsonl", remote, "docs", "url", COLUMNS,
                        observe=["meta:lang"])
    assert (result.rows, result.rejects) == (150, 1)
    again = load_files(spark, path, "jsonl", remote, "docs", "url", COLUMNS)
    assert again.already_loaded and again.commit_ts == result.commit_ts
    with percolator.connect(remote) as c:
        assert visible(c) == expected(recs)
        assert_clean(c)
        notified = {row for row, _ in internals(c).store.scan("docs", None, None, [Read("n")])}
        assert notified == set(expected(recs))
        for table in internals(c).store.list_tables():
            internals(c).store.drop_table(table)


def test_a_committed_load_is_counted_in_the_metrics(
    spark: Any, tmp_path: Path, store_url: str, cluster: percolator.Cluster
) -> None:
    from percolator import metrics

    def counted() -> tuple[float, float, float]:
        values, _ = metrics.snapshot()
        return (values.get(("percolator_loader_rows_total", ()), 0.0),
                values.get(("percolator_loader_rejects_total", ()), 0.0),
                values.get(("percolator_transactions_committed_total", ("bulk",)), 0.0))

    before = counted()
    path = write_jsonl(tmp_path / "in.jsonl", records(12), extra=("not json",))
    load_files(spark, path, "jsonl", store_url, "docs", "url", COLUMNS)
    after = counted()
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (12, 1, 1)
