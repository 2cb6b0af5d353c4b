"""A network of Linux network namespaces for the fault suite (issue 21).

:class:`Network` creates, as root, one or more Linux bridges in the host namespace and
one network namespace per node, each joined to its bridges by veth pairs. Addresses
(``10.231.<bridge>.<node>/24``) exist only inside the namespaces: the host namespace
and every other test run see none of them, and every name carries a random suffix so
that parallel runs do not collide. Loopback is up in every namespace.

Faults:

* :meth:`Network.partition` takes a node's host-side veth link(s) down: its packets
  are dropped (no RST, no ICMP), as in a real partition; :meth:`Network.heal` brings
  them up again. There is no netem and no netfilter on the machines this runs on, so
  a partition is always a whole link: a node is cut off from everyone on that bridge.
  A node on two bridges can be cut off from one of them only (an asymmetric split).
* :class:`NodeProcess` runs a command inside a node (``ip netns exec``) in its own
  process group; :meth:`~NodeProcess.pause` / :meth:`~NodeProcess.resume` send
  SIGSTOP / SIGCONT, :meth:`~NodeProcess.kill` SIGKILL, :meth:`~NodeProcess.restart`
  kill -9 and start the same command again.

No orphans, whatever happens: every command runs under ``setpriv --pdeathsig KILL``
(it dies with the process that spawned it), spawned from one long-lived thread of the
network (PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so a
short-lived nemesis thread must not be that parent); :meth:`Network.close` (the
context manager's exit, and an ``atexit`` hook as a last resort) kills every process
group it started and deletes every namespace, veth and bridge it made. A test process
killed with SIGKILL runs neither: each network records what it made in
``/run/percolator-netns/<suffix>.json`` with its creator's pid, and the next
:class:`Network` deletes what a dead creator left.

Code of this process can also run inside a node: :meth:`Node.call` runs a function in
a fresh thread that first joins the node's network namespace (``setns``, which is per
thread); sockets it opens live there. Used for readiness probes; client code under
test runs in subprocesses instead (gRPC's own threads would not follow).

When not root, or ``ip``/``setpriv`` are missing, or namespaces cannot be made,
:func:`require_netns` skips with the reason (fails under ``CI=true``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from percolator._timestamps import process_alive as _alive
from tests._services import service_missing

log = logging.getLogger(__name__)

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
#: The first bridge's subnet; bridge k uses 10.231.k.0/24. Reused by every run: the
#: addresses exist only inside each run's own namespaces, so runs cannot see each other.
BASE_NET = "10.231"

_live: weakref.WeakSet[Network] = weakref.WeakSet()
LEDGER = Path("/run/percolator-netns")
_libc = ctypes.CDLL(None, use_errno=True)
_probed: list[str | None] = []  # the reason found by the one probe, once made


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can). Probed once: a real
    namespace and bridge are made and deleted, since root in a container may still lack
    CAP_NET_ADMIN."""
    if _probed:
        return _probed[0]
    reason: str | None = None
    if os.geteuid() != 0:
        reason = "network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    elif shutil.which("ip") is None:
        reason = "the ip command is missing: apt-get install -y iproute2"
    elif shutil.which("setpriv") is None:
        reason = "setpriv is missing: apt-get install -y util-linux"
    else:
        suffix = uuid.uuid4().hex[:6]
        try:
            _ip("netns", "add", f"pcl-probe-{suffix}")
            _ip("link", "add", f"pbprobe{suffix}", "type", "bridge")
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            reason = f"cannot create a network namespace and a bridge: {e}"
        finally:
            _ip("link", "del", f"pbprobe{suffix}", check=False)
            _ip("netns", "del", f"pcl-probe-{suffix}", check=False)
    _probed.append(reason)
    return reason


def require_netns() -> None:
    """Skip the test (fail in CI) when namespaces cannot be made here."""
    reason = unavailable()
    if reason is not None:
        service_missing(reason)


