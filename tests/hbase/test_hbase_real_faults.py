"""Real faults of a real HBase: ``kill -9`` of the HBase JVM (master, region server and
ZooKeeper at once) and, separately, of its Thrift1 server, in the middle of the bank
workload, of observer runs and of open scans; then a restart on the same data.

The module has an HBase of its own (``tests/_hbase_local.py``), since it kills it; it
is skipped when ``PERCOLATOR_HBASE_THRIFT`` names another server (one cannot kill that).
What must hold (docs/hbase.md "Faults of a real cluster"):

* while a JVM is down, reads and commits fail with StoreUnavailable (a commit whose
  commit point is not known: CommitUnknownError) within the store's deadline, two
  socket timeouts (a read is sent once more on a new connection), never hang;
* afterwards the bank's total holds, no transfer is half-applied or lost, and reading
  resolves the locks of the clients that died;
* every change is processed by an observer exactly once;
* a scan whose Thrift server restarted resumes after its last row, or fails with
  StoreUnavailable while the server is down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import Observer, Worker, wait_for_observers
from percolator import Snapshot, StoreUnavailable, Transaction, TransactionBase
from percolator._encoding import Lock, decode_lock
from percolator._internals import internals
from percolator._store import Mutation, Read
from percolator.conformance._bank import account
from percolator.stores import open_store
from tests._hbase import ENV, TEST_SERVER, hbase_store_url, require_hbase_client

pytestmark = pytest.mark.hbase

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 8.0
"""The store's socket timeout in these tests: the Thrift server's own client waits up
to 30 s for a dead HBase (hbase.client.operation.timeout in _hbase_local), so the
store gives up first."""
DEADLINE = 2 * TIMEOUT + 5
"""A read meets the socket timeout twice (sent again once on a new connection); 5 s
for connecting and a loaded machine."""
ACCOUNTS = 8
INITIAL = 1000


@pytest.fixture(scope="module")
def hbase() -> Iterator[object]:
    require_hbase_client()
    if os.environ.get(ENV) and os.environ.get(ENV) != TEST_SERVER:
        pytest.skip(f"{ENV} names a server these tests cannot kill")
    from tests._hbase_local import HBaseStartError, LocalHBase
    from tests._services import service_missing

    server = LocalHBase(thrift2=False)  # these kills are of Thrift1's path: one JVM fewer
    try:
        server.start()
    except HBaseStartError as e:
        server.stop()
        service_missing(f"could not start a standalone HBase: {e}")
    try:
        yield server
    finally:
        server.stop()
        for proc in (server.hbase, server.thrift):  # nothing is left running
            assert proc is None or proc.poll() is not None


@pytest.fixture(autouse=True)
def _running_again(hbase: object) -> Iterator[None]:
    """Whatever a test left killed (it failed half-way) is running for the next one."""
    yield
    from tests._hbase_local import LocalHBase

    assert isinstance(hbase, LocalHBase)
    if hbase.hbase is None or hbase.hbase.poll() is not None:
        hbase.start_hbase()
    if hbase.thrift is None or hbase.thrift.poll() is not None:
        hbase.start_thrift()
    hbase.wait_ready()


def _restart(hbase: object, which: str) -> None:
    from tests._hbase_local import LocalHBase

    assert isinstance(hbase, LocalHBase)
    if which == "hbase":
        hbase.start_hbase()
        hbase.wait_ready()
    else:
        hbase.start_thrift()


def _kill(hbase: object, which: str) -> None:
    from tests._hbase_local import LocalHBase

    assert isinstance(hbase, LocalHBase)
    hbase.kill_hbase() if which == "hbase" else hbase.kill_thrift()


def _url(hbase: object, name: str) -> str:
    return hbase_store_url(hbase.hostport, name) + f"&timeout={TIMEOUT:g}"  # type: ignore[attr-defined]


def _connect(url: str, *tables: str) -> percolator.Cluster:
    """A cluster on *url* (with the short socket timeout of these tests), its *tables*
    created first at the store's default timeout: at load 40-60 a table's creation (HBase
    procedures, not the faults under test) ran out the 8 s and failed the test."""
    with percolator.connect(url.replace(f"&timeout={TIMEOUT:g}", "")) as setup:
        for table in tables:
            setup.create_table(table)
    return percolator.connect(url)


def _bank_client(url: str, seed: int, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.transactions._bank_worker", url, str(ACCOUNTS),
         str(seed), str(log), "outages"],
        cwd=ROOT, stderr=subprocess.PIPE,
    )


def _lines(log: Path) -> int:
    return len(log.read_bytes().split()) if log.exists() else 0


def _wait_for(condition: object, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _wait_while_progressing(condition: object, progress: object, what: str,
                            stall: float = 180) -> None:
    """Wait until *condition()* holds, for as long as *progress()* (a value that changes
    as the work advances) keeps changing: give up only after *stall* seconds without a
    change (a hang), not after a fixed total that a loaded machine may need (pytest's
    timeout bounds the test)."""
    last, since = progress(), time.monotonic()  # type: ignore[operator]
    while not condition():  # type: ignore[operator]
        now, seen = time.monotonic(), progress()  # type: ignore[operator]
        if seen != last:
            last, since = seen, now
        elif now - since > stall:
            raise AssertionError(f"timed out waiting for {what}: no progress in {stall:g} s")
        time.sleep(0.1)


def _fails_in_time(call: object) -> BaseException:
    """Run *call*; it must raise StoreUnavailable/CommitUnknownError within DEADLINE."""
    started = time.monotonic()
    with pytest.raises((StoreUnavailable, percolator.CommitUnknownError)) as raised:
        call()  # type: ignore[operator]
    elapsed = time.monotonic() - started
    assert elapsed < DEADLINE, f"failed after {elapsed:.1f} s, past the {DEADLINE} s deadline"
    return raised.value


@pytest.mark.parametrize("which", ["hbase", "thrift"])
def test_bank_survives_kill_9_of_the_server(hbase: object, which: str, tmp_path: Path) -> None:
    url = _url(hbase, f"bank_{which}")
    cluster = _connect(url, "accounts", "transfers")
    with Transaction(cluster) as txn:
        for i in range(ACCOUNTS):
            txn.set("accounts", b"acct%03d" % i, "bal:v", str(INITIAL).encode())
    log = tmp_path / "committed.log"
    clients = [_bank_client(url, seed, log) for seed in (1, 2, 3)]
    try:
        _wait_for(lambda: _lines(log) >= 10, "transfers before the kill")
        _kill(hbase, which)
        before = _lines(log)
        # While it is down, a read and a commit fail within the deadline.
        _fails_in_time(lambda: Snapshot(cluster).get("accounts", b"acct000", "bal:v"))

        def commit() -> None:
            with Transaction(cluster) as txn:
                txn.set("accounts", b"acct000", "note:v", b"x")

        _fails_in_time(commit)
        # A client killed while the server is down leaves its locks (if any) to readers.
        os.kill(clients[0].pid, signal.SIGKILL)
        clients[0].wait()
        _restart(hbase, which)
        clients[0] = _bank_client(url, 4, log)
        _wait_for(lambda: _lines(log) >= before + 10, "transfers after the restart")
        os.kill(clients[1].pid, signal.SIGKILL)  # and one killed mid-transfer, live server
    finally:
        for c in clients:
            c.kill()
            c.wait()
    for c in clients[2:]:
        assert c.returncode == -signal.SIGKILL, c.stderr.read().decode()  # type: ignore[union-attr]

    final = Transaction(cluster)  # reading resolves the dead clients' locks
    balances = {row: int(v["bal:v"]) for row, v in final.scan("accounts")}
    transfers = {row: v["t:move"] for row, v in final.scan("transfers")}
    expected = {b"acct%03d" % i: INITIAL for i in range(ACCOUNTS)}
    for move in transfers.values():  # "src dst amount", accounts by number
        src, dst, n = (int(part) for part in move.split())
        expected[account(src)] -= n
        expected[account(dst)] += n
    assert sum(balances.values()) == ACCOUNTS * INITIAL
    assert balances == expected, "a transfer was half-applied"
    acknowledged = set(log.read_bytes().split())
    assert acknowledged <= set(transfers), "an acknowledged transfer was lost"
    for table in ("accounts", "transfers"):
        for _, cells in internals(cluster).store.scan(table, None, None, [Read("l")]):
            for versions in cells.values():
                state = decode_lock(versions[0][1])
                assert not isinstance(state, Lock), f"a lock was left unresolved: {state}"
    cluster.close()


class Upper(Observer):
    """docs/raw:v -> docs/up:v."""

    table, column = "docs", "raw:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        value = txn.get(self.table, row, column) or b""
        txn.set(self.table, row, "up:v", value.upper())


@pytest.mark.parametrize("which", ["hbase", "thrift"])
def test_observers_process_each_change_once_across_a_kill_9(
    hbase: object, which: str
) -> None:
    cluster = _connect(_url(hbase, f"obs_{which}"), "docs")
    commits: Counter[tuple[bytes, int]] = Counter()
    lock = threading.Lock()

    def on_commit(
        observer: Observer, table: str, row: bytes, column: str, change_ts: int, commit_ts: int
    ) -> None:
        with lock:
            commits[row, change_ts] += 1

    rows = [b"doc%03d" % i for i in range(60)]
    changes: set[tuple[bytes, int]] = set()
    worker = Worker(cluster, [Upper], threads=2, idle_max=0.05, on_commit=on_commit)
    with worker:
        for batch in (rows[:30], rows[30:]):
            with Transaction(cluster) as txn:
                for row in batch:
                    txn.set("docs", row, "raw:v", b"text of " + row)
            assert txn.commit_ts is not None
            changes |= {(row, txn.commit_ts) for row in batch}
            if batch is rows[:30]:
                _wait_for(lambda: len(commits) >= 5, "the observers' first commits")
                _kill(hbase, which)
                time.sleep(2)  # the worker meets the dead server
                _restart(hbase, which)
        wait_for_observers(cluster, timeout=180)
    snapshot = Snapshot(cluster)
    for row in rows:
        assert snapshot.get("docs", row, "up:v") == b"TEXT OF " + row.upper()
    assert set(commits) == changes, "a change was not processed"
    assert max(commits.values()) == 1, "a change was processed twice"
    cluster.close()


@pytest.mark.parametrize("down", [False, True], ids=["restarted", "still-down"])
def test_a_scan_across_a_thrift_restart_resumes_or_fails_clearly(
    hbase: object, down: bool
) -> None:
    store = open_store(_url(hbase, "scan"))
    try:
        store.create_table("t", {"d": 0})
        rows = [b"r%02d" % i for i in range(10)]
        store.mutate_rows("t", [Mutation(row=r, puts=[("d:a", 1, r)]) for r in rows])
        scan = store.scan("t", None, None, [Read("d")], batch_size=2)
        got = [next(scan)[0], next(scan)[0]]  # the scanner is open, on one connection
        _kill(hbase, "thrift")
        if down:
            _fails_in_time(lambda: got.extend(r for r, _ in scan))
        else:
            _restart(hbase, "thrift")
            got.extend(r for r, _ in scan)
            assert got == rows
    finally:
        if down:
            _restart(hbase, "thrift")
        store.close()


@pytest.mark.timeout(900)  # three HBase or Thrift restarts on a loaded 2-core machine
def test_histories_hold_across_kill_9_of_hbase_and_of_thrift(
    hbase: object, tmp_path: Path
) -> None:
    """The nemesis suite's workloads (bank, list-append, observed changes: two client
    processes and an observer worker) on the real HBase while its JVM and then its
    Thrift server are killed and restarted; then its checkers: the bank's invariants,
    the list-append history through tests/faults/_elle.py (no SI anomaly, no lost
    append), every change processed, none twice."""
    import json

    from tests.faults._checks import Report, check_append, check_bank, check_observers, count
    from tests.faults._checks import load as load_histories
    from tests.faults._workload import final

    config = {"store": _url(hbase, "hist"), "oracle": None, "zookeeper": None,
              "dir": str(tmp_path), "deadline": 10.0, "lock_ttl": 3.0,
              "session_timeout": 10.0}
    workload = [sys.executable, "-m", "tests.faults._workload"]
    subprocess.run([*workload, "setup", "--config", json.dumps(config)], cwd=ROOT,
                   check=True, timeout=300)
    procs = [subprocess.Popen([*workload, "run", "--config", json.dumps(config), "--node",
                               f"c{i}", "--seed", str(i), "--kinds", "bank,append,obs"],
                              cwd=ROOT, stderr=subprocess.DEVNULL) for i in (1, 2)]
    observer_log = tmp_path / "observer.log"
    with open(observer_log, "wb") as log_file:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "observers", "--cluster", config["store"],  # type: ignore[list-item]
             "--observers", "tests.faults._workload:OBSERVERS", "--threads", "1",
             "--lock-ttl", "3", "--gc-interval", "0", "--retry-delay", "0.2"],
            cwd=ROOT, stderr=log_file))

    def answered() -> int:
        return sum(p.read_bytes().count(b'"type": "ok"') for p in tmp_path.glob("*.jsonl"))

    began = time.monotonic()

    def phase(what: str) -> None:  # printed with a failure: where the time went
        print(f"{time.monotonic() - began:6.1f} s: {what}", flush=True)

    try:
        def progress(what: str) -> None:
            before = answered()
            _wait_for(lambda: answered() >= before + 15, what, timeout=240)
            phase(what)

        for which in ("hbase", "thrift"):
            progress(f"operations before killing {which}")
            _kill(hbase, which)
            time.sleep(2)  # the clients meet the dead server
            _restart(hbase, which)
            phase(f"{which} restarted")
        progress("operations after the restarts")
        (tmp_path / "stop").touch()
        for p in procs[:2]:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()  # its unanswered operation counts as indeterminate
        phase("clients stopped")
        state: dict[str, Any] = {}

        def caught_up() -> bool:
            final(config, str(tmp_path / "final.json"))
            state.update(json.loads((tmp_path / "final.json").read_text()))
            return bool(state["obs_in"] == state["obs_out"])

        def observed() -> tuple[int, int]:  # the observer's commits, the rows caught up
            inputs, outputs = state.get("obs_in", {}), state.get("obs_out", {})
            return len(state.get("obslog", ())), sum(
                outputs.get(row) == value for row, value in inputs.items())

        try:
            _wait_while_progressing(caught_up, observed, "the observer to process every change")
        except AssertionError as e:
            tail = "\n".join(observer_log.read_text(errors="replace").splitlines()[-60:])
            raise AssertionError(f"{e}; in {state.get('obs_in')}, out {state.get('obs_out')}; "
                                 f"the observer's log ends:\n{tail}") from None
        phase("the observer caught up")
    finally:
        for p in procs:
            p.kill()
            p.wait()
    streams = load_histories(tmp_path)
    report = Report()
    count(streams, report)
    check_bank(streams, state, report)
    check_append(streams, state, report)
    check_observers(streams, state, report)
    print(report.summary())
    assert report.anomalies == {}, report.summary()
    assert report.counts["append"]["ok"] > 0 and report.counts["bank"]["ok"] > 0
