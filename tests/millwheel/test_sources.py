"""MillWheel's sources that never end: ``LogSource`` (growing files, Ubiq's file
following) and ``TableSource`` (another table's committed changes). Their position
commits with what the injector injects: every record is injected once, a restarted
injector (a process killed with SIGKILL) goes on from its last commit and never reads
from the start again."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import percolator
from observers import Worker, wait_for_observers
from observers import millwheel as mw
from percolator import Cluster, Snapshot, Transaction
from tests._backends import SQLITE_AND_BIGTABLE, backend_fixture
from tests._concurrency import spawn_module
from tests.millwheel import _app

# On the embedded store and Bigtable: the recipe's code is the same on every store
# (the note in tests/millwheel/test_millwheel.py).
backend = backend_fixture(SQLITE_AND_BIGTABLE)


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _inject_all(pipeline: mw.Pipeline) -> int:
    n = 0
    while (got := pipeline.inject("values")):
        n += got
    return n


def _drain(pipeline: mw.Pipeline) -> None:
    """Run the key runs until nothing is pending (the source never ends: no
    watermark reaches the end of time)."""
    with Worker(pipeline.cluster, pipeline.observers(), threads=1):
        wait_for_observers(pipeline.cluster, 120)


def test_a_log_source_injects_complete_records_once_as_files_grow(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Two files grow, one with a half-written last line; a third appears; one is
    truncated (refused: logged, never read again). Each complete line is injected once,
    a half line only once its newline is there; event-time watermark from the lines."""
    logs = tmp_path / "logs"
    logs.mkdir()
    source = mw.LogSource(logs, "*.log", timestamp=lambda r: int(r.data[1:]),
                          disorder_ms=10)
    pipeline = _app.build_relay(cluster, [], False, inject_batch=3, source=source)
    pipeline.create()
    _append(logs / "a.log", b"v00001\nv00002\nv0000")
    _append(logs / "b.log", b"v00010\n")
    _append(logs / "ignored.txt", b"v00099\n")
    assert _inject_all(pipeline) == 3
    _append(logs / "a.log", b"3\nv00004\n")
    _append(logs / "c.log", b"v00020\nv00021\n")
    assert _inject_all(pipeline) == 4
    with Snapshot(cluster) as snap:
        assert pipeline.watermarks(snap, "Relay")[0] == 0  # not advanced yet
        mark = int(snap.get(pipeline.meta, b"inj/values", "w:low") or b"0")
    assert mark == 21 - 10  # the largest timestamp read less the disorder
    (logs / "b.log").write_bytes(b"")  # truncated: refused
    _append(logs / "c.log", b"v00022\n")
    assert _inject_all(pipeline) == 1
    _append(logs / "b.log", b"v00011\nv00012\n")  # past the old offset: still refused
    assert _inject_all(pipeline) == 0
    _drain(pipeline)
    expected = [b"v00001", b"v00002", b"v00003", b"v00004", b"v00010", b"v00020",
                b"v00021", b"v00022"]
    assert _app.tallies(pipeline) == dict.fromkeys(expected, 1)
    assert pipeline.verify().problems == []


def test_a_table_source_reads_each_committed_change_once(cluster: Cluster) -> None:
    """Cells are committed into a user table between the reads of a pass (two
    changes per read): a commit behind the pass's cursor and one ahead of it, and an
    overwrite of a cell already read. Every change reaches the Tally once; a cell
    changed twice between two passes gives its newest value once."""
    cluster.create_table("clicks")
    source = mw.TableSource(cluster, "clicks", ["c:v"])
    pipeline = _app.build_relay(cluster, [], False, inject_batch=2, source=source)
    pipeline.create()

    def put(*cells: tuple[bytes, bytes]) -> None:
        with Transaction(cluster) as txn:
            for row, value in cells:
                txn.set("clicks", row, "c:v", value)

    put((b"r1", b"v00001"), (b"r2", b"v00002"), (b"r3", b"v00003"), (b"r4", b"v00004"),
        (b"r5", b"v00005"))
    assert pipeline.inject("values") == 2  # r1, r2: the pass's cursor is at r2
    put((b"r0", b"v00010"), (b"r6", b"v00011"), (b"r1", b"v00012"))  # behind, ahead, again
    while pipeline.inject("values"):
        pass
    put((b"r3", b"v00013"))
    put((b"r3", b"v00014"))  # two changes of one cell before the next pass
    while pipeline.inject("values"):
        pass
    _drain(pipeline)
    expected = [b"v%05d" % i for i in (1, 2, 3, 4, 5, 10, 11, 12, 14)]
    assert _app.tallies(pipeline) == dict.fromkeys(expected, 1)


def _spawn(url: str, logs: Path) -> subprocess.Popen[bytes]:
    return spawn_module("observers.millwheel", "run", "--cluster", url, "--pipeline",
                        "tests.millwheel._app:make_log_relay", "--threads", "2",
                        env={"MW_LOG_DIR": str(logs), "MW_BATCH": "7"})


def test_a_log_source_process_killed_with_sigkill_resumes_where_it_committed(
    tmp_path: Path,
) -> None:
    """The test appends 900 lines, across three files rotated one after another,
    while the one process that injects them (and runs the key runs) is killed with
    SIGKILL whenever it has injected more since the last kill, eight times, and
    restarted. Every line reaches the Tally once: a restarted injector reading again
    from the start, or from anywhere before its last commit, doubles lines."""
    url = f"sqlite:///{tmp_path}/repo.db"
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [b"v%05d" % i for i in range(900)]
    with percolator.connect(url) as cluster:
        pipeline = _app.build_relay(cluster, [], False, source=mw.LogSource(logs))
        pipeline.create()

        def injected() -> int:
            return _app.log_bytes_injected(pipeline) // 7

        proc = _spawn(url, logs)
        kills, written = 0, 0
        try:
            while written < len(lines) or kills < 8:
                chunk = lines[written:written + 60]
                name = logs / f"{written // 300:03d}.log"  # a new file every 300 lines
                _append(name, b"".join(line + b"\n" for line in chunk))
                written += len(chunk)
                seen = injected()
                deadline = time.monotonic() + 120
                while injected() == seen and seen < written:
                    assert time.monotonic() < deadline, "the injector made no progress"
                    time.sleep(0.02)
                if kills < 8:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    kills += 1
                    proc = _spawn(url, logs)
            deadline = time.monotonic() + 300
            while injected() < len(lines):
                assert time.monotonic() < deadline, injected()
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait()
        _drain(pipeline)
        assert _app.tallies(pipeline) == dict.fromkeys(lines, 1)
        assert pipeline.verify().problems == []
