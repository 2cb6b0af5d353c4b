"""Metrics: values that move as work is done, scraped from real worker and oracle
processes over HTTP and parsed with prometheus_client's parser; the in-process
recorders behind them; the dashboard and alert rules kept in deploy/."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

import percolator
from observers import Worker, wait_for_observers
from oracle import OracleClient
from percolator import ConflictError, Snapshot, Transaction, metrics
from percolator._commit import CrashPoint, commit_group
from percolator._notifications import watch_pending_notifications
from percolator.testing import client_of, crash_commit
from tests._backends import backend_fixture
from tests._concurrency import hold_locks
from tests._services import free_port
from tests._zookeeper import DIE_WITH_PARENT
from tests.observers import _app

parser = pytest.importorskip("prometheus_client.parser")

ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of http://127.0.0.1:*port*/metrics, keyed by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found: Samples = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_scrape(port: int, proc: subprocess.Popen[bytes], log: Path) -> Samples:
    """Scrape *port* once it answers (the process is starting)."""
    end = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return scrape(port)
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def local(name: str, **labels: str) -> float:
    values, hists = metrics.snapshot()
    key = (name, tuple(labels.values()))
    if key in hists:
        return float(sum(hists[key][0]))  # a histogram: its count
    return values.get(key, 0.0)


backend = backend_fixture("sqlite")


@pytest.fixture
def cluster_tables() -> tuple[str, ...]:
    return ("docs", "log", "flaky")


# --- real processes ---------------------------------------------------------------------

def test_worker_process_metrics_move_as_observers_run(
    cluster: percolator.Cluster, store_url: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "worker.log"
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            [*DIE_WITH_PARENT, sys.executable, "-m", "observers", "--cluster", store_url,
             "--observers", "tests.observers._app:ALL", "--threads", "2", "--max-failures",
             "1", "--metrics-port", str(port), "--log-level", "WARNING"],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.DEVNULL, stderr=log_file,
        )
    try:
        Worker(cluster, _app.ALL).register()  # before the writes, whatever the worker's pace
        before = wait_scrape(port, proc, log)
        assert value(before, "percolator_observer_runs_total",
                     observer="Indexer", outcome="committed") == 0
        for i in range(5):
            with Transaction(cluster) as txn:
                txn.set("docs", f"r{i}".encode(), "raw:v", b"x")
        with Transaction(cluster) as txn:
            txn.set("flaky", b"config", "cfg:fail", b"1")
            txn.set("flaky", b"bad", "in:x", b"1")
        wait_for_observers(cluster)
        after = scrape(port)
        # Each write runs Indexer, whose write runs Stage2: one committed run each.
        assert value(after, "percolator_observer_runs_total",
                     observer="Indexer", outcome="committed") == 5
        assert value(after, "percolator_observer_runs_total",
                     observer="Stage2", outcome="committed") == 5
        assert value(after, "percolator_observer_runs_total",
                     observer="Flaky", outcome="failed") == 1
        assert value(after, "percolator_observer_runs_total",
                     observer="Flaky", outcome="quarantined") == 1
        assert value(after, "percolator_transactions_committed_total", kind="observer") >= 10
        assert value(after, "percolator_transactions_begun_total", kind="observer") >= 11
        # Every run is timed, whatever its outcome: with two scanner threads a run may
        # find its change acknowledged already, or conflict, and be timed too; a run
        # deferred into a group commit is timed without a count of its own.
        indexer_runs = sum(v for (name, labels), v in after.items()
                           if name == "percolator_observer_runs_total"
                           and ("observer", "Indexer") in labels)
        assert value(after, "percolator_observer_run_duration_seconds_count",
                     observer="Indexer") >= indexer_runs >= 5
        assert value(after, "percolator_notification_scan_duration_seconds_count") > 0
        assert value(after, "percolator_read_duration_seconds_count") > 0  # the first read
        assert value(after, "percolator_reads_total") >= value(
            after, "percolator_read_duration_seconds_count")
        assert value(after, "percolator_store_requests_total", operation="scan") > 0
        assert value(after, "percolator_store_requests_total", operation="read_rows") > 0
        # The backlog gauge is recounted at most every few seconds: wait for a fresh one.
        end = time.monotonic() + 60
        while value(scrape(port), "percolator_notifications_pending", table="docs") != 0:
            assert time.monotonic() < end, "the pending gauge never came back to 0"
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0, log.read_text()[-3000:]


@pytest.mark.oracle
def test_oracle_process_metrics_move_as_timestamps_are_served(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "oracle.log"
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            [*DIE_WITH_PARENT, sys.executable, "-m", "oracle", "--listen",
             f"127.0.0.1:{port}", "--state-file", str(tmp_path / "ceiling"),
             "--block-size", "1000", "--metrics-port", str(metrics_port)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
        )
    try:
        before = wait_scrape(metrics_port, proc, log)
        assert value(before, "percolator_oracle_timestamps_served_total") == 0
        with OracleClient(f"grpc://127.0.0.1:{port}") as client:
            for _ in range(7):
                client.get_timestamp()
            status = client.status()
        after = scrape(metrics_port)
        assert value(after, "percolator_oracle_timestamps_served_total") == status.served >= 7
        assert value(after, "percolator_oracle_requests_total") == status.requests >= 7
        assert value(after, "percolator_oracle_batches_total") == status.allocations
        assert value(after, "percolator_oracle_batch_size_count") == status.allocations
        assert value(after, "percolator_oracle_leader") == 1
        assert value(after, "percolator_oracle_persisted_ceiling") == status.persisted_ceiling
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_busy_metrics_port_is_a_clean_error(tmp_path: Path) -> None:
    server = metrics.serve(0)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "oracle", "--listen", "127.0.0.1:0",
             "--state-file", str(tmp_path / "ceiling"),
             "--metrics-port", str(server.server_port)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 2
    assert f"cannot serve metrics on 127.0.0.1:{server.server_port}" in out.stderr


# --- the endpoint -----------------------------------------------------------------------

def test_the_endpoint_binds_loopback_unless_told() -> None:
    server = metrics.serve(0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        assert "# TYPE percolator_oracle_leader gauge" in text
        assert "# TYPE percolator_transactions_begun_total counter" in text
    finally:
        server.shutdown()
        server.server_close()


def test_without_prometheus_client_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(metrics.MetricsUnavailable, match=r"percolator-txn\[metrics\]"):
        metrics.serve(0)
    with pytest.raises(metrics.MetricsUnavailable, match="prometheus_client"):
        metrics.collector()
    # Recording needs nothing: the library keeps counting.
    before = local("percolator_locks_met_total")
    metrics.inc("percolator_locks_met_total")
    assert local("percolator_locks_met_total") == before + 1


# --- in-process recorders ------------------------------------------------------------------

def test_recording_can_be_switched_off(cluster: percolator.Cluster) -> None:
    committed = local("percolator_transactions_committed_total", kind="user")
    metrics.set_enabled(False)
    try:
        with Transaction(cluster) as txn:
            txn.set("docs", b"off", "raw:v", b"1")
    finally:
        metrics.set_enabled(True)
    assert local("percolator_transactions_committed_total", kind="user") == committed
    with Transaction(cluster) as txn:
        txn.set("docs", b"on", "raw:v", b"1")
    assert local("percolator_transactions_committed_total", kind="user") == committed + 1


def test_transactions_are_counted_by_kind_and_outcome(cluster: percolator.Cluster) -> None:
    names = ("begun", "committed", "conflicted", "failed")
    before = {n: local(f"percolator_transactions_{n}_total", kind="user") for n in names}
    commits = local("percolator_commit_duration_seconds", kind="user")
    with Transaction(cluster) as txn:
        txn.set("docs", b"a", "raw:v", b"1")
    t1, t2 = Transaction(cluster), Transaction(cluster)
    t1.set("docs", b"b", "raw:v", b"1")
    t2.set("docs", b"b", "raw:v", b"2")
    t1.commit()
    with pytest.raises(ConflictError):
        t2.commit()
    delta = {n: local(f"percolator_transactions_{n}_total", kind="user") - before[n]
             for n in names}
    assert delta == {"begun": 3, "committed": 2, "conflicted": 1, "failed": 0}
    assert local("percolator_commit_duration_seconds", kind="user") - commits == 3


def test_a_commit_that_fails_is_counted_as_failed(cluster: percolator.Cluster) -> None:
    """A commit that ends with an error other than a conflict (here its table, dropped
    since the write, is not there) counts as failed, with its duration, neither
    committed nor conflicted."""
    names = ("committed", "conflicted", "failed")
    before = {n: local(f"percolator_transactions_{n}_total", kind="user") for n in names}
    commits = local("percolator_commit_duration_seconds", kind="user")
    cluster.create_table("gone")
    txn = Transaction(cluster)
    txn.set("gone", b"a", "raw:v", b"1")
    cluster.drop_table("gone")
    with pytest.raises(percolator.UnknownTableError):
        txn.commit()
    delta = {n: local(f"percolator_transactions_{n}_total", kind="user") - before[n]
             for n in names}
    assert delta == {"committed": 0, "conflicted": 0, "failed": 1}
    assert local("percolator_commit_duration_seconds", kind="user") - commits == 1


def test_a_commits_duration_is_the_time_its_commit_took(cluster: percolator.Cluster) -> None:
    """The commit duration histogram gets, per commit (committed or conflicted), a
    positive time within the wall time measured around the commits."""
    key = ("percolator_commit_duration_seconds", ("user",))

    def total() -> tuple[float, float]:
        counts, seconds = metrics.snapshot()[1].get(key, ([], 0.0))
        return float(sum(counts)), seconds

    with Transaction(cluster) as txn:
        txn.set("docs", b"a", "raw:v", b"0")
    late = Transaction(cluster)  # conflicts with the next commit to "a"
    late.set("docs", b"a", "raw:v", b"late")
    (count, seconds), began = total(), time.perf_counter()
    with Transaction(cluster) as txn:
        txn.set("docs", b"a", "raw:v", b"1")
    with pytest.raises(ConflictError):
        late.commit()
    took = time.perf_counter() - began
    after_count, after_seconds = total()
    assert after_count == count + 2
    assert 0 < after_seconds - seconds <= took


def test_a_group_commit_counts_each_member_by_outcome(cluster: percolator.Cluster) -> None:
    names = ("committed", "conflicted", "failed")
    before = {n: local(f"percolator_transactions_{n}_total", kind="user") for n in names}
    commits = local("percolator_commit_duration_seconds", kind="user")
    late = Transaction(cluster)  # conflicts with the next commit to "a"
    late.set("docs", b"a", "raw:v", b"late")
    with Transaction(cluster) as txn:
        txn.set("docs", b"a", "raw:v", b"1")
    fine = Transaction(cluster)
    fine.set("docs", b"b", "raw:v", b"1")
    outcomes = commit_group([late, fine])
    assert isinstance(outcomes[0], ConflictError) and isinstance(outcomes[1], int)
    delta = {n: local(f"percolator_transactions_{n}_total", kind="user") - before[n]
             for n in names}
    assert delta == {"committed": 2, "conflicted": 1, "failed": 0}
    assert local("percolator_commit_duration_seconds", kind="user") - commits == 3


@pytest.mark.parametrize(("point", "action", "resolved_locks"), [
    # the reader of the secondaries rolls back the dead primary, then their two locks
    (CrashPoint("prewrite", 2), "rolled_back", 3),
    # the primary is committed: only the secondaries read are rolled forward
    (CrashPoint("commit_point"), "rolled_forward", 2),
])
def test_locks_met_and_resolved_are_counted(
    cluster: percolator.Cluster, point: CrashPoint, action: str, resolved_locks: int
) -> None:
    """A row read meets two locks at once: both count as met."""
    client = client_of(cluster)
    txn = Transaction(client)
    txn.set("docs", b"x", "raw:v", b"1")
    txn.set("docs", b"y", "raw:v", b"1")
    txn.set("docs", b"y", "raw:w", b"1")
    crash_commit(txn, point)
    met = local("percolator_locks_met_total")
    resolved = local("percolator_locks_resolved_total", action=action)
    Snapshot(cluster).get_row("docs", b"y", ["raw:v", "raw:w"])
    assert local("percolator_locks_met_total") - met == 2
    assert local("percolator_locks_resolved_total", action=action) - resolved == resolved_locks


def test_store_round_trips_are_counted_by_operation(cluster: percolator.Cluster) -> None:
    snapshot = Snapshot(cluster)  # its start timestamp may cost round trips of its own
    snapshot.get("docs", b"warm", "raw:v")
    reads = local("percolator_store_requests_total", operation="read_rows")
    scans = local("percolator_store_requests_total", operation="scan")
    snapshot.get("docs", b"nothing", "raw:v")
    list(snapshot.scan("docs"))
    assert local("percolator_store_requests_total", operation="read_rows") - reads == 1
    assert local("percolator_store_requests_total", operation="scan") - scans == 1


def _quantile(q: float, bounds: tuple[float, ...], counts: list[int]) -> float:
    """Prometheus's histogram_quantile over per-bucket counts (the last bucket +Inf):
    linear interpolation inside the bucket where the rank falls, the dashboard's read."""
    cumulative, total = [], 0
    for count in counts:
        total += count
        cumulative.append(total)
    rank = q * total
    for i, seen in enumerate(cumulative):
        if seen >= rank:
            if i == len(bounds):
                return bounds[-1]  # +Inf: Prometheus answers the highest finite bound
            lower = bounds[i - 1] if i else 0.0
            below = cumulative[i - 1] if i else 0
            return lower + (bounds[i] - lower) * (rank - below) / (counts[i] or 1)
    return float("nan")


