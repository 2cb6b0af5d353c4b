"""Adding a computation to a running MillWheel pipeline (issue 35): the subscriptions
are stored and read by every delivering transaction, so each record lands on one side
of the change; processes without the new computation's code hold its records until
one with it moves them into its rows. The new consumer gets every record from the
change onwards exactly once, the old ones everything exactly once."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import percolator
from observers import Worker, wait_for_observers
from observers import millwheel as mw
from observers.millwheel import _pipeline
from percolator import Cluster, Snapshot, Transaction
from tests._backends import SQLITE_AND_BIGTABLE, backend_fixture
from tests._concurrency import spawn_module
from tests.millwheel import _app

# On the embedded store and Bigtable: the recipe's code is the same on every store
# (the note in tests/millwheel/test_millwheel.py).
backend = backend_fixture(SQLITE_AND_BIGTABLE)


def _held(pipeline: mw.Pipeline) -> int:
    with Snapshot(pipeline.cluster) as snap:
        return sum(1 for _ in snap.scan(pipeline.held, None, None, ["h:rec"]))


def _drain(pipeline: mw.Pipeline) -> None:
    with Worker(pipeline.cluster, pipeline.observers(), threads=1):
        wait_for_observers(pipeline.cluster, 120)


def test_a_production_lands_on_one_side_of_the_subscription(cluster: Cluster) -> None:
    """Three injections by a process of the old topology (no Second): one committed
    before the subscription, one whose transaction starts before it and reads and
    commits after it, one after. Only the last reaches Second (held, then moved by
    the new topology's advancer, whose low watermark stays at or below the held
    records); the Tally gets all of them once."""
    records = _app.relay_input(30)
    old = _app.build_fanout(cluster, mw.IterableSource(records), False, inject_batch=10)
    new = _app.build_fanout(cluster, mw.IterableSource(records), True, inject_batch=10)
    old.create()
    assert old.inject("values") == 10
    with Transaction(cluster) as txn:  # its snapshot precedes the change, its commit not
        assert txn.start_ts  # the snapshot, taken now (else at the first read)
        new.create()
        assert _pipeline._inject(txn, old, old.injectors["values"], 10) == 10
    with Snapshot(cluster) as snap:
        assert new.subscriptions(snap) == {"values": ["Second", "Tally"]}
    assert old.inject("values") == 10
    assert _held(new) == 10  # old knows no Second: it holds them
    _, low = new.advance()["Second"]
    assert low <= records[20][1]  # held records count as pending
    assert _held(new) == 0
    _drain(new)
    assert _app.tallies(new) == {v: 1 for v, _ in records}
    assert _app.tallies(new, "Second") == {v: 1 for v, _ in records[20:]}
    assert new.verify().ok
    assert all(s.pending == 0 for s in new.status())


def test_a_computation_added_in_a_new_process_gets_the_rest_of_the_log_once(
    tmp_path: Path,
) -> None:
    """Two processes of the old topology (source -> Tally) run while a log grows; a
    process of the new one (source -> Tally and Second) starts and adds Second. Old
    and new processes are killed with SIGKILL during the change; while the only new
    process is dead, the old ones inject and hold Second's records. At the end the
    Tally has every line once and Second a run of the log's last lines, once each,
    including every line appended after the subscription committed."""
    url = f"sqlite:///{tmp_path}/repo.db"
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [b"v%05d" % i for i in range(800)]
    written = 0

    def append(n: int) -> None:
        nonlocal written
        with open(logs / "000.log", "ab") as f:
            f.write(b"".join(line + b"\n" for line in lines[written:written + n]))
        written += n

    def spawn(second: bool) -> subprocess.Popen[bytes]:
        return spawn_module("observers.millwheel", "run", "--cluster", url, "--pipeline",
                            "tests.millwheel._app:make_fanout", "--threads", "2",
                            env={"MW_LOG_DIR": str(logs), "MW_SECOND": "1" if second else "0"})

    def wait(what: str, done: object) -> None:
        deadline = time.monotonic() + 240
        while not done():  # type: ignore[operator]
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    with percolator.connect(url) as cluster:
        view = _app.build_fanout(cluster, mw.LogSource(logs), True)
        old = _app.build_fanout(cluster, mw.LogSource(logs), False)
        old.create()

        def subscribed() -> bool:
            with Snapshot(cluster) as snap:
                return "Second" in view.subscriptions(snap).get("values", [])

        procs = [spawn(False), spawn(False)]
        try:
            append(200)
            wait("the Tally got no records", lambda: len(_app.tallies(old)) >= 100)
            procs.append(spawn(True))  # adds Second when it starts
            for _ in range(10):  # lines straddling the change, an old process killed
                append(20)
                time.sleep(0.05)
                if written == 300:
                    procs[0].send_signal(signal.SIGKILL)
                    procs[0].wait()
                    procs[0] = spawn(False)
            wait("Second was never subscribed", subscribed)
            after = written  # every line from here on is injected after the change
            procs[2].send_signal(signal.SIGKILL)  # the only process with Second's code
            procs[2].wait()
            append(200)
            wait("the old processes did not go on", lambda: len(_app.tallies(old)) == written)
            assert _held(view) >= 200  # held for Second, by processes without its code
            procs[2] = spawn(True)
            append(200)
            wait("Second did not get the last line",
                 lambda: lines[-1] in _app.tallies(view, "Second") and _held(view) == 0
                 and all(s.pending == 0 for s in view.status()))
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        tally, second = _app.tallies(view), _app.tallies(view, "Second")
        assert tally == dict.fromkeys(lines, 1)
        assert set(second.values()) == {1}
        first = min(second)
        assert second.keys() == set(lines[lines.index(first):])  # a contiguous run
        assert lines.index(first) <= after
        assert view.verify().ok


class _Keyer(mw.Computation):
    """Forwards each record with an explicit key, not its consumer's extractor's."""

    outputs = ("keyed",)

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.produce("keyed", record.value, record.timestamp, key=b"K")


def test_a_held_record_keeps_the_key_its_producer_gave(cluster: Cluster) -> None:
    """A key run of the old topology produces, with an explicit key, for a consumer it
    has no code for: the record is held with its key, and the new topology's advancer
    delivers it to that key, not to the one the consumer's extractor gives."""
    records = _app.relay_input(6)

    def build(with_tally: bool) -> mw.Pipeline:
        pipeline = mw.Pipeline(cluster, "keyed", interval=0.05)
        pipeline.injector("values", mw.IterableSource(records), stream="values")
        pipeline.computation(_Keyer(), inputs={"values": lambda r: r.value[-1:]})
        if with_tally:
            pipeline.computation(_app.Tally(), inputs={"keyed": lambda r: r.value[-1:]})
        return pipeline

    old, new = build(False), build(True)
    old.create()
    new.create()
    assert old.inject("values") == 6
    _drain(old)
    assert _held(new) == 6
    new.advance()
    _drain(new)
    with Snapshot(cluster) as snap:
        keys = {key for key, _ in snap.scan(new.nodes["Tally"].table, None, None, ["s:n/v00000"])}
    assert keys == {b"K"}
    assert _app.tallies(new) == {v: 1 for v, _ in records}


