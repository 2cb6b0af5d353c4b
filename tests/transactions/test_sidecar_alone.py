"""A process alone on the timestamp sidecar that draws often keeps its ``flock`` between
draws (no system call a section), and lets a newcomer in: at the end of its next section when it is
busy, from the releaser thread when it is idle, and at its death when it forked a
child that lives on (:class:`percolator._timestamps._SidecarLock`)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from percolator._presence import Presence
from percolator._timestamps import _RELEASER, HostTimestamps, _Releaser
from percolator.stores.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parents[2]

_DRAW_ONCE = """
import sys
from percolator._timestamps import HostTimestamps
from percolator.stores.sqlite import SqliteStore
store = SqliteStore(sys.argv[1])
print(HostTimestamps(store, sys.argv[1] + "-ts").get_timestamp(), flush=True)
"""

_HOLD_FORK_AND_WAIT = """
import os, sys, time
from percolator._timestamps import HostTimestamps, _Releaser
from percolator.stores.sqlite import SqliteStore
_Releaser.TICK = 3600.0  # this process never lets go while it lives
HostTimestamps.HOT = 1  # and keeps the lock from its first draw
store = SqliteStore(sys.argv[1])
source = HostTimestamps(store, sys.argv[1] + "-ts")
first = source.get_timestamp()
assert source._holding, "alone on the sidecar, the flock is kept"
parent_alive, parent_gone = os.pipe()
child = os.fork()
if child == 0:
    os.close(parent_gone)
    os.read(parent_alive, 1)  # b"" once the parent is dead
    print(first, source.get_timestamp(), flush=True)
    os._exit(0)
print("forked", child, flush=True)
time.sleep(3600)
"""


@pytest.fixture(autouse=True)
def hot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock is kept from the first section (not from the rate that pays for it)."""
    monkeypatch.setattr(HostTimestamps, "HOT", 1)


@pytest.fixture
def slow_releaser(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The releaser lets go of nothing while the test runs (wakes it at the end, so
    that it does not sleep out the patched tick)."""
    monkeypatch.setattr(_Releaser, "TICK", 3600.0)
    yield
    monkeypatch.undo()
    with _RELEASER._wake:
        _RELEASER._wake.notify()


def _draw_in_another_process(path: str, timeout: float = 60) -> int:
    done = subprocess.run([sys.executable, "-c", _DRAW_ONCE, path], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=True)
    return int(done.stdout)


def _flock_taken(path: str) -> bool:
    """Whether some open file holds the sidecar's flock (tried from a new one)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the flock if this descriptor got it
    return False


def test_a_process_alone_keeps_the_flock_between_draws(
    tmp_path: Path, slow_releaser: None,
) -> None:
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    try:
        first = source.get_timestamp()
        assert _flock_taken(source.path)  # kept after the draw returned
        assert source.get_timestamps(3)[0] > first
        source.close()
        assert not _flock_taken(source.path)  # closing lets go
    finally:
        source.close()
        store.close()


def test_a_process_that_draws_rarely_does_not_keep_the_flock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_releaser: None,
) -> None:
    """Below the rate at which keeping it pays for the releaser's looks (``HOT``
    sections within a tick), every section unlocks, as every process did before."""
    monkeypatch.setattr(HostTimestamps, "HOT", 10)
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    try:
        source.get_timestamp()  # one or two sections (the first persists a ceiling)
        assert not source._holding and not _flock_taken(source.path)
        for _ in range(10):  # within a tick (an hour, here)
            source.get_timestamp()
        assert source._holding and _flock_taken(source.path)
    finally:
        source.close()
        store.close()


def test_a_newcomer_gets_in_while_the_process_alone_keeps_drawing(
    tmp_path: Path, slow_releaser: None,
) -> None:
    """The releaser is asleep: only the drawing thread's own sections can let go, once
    they see the newcomer's mark."""
    path = str(tmp_path / "db")
    store = SqliteStore(path)
    source = HostTimestamps(store, path + "-ts")
    drawn: list[int] = []
    stop = threading.Event()

    def keep_drawing() -> None:
        while not stop.is_set():
            drawn.append(source.get_timestamp())

    drawn.append(source.get_timestamp())
    assert source._holding
    before = drawn[-1]
    drawer = threading.Thread(target=keep_drawing)
    drawer.start()
    try:
        theirs = _draw_in_another_process(path)
    finally:
        stop.set()
        drawer.join()
        source.close()
        store.close()
    assert theirs > before
    assert theirs not in drawn