def test_reads_are_counted_exactly_and_their_durations_sampled_fairly(
    cluster: percolator.Cluster,
) -> None:
    """Every transactional read that goes to the store counts in percolator_reads_total;
    the first read and one in READ_SAMPLE after it are timed, each by its own clock
    reads: the histogram's count follows the counter's stride, its sum is part of the
    time the reads took, and the dashboard's p99 of it is a read's latency."""
    rows = [b"q%02d" % i for i in range(32)]
    with Transaction(cluster) as txn:
        for row in rows:
            txn.set("docs", row, "raw:v", b"1")
            txn.set("docs", row, "raw:w", b"2")
            txn.set("docs", row, "raw:u", b"3")
    name = "percolator_read_duration_seconds"
    bounds = metrics.METRICS[name][3]
    reads = local("percolator_reads_total")
    trips = local("percolator_store_requests_total", operation="read_rows")
    counts, total = metrics.snapshot()[1].get((name, ()), ([0] * (len(bounds) + 1), 0.0))
    began = time.perf_counter()
    for row in rows:  # every kind of store read a transaction makes
        snap = Snapshot(cluster)
        # The first row: the clean census's one-cell read, then a row read; after it
        # raw:w rides along with raw:v as a prediction (a row read), and is not read again.
        assert snap.get("docs", row, "raw:v") == b"1"
        assert snap.get_row("docs", row, ["raw:w"]) == {"raw:w": b"2"}
        assert snap.get_rows("docs", [row], ["raw:v"]) == {row: {"raw:v": b"1"}}  # known
        # A fresh snapshot's rows read (raw:w rides along as a prediction).
        assert Snapshot(cluster).get_rows("docs", [row], ["raw:v"]) == {row: {"raw:v": b"1"}}
        # Alone in its snapshot, raw:u predicts nothing: the clean census's read again.
        assert Snapshot(cluster).get("docs", row, "raw:u") == b"3"
    elapsed = time.perf_counter() - began
    reads_after = local("percolator_reads_total")
    # Each read is one store call here (the values are inline): none left uncounted.
    assert reads_after - reads == local(
        "percolator_store_requests_total", operation="read_rows") - trips == 3 * len(rows) + 1
    counts_after, total_after = metrics.snapshot()[1][(name, ())]
    delta = [a - b for a, b in zip(counts_after, counts, strict=True)]
    stride = [n for n in range(int(reads) + 1, int(reads_after) + 1)
              if n % metrics.READ_SAMPLE == 1]
    assert sum(delta) == len(stride) >= 4
    assert 0 < total_after - total <= elapsed
    assert 0 < _quantile(0.99, bounds, delta) <= min(b for b in bounds if b >= elapsed)


