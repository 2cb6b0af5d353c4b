"""Photon's primaries kept in their logs (``photon.LogFeed(..., index=True)``): a
primary's row holds where its line sits, and the joiner reads it back through the
pipeline's EventStore (a cache, then the log). Every test compares the output with
the in-memory reference join: a joiner given the reference instead of the event, a
process that cannot find the log's directory, a log rewritten under the index, a
feed killed with SIGKILL and retention each would break it."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import Worker, photon, wait_for_observers
from observers.photon._events import LOGGED
from percolator import Cluster, Snapshot
from percolator._notifications import quarantined
from tests._backends import SQLITE_AND_BIGTABLE, backend_fixture, make_store_url
from tests._concurrency import spawn_module
from tests.photon.test_photon import generate, now_ms, outputs, pipeline, reference

# On the embedded store and Bigtable: the recipe's code is the same on every store
# (the note in tests/photon/test_photon.py).
backend = backend_fixture(SQLITE_AND_BIGTABLE)


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, sort_keys=True, separators=(",", ":")).encode()


def _append(path: Path, events: list[dict[str, Any]]) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(_line(e) + b"\n" for e in events))


def _stored(p: photon.JoinPipeline) -> dict[bytes, bytes]:
    with Snapshot(p.cluster) as snap:
        return {row[3:]: cells["ev:raw"]
                for row, cells in snap.scan(p.primary, None, None, ["ev:raw"])}


def test_an_index_feed_keeps_where_each_primary_sits_and_joins_its_bytes(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Queries come from a log through an index feed: their rows hold references, far
    shorter than the queries. Half the clicks are joined by this process (the feed
    filled its cache: every lookup a hit), the rest by a pipeline opened afresh, which
    finds the log's directory in the feed's committed row and reads every query from
    the log. The output is the reference join throughout."""
    qs, cs = generate(random.Random(21), 40, 60)
    qs = [{**q, "text": "x" * 200} for q in qs]
    _append(tmp_path / "0.jsonl", qs[:25])
    _append(tmp_path / "1.jsonl", qs[25:])
    p = pipeline(cluster)
    feed = photon.LogFeed(p, "queries", tmp_path, "*.jsonl", foreign=False, index=True,
                          batch=10)
    while feed.step():
        pass
    stored = _stored(p)
    assert len(stored) == len(qs) and all(
        v.startswith(LOGGED) and len(v) < 60 for v in stored.values())
    p.log_foreign(cluster, cs[:30])
    with Worker(cluster, p.observers(), threads=2):
        wait_for_observers(cluster, 120)
    assert p.events.misses == 0 and p.events.hits > 0
    cold = photon.JoinPipeline.open(cluster, "clicks")
    cold.log_foreign(cluster, cs[30:])
    with Worker(cluster, cold.observers(), threads=2, max_failures=2, retry_delay=0.01):
        wait_for_observers(cluster, 120)
    assert cold.events.misses > 0 and cold.events.directories == {"queries": tmp_path}
    assert outputs(p) == reference(qs, cs)
    assert p.verify().ok and not list(quarantined(cluster, p.foreign))
    assert feed.status().written == len(qs)


@pytest.mark.parametrize("harm", ["rewritten", "removed"])
def test_a_log_changed_under_its_index_fails_the_join_rather_than_join_other_bytes(
    sqlite_cluster: Cluster, tmp_path: Path, harm: str
) -> None:
    """Queries indexed, then their log rewritten (same length, other bytes) or removed
    while a click still needs one. A process without the events in its cache cannot
    read the query: the click is quarantined with the reason, never joined with what
    the file holds now; verify lists it."""
    cluster = sqlite_cluster
    t = now_ms()
    qs = [{"query": "q1", "t": t, "text": "abc"}, {"query": "q2", "t": t, "text": "def"}]
    log = tmp_path / "0.jsonl"
    _append(log, qs)
    p = pipeline(cluster)
    feed = photon.LogFeed(p, "queries", tmp_path, "*.jsonl", foreign=False, index=True)
    assert feed.step() == 2
    if harm == "rewritten":
        log.write_bytes(log.read_bytes().replace(b"def", b"xyz"))
    else:
        log.unlink()
    cold = photon.JoinPipeline.open(cluster, "clicks")
    cold.log_foreign(cluster, [{"click": "c2", "query": "q2", "t": t}])
    with Worker(cluster, cold.observers(), threads=1, max_failures=2, retry_delay=0.01):
        wait_for_observers(cluster, 60)
    assert outputs(p) == {}
    assert [q.row for q in quarantined(cluster, p.foreign)] == [photon.row_key(b"c2")]
    assert "0.jsonl" in quarantined(cluster, p.foreign)[0].error
    report = p.verify()
    assert report.quarantined == [b"c2"] and report.ok