def test_an_idle_process_lets_a_newcomer_in_and_keeps_the_flock_again_once_it_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Presence, "RECHECK", 0.0)  # a departure is seen at the next look
    path = str(tmp_path / "db")
    store = SqliteStore(path)
    source = HostTimestamps(store, path + "-ts")
    try:
        first = source.get_timestamp()
        assert source._holding
        theirs = _draw_in_another_process(path)  # nobody draws here meanwhile
        assert theirs > first
        assert not source._holding  # it let go for the newcomer
        ours = source.get_timestamp()  # the newcomer is gone: kept again
        assert ours > theirs
        assert source._holding
    finally:
        source.close()
        store.close()


def test_the_flock_of_a_killed_process_does_not_outlive_it_in_its_forked_child(
    tmp_path: Path,
) -> None:
    """A child inherits the descriptors of its parent's open sidecar, which holds the
    flock: it must close, not keep, them (and not unlock them: the parent's lock),
    or the lock outlives a parent killed while holding it and the child waits for ever."""
    path = str(tmp_path / "db")
    parent = subprocess.Popen([sys.executable, "-c", _HOLD_FORK_AND_WAIT, path], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    out = parent.stdout
    child = 0
    try:
        said, pid = out.readline().split()
        assert said == "forked"
        child = int(pid)
        assert _flock_taken(path + "-ts")
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        lines: list[str] = []
        reading = threading.Thread(target=lambda: lines.append(out.readline()), daemon=True)
        reading.start()
        reading.join(60)
        assert lines, "the forked child still waits for its dead parent's flock"
        first, theirs = map(int, lines[0].split())
        assert theirs > first
    finally:
        parent.kill()
        parent.wait()
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def own_releaser(monkeypatch: pytest.MonkeyPatch) -> _Releaser:
    """A releaser of the test's own in the process's place: its thread starts with the
    test's first kept flock, so the test sees (and mutation testing maps) its whole run."""
    releaser = _Releaser()
    monkeypatch.setattr("percolator._timestamps._RELEASER", releaser)
    return releaser


def test_an_idle_process_alone_lets_go_of_the_flock_and_is_forgotten(
    tmp_path: Path, own_releaser: _Releaser,
) -> None:
    """Nobody else came, and the process draws no more: its releaser thread (a daemon,
    named for what it does) lets go of the flock all the same, a tick or two after the
    last section (a newcomer then finds it free), and stops looking at the source."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    try:
        source.get_timestamp()
        thread = own_releaser._thread
        assert thread is not None, "the flock was kept, and nothing watches it"
        assert (thread.name, thread.daemon) == ("percolator-sidecar-releaser", True)
        deadline = time.monotonic() + 10
        while _flock_taken(source.path) or source in own_releaser._watched:
            assert time.monotonic() < deadline, "an idle source kept its flock, or stays watched"
            time.sleep(0.005)
        assert not source._holding
    finally:
        source.close()
        store.close()


def test_a_look_lets_go_only_of_a_source_that_had_no_section_since_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The releaser's looks, made here one by one (its thread never runs): a source
    that had a section since the count of the last look keeps its flock (letting go
    would cost its next section a flock); one that had none lets go. A look while a
    section runs answers at once, with a count that no section count equals: the
    look after it keeps the flock even if exactly one section ran. So does the first
    look at a source just handed over, whatever its count."""
    releaser = _Releaser()
    releaser._thread = threading.current_thread()  # taken for its thread: none starts
    monkeypatch.setattr("percolator._timestamps._RELEASER", releaser)
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    try:
        source.get_timestamp()
        assert source._holding
        handed_over = releaser._watched[source]
        with source._lock:
            source._sections = 0  # any count; 0 puts the next section's at 1
        inside, leave, left = threading.Event(), threading.Event(), threading.Event()

        def section() -> None:
            with source._locked():
                inside.set()
                leave.wait(10)
            left.set()

        running = threading.Thread(target=section)
        running.start()
        try:
            assert inside.wait(10)
            busy = source._let_go_if_idle(0)
            assert not left.is_set(), "a look waited for the section to end"
            assert busy is not None, "a look let go while a section ran"
        finally:
            leave.set()
            running.join(10)
        assert source._sections == 1
        assert source._let_go_if_idle(handed_over) == 1
        assert source._let_go_if_idle(busy) == 1
        assert source._holding and _flock_taken(source.path)
        with source._locked():
            pass
        assert source._let_go_if_idle(1) == 2  # one section since: kept
        assert source._holding and _flock_taken(source.path)
        assert source._let_go_if_idle(2) is None  # none since: let go
        assert not source._holding and not _flock_taken(source.path)
    finally:
        source.close()
        store.close()


def test_a_forked_childs_close_leaves_its_parents_flock_and_the_parents_lets_go(
    tmp_path: Path, slow_releaser: None,
) -> None:
    """A forked child shares the open file, and with it the flock its parent keeps:
    its close must not unlock it (the parent would count with nobody excluded). The
    parent's close must unlock it, not only close its descriptor: a child still
    holding the inherited one would keep the flock while it lives."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    lives_read, lives_write = os.pipe()
    child = 0
    try:
        source.get_timestamp()
        assert source._holding
        child = os.fork()
        if child == 0:
            code = 1
            try:
                source.close()
                code = 0
            finally:
                os._exit(code)
        status = os.waitpid(child, 0)[1]
        child = 0
        assert os.waitstatus_to_exitcode(status) == 0
        assert _flock_taken(source.path), "the child's close unlocked its parent's flock"
        child = os.fork()
        if child == 0:  # keeps the inherited descriptors open until the parent says
            os.close(lives_write)
            os.read(lives_read, 1)
            os._exit(0)
        source.close()
        assert not _flock_taken(source.path), "a child's open descriptor kept the flock"
    finally:
        os.close(lives_write)
        os.close(lives_read)
        if child:
            os.waitpid(child, 0)
        source.close()
        store.close()


def test_the_flock_is_kept_from_the_hot_th_section_within_a_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_releaser: None,
) -> None:
    """The rate that pays for keeping the flock, on a clock of the test's: ``HOT``
    sections within one tick of the first of them (a tick after it still counts), not
    fewer, and not ``HOT`` spread over more than a tick (the count starts again)."""
    monkeypatch.setattr(HostTimestamps, "HOT", 3)
    now = [1000.0]
    monkeypatch.setattr("percolator._timestamps._monotonic", lambda: now[0])
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))

    def section() -> bool:
        with source._locked():
            pass
        return source._holding

    try:
        assert (section(), section()) == (False, False)
        now[0] += _Releaser.TICK + 0.5  # the window of the first two is over
        assert (section(), section()) == (False, False)
        now[0] += _Releaser.TICK  # exactly a tick after the window began: still in it
        assert section()
        assert _flock_taken(source.path)
    finally:
        source.close()
        store.close()


def test_a_process_that_let_a_newcomer_in_takes_the_flock_again_for_each_section(
    tmp_path: Path, slow_releaser: None,
) -> None:
    """Once a section saw the newcomer's mark and let go, the process keeps the flock
    no more: its next section waits while another open file holds it."""
    store = SqliteStore(str(tmp_path / "db"))
    source = HostTimestamps(store, str(tmp_path / "db-ts"))
    newcomer = None
    other = os.open(source.path, os.O_RDWR)
    try:
        source.get_timestamp()
        assert source._holding
        newcomer = HostTimestamps(store, source.path)  # its mark: a newcomer
        with source._locked():
            pass  # sees the mark, lets go
        fcntl.flock(other, fcntl.LOCK_EX)  # another open file counts now
        drawn: list[int] = []
        drawing = threading.Thread(target=lambda: drawn.append(source.get_timestamp()))
        drawing.start()
        drawing.join(0.5)
        assert not drawn, "a section ran while another open file held the flock"
        fcntl.flock(other, fcntl.LOCK_UN)
        drawing.join(10)
        assert drawn
    finally:
        os.close(other)
        if newcomer is not None:
            newcomer.close()
        source.close()
        store.close()
