"""The services the xdist workers of one run share (``tests/_services.py``): started
once for all the workers, and stopped when the run ends, also when its controller is
killed with -9. Real pytest runs in subprocesses, with a ``sleep`` process standing
for HBase."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._services import _alive

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from tests.conftest import pytest_configure, pytest_unconfigure  # noqa: F401
"""

TESTS = """
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests._services import service_missing, shared_service

STARTS = Path(os.environ["OUT"]) / "starts"


def _start():
    with STARTS.open("a") as f:
        f.write("start\\n")
    if os.environ.get("BROKEN"):
        service_missing("the sleeper is broken")
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    return {"pids": [proc.pid]}


@pytest.mark.parametrize("n", range(4))
def test_uses_the_service(n):
    info = shared_service("sleeper", _start)
    out = Path(os.environ["OUT"]) / f"{n}"
    out.write_text(f"{info['pids'][0]} {os.getpid()}")
    (Path(os.environ["OUT"]) / "folder").write_text(os.environ["PERCOLATOR_TEST_SHARED"])
    park = Path(os.environ["OUT"]) / "park"
    while park.exists():  # the test of a killed controller holds the workers here
        time.sleep(0.05)
"""


@pytest.fixture
def inner(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A directory with the inner run's tests, and its environment; every process
    the inner run leaves (it should leave none) is killed at the end."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(TESTS)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "PERCOLATOR_TEST_"))}
    env["OUT"] = str(out)
    yield tmp_path, env
    for result in out.glob("[0-9]*"):
        for pid in map(int, result.read_text().split()):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _pytest(folder: Path, env: dict[str, str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
            "--rootdir", str(folder), "-c", os.devnull, str(folder)]


def _service_pids(out: Path) -> set[int]:
    return {int(r.read_text().split()[0]) for r in out.glob("[0-9]*")}


def test_the_workers_share_one_service_stopped_at_the_end(
    inner: tuple[Path, dict[str, str]],
) -> None:
    folder, env = inner
    out = Path(env["OUT"])
    run = subprocess.run(_pytest(folder, env), env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (out / "starts").read_text() == "start\n"
    (pid,) = _service_pids(out)  # the four tests on two workers found the same one
    assert not _alive(pid)
    assert not Path((out / "folder").read_text()).exists()


def test_a_service_that_cannot_start_is_tried_once(inner: tuple[Path, dict[str, str]]) -> None:
    folder, env = inner
    run = subprocess.run(_pytest(folder, env), env={**env, "BROKEN": "1", "CI": ""},
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 skipped" in run.stdout
    assert (Path(env["OUT"]) / "starts").read_text() == "start\n"


def test_a_killed_controller_leaves_no_service_behind(
    inner: tuple[Path, dict[str, str]],
) -> None:
    folder, env = inner
    out = Path(env["OUT"])
    (out / "park").touch()
    controller = subprocess.Popen(_pytest(folder, env), env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while len(list(out.glob("[0-9]*"))) < 2:  # both workers hold a test, parked
            assert controller.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        (pid,) = _service_pids(out)
        assert _alive(pid)
        controller.kill()
        controller.wait()
        folder = Path((out / "folder").read_text())
        deadline = time.monotonic() + 30
        while (_alive(pid) or folder.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the service outlived the killed controller"
        assert not folder.exists(), "the killed controller's shared folder is left"
    finally:
        (out / "park").unlink()
        if controller.poll() is None:
            controller.kill()
            controller.wait()
