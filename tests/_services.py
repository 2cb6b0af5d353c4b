"""How the suite treats real services it needs (ZooKeeper, cbtemulator, Spark, ...).

A service the suite cannot find fails the run in CI (``CI=true``) and skips the
test elsewhere, always with a reason that says what to install.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]

def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def service_missing(reason: str) -> NoReturn:
    """Fail in CI, skip elsewhere, quoting *reason* (what is missing and how to get it)."""
    if in_ci():
        pytest.fail(f"required service missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Kill *proc* (a service the suite started) and reap it."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - kill -9 does not hang
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- services shared by the xdist workers of one run ---------------------------------
#
# Under pytest-xdist every worker is a process of its own, and a session fixture runs
# once per worker. A service that is costly to start (HBase: two JVMs, ~30 s of CPU)
# is started once per run instead: the first worker that needs it starts it under a
# file lock and publishes how to reach it in ``<shared dir>/<name>.json``; the others
# read that file. Its processes are not tied to that worker (which may finish its
# tests and exit while others still use the service) but to the controller: the
# controller stops them at the end of the run (:func:`stop_shared_services`), and a
# watchdog process kills them if the controller dies without doing so (kill -9).

SHARED_ENV = "PERCOLATOR_TEST_SHARED"
"""The directory of the shared services' files, set by the controller for its workers."""
CONTROLLER_ENV = "PERCOLATOR_TEST_CONTROLLER"
"""The controller's pid, for the watchdog of the shared services."""


def xdist_worker() -> bool:
    """Whether this process is an xdist worker of a run that shares its services."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and bool(os.environ.get(SHARED_ENV))


def shared_service(
    name: str, start: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """The description of shared service *name* (see above), started by *start* if no
    worker has started it yet. *start* returns a JSON-able dict whose ``"pids"`` are
    the service's processes (each leading a process group of its own, killed with it)
    and ``"dirs"`` the directories to remove when it stops; it calls
    :func:`service_missing` when the service cannot start, and the other workers then
    fail or skip with the same reason at once instead of trying again."""
    import fcntl

    folder = Path(os.environ[SHARED_ENV])
    published = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        if published.exists():
            info: dict[str, Any] = json.loads(published.read_text())
        else:
            try:
                info = start()
            except (pytest.skip.Exception, pytest.fail.Exception) as e:
                info = {"error": str(e.msg)}
            else:
                _watch(info)
            partial = published.with_suffix(".tmp")
            partial.write_text(json.dumps(info))
            partial.replace(published)
    if "error" in info:
        service_missing(info["error"].removeprefix("required service missing in CI: "))
    return info


def _watch(info: dict[str, Any]) -> None:
    """Start the watchdog that stops the service of *info* when the controller dies."""
    subprocess.Popen(
        [sys.executable, "-m", "tests._services", os.environ[CONTROLLER_ENV],
         json.dumps(info), os.environ[SHARED_ENV]],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )


def stop_shared(info: dict[str, Any]) -> None:
    """Kill the processes of a shared service (their process groups) and remove its
    directories."""
    for pid in info.get("pids", ()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for pid in info.get("pids", ()):
        _wait_gone(pid)
    for folder in info.get("dirs", ()):
        shutil.rmtree(folder, ignore_errors=True)


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            # A child of this process (not under xdist) is reaped; another's is not ours.
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        if not _alive(pid):
            return
        time.sleep(0.05)


def stop_shared_services(folder: Path) -> None:
    """The controller's end of the run: stop every service published in *folder*."""
    for published in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            stop_shared(json.loads(published.read_text()))
    shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether *pid* runs (a zombie, killed but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _watchdog(controller: int, info: dict[str, Any], folder: Path) -> None:
    """Wait until the controller or the service is gone, then stop the service (if it
    still runs), and remove the shared services' *folder* if the controller is gone."""
    pids = info.get("pids", ())
    while _alive(controller) and any(_alive(pid) for pid in pids):
        time.sleep(0.5)
    stop_shared(info)
    if not _alive(controller):
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    _watchdog(int(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3]))