def test_retention_forgets_indexed_primaries_and_then_their_log_can_go(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Yesterday's queries were indexed from day0.jsonl and their clicks joined.
    Today retention removes their rows; the log is then deleted (rotated away) and
    today's queries come in day1.jsonl. The feed goes on with the new file, today's
    clicks join from it, a late click of yesterday is refused, not left waiting for a
    query whose row and log are gone, and the primary table holds today's queries
    only."""
    day = 86_400_000
    t = now_ms()
    clock = [t - day - 60_000]
    p = pipeline(cluster, retention_days=1, clock=lambda: clock[0])
    old_q, old_c = generate(random.Random(31), 10, 10, orphans=0, t=clock[0])
    new_q, new_c = generate(random.Random(32), 10, 10, orphans=0, t=t)
    new_q = [{**q, "query": "n" + q["query"]} for q in new_q]
    new_c = [{**c, "click": "n" + c["click"], "query": "n" + c["query"]} for c in new_c]
    _append(tmp_path / "day0.jsonl", old_q)
    feed = photon.LogFeed(p, "queries", tmp_path, "*.jsonl", foreign=False, index=True)
    with Worker(cluster, p.observers(), threads=1):
        feed.step()
        p.log_foreign(cluster, old_c)
        wait_for_observers(cluster, 60)
        assert len(outputs(p)) == 10
        clock[0] = t
        assert p.apply_retention() == 20  # yesterday's 10 queries and 10 clicks
        (tmp_path / "day0.jsonl").unlink()
        _append(tmp_path / "day1.jsonl", new_q)
        assert feed.step() == 10
        late = p.log_foreign(cluster, old_c[:1])
        assert (late.too_late, late.written) == (1, 0)
        p.log_foreign(cluster, new_c)
        wait_for_observers(cluster, 60)
    assert outputs(p) == reference(new_q, new_c)
    assert set(_stored(p)) == {str(q["query"]).encode() for q in new_q}
    assert p.verify().ok and not list(quarantined(cluster, p.foreign))


def _spawn(url: str, clicks: Path, queries: Path) -> subprocess.Popen[bytes]:
    return spawn_module("tests.photon._feed_proc", url, str(clicks), str(queries))


@pytest.mark.parametrize("backend", SQLITE_AND_BIGTABLE)
def test_a_process_joining_from_the_index_killed_with_sigkill_joins_everything_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """One process feeds queries (index feed) and clicks from their logs and joins;
    the test appends both, clicks often before their queries, and kills the process
    with SIGKILL after each commit of either feed, eight times. A pipeline opened
    afresh (empty cache: every query read from the log) finishes. Every click is
    joined once with its query's bytes, neither feed read an event twice, and every
    primary row is a reference (or the placeholder of a query that never came)."""
    url = make_store_url(backend, request, tmp_path)
    logs, qlogs = tmp_path / "clicks", tmp_path / "queries"
    logs.mkdir()
    qlogs.mkdir()
    rng = random.Random(41)
    qs, cs = generate(rng, 80, 240)
    with percolator.connect(url) as cluster:
        p = pipeline(cluster)
        clicks = photon.LogFeed(p, "clicks", logs, "*.jsonl", foreign=True)
        queries = photon.LogFeed(p, "queries", qlogs, "*.jsonl", foreign=False, index=True)

        def committed() -> int:
            return clicks.status().written + queries.status().written

        proc = _spawn(url, logs, qlogs)
        kills, q_at, c_at = 0, 0, 0
        try:
            while c_at < len(cs) or q_at < len(qs) or kills < 8:
                c_next, q_next = cs[c_at:c_at + 30], qs[q_at:q_at + 10]
                _append(logs / f"{c_at // 120}.jsonl", c_next)  # clicks lead their queries
                _append(qlogs / f"{q_at // 40}.jsonl", q_next)
                c_at, q_at = c_at + len(c_next), q_at + len(q_next)
                seen = committed()
                deadline = time.monotonic() + 120
                while committed() == seen and seen < c_at + q_at:
                    assert time.monotonic() < deadline, "the feeds made no progress"
                    time.sleep(0.02)
                if kills < 8:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    kills += 1
                    proc = _spawn(url, logs, qlogs)
            deadline = time.monotonic() + 300
            while committed() < len(cs) + len(qs):
                assert time.monotonic() < deadline, (clicks.status(), queries.status())
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait()
        cold = photon.JoinPipeline.open(cluster, "clicks")
        with Worker(cluster, cold.observers(), threads=2, max_failures=2, retry_delay=0.01):
            wait_for_observers(cluster, 300)
        assert outputs(p) == reference(qs, cs)
        report = p.verify()
        assert report.ok and not report.quarantined and report.in_flight == 0, report
        for feed, n in ((clicks, len(cs)), (queries, len(qs))):
            status = feed.status()
            assert (status.written, status.dup, status.rejected) == (n, 0, 0)
        assert all(v.startswith(LOGGED) for v in _stored(p).values() if v != photon.PLACEHOLDER)
