"""A whole distributed percolator in network namespaces, for the nemesis suite.

Nodes (``tests/faults/_netns.py``), on bridge ``main`` (10.231.0.0/24) unless said:

* ``zk``: a standalone ZooKeeper (:class:`tests._zookeeper.ZooKeeperServer`);
* ``st``: the store: the Bigtable emulator, or the HBase Thrift1 test server of
  ``tests/hbase_thrift_server`` (both in memory: partitioned and paused, never killed);
* ``or1``, ``or2``: two oracle replicas (``python -m oracle --zookeeper``), also on
  bridge ``side`` (10.231.1.0/24);
* ``c1``, ``c2``: client hosts, each running a workload process and an observer worker;
* ``side``: a client host on bridge ``side`` only, recording the timestamps each oracle
  replica hands it directly (``grpc://`` to each replica's side address). Cutting an
  oracle off ``main`` isolates it from ZooKeeper while this client still reaches it:
  the clients on the isolated leader's side.

Every process is a :class:`~tests.faults._netns.NodeProcess` (or, for ZooKeeper and
the emulator, started by their own helpers inside the namespace), so the nemesis can
pause, kill and restart it; :meth:`FaultCluster.close` removes everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests._bigtable import bigtable_store_url, start_emulator
from tests._concurrency import ROOT
from tests._hbase import hbase_store_url, require_hbase_client
from tests._services import service_missing, stop_process
from tests._zookeeper import ZooKeeperServer, java_available
from tests.faults._netns import Network, Node, NodeProcess, wait_until


@dataclass
class Settings:
    """Timeouts of the run (seconds). Pauses of the nemesis outlast them all."""

    oracle_session: float = 2.0  # oracle's ZooKeeper session; its lease is half of it
    client_session: float = 3.0  # clients' ZooKeeper session
    lock_ttl: float = 3.0
    deadline: float = 5.0  # oracle deadline of a client
    store_timeout: float = 2.0  # deadline of one store RPC
    block_size: int = 1000  # small: oracles persist (and are fenced) often


class FaultCluster:
    def __init__(self, workdir: Path, settings: Settings | None = None,
                 store: str = "bigtable", *, split_brain: bool = False) -> None:
        """*split_brain* breaks the system on purpose, to show the checkers catch it:
        each oracle replica keeps its own ceiling in a local file (no election), and
        each client host uses the replica of its own parity, so two oracles serve the
        same timestamps."""
        missing = java_available()
        if missing is not None:
            service_missing(missing)
        self.workdir = workdir
        self.settings = settings or Settings()
        self.dir = workdir / "histories"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.net = Network(workdir / "net")
        self.zk: ZooKeeperServer | None = None
        self.store = store  # "bigtable" or "hbase"
        self.split_brain = split_brain
        self.emulator: subprocess.Popen[bytes] | None = None
        self.hbase: NodeProcess | None = None
        self.oracles: dict[str, NodeProcess] = {}
        self.workloads: dict[str, NodeProcess] = {}
        self.observers: dict[str, NodeProcess] = {}
        self.recorder: NodeProcess | None = None
        self.config: dict[str, Any] = {}
        self.chroot = ""

    # -- start ------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "BIGTABLE_EMULATOR_HOST"}
        env["PYTHONPATH"] = str(ROOT)
        return env

    def start(self, clients: tuple[str, ...] = ("c1", "c2"), *, workloads: bool = True) -> None:
        """Start every service; with *workloads*, also the workload processes, the
        observer workers and the side recorder (the targeted tests drive their own)."""
        net, s = self.net, self.settings
        net.add_bridge("main")
        net.add_bridge("side")
        zk = net.add_node("zk", ["main"])
        st = net.add_node("st", ["main"])
        for name in ("or1", "or2"):
            net.add_node(name, ["main", "side"])
        for name in clients:
            net.add_node(name, ["main"])
        side = net.add_node("side", ["side"])

        self.zk = ZooKeeperServer(port=2181, host=zk.ip, netns=zk.netns)
        self.zk.start()
        self.chroot = self.zk.create_chroot()
        store = self._start_store(st)
        self.config = {
            "store": store, "oracle": f"zk://{self.chroot}", "zookeeper": self.chroot,
            "dir": str(self.dir), "deadline": s.deadline, "lock_ttl": s.lock_ttl,
            "session_timeout": s.client_session,
        }
        for name in ("or1", "or2"):
            node = net[name]
            state = (["--state-file", str(self.workdir / f"{name}.ceiling")]
                     if self.split_brain else ["--zookeeper", self.chroot])
            self.oracles[name] = node.spawn(
                [sys.executable, "-m", "oracle", "--listen", "0.0.0.0:7070", *state,
                 "--advertise", f"{node.ip}:7070",
                 "--session-timeout", f"{s.oracle_session:g}",
                 "--block-size", str(s.block_size), "--max-workers", "4"],
                name="oracle", env=self.env(), cwd=str(ROOT))
        self.run_once(clients[0], "setup", timeout=120)
        if not workloads:
            return
        for i, name in enumerate(clients):
            self.workloads[name] = net[name].spawn(
                self.workload_argv("run", "--node", name, "--seed", str(i + 1), node=name),
                name="workload", env=self.env(), cwd=str(ROOT))
            self.observers[name] = net[name].spawn(
                [sys.executable, "-m", "observers", "--cluster", store,
                 "--observers", "tests.faults._workload:OBSERVERS",
                 "--oracle", self.oracle_for(name), "--zookeeper", self.chroot,
                 "--threads", "1", "--lock-ttl", f"{s.lock_ttl:g}", "--gc-interval", "0",
                 "--retry-delay", "0.2"],
                name="observer", env=self.env(), cwd=str(ROOT))
        self.recorder = side.spawn(
            self.workload_argv("ts", "--node", "side",
                               *(f"--target=grpc://{net[o].addresses['side']}:7070"
                                 for o in ("or1", "or2"))),
            name="ts", env=self.env(), cwd=str(ROOT))

    def _start_store(self, node: Node) -> str:
        """Start the store in *node*; return its url (RPC deadline: store_timeout)."""
        s = self.settings
        if self.store == "bigtable":
            self.emulator, hostport = start_emulator(host=node.ip, netns=node.netns,
                                                     port=8086)
            return bigtable_store_url(hostport, "nemesis") + f"&timeout={s.store_timeout:g}"
        require_hbase_client()
        self.hbase = node.spawn(
            [sys.executable, "-m", "tests.hbase_thrift_server", "--host", node.ip,
             "--port", "9090"], name="hbase", env=self.env(), cwd=str(ROOT))
        wait_until(lambda: node.can_connect(node.ip, 9090), 60, "the HBase test server")
        return (hbase_store_url(f"{node.ip}:9090", "nemesis")
                + f"&timeout={s.store_timeout:g}")

    def oracle_for(self, node: str) -> str:
        """The oracle target of the clients of *node*."""
        if not self.split_brain:
            return str(self.config["oracle"])
        index = sorted(n for n in self.net.nodes if n.startswith("c")).index(node)
        return f"grpc://{self.net[('or1', 'or2')[index % 2]].ip}:7070"

    def workload_argv(self, command: str, *args: str, node: str = "c1") -> list[str]:
        config = dict(self.config, oracle=self.oracle_for(node))
        return [sys.executable, "-m", "tests.faults._workload", command,
                "--config", json.dumps(config), *args]

    def run_once(self, node: str, command: str, *args: str, timeout: float) -> None:
        """Run a one-shot workload command inside *node* and wait for it."""
        proc = self.net[node].spawn(self.workload_argv(command, *args, node=node),
                                    name=command,
                                    env=self.env(), cwd=str(ROOT))
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"{command} in {node} did not finish in {timeout:g}s:\n"
                                 f"{proc.log_tail()}") from None
        assert code == 0, f"{command} in {node} exited {code}:\n{proc.log_tail()}"

    # -- state --------------------------------------------------------------------------

    def leader(self) -> str | None:
        """The oracle node named in ZooKeeper's leader node (None if none or unknown)."""
        from oracle._target import zk_paths

        assert self.zk is not None
        _, leader_path, _ = zk_paths("/" + self.chroot.partition("/")[2])

        def read() -> str | None:
            from kazoo.client import KazooClient

            zk = KazooClient(hosts=self.zk.hosts if self.zk else "", timeout=3.0)
            try:
                zk.start(timeout=5)
                data, _ = zk.get(leader_path)
                return str(data.decode())
            except Exception:
                return None
            finally:
                zk.stop()
                zk.close()

        if self.zk is None or not self.zk.running:
            return None
        address = self.net["zk"].call(read, timeout=20)
        for name in self.oracles:
            if address and address.rpartition("://")[2].startswith(self.net[name].ip + ":"):
                return name
        return None

    def final_state(self, node: str = "c1") -> dict[str, Any]:
        out = self.dir / f"final-{time.monotonic_ns()}.json"
        self.run_once(node, "final", "--out", str(out), timeout=120)
        state: dict[str, Any] = json.loads(out.read_text())
        return state

    def stop_workloads(self, timeout: float) -> list[str]:
        """Ask the workload processes to stop; return those that did not within
        *timeout* (then killed): a call that never returned."""
        (self.dir / "stop").touch()
        hung = []
        end = time.monotonic() + timeout
        for name, proc in [*self.workloads.items(), ("side", self.recorder)]:
            assert proc is not None
            try:
                proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(f"{name}: {proc.log_tail(10)}")
                proc.kill()
        return hung

    def wait_workloads_running(self, timeout: float) -> None:
        """Wait until every client's workload has had an operation acknowledged: the
        nemesis is for a running system, and on a loaded machine the workload and
        observer processes can take tens of seconds to import and connect, which a
        schedule started at once would spend on clients not running yet."""
        from tests.faults._checks import load

        def running() -> bool:
            streams = load(self.dir)
            return all(any(op.status == "ok" for stream, ops in streams.items()
                           if stream.startswith(f"{name}-") for op in ops)
                       for name in self.workloads)

        wait_until(running, timeout, "every client's first acknowledged operation", 0.5)

    def wait_observers_caught_up(self, timeout: float) -> dict[str, Any]:
        """Poll the final state until every observed row's output matches its input."""
        state: dict[str, Any] = {}

        def caught_up() -> bool:
            nonlocal state
            state = self.final_state()
            return bool(state["obs_in"] == state["obs_out"])

        try:
            wait_until(caught_up, timeout, "the observers to process every change", 1.0)
        except AssertionError:
            pass  # reported by the checker as lost notifications
        # No read within the timeout (a loaded machine): one more, whose failure says why.
        return state or self.final_state()

    def close(self) -> None:
        if self.zk is not None:
            self.zk.cleanup()
        if self.emulator is not None:
            stop_process(self.emulator)
        self.net.close()

    def __enter__(self) -> FaultCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
