"""Photon on Percolator (``observers.photon``): every test compares the joined output
with an in-memory reference join of the same generated input.

Duplicate feeds from two ingesters in different orders, a primary that arrives after
its foreign events (woken, not polled), the waiter/primary race played step by step
(and the mutant without its guard), a primary that never comes, crash points inside
the join and the ingest commits, the adapter's skip and poison, the retention
boundary, replay after downtime, and worker and ingest processes killed with
``kill -9``."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import VerifyReport, Worker, photon, wait_for_observers
from observers._changes import TableChanges
from observers.photon import _pipeline
from observers.photon.__main__ import main as photon_main
from observers.photon._events import encode_ref
from percolator import Cluster, Snapshot, Transaction, metrics
from percolator._notifications import quarantined, retry_quarantined
from percolator.ext import pending_notifications
from percolator.testing import CrashPoint, Interleaving, client_of, crash_commit
from tests._backends import BACKENDS, SQLITE_AND_BIGTABLE, backend_fixture, make_store_url
from tests._concurrency import spawn_module

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = photon.JsonAdapter(foreign_id="click", primary_id="query", primary_ref="query",
                             time="t")
DAY = timedelta(days=1)


def now_ms() -> int:
    return int(time.time() * 1000)


# Photon's code is the same on every store (it never asks which one it runs on): its
# tests run on the embedded store (notifications found by scans) and on Bigtable (by the
# notification index). On HBase, where each test makes and drops its pipeline's tables,
# only two ingesters' duplicate feeds joined once and a waiting event woken by its
# primary, end to end, run: HBase's own part, the store contract, the transactions'
# crash points and the observers' scans, has tests of its own there (CONTRIBUTING.md,
# "Test suite time").
backend = backend_fixture(SQLITE_AND_BIGTABLE)


def generate(rng: random.Random, queries: int, clicks: int, *, orphans: float = 0.1,
             t: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Queries q0.. and clicks c0.. referencing them; a share of clicks reference a
    query that never comes."""
    t = now_ms() if t is None else t
    qs = [{"query": f"q{i}", "t": t, "text": f"text {i}"} for i in range(queries)]
    cs = []
    for i in range(clicks):
        ref = f"q{rng.randrange(queries)}" if rng.random() >= orphans else f"missing{i}"
        cs.append({"click": f"c{i}", "query": ref, "t": t})
    return qs, cs


def reference(qs: list[dict[str, Any]], cs: list[dict[str, Any]]) -> dict[bytes, bytes]:
    """The hash join the pipeline must reproduce: click id -> output."""
    enc = [json.dumps(q, sort_keys=True, separators=(",", ":")).encode() for q in qs]
    by_id = {q["query"]: raw for q, raw in zip(qs, enc, strict=True)}
    out = {}
    for c in cs:
        if c["query"] in by_id:
            raw = json.dumps(c, sort_keys=True, separators=(",", ":")).encode()
            out[c["click"].encode()] = ADAPTER.join(by_id[c["query"]], raw)
    return out


def outputs(p: photon.JoinPipeline) -> dict[bytes, bytes]:
    with Snapshot(p.cluster) as snap:
        return {row[3:]: cells["ev:joined"]
                for row, cells in snap.scan(p.joined_table, None, None, ["ev:joined"])}


def pipeline(cluster: Cluster, **options: Any) -> photon.JoinPipeline:
    options.setdefault("unjoinable_after", 600)
    p = photon.JoinPipeline(cluster, "clicks", options.pop("adapter", ADAPTER), **options)
    p.create()
    return p


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicate_feeds_in_two_ingesters_join_once(cluster: Cluster) -> None:
    """Two ingesters each send every event, in different orders and interleaved with
    the joiner; a tenth of the events a third time. One output per joinable click,
    equal to the reference; verify finds no duplicate commit of any output."""
    rng = random.Random(16)
    qs, cs = generate(rng, 60, 40)
    p = pipeline(cluster)
    feeds = []
    for seed in (1, 2):
        order = [("q", q) for q in qs] + [("c", c) for c in cs]
        random.Random(seed).shuffle(order)
        feeds.append(order)
    feeds.append([e for e in feeds[0] if rng.random() < 0.1])
    written = 0
    with Worker(cluster, p.observers(), threads=2):
        for start in range(0, len(feeds[0]), 20):  # the feeds take turns, 20 at a time
            for feed in feeds:
                part = feed[start:start + 20]
                written += p.log_primary(cluster, [e for k, e in part if k == "q"]).written
                written += p.log_foreign(cluster, [e for k, e in part if k == "c"]).written
        wait_for_observers(cluster, 120)
    assert written == len(qs) + len(cs)  # every event written once, the rest duplicates
    assert outputs(p) == reference(qs, cs)
    report = p.verify()
    assert report.ok, report
    assert report.by_state == {"joined": len(reference(qs, cs)),
                               "waiting": len(cs) - len(reference(qs, cs))}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_foreign_event_waits_for_its_primary_and_is_woken_by_it(cluster: Cluster) -> None:
    """Clicks before their queries wait; the queries' ingest wakes them (no deadline
    sweep runs in this test: nothing polls)."""
    qs, cs = generate(random.Random(2), 10, 10, orphans=0)
    p = pipeline(cluster)
    with Worker(cluster, p.observers(), threads=2):
        p.log_foreign(cluster, cs)
        wait_for_observers(cluster, 60)
        with Snapshot(cluster) as snap:
            assert {p.state(snap, c["click"]) for c in cs} == {photon.State.WAITING}
            assert len(list(snap.scan(p.deadlines, None, None, ["d:x"]))) == len(cs)
        p.log_primary(cluster, qs)
        wait_for_observers(cluster, 60)
    assert outputs(p) == reference(qs, cs)
    with Snapshot(cluster) as snap:
        assert list(snap.scan(p.deadlines, None, None, ["d:x"])) == []
        assert list(snap.scan(p.primary, None, None, ["j:waiters"])) == []


def _race(cluster: Cluster, joiner_first: bool) -> photon.State | None:
    """The joiner registers a click as a waiter while the ingest of its query runs
    concurrently (both read before either commits); then both finish in the given
    order, and a worker drains what is left."""
    p = pipeline(cluster)
    q = {"query": "q", "t": now_ms()}
    p.log_foreign(cluster, [{"click": "c", "query": "q", "t": now_ms()}])
    worker = Worker(cluster, p.observers(), threads=1)
    worker.register()
    row = photon.row_key(b"c")
    with Interleaving(cluster) as world:
        joiner = world.actor("joiner", lambda: worker._scanner.serve_row(p.foreign, row))
        ingest = world.actor("ingest", lambda: p.log_primary(cluster, [q]))
        joiner.run_until(lambda s: s.matches("read_rows", table=p.primary))
        joiner.step()  # the joiner has read the query's row: absent
        ingest.run_until(lambda s: s.matches("read_rows", table=p.primary))
        ingest.step()  # the ingest has read it: no waiter yet
        for actor in (joiner, ingest) if joiner_first else (ingest, joiner):
            actor.finish()
    with worker:
        wait_for_observers(cluster, 60)
    with Snapshot(cluster) as snap:
        return p.state(snap, b"c")


@pytest.mark.parametrize("joiner_first", [True, False], ids=["joiner-first", "ingest-first"])
def test_the_waiter_and_primary_race_loses_no_wake_up(
    cluster: Cluster, joiner_first: bool
) -> None:
    assert _race(cluster, joiner_first) is photon.State.JOINED
    assert photon.JoinPipeline.open(cluster, "clicks").verify().ok