def _hold_a_lock_elsewhere(cluster: percolator.Cluster) -> None:
    """A lock held by another client's live transaction, stopped after its prewrite:
    the lock census is not clean, so reads look at the locks."""
    holder = Transaction(client_of(cluster))
    holder.set("docs", b"held", "raw:v", b"x")
    hold_locks(holder)


def _assert_each_read_counted_and_sampled(read: Callable[[int], None]) -> None:
    """Calls *read*(i) 2 * READ_SAMPLE times: each call one read in
    percolator_reads_total, and those one past a multiple of READ_SAMPLE timed into
    the read-duration histogram, within the calls' own time."""
    name = "percolator_read_duration_seconds"
    reads = local("percolator_reads_total")
    counts, total = metrics.snapshot()[1].get((name, ()), ([0], 0.0))
    began = time.perf_counter()
    for i in range(2 * metrics.READ_SAMPLE):
        read(i)
    elapsed = time.perf_counter() - began
    reads_after = local("percolator_reads_total")
    assert reads_after - reads == 2 * metrics.READ_SAMPLE
    sampled = [n for n in range(int(reads) + 1, int(reads_after) + 1)
               if n % metrics.READ_SAMPLE == 1]
    counts_after, total_after = metrics.snapshot()[1][(name, ())]
    assert sum(counts_after) - sum(counts) == len(sampled) >= 2
    assert 0 < total_after - total <= elapsed


