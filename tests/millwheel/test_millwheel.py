"""MillWheel on Percolator (``observers.millwheel``): the slides' Zeitgeist example
(windowed counts per query, then dips) must equal a batch group-by of the same input
exactly: with worker and injector processes killed with ``kill -9``, crash points in
the injector's and the key run's commits, restarts that replay the source, random
schedules (hypothesis: the watermark never goes back, no window fires early), a
second windowed stage downstream driven step by step (no timer fires before what it
waits for has reached it), late records, and bad topologies."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import percolator
from observers import VerifyReport, Worker, wait_for_observers
from observers import millwheel as mw
from observers._changes import TableChanges
from observers.millwheel import _pipeline
from observers.millwheel.__main__ import main as mw_main
from percolator import Cluster, Snapshot, Transaction
from percolator.ext import pending_notifications
from percolator.testing import CrashPoint, client_of, crash_commit
from tests._backends import (
    BACKENDS,
    SQLITE_AND_BIGTABLE,
    backend_fixture,
    drop_tables,
    make_store_url,
)
from tests._concurrency import spawn_module
from tests.millwheel import _app

ROOT = Path(__file__).resolve().parents[2]
END = mw.END_OF_TIME


# MillWheel's code is the same on every store (it never asks which one it runs on): its
# tests run on the embedded store (notifications found by scans) and on Bigtable (by the
# notification index). On HBase, where each test makes and drops its pipeline's tables,
# only the Zeitgeist pipeline end to end runs: HBase's own part, the store contract, the
# transactions' crash points and the observers' scans, has tests of its own there
# (CONTRIBUTING.md, "Test suite time").
backend = backend_fixture(SQLITE_AND_BIGTABLE)


def run_to_the_end(pipeline: mw.Pipeline, timeout: float = 120) -> None:
    """A worker with the pipeline's tasks until every watermark reached the end of the
    input and nothing is pending."""
    cluster = pipeline.cluster
    with Worker(cluster, pipeline.observers(), tasks=pipeline.tasks(), threads=2):
        deadline = time.monotonic() + timeout
        while not all(s.low_watermark >= END for s in pipeline.status()):
            assert time.monotonic() < deadline, pipeline.status()
            time.sleep(0.05)
        wait_for_observers(cluster, timeout)


def assert_exact(pipeline: mw.Pipeline, records: list[tuple[bytes, int]]) -> None:
    found, twice = _app.results(pipeline)
    reference = _app.batch_windows(records)
    assert found == reference
    assert twice == 0  # every window emitted once
    with Snapshot(pipeline.cluster) as snap:
        dips = {(json.loads(r.value)["q"], json.loads(r.value)["start"])
                for r in pipeline.output(snap, "dips")}
    assert dips == _app.batch_dips(reference)
    assert pipeline.verify().problems == []
    assert all((s.pending, s.timers, s.late) == (0, 0, 0) for s in pipeline.status())


@pytest.mark.parametrize("backend", BACKENDS)
def test_zeitgeist_windows_equal_a_batch_group_by(cluster: Cluster) -> None:
    records = _app.make_input(1, 600, queries=4)
    pipeline = _app.build(cluster, records, inject_batch=100)
    pipeline.create()
    run_to_the_end(pipeline)
    assert_exact(pipeline, records)


def test_a_restarted_injector_replays_nothing_twice(cluster: Cluster) -> None:
    """The source position commits with the records: a new process (a new Pipeline
    object over the same source) goes on where the last commit left off, and an
    injection that dies at any point of its commit is either all there or redone."""
    records = _app.make_input(2, 300, queries=3)
    first = _app.build(cluster, records, inject_batch=40)
    first.create()
    assert first.inject("queries") == 40
    for point in (CrashPoint("prewrite", 0), CrashPoint("prewrite", 3),
                  CrashPoint("commit_point"), CrashPoint("commit", 2)):
        dying = client_of(cluster)
        dying.one_phase_commit = False
        txn = Transaction(dying)
        _pipeline._inject(txn, first, first.injectors["queries"], 40)
        crash_commit(txn, point)
    again = _app.build(cluster, records, inject_batch=40)  # a restarted process
    run_to_the_end(again)
    assert_exact(again, records)


def test_a_key_run_dying_inside_its_commit_is_all_or_nothing(store_url: str) -> None:
    """A Windower run that consumes records, fires a timer, arms timers and produces
    a window dies at each point of its commit, each on a query of its own; the rest
    of the pipeline then runs. Counts stay exact, per query: each run's effects
    landed together or not at all. (One pipeline for the four points, each owning a
    key: on HBase a pipeline per point made and dropped its tables four times.)"""
    points = (CrashPoint("prewrite", 0), CrashPoint("prewrite", 2),
              CrashPoint("commit_point"), CrashPoint("commit", 1))
    with percolator.connect(store_url) as cluster:
        records = _app.make_input(3, 240, queries=len(points))
        pipeline = _app.build(cluster, records)
        pipeline.create()
        pipeline.inject("queries")
        pipeline.advance()  # the end of input: every timer of every query is due
        node = pipeline.nodes["Windower"]
        for key, point in zip((b"q%d" % i for i in range(len(points))), points, strict=True):
            dying = client_of(cluster)
            dying.one_phase_commit = False
            txn = Transaction(dying)
            _pipeline._KeyRun(txn, pipeline, node, key).run()
            assert txn.writes  # consumed, fired and produced something
            crash_commit(txn, point)
        run_to_the_end(pipeline)
        assert_exact(pipeline, records)
        drop_tables(cluster)


def _spawn(url: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return spawn_module("observers.millwheel", "run", "--cluster", url, "--pipeline",
                        "tests.millwheel._app:make", "--threads", "2", env=env)


@pytest.mark.parametrize("backend", SQLITE_AND_BIGTABLE)
def test_workers_and_injectors_killed_with_sigkill_keep_counts_exact(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Two worker processes, each running key runs, the injector and the advancer,
    are killed with SIGKILL at random and restarted while the input flows (20
    records per injection, so injections die halfway too)."""
    url = make_store_url(backend, request, tmp_path)
    # Fewer on Bigtable, where each record costs several emulator round trips: the
    # kills land in the first six seconds either way (the suite's time, CONTRIBUTING.md).
    n = 1200 if backend == "sqlite" else 600
    env = {"MW_SEED": "4", "MW_RECORDS": str(n), "MW_BATCH": "20"}
    records = _app.make_input(4, n)
    rng = random.Random(17)
    with percolator.connect(url) as cluster:  # a loaded machine may kill every worker
        _app.build(cluster, records, inject_batch=20).create()  # before it gets this far
    workers = [_spawn(url, env) for _ in range(2)]
    kills = 0
    try:
        end = time.monotonic() + 6
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.3, 0.8))
            i = rng.randrange(2)
            workers[i].send_signal(signal.SIGKILL)
            workers[i].wait()
            workers[i] = _spawn(url, env)
            kills += 1
        with percolator.connect(url) as cluster:
            pipeline = _app.build(cluster, records, inject_batch=20)
            run_to_the_end(pipeline, timeout=300)
            assert_exact(pipeline, records)
    finally:
        for proc in workers:
            proc.kill()
            proc.wait()
    assert kills >= 5