def test_without_the_placeholder_write_the_race_loses_the_click(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutant: a waiter that does not write its primary's ``ev:raw``. Both
    transactions commit (write skew) and the click waits for a query that is there."""
    monkeypatch.setattr(_pipeline, "_hold_primary", lambda *args: None)
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        assert _race(cluster, joiner_first=True) is photon.State.WAITING
        report = photon.JoinPipeline.open(cluster, "clicks").verify()
        assert report.missing == [b"c"] and not report.ok


def test_a_primary_that_never_comes_makes_the_event_unjoinable_once(cluster: Cluster) -> None:
    p = pipeline(cluster, unjoinable_after=0.5, sweep_interval=0.1)
    p.log_foreign(cluster, [{"click": "c", "query": "q", "t": now_ms()}])
    with Worker(cluster, p.observers(), tasks=p.tasks(), threads=1):
        deadline = time.monotonic() + 60
        while p.state(Snapshot(cluster), b"c") is not photon.State.UNJOINABLE:
            assert time.monotonic() < deadline, "never became unjoinable"
            time.sleep(0.05)
        p.log_primary(cluster, [{"query": "q", "t": now_ms()}])  # too late to join
        wait_for_observers(cluster, 60)
        assert p.state(Snapshot(cluster), b"c") is photon.State.UNJOINABLE
        assert outputs(p) == {}
        assert list(Snapshot(cluster).scan(p.deadlines, None, None, ["d:x"])) == []
        assert p.rejoin(photon.State.UNJOINABLE) == 1  # the operator's recovery
        wait_for_observers(cluster, 60)
    assert set(outputs(p)) == {b"c"}
    assert p.verify().ok


def _joiner_on(p: photon.JoinPipeline) -> Worker:
    """A registered worker whose runs the test makes, one row at a time."""
    worker = Worker(p.cluster, p.observers(), threads=1)
    worker.register()
    return worker


def _wake(p: photon.JoinPipeline, row: bytes) -> None:
    """A weak notification of the event in *row*, as a rerun or a stray wake-up."""
    with Transaction(p.cluster) as txn:
        txn.notify(p.foreign, row, "ev:raw")


def test_a_sweeper_clock_ahead_of_the_joiners_still_ends_the_wait(cluster: Cluster) -> None:
    """The sweeper's host is 5 ms ahead of the joiner's: it fires a deadline that the
    joiner's clock says is 3 ms away, and deletes the deadline row. The joiner must
    obey the sweep (the event ends unjoinable), not keep it waiting with nothing left
    to wake it."""
    t = now_ms()
    joiner_now = [t]
    p = pipeline(cluster, now=lambda: joiner_now[0] / 1000)
    sweeper = photon.JoinPipeline.open(cluster, "clicks", now=lambda: (joiner_now[0] + 5) / 1000)
    p.log_foreign(cluster, [{"click": "c", "query": "q", "t": t}])
    worker, row = _joiner_on(p), photon.row_key(b"c")
    worker._scanner.serve_row(p.foreign, row)
    assert p.state(Snapshot(cluster), b"c") is photon.State.WAITING
    joiner_now[0] = t + 600_000 - 3
    assert sweeper.sweep() == 1
    worker._scanner.serve_row(p.foreign, row)
    assert p.state(Snapshot(cluster), b"c") is photon.State.UNJOINABLE
    with Snapshot(cluster) as snap:
        assert list(snap.scan(p.deadlines, None, None, ["d:x"])) == []
        assert snap.get_row(p.foreign, row, ["j:wait", "j:due"]) == {}
    assert p.verify().ok


def _transactions_begun() -> float:
    values, _ = metrics.snapshot()
    return sum(v for (name, _), v in values.items()
               if name == "percolator_transactions_begun_total")


def test_a_sweep_fires_every_deadline_up_to_the_time_it_is_given_in_batches(
    sqlite_cluster: Cluster,
) -> None:
    """400 clicks wait for queries that never come, all with the deadline t + 10 min.
    A sweep told a time (not its pipeline's clock, which stays at t) one millisecond
    before fires nothing; told the deadline itself, it fires all 400 (each click's
    ``j:due`` set, every deadline row gone), in a few transactions of many deadlines,
    not one per deadline nor a batch's worth of rows skipped; a second sweep finds none.

    The sweep's own questions (the time it is told, a deadline equal to it, its
    batches): the pipeline's logic, so SQLite alone plays it."""
    cluster = sqlite_cluster
    t = now_ms()
    deadline = t + 600_000
    p = pipeline(cluster, now=lambda: t / 1000)
    clicks = [f"c{i:03d}" for i in range(400)]
    p.log_foreign(cluster, [{"click": c, "query": f"never{c}", "t": t} for c in clicks])
    rows = [photon.row_key(c.encode()) for c in clicks]
    with Transaction(cluster) as txn:  # the joiner's body for each: each starts to wait
        assert all(_pipeline.join_event(txn, p, row, t) for row in rows)
    assert p.sweep(now_ms=deadline - 1) == 0
    begun = _transactions_begun()
    assert p.sweep(now_ms=deadline) == len(clicks)
    assert _transactions_begun() - begun <= 4  # a batch per 200 deadlines, not one each
    with Snapshot(cluster) as snap:
        due = {row for row, _ in snap.scan(p.foreign, None, None, ["j:due"])}
        assert due == set(rows)
        assert list(snap.scan(p.deadlines, None, None, ["d:x"])) == []
    assert p.sweep(now_ms=deadline) == 0


def test_a_deadline_gone_since_the_sweeps_scan_is_passed_over_not_the_rest(
    sqlite_cluster: Cluster,
) -> None:
    """Two clicks wait with one deadline; the sweep scans both deadline rows, then,
    before its firing transaction starts, the first of them (in the order the sweep
    fires them) is joined, which deletes its deadline row. The sweep must pass over
    that row and still fire the second: a sweep that stopped at the gone row would
    leave the second waiting with its deadline past. SQLite alone: the pipeline's
    logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    p.log_foreign(cluster, [{"click": "ca", "query": "qa", "t": t},
                            {"click": "cb", "query": "qb", "t": t}])
    first, second = photon.row_key(b"ca"), photon.row_key(b"cb")  # 55/ca, ef/cb
    assert first < second
    worker = _joiner_on(p)
    for row in (first, second):
        worker._scanner.serve_row(p.foreign, row)
    with Interleaving(cluster) as world:
        sweep = world.actor("sweep", lambda: p.sweep(now_ms=t + 600_000))
        sweep.run_until(lambda s: s.matches("scan", table=p.deadlines))
        sweep.run_until(lambda s: s.op == "timestamp")  # the firing transaction's start
        p.log_primary(cluster, [{"query": "qa", "t": t}])
        worker._scanner.serve_row(p.foreign, first)
        assert p.state(Snapshot(cluster), b"ca") is photon.State.JOINED
        assert sweep.finish() == 2  # what its scan found
    with Snapshot(cluster) as snap:
        assert snap.get(p.foreign, second, "j:due") is not None
        assert list(snap.scan(p.deadlines, None, None, ["d:x"])) == []
    worker._scanner.serve_row(p.foreign, second)
    assert p.state(Snapshot(cluster), b"cb") is photon.State.UNJOINABLE
    assert p.verify().ok


def test_a_rejoin_meets_events_another_rejoin_reopened_since_its_scan(
    sqlite_cluster: Cluster,
) -> None:
    """An operator's rejoin scans an unjoinable event; before its transaction starts,
    a second rejoin reopens the same event (its state gone). The first must pass the
    event by (its state is no longer the one it reopens), not fail on the missing
    state. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    p.log_foreign(cluster, [{"click": "c", "query": "q", "t": t - 700_000}])
    worker = _joiner_on(p)
    worker._scanner.serve_row(p.foreign, photon.row_key(b"c"))
    assert p.state(Snapshot(cluster), b"c") is photon.State.UNJOINABLE
    with Interleaving(cluster) as world:
        rejoin = world.actor("rejoin", lambda: p.rejoin(photon.State.UNJOINABLE))
        rejoin.run_until(lambda s: s.matches("scan", table=p.foreign))
        rejoin.run_until(lambda s: s.op == "timestamp")  # its transaction's start
        assert p.rejoin(photon.State.UNJOINABLE) == 1
        assert rejoin.finish() == 1  # what its scan found
    assert p.state(Snapshot(cluster), b"c") is photon.State.PENDING
    p.log_primary(cluster, [{"query": "q", "t": t}])
    worker._scanner.serve_row(p.foreign, photon.row_key(b"c"))
    assert set(outputs(p)) == {b"c"}
    assert p.verify().ok


def test_a_primary_wakes_waiters_whose_ids_hold_spaces(sqlite_cluster: Cluster) -> None:
    """Two clicks whose ids hold a space and a tab wait for one query; its ingest
    notifies exactly their rows (the waiter list is split at its newlines only, an
    id being any bytes), and each then joins. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    clicks = [b"click one", b"click\ttwo"]
    p.log_foreign(cluster, [{"click": c.decode(), "query": "q", "t": t} for c in clicks])
    worker = _joiner_on(p)
    rows = {photon.row_key(c) for c in clicks}
    for row in rows:
        worker._scanner.serve_row(p.foreign, row)
    assert {n.row for n in pending_notifications(cluster, [p.foreign])} == set()
    p.log_primary(cluster, [{"query": "q", "t": t}])
    assert {n.row for n in pending_notifications(cluster, [p.foreign])} == rows
    for row in rows:
        worker._scanner.serve_row(p.foreign, row)
    assert set(outputs(p)) == set(clicks)
    assert p.verify().ok


def _rows(p: photon.JoinPipeline) -> dict[str, dict[bytes, dict[str, bytes]]]:
    """Every row the joiner writes: the foreign, primary, deadline and output tables."""
    with Snapshot(p.cluster) as snap:
        return {table: dict(snap.scan(table, None, None))
                for table in (p.foreign, p.primary, p.deadlines, p.joined_table)}


def test_the_joiners_body_says_whether_it_decided_and_leaves_a_waiting_event_as_it_was(
    sqlite_cluster: Cluster,
) -> None:
    """``join_event`` returns True when it changed the event's course (it started to
    wait, joined, gave up) and False when there was nothing to do, which the joiner
    counts as a wasted run: an event never ingested, one decided already, and one that
    waits and is woken again in time (a stray wake-up), which must leave every row as
    it was, not register the waiter a second time nor move its deadline. The adapter has
    no time field, so a wait's deadline comes from the joiner's clock when it starts to
    wait: only the stored ``j:wait`` keeps it. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    untimed = photon.JsonAdapter(foreign_id="click", primary_id="query", primary_ref="query")
    p = pipeline(cluster, adapter=untimed, now=lambda: t / 1000)
    p.log_foreign(cluster, [{"click": "c", "query": "q"}])
    row = photon.row_key(b"c")

    def join(at_ms: int, event: bytes = row) -> bool:
        with Transaction(cluster) as txn:
            return _pipeline.join_event(txn, p, event, at_ms)

    assert join(t, photon.row_key(b"never-ingested")) is False
    assert join(t) is True  # starts to wait, with the deadline t + 10 min
    waiting = _rows(p)
    assert waiting[p.foreign][row]["j:wait"][:8] == (t + 600_000).to_bytes(8, "big")
    assert waiting[p.primary][photon.row_key(b"q")]["j:waiters"] == row
    assert join(t + 1_000) is False  # woken again, still in time: nothing to do
    assert _rows(p) == waiting
    p.log_primary(cluster, [{"query": "q"}])
    assert join(t + 2_000) is True
    with Snapshot(cluster) as snap:
        assert p.state(snap, b"c") is photon.State.JOINED
        assert p.joined(snap, b"c") == p.joined(snap, "c") == outputs(p)[b"c"]
        assert p.joined(snap, b"never-ingested") is None
    assert join(t + 3_000) is False  # decided already
    p.log_foreign(cluster, [{"click": "u", "query": "never"}])
    unjoinable = photon.row_key(b"u")
    assert join(t, unjoinable) is True
    assert join(t + 600_000, unjoinable) is True  # the deadline: given up
    assert p.state(Snapshot(cluster), b"u") is photon.State.UNJOINABLE
    assert join(t + 600_001, unjoinable) is False
    assert p.verify().ok