def test_rows_read_together_are_one_read_counted_and_sampled_as_any_other(
    cluster: percolator.Cluster,
) -> None:
    """While a lock is held somewhere (the lock census not clean), ``get_rows`` reads
    its rows in one store call: one read in percolator_reads_total, timed into the
    read-duration histogram when it is one of the sampled reads, by its own clock."""
    rows = [b"g%02d" % i for i in range(4)]
    with Transaction(cluster) as txn:
        for row in rows:
            txn.set("docs", row, "raw:v", b"1")
    _hold_a_lock_elsewhere(cluster)

    def read_rows(_: int) -> None:
        assert Snapshot(cluster).get_rows("docs", rows, ["raw:v"]) == {
            row: {"raw:v": b"1"} for row in rows}

    _assert_each_read_counted_and_sampled(read_rows)


def test_a_read_of_a_row_that_holds_nothing_is_counted_and_timed_by_its_own_clock(
    cluster: percolator.Cluster,
) -> None:
    """A read that looks at the locks (one is held somewhere: the lock census is not
    clean) and finds the row empty returns early, and is counted and sampled as any
    other read: timed, when it is one of the sampled reads, by its own clock."""
    _hold_a_lock_elsewhere(cluster)

    def read_nothing(i: int) -> None:
        assert Snapshot(cluster).get("docs", b"nothing%02d" % i, "raw:v") is None

    _assert_each_read_counted_and_sampled(read_nothing)