class _Recorder(_app.Windower):
    """The Windower, recording each firing with the watermarks its run saw."""

    name = "Windower"
    fired: list[tuple[int, int]] = []

    def process_timer(self, ctx: mw.Context, timer: mw.Timer) -> None:
        _Recorder.fired.append((timer.time, ctx.input_watermark))
        super().process_timer(ctx, timer)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), disorder=st.integers(1, 2500),
       schedule=st.lists(st.integers(0, 9), min_size=5, max_size=60),
       batch=st.integers(5, 60))
def test_the_watermark_never_goes_back_and_no_window_fires_early(
    tmp_path_factory: pytest.TempPathFactory, seed: int, disorder: int, schedule: list[int],
    batch: int,
) -> None:
    """Random interleavings of injections, advances and key runs (in any order, keys
    picked at random) over input disordered by up to 2.5 windows. After every step:
    no watermark went back, downstream never ahead of upstream, no non-late record
    pending below its computation's low watermark. At the end every window count is
    the batch count: a timer that fired before all its window's records were handled
    would have emitted a smaller one."""
    records = _app.make_input(seed, 150, disorder_ms=disorder, queries=3)
    url = f"sqlite:///{tmp_path_factory.mktemp('wm')}/repo.db"
    _Recorder.fired = []
    rng = random.Random(seed)
    with percolator.connect(url) as cluster:
        pipeline = mw.Pipeline(cluster, "zeitgeist", inject_batch=batch)
        pipeline.injector("queries", mw.IterableSource(records), stream="queries")
        pipeline.computation(_Recorder(), inputs={"queries": lambda r: r.value})
        pipeline.computation(_app.DipDetector(),
                             inputs={"windows": lambda r: json.loads(r.value)["q"].encode()})
        pipeline.create()
        worker = Worker(cluster, pipeline.observers(), threads=1)
        worker.register()
        seen: dict[str, tuple[int, int]] = {}

        def check() -> None:
            with Snapshot(cluster) as snap:
                marks = {n: pipeline.watermarks(snap, n) for n in pipeline.nodes}
                for name, (w_in, w_low) in marks.items():
                    old_in, old_low = seen.get(name, (0, 0))
                    assert w_in >= old_in and w_low >= old_low, (name, marks, seen)
                    node = pipeline.nodes[name]
                    for key, cells in snap.scan(node.table):
                        for column, raw in cells.items():
                            if column.startswith("in:"):
                                rec = _pipeline._decode_record(raw, key, column[3:])
                                assert rec.late or rec.timestamp >= w_low, (name, rec, w_low)
                assert marks["DipDetector"][1] <= marks["Windower"][1]
                seen.update(marks)

        def run_some_key() -> None:
            node = rng.choice(list(pipeline.nodes.values()))
            with Snapshot(cluster) as snap:
                keys = [k for k, _ in snap.scan(node.table)]
            if keys:
                worker._scanner.serve_row(node.table, rng.choice(keys))

        for step in schedule:
            if step < 3:
                pipeline.inject("queries")
            elif step < 5:
                pipeline.advance()
            else:
                run_some_key()
            check()
        while pipeline.inject("queries"):
            check()
        for _ in range(50):
            pipeline.advance()
            check()
            for node in pipeline.nodes.values():
                with Snapshot(cluster) as snap:
                    keys = [k for k, _ in snap.scan(node.table)]
                for key in keys:
                    worker._scanner.serve_row(node.table, key)
            if all(s.pending == 0 and s.timers == 0 and s.low_watermark >= END
                   for s in pipeline.status()):
                break
        assert all(time_ms <= w_in for time_ms, w_in in _Recorder.fired)
        found, twice = _app.results(pipeline)
        assert found == _app.batch_windows(records) and twice == 0


SPAN_MS = 2 * _app.WINDOW_MS


class _Totals(mw.Computation):
    """A second windowed stage, with timers of its own: the Windower's counts summed
    per span of window ends (the span is the key), each total produced once, when
    the span's timer fires."""

    outputs = ("totals",)

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.state.set_json("n", ctx.state.get_json("n", 0) + json.loads(record.value)["n"])
        ctx.set_timer("span", int(ctx.key) + SPAN_MS)

    def process_timer(self, ctx: mw.Context, timer: mw.Timer) -> None:
        total = {"start": timer.time - SPAN_MS, "n": ctx.state.get_json("n", 0)}
        ctx.state.delete("n")
        ctx.produce("totals", json.dumps(total).encode(), timer.time)


def _span_of(record: mw.Record) -> bytes:
    return b"%d" % (record.timestamp - record.timestamp % SPAN_MS)


def _two_windowed_stages(cluster: Cluster, records: list[tuple[bytes, int]],
                         inject_batch: int, windower: type[_Recorder] = _Recorder
                         ) -> tuple[mw.Pipeline, Worker]:
    """Windower -> _Totals (and DipDetector), with a registered worker whose key runs
    the test makes."""
    pipeline = mw.Pipeline(cluster, "spans", inject_batch=inject_batch)
    pipeline.injector("queries", mw.IterableSource(records), stream="queries")
    pipeline.computation(windower(), inputs={"queries": lambda r: r.value})
    pipeline.computation(_Totals(), inputs={"windows": _span_of})
    pipeline.computation(_app.DipDetector(),
                         inputs={"windows": lambda r: json.loads(r.value)["q"].encode()})
    pipeline.create()
    worker = Worker(cluster, pipeline.observers(), threads=1)
    worker.register()
    return pipeline, worker


def _run_keys(pipeline: mw.Pipeline, worker: Worker, name: str,
              keys: list[bytes] | None = None) -> None:
    """One run of each key (default: every key) of computation *name* with a
    notification."""
    node = pipeline.nodes[name]
    if keys is None:
        with Snapshot(pipeline.cluster) as snap:
            keys = [k for k, _ in snap.scan(node.table)]
    for key in keys:
        worker._scanner.serve_row(node.table, key)


