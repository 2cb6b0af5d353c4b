"""Ubiq on Percolator (``observers.ubiq``): a writer appends JSONL records to 20 files
while workers run, a copier replicates them to a second, lagging site, and the
per-unit partial counts (and their roll-up) must equal a batch count over the final
files, exactly: on growing files with records written in halves, with worker
processes killed with ``kill -9``, with a SIGSTOPped owner past its lease, crash points
in the unit commit, a corrupt record, the file sink, and truncated or replaced files."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import zlib
from pathlib import Path

import pytest

import percolator
from observers import VerifyReport, Worker, ubiq, wait_for_observers
from observers.ubiq import _pipeline
from observers.ubiq.__main__ import main as ubiq_main
from percolator import Cluster, ConflictError, Snapshot, Transaction
from percolator._coordination import LocalCoordination
from percolator._internals import internals
from percolator._notifications import pending_notifications
from percolator.testing import CrashPoint, Interleaving, client_of, crash_commit
from tests._backends import (
    BACKENDS,
    SQLITE_AND_BIGTABLE,
    backend_fixture,
    drop_tables,
    make_store_url,
)
from tests._concurrency import spawn_module
from tests.ubiq import _app

ROOT = Path(__file__).resolve().parents[2]


# Ubiq's code is the same on every store (it never asks which one it runs on): its tests
# run on the embedded store (notifications found by scans) and on Bigtable (by the
# notification index). On HBase, where each test makes and drops its pipeline's tables,
# only the growing files end to end and the kills at every store call of taking a unit
# (whose steps are each store's own calls) run: HBase's own part, the store contract,
# the transactions' crash points and the observers' scans, has tests of its own there
# (CONTRIBUTING.md, "Test suite time").
backend = backend_fixture(SQLITE_AND_BIGTABLE)


def settle(p: ubiq.LogPipeline, timeout: float = 120) -> None:
    """Until every tracked byte is committed or quarantined and nothing is pending."""
    deadline = time.monotonic() + timeout
    while True:
        report = p.coverage()
        if report and not any(report.values()):
            break
        assert time.monotonic() < deadline, {k: v for k, v in report.items() if v}
        time.sleep(0.1)
    wait_for_observers(p.cluster, timeout)


def run_writer(p: ubiq.LogPipeline, writer: _app.Writer, site: str = "a",
               threads: int = 2) -> None:
    """The writer and the copier run while a worker (cutter, processor at *site*,
    dispatcher, roll-up, both sites' trackers, lease sweep) processes."""
    with Worker(p.cluster, [*p.observers(site), _app.RollUp], tasks=p.tasks(),
                threads=threads):
        writer.start()
        writer.join(120)
        settle(p)


def assert_exact(p: ubiq.LogPipeline, root: Path) -> None:
    reference = _app.batch_counts(root / "a")
    assert _app.partial_totals(p.cluster) == reference
    with Snapshot(p.cluster) as snap:
        totals = {row.decode(): int(c["t:n"]) for row, c in snap.scan(_app.TOTALS)}
    assert totals == dict(reference)  # the roll-up of the partials, once each
    assert all(not problems for problems in p.coverage().values()), p.coverage()


@pytest.mark.parametrize("backend", BACKENDS)
def test_exactly_once_on_growing_files(cluster: Cluster, backend: str, tmp_path: Path) -> None:
    # Fewer records on HBase (32 units instead of 75), where each unit's commit and its
    # roll-ups cost round trips to the JVMs: the embedded store and Bigtable carry the
    # volume, HBase the same growing files cut into units (CONTRIBUTING.md, the suite's
    # time).
    records = 600 if backend == "hbase" else 1500
    reported: list[str] = []
    p = _app.pipeline(cluster, tmp_path, unit_bytes=512,
                      on_commit=lambda unit: reported.append(unit.id))
    p.create()
    run_writer(p, _app.Writer(tmp_path, files=20, records=records, seed=1))
    assert_exact(p, tmp_path)
    assert p.quarantined() == []  # no record was ever cut in two
    with Snapshot(cluster) as snap:
        units = [c for _, c in snap.scan(p.units, None, None, ["u:state"])]
    assert len(units) > 40 * records // 1500 and {c["u:state"] for c in units} == {b"C"}
    assert len(reported) == len(set(reported)) == len(units)  # on_commit: once a unit


def test_a_corrupt_record_is_split_off_and_quarantined(cluster: Cluster, tmp_path: Path) -> None:
    p = _app.pipeline(cluster, tmp_path)
    p.create()
    run_writer(p, _app.Writer(tmp_path, files=3, records=300, seed=2, corrupt=2))
    assert_exact(p, tmp_path)  # everything else committed
    bad = p.quarantined()
    assert len(bad) == 2
    for name, begin, end, error in bad:
        data = (tmp_path / "a" / name).read_bytes()[begin:end]
        assert data == b"{not json\n" and "bad record" in error
    # the operator fixes the data's reader and puts the ranges back
    p.app = _app.Counts()
    for name, begin, _, _ in bad:
        (tmp_path / "a" / name).write_bytes((tmp_path / "a" / name).read_bytes().replace(
            b"{not json\n", b'{"k":"X"}\n'))  # the same length: offsets hold
        p.retry_range(name, begin)
    with Worker(cluster, [*p.observers("a"), _app.RollUp], threads=1):
        settle(p)
    assert p.quarantined() == []
    assert _app.partial_totals(cluster)["X"] == 2


def test_a_unit_commit_dying_at_any_point_lands_whole_or_not_at_all(
    store_url: str, tmp_path: Path
) -> None:
    """Four units' commits die each at a point of its commit (before, at and after
    the commit point), each unit of a file of its own; a live worker then takes the
    dead owner's leases over: every unit lands once, whole, and its attempt is
    recorded. (One pipeline for the four points: a pipeline per point made and dropped
    its tables four times on HBase.)"""
    points = (CrashPoint("prewrite", 0), CrashPoint("prewrite", 2),
              CrashPoint("commit_point"), CrashPoint("commit", 1))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with percolator.connect(store_url) as cluster:
        p = _app.pipeline(cluster, tmp_path, max_unit_delay=0)
        p.create()
        attempts = []
        for n, point in enumerate(points):
            name = f"one{n}.jsonl"
            (tmp_path / "a" / name).write_bytes(
                b"".join(json.dumps({"k": f"k{i % 3}"}).encode() + b"\n" for i in range(30)))
            p.track("a")
            assert _app.cut(p, name) == 1
            row = _pipeline.unit_row(name, 0)
            dying = client_of(cluster)
            dying.one_phase_commit = False
            owner = internals(dying).coordination.current_owner()
            assert _pipeline._take_lease(dying, p, row, owner, _pipeline._now_ms())
            txn = Transaction(dying)
            unit = ubiq.WorkUnit(name, 0, 30 * 11, tmp_path / "a" / name, "a")
            unit.end = int(Snapshot(cluster).get(p.units, row, "u:range") or b"0")
            p.app.process(unit, ubiq.Output(txn, tmp_path / "staging"))
            assert _pipeline.finish_unit(txn, p, row, owner, "attempt", [])
            # its owner is now dead: its lease is taken over at once
            assert crash_commit(txn, point) == (point.phase != "prewrite")
            attempts.append(f"{name}@0-{unit.end}".encode())
        with Worker(cluster, [*p.observers("a"), _app.RollUp], tasks=p.tasks("a"), threads=1):
            settle(p)
        assert_exact(p, tmp_path)
        with Snapshot(cluster) as snap:
            for attempt in attempts:
                assert snap.get(_app.ATTEMPTS, attempt, "a:owner") is not None, attempt


def _kill_while_taking_a_unit(url: str, root: Path, kill_at: int, one_phase: bool) -> bool:
    """Kill the processor's run on a fresh unit (of a file of its own) before its
    *kill_at*-th step (or once it returned, with the thread it handed the unit to not
    yet run: the process died); check that nothing is stranded and that a live worker
    then commits the unit exactly once. Returns whether the run had returned."""
    name = f"one{kill_at}.jsonl"
    (root / "a" / name).write_bytes(
        b"".join(json.dumps({"k": f"k{i % 3}"}).encode() + b"\n" for i in range(30)))
    row = _pipeline.unit_row(name, 0)
    with percolator.connect(url) as cluster:  # a fresh client: its first calls are steps too
        p = _app.pipeline(cluster, root, max_unit_delay=0, local_eta=600)
        p.create()  # made by the first kill point, found by the others
        p.track("a")
        assert _app.cut(p, name) == 1
        handed: list[bytes] = []
        with Interleaving(cluster) as world:
            dying = client_of(cluster)
            dying.one_phase_commit = one_phase
            observers = _app.pipeline(dying, root).observers("a")
            processor = next(o for o in observers if isinstance(o, _pipeline._Processor))
            processor._start = lambda row, owner: handed.append(row)  # type: ignore[method-assign]
            worker = Worker(dying, observers, threads=1)
            worker.register()
            run = world.actor("processor", lambda: worker._scanner.serve_row(p.units, row),
                              clients=[dying])
            for _ in range(kill_at):
                run.step()
                if run.done:
                    break
            returned = run.done
            run.kill()
        assert not returned or handed == [row]  # it did hand the unit on
        assert p.stranded() == [], f"stranded when killed before step {kill_at}"
        with Worker(cluster, [*p.observers("a"), _app.RollUp], tasks=p.tasks("a"),
                    threads=1):
            settle(p)
        assert_exact(p, root)  # this unit once, and every unit before it still once
    return returned


@pytest.mark.parametrize("one_phase", [True, False], ids=["one-phase", "two-phase"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_dying_at_any_step_of_taking_a_unit_strands_nothing(
    store_url: str, tmp_path: Path, one_phase: bool
) -> None:
    """The processor's run on a ready unit (acknowledging its notification, handing
    the unit to a thread) is killed before each of its store calls in turn, and
    finally just after it returned, before the thread it started ran. Each time the
    unit must keep a notification or a lease, and a live worker with the lease sweep
    must then commit it exactly once. Fails when the lease is taken by the thread
    rather than in the acknowledging transaction: killed after the acknowledgement,
    the unit has neither, and is pending for ever.

    Each kill point takes the unit of a file of its own, in the same tables, whose
    earlier units are all committed: the run's steps on it are those on a fresh
    pipeline's unit (new tables for each point made this the suite's slowest test on
    HBase: eight creations and drops per point, 14 points, over 200 s)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    kill_at = 0
    while not _kill_while_taking_a_unit(store_url, tmp_path, kill_at, one_phase):
        kill_at += 1
    assert kill_at > 3
    with percolator.connect(store_url) as cluster:
        drop_tables(cluster)


def test_the_lease_sweep_wakes_a_unit_an_older_version_stranded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit left as an older processor left it when its process died after the
    acknowledgement (pending, no lease, no notification) is listed by stranded() and
    coverage(), and the next lease sweep wakes it; a worker then commits it once."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "one.jsonl").write_bytes(b'{"k":"k"}\n' * 20)
    row = _pipeline.unit_row("one.jsonl", 0)
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        p = _app.pipeline(cluster, tmp_path, max_unit_delay=0)
        p.create()
        p.track("a")
        assert _app.cut(p, "one.jsonl") == 1
        assert p.stranded() == [] and p.sweep_leases() == 0  # notified: not stranded
        with monkeypatch.context() as old:  # the lease left to a thread that never ran
            old.setattr(_pipeline, "_lease_unit", lambda *args, **kwargs: [("one.jsonl", 0, 200)])
            old.setattr(_pipeline._Processor, "_start", lambda self, row, owner: None)
            worker = Worker(cluster, p.observers("a"), threads=1)
            worker.register()
            worker._scanner.serve_row(p.units, row)
        assert p.stranded() == [row]
        assert p.coverage()["one.jsonl"] == [
            "1 unit(s) pending, 1 with neither a lease nor a notification"]
        assert p.sweep_leases() == 1
        assert p.stranded() == []
        with Worker(cluster, [*p.observers("a"), _app.RollUp], threads=1):
            settle(p)
        assert_exact(p, tmp_path)


def test_a_worker_at_a_lagging_site_reads_what_its_replica_lacks_elsewhere(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Site b holds only the first half of the file (its copy lags): a worker at site
    b commits every unit, reading the rest from site a; nothing is quarantined."""
    p = _app.pipeline(cluster, tmp_path, unit_bytes=256, max_unit_delay=0)
    for site in "ab":
        (tmp_path / site).mkdir()
    data = b"".join(json.dumps({"k": f"k{i % 4}"}).encode() + b"\n" for i in range(200))
    (tmp_path / "a" / "lag.jsonl").write_bytes(data)
    (tmp_path / "b" / "lag.jsonl").write_bytes(data[: data.index(b"\n", len(data) // 2) + 1])
    p.create()
    p.track("a")
    p.track("b")
    with Worker(cluster, [*p.observers("b"), _app.RollUp], threads=1):
        settle(p)
    assert p.quarantined() == []
    assert_exact(p, tmp_path)


def test_refuses_a_truncated_or_replaced_file(cluster: Cluster, tmp_path: Path) -> None:
    p = _app.pipeline(cluster, tmp_path)
    for site in "ab":
        (tmp_path / site).mkdir()
    p.create()
    line = json.dumps({"k": "k", "pad": "x" * 100}).encode() + b"\n"
    (tmp_path / "a" / "short.jsonl").write_bytes(line * 20)
    (tmp_path / "a" / "swapped.jsonl").write_bytes(line * 20)
    p.track("a")
    (tmp_path / "a" / "short.jsonl").write_bytes(line * 5)  # truncated
    (tmp_path / "a" / "swapped.jsonl").write_bytes(line.replace(b"k", b"j") * 30)  # replaced
    p.track("a")
    with Snapshot(cluster) as snap:
        refused = {row.decode(): c["f:refused"].decode()
                   for row, c in snap.scan(p.files, None, None, ["f:refused"])}
    assert "truncated" in refused["short.jsonl"] and "replaced" in refused["swapped.jsonl"]
    with Snapshot(cluster) as snap:  # never grows again, never processed twice
        assert snap.get(p.files, b"swapped.jsonl", "f:size") == b"%d" % (len(line) * 20)


# --- processes ------------------------------------------------------------------------------


def _spawn(url: str, root: Path, site: str, **env: str) -> subprocess.Popen[bytes]:
    return spawn_module("observers.ubiq", "run", "--cluster", url, "--pipeline",
                        "tests.ubiq._app:make", "--site", site, "--threads", "2",
                        env={"UBIQ_ROOT": str(root), **env})


# 150 small files on Bigtable is held back (--run-slow): 78-115 s in the suite, and
# nothing in it is Bigtable's own. The packing of small files' tails under kills runs
# on SQLite; Bigtable's notification index under the same kills with 20 files (the
# suite's time, CONTRIBUTING.md).
@pytest.mark.parametrize(("files", "backend"), [
    pytest.param(20, "sqlite", id="20-files-sqlite"),
    pytest.param(20, "bigtable", id="20-files-bigtable", marks=pytest.mark.bigtable),
    pytest.param(150, "sqlite", id="150-small-files-sqlite"),
    pytest.param(150, "bigtable", id="150-small-files-bigtable",
                 marks=[pytest.mark.bigtable, pytest.mark.slow]),
])
def test_workers_killed_mid_unit_and_the_file_sink(
    backend: str, files: int, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Three run processes (two at site a, one at the lagging site b), each also a
    tracker and a cutter; one is SIGKILLed every so often and restarted while the
    writer appends. Counts stay exact, and the sink holds exactly one counts file per
    committed unit, each equal to what that unit committed. With 150 files of about
    ten records, tails are packed into units of several files."""
    import random

    url = make_store_url(backend, request, tmp_path)
    with percolator.connect(url) as cluster:
        _app.pipeline(cluster, tmp_path).create()
    env = {"UBIQ_FILES": "1", "UBIQ_SLOW": "0.02"}
    writer = _app.Writer(tmp_path, files=files, records=1500, seed=3)
    procs = [_spawn(url, tmp_path, site, **env) for site in ("a", "a", "b")]
    rng = random.Random(5)
    kills = 0
    try:
        writer.start()
        end = time.monotonic() + 6
        while time.monotonic() < end or not writer.done.is_set():
            time.sleep(rng.uniform(0.4, 0.9))
            i = rng.randrange(3)
            procs[i].send_signal(signal.SIGKILL)
            procs[i].wait()
            procs[i] = _spawn(url, tmp_path, "ab"[i // 2], **env)
            kills += 1
        with percolator.connect(url) as cluster:
            p = _app.pipeline(cluster, tmp_path, app=_app.Counts(files=True))
            with Worker(cluster, [*p.observers("a"), _app.RollUp], tasks=p.tasks(),
                        threads=2):
                settle(p, timeout=300)
            assert_exact(p, tmp_path)
            with Snapshot(cluster) as snap:
                committed = {row for row, c in snap.scan(p.units, None, None, ["u:state"])
                             if c["u:state"] == b"C"}
            published = sorted(f.name for f in (tmp_path / "sink").glob("*.counts.json"))
            expected = sorted("{}@{}.counts.json".format(*_pipeline.parse_unit_row(row))
                              for row in committed)
            assert published == expected
            total = sum((json.loads((tmp_path / "sink" / f).read_bytes()).get(k, 0)
                         for f in published for k in _app.batch_counts(tmp_path / "a")), 0)
            assert total == sum(_app.batch_counts(tmp_path / "a").values())
            with Snapshot(cluster) as snap:
                packed = sum(1 for _ in snap.scan(p.units, None, None, ["u:parts"]))
            assert packed or files < 100, "small files were cut one unit each"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert kills >= 5


def _stop_outside_the_store(proc: subprocess.Popen[bytes], db: Path, table: str,
                            row: bytes) -> None:
    """SIGSTOP *proc* at a moment it holds no write lock of the embedded store *db*
    (SQLite's, the writers' turn, the timestamp file, the census) nor the advisory
    lock of *row* (a scanner's, while it runs an observer there): stopped inside one,
    it would stall every other process on the file (an embedded store's single
    writer), or keep the row from every other worker for as long as it is stopped
    (local coordination's locks are released when a process dies, not when it
    stops); the test would measure that instead of the lease."""
    watched = set()
    for suffix in ("", "-shm", "-wal", "-ts", "-write.lock", "-census"):
        with contextlib.suppress(FileNotFoundError):
            watched.add(os.stat(f"{db}{suffix}").st_ino)
    locks_file = os.stat(f"{db}-locks").st_ino
    row_byte = str(zlib.crc32(f"{table}/{row.hex()}".encode()) % LocalCoordination.BUCKETS)
    for _ in range(1000):
        proc.send_signal(signal.SIGSTOP)
        with open("/proc/locks") as f:  # "1: POSIX ADVISORY WRITE 123 fd:01:4567 0 EOF"
            held = [fields for fields in map(str.split, f)
                    if len(fields) > 7 and fields[1] != "->" and fields[4] == str(proc.pid)]
        if not any((fields[3] == "WRITE" and int(fields[5].rsplit(":", 1)[1]) in watched)
                   or (int(fields[5].rsplit(":", 1)[1]) == locks_file and fields[6] == row_byte)
                   for fields in held):
            return
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError("the process always held a lock of the store or of the row")


def test_a_stopped_owner_past_its_lease_loses_the_unit(tmp_path: Path) -> None:
    """A run process takes a unit and is SIGSTOPped mid-unit (alive, but stuck) past
    its lease; another worker takes the unit over and commits it; woken, the stopped
    process's commit fails and its output never appears."""
    url = f"sqlite:///{tmp_path}/repo.db"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "one.jsonl").write_bytes(b'{"k":"k"}\n' * 50)
    with percolator.connect(url) as cluster:
        p = _app.pipeline(cluster, tmp_path, local_eta=1.0, max_unit_delay=0)
        p.create()
        stuck = _spawn(url, tmp_path, "a", UBIQ_SLOW="2", UBIQ_ETA="1")
        try:
            row = _pipeline.unit_row("one.jsonl", 0)
            deadline = time.monotonic() + 60
            while Snapshot(cluster).get(p.units, row, "u:lease") is None:
                assert time.monotonic() < deadline, "the process never took the unit"
                time.sleep(0.02)
            _stop_outside_the_store(stuck, tmp_path / "repo.db", p.units, row)
            owner = json.loads(Snapshot(cluster).get(p.units, row, "u:lease") or b"{}")["owner"]
            time.sleep(1.2)  # past its lease
            # No periodic tasks here: the stopped process may hold their (local, fcntl)
            # singleton lock; the test sweeps the leases itself.
            with Worker(cluster, [*p.observers("a"), _app.RollUp], threads=1):
                deadline = time.monotonic() + 180  # a loaded 2-core machine is slow
                while Snapshot(cluster).get(p.units, row, "u:state") != b"C":
                    assert time.monotonic() < deadline, (
                        "nobody took the unit over", _pipeline._now_ms(), p._pending_units(),
                        Snapshot(cluster).get_row(p.units, row, ["u:state", "u:lease", "u:ready"]),
                        internals(cluster).coordination.is_alive(owner))
                    p.sweep_leases()
                    time.sleep(0.1)
                settle(p)
            assert Snapshot(cluster).get(_app.ATTEMPTS, b"one.jsonl@0-500", "a:owner") == (
                str(os.getpid()).encode())
            stuck.send_signal(signal.SIGCONT)
            time.sleep(3)  # it finishes its unit and tries to commit
            wait_for_observers(cluster, 60)
            assert Snapshot(cluster).get(_app.ATTEMPTS, b"one.jsonl@0-500", "a:owner") == (
                str(os.getpid()).encode())  # the stopped one's output never appeared
            assert json.loads(Snapshot(cluster).get(p.units, row, "u:commit") or b"{}")[
                "owner"] != owner
            assert_exact(p, tmp_path)
        finally:
            stuck.send_signal(signal.SIGCONT)
            stuck.kill()
            stuck.wait()


def test_the_cli_reports_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/repo.db"
    monkeypatch.setenv("UBIQ_ROOT", str(tmp_path))
    args = ["--cluster", url, "--pipeline", "tests.ubiq._app:make"]
    with percolator.connect(url) as cluster:
        p = _app.pipeline(cluster, tmp_path)
        p.create()
        run_writer(p, _app.Writer(tmp_path, files=2, records=100, seed=4, corrupt=1))
        name, begin, _, _ = p.quarantined()[0]
    assert ubiq_main(["verify", *args]) == 0
    assert ubiq_main(["status", *args]) == 0
    out = capsys.readouterr().out
    assert "quarantined log" in out and "committed" in out
    assert ubiq_main(["retry-range", *args, name, str(begin)]) == 0
    with percolator.connect(url) as cluster:
        report = _app.pipeline(cluster, tmp_path).verify()
    assert isinstance(report, VerifyReport) and not report and not report.ok
    gap = f"{name}: gap at {begin}; 1 unit(s) pending"
    assert report.problems == [gap] and report.files[name] == gap.split(": ", 1)[1].split("; ")
    assert len(report.files) == 2
    assert ubiq_main(["verify", *args]) == 1  # a range back to pending: not covered yet
    out = capsys.readouterr().out
    assert out.endswith(f"{gap}\n2 file(s); VIOLATIONS FOUND\n"), out
    assert ubiq_main(["retry-range", *args, "nope", "0"]) == 2


def test_many_small_files_make_few_units_oldest_first(cluster: Cluster, tmp_path: Path) -> None:
    """Twelve files of 100 bytes, reported in an order unlike their names' and cut
    (their tails due) when the newest is: three units of four files each, each
    unit's files the next oldest (Ubiq's work-unit creator). Before processing,
    `coverage` reports each file's part pending (its unit's state); after, every
    file is covered exactly once and the counts are exact. Fails with one unit per
    file, with tails taken in name order rather than oldest first, and when a part
    is judged by its own row's state rather than its unit's."""
    from observers._logs import head_digest

    p = _app.pipeline(cluster, tmp_path, unit_bytes=400, max_unit_delay=1.0)
    p.create()
    names = [f"s{i:02d}.jsonl" for i in range(12)]
    for site in "ab":
        (tmp_path / site).mkdir()
        for i, name in enumerate(names):
            record = b'{"k": "k%d", "pad": "%s"}\n' % (i % 3, b"x" * 20)
            (tmp_path / site / name).write_bytes(record * 2 + b'{"k": "k%02d"} \n' % i)
    size = (tmp_path / "a" / names[0]).stat().st_size
    assert size == 100
    oldest_first = [names[(5 * i) % 12] for i in range(12)]  # 5 is prime to 12
    base = _pipeline._now_ms() - 60_000
    for age, name in enumerate(oldest_first):
        for site in "ab":
            path = tmp_path / site / name
            assert _pipeline._report(cluster, p, name, site, size, head_digest(path),
                                     base + age, base + age)
    with Transaction(cluster) as txn:  # its tail is left to the packer
        assert _pipeline.cut_file(txn, p, oldest_first[-1], _pipeline._now_ms()) == 0
    with Transaction(cluster) as txn:
        assert _pipeline.pack_tails(txn, p, _pipeline._now_ms()) == 3
    with Snapshot(cluster) as snap:
        units = [json.loads(cells["u:parts"]) for _, cells in
                 snap.scan(p.units, None, None, ["u:parts", "u:state"]) if "u:state" in cells]
    assert sorted(units) == sorted([[name, 0, size] for name in oldest_first[i:i + 4]]
                                   for i in (0, 4, 8))
    assert p.coverage() == {name: ["1 unit(s) pending"] for name in names}
    with Worker(cluster, [*p.observers("a"), _app.RollUp], tasks=p.tasks(), threads=2):
        settle(p)
    assert_exact(p, tmp_path)


def test_a_file_cut_into_units_then_a_short_tail_has_its_tail_in_a_unit(
        cluster: Cluster, tmp_path: Path) -> None:
    """A file of two units and a short tail, and a small file: its cutter makes the
    two units, the packer a unit of the tail with the small file, and the file's
    rows partition it. Fails when the tail is left out of every unit though f:cut
    passes it (a packing that took the file's row as read before its units)."""
    p = _app.pipeline(cluster, tmp_path, unit_bytes=400, max_unit_delay=0)
    p.create()
    record = b'{"k": "k1", "pad": "%s"}\n' % (b"x" * 20)  # 43 bytes
    for site in "ab":
        (tmp_path / site).mkdir()
        (tmp_path / site / "big.jsonl").write_bytes(record * 25)
        (tmp_path / site / "small.jsonl").write_bytes(record * 2)
    p.track("a")
    assert _app.cut(p, "big.jsonl") == 3
    with Snapshot(cluster) as snap:
        rows = {_pipeline.parse_unit_row(row): int(cells["u:range"])
                for row, cells in snap.scan(p.units, None, None, ["u:range"])}
    assert rows == {("big.jsonl", 0): 430, ("big.jsonl", 430): 860,
                    ("big.jsonl", 860): 1075, ("small.jsonl", 0): 86}
    assert p.coverage() == {"big.jsonl": ["3 unit(s) pending"],
                            "small.jsonl": ["1 unit(s) pending"]}


def test_the_cutters_of_many_due_tails_never_conflict_and_one_packer_run_packs_them(
        cluster: Cluster, tmp_path: Path) -> None:
    """Twenty small files, every tail due, and every file's cutter run at once (each
    from a snapshot taken before any of them commits, as a scanner's group of runs
    is): all twenty commit, they wake the packer, and one run of it cuts every tail,
    five units of four files. Fails when each cutter packs the tails it sees: every
    packing cut writes the f:cut of the oldest tails, so all but one of the cutters
    conflict and run again, each reading every file row again (issue 35's 0.48x)."""
    p = _app.pipeline(cluster, tmp_path, unit_bytes=400, max_unit_delay=0)
    p.create()
    names = [f"s{i:02d}.jsonl" for i in range(20)]
    for site in "ab":
        (tmp_path / site).mkdir()
        for i, name in enumerate(names):
            (tmp_path / site / name).write_bytes(b'{"k": "k%02d", "pad": "%s"}\n' % (
                i, b"x" * 74))
    p.track("a")
    now = _pipeline._now_ms()
    cutters = [Transaction(cluster) for _ in names]
    made = [_pipeline.cut_file(txn, p, name, now) for txn, name in zip(cutters, names, strict=True)]
    conflicts = 0
    for txn in cutters:
        try:
            txn.commit()
        except ConflictError:
            conflicts += 1
    assert conflicts == 0 and made == [0] * 20
    assert {(n.row, n.column) for n in pending_notifications(cluster, [p.packer])} == {
        (b"tails", "k:due")}
    with Transaction(cluster) as txn:
        assert _pipeline.pack_tails(txn, p, now) == 5
    with Snapshot(cluster) as snap:
        units = [json.loads(cells["u:parts"]) for _, cells in
                 snap.scan(p.units, None, None, ["u:parts", "u:state"]) if "u:state" in cells]
    assert sorted(len(parts) for parts in units) == [4] * 5
    assert p.coverage() == {name: ["1 unit(s) pending"] for name in names}