@pytest.mark.parametrize("lock_held", [False, True], ids=["census-clean", "lock-held"])
def test_the_read_one_past_each_read_sample_is_timed(
    cluster: percolator.Cluster, lock_held: bool,
) -> None:
    """Reads are counted one by one; the one whose count is one past a multiple of
    READ_SAMPLE (the process's first read, then one in READ_SAMPLE) is timed into the
    read-duration histogram, the next is not: ``get``'s own read where no lock can be
    held (the lock census clean), and a read that looks at the locks (one is held)."""
    if lock_held:
        _hold_a_lock_elsewhere(cluster)
    name = "percolator_read_duration_seconds"
    snapshot = Snapshot(cluster)
    for untimed in range(metrics.READ_SAMPLE):  # each row's first read goes to the store
        if int(local("percolator_reads_total")) % metrics.READ_SAMPLE == 0:
            break
        snapshot.get("docs", b"u%d" % untimed, "raw:v")
    timed = []
    for _ in range(2):
        before = sum(metrics.snapshot()[1].get((name, ()), ([0], 0.0))[0])
        snapshot.get("docs", b"r%d" % len(timed), "raw:v")
        timed.append(sum(metrics.snapshot()[1][(name, ())][0]) - before)
    assert timed == [1, 0]


def test_a_gc_pass_is_recorded() -> None:
    passes = local("percolator_gc_passes_total", outcome="ok")
    deleted = local("percolator_gc_versions_deleted_total", table="docs")
    metrics.record_gc_pass(0.2, ok=True, deleted={"docs": 7}, safe_point=1234)
    metrics.record_gc_pass(0.1, ok=False)
    assert local("percolator_gc_passes_total", outcome="ok") == passes + 1
    assert local("percolator_gc_versions_deleted_total", table="docs") == deleted + 7
    assert local("percolator_gc_safe_point_timestamp") == 1234
    assert local("percolator_gc_passes_total", outcome="failed") >= 1