def _drain(pipeline: mw.Pipeline, worker: Worker) -> None:
    for _ in range(50):
        pipeline.advance()
        for name in pipeline.order():
            _run_keys(pipeline, worker, name)
        if all(s.pending == 0 and s.timers == 0 and s.low_watermark >= END
               for s in pipeline.status()):
            return
    raise AssertionError(f"the pipeline did not drain: {pipeline.status()}")


def _assert_totals(pipeline: mw.Pipeline, records: list[tuple[bytes, int]]) -> None:
    expected: dict[int, int] = {}
    for (_, start), n in _app.batch_windows(records).items():
        end = start + _app.WINDOW_MS
        expected[end - end % SPAN_MS] = expected.get(end - end % SPAN_MS, 0) + n
    with Snapshot(pipeline.cluster) as snap:
        totals = [json.loads(r.value) for r in pipeline.output(snap, "totals")]
    assert sorted(t["start"] for t in totals) == sorted(expected)  # each span once
    assert {t["start"]: t["n"] for t in totals} == expected
    assert pipeline.verify().problems == []


def test_a_downstream_stage_fires_no_timer_before_the_upstream_windows_reach_it(
    cluster: Cluster,
) -> None:
    """The low watermark must not pass a record still pending nor a timer still
    armed upstream. Here the input is all injected at once (the source's watermark is
    at the end of time): the Windower's low watermark is then held only by its
    pending records, and once they are consumed, only by its armed window timers.
    The steps: both queries' records consumed (timers armed), an advance, q0's
    windows fired into _Totals, an advance, _Totals runs its keys; then everything
    drains. Every span total must equal the batch sum, produced once. An advancer
    that ignores timers (mutant 5 of issue 31) or pending records lets _Totals'
    watermark jump to the end of time and fire its spans with q0's windows alone,
    then again when q1's arrive."""
    records = _app.make_input(5, 400, queries=2)
    _Recorder.fired = []
    pipeline, worker = _two_windowed_stages(cluster, records, inject_batch=500)
    assert pipeline.inject("queries") == len(records)
    pipeline.advance()
    _run_keys(pipeline, worker, "Windower", [b"q0", b"q1"])  # consumed, timers armed
    pipeline.advance()
    _run_keys(pipeline, worker, "Windower", [b"q0"])  # q0's windows fired
    assert any(True for _ in Snapshot(cluster).scan(pipeline.nodes["_Totals"].table))
    pipeline.advance()
    for _ in range(2):
        _run_keys(pipeline, worker, "_Totals")
    _drain(pipeline, worker)
    _assert_totals(pipeline, records)


def test_no_timer_fires_before_the_input_watermark_reaches_it(cluster: Cluster) -> None:
    """The input comes 40 records at a time, so the watermark rises in steps and
    records of a window keep arriving after the previous window's timer is armed.
    Every timer fires at or below the input watermark its run read, every window
    count is the batch count and every span total the batch sum. A key run that
    fires timers up to 2 s past the watermark emits windows before their last
    records came, and again after."""
    records = _app.make_input(6, 400, queries=2)
    _Recorder.fired = []
    pipeline, worker = _two_windowed_stages(cluster, records, inject_batch=40)
    while pipeline.inject("queries"):
        pipeline.advance()
        for name in pipeline.order():
            _run_keys(pipeline, worker, name)
    _drain(pipeline, worker)
    assert _Recorder.fired and all(time_ms <= w_in for time_ms, w_in in _Recorder.fired)
    found, twice = _app.results(pipeline)
    assert found == _app.batch_windows(records) and twice == 0
    _assert_totals(pipeline, records)


class _LateSource:
    """Twenty records at t=10,000.., then (its watermark past them) ten at t=0.."""

    def read(self, position: bytes | None, limit: int) -> tuple[list[mw.Record], bytes, int]:
        if position is None:
            return [mw.Record(b"k", 10_000 + i) for i in range(20)], b"1", 10_000
        if position == b"1":
            return [mw.Record(b"k", i) for i in range(10)], b"2", END
        return [], b"2", END


class _CountAll(mw.Computation):
    seen: list[bool] = []

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        _CountAll.seen.append(record.late)
        ctx.state.set_json("n", ctx.state.get_json("n", 0) + 1)


class _DropLate(_CountAll):
    late_policy = "drop"


def test_late_records_are_marked_and_handled_by_policy(cluster: Cluster) -> None:
    _CountAll.seen = []
    pipeline = mw.Pipeline(cluster, "late")
    pipeline.injector("src", _LateSource(), stream="s")
    pipeline.computation(_CountAll(), inputs={"s": lambda r: r.value})
    pipeline.computation(_DropLate(), inputs={"s": lambda r: r.value})
    pipeline.create()
    run_to_the_end(pipeline)
    with Snapshot(cluster) as snap:
        assert pipeline.state(snap, "_CountAll", b"k") == {"n": b"30"}
        assert pipeline.state(snap, "_DropLate", b"k") == {"n": b"20"}
    # the ten late records reached _CountAll marked late; _DropLate never saw them
    assert (_CountAll.seen.count(True), len(_CountAll.seen)) == (10, 50)
    late = {s.name: s.late for s in pipeline.status()}
    assert late == {"_CountAll": 10, "_DropLate": 10}


def test_bad_topologies_and_productions_are_refused(cluster: Cluster) -> None:
    class A(mw.Computation):
        outputs = ("b",)

    class B(mw.Computation):
        outputs = ("a",)

    cyclic = mw.Pipeline(cluster, "cyclic")
    cyclic.injector("src", mw.IterableSource([]), stream="a")
    cyclic.computation(A(), inputs={"a": lambda r: r.value})
    cyclic.computation(B(), inputs={"b": lambda r: r.value})
    with pytest.raises(percolator.InvalidArgument, match=re.escape(
            "the pipeline's graph has a cycle through ['A', 'B']")):
        cyclic.create()
    orphan = mw.Pipeline(cluster, "orphan")
    orphan.computation(A(), inputs={"nobody": lambda r: r.value})
    with pytest.raises(percolator.InvalidArgument, match="nothing produces"):
        orphan.create()
    with pytest.raises(percolator.InvalidArgument):
        orphan.computation(A(), inputs={"x": lambda r: r.value})  # added twice
    with pytest.raises(percolator.InvalidArgument, match="late_policy"):
        type("Bad", (mw.Computation,), {"late_policy": "ignore"})

    class Stray(mw.Computation):
        def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
            ctx.produce("undeclared", b"x", record.timestamp)

    stray = mw.Pipeline(cluster, "stray")
    stray.injector("src", mw.IterableSource([(b"k", 1)]), stream="s")
    stray.computation(Stray(), inputs={"s": lambda r: r.value})
    stray.create()
    stray.inject("src")
    txn = Transaction(cluster)
    with pytest.raises(percolator.InvalidArgument, match="not among its outputs"):
        _pipeline._KeyRun(txn, stray, stray.nodes["Stray"], b"k").run()


