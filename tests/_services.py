"""How the suite treats real services it needs (ZooKeeper, cbtemulator, Spark, ...).

A service the suite cannot find fails the run in CI (``CI=true``) and skips the
test elsewhere, always with a reason that says what to install.
"""

from __future__ import annotations

import os
import socket
import subprocess
from typing import NoReturn

import pytest


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