def test_a_placeholder_lists_at_most_max_waiters_and_the_others_join_at_their_deadline(
    sqlite_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``MAX_WAITERS`` at 2, three clicks wait for one query: its placeholder lists
    the first two exactly, so the query's ingest wakes those two; the third waits, still
    registered by its deadline row, and joins when the sweep fires it. SQLite alone: the
    pipeline's logic."""
    monkeypatch.setattr(_pipeline, "MAX_WAITERS", 2)
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    clicks = [b"c1", b"c2", b"c3"]
    p.log_foreign(cluster, [{"click": c.decode(), "query": "q", "t": t} for c in clicks])
    rows = [photon.row_key(c) for c in clicks]
    worker = _joiner_on(p)
    for row in rows:
        assert worker._scanner.serve_row(p.foreign, row)
    with Snapshot(cluster) as snap:
        assert snap.get(p.primary, photon.row_key(b"q"), "j:waiters") == b"\n".join(rows[:2])
        assert {p.state(snap, c) for c in clicks} == {photon.State.WAITING}
    p.log_primary(cluster, [{"query": "q", "t": t}])
    assert {n.row for n in pending_notifications(cluster, [p.foreign])} == set(rows[:2])
    for row in rows[:2]:
        worker._scanner.serve_row(p.foreign, row)
    assert p.state(Snapshot(cluster), b"c3") is photon.State.WAITING
    assert p.sweep(now_ms=t + 600_000) == 1
    worker._scanner.serve_row(p.foreign, rows[2])
    assert set(outputs(p)) == set(clicks)
    assert p.verify().ok


def test_the_tasks_are_the_sweep_and_with_a_retention_the_retention_pass(
    sqlite_cluster: Cluster,
) -> None:
    """A pipeline without a retention has one task, the deadline sweep every
    *sweep_interval*; with one, also the retention pass, hourly. Each, run, does its
    work: the sweep fires a deadline its clock has passed, the pass removes an event
    older than the retention. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    clock = [t]
    plain = pipeline(cluster, sweep_interval=0.25)
    assert [(task.name, task.interval) for task in plain.tasks()] == [
        ("photon.clicks.sweep", 0.25)]
    kept = photon.JoinPipeline(cluster, "kept", ADAPTER, unjoinable_after=600, retention=DAY,
                               sweep_interval=0.25, now=lambda: clock[0] / 1000)
    kept.create()
    sweep, retention = kept.tasks()
    assert [(task.name, task.interval) for task in (sweep, retention)] == [
        ("photon.kept.sweep", 0.25), ("photon.kept.retention", 3600.0)]
    kept.log_foreign(cluster, [{"click": "old", "query": "q", "t": t - 2 * 86_400_000},
                               {"click": "new", "query": "q", "t": t}])
    _joiner_on(kept)._scanner.serve_row(kept.foreign, photon.row_key(b"new"))
    clock[0] = t + 600_000
    assert sweep.run_once()
    assert retention.run_once()
    with Snapshot(cluster) as snap:
        assert kept.state(snap, b"old") is None
        assert snap.get(kept.foreign, photon.row_key(b"new"), "j:due") is not None


def test_rejoin_reopens_every_event_in_its_state_in_batches(sqlite_cluster: Cluster) -> None:
    """401 clicks given up (their deadline passed before their first run): ``rejoin``
    of UNJOINABLE puts all 401 back to undecided and wakes each, in a few transactions
    of many events (not one per event, nor a batch's worth of events left out); a
    second finds none. It takes UNJOINABLE or SKIPPED only, and says so. SQLite alone:
    the pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    clicks = [b"c%03d" % i for i in range(401)]
    p.log_foreign(cluster, [{"click": c.decode(), "query": "never", "t": t - 700_000}
                            for c in clicks])
    rows = {photon.row_key(c) for c in clicks}
    with Transaction(cluster) as txn:  # the joiner's body for each: each given up at once
        assert all(_pipeline.join_event(txn, p, row, t) for row in rows)
    with pytest.raises(percolator.InvalidArgument, match=re.escape(
            f"rejoin takes UNJOINABLE or SKIPPED, got {photon.State.JOINED!r}")):
        p.rejoin(photon.State.JOINED)
    begun = _transactions_begun()
    assert p.rejoin(photon.State.UNJOINABLE) == len(clicks)
    assert _transactions_begun() - begun <= 4  # a batch per 200 events, not one each
    with Snapshot(cluster) as snap:
        assert {p.state(snap, c) for c in clicks} == {photon.State.PENDING}
    assert {n.row for n in pending_notifications(cluster, [p.foreign])} == rows
    assert p.rejoin(photon.State.UNJOINABLE) == 0


def test_open_says_what_is_missing_and_takes_the_stored_options_or_the_defaults(
    sqlite_cluster: Cluster,
) -> None:
    """``open`` of a pipeline never created says to create it; of one whose meta table
    holds no configuration (no JSON adapter recorded), says to pass the adapter, and
    with it takes the defaults (unjoinable after an hour, no retention); an old
    caller's ``retention_days`` wins over the stored retention (with its warning)."""
    cluster = sqlite_cluster
    with pytest.raises(percolator.InvalidArgument, match=re.escape(
            f"no photon pipeline 'nope' in {cluster.url}: create() it first")):
        photon.JoinPipeline.open(cluster, "nope")
    cluster.create_table("photon.bare.meta")
    with pytest.raises(percolator.InvalidArgument, match=re.escape(
            "pipeline 'bare' has a custom adapter: pass it (--adapter package.module:NAME)")):
        photon.JoinPipeline.open(cluster, "bare")
    bare = photon.JoinPipeline.open(cluster, "bare", ADAPTER)
    assert (bare.unjoinable_after, bare.retention) == (3_600.0, None)
    pipeline(cluster, retention=DAY)
    with pytest.warns(DeprecationWarning, match="retention=timedelta"):
        old = photon.JoinPipeline.open(cluster, "clicks", retention_days=2)
    assert (old.unjoinable_after, old.retention) == (600.0, 2 * 86_400.0)


def test_a_pipeline_whose_create_was_cut_short_opens_but_ingests_nothing_until_created(
    sqlite_cluster: Cluster,
) -> None:
    """``create`` makes the tables, then observes the joiner's column, then records the
    configuration. One cut short after its tables opens (its adapter given, as the
    CLI's ``--adapter`` does) but must refuse to ingest until ``create`` runs again:
    an event ingested before the column is observed notifies nobody, and no joiner
    would ever run for it. Then the ingest goes through, notifying the joiner."""
    cluster = sqlite_cluster
    whole = photon.JoinPipeline(cluster, "half", ADAPTER, unjoinable_after=600)
    for table in (whole.foreign, whole.primary, whole.joined_table, whole.deadlines,
                  whole.meta):
        cluster.create_table(table)
    opened = photon.JoinPipeline.open(cluster, "half", ADAPTER)
    click = {"click": "c", "query": "q", "t": now_ms()}
    with pytest.raises(percolator.InvalidArgument, match=re.escape(
            "photon pipeline 'half' is not created: call create() before ingesting")):
        opened.log_foreign(cluster, [click])
    assert list(Snapshot(cluster).scan(opened.foreign)) == []
    whole.create()
    assert opened.log_foreign(cluster, [click]).written == 1
    assert {n.row for n in pending_notifications(cluster, [opened.foreign])} == {
        photon.row_key(b"c")}


def test_create_records_the_first_releases_configuration_once_and_leaves_the_pipeline_created(
    sqlite_cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``create`` makes the first release's tables and records the configuration as it
    did (JSON with sorted keys: a pipeline made by either opens with the other), and
    only when it changed: a second ``create`` of the same pipeline commits no new
    version of it, one with another retention does. The object that created the
    pipeline ingests without asking again whether the joiner's column is observed: with
    ZooKeeper a client's view of that registry comes by a watch, and right after
    ``create`` may not show it yet."""
    cluster = sqlite_cluster
    p = pipeline(cluster, retention=DAY)
    assert sorted(t for t in cluster.tables() if t.startswith("photon.")) == [
        f"photon.clicks.{part}" for part in ("deadlines", "foreign", "joined", "meta", "primary")]
    configs = TableChanges(cluster, p.meta, ["m:config"])
    changes, mark = configs.read({}, 10)
    assert [c.value for c in changes] == [
        b'{"json_adapter": {"foreign_id": "click", "primary_id": "query", "primary_ref": '
        b'"query", "time": "t"}, "retention_days": 1.0, "unjoinable_after_ms": 600000}']
    p.create()
    assert configs.read(mark, 10)[0] == []
    pipeline(cluster, retention=2 * DAY)
    changes, _ = configs.read(mark, 10)
    assert [json.loads(c.value)["retention_days"] for c in changes] == [2.0]
    monkeypatch.setattr(cluster, "is_observed", lambda table, column: False)
    created = pipeline(cluster)
    assert created.log_foreign(cluster, [{"click": "c", "query": "q", "t": now_ms()}]).written == 1


def test_verify_lists_at_most_twenty_ids_of_a_violation(sqlite_cluster: Cluster) -> None:
    """21 outputs without their registration: the problem counts 21 and lists the
    first 20 ids, one per line."""
    cluster = sqlite_cluster
    p = pipeline(cluster)
    forged = [b"f%02d" % i for i in range(21)]
    with Transaction(cluster) as txn:
        for fid in forged:
            txn.set(p.joined_table, photon.row_key(fid), "ev:joined", b"x")
    report = p.verify()
    assert sorted(report.orphans) == forged
    assert report.problems == ["output and state disagree: 21" + "".join(
        f"\n  {fid!r}" for fid in report.orphans[:20])]


def test_verify_reports_a_waiting_event_nothing_will_wake(cluster: Cluster) -> None:
    """A waiting event whose deadline row is gone and that has no notification (what
    a sweep without j:due left behind) can never end: verify says so."""
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    p.log_foreign(cluster, [{"click": "c", "query": "q", "t": t}])
    _joiner_on(p)._scanner.serve_row(p.foreign, photon.row_key(b"c"))
    assert p.verify().ok
    with Transaction(cluster) as txn:
        (deadline, _), = txn.scan(p.deadlines, None, None, ["d:x"])
        txn.delete(p.deadlines, deadline, "d:x")
    report = p.verify()
    assert report.missing == [b"c"] and not report.ok


def test_verify_counts_only_its_own_tables_notifications_and_quarantine(
    sqlite_cluster: Cluster,
) -> None:
    """Two waiting events, c and d, whose deadline rows are lost have nothing left to
    wake them: verify reports both, even while another pipeline's foreign table holds
    a notification of c's row key and has d's quarantined (its adapter fails on it):
    those are that pipeline's joiner's, not this one's. SQLite alone: the pipeline's
    logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    p.log_foreign(cluster, [{"click": c, "query": "q", "t": t} for c in ("c", "d")])
    joiner = _joiner_on(p)
    for click in (b"c", b"d"):
        joiner._scanner.serve_row(p.foreign, photon.row_key(click))
    with Transaction(cluster) as txn:  # their deadline rows lost: nothing will wake them
        for deadline, _ in list(txn.scan(p.deadlines, None, None, ["d:x"])):
            txn.delete(p.deadlines, deadline, "d:x")
    _Picky.cured = False
    picky = _Picky(foreign_id="click", primary_id="query", primary_ref="query", time="t")
    other = photon.JoinPipeline(cluster, "other", picky, unjoinable_after=600)
    other.create()
    other.log_primary(cluster, [{"query": "q", "t": t}])
    other.log_foreign(cluster, [{"click": "c", "query": "q", "t": t},
                                {"click": "d", "query": "q", "t": t, "poison": True}])
    worker = Worker(cluster, other.observers(), threads=1, max_failures=1, retry_delay=0)
    worker.register()
    worker._scanner.serve_row(other.foreign, photon.row_key(b"d"))
    assert [q.row for q in quarantined(cluster, other.foreign)] == [photon.row_key(b"d")]
    assert {n.row for n in pending_notifications(cluster, [other.foreign])} == {
        photon.row_key(b"c")}
    report = p.verify()
    assert (report.missing, report.quarantined, report.in_flight) == ([b"c", b"d"], [], 0)


def test_verify_counts_the_events_and_passes_over_a_row_left_without_its_event(
    sqlite_cluster: Cluster,
) -> None:
    """A row left with a state and no event (what retention racing a joiner that gave
    up left before retention deleted every column of the row: a pipeline's rows from
    then), then, after it in row order, a joined event whose output is lost
    and a waiting one, and an output of no event: verify counts the two events,
    reports the joined one's lost output and the output without its event by their
    ids, and passes over the leftover row rather than stop there. SQLite alone: the
    pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    left, joined, waiting = (photon.row_key(c) for c in (b"a", b"c", b"d"))
    assert left < joined < waiting  # 43/a, 6f/c, cc/d
    p.log_primary(cluster, [{"query": "q", "t": t}])
    p.log_foreign(cluster, [{"click": "a", "query": "never", "t": t},
                            {"click": "c", "query": "q", "t": t},
                            {"click": "d", "query": "never", "t": t}])
    joiner = _joiner_on(p)
    for row in (joined, waiting):
        joiner._scanner.serve_row(p.foreign, row)
    with Transaction(cluster) as txn:
        for column in ("ev:raw", "ev:t"):
            txn.delete(p.foreign, left, column)
        txn.set(p.foreign, left, "j:state", b"U")
        txn.delete(p.joined_table, joined, "ev:joined")
        txn.set(p.joined_table, photon.row_key(b"forged"), "ev:joined", b"x")
    report = p.verify()
    assert (report.events, report.by_state) == (2, {"joined": 1, "waiting": 1})
    assert report.orphans == [b"c", b"forged"] and not report.ok


def test_retention_racing_a_joiner_that_gives_up_leaves_nothing_of_the_event(
    sqlite_cluster: Cluster,
) -> None:
    """Retention reads an old event still undecided, then its joiner gives up on it
    (``j:state`` U) and commits before retention does. Retention deletes the row's
    every column, the state too, so the two conflict: retention's commit fails, and
    its retry deletes the event and the decision. (It deleted only the cells it had
    read, so both committed and left a row holding only ``j:state``, which no later
    pass deleted: it has no event time.) SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    p.log_foreign(cluster, [{"click": "a", "query": "never", "t": t}])
    row = photon.row_key(b"a")
    retention = Transaction(cluster)
    assert _pipeline._forget(retention, p, p.foreign, [row], t + 1) == 1
    with Transaction(cluster) as joiner:
        joiner.set(p.foreign, row, "j:state", b"U")
    with pytest.raises(percolator.ConflictError):
        retention.commit()
    assert _pipeline._forget(cluster, p, p.foreign, [row], t + 1) == 1  # its retry
    with Snapshot(cluster) as snap:
        assert list(snap.scan(p.foreign)) == []


def test_verify_counts_undecided_events_in_flight_and_reports_one_nobody_will_run(
    sqlite_cluster: Cluster,
) -> None:
    """An event written before the joiner's column was observed (what an ingest into a
    pipeline whose ``create()`` was cut short did before ``open`` checked) has no
    notification: verify reports it as never to be processed, while the two ingested
    after ``create()``, not run yet, are in flight. SQLite alone: the pipeline's
    logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = photon.JoinPipeline(cluster, "half", ADAPTER, unjoinable_after=600)
    for table in (p.foreign, p.primary, p.joined_table, p.deadlines, p.meta):
        cluster.create_table(table)
    with Transaction(cluster) as txn:
        txn.set(p.foreign, photon.row_key(b"lost"), "ev:raw",
                json.dumps({"click": "lost", "query": "q", "t": t}).encode())
    p.create()
    p.log_foreign(cluster, [{"click": c, "query": "q", "t": t} for c in ("c1", "c2")])
    report = p.verify()
    assert (report.events, report.by_state) == (3, {"pending": 3})
    assert (report.in_flight, report.missing) == (2, [b"lost"]) and not report.ok


def test_a_primary_in_the_log_of_a_feed_without_a_directory_is_unreadable(
    sqlite_cluster: Cluster,
) -> None:
    """A primary kept as a reference into the log of a feed the pipeline has no
    directory for (no ``feed/<name>`` row: a feed that never ran here): the join fails
    with PrimaryUnreadable naming the feed, not a deep error. SQLite alone: the
    pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    with Transaction(cluster) as txn:  # what a feed with index=True writes
        txn.set(p.primary, photon.row_key(b"q"), "ev:raw",
                encode_ref("elsewhere", "q.log", 0, b'{"query":"q"}'))
    p.log_foreign(cluster, [{"click": "c", "query": "q", "t": t}])
    txn = Transaction(cluster)
    with pytest.raises(photon.PrimaryUnreadable, match="no directory known for feed 'elsewhere'"):
        _pipeline.join_event(txn, p, photon.row_key(b"c"), t)
    txn.rollback()


def test_the_joiner_counts_its_wasted_runs(sqlite_cluster: Cluster) -> None:
    """A run that decides an event is work; each later run for it (a duplicate feed's
    wake-up, a rerun) finds it decided and counts as wasted (``_Joiner.wasted``, the
    benchmark's wasted joins). SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    (joiner,) = p.observers()
    worker = Worker(cluster, [joiner], threads=1)
    worker.register()
    p.log_primary(cluster, [{"query": "q", "t": t}])
    p.log_foreign(cluster, [{"click": "c", "query": "q", "t": t}])
    row = photon.row_key(b"c")
    worker._scanner.serve_row(p.foreign, row)
    assert p.state(Snapshot(cluster), b"c") is photon.State.JOINED
    assert joiner.wasted == 0  # type: ignore[attr-defined]
    for wasted in (1, 2):
        _wake(p, row)
        worker._scanner.serve_row(p.foreign, row)
        assert joiner.wasted == wasted  # type: ignore[attr-defined]


def test_an_ingest_of_more_than_a_batch_counts_every_batch(sqlite_cluster: Cluster) -> None:
    """501 clicks go in two ingest transactions (500 a batch): the result counts all
    501 written, a second ingest of them all 501 duplicates, and an ingest of 501
    clicks older than the retention boundary all 501 too late; an event three times in
    one batch is written once and counted twice a duplicate."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, retention=DAY, now=lambda: t / 1000)
    assert p.boundary_ms(Snapshot(cluster)) == 0  # none yet: nothing is too late
    assert p.apply_retention(t) == 0  # the boundary: a day ago
    clicks = [{"click": f"c{i:03d}", "query": "q", "t": t} for i in range(501)]
    assert p.log_foreign(cluster, clicks).written == 501
    assert p.log_foreign(cluster, clicks).duplicates == 501
    old = [{**c, "click": "old" + c["click"], "t": t - 2 * 86_400_000} for c in clicks]
    assert p.log_foreign(cluster, old).too_late == 501
    again = p.log_foreign(cluster, [{"click": "x", "query": "q", "t": t}] * 3)
    assert (again.written, again.duplicates) == (1, 2)  # one batch, one event thrice


def test_the_row_key_of_an_event_keeps_its_stored_format() -> None:
    """Two lowercase hex digits of the id's CRC-32, a slash, the id: the rows that
    pipelines already hold are found by it (a change of format loses them)."""
    assert [photon.row_key(i) for i in (b"a", b"c", b"waiting")] == [
        b"43/a", b"6f/c", b"ae/waiting"]


def test_an_event_id_must_be_non_empty_bytes_or_str(sqlite_cluster: Cluster) -> None:
    p = pipeline(sqlite_cluster)
    with Snapshot(sqlite_cluster) as snap:
        for bad in (b"", 5):
            with pytest.raises(percolator.InvalidArgument, match=re.escape(
                    f"an event id must be non-empty bytes or str, got {bad!r}")):
                p.state(snap, bad)  # type: ignore[arg-type]


def test_verify_reports_an_output_committed_twice(cluster: Cluster) -> None:
    """verify counts an event's outputs from the write records of its output cell: a
    second commit shows although it overwrote the first; a delete is no output."""
    t = now_ms()
    p = pipeline(cluster, clock=lambda: t)
    p.log_primary(cluster, [{"query": "q", "t": t}])
    p.log_foreign(cluster, [{"click": c, "query": "q", "t": t} for c in ("once", "twice")])
    worker = _joiner_on(p)
    for click in (b"once", b"twice"):
        worker._scanner.serve_row(p.foreign, photon.row_key(click))
    assert p.verify().ok
    joined = outputs(p)
    with Transaction(cluster) as txn:  # "once": deleted, then written back
        txn.delete(p.joined_table, photon.row_key(b"once"), "ev:joined")
    with Transaction(cluster) as txn:
        txn.set(p.joined_table, photon.row_key(b"once"), "ev:joined", joined[b"once"])
        txn.set(p.joined_table, photon.row_key(b"twice"), "ev:joined", joined[b"twice"])
    report = p.verify()
    assert sorted(report.duplicates) == [b"once", b"twice"] and not report.ok


def test_a_joiner_woken_in_the_deadline_millisecond_gives_up_as_the_sweep_does(
    cluster: Cluster,
) -> None:
    """The sweep counts a deadline equal to its clock as passed; so must the joiner:
    an event first seen in that millisecond is unjoinable at once (no wait), and a
    waiting event woken then (not by the sweep) is given up, while one millisecond
    earlier both leave it waiting."""
    t = now_ms()
    deadline = t + 600_000
    joiner_now = [deadline]
    p = pipeline(cluster, now=lambda: joiner_now[0] / 1000)
    p.log_foreign(cluster, [{"click": "late", "query": "q", "t": t},
                            {"click": "woken", "query": "q", "t": t}])
    worker = _joiner_on(p)
    worker._scanner.serve_row(p.foreign, photon.row_key(b"late"))
    assert p.state(Snapshot(cluster), b"late") is photon.State.UNJOINABLE
    joiner_now[0] = t
    worker._scanner.serve_row(p.foreign, photon.row_key(b"woken"))
    assert p.state(Snapshot(cluster), b"woken") is photon.State.WAITING
    for now, state in ((deadline - 1, photon.State.WAITING),
                       (deadline, photon.State.UNJOINABLE)):
        assert p.sweep(now_ms=now - 1) == 0  # the sweep, a step behind, fires nothing
        joiner_now[0] = now
        _wake(p, photon.row_key(b"woken"))
        worker._scanner.serve_row(p.foreign, photon.row_key(b"woken"))
        assert p.state(Snapshot(cluster), b"woken") is state, now - deadline
    assert list(Snapshot(cluster).scan(p.deadlines, None, None, ["d:x"])) == []
    assert p.verify().ok


def test_a_joiner_dying_inside_its_commit_joins_once(store_url: str) -> None:
    """Four clicks' joins die each at a point of its commit (before, at and after the
    commit point); a worker then runs: every click is joined once, with one committed
    output even after a roll-forward. (One pipeline for the four points, a click each:
    a pipeline per point made and dropped its tables four times on HBase.)"""
    points = (CrashPoint("prewrite", 0), CrashPoint("prewrite", 1),
              CrashPoint("commit_point"), CrashPoint("commit", 0))
    with percolator.connect(store_url) as cluster:
        p = pipeline(cluster)
        qs, cs = generate(random.Random(5), 2, len(points), orphans=0)
        p.log_primary(cluster, qs)
        p.log_foreign(cluster, cs)
        for i, point in enumerate(points):
            dying = client_of(cluster)
            dying.one_phase_commit = False
            txn = Transaction(dying)
            assert _pipeline.join_event(txn, p, photon.row_key(b"c%d" % i), now_ms())
            assert crash_commit(txn, point) == (point.phase != "prewrite")
        with Worker(cluster, p.observers(), threads=1):
            wait_for_observers(cluster, 60)
        assert outputs(p) == reference(qs, cs)
        assert p.verify().ok  # one committed output each, even after a roll-forward


@pytest.mark.parametrize("point", [CrashPoint("prewrite", 1), CrashPoint("commit_point")],
                         ids=lambda c: f"{c.phase}-{c.index}")
def test_an_ingest_dying_inside_its_commit_wakes_its_waiters_or_nothing(
    cluster: Cluster, point: CrashPoint
) -> None:
    qs, cs = generate(random.Random(6), 1, 3, orphans=0)
    p = pipeline(cluster)
    with Worker(cluster, p.observers(), threads=1):
        p.log_foreign(cluster, cs)
        wait_for_observers(cluster, 60)
        dying = client_of(cluster)
        dying.one_phase_commit = False
        txn = Transaction(dying)
        _pipeline._ingest_primary(txn, p, p._prepare(qs, foreign=False)[0])
        committed = crash_commit(txn, point)
        wait_for_observers(cluster, 60)
        if not committed:
            assert outputs(p) == {}
            p.log_primary(cluster, qs)  # the feed sends it again
            wait_for_observers(cluster, 60)
    assert outputs(p) == reference(qs, cs)
    assert p.verify().ok


class _Picky(photon.JsonAdapter):
    """Skips clicks marked "skip"; raises on "poison" until cured."""

    cured = False

    def join(self, primary: bytes, foreign: bytes) -> bytes | None:
        event = json.loads(foreign)
        if event.get("skip"):
            return None
        if event.get("poison") and not _Picky.cured:
            raise RuntimeError("the adapter cannot handle this event")
        return super().join(primary, foreign)


def test_the_adapter_skips_and_a_poison_event_is_quarantined_alone(cluster: Cluster) -> None:
    _Picky.cured = False
    adapter = _Picky(foreign_id="click", primary_id="query", primary_ref="query", time="t")
    p = pipeline(cluster, adapter=adapter)
    t = now_ms()
    p.log_primary(cluster, [{"query": "q", "t": t}])
    p.log_foreign(cluster, [{"click": "ok", "query": "q", "t": t},
                            {"click": "skip", "query": "q", "t": t, "skip": True},
                            {"click": "bad", "query": "q", "t": t, "poison": True}])
    with Worker(cluster, p.observers(), threads=1, max_failures=2, retry_delay=0.01):
        wait_for_observers(cluster, 60)
        snap = Snapshot(cluster)
        assert p.state(snap, b"ok") is photon.State.JOINED
        assert p.state(snap, b"skip") is photon.State.SKIPPED
        assert p.state(snap, b"bad") is photon.State.PENDING
        assert [q.row for q in quarantined(cluster, p.foreign)] == [photon.row_key(b"bad")]
        report = p.verify()
        assert report.quarantined == [b"bad"] and report.ok
        _Picky.cured = True
        retry_quarantined(cluster, p.foreign)
        wait_for_observers(cluster, 60)
    assert set(outputs(p)) == {b"ok", b"bad"}


def test_the_retention_boundary_refuses_old_events_and_never_goes_back(
    cluster: Cluster,
) -> None:
    day = 86_400_000
    now = now_ms()
    p = pipeline(cluster, retention=DAY)
    old_q, old_c = generate(random.Random(8), 3, 3, orphans=0, t=now - 2 * day)
    new_q, new_c = generate(random.Random(9), 3, 3, orphans=0, t=now)
    new_q = [{**q, "query": "n" + q["query"]} for q in new_q]
    new_c = [{**c, "click": "n" + c["click"], "query": "n" + c["query"]} for c in new_c]
    with Worker(cluster, p.observers(), threads=1):
        p.log_primary(cluster, old_q + new_q)
        p.log_foreign(cluster, old_c + new_c)
        wait_for_observers(cluster, 60)
        assert len(outputs(p)) == 6
        assert p.apply_retention(now) == 6  # the old queries and clicks
        assert set(outputs(p)) == {c["click"].encode() for c in new_c}
        assert p.boundary_ms(Snapshot(cluster)) == now - day
        p.apply_retention(now - day)  # an older boundary is a no-op
        assert p.boundary_ms(Snapshot(cluster)) == now - day
        again = p.log_foreign(cluster, old_c)
        assert (again.too_late, again.written) == (3, 0)  # refused, not joined again
        assert p.log_primary(cluster, old_q).too_late == 3
        wait_for_observers(cluster, 60)
    assert set(outputs(p)) == {c["click"].encode() for c in new_c}
    assert p.verify().ok


def test_retention_leaves_events_without_a_time_and_does_nothing_unless_configured(
    sqlite_cluster: Cluster,
) -> None:
    """An adapter without a time field: a click that waited for its query (a
    placeholder aged by ``j:held``), then joined when the query came; neither has an
    ``ev:t``. Ten days later, retention removes nothing (returns 0), without a
    configured retention or with one day: an event without a time never falls behind
    the boundary (docs/photon.md), so the query's ingest drops the placeholder's
    ``j:held`` with it, and the scan that looks for old rows must not trip over rows
    that have neither ``ev:t`` nor ``j:held``. SQLite alone: the pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    untimed = photon.JsonAdapter(foreign_id="click", primary_id="query", primary_ref="query")
    later = t + 10 * 86_400_000
    for retention in (None, DAY):
        p = pipeline(cluster, adapter=untimed, retention=retention, now=lambda: t / 1000)
        if retention is None:
            p.log_foreign(cluster, [{"click": "c", "query": "q"}])
            joiner = _joiner_on(p)
            joiner._scanner.serve_row(p.foreign, photon.row_key(b"c"))
            assert p.state(Snapshot(cluster), b"c") is photon.State.WAITING
            p.log_primary(cluster, [{"query": "q"}])
            joiner._scanner.serve_row(p.foreign, photon.row_key(b"c"))
        assert p.apply_retention(later) == 0, retention
        with Snapshot(cluster) as snap:
            assert p.state(snap, b"c") is photon.State.JOINED
            assert snap.get(p.primary, photon.row_key(b"q"), "ev:raw") is not None
    assert set(outputs(p)) == {b"c"}
    assert p.verify().ok


def test_retention_removes_every_old_event_in_batches(sqlite_cluster: Cluster) -> None:
    """400 clicks two days old: retention at a one-day boundary removes all 400, in a
    few transactions of many rows (not one per row), and then none is left. SQLite
    alone: the pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, retention=DAY, now=lambda: t / 1000)
    old = t - 2 * 86_400_000
    assert p.log_foreign(cluster, [{"click": f"c{i:03d}", "query": "q", "t": old}
                                   for i in range(400)]).written == 400
    begun = _transactions_begun()
    assert p.apply_retention(t) == 400
    assert _transactions_begun() - begun <= 6  # the boundary, then a batch per 200 rows
    with Snapshot(cluster) as snap:
        assert list(snap.scan(p.foreign, None, None, ["ev:raw", "ev:t"])) == []
    assert p.apply_retention(t) == 0


def test_retention_removes_the_placeholders_of_primaries_that_never_came(
    cluster: Cluster,
) -> None:
    """Two days ago, clicks waited for queries that never came (each left a
    placeholder row, which has no event time) and one for a query that came; today a
    click waits. Retention at today's boundary leaves only today's click, its
    placeholder and its deadline: every table the pipeline writes is bounded."""
    day = 86_400_000
    t = now_ms()
    clock = [t - 2 * day]
    p = pipeline(cluster, retention=DAY, now=lambda: clock[0] / 1000)
    old = [{"click": f"c{i}", "query": f"never{i}", "t": clock[0]} for i in range(4)]
    with Worker(cluster, p.observers(), threads=1):
        p.log_foreign(cluster, [*old, {"click": "d", "query": "comes", "t": clock[0]}])
        wait_for_observers(cluster, 60)
        assert len(list(Snapshot(cluster).scan(p.primary, None, None, ["ev:raw"]))) == 5
        p.log_primary(cluster, [{"query": "comes", "t": clock[0]}])
        wait_for_observers(cluster, 60)
        clock[0] = t
        p.log_foreign(cluster, [{"click": "e", "query": "later", "t": t}])
        wait_for_observers(cluster, 60)
    assert set(outputs(p)) == {b"d"}
    assert p.apply_retention(t) == 10  # 5 clicks, 4 placeholders, 1 query
    with Snapshot(cluster) as snap:
        assert [r for r, _ in snap.scan(p.foreign, None, None, ["ev:raw"])] == [
            photon.row_key(b"e")]
        assert [r for r, _ in snap.scan(p.primary, None, None, ["ev:raw", "j:held"])] == [
            photon.row_key(b"later")]
        assert len(list(snap.scan(p.deadlines, None, None, ["d:x"]))) == 1
        assert list(snap.scan(p.joined_table, None, None, ["ev:joined"])) == []
    assert p.state(Snapshot(cluster), b"e") is photon.State.WAITING
    assert p.verify().ok


def test_a_primary_arriving_during_retention_outlives_its_old_placeholder(
    cluster: Cluster,
) -> None:
    """The retention pass finds two placeholders past the boundary (of clicks c and d,
    waiting for q and r); before it deletes them, q arrives, with a time at the
    boundary itself (not older than it: admitted). The pass must look again in its
    own transaction and keep q (the scan's verdict was about the placeholder), and
    still delete r's placeholder, which follows q's in the same batch."""
    day = 86_400_000
    t = now_ms()
    clock = [t - 2 * day]
    p = pipeline(cluster, retention=DAY, now=lambda: clock[0] / 1000)
    p.log_foreign(cluster, [{"click": "c", "query": "q", "t": clock[0]},
                            {"click": "d", "query": "r", "t": clock[0]}])
    joiner = _joiner_on(p)
    for click in (b"c", b"d"):
        joiner._scanner.serve_row(p.foreign, photon.row_key(click))
    assert photon.row_key(b"q") < photon.row_key(b"r")  # 27/q, 9d/r: q's first
    clock[0] = t
    with Interleaving(cluster) as world:
        retention = world.actor("retention", lambda: p.apply_retention(t))
        retention.run_until(lambda s: s.matches("scan", table=p.primary))
        retention.run_until(lambda s: s.op == "timestamp")  # the deletion's start
        assert p.log_primary(cluster, [{"query": "q", "t": t - day}]).written == 1
        assert retention.finish() == 3  # the clicks and r's placeholder
    with Snapshot(cluster) as snap:
        assert snap.get_row(p.primary, photon.row_key(b"q"), ["ev:raw", "ev:t"]) != {}
        assert snap.get_row(p.primary, photon.row_key(b"r"), ["ev:raw", "j:held"]) == {}
        assert p.state(snap, b"c") is None


def test_retention_keeps_a_placeholder_until_its_last_waiters_deadline(
    sqlite_cluster: Cluster,
) -> None:
    """Two clicks wait for one query: one two days old (its deadline long past), one
    of today (its deadline ahead). Retention at today's boundary deletes the old click
    but must keep the placeholder and its waiter list, which ages by its waiters'
    latest deadline: the query ingested afterwards wakes today's click, which joins.

    Catches the placeholder that keeps the earliest deadline of its waiters (``>``
    for ``<`` in ``_hold_primary``): retention deletes it with its waiter list once
    the first waiter's deadline passes, the query wakes nobody, and today's click
    ends unjoinable. The pipeline's logic, not the store's: SQLite alone plays it."""
    cluster = sqlite_cluster
    day = 86_400_000
    t = now_ms()
    clock = [t - 2 * day]
    p = pipeline(cluster, retention=DAY, now=lambda: clock[0] / 1000)
    joiner = _joiner_on(p)
    p.log_foreign(cluster, [{"click": "old", "query": "q", "t": clock[0]}])
    assert joiner._scanner.serve_row(p.foreign, photon.row_key(b"old"))
    clock[0] = t
    p.log_foreign(cluster, [{"click": "new", "query": "q", "t": t}])
    assert joiner._scanner.serve_row(p.foreign, photon.row_key(b"new"))
    with Snapshot(cluster) as snap:
        assert {p.state(snap, c) for c in (b"old", b"new")} == {photon.State.WAITING}
    assert p.apply_retention(t) == 1  # the old click
    with Snapshot(cluster) as snap:
        waiters = snap.get(p.primary, photon.row_key(b"q"), "j:waiters") or b""
        assert photon.row_key(b"new") in waiters.split(b"\n")
    assert p.log_primary(cluster, [{"query": "q", "t": t}]).written == 1
    assert joiner._scanner.serve_row(p.foreign, photon.row_key(b"new"))
    with Snapshot(cluster) as snap:
        assert p.state(snap, b"new") is photon.State.JOINED
    assert set(outputs(p)) == {b"new"}
    assert p.verify().ok


@pytest.mark.parametrize("joiner_first", [True, False], ids=["joiner-first", "retention-first"])
def test_retention_racing_a_join_of_the_same_event_leaves_no_output(
    cluster: Cluster, joiner_first: bool
) -> None:
    """The retention pass deletes an old event while the joiner joins it (both read
    before either commits): they conflict on the output cell, and whichever order
    they finish in, the event and its output are gone and nothing was committed twice."""
    day = 86_400_000
    now = now_ms()
    p = pipeline(cluster, retention=DAY)
    qs, cs = generate(random.Random(13), 1, 1, orphans=0, t=now - 2 * day)
    p.log_primary(cluster, qs)
    p.log_foreign(cluster, cs)
    worker = Worker(cluster, p.observers(), threads=1)
    worker.register()
    with Interleaving(cluster) as world:
        joiner = world.actor("joiner",
                             lambda: worker._scanner.serve_row(p.foreign, photon.row_key(b"c0")))
        retention = world.actor("retention", lambda: p.apply_retention(now))
        joiner.run_until(lambda s: s.matches("read_rows", table=p.primary))
        joiner.step()
        retention.run_until(lambda s: s.matches("read_rows", table=p.foreign))
        retention.step()  # the retention pass has read the event: undecided
        for actor in (joiner, retention) if joiner_first else (retention, joiner):
            actor.finish()
    with worker:
        wait_for_observers(cluster, 60)
    assert outputs(p) == {}
    assert p.state(Snapshot(cluster), b"c0") is None
    report = p.verify()
    assert report.ok and report.duplicates == [], report


def test_a_replay_after_downtime_joins_nothing_new(cluster: Cluster) -> None:
    qs, cs = generate(random.Random(10), 40, 30)
    p = pipeline(cluster)
    with Worker(cluster, p.observers(), threads=2):
        p.log_primary(cluster, qs)
        p.log_foreign(cluster, cs)
        wait_for_observers(cluster, 60)
        before = outputs(p)
        replay = [p.log_primary(cluster, qs), p.log_foreign(cluster, cs)]
        wait_for_observers(cluster, 60)
    assert [r.written for r in replay] == [0, 0]
    assert [r.duplicates for r in replay] == [len(qs), len(cs)]
    assert outputs(p) == before == reference(qs, cs)
    assert p.verify().ok


def test_bad_input_is_reported_not_written(tmp_path: Path) -> None:
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        p = photon.JoinPipeline(cluster, "clicks", ADAPTER, unjoinable_after=60)
        with pytest.raises(percolator.InvalidArgument, match="create"):
            p.log_foreign(cluster, [{"click": "c", "query": "q", "t": 1}])
        p.create()
        result = p.log_foreign(cluster, [
            {"click": "c1", "query": "q", "t": now_ms()},
            b"{not json", {"query": "q", "t": 1}, {"click": "c2", "query": "q", "t": "noon"},
            {"click": "c3", "query": "q", "t": now_ms() + 3_600_000}, 42])
        assert result.written == 1
        assert [i for i, _ in result.rejected] == [1, 2, 3, 4, 5]
        assert "click" in result.rejected[1][1] and "future" in result.rejected[3][1]
        with pytest.raises(percolator.InvalidArgument, match="iterable"):
            p.log_primary(cluster, b'{"query": "q"}')
        for bad in ({"name": "no spaces"}, {"unjoinable_after": 0}, {"adapter": object()}):
            args: dict[str, Any] = {"name": "ok", "adapter": ADAPTER, "unjoinable_after": 1}
            args.update(bad)
            with pytest.raises(percolator.InvalidArgument):
                photon.JoinPipeline(cluster, args.pop("name"), args.pop("adapter"), **args)


def test_an_ingest_stores_a_mapping_as_compact_sorted_json_and_says_why_it_rejects(
    sqlite_cluster: Cluster,
) -> None:
    """A mapping is stored as its JSON with sorted keys and no spaces, whatever its
    keys' order (so that a join's output does not depend on how a producer built
    it); a str as its bytes. A single event where an iterable of them belongs, an
    event of another type and one from more than five minutes ahead are refused,
    each with what was wrong (five minutes exactly is in time). SQLite alone: the
    pipeline's logic."""
    cluster = sqlite_cluster
    t = now_ms()
    p = pipeline(cluster, now=lambda: t / 1000)
    for single in (b'{"click": "c"}', '{"click": "c"}', {"click": "c"}):
        with pytest.raises(percolator.InvalidArgument, match="^" + re.escape(
                "events must be an iterable of events, not a single event") + "$"):
            p.log_foreign(cluster, single)  # type: ignore[arg-type]
    result = p.log_foreign(cluster, [
        {"t": t, "query": "q", "click": "m"}, f'{{"click": "s", "query": "q", "t": {t}}}', 42,
        {"click": "f", "query": "q", "t": t + 300_001},
        {"click": "e", "query": "q", "t": t + 300_000}])  # five minutes ahead: in time
    assert result.written == 3
    assert result.rejected == [
        (2, "an event must be bytes, str or a JSON mapping, got int"),
        (3, f"event time {t + 300_001} is more than 300s in the future (check the "
            "producer's clock)")]
    with Snapshot(cluster) as snap:
        assert snap.get(p.foreign, photon.row_key(b"m"), "ev:raw") == (
            b'{"click":"m","query":"q","t":%d}' % t)
        assert snap.get(p.foreign, photon.row_key(b"s"), "ev:raw") == (
            b'{"click": "s", "query": "q", "t": %d}' % t)


class _Piped:
    """An adapter of events ``<id>|<ref>`` without a time, whose id ``str`` it gives
    as a str (an adapter's bug the ingest must catch)."""

    def foreign_id(self, event: bytes) -> bytes:
        fid = event.split(b"|")[0]
        return fid.decode() if fid == b"str" else fid  # type: ignore[return-value]

    primary_id = foreign_id

    def primary_ref(self, foreign: bytes) -> bytes:
        return foreign.split(b"|")[1]

    def event_time(self, event: bytes) -> int | None:
        return None

    def join(self, primary: bytes, foreign: bytes) -> bytes | None:
        return primary + foreign


def test_an_ingest_refuses_an_empty_or_non_bytes_id_and_photons_reserved_prefix(
    sqlite_cluster: Cluster,
) -> None:
    """Events whose adapter gives an empty id or a str, and one that begins with the
    prefix photon keeps for its own ``ev:raw`` values (a placeholder, a log
    reference), are refused, each saying why; the good one is written. SQLite alone:
    the pipeline's logic."""
    cluster = sqlite_cluster
    p = pipeline(cluster, adapter=_Piped())
    result = p.log_foreign(cluster, [b"ok|q", b"|q", b"str|q", b"\x00photon:x|q"])
    assert result.written == 1
    assert result.rejected == [
        (1, "the adapter gave an empty or non-bytes id b''"),
        (2, "the adapter gave an empty or non-bytes id 'str'"),
        (3, "the event begins with photon's reserved b'\\x00photon:'")]


def test_durations_are_seconds_or_timedeltas_and_the_old_names_warn(tmp_path: Path) -> None:
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        p = photon.JoinPipeline(cluster, "clicks", ADAPTER, unjoinable_after=timedelta(minutes=2),
                                retention=DAY, sweep_interval=timedelta(milliseconds=250))
        assert (p.unjoinable_after, p.retention, p.sweep_interval) == (120.0, 86_400.0, 0.25)
        p.create()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # what create() stored opens without the old names
            opened = photon.JoinPipeline.open(cluster, "clicks")
        assert (opened.unjoinable_after, opened.retention) == (120.0, 86_400.0)
        assert opened._now_ms() == pytest.approx(now_ms(), abs=60_000)
        with pytest.warns(DeprecationWarning, match="retention=timedelta"):
            old = photon.JoinPipeline(cluster, "clicks", ADAPTER, unjoinable_after=1,
                                      retention_days=2)
        assert old.retention == 2 * 86_400.0
        with pytest.warns(DeprecationWarning, match="returning seconds"):
            old = photon.JoinPipeline.open(cluster, "clicks", clock=lambda: 1_700_000_000_003)
        assert old._now_ms() == 1_700_000_000_003  # the old clock's milliseconds, exactly
        for bad, message in (
                ({"retention": DAY, "retention_days": 1}, "not also its old form"),
                ({"now": time.time, "clock": now_ms}, "not also its old form clock"),
                ({"retention": -1}, "retention must be a positive number of seconds"),
                ({"retention": timedelta(0)}, "retention must be a positive"),
                ({"sweep_interval": "1"}, "sweep_interval must be a positive"),
                ({"unjoinable_after": True}, "unjoinable_after must be a positive"),
                ({"unjoinable_after": float("inf")}, "unjoinable_after must be a positive"),
                ({"unjoinable_after": float("nan")}, "unjoinable_after must be a positive"),
                ({"now": 5}, "now must be a callable"),
                ({"retention_seconds": 5}, r"unknown option\(s\) \['retention_seconds'\]")):
            args: dict[str, Any] = {"unjoinable_after": 1, **bad}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                with pytest.raises(percolator.InvalidArgument, match=message):
                    photon.JoinPipeline(cluster, "clicks", ADAPTER, **args)


def test_the_old_option_names_warn_at_the_callers_line_saying_what_to_pass(
    tmp_path: Path,
) -> None:
    """The deprecation warnings of ``retention_days`` and ``clock`` point at the
    caller's line, where the old name is to be changed, not into photon, and say what
    to pass instead; None for either keeps the default; a bad value of either, both
    forms at once, or an unknown option is refused saying so."""
    warned = {
        "retention_days": "JoinPipeline(retention_days=N) is deprecated: pass "
                          "retention=timedelta(days=N) (or seconds)",
        "clock": "JoinPipeline(clock=...) (milliseconds) is deprecated: pass now=... "
                 "returning seconds, as time.time"}

    def exactly(message: str) -> str:
        return "^" + re.escape(message) + "$"

    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        for name, value in (("retention_days", 2), ("clock", now_ms),
                            ("retention_days", None), ("clock", None)):
            with pytest.warns(DeprecationWarning) as caught:
                p = photon.JoinPipeline(cluster, "clicks", ADAPTER, unjoinable_after=1,
                                        **{name: value})
            # Under mutmut every function is called through its trampoline, frames of
            # mutmut's own between this line and photon: the warning points into mutmut
            # there, so the file is checked on the plain code (`scripts/mutation --try`).
            where = __file__ if "MUTANT_UNDER_TEST" not in os.environ else caught[0].filename
            assert [(w.filename, str(w.message)) for w in caught] == [
                (where, warned[name])], name
            if value is None:
                assert p.retention is None and p._now_ms() == pytest.approx(now_ms(), abs=60_000)
        bad: list[tuple[dict[str, Any], str]] = [
            ({"retention_days": 0}, "retention_days must be positive or None, got 0"),
            ({"retention_days": True}, "retention_days must be positive or None, got True"),
            ({"retention_days": "2"}, "retention_days must be positive or None, got '2'"),
            ({"clock": 5}, "clock must be a callable returning ms, got 5"),
            ({"retention_days": 1, "retention": DAY},
             "pass retention (seconds or a timedelta), not also its old form retention_days"),
            ({"clock": now_ms, "now": time.time},
             "pass now (seconds), not also its old form clock"),
            ({"zeta": 1, "alpha": 2}, "JoinPipeline got unknown option(s) ['alpha', 'zeta']")]
        for options, message in bad:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                with pytest.raises(percolator.InvalidArgument, match=exactly(message)):
                    photon.JoinPipeline(cluster, "clicks", ADAPTER, unjoinable_after=1,
                                        **options)


def test_a_pipeline_sweeps_every_second_by_default_and_refuses_what_is_not_one(
    sqlite_cluster: Cluster,
) -> None:
    """The default sweep interval is a second; a cluster that is not one and an adapter
    that does not implement ``photon.Adapter`` are refused, saying which."""
    p = photon.JoinPipeline(sqlite_cluster, "clicks", ADAPTER, unjoinable_after=1)
    assert (p.name, p.sweep_interval) == ("clicks", 1.0)
    with pytest.raises(percolator.InvalidArgument,
                       match=r"^JoinPipeline needs a percolator\.Cluster, got 'x'$"):
        photon.JoinPipeline("x", "clicks", ADAPTER, unjoinable_after=1)  # type: ignore[arg-type]
    with pytest.raises(percolator.InvalidArgument,
                       match=r"^adapter must implement photon\.Adapter, got 42$"):
        photon.JoinPipeline(sqlite_cluster, "clicks", 42, unjoinable_after=1)  # type: ignore[arg-type]


# --- processes: the CLI, and kill -9 ------------------------------------------------------


def _cli(*args: str) -> int:
    return photon_main(list(args))


def test_the_cli_creates_ingests_reports_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/repo.db"
    qs, cs = generate(random.Random(11), 10, 10)
    for name, events in (("q.jsonl", qs), ("c.jsonl", cs)):
        (tmp_path / name).write_text("".join(json.dumps(e) + "\n" for e in events))
    base = ["--cluster", url, "--name", "clicks"]
    assert _cli("create", *base, "--foreign-id", "click", "--primary-id", "query",
                "--primary-ref", "query", "--time", "t", "--unjoinable-after", "600") == 0
    assert _cli("ingest", *base, "--kind", "primary", str(tmp_path / "q.jsonl")) == 0
    assert _cli("ingest", *base, "--kind", "foreign", str(tmp_path / "c.jsonl")) == 0
    assert "10 written" in capsys.readouterr().out
    with percolator.connect(url) as cluster:
        p = photon.JoinPipeline.open(cluster, "clicks")
        with Worker(cluster, p.observers(), threads=1):
            wait_for_observers(cluster, 60)
        assert outputs(p) == reference(qs, cs)
    assert _cli("status", *base) == 0
    assert f"joined: {len(reference(qs, cs))}" in capsys.readouterr().out
    assert _cli("verify", *base) == 0
    with percolator.connect(url) as cluster, Transaction(cluster) as txn:
        # an output without its registration
        txn.set("photon.clicks.joined", photon.row_key(b"forged"), "ev:joined", b"x")
    with percolator.connect(url) as cluster:
        report = photon.JoinPipeline.open(cluster, "clicks").verify()
    assert isinstance(report, VerifyReport) and not report and not report.ok
    assert report.orphans == [b"forged"]
    assert report.problems == ["output and state disagree: 1\n  b'forged'"]
    assert _cli("verify", *base) == 1
    out = capsys.readouterr().out  # every kind with its count, 0 too, as before
    assert ("duplicate output: 0\noutput and state disagree: 1\n  b'forged'\n"
            "never to be processed: 0\nVIOLATIONS FOUND\n") in out
    assert _cli("status", "--cluster", url, "--name", "nope") == 2
    assert "create() it first" in capsys.readouterr().err


def _spawn(url: str, *args: str) -> subprocess.Popen[bytes]:
    return spawn_module("observers.photon", *args, "--cluster", url, "--name", "clicks")


@pytest.mark.parametrize("backend", SQLITE_AND_BIGTABLE)
def test_workers_and_ingesters_killed_with_sigkill_join_everything_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = make_store_url(backend, request, tmp_path)
    rng = random.Random(12)
    qs, cs = generate(rng, 150, 100)
    with percolator.connect(url) as cluster:
        p = pipeline(cluster)
    feeds = []
    for i in range(2):  # two ingesters, each with every event, in its own order
        events = [("primary", q) for q in qs] + [("foreign", c) for c in cs]
        random.Random(i).shuffle(events)
        for kind in ("primary", "foreign"):
            path = tmp_path / f"{kind}{i}.jsonl"
            path.write_text("".join(json.dumps(e) + "\n" for k, e in events if k == kind))
            feeds.append((kind, path))
    workers = [_spawn(url, "run", "--threads", "2") for _ in range(2)]
    ingesters = [_spawn(url, "ingest", "--kind", kind, str(path)) for kind, path in feeds]
    kills = 0
    try:
        end = time.monotonic() + 6
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.3, 0.8))
            group = rng.choice([workers, ingesters])
            i = rng.randrange(len(group))
            group[i].send_signal(signal.SIGKILL)
            group[i].wait()
            kills += 1
            if group is workers:
                workers[i] = _spawn(url, "run", "--threads", "2")
            else:  # the feed starts over: everything it sent is a duplicate now
                kind, path = feeds[i]
                ingesters[i] = _spawn(url, "ingest", "--kind", kind, str(path))
        for proc in ingesters:
            assert proc.wait(300) in (0, 1)
        with percolator.connect(url) as cluster:
            p = photon.JoinPipeline.open(cluster, "clicks")
            for kind, path in feeds:  # a feed killed last delivers in full once more
                with open(path, "rb") as f:
                    events = list(_pipeline.iter_jsonl(f))
                (p.log_primary if kind == "primary" else p.log_foreign)(cluster, events)
            wait_for_observers(cluster, 300)
            assert outputs(p) == reference(qs, cs)
            report = p.verify()
            assert report.ok and report.in_flight == 0, report
    finally:
        for proc in workers + ingesters:
            proc.kill()
            proc.wait()
    assert kills >= 5