class _Spaced(mw.Computation):
    name = "a b"


class _BadOutput(mw.Computation):
    outputs = ("o/p",)


def test_bad_names_sources_and_inputs_are_refused_saying_what_and_whose(
    sqlite_cluster: Cluster,
) -> None:
    """Each bad argument of a pipeline's set-up is an InvalidArgument that names it
    (pipeline, injector, computation or stream name; the source, the computation, the
    inputs) and what it got, and a second injector or computation of one name is
    refused as such; so is an injection by an injector never defined. SQLite alone: the
    pipeline's logic."""
    cluster = sqlite_cluster
    names = "must be letters, digits, '_', '-' or '.', got"
    p = _quiet(cluster, mw.IterableSource([]))  # injector "in", computation Quiet

    def extract(record: mw.Record) -> bytes:
        return record.value

    refused: list[tuple[Callable[[], object], str]] = [
        (lambda: mw.Pipeline("repo.db", "p"),  # type: ignore[arg-type]
         "Pipeline needs a percolator.Cluster, got 'repo.db'"),
        (lambda: mw.Pipeline(cluster, "a b"),
         "pipeline name must be letters, digits, '_' or '-', got 'a b'"),
        (lambda: p.injector("a b", mw.IterableSource([]), stream="s"),
         f"injector name {names} 'a b'"),
        (lambda: p.injector("", mw.IterableSource([]), stream="s"), f"injector name {names} ''"),
        (lambda: p.injector(5, mw.IterableSource([]), stream="s"),  # type: ignore[arg-type]
         f"injector name {names} 5"),
        (lambda: p.injector("i", mw.IterableSource([]), stream="s/t"),
         f"stream name {names} 's/t'"),
        (lambda: p.injector("i", "repo.db", stream="s"),  # type: ignore[arg-type]
         "source must have read(position, limit), got 'repo.db'"),
        (lambda: p.injector("in", mw.IterableSource([]), stream="s"),
         "injector 'in' is defined twice"),
        (lambda: p.computation("Quiet", {"in": extract}),  # type: ignore[arg-type]
         "computation must be a millwheel.Computation, got 'Quiet'"),
        (lambda: p.computation(_Spaced(), {"in": extract}),
         f"computation name {names} 'a b'"),
        (lambda: p.computation(_Quiet(), {"in": extract}),
         "computation 'Quiet' is added twice"),
        (lambda: p.computation(_Alarm(), {}),
         "Alarm: inputs must map stream names to key extractors"),
        (lambda: p.computation(_Alarm(), {"in": extract, "x": b"k"}),  # type: ignore[dict-item]
         "Alarm: inputs must map stream names to key extractors"),
        (lambda: p.computation(_Alarm(), {"in": extract, "s t": extract}),
         f"stream name {names} 's t'"),
        (lambda: p.computation(_BadOutput(), {"in": extract}),
         f"stream name {names} 'o/p'"),
        (lambda: p.inject("nope"), "no injector 'nope'")]
    for setup, message in refused:
        with pytest.raises(percolator.InvalidArgument, match="^" + re.escape(message) + "$"):
            setup()
    assert (list(p.injectors), list(p.nodes), list(p.subscribers)) == (["in"], ["Quiet"], ["in"])


def test_the_order_is_topological_whatever_the_names_and_the_order_of_inputs(
    sqlite_cluster: Cluster,
) -> None:
    """Zed reads the injected stream, Mid reads Zed's output, Alpha reads Mid's and
    the injected stream (in that order): computations come after everything they read,
    whichever of their inputs names them, so Zed, Mid, Alpha, not by name; ``status``
    and the advancers' tasks take that order (every task at the default interval, a
    tenth of a second). SQLite alone: the pipeline's logic."""
    def stage(name: str, outputs: tuple[str, ...]) -> mw.Computation:
        return type(name, (mw.Computation,), {"outputs": outputs})()  # type: ignore[no-any-return]

    def key(record: mw.Record) -> bytes:
        return record.value

    pipeline = mw.Pipeline(sqlite_cluster, "ranks")
    pipeline.injector("in", mw.IterableSource([]), stream="i")
    pipeline.computation(stage("Zed", ("z",)), inputs={"i": key})
    pipeline.computation(stage("Mid", ("m",)), inputs={"z": key})
    pipeline.computation(stage("Alpha", ()), inputs={"m": key, "i": key})
    pipeline.create()
    assert pipeline.order() == ["Zed", "Mid", "Alpha"]
    assert [s.name for s in pipeline.status()] == ["Zed", "Mid", "Alpha"]
    tasks = pipeline.tasks()
    assert [t.name for t in tasks] == [
        "mw.ranks.inject.in", "mw.ranks.advance.Zed", "mw.ranks.advance.Mid",
        "mw.ranks.advance.Alpha"]
    assert {t.interval for t in tasks} == {0.1}  # the default interval


def test_the_cli_shows_status_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/repo.db"
    monkeypatch.setenv("MW_RECORDS", "200")
    records = _app.make_input(1, 200)
    with percolator.connect(url) as cluster:
        pipeline = _app.make(cluster)
        pipeline.create()
        pipeline.inject("queries")
    args = ["--cluster", url, "--pipeline", "tests.millwheel._app:make"]
    assert mw_main(["status", *args]) == 0
    out = capsys.readouterr().out
    assert "pending records: 200" in out and "Windower" in out
    assert mw_main(["verify", *args]) == 0
    with percolator.connect(url) as cluster:
        pipeline = _app.make(cluster)
        run_to_the_end(pipeline)
        assert_exact(pipeline, records)
        with Transaction(cluster) as txn:  # an index row without its record
            txn.set(pipeline.pending, b"Windower\0" + b"\0" * 10 + b"x", "p:x", b"")
        report = pipeline.verify()  # the recipes' one report shape
        assert isinstance(report, VerifyReport) and not report and not report.ok
        assert report.problems == ["Windower: 1 pending record(s) and index rows disagree"]
    assert mw_main(["verify", *args]) == 1
    out = capsys.readouterr().out
    assert out.endswith("OK\nWindower: 1 pending record(s) and index rows disagree\n"
                        "VIOLATIONS FOUND\n"), out
    assert mw_main(["status", "--cluster", url, "--pipeline", "tests.millwheel._app:nope"]) == 2