def test_pending_notifications_gauge_counts_the_backlog(cluster: percolator.Cluster) -> None:
    worker = Worker(cluster, _app.OBSERVERS, threads=1)
    worker.register()
    for i in range(3):
        with Transaction(cluster) as txn:
            txn.set("docs", f"p{i}".encode(), "raw:v", b"x")
    callback = watch_pending_notifications(cluster, ["docs"], every=0)
    try:
        assert list(callback()) == [("percolator_notifications_pending", ("docs",), 3.0)]
        with worker:
            wait_for_observers(cluster)
        assert list(callback()) == [("percolator_notifications_pending", ("docs",), 0.0)]
    finally:
        metrics.remove_gauge_callback(callback)


def test_exposition_is_valid_and_names_follow_conventions() -> None:
    metrics.observe("percolator_read_duration_seconds", 0.003)
    server = metrics.serve(0)
    try:
        samples = scrape(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
    assert value(samples, "percolator_read_duration_seconds_count") >= 1
    assert samples[("percolator_read_duration_seconds_bucket", (("le", "+Inf"),))] >= 1
    for name, (kind, _help, labels, *_) in metrics.METRICS.items():
        assert re.fullmatch(r"percolator_[a-z_]+", name), name
        assert (kind == "counter") == name.endswith("_total"), name
        assert "row" not in labels and "key" not in labels, name


# --- deploy/: dashboard, Prometheus configuration and alert rules ----------------------------

DEPLOY = ROOT / "deploy"


def _series(expr: str) -> set[str]:
    return set(re.findall(r"\b(percolator_[a-z_]+)", expr))


def _known() -> set[str]:
    known = set()
    for name, (kind, *_rest) in metrics.METRICS.items():
        known.add(name)
        if kind == "histogram":
            known |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return known


def test_dashboard_queries_name_existing_metrics(tmp_path: Path) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "percolator.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 8
    used = set().union(*map(_series, exprs))
    assert used and used <= _known(), used - _known()
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("backlog", "throughput", "conflict", "lock wait", "latency", "oracle"):
        assert topic in titles, topic
    promtool = shutil.which("promtool")
    if promtool is not None:  # each query parses as PromQL: promtool checks it as a rule
        rules = {"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]}]}
        path = tmp_path / "dashboard-rules.json"
        path.write_text(json.dumps(rules))  # JSON is YAML
        out = subprocess.run([promtool, "check", "rules", str(path)],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def test_alert_rules_name_existing_metrics_and_pass_promtool() -> None:
    yaml = pytest.importorskip("yaml")
    rules_file = DEPLOY / "prometheus" / "alerts.yml"
    rules = yaml.safe_load(rules_file.read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = set().union(*map(_series, exprs))
    assert used and used <= _known(), used - _known()
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing: scripts/test installs Debian's prometheus")
        pytest.skip("promtool not installed (Debian package prometheus)")
    out = subprocess.run([promtool, "check", "rules", str(rules_file)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run([promtool, "check", "config", "--syntax-only",
                          str(DEPLOY / "prometheus" / "prometheus.yml")],
                         capture_output=True, text=True, cwd=DEPLOY / "prometheus")
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_prometheus_scrapes_every_worker_and_oracle() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    exporting = set()
    for name, service in compose.items():
        command = service.get("command") or []
        if "--metrics-port" in command:
            assert command[command.index("--metrics-host") + 1] == "0.0.0.0", name
            exporting.add(f"{name}:{command[command.index('--metrics-port') + 1]}")
    assert exporting == targets
    assert {"oracle1", "oracle2", "worker"} <= {t.split(":")[0] for t in exporting}
    mounts = " ".join(compose["grafana"]["volumes"])
    assert "./deploy/grafana/dashboards" in mounts


# --- a real Prometheus -----------------------------------------------------------------------

def _query(port: int, promql: str) -> list[dict[str, object]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        answer = json.loads(r.read())
    assert answer["status"] == "success", answer
    result: list[dict[str, object]] = answer["data"]["result"]
    return result


@pytest.mark.oracle
def test_prometheus_scrapes_a_worker_and_an_oracle(
    cluster: percolator.Cluster, store_url: str, tmp_path: Path
) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus missing: scripts/test installs Debian's prometheus")
        pytest.skip("prometheus not installed (Debian package prometheus)")
    oracle_port, oracle_metrics, worker_metrics, prom_port = (free_port() for _ in range(4))
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {"job_name": "percolator-worker",
             "static_configs": [{"targets": [f"127.0.0.1:{worker_metrics}"]}]},
            {"job_name": "percolator-oracle",
             "static_configs": [{"targets": [f"127.0.0.1:{oracle_metrics}"]}]},
        ],
    }))
    procs = []
    with open(tmp_path / "processes.log", "ab") as log:
        def start(*cmd: str) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen([*DIE_WITH_PARENT, *cmd], cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=dict(os.environ, PYTHONPATH=str(ROOT)))
            procs.append(proc)
            return proc

        try:
            start(sys.executable, "-m", "oracle", "--listen", f"127.0.0.1:{oracle_port}",
                  "--state-file", str(tmp_path / "ceiling"),
                  "--metrics-port", str(oracle_metrics))
            start(sys.executable, "-m", "observers", "--cluster", store_url, "--observers",
                  "tests.observers._app:OBSERVERS", "--threads", "1",
                  "--metrics-port", str(worker_metrics))
            start(binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path}/tsdb",
                  f"--web.listen-address=127.0.0.1:{prom_port}")
            Worker(cluster, _app.OBSERVERS).register()  # the writes must set notifications
            for i in range(3):
                with Transaction(cluster) as txn:
                    txn.set("docs", f"q{i}".encode(), "raw:v", b"x")
            wait_for_observers(cluster)
            with OracleClient(f"grpc://127.0.0.1:{oracle_port}") as client:
                client.get_timestamps(5)
            # Wait until Prometheus has scraped both after the work was done.
            queries = {
                'up{job=~"percolator-.*"}': lambda r: len(r) == 2 and all(
                    s["value"][1] == "1" for s in r),  # type: ignore[index]
                "percolator_oracle_leader": lambda r: [s["value"][1] for s in r] == ["1"],  # type: ignore[index]
                "percolator_oracle_timestamps_served_total": lambda r: bool(r) and float(
                    r[0]["value"][1]) >= 5,  # type: ignore[index]
                'sum(percolator_observer_runs_total{outcome="committed"})': lambda r: bool(r)
                and float(r[0]["value"][1]) == 6,  # type: ignore[index]
            }
            end = time.monotonic() + 120
            pending = dict(queries)
            while pending:
                assert all(p.poll() is None for p in procs), \
                    (tmp_path / "processes.log").read_text()[-3000:]
                for promql, ok in list(pending.items()):
                    try:
                        if ok(_query(prom_port, promql)):
                            del pending[promql]
                    except OSError:
                        pass  # Prometheus is starting
                assert time.monotonic() < end, f"never true in Prometheus: {list(pending)}"
                time.sleep(0.5)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_a_real_gc_pass_moves_the_gc_metrics(cluster: percolator.Cluster) -> None:
    for value in (b"1", b"2", b"3"):
        with Transaction(cluster) as txn:
            txn.set("docs", b"row", "c:v", value)
    passes = local("percolator_gc_passes_total", outcome="ok")
    deleted = local("percolator_gc_versions_deleted_total", table="docs")
    summary = cluster.gc(retention=0)
    assert summary.removed_by_table.get("docs", 0) >= 2  # two older versions of the cell
    assert local("percolator_gc_passes_total", outcome="ok") == passes + 1
    assert local("percolator_gc_versions_deleted_total", table="docs") == (
        deleted + summary.removed_by_table["docs"])
    assert local("percolator_gc_safe_point_timestamp") == summary.collected_below
    cluster.gc(retention=0, dry_run=True)  # a dry run changes nothing, metrics included
    assert local("percolator_gc_passes_total", outcome="ok") == passes + 1