def test_an_advancer_moves_held_records_a_batch_at_a_time(sqlite_cluster: Cluster) -> None:
    """20 records held for Second (injected by a process of the old topology, which
    has no Second); the new topology's advancer, with a batch of 5, moves the 5
    oldest into Second's rows per pass, so that one pass's transaction stays bounded
    (``status`` counts all 20 pending meanwhile, held or moved), and Second then counts
    each once. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    records = _app.relay_input(20)
    old = _app.build_fanout(cluster, mw.IterableSource(records), second=False)
    new = _app.build_fanout(cluster, mw.IterableSource(records), second=True, inject_batch=5)
    old.create()
    new.create()
    assert old.inject("values") == 20
    assert _held(new) == 20
    for left in (15, 10):
        new.advance()
        assert _held(new) == left
        # status counts Second's held records as pending, with those moved into its rows
        assert {s.name: s.pending for s in new.status()}["Second"] == 20
    while _held(new):
        new.advance()
    _drain(new)
    assert _app.tallies(new, "Second") == {v: 1 for v, _ in records}


def test_an_old_advancer_holds_the_watermark_below_records_it_cannot_move(
    sqlite_cluster: Cluster,
) -> None:
    """Mid-upgrade: the new topology's Second also reads the stream "extra"; a process
    of the old one (whose Second reads "values" only) injects both, so the extra
    records are held for the new code. The old process's advancer can move none of
    them, and must keep Second's low watermark at or below the oldest (the records
    are pending for Second all the same); the new one's moves them and Second counts
    each once. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    values = _app.relay_input(6)
    extra = [(b"x%05d" % i, ts + 1) for i, (_, ts) in enumerate(values)]

    def build(new_code: bool) -> mw.Pipeline:
        pipeline = mw.Pipeline(cluster, "upgrade", interval=0.05)
        pipeline.injector("values", mw.IterableSource(values), stream="values")
        pipeline.injector("extra", mw.IterableSource(extra), stream="extra")
        inputs = {"values": lambda r: r.value[-1:]}
        if new_code:
            inputs["extra"] = lambda r: r.value[-1:]
        pipeline.computation(_app.Second(), inputs=inputs)
        return pipeline

    old, new = build(False), build(True)
    old.create()
    new.create()
    assert (old.inject("values"), old.inject("extra")) == (6, 6)
    assert _held(new) == 6
    with Worker(cluster, old.observers(), threads=1):
        wait_for_observers(cluster, 60)
    old.advance()
    assert _held(new) == 6
    (status,) = old.status()
    assert status.low_watermark <= min(ts for _, ts in extra)
    new.advance()
    assert _held(new) == 0
    _drain(new)
    assert _app.tallies(new, "Second") == {v: 1 for v, _ in [*values, *extra]}