class _SteppedSource:
    """One record at t=1,000, then no more, its watermark where the test sets it."""

    def __init__(self) -> None:
        self.mark = 1_000

    def read(self, position: bytes | None, limit: int) -> tuple[list[mw.Record], bytes, int]:
        if position is None:
            return [mw.Record(b"k", 1_000)], b"1", self.mark
        return [], b"1", self.mark


class _Alarm(mw.Computation):
    """Arms a timer 100 ms after each record; counts the timers fired (``fired``)."""

    name = "Alarm"

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.set_timer("t", record.timestamp + 100)

    def process_timer(self, ctx: mw.Context, timer: mw.Timer) -> None:
        ctx.state.set_json("fired", ctx.state.get_json("fired", 0) + 1)


class _Zulu(_Alarm):
    """The same, a second computation (its index rows after the Alarm's)."""

    name = "Zulu"


def test_the_advancer_wakes_a_key_when_its_timer_becomes_due_and_not_before(
    sqlite_cluster: Cluster,
) -> None:
    """A key's timer armed at 1,100 ms. With the input watermark at 1,099 the
    advancer wakes no key (a wake-up for a timer not due is a wasted run, at every
    advance); once the watermark reaches 1,100 exactly, it wakes the key, whose run
    then fires the timer. Zulu, a second computation with the same timer, shares
    the timers index: each advance wakes its own computation's keys only. SQLite
    alone: the pipeline's logic."""
    cluster = sqlite_cluster
    source = _SteppedSource()
    pipeline = mw.Pipeline(cluster, "alarm", interval=0.05)
    pipeline.injector("in", source, stream="in")
    names = ("Alarm", "Zulu")
    pipeline.computation(_Alarm(), inputs={"in": lambda r: r.value})
    pipeline.computation(_Zulu(), inputs={"in": lambda r: r.value})
    pipeline.create()
    worker = Worker(cluster, pipeline.observers(), threads=1)
    worker.register()

    def woken(name: str) -> set[bytes]:
        table = pipeline.nodes[name].table
        return {n.row for n in pending_notifications(cluster, [table])}

    assert pipeline.inject("in") == 1
    for name in names:
        _run_keys(pipeline, worker, name)
        assert woken(name) == set()
    for mark, keys in ((1_099, set()), (1_100, {b"k"})):
        source.mark = mark
        pipeline.inject("in")
        advanced = pipeline.advance()
        for name in names:
            assert advanced[name][0] == mark
            assert woken(name) == keys, (name, mark)
    for name in names:
        _run_keys(pipeline, worker, name)
        with Snapshot(cluster) as snap:
            assert pipeline.state(snap, name, b"k") == {"fired": b"1"}


class _Flush(mw.Computation):
    """Counts its records, and arms a timer at the end of time to flush the count
    once the input has ended (``flushed``)."""

    name = "Flush"

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.state.set_json("n", ctx.state.get_json("n", 0) + 1)
        ctx.set_timer("end", END)

    def process_timer(self, ctx: mw.Context, timer: mw.Timer) -> None:
        ctx.state.set_json("flushed", ctx.state.get_json("n", 0))


class _ArmsAt(mw.Computation):
    """Arms a timer at the time its record carries as its value."""

    name = "ArmsAt"

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.set_timer("t", int(record.value))


@pytest.mark.parametrize("time_ms", [END + 1, -1, 2**64])
def test_a_timer_outside_the_time_range_is_refused_and_nothing_of_its_run_is_kept(
        sqlite_cluster: Cluster, caplog: pytest.LogCaptureFixture, time_ms: int) -> None:
    """A timer beyond END_OF_TIME could never fire (its key would be woken for nothing
    by every advance once the input ends), and one below 0 or past 64 bits has no
    place in the timer index (a ``struct.error`` from deep inside before): the key
    run fails with an InvalidArgument that gives the range, and commits nothing: its
    record stays pending, no timer is armed."""
    cluster = sqlite_cluster
    pipeline = mw.Pipeline(cluster, "arms", interval=0.05)
    pipeline.injector("in", mw.IterableSource([(str(time_ms).encode(), 1_000)]), stream="in")
    pipeline.computation(_ArmsAt(), inputs={"in": lambda r: b"k"})
    pipeline.create()
    assert pipeline.inject("in") == 1
    worker = Worker(cluster, pipeline.observers(), threads=1)
    worker.register()
    with caplog.at_level(logging.WARNING, logger="observers"):
        _run_keys(pipeline, worker, "ArmsAt")
    (failure,) = [r.getMessage() for r in caplog.records if r.name == "observers"]
    assert f"set_timer's time must be from 0 to END_OF_TIME ({END}" in failure, failure
    assert failure.endswith(f"got {time_ms}"), failure
    (status,) = pipeline.status()
    assert (status.pending, status.timers) == (1, 0)


def test_a_timer_at_the_end_of_time_fires_when_the_input_ends(sqlite_cluster: Cluster) -> None:
    """A key's timer armed at END_OF_TIME (flush at the end of the input): once every
    record is read, the source's watermark, hence the input watermark, is the end of
    time, and the advancer must wake the key, whose run fires the timer (a timer fires
    once the input watermark reaches it). An advancer that woke keys only for timers
    below the end of time left it armed for ever, the pipeline reported done (its low
    watermark at the end) and the flush never came. SQLite alone: the pipeline's
    logic."""
    cluster = sqlite_cluster
    pipeline = mw.Pipeline(cluster, "flush", interval=0.05)
    pipeline.injector("in", mw.IterableSource([(b"k", 1_000), (b"k", 2_000)]), stream="in")
    pipeline.computation(_Flush(), inputs={"in": lambda r: r.value})
    pipeline.create()
    worker = Worker(cluster, pipeline.observers(), threads=1)
    worker.register()
    assert pipeline.inject("in") == 2
    _run_keys(pipeline, worker, "Flush")
    assert pipeline.advance()["Flush"][0] == END
    assert {n.row for n in pending_notifications(cluster, [pipeline.nodes["Flush"].table])} == {
        b"k"}
    _run_keys(pipeline, worker, "Flush")
    with Snapshot(cluster) as snap:
        assert pipeline.state(snap, "Flush", b"k") == {"n": b"2", "flushed": b"2"}
    (status,) = pipeline.status()
    assert (status.low_watermark, status.timers) == (END, 0)


class _Quiet(mw.Computation):
    """Handles nothing itself: the tests call its key run's context."""

    name = "Quiet"
    outputs = ("said",)


