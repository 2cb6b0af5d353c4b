"""MillWheel's weak productions (``Computation.productions = "weak"``): a weak run
hands its productions to the subscribers' key runs, which commit before it does. A
crash or a failure between the two hands a record again (at least once) but never
loses one; strong productions stay exactly once under the same crashes."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

import percolator
from observers import Worker, wait_for_observers
from observers import millwheel as mw
from observers.millwheel import _pipeline
from percolator import Cluster, Snapshot, Transaction
from percolator.testing import CrashPoint, client_of, crash_commit
from tests._backends import SQLITE_AND_BIGTABLE, backend_fixture, make_store_url
from tests._concurrency import spawn_module
from tests.millwheel import _app
from tests.millwheel.test_millwheel import (
    _assert_totals,
    _drain,
    _Recorder,
    _run_keys,
    _two_windowed_stages,
    run_to_the_end,
)

# On the embedded store and Bigtable: the recipe's code is the same on every store
# (the note in tests/millwheel/test_millwheel.py).
backend = backend_fixture(SQLITE_AND_BIGTABLE)


POINTS = [CrashPoint("prewrite", 0), CrashPoint("prewrite", 2), CrashPoint("commit_point"),
          CrashPoint("commit", 1)]


@pytest.mark.parametrize("weak", [True, False], ids=["weak", "strong"])
def test_a_relay_dying_in_its_commit_duplicates_if_weak_and_loses_nothing(
    cluster: Cluster, weak: bool
) -> None:
    """The Relay's runs of keys 3, 4, 5 and 6 (four records each) die each at a point
    of its commit (*POINTS*, in turn), then the pipeline runs to the end. Weak: a
    run's four reached the Tally before its commit began, so a death before the commit
    point hands them again (count 2), one after it does not (count 1). Strong: every
    count is 1 whatever the point. (One pipeline for the four points, each on a key of
    its own: a pipeline per point made and dropped its tables four times on HBase.)"""
    records = _app.relay_input(40)
    pipeline = _app.build_relay(cluster, records, weak)
    pipeline.create()
    pipeline.inject("values")
    relay = pipeline.nodes["Relay"]
    handed: set[bytes] = set()
    twice: set[bytes] = set()
    for key, point in zip((b"3", b"4", b"5", b"6"), POINTS, strict=True):
        dying = client_of(cluster)
        dying.one_phase_commit = False
        txn = Transaction(dying)
        _pipeline._KeyRunner(pipeline, relay).process(txn, key, _pipeline.WAKE)
        mine = {v for v, _ in records if v.endswith(key)}
        assert len(mine) == 4
        handed |= mine
        # weak: sent before the Relay's commit acknowledges them; strong: not yet
        assert set(_app.tallies(pipeline)) == (handed if weak else set()), point
        committed = crash_commit(txn, point)
        assert committed == (point.phase != "prewrite")
        if weak and not committed:
            twice |= mine
    run_to_the_end(pipeline)
    counts = _app.tallies(pipeline)
    assert twice if weak else not twice  # the prewrite points hand the weak runs' again
    assert counts == {v: 2 if v in twice else 1 for v, _ in records}
    assert pipeline.verify().problems == []


class _FlakyTally(_app.Tally):
    """The Tally, failing the first time it meets v00007 (a bug, a lost store)."""

    name = "Tally"
    failed: list[bytes] = []

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        if record.value == b"v00007" and not _FlakyTally.failed:
            _FlakyTally.failed.append(record.value)
            raise RuntimeError("the Tally's first try at v00007 fails")
        super().process_record(ctx, record)


def test_a_failed_hand_off_fails_the_weak_run_that_made_it(cluster: Cluster) -> None:
    """The Tally's run handed v00007 fails: the Relay's run must fail too, and commit
    nothing, so that v00007 is handed again by the run's retry. A weak run that let a
    failed hand-off pass (logged, not raised) would acknowledge v00007 without its
    ever reaching the Tally."""
    _FlakyTally.failed = []
    records = _app.relay_input(40)
    pipeline = _app.build_relay(cluster, records, weak=True, tally=_FlakyTally)
    pipeline.create()
    pipeline.inject("values")
    worker = Worker(cluster, pipeline.observers(), threads=1, retry_delay=0)
    worker.register()
    relay = pipeline.nodes["Relay"]
    worker._scanner.serve_row(relay.table, b"7")
    assert _FlakyTally.failed == [b"v00007"] and worker.stats["failures"] == 1
    with Snapshot(cluster) as snap:  # the Relay's records of key 7 are still pending
        cells = [c for _, row in snap.scan(relay.table, b"7", b"7\0") for c in row]
        assert sum(1 for c in cells if c.startswith("in:")) == 4
    worker._scanner.serve_row(relay.table, b"7")
    run_to_the_end(pipeline)
    counts = _app.tallies(pipeline)
    assert set(counts) == {v for v, _ in records} and counts[b"v00007"] == 1
    assert pipeline.verify().problems == []


def _progress(pipeline: mw.Pipeline) -> int:
    """Records injected (lines of 7 bytes) plus records tallied so far."""
    return _app.log_bytes_injected(pipeline) // 7 + sum(_app.tallies(pipeline).values())


def _spawn(url: str, logs: Path, weak: bool) -> subprocess.Popen[bytes]:
    return spawn_module("observers.millwheel", "run", "--cluster", url, "--pipeline",
                        "tests.millwheel._app:make_log_relay", "--threads", "2",
                        env={"MW_LOG_DIR": str(logs), "MW_BATCH": "20",
                             "MW_WEAK": "1" if weak else "0"})


@pytest.mark.parametrize("weak", [True, False], ids=["weak", "strong"])
@pytest.mark.parametrize("backend", SQLITE_AND_BIGTABLE)
def test_relay_workers_killed_with_sigkill_lose_nothing(
    backend: str, weak: bool, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Two worker processes (key runs, injector) are killed with SIGKILL at random
    (each time the pipeline has moved on) and restarted, eight times, while the test
    appends records to the log they inject from, keeping 60 ahead of the Tally. Every
    record reaches the Tally: at least once with weak productions, exactly once with
    strong.

    The input stops once the eighth kill has landed: the records after the last kill
    (a fixed 1,000 before, 500 on Bigtable, when the kills landed by the first 100 or
    so) only ran the pipeline without a crash, which the other tests do."""
    url = make_store_url(backend, request, tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    rng = random.Random(23)
    lines: list[bytes] = []
    with percolator.connect(url) as cluster:
        pipeline = _app.build_relay(cluster, [], weak, source=mw.LogSource(logs))
        pipeline.create()
        workers = [_spawn(url, logs, weak) for _ in range(2)]
        kills = 0
        try:
            # Kill once the pipeline has moved on since the last kill (injected or
            # tallied more), whatever the machine's load, and has not caught up: each
            # kill then lands in the middle of the work, with records in every stage
            # (up to 60 ahead of the Tally, 20 an injection).
            seen = 0
            while kills < 8:
                tallied = len(_app.tallies(pipeline))
                more = [b"v%05d" % i for i in range(len(lines), max(tallied + 60, len(lines)))]
                with open(logs / "values.log", "ab") as log:
                    log.write(b"".join(line + b"\n" for line in more))
                lines += more
                time.sleep(rng.uniform(0.1, 0.4))
                deadline = time.monotonic() + 120
                while _progress(pipeline) == seen:
                    assert time.monotonic() < deadline, "the workers made no progress"
                    time.sleep(0.05)
                seen = _progress(pipeline)
                if len(_app.tallies(pipeline)) == len(lines):
                    continue  # nothing in flight: more input first
                i = rng.randrange(2)
                workers[i].send_signal(signal.SIGKILL)
                workers[i].wait()
                workers[i] = _spawn(url, logs, weak)
                kills += 1
            # The source never ends (no watermark reaches the end of time): run until
            # the whole log is injected and nothing is pending.
            size = (logs / "values.log").stat().st_size
            with Worker(cluster, pipeline.observers(), tasks=pipeline.tasks(), threads=2):
                deadline = time.monotonic() + 300
                while _app.log_bytes_injected(pipeline) < size:
                    assert time.monotonic() < deadline, "the log was never injected"
                    time.sleep(0.05)
                wait_for_observers(cluster, 300)
            counts = _app.tallies(pipeline)
            assert set(counts) == set(lines)  # none lost
            assert all(n >= 1 for n in counts.values())
            if not weak:
                assert set(counts.values()) == {1}
            assert pipeline.verify().problems == []
        finally:
            for proc in workers:
                proc.kill()
                proc.wait()


class _WeakRecorder(_Recorder):
    productions = "weak"


def test_a_weak_windower_fires_no_timer_early_and_counts_stay_exact(cluster: Cluster) -> None:
    """The windowed pipeline of test_millwheel driven step by step, its Windower
    weak: windows are handed to _Totals and DipDetector, and the Windower's timers
    and inputs hold the watermarks until those runs commit. Without a crash, every
    window and span total equals the batch result, each produced once."""
    records = _app.make_input(6, 400, queries=2)
    _Recorder.fired = []
    pipeline, worker = _two_windowed_stages(cluster, records, 40, _WeakRecorder)
    while pipeline.inject("queries"):
        pipeline.advance()
        for name in pipeline.order():
            _run_keys(pipeline, worker, name)
    _drain(pipeline, worker)
    assert _Recorder.fired and all(time_ms <= w_in for time_ms, w_in in _Recorder.fired)
    found, twice = _app.results(pipeline)
    assert found == _app.batch_windows(records) and twice == 0
    _assert_totals(pipeline, records)


class _WeakRelayAgain(mw.Computation):
    """A second weak relay, after the first: its key runs are handed records."""

    name = "Relay2"
    outputs = ("relayed2",)
    productions = "weak"

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.produce("relayed2", record.value, record.timestamp)


def test_a_run_on_handed_records_hands_on_its_own_weak_productions(
    sqlite_cluster: Cluster,
) -> None:
    """A chain of two weak computations, values -> Relay -> Relay2 -> Tally: the
    Relay's run of key 3 hands its four records to Relay2's key runs, which hand
    theirs to the Tally's, all committed before the Relay's run commits (and so
    acknowledges its inputs). Every value then reaches the Tally once.

    Catches the run on handed records that does not hand on its own productions
    (``run.hand_off()`` removed from ``_handed_run``): Relay2's output is computed
    and dropped while the Relay acknowledges its inputs, and the Tally never gets
    them. The hand-off is the pipeline's logic, not the store's: SQLite alone plays
    it (a cluster store's many tables cost seconds of DDL)."""
    cluster = sqlite_cluster
    records = _app.relay_input(40)
    pipeline = mw.Pipeline(cluster, "chain", interval=0.05)
    pipeline.injector("values", mw.IterableSource(records), stream="values")
    pipeline.computation(_app.WeakRelay(), inputs={"values": lambda r: r.value[-1:]})
    pipeline.computation(_WeakRelayAgain(), inputs={"relayed": lambda r: r.value[-2:-1]})
    pipeline.computation(_app.Tally(), inputs={"relayed2": lambda r: r.value[-1:]})
    pipeline.create()
    pipeline.inject("values")
    txn = Transaction(cluster)
    _pipeline._KeyRunner(pipeline, pipeline.nodes["Relay"]).process(txn, b"3", _pipeline.WAKE)
    mine = {v for v, _ in records if v.endswith(b"3")}
    assert len(mine) == 4
    assert _app.tallies(pipeline) == {v: 1 for v in mine}  # before the Relay's commit
    txn.commit()
    worker = Worker(cluster, pipeline.observers(), threads=1)
    worker.register()
    _drain(pipeline, worker)
    assert _app.tallies(pipeline) == {v: 1 for v, _ in records}
    assert pipeline.verify().problems == []


class _Echo(mw.Computation):
    """A weak relay that produces two records per input, the later one first: v+ at
    its time + 1 s, then v at its time (neither late)."""

    name = "Echo"
    outputs = ("echoed",)
    productions = "weak"

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.produce("echoed", record.value + b"+", record.timestamp + 1000)
        ctx.produce("echoed", record.value, record.timestamp)


class _InOrder(mw.Computation):
    """Appends each value it handles to its key's state ``seq``."""

    name = "InOrder"

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.state.set("seq", (ctx.state.get("seq") or b"") + record.value + b",")


def test_a_run_on_handed_records_handles_them_all_in_time_order(
    sqlite_cluster: Cluster,
) -> None:
    """The weak Echo's run of key 3 (four inputs, 5 ms apart) hands its eight records
    to one key of InOrder (every record keyed "all"): one run on eight handed records,
    which handles them in time order as a key run handles its pending records, not in
    the order they were produced. SQLite alone: the pipeline's logic.

    Catches a handed run that does not sort its records by time (or cannot: a
    Record has no order of its own), which no run of one handed record shows."""
    cluster = sqlite_cluster
    records = _app.relay_input(40)
    pipeline = mw.Pipeline(cluster, "order", interval=0.05)
    pipeline.injector("values", mw.IterableSource(records), stream="values")
    pipeline.computation(_Echo(), inputs={"values": lambda r: r.value[-1:]})
    pipeline.computation(_InOrder(), inputs={"echoed": lambda r: b"all"})
    pipeline.create()
    pipeline.inject("values")
    txn = Transaction(cluster)
    _pipeline._KeyRunner(pipeline, pipeline.nodes["Echo"]).process(txn, b"3", _pipeline.WAKE)
    txn.commit()
    mine = [v for v, _ in records if v.endswith(b"3")]
    assert len(mine) == 4
    with Snapshot(cluster) as snap:
        seq = pipeline.state(snap, "InOrder", b"all")["seq"]
    assert seq == b"".join(v + b"," for v in [*mine, *(v + b"+" for v in mine)])


def test_a_weak_production_for_a_subscriber_without_code_here_is_held(
    sqlite_cluster: Cluster,
) -> None:
    """Mid-upgrade: the new topology adds Second, a consumer of the weak Relay's
    output, and a process of the old one (no Second's code) runs the Relay's keys. A
    hand-off needs the subscriber's key extractor, so those productions must fall back
    to checkpointed delivery: held for Second, then moved into its rows by the new
    topology's advancer. The Tally and Second each get every value once.

    Catches the weak production that hands records to the subscribers it has code
    for and drops the others' (``len(known) < len(names)`` removed from
    ``_KeyRun.produce``): nothing is held, and Second never sees the values. SQLite
    alone, as the test above."""
    cluster = sqlite_cluster
    records = _app.relay_input(20)

    def build(second: bool) -> mw.Pipeline:
        pipeline = _app.build_relay(cluster, records, weak=True)
        if second:
            pipeline.computation(_app.Second(), inputs={"relayed": lambda r: r.value[-1:]})
        return pipeline

    old, new = build(False), build(True)
    old.create()
    new.create()
    with Snapshot(cluster) as snap:
        assert new.subscriptions(snap)["relayed"] == ["Second", "Tally"]
    assert old.inject("values") == len(records)
    old_worker = Worker(cluster, old.observers(), threads=1)
    _run_keys(old, old_worker, "Relay")
    with Snapshot(cluster) as snap:
        held = sum(1 for _ in snap.scan(new.held, None, None, ["h:rec"]))
    assert held == len(records)
    new_worker = Worker(cluster, new.observers(), threads=1)
    new_worker.register()
    _drain(new, new_worker)
    assert _app.tallies(new) == {v: 1 for v, _ in records}
    assert _app.tallies(new, "Second") == {v: 1 for v, _ in records}
    assert new.verify().problems == []


class _Maker(mw.Computation):
    """Weak: for each input, a record to the key it names ("given") and a late one
    (1 ms below its input) to the key its subscriber's extractor picks."""

    name = "Maker"
    outputs = ("made",)
    productions = "weak"

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.produce("made", b"keyed", record.timestamp, key=b"given")
        ctx.produce("made", b"late", record.timestamp - 1)


class _StrongMaker(_Maker):
    name = "Maker"
    productions = "strong"


class _Seer(mw.Computation):
    """Keeps what each record it handles carried, in its key's state (by value)."""

    name = "Seer"

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.state.set_json(record.value.decode(), {
            "key": record.key.decode(), "by": record.id.split("/")[0],
            "stream": record.stream, "late": record.late})


def _seer_key(record: mw.Record) -> bytes:
    """A key made of what the extractor is given: the producer (from the id), the
    stream, the lateness and the time. The record has no key yet: this picks it."""
    assert record.key == b"", record.key
    late = "late" if record.late else "on-time"
    return f"{record.id.split('/')[0]}-{record.stream}-{late}-{record.timestamp}".encode()


@pytest.mark.parametrize("how", ["weak", "strong", "held"])
def test_a_handed_or_held_record_carries_what_a_delivered_one_does(
    sqlite_cluster: Cluster, how: str
) -> None:
    """A production handed to its subscriber's run (weak), or held for a subscriber the
    producing process has no code for and moved into its rows by a process that has
    (held), must reach the key and the handler as one delivered through the store
    (strong, the reference) does: to the key its producer named, else to the key its
    subscriber's extractor picks from the record's id, stream, lateness and time, and
    with its key, id, stream and lateness in the handler. SQLite alone: the pipeline's
    logic."""
    cluster = sqlite_cluster

    def build(maker: mw.Computation, seer: bool) -> mw.Pipeline:
        pipeline = mw.Pipeline(cluster, "seen", interval=0.05)
        pipeline.injector("in", mw.IterableSource([(b"x", 1_000)]), stream="in")
        pipeline.computation(maker, inputs={"in": lambda r: r.value})
        if seer:
            pipeline.computation(_Seer(), inputs={"made": _seer_key})
        pipeline.create()
        return pipeline

    pipeline = build(_StrongMaker() if how == "strong" else _Maker(), seer=True)
    assert pipeline.inject("in") == 1
    if how == "held":  # a process of the old topology, without Seer, runs the Maker
        old = build(_Maker(), seer=False)
        _run_keys(old, Worker(cluster, old.observers(), threads=1), "Maker")
        assert sum(1 for _ in Snapshot(cluster).scan(pipeline.held, None, None, ["h:rec"])) == 2
    worker = Worker(cluster, pipeline.observers(), threads=1)
    worker.register()
    _drain(pipeline, worker)
    with Snapshot(cluster) as snap:
        seen = {key: pipeline.state(snap, "Seer", key)
                for key, _ in snap.scan(pipeline.nodes["Seer"].table)}
    assert seen == {
        b"given": {"keyed": b'{"by":"Maker","key":"given","late":false,"stream":"made"}'},
        b"Maker-made-late-999": {
            "late": b'{"by":"Maker","key":"Maker-made-late-999","late":true,"stream":"made"}'},
    }
    assert list(Snapshot(cluster).scan(pipeline.held)) == []  # moved with its h:key
    assert pipeline.verify().problems == []


def test_productions_other_than_strong_or_weak_are_refused() -> None:
    with pytest.raises(percolator.InvalidArgument, match="productions must be"):
        type("Bad", (mw.Computation,), {"productions": "eventual"})
