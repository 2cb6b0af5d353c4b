"""What every benchmark script shares: the machine's description and the writer of
its own section of BENCHMARKS.md (scripts run as ``python bench/NAME.py``)."""

from __future__ import annotations

import contextlib
import json
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests._hbase_local import kill, tail

BENCHMARKS = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def head_commit() -> str:
    """The checkout's commit (short), with ``+dirty`` when it has uncommitted changes."""
    here = Path(__file__).resolve().parent
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=here).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, cwd=here).stdout.strip()
    return head + ("+dirty" if dirty else "")


def write_section(heading: str, text: str, path: Path = BENCHMARKS) -> None:
    """Replace the section that starts with *heading* (a ``## `` line) by *text*, or
    append it; the other sections are left as they are."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    start = old.find(heading)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + len(heading))
        new = old[:start] + text.rstrip("\n") + "\n" + ("" if end < 0 else old[end:])
    path.write_text(new.rstrip("\n") + "\n")


def header(heading: str, command: str, *notes: str) -> list[str]:
    """The first lines of a section: heading, machine, date, command and *notes*."""
    import os
    import time

    return [heading, "",
            f"- machine: {platform.machine()}, {cpu_model()}, {os.cpu_count()} cores, "
            f"CPython {platform.python_version()}",
            f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            f"- command: `{command}`", *(f"- {note}" for note in notes)]


def publish(heading: str, lines: list[str], write: bool) -> None:
    """Print the section, and with *write* put it in BENCHMARKS.md."""
    text = "\n".join(lines)
    print(text)
    if write:
        write_section(heading, text)


def pid_listening_on(port: int) -> int | None:
    """The pid of this user's process listening on TCP *port* (from ``/proc``), or None
    (no such process, or another user's): a benchmark on a server it did not start
    (``scripts/hbase``'s) charges that server's CPU to the operations too."""
    import os

    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rpartition(":")[2], 16) == port:  # LISTEN
                inodes.add(f"socket:[{inode}]")
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
            except OSError:
                continue
    return None


# -- a real HBase for a benchmark -------------------------------------------------------

HBASE_ENV = "PERCOLATOR_HBASE_THRIFT"
HBASE_CONF_ENV = "PERCOLATOR_HBASE_CONF"


class BenchSetupError(RuntimeError):
    """What a benchmark was given to run on is not usable; the message says what to set."""


@dataclass
class HBaseServers:
    """The real HBase of a benchmark: its conf directory (``hbase-site.xml``, for a
    Java client that finds HBase through ZooKeeper; None if not known), its Thrift1
    and Thrift2 servers (``host:port``), the pids of its JVMs that this user can see
    (``hbase``, ``thrift``, ``thrift2``: their CPU is charged to what is measured), and
    a line describing it for the table."""

    conf: Path | None
    thrift1: str
    thrift2: str
    pids: dict[str, int]
    described: str


def hbase_servers_of(hbase: Any) -> HBaseServers:
    """A standalone HBase of the launcher (``tests/_hbase_local.py``'s ``LocalHBase``),
    started in this process or in another one of the test session; its Thrift2 server
    started if it runs none yet."""
    from tests._hbase_local import HEAP, THRIFT_HEAP

    hbase.start_thrift2()
    pids = dict(zip(("hbase", "thrift"), hbase.jvm_pids, strict=True))
    thrift2 = (hbase.thrift2.pid if hbase.thrift2 is not None
               else pid_listening_on(hbase.thrift2_port))
    if thrift2 is not None:
        pids["thrift2"] = thrift2
    return HBaseServers(hbase.dir / "conf", hbase.hostport, hbase.hostport2, pids,
                        f"HBase 2.6.1 standalone started by the benchmark "
                        f"(tests/_hbase_local.py: one JVM, {HEAP}, local FS; Thrift2 and "
                        f"Thrift1 servers {THRIFT_HEAP} each)")


def hbase_servers_from_env(need_conf: bool = False) -> HBaseServers | None:
    """The HBase that ``PERCOLATOR_HBASE_THRIFT`` and ``PERCOLATOR_HBASE_THRIFT2`` name
    (``scripts/hbase`` prints both), with its conf directory from
    ``PERCOLATOR_HBASE_CONF`` (``scripts/hbase --dir DIR``: ``DIR/conf``), which
    *need_conf* requires; None when none of them is set. Its JVMs are found by the
    ports they listen on: the Thrift servers', and the region server's (or
    ZooKeeper's) from ``hbase-site.xml``."""
    import os

    from tests._hbase_local import read_site

    names = (HBASE_CONF_ENV, HBASE_ENV, HBASE_ENV + "2")
    given = {name: os.environ.get(name, "") for name in names}
    if not any(given[name] for name in names[1:]) and not (need_conf and given[names[0]]):
        return None
    missing = [name for name in names[(0 if need_conf else 1):] if not given[name]]
    if missing:
        raise BenchSetupError(
            f"{', '.join(missing)} unset: this benchmark on an HBase of your own needs "
            f"{', '.join(names[(0 if need_conf else 1):])} (its Thrift1 and Thrift2 servers, "
            "as scripts/hbase prints them" + ("; its conf directory, where a Java client "
                                              "finds hbase-site.xml: scripts/hbase --dir DIR "
                                              "keeps it in DIR/conf)" if need_conf else ")"))
    conf = Path(given[HBASE_CONF_ENV]) if given[HBASE_CONF_ENV] else None
    ports = {"thrift": given[HBASE_ENV].rpartition(":")[2],
             "thrift2": given[HBASE_ENV + "2"].rpartition(":")[2]}
    if conf is not None:
        if not (conf / "hbase-site.xml").exists():
            raise BenchSetupError(f"{HBASE_CONF_ENV}={conf} holds no hbase-site.xml "
                                  "(scripts/hbase --dir DIR keeps it in DIR/conf)")
        site = read_site(conf / "hbase-site.xml")
        ports["hbase"] = (site.get("hbase.regionserver.port")
                          or site.get("hbase.zookeeper.property.clientPort") or "")
    pids = {}
    for name, port in ports.items():
        pid = pid_listening_on(int(port)) if port.isdigit() else None
        if pid is not None:
            pids[name] = pid
    return HBaseServers(conf, given[HBASE_ENV], given[HBASE_ENV + "2"], pids,
                        f"the HBase of {HBASE_ENV}={given[HBASE_ENV]} and "
                        f"{HBASE_ENV}2={given[HBASE_ENV + '2']}"
                        + (f" ({HBASE_CONF_ENV}={conf})" if conf else "")
                        + f"; CPU charged to its JVMs: {', '.join(sorted(pids)) or 'none found'}")


# -- child processes ----------------------------------------------------------------------


class ChildFailed(RuntimeError):
    """A benchmark's child process died or answered an error; the message names its log."""


def spawn(command: list[str], cwd: Path, log: Path, **kw: Any) -> subprocess.Popen[bytes]:
    """Start *command* with its stderr appended to *log*; it dies with this process
    (``PR_SET_PDEATHSIG``), so that a benchmark killed leaves nothing running.

    The death signal is set by ``setpriv --pdeathsig KILL`` (util-linux), which then
    execs *command* under the same pid, rather than by a ``preexec_fn``: a
    ``preexec_fn`` makes Python fork the whole process, and a child forked from a
    process with live gRPC channels (our oracle's) ran gRPC's fork handlers and
    aborted before its exec (a client JVM exited with -6, 2026-11-29)."""
    if shutil.which("setpriv"):
        with open(log, "ab") as f:
            return subprocess.Popen(["setpriv", "--pdeathsig", "KILL", *command], cwd=cwd,
                                    stderr=f, **kw)
    from tests._hbase_local import _die_with_parent

    with open(log, "ab") as f:
        return subprocess.Popen(command, cwd=cwd, stderr=f, preexec_fn=_die_with_parent, **kw)


class LineClient:
    """A child process spoken to one line at a time, answering each command with one
    line of JSON (``{"error": ...}`` on failure) after a first ``{"ready": true}`` (the
    Java harness of bench/peers.py, that script's ``--client`` mode, the worker
    processes of bench/observers.py's drains). Started without waiting, so that several
    start at once; :meth:`ready` waits; :meth:`stop` sends ``quit``, then kills."""

    def __init__(self, command: list[str], cwd: Path, log: Path, what: str,
                 env: dict[str, str] | None = None) -> None:
        self.log, self.what = log, what
        self.proc = spawn(command, cwd, log, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env=env)
        self._out: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        self._ready = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self) -> LineClient:
        if not self._ready:
            self.answer()  # {"ready": true}
            self._ready = True
        return self

    def answer(self) -> dict[str, Any]:
        line = self._out.readline()
        if not line:
            raise ChildFailed(f"{self.what} exited ({self.proc.poll()}); see {self.log}:\n"
                              + tail(self.log))
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise ChildFailed(f"{self.what} failed: {answer['error']}; see {self.log}")
        return answer

    def send(self, *words: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((" ".join(map(str, words)) + "\n").encode())
        self.proc.stdin.flush()

    def call(self, *words: object) -> dict[str, Any]:
        self.ready()
        self.send(*words)
        return self.answer()

    def stop(self, wait: float = 10.0) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"quit\n")
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=wait)
        kill(self.proc)


def serve_lines(handle: Callable[[list[str]], dict[str, Any]]) -> None:
    """The child's side of :class:`LineClient`: say ready, then answer each command
    line on stdin with :func:`handle`'s JSON (``{"error": ...}`` when it raises) until
    ``quit`` or the end of stdin. Whatever else the child prints goes to stderr."""
    out = sys.stdout
    sys.stdout = sys.stderr  # stdout is the protocol
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        try:
            answer = handle(words)
        except Exception as e:  # the driver reports it, with the child's log
            answer = {"error": repr(e)}
        print(json.dumps(answer), file=out, flush=True)