def _quiet(cluster: Cluster, source: mw.Source) -> mw.Pipeline:
    pipeline = mw.Pipeline(cluster, "quiet")
    pipeline.injector("in", source, stream="in")
    pipeline.computation(_Quiet(), inputs={"in": lambda r: r.value})
    pipeline.create()
    return pipeline


def _context(txn: Transaction, pipeline: mw.Pipeline, key: bytes) -> mw.Context:
    """The context a handler of Quiet's run for *key* in *txn* gets."""
    return mw.Context(_pipeline._KeyRun(txn, pipeline, pipeline.nodes["Quiet"], key))


def test_timers_re_armed_and_deleted_leave_their_cells_and_index_rows_matching(
    sqlite_cluster: Cluster,
) -> None:
    """A key arms timers a, b and c; a later run re-arms a at another time, deletes b
    and deletes a timer never armed. The key's ``t:`` cells and the timers index must
    then hold a (at its new time) and c only: a re-armed or deleted timer whose index
    row stayed would be woken for nothing and hold the low watermark at its old time
    (verify reports the mismatch). SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    pipeline = _quiet(cluster, mw.IterableSource([]))
    node = pipeline.nodes["Quiet"]
    with Transaction(cluster) as txn:
        ctx = _context(txn, pipeline, b"k")
        for tag, time_ms in (("a", 5_000), ("b", 6_000), ("c", 7_000)):
            ctx.set_timer(tag, time_ms)
    with Transaction(cluster) as txn:
        ctx = _context(txn, pipeline, b"k")
        ctx.set_timer("a", 8_000)
        ctx.delete_timer("b")
        ctx.delete_timer("never")
    with Snapshot(cluster) as snap:
        cells = snap.get_row(node.table, b"k", ["t:a", "t:b", "t:c"])
        index = [row for row, _ in snap.scan(node.timers, *node.index_range(), ["t:x"])]
    assert cells == {"t:a": (8_000).to_bytes(8, "big"), "t:c": (7_000).to_bytes(8, "big")}
    assert index == [_pipeline._index_row(node, 7_000, b"k", b"c"),
                     _pipeline._index_row(node, 8_000, b"k", b"a")]
    assert pipeline.verify().problems == []
    (status,) = pipeline.status()
    assert status.timers == 2


def test_a_timer_armed_at_the_input_watermark_wakes_its_key_at_once(
    sqlite_cluster: Cluster,
) -> None:
    """With the input watermark at 1,000, a run that arms a timer at 1,000 exactly
    notifies its key (the timer is due: the next run fires it, without waiting for an
    advance); one armed at 1,001 does not. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    pipeline = _quiet(cluster, _SteppedSource())  # one record of key k, watermark 1,000
    assert pipeline.inject("in") == 1
    assert pipeline.advance()["Quiet"][0] == 1_000
    for key, time_ms in ((b"at", 1_000), (b"after", 1_001)):
        with Transaction(cluster) as txn:
            _context(txn, pipeline, key).set_timer("t", time_ms)
    woken = {n.row for n in pending_notifications(cluster, [pipeline.nodes["Quiet"].table])}
    assert woken == {b"k", b"at"}


def test_bad_timers_and_productions_are_refused_with_what_was_wrong(
    sqlite_cluster: Cluster,
) -> None:
    """A handler's timer needs a non-empty str tag and an int time, a production
    bytes and an int timestamp: each bad one is an InvalidArgument saying so, not a
    deep TypeError from the encoding (nor a timer armed under a tag that is no str)."""
    cluster = sqlite_cluster
    pipeline = _quiet(cluster, mw.IterableSource([]))
    with Transaction(cluster) as txn:
        ctx = _context(txn, pipeline, b"k")
        for tag, time_ms in (("", 1_000), (5, 1_000), ("t", 1.5), ("t", "1000")):
            with pytest.raises(percolator.InvalidArgument, match=re.escape(
                    f"set_timer needs a non-empty str tag and int ms, got {tag!r}, {time_ms!r}")):
                ctx.set_timer(tag, time_ms)  # type: ignore[arg-type]
        for value, ts in (("text", 1_000), (b"x", 1.5), ("text", 1.5)):
            with pytest.raises(percolator.InvalidArgument, match=re.escape(
                    "produce needs bytes and an int timestamp, got "
                    f"{type(value).__name__}, {ts!r}")):
                ctx.produce("said", value, ts)  # type: ignore[arg-type]
    with Snapshot(cluster) as snap:
        assert list(snap.scan(pipeline.nodes["Quiet"].table)) == []
        assert list(snap.scan(pipeline.out)) == []


def test_a_key_that_is_not_non_empty_bytes_is_refused_saying_whose(
    sqlite_cluster: Cluster,
) -> None:
    """A key extractor that returns a str, or empty bytes, makes the delivery fail with
    an InvalidArgument naming the computation, the stream and what it returned, not
    a record written under a key no run could read. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    for name, extractor, got in (("str", lambda r: r.value.decode(), "'v'"),
                                 ("empty", lambda r: b"", "b''")):
        pipeline = mw.Pipeline(cluster, name)
        pipeline.injector("in", mw.IterableSource([(b"v", 1_000)]), stream="in")
        pipeline.computation(_Quiet(), inputs={"in": extractor})
        pipeline.create()
        with pytest.raises(percolator.InvalidArgument, match=re.escape(
                f"Quiet: the key extractor of 'in' must return non-empty bytes, got {got}")):
            pipeline.inject("in")
        with Snapshot(cluster) as snap:
            assert list(snap.scan(pipeline.nodes["Quiet"].table)) == []


class _Batches(mw.Computation):
    """Appends each value it handles to its key's ``seq``, each timer's tag to
    ``fired``."""

    name = "Batches"

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.state.set("seq", (ctx.state.get("seq") or b"") + record.value + b",")

    def process_timer(self, ctx: mw.Context, timer: mw.Timer) -> None:
        ctx.state.set("fired", (ctx.state.get("fired") or b"") + timer.tag.encode())


def test_a_key_run_handles_its_own_records_at_most_max_at_a_time_and_then_its_timers(
    sqlite_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``MAX_RECORDS_PER_RUN`` at 3: key k has five pending records and a due
    timer, key j exactly three and a due timer, key k1 (whose row follows k's) one
    record. k's first run handles its three oldest, fires no timer (its window may not
    be complete) and wakes k again; its second run handles the other two and fires
    the timer. j's one run handles its three and fires its timer, and leaves j
    asleep. No run reads another key's row. SQLite alone: the pipeline's logic."""
    monkeypatch.setattr(_pipeline, "MAX_RECORDS_PER_RUN", 3)
    cluster = sqlite_cluster
    values = [b"k.%d" % i for i in range(5)] + [b"j.%d" % i for i in range(3)] + [b"k1.0"]
    pipeline = mw.Pipeline(cluster, "batches")
    pipeline.injector("in", mw.IterableSource([(v, 1_000 + i) for i, v in enumerate(values)]),
                      stream="in")
    pipeline.computation(_Batches(), inputs={"in": lambda r: r.value.split(b".")[0]})
    pipeline.create()
    node = pipeline.nodes["Batches"]
    with Transaction(cluster) as txn:
        for key in (b"k", b"j"):
            mw.Context(_pipeline._KeyRun(txn, pipeline, node, key)).set_timer("flush", 2_000)
    assert pipeline.inject("in") == len(values)
    assert pipeline.advance()["Batches"][0] == END
    worker = Worker(cluster, pipeline.observers(), threads=1)
    worker.register()

    def run(key: bytes) -> tuple[dict[str, bytes], bool]:
        """Key's state after one run of it, and whether it is woken again."""
        worker._scanner.serve_row(node.table, key)
        woken = {n.row for n in pending_notifications(cluster, [node.table])}
        with Snapshot(cluster) as snap:
            return pipeline.state(snap, "Batches", key), key in woken

    assert run(b"k") == ({"seq": b"k.0,k.1,k.2,"}, True)
    assert run(b"j") == ({"seq": b"j.0,j.1,j.2,", "fired": b"flush"}, False)
    assert run(b"k") == ({"seq": b"k.0,k.1,k.2,k.3,k.4,", "fired": b"flush"}, False)
    assert run(b"k1") == ({"seq": b"k1.0,"}, False)
    assert pipeline.verify().problems == []
    (status,) = pipeline.status()
    assert (status.pending, status.timers) == (0, 0)


