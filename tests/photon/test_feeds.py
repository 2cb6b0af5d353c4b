"""Photon's feeds (``photon.LogFeed``, ``photon.TableFeed``): events pulled from growing
log files or another table's committed changes, the feed's position committed with the
events it ingests. A feed whose step dies at any point of its commit, or whose process
is killed with SIGKILL, goes on from its last commit: never a duplicate read (the
feed's ``dup`` counter stays 0) and every event ingested."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import percolator
from observers import Worker, photon, wait_for_observers
from observers.photon import _feeds
from percolator import Cluster, Transaction
from percolator.testing import CrashPoint, client_of, crash_commit
from tests._backends import SQLITE_AND_BIGTABLE, backend_fixture
from tests._concurrency import spawn_module
from tests.photon.test_photon import generate, outputs, pipeline, reference

# On the embedded store and Bigtable: the recipe's code is the same on every store
# (the note in tests/photon/test_photon.py).
backend = backend_fixture(SQLITE_AND_BIGTABLE)


def _line(event: dict[str, object]) -> bytes:
    return json.dumps(event, sort_keys=True, separators=(",", ":")).encode()


def test_a_table_feed_step_dying_in_its_commit_ingests_all_or_nothing(cluster: Cluster) -> None:
    """Queries are committed into a table of their own, some between the feed's
    steps (three events a step); four steps in a row die, each at a point of its
    commit (before, at and after the commit point). Every query is ingested once: a
    step's events and position landed together or not at all, and the next step
    starts where the last one that landed ended. (One feed for the four points: a
    pipeline per point made and dropped its tables four times on HBase.)"""
    qs, cs = generate(random.Random(3), 12, 30)
    p = pipeline(cluster)
    cluster.create_table("queries")
    feed = photon.TableFeed(p, "queries", cluster, "queries", ["q:raw"], foreign=False,
                            batch=3)

    def put(events: list[dict[str, object]]) -> None:
        with Transaction(cluster) as txn:
            for q in events:
                txn.set("queries", str(q["query"]).encode(), "q:raw", _line(q))

    put(qs[:8])
    assert feed.step() == 3
    put(qs[8:])
    landed = 0
    for point in (CrashPoint("prewrite", 0), CrashPoint("prewrite", 2),
                  CrashPoint("commit_point"), CrashPoint("commit", 1)):
        dying = client_of(cluster)
        dying.one_phase_commit = False
        txn = Transaction(dying)
        read = _feeds._step(txn, feed)
        assert read > 0
        committed = crash_commit(txn, point)
        assert committed == (point.phase != "prewrite")
        landed += read if committed else 0
    assert feed.status().written == 3 + landed  # the steps that reached their commit point
    while feed.step():
        pass
    p.log_foreign(cluster, cs)
    with Worker(cluster, p.observers(), threads=1):
        wait_for_observers(cluster, 120)
    assert outputs(p) == reference(qs, cs)
    status = feed.status()
    assert (status.written, status.dup, status.rejected) == (len(qs), 0, 0)


def _spawn(url: str, logs: Path) -> subprocess.Popen[bytes]:
    return spawn_module("tests.photon._feed_proc", url, str(logs))


def test_a_log_feed_process_killed_with_sigkill_resumes_where_it_committed(
    tmp_path: Path,
) -> None:
    """The test appends 400 clicks, across two files, while the one process that
    feeds and joins them is killed with SIGKILL whenever its feed has committed more
    since the last kill, eight times, and restarted. Every click is joined once, and
    the feed never read a click twice (its ``dup`` counter is 0): a restarted feed
    reading from the start, or from before its last commit, counts duplicates."""
    url = f"sqlite:///{tmp_path}/repo.db"
    logs = tmp_path / "logs"
    logs.mkdir()
    qs, cs = generate(random.Random(5), 60, 400)
    with percolator.connect(url) as cluster:
        p = pipeline(cluster)
        p.log_primary(cluster, qs)
        feed = photon.LogFeed(p, "clicks", logs, "*.jsonl", foreign=True)
        proc = _spawn(url, logs)
        kills, written = 0, 0
        try:
            while written < len(cs) or kills < 8:
                chunk = cs[written:written + 25]
                with open(logs / f"{written // 200}.jsonl", "ab") as f:
                    f.write(b"".join(_line(c) + b"\n" for c in chunk))
                written += len(chunk)
                seen = feed.status().written
                deadline = time.monotonic() + 120
                while feed.status().written == seen and seen < written:
                    assert time.monotonic() < deadline, "the feed made no progress"
                    time.sleep(0.02)
                if kills < 8:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    kills += 1
                    proc = _spawn(url, logs)
            deadline = time.monotonic() + 300
            while feed.status().written < len(cs):
                assert time.monotonic() < deadline, feed.status()
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait()
        with Worker(cluster, p.observers(), threads=1):
            wait_for_observers(cluster, 300)
        assert outputs(p) == reference(qs, cs)
        status = feed.status()
        assert (status.written, status.dup, status.rejected) == (len(cs), 0, 0)