class _Echoer(mw.Computation):
    """Sends each record on to ``out``, which nothing subscribes to."""

    outputs = ("out",)

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.produce("out", record.value, record.timestamp)


class _Other(mw.Computation):
    """Reads ``in2``, a stream whose name starts as ``in`` does."""


def test_a_pipeline_created_before_subscriptions_were_stored_delivers_by_its_code(
    sqlite_cluster: Cluster,
) -> None:
    """A pipeline created before subscriptions were stored has no ``sub/<stream>`` row
    for its streams (here ``in`` and ``out`` lose theirs; ``in2``, read by Other, keeps
    its own): until its next ``create()``, a production on such a stream goes to the
    subscribers of this process's code, the Echoer for ``in`` and the pipeline's output
    for ``out``, not to the subscribers of another stream's row (``in2`` sorts right
    after ``in``), nor to nobody. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    pipeline = mw.Pipeline(cluster, "legacy")
    pipeline.injector("a", mw.IterableSource([(b"v", 1_000)]), stream="in")
    pipeline.injector("b", mw.IterableSource([]), stream="in2")
    pipeline.computation(_Echoer(), inputs={"in": lambda r: r.value})
    pipeline.computation(_Other(), inputs={"in2": lambda r: r.value})
    pipeline.create()
    with Transaction(cluster) as txn:  # as before subscriptions were stored
        for row, column in ((b"sub/in", "x:stream"), (b"sub/in", "c:_Echoer"),
                            (b"sub/out", "x:stream")):
            txn.delete(pipeline.meta, row, column)
    with Snapshot(cluster) as snap:
        assert pipeline.subscriptions(snap) == {"in2": ["_Other"]}
    assert pipeline.inject("a") == 1
    worker = Worker(cluster, pipeline.observers(), threads=1)
    worker.register()
    worker._scanner.serve_row(pipeline.nodes["_Echoer"].table, b"v")
    with Snapshot(cluster) as snap:
        assert [(r.value, r.timestamp, r.key, r.stream, r.id.split("/")[0])
                for r in pipeline.output(snap, "out")] == [(b"v", 1_000, b"", "out", "_Echoer")]
        assert [r.value for r in pipeline.output(snap, "in")] == []
        assert list(snap.scan(pipeline.nodes["_Other"].table)) == []
        assert list(snap.scan(pipeline.held)) == []
        assert list(snap.scan(pipeline.nodes["_Echoer"].table)) == []  # consumed


def test_add_computation_subscribes_it_from_the_change_on(sqlite_cluster: Cluster) -> None:
    """``add_computation`` on a created pipeline that has injected and advanced: the
    stored topology (``subscriptions``, exactly: the meta table's injector and
    watermark rows are no streams) gains the new consumer, which gets the records
    injected after the change, and the Tally all of them. SQLite alone: the pipeline's
    logic."""
    cluster = sqlite_cluster
    records = _app.relay_input(4)
    pipeline = mw.Pipeline(cluster, "grow", inject_batch=2)
    pipeline.injector("feed", mw.IterableSource(records), stream="values")
    pipeline.computation(_app.Tally(), inputs={"values": lambda r: r.value[-1:]})
    pipeline.create()
    assert pipeline.inject("feed") == 2
    pipeline.advance()
    with Snapshot(cluster) as snap:
        assert pipeline.subscriptions(snap) == {"values": ["Tally"]}
    pipeline.add_computation(_app.Second(), inputs={"values": lambda r: r.value[-2:-1]})
    with Snapshot(cluster) as snap:
        assert pipeline.subscriptions(snap) == {"values": ["Second", "Tally"]}
    assert pipeline.inject("feed") == 2
    pipeline.advance()
    _drain(pipeline)
    assert _app.tallies(pipeline) == {v: 1 for v, _ in records}
    assert _app.tallies(pipeline, "Second") == {v: 1 for v, _ in records[2:]}
