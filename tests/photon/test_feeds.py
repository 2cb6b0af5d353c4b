"""Photon's feeds (``photon.LogFeed``, ``photon.TableFeed``): events pulled from growing
log files or another table's committed changes, the feed's position committed with the
events it ingests. A feed whose step dies at any point of its commit, or whose process
is killed with SIGKILL, goes on from its last commit: never a duplicate read (the
feed's ``dup`` counter stays 0) and every event ingested."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import Worker, photon, wait_for_observers
from observers._changes import TableChanges
from observers.photon import _feeds
from percolator import Cluster, InvalidArgument, Snapshot, Transaction
from percolator.testing import CrashPoint, client_of, crash_commit
from tests._backends import SQLITE_AND_BIGTABLE, backend_fixture
from tests._concurrency import spawn_module
from tests.photon.test_photon import generate, outputs, pipeline, reference

# On the embedded store and Bigtable: the recipe's code is the same on every store
# (the note in tests/photon/test_photon.py).
backend = backend_fixture(SQLITE_AND_BIGTABLE)


def _line(event: dict[str, object]) -> bytes:
    return json.dumps(event, sort_keys=True, separators=(",", ":")).encode()


def _append(path: Path, events: list[dict[str, Any]]) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(_line(e) + b"\n" for e in events))


def _put(cluster: Cluster, events: list[dict[str, Any]], table: str = "queries") -> None:
    with Transaction(cluster) as txn:
        for q in events:
            txn.set(table, str(q["query"]).encode(), "q:raw", _line(q))


def _primaries(p: photon.JoinPipeline) -> dict[bytes, bytes]:
    """What each primary's ``ev:raw`` holds, by primary id."""
    with Snapshot(p.cluster) as snap:
        return {row[3:]: cells["ev:raw"]
                for row, cells in snap.scan(p.primary, None, None, ["ev:raw"])}


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


def test_a_feed_refuses_bad_arguments_saying_what_it_takes(
    sqlite_cluster: Cluster, tmp_path: Path
) -> None:
    p = pipeline(sqlite_cluster)
    index_message = ("an index LogFeed feeds primary events (foreign=False) that are its "
                     "lines as they are (no event=)")
    refused: list[tuple[dict[str, Any], str]] = [
        ({"pipeline": "clicks"}, "a feed needs a photon.JoinPipeline, got 'clicks'"),
        ({"name": "a/b"}, "feed name must be letters, digits, '_', '-' or '.', got 'a/b'"),
        ({"name": ""}, "feed name must be letters, digits, '_', '-' or '.', got ''"),
        ({"name": 5}, "feed name must be letters, digits, '_', '-' or '.', got 5"),
        ({"foreign": "yes"}, "foreign must be True (foreign events) or False (primary "
                             "events), got 'yes'"),
        ({"event": 5}, "event must be a callable, got 5"),
        ({"batch": 0}, "batch must be an int >= 1, got 0"),
        ({"batch": 2.0}, "batch must be an int >= 1, got 2.0"),
        ({"index": "yes"}, "index must be True or False, got 'yes'"),
        ({"index": True}, index_message),  # foreign=True
        ({"index": True, "foreign": False, "event": _feeds._line}, index_message),
    ]
    for change, message in refused:
        arguments: dict[str, Any] = {"pipeline": p, "name": "clicks", "directory": tmp_path,
                                     "foreign": True, **change}
        with pytest.raises(InvalidArgument) as refusal:
            photon.LogFeed(**arguments)
        assert str(refusal.value) == message, change
    # Every character a name may hold, and the smallest batch, are taken.
    assert photon.LogFeed(p, "Az09_-.", tmp_path, foreign=True, batch=1).batch == 1


def test_a_step_with_nothing_new_commits_nothing_and_one_that_ends_a_pass_commits_it(
    sqlite_cluster: Cluster,
) -> None:
    """A table feed's steps, three changes at most each. A step that finds nothing
    new commits nothing (no new version of ``c:pos``), the very first one too. A step
    that finds no change but ends a pass over the table commits the position after
    it: without it, the feed stays inside the pass that ended (whose upper bound is
    below every later commit) and never reads another change. The status's position
    is the committed one, where the next step reads from."""
    cluster = sqlite_cluster
    p = pipeline(cluster)
    cluster.create_table("queries")
    feed = photon.TableFeed(p, "queries", cluster, "queries", ["q:raw"], foreign=False,
                            batch=3)
    positions = TableChanges(cluster, p.meta, ["c:pos"])
    qs, _ = generate(random.Random(7), 5, 0)
    assert feed.step() == 0
    assert positions.read({}, 10)[0] == []  # nothing read: no position committed
    _put(cluster, qs[:3])
    assert feed.step() == 3
    assert feed.step() == 0  # the pass's end: its position is committed
    committed, mark = positions.read({}, 10)
    assert len(committed) == 1
    assert feed.step() == 0
    assert positions.read(mark, 10)[0] == []  # an idle step commits nothing
    assert feed.reader.read(feed.status().position, 10) == ([], feed.status().position)
    _put(cluster, qs[3:])
    assert feed.step() == 2
    assert _primaries(p) == {str(q["query"]).encode(): _line(q) for q in qs}