def run_in_netns(netns: str, fn: Callable[[], T], timeout: float = 60.0) -> T:
    """Run *fn* in a fresh thread that first joins network namespace *netns*; return
    its result (or raise its exception). Threads it starts stay in that namespace."""
    box: Future[T] = Future()

    def run() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({netns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            box.set_result(fn())
        except BaseException as e:
            box.set_exception(e)

    thread = threading.Thread(target=run, name=f"netns-{netns}", daemon=True)
    thread.start()
    return box.result(timeout)


def can_connect(netns: str, host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to host:port succeeds from inside *netns*."""
    def probe() -> bool:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            return False
    return run_in_netns(netns, probe, timeout + 5)


class NodeProcess:
    """A command running inside a node, in its own process group (see module docs)."""

    def __init__(self, node: Node, argv: Sequence[str], *, env: dict[str, str] | None,
                 log_path: Path, cwd: str | None) -> None:
        self.node = node
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.starts = 0

    def start(self) -> NodeProcess:
        """Start (or start again) the command; returns self."""
        if self.running:
            return self
        cmd = ["setpriv", "--pdeathsig", "KILL", "ip", "netns", "exec", self.node.netns,
               *self.argv]

        def spawn() -> subprocess.Popen[bytes]:
            with open(self.log_path, "ab") as out:
                return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                                        start_new_session=True)

        self.process = self.node.network._spawn(spawn)
        self.paused = False
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _signal(self, sig: int) -> None:
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def pause(self) -> None:
        """SIGSTOP the process group (a long GC pause: no thread runs, sockets stay)."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """kill -9 the process group and reap it."""
        p = self.process
        if p is None:
            return
        self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)
        self.paused = False

    def terminate(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (SIGCONT first, a stopped process cannot act on it), then SIGKILL."""
        p = self.process
        if p is None:
            return None
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return p.poll()

    def restart(self) -> None:
        """kill -9, then start the same command again."""
        self.kill()
        self.start()

    def wait(self, timeout: float | None = None) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-lines:])
        except OSError:
            return "(no log)"


class Node:
    """One network namespace of a :class:`Network`, with an address on each bridge."""

    def __init__(self, network: Network, name: str, index: int, netns: str) -> None:
        self.network = network
        self.name = name
        self.index = index
        self.netns = netns
        self.addresses: dict[str, str] = {}  # bridge name -> address
        self.host_links: dict[str, str] = {}  # bridge name -> host-side veth name
        self.processes: list[NodeProcess] = []

    @property
    def ip(self) -> str:
        """The node's address on the first bridge it joined."""
        return next(iter(self.addresses.values()))

    def spawn(self, argv: Sequence[str], *, name: str, env: dict[str, str] | None = None,
              cwd: str | None = None, start: bool = True) -> NodeProcess:
        """Run *argv* inside this node; output goes to ``<workdir>/<node>-<name>.log``."""
        proc = NodeProcess(self, argv, env=env, cwd=cwd,
                           log_path=self.network.workdir / f"{self.name}-{name}.log")
        self.processes.append(proc)
        self.network._processes.append(proc)
        return proc.start() if start else proc

    def call(self, fn: Callable[[], T], timeout: float = 60.0) -> T:
        """Run *fn* inside this node's network namespace (see :func:`run_in_netns`)."""
        return run_in_netns(self.netns, fn, timeout)

    def can_connect(self, host: str, port: int, timeout: float = 1.0) -> bool:
        return can_connect(self.netns, host, port, timeout)

    def __repr__(self) -> str:
        return f"Node({self.name}, {self.addresses})"


class Network:
    """Bridges and namespaces made for one test; see the module docstring.

    ``Network(workdir)`` then :meth:`add_bridge` and :meth:`add_node`; use it as a
    context manager (or call :meth:`close`) so everything is removed.
    """

    def __init__(self, workdir: Path | str) -> None:
        require_netns()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.suffix = uuid.uuid4().hex[:5]
        self.bridges: dict[str, tuple[str, int]] = {}  # name -> (device, subnet index)
        self.nodes: dict[str, Node] = {}
        self._processes: list[NodeProcess] = []
        self._links: list[str] = []  # host-side veths and bridges, deleted at close
        self._netns: list[str] = []
        self._partitioned: set[tuple[str, str]] = set()
        self._closed = False
        # One long-lived thread forks every child (PR_SET_PDEATHSIG follows the thread).
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netns-spawn")
        _live.add(self)
        sweep_dead()
        self._ledger = LEDGER / f"{self.suffix}.json"
        self._record()

    def _record(self) -> None:
        """Write what this network made so far, for :func:`sweep_dead`."""
        LEDGER.mkdir(parents=True, exist_ok=True)
        tmp = self._ledger.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "links": self._links,
                                   "netns": self._netns}))
        tmp.rename(self._ledger)

    def _spawn(self, fn: Callable[[], T]) -> T:
        return self._spawner.submit(fn).result(60)

    def add_bridge(self, name: str) -> str:
        """A bridge for subnet 10.231.<k>.0/24 (k: its order of creation)."""
        device = f"pb{self.suffix}{len(self.bridges)}"
        _ip("link", "add", device, "type", "bridge")
        self._links.append(device)
        self._record()
        _ip("link", "set", device, "up")
        self.bridges[name] = (device, len(self.bridges))
        return device

    def add_node(self, name: str, bridges: Iterable[str] | None = None) -> Node:
        """A namespace joined to *bridges* (default: every bridge), loopback up."""
        index = len(self.nodes) + 2  # .1 left free, as for a gateway
        netns = f"pcl-{self.suffix}-{name}"
        _ip("netns", "add", netns)
        self._netns.append(netns)
        self._record()
        node = Node(self, name, index, netns)
        _ip("-n", netns, "link", "set", "lo", "up")
        for k, bridge in enumerate(bridges if bridges is not None else list(self.bridges)):
            device, subnet = self.bridges[bridge]
            host = f"pv{self.suffix}{index:02d}{k}"
            peer = f"pp{self.suffix}{index:02d}{k}"
            _ip("link", "add", host, "type", "veth", "peer", "name", peer)
            self._links.append(host)
            self._record()
            _ip("link", "set", peer, "netns", netns)
            _ip("-n", netns, "link", "set", peer, "name", f"eth{k}")
            address = str(ipaddress.ip_address(f"{BASE_NET}.{subnet}.{index}"))
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", f"eth{k}")
            _ip("-n", netns, "link", "set", f"eth{k}", "up")
            _ip("link", "set", host, "master", device)
            _ip("link", "set", host, "up")
            node.addresses[bridge] = address
            node.host_links[bridge] = host
        self.nodes[name] = node
        return node

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    # -- faults -----------------------------------------------------------------------

    def partition(self, name: str, bridges: Iterable[str] | None = None) -> None:
        """Cut node *name* off (from *bridges*, default all of its bridges): its
        host-side veth goes down, so every packet to or from it is dropped."""
        node = self.nodes[name]
        for bridge in bridges if bridges is not None else list(node.host_links):
            _ip("link", "set", node.host_links[bridge], "down")
            self._partitioned.add((name, bridge))

    def heal(self, name: str | None = None) -> None:
        """Bring the links of node *name* (default: every partitioned node) up again."""
        for node_name, bridge in sorted(self._partitioned):
            if name is None or node_name == name:
                _ip("link", "set", self.nodes[node_name].host_links[bridge], "up")
                self._partitioned.discard((node_name, bridge))

    @property
    def partitioned(self) -> set[tuple[str, str]]:
        return set(self._partitioned)

    def resume_all(self) -> None:
        """SIGCONT every paused process."""
        for proc in self._processes:
            if proc.paused:
                proc.resume()

    # -- clean-up ---------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process, delete every namespace, veth and bridge made here."""
        if self._closed:
            return
        self._closed = True
        for proc in self._processes:
            with contextlib.suppress(Exception):
                proc.kill()
        self._spawner.shutdown(wait=False)
        for link in reversed(self._links):
            _ip("link", "del", link, check=False)
        for netns in self._netns:
            _ip("netns", "del", netns, check=False)
        self._ledger.unlink(missing_ok=True)

    def leftovers(self) -> list[str]:
        """Namespaces and links of this network still present (empty after close)."""
        found = [ns for ns in _ip("netns", "list").stdout.split() if self.suffix in ns]
        found += [line for line in _ip("-o", "link", "show").stdout.splitlines()
                  if self.suffix in line]
        return found

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sweep_dead() -> None:
    """Delete the namespaces and links of networks whose creator died without closing
    them (a test process killed with SIGKILL); their processes died with it."""
    if not LEDGER.is_dir():
        return
    for path in LEDGER.glob("*.json"):
        try:
            made = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _alive(made["pid"]):
            continue
        for link in reversed(made["links"]):
            _ip("link", "del", link, check=False)
        for netns in made["netns"]:
            _ip("netns", "del", netns, check=False)
        path.unlink(missing_ok=True)


@atexit.register
def _close_all() -> None:
    for network in list(_live):
        with contextlib.suppress(Exception):
            network.close()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.1) -> None:
    """Poll *predicate* until true; raise AssertionError naming *what* after *timeout*."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
