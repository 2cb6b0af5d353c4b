"""Real oracle server processes and load workers for the oracle tests."""

from __future__ import annotations

import bisect
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from oracle import OracleClient
from percolator import TlsConfig
from percolator._errors import OracleUnavailable
from tests._services import free_port
from tests._zookeeper import DIE_WITH_PARENT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class OracleProcess:
    """``python -m oracle ...`` in a child process, logging to *log_path*; *tls* is what
    its own status client uses to reach it (None: plaintext)."""

    def __init__(
        self, args: list[str], log_path: str, port: int, tls: TlsConfig | None = None
    ) -> None:
        self.args = args
        self.tls = tls
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*DIE_WITH_PARENT, sys.executable, "-m", "oracle", "--listen", self.address, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def status_client(self, deadline: float = 2.0) -> OracleClient:
        scheme = "grpc" if self.tls is None else "grpcs"
        return OracleClient(f"{scheme}://{self.address}", deadline=deadline, tls=self.tls)

    def wait_serving(self, timeout: float = 30.0, leader: bool = True) -> None:
        """Wait until it answers Status (with ``leader`` as given)."""
        end = time.monotonic() + timeout
        with self.status_client(1.0) as c:
            while time.monotonic() < end:
                assert self.process.poll() is None, f"oracle exited:\n{self.log()}"
                try:
                    if c.status().leader == leader:
                        return
                except OracleUnavailable:
                    pass
                time.sleep(0.05)
        raise AssertionError(f"oracle at {self.address} not serving:\n{self.log()}")

    def is_leader(self) -> bool:
        try:
            with self.status_client(1.0) as c:
                return c.status().leader
        except OracleUnavailable:
            return False

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]


@dataclass
class Oracles:
    """Starts oracle processes and load workers; kills all of them at teardown."""

    tmp: str
    procs: list[OracleProcess] = field(default_factory=list)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(
        self, *args: str, port: int | None = None, tls: TlsConfig | None = None
    ) -> OracleProcess:
        port = port or free_port()
        log = os.path.join(self.tmp, f"oracle-{len(self.procs)}.log")
        p = OracleProcess(list(args), log, port, tls)
        self.procs.append(p)
        return p

    def worker(
        self,
        target: str,
        out: str,
        *,
        threads: int,
        count: int = 0,
        stop: str = "",
        extra: tuple[str, ...] = (),
    ) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "tests.oracle._load_worker", target, out]
        cmd += ["--threads", str(threads), "--count", str(count), "--stop", stop, *extra]
        w = subprocess.Popen([*DIE_WITH_PARENT, *cmd], cwd=ROOT, stdin=subprocess.DEVNULL)
        self.workers.append(w)
        return w

    def cleanup(self) -> None:
        for w in self.workers:
            if w.poll() is None:
                w.kill()
            w.wait()
        for p in self.procs:
            p.kill()


@pytest.fixture
def oracles(tmp_path: object) -> Iterator[Oracles]:
    o = Oracles(str(tmp_path))
    try:
        yield o
    finally:
        o.cleanup()


Call = tuple[int, int, int, int]  # (caller, invoke_ns, return_ns, timestamp)


def read_history(paths: list[str]) -> list[Call]:
    """Calls recorded by workers; fails on any error a worker recorded."""
    calls: list[Call] = []
    for proc, path in enumerate(paths):
        with open(path) as f:
            for line in f:
                assert not line.startswith("ERROR"), f"{path}: {line.strip()}"
                thread, t0, t1, ts = map(int, line.split())
                calls.append((proc * 1000 + thread, t0, t1, ts))
    return calls


def check_history(calls: list[Call]) -> None:
    """All timestamps distinct, increasing per caller, and linearizable in real time.

    Linearizable: a call that began after another call returned ``t`` (in any thread or
    process) got a timestamp larger than ``t``.
    """
    assert calls, "no timestamps drawn"
    stamps = [c[3] for c in calls]
    assert len(set(stamps)) == len(stamps), "a timestamp was issued twice"
    by_caller: dict[int, list[Call]] = {}
    for c in calls:
        by_caller.setdefault(c[0], []).append(c)
    for caller, cs in by_caller.items():
        cs.sort(key=lambda c: c[1])
        for a, b in itertools.pairwise(cs):
            assert b[3] > a[3], f"caller {caller}: {b[3]} after {a[3]}"
    by_return = sorted(calls, key=lambda c: c[2])
    returns = [c[2] for c in by_return]
    prefix_max: list[int] = []
    m = -1
    for c in by_return:
        m = max(m, c[3])
        prefix_max.append(m)
    for c in calls:
        k = bisect.bisect_left(returns, c[1])  # calls that returned before c began
        if k:
            assert c[3] > prefix_max[k - 1], (
                f"timestamp {c[3]} handed out after {prefix_max[k - 1]} had been returned"
            )