class _Rearm(_Batches):
    """_Batches whose record ``later`` re-arms the key's timer at 5,000 and whose record
    ``cancel`` deletes it."""

    name = "Batches"

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        super().process_record(ctx, record)
        if record.value == b"later":
            ctx.set_timer("flush", 5_000)
        elif record.value == b"cancel":
            ctx.delete_timer("flush")


def test_a_timer_re_armed_or_deleted_by_a_handler_of_the_run_does_not_fire_at_its_old_time(
    sqlite_cluster: Cluster,
) -> None:
    """Keys l and c each have a timer due at 2,000 and one pending record; l's record
    re-arms the timer at 5,000, c's deletes it. The run, which read the timer at 2,000
    before its handlers ran, must not fire it: l's stays armed at 5,000 (it fires in a
    later run), c's is gone; c's other timer, due at 3,000, still fires in the same
    run. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    pipeline = mw.Pipeline(cluster, "rearm")
    pipeline.injector("in", mw.IterableSource([(b"later", 1_000), (b"cancel", 1_000)]),
                      stream="in")
    pipeline.computation(_Rearm(), inputs={"in": lambda r: r.value[:1]})
    pipeline.create()
    node = pipeline.nodes["Batches"]
    with Transaction(cluster) as txn:
        for key in (b"l", b"c"):
            mw.Context(_pipeline._KeyRun(txn, pipeline, node, key)).set_timer("flush", 2_000)
        mw.Context(_pipeline._KeyRun(txn, pipeline, node, b"c")).set_timer("other", 3_000)
    assert pipeline.inject("in") == 2
    worker = Worker(cluster, pipeline.observers(), threads=1)
    worker.register()
    assert pipeline.advance()["Batches"][0] == END
    for key in (b"l", b"c"):
        worker._scanner.serve_row(node.table, key)
    with Snapshot(cluster) as snap:
        assert pipeline.state(snap, "Batches", b"l") == {"seq": b"later,"}
        assert pipeline.state(snap, "Batches", b"c") == {"seq": b"cancel,", "fired": b"other"}
        assert snap.get(node.table, b"l", "t:flush") == (5_000).to_bytes(8, "big")
        assert snap.get_row(node.table, b"c", ["t:flush", "t:other"]) == {}
    assert pipeline.verify().problems == []
    worker._scanner.serve_row(node.table, b"l")  # woken by its re-arming: now due
    with Snapshot(cluster) as snap:
        assert pipeline.state(snap, "Batches", b"l") == {"seq": b"later,", "fired": b"flush"}


class _Batched:
    """A source of records of value k at the times given, in batches, each with its
    watermark."""

    def __init__(self, batches: list[tuple[list[int], int]]) -> None:
        self.batches = batches

    def read(self, position: bytes | None, limit: int) -> tuple[list[mw.Record], bytes, int]:
        i = int(position or b"0")
        if i >= len(self.batches):
            return [], b"%d" % i, END
        times, mark = self.batches[i]
        return [mw.Record(b"k", t) for t in times], b"%d" % (i + 1), mark


def test_late_records_are_counted_across_runs(sqlite_cluster: Cluster) -> None:
    """Key k gets a record on time, then one late (below the source's watermark), run
    together, then two more late ones in a later run: its ``m:late`` counts all three
    (what ``status`` reports), not the last run's. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    pipeline = mw.Pipeline(cluster, "latecount")
    pipeline.injector("in", _Batched([([10_000], 10_000), ([1], 10_000), ([2, 3], END)]),
                      stream="in")
    pipeline.computation(_Batches(), inputs={"in": lambda r: r.value})
    pipeline.create()
    node = pipeline.nodes["Batches"]
    worker = Worker(cluster, pipeline.observers(), threads=1)
    worker.register()
    for injected in ((1, 1), (2,)):
        for n in injected:
            assert pipeline.inject("in") == n
        worker._scanner.serve_row(node.table, b"k")
    with Snapshot(cluster) as snap:
        assert snap.get(node.table, b"k", "m:late") == b"3"
    (status,) = pipeline.status()
    assert (status.late, status.pending) == (3, 0)


def test_an_injection_with_nothing_new_commits_nothing_but_a_risen_watermark(
    sqlite_cluster: Cluster,
) -> None:
    """An injector commits its position and watermark with what it injects. One that
    reads no record, stays at its position and finds its source's watermark no higher
    (an idle injector, at every interval) commits nothing: no new version of ``c:pos``
    or ``w:low``; a watermark that rose alone is committed. SQLite alone: the
    pipeline's logic."""
    cluster = sqlite_cluster
    source = _SteppedSource()  # one record at 1,000, then none; its watermark as set
    pipeline = _quiet(cluster, source)
    marks = TableChanges(cluster, pipeline.meta, ["c:pos", "w:low"])

    def committed() -> list[tuple[bytes, str, bytes]]:
        nonlocal position
        changes, position = marks.read(position, 10)
        return sorted((c.row, c.column, c.value) for c in changes)

    position: dict[str, object] = {}
    assert pipeline.inject("in") == 1
    assert committed() == [(b"inj/in", "c:pos", b"1"), (b"inj/in", "w:low", b"1000")]
    for mark in (1_000, 900):  # the same watermark, then one that went back
        source.mark = mark
        assert pipeline.inject("in") == 0
        assert committed() == []
    source.mark = 2_000
    assert pipeline.inject("in") == 0
    assert committed() == [(b"inj/in", "c:pos", b"1"), (b"inj/in", "w:low", b"2000")]


class _Positions:
    """Records of value k, one batch per position: two from the start, then one each
    from a short position, one of 16 bytes and one of 17 (then the end)."""

    AFTER = {None: b"p", b"p": b"x" * 16, b"x" * 16: b"y" * 17, b"y" * 17: b"end"}

    def read(self, position: bytes | None, limit: int) -> tuple[list[mw.Record], bytes, int]:
        if position not in self.AFTER:
            return [], b"end", END
        n = 2 if position is None else 1
        return [mw.Record(b"k", 1_000 + i) for i in range(n)], self.AFTER[position], 1_000


def test_injected_record_ids_name_the_injector_the_position_read_from_and_the_place(
    sqlite_cluster: Cluster,
) -> None:
    """An injected record's id is ``<injector>/<tag>/<n>``: *tag* the position its
    batch was read from, in hex (empty for the source's start), or ``h`` and a digest
    of a position longer than 16 bytes (ids go into column and row keys); *n* its place
    in the batch. No two positions give one tag, so no record overwrites another's
    ``in:`` cell. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    pipeline = _quiet(cluster, _Positions())
    while pipeline.inject("in"):
        pass
    with Snapshot(cluster) as snap:
        (cells,) = [cells for _, cells in snap.scan(pipeline.nodes["Quiet"].table)]
    digest = hashlib.sha256(b"y" * 17).hexdigest()[:32]
    ids = sorted(c[3:] for c in cells if c.startswith("in:"))
    assert ids == sorted(["in//0", "in//1", "in/70/0", f"in/{'78' * 16}/0", f"in/h{digest}/0"])


def test_verify_counts_each_index_row_and_cell_that_disagree(sqlite_cluster: Cluster) -> None:
    """``verify`` matches the pending index with the keys' ``in:`` cells and the timers
    index with their ``t:`` cells. With three records pending and two timers armed (all
    matching: no problem), a record left without its index row, an index row without
    its record and a timer's cell gone with its index row left are three disagreements:
    two of the pending kind, one of the timers, each kind counted in its own problem.
    SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    pipeline = _quiet(cluster, mw.IterableSource([(b"k", 1_000), (b"j", 2_000), (b"k", 3_000)]))
    node = pipeline.nodes["Quiet"]
    assert pipeline.inject("in") == 3
    with Transaction(cluster) as txn:
        for key in (b"k", b"j"):
            _context(txn, pipeline, key).set_timer("t", 5_000)
    assert pipeline.verify().problems == []
    with Snapshot(cluster) as snap:
        first = next(row for row, _ in snap.scan(node.pending, *node.index_range(), ["p:x"]))
    with Transaction(cluster) as txn:
        txn.delete(node.pending, first, "p:x")
        txn.set(node.pending, _pipeline._index_row(node, 4_000, b"k", b"in/gone"), "p:x", b"")
        txn.delete(node.table, b"j", "t:t")
    assert pipeline.verify().problems == [
        "Quiet: 2 pending record(s) and index rows disagree",
        "Quiet: 1 timer(s) and index rows disagree"]


def test_a_record_and_a_timer_at_time_zero_are_taken_and_hold_the_low_watermark_at_zero(
    sqlite_cluster: Cluster,
) -> None:
    """A pending record of time 0 (the first instant the index can hold) keeps its
    computation's low watermark at 0 while the input watermark moves on: the index row
    is at its time, not rounded up. A timer may be armed at 0 too. SQLite alone: the
    pipeline's logic."""
    cluster = sqlite_cluster
    pipeline = _quiet(cluster, mw.IterableSource([(b"k", 0), (b"k", 5_000)]))
    assert pipeline.inject("in") == 2
    with Transaction(cluster) as txn:
        _context(txn, pipeline, b"j").set_timer("t", 0)
    (status,) = pipeline.status()
    assert (status.pending, status.timers) == (2, 1)
    assert pipeline.advance()["Quiet"] == (END, 0)


def test_computations_whose_names_start_alike_count_their_own_index_rows_only(
    sqlite_cluster: Cluster,
) -> None:
    """Alarm and AlarmB share the pending and timers indexes, where AlarmB's rows follow
    Alarm's: each computation's status counts its own pending records and timers, and
    its low watermark is held by its own only. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    pipeline = mw.Pipeline(cluster, "alike")
    pipeline.injector("in", mw.IterableSource([(b"k", 1_000), (b"j", 2_000)]), stream="in")
    pipeline.computation(_Alarm(), inputs={"in": lambda r: r.value})
    pipeline.computation(type("AlarmB", (_Alarm,), {"name": "AlarmB"})(),
                         inputs={"in": lambda r: b"k"})
    pipeline.create()
    assert pipeline.inject("in") == 2
    node = pipeline.nodes["AlarmB"]
    with Transaction(cluster) as txn:
        mw.Context(_pipeline._KeyRun(txn, pipeline, node, b"k")).set_timer("t", 500)
    assert {s.name: (s.pending, s.timers) for s in pipeline.status()} == {
        "Alarm": (2, 0), "AlarmB": (2, 1)}
    assert pipeline.advance() == {"Alarm": (END, 1_000), "AlarmB": (END, 500)}
    assert pipeline.verify().problems == []


def test_the_state_of_a_key_is_its_own_rows_only(sqlite_cluster: Cluster) -> None:
    """``state`` of a key without a row is empty, whatever the keys after it hold (k1's
    row follows k's, and starts as k does). SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    pipeline = _quiet(cluster, mw.IterableSource([]))
    with Transaction(cluster) as txn:
        _context(txn, pipeline, b"k1").state.set("n", b"1")
    with Snapshot(cluster) as snap:
        assert pipeline.state(snap, "Quiet", b"k1") == {"n": b"1"}
        assert pipeline.state(snap, "Quiet", b"k") == {}
        assert pipeline.state(snap, "Quiet", b"a") == {}