def test_an_index_feed_commits_its_directory_once(sqlite_cluster: Cluster,
                                                  tmp_path: Path) -> None:
    """The directory (``c:dir``) is written by the index feed's first step that
    ingests, and not again while it stays the same: later steps commit their
    position and counters only."""
    cluster = sqlite_cluster
    p = pipeline(cluster)
    qs, _ = generate(random.Random(8), 6, 0)
    _append(tmp_path / "0.jsonl", qs[:4])
    feed = photon.LogFeed(p, "queries", tmp_path, foreign=False, index=True, batch=2)
    directories = TableChanges(cluster, p.meta, ["c:dir"])
    assert feed.step() == 2
    found, mark = directories.read({}, 10)
    assert [c.value for c in found] == [str(tmp_path.resolve()).encode()]
    assert feed.step() == 2
    _append(tmp_path / "0.jsonl", qs[4:])
    assert feed.step() == 2
    assert directories.read(mark, 10)[0] == []
    assert feed.status().written == len(qs)


def test_an_index_feed_reads_its_primaries_from_its_own_directory(
    sqlite_cluster: Cluster, tmp_path: Path
) -> None:
    """A process reads the queries' log where its own index feed says it is, not
    where the feed's ``c:dir`` says another process found it (the logs mounted
    elsewhere): the process that indexed them sees them in ``a``, this one in ``b``
    only, and joins every click (fed as foreign events from a log) from there."""
    cluster = sqlite_cluster
    qs, cs = generate(random.Random(9), 8, 8, orphans=0)
    (tmp_path / "a").mkdir()
    _append(tmp_path / "a" / "0.jsonl", qs)
    p = pipeline(cluster)
    assert photon.LogFeed(p, "queries", tmp_path / "a", foreign=False, index=True).step() == 8
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "a")
    here = photon.JoinPipeline.open(cluster, "clicks")
    photon.LogFeed(here, "queries", tmp_path / "b", foreign=False, index=True)
    (tmp_path / "clicks").mkdir()
    _append(tmp_path / "clicks" / "0.jsonl", cs)
    assert photon.LogFeed(here, "clicks", tmp_path / "clicks", foreign=True).step() == 8
    with Worker(cluster, here.observers(), threads=1, max_failures=2, retry_delay=0.01):
        wait_for_observers(cluster, 60)
    # None was in this process's cache: each query read once, from b.
    assert here.events.misses == len({c["query"] for c in cs})
    assert outputs(here) == reference(qs, cs)


def test_a_log_feed_by_default_reads_jsonl_files_500_lines_a_step_and_keeps_the_lines(
    sqlite_cluster: Cluster, tmp_path: Path
) -> None:
    """A LogFeed's defaults: files ``*.jsonl`` (another file is not read), at most 500
    lines a step, every half second as a task, and the lines themselves in the
    primaries' ``ev:raw`` (not log references, no ``c:dir``: not an index feed). The
    task is the feed's step under the pipeline's and feed's name, shared by every
    worker of the cluster."""
    cluster = sqlite_cluster
    p = pipeline(cluster)
    qs, _ = generate(random.Random(10), 501, 0)
    _append(tmp_path / "0.jsonl", qs)
    _append(tmp_path / "other.log", [{"query": "elsewhere", "t": qs[0]["t"]}])
    feed = photon.LogFeed(p, "queries", tmp_path, foreign=False)
    task = feed.task()
    assert (task.name, task.interval) == ("photon.clicks.feed.queries", 0.5)
    assert task.run_once()
    assert feed.status().written == 500
    assert feed.step() == 1
    assert _primaries(p) == {str(q["query"]).encode(): _line(q) for q in qs}
    assert TableChanges(cluster, p.meta, ["c:dir"]).read({}, 10)[0] == []


def test_a_table_feed_by_default_reads_500_changes_a_step_of_its_columns_only(
    sqlite_cluster: Cluster,
) -> None:
    """A TableFeed's defaults: at most 500 changes a step, every half second as a
    task; and only the columns it is given: a second column of the same rows is not
    fed (its values are no events: they would be refused)."""
    cluster = sqlite_cluster
    p = pipeline(cluster)
    cluster.create_table("queries")
    qs, _ = generate(random.Random(11), 501, 0)
    _put(cluster, qs)
    with Transaction(cluster) as txn:
        for q in qs[:5]:
            txn.set("queries", str(q["query"]).encode(), "q:note", b"not an event")
    feed = photon.TableFeed(p, "queries", cluster, "queries", ["q:raw"], foreign=False)
    assert feed.task().interval == 0.5
    assert feed.step() == 500
    assert feed.step() == 1
    assert feed.step() == 0
    status = feed.status()
    assert (status.written, status.rejected) == (len(qs), 0)
