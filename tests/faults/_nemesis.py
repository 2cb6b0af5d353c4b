"""The nemesis: a seeded random schedule of faults, and its runner.

:func:`schedule` draws, from one seed, a list of :class:`Fault` covering the run, one
at a time with quiet gaps between them (so throughput can be told with and without a
fault): partitions of a node, an oracle leader cut off from ZooKeeper while the side
client still reaches it, SIGSTOP pauses longer than the ZooKeeper session timeout and
the lock TTL, and kill -9 with a restart. The seed comes from
``PERCOLATOR_NEMESIS_SEED`` when set (to replay a run), else a random one; it is
printed with the schedule. The faults are the same on a replay; their timing against
the workload is not (processes are scheduled by the kernel).

:class:`Nemesis` runs a schedule against a :class:`tests.faults._cluster.FaultCluster`
in the calling thread, and ends by healing every link and resuming every process.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass, field

from tests.faults._cluster import FaultCluster, Settings
from tests.faults._netns import NodeProcess

SEED_ENV = "PERCOLATOR_NEMESIS_SEED"
#: ZooKeeper session timeout of an observer worker: ``connect``'s default.
OBSERVER_SESSION = 10.0

# "leader" is resolved when the fault starts: the oracle replica ZooKeeper names.
PARTITION_TARGETS = ["zk", "st", "or1", "or2", "c1", "c2", "leader"]
PAUSE_TARGETS = ["zk", "st", "or1", "or2", "leader", "workload:c1", "workload:c2",
                 "observer:c1", "observer:c2"]
KILL_TARGETS = ["zk", "or1", "or2", "leader", "workload:c1", "workload:c2", "observer:c1",
                "observer:c2"]
KINDS = {"partition": PARTITION_TARGETS, "isolate-leader": ["leader"],
         "pause": PAUSE_TARGETS, "kill": KILL_TARGETS}


def nemesis_seed() -> int:
    value = os.environ.get(SEED_ENV)
    return int(value) if value else random.SystemRandom().randrange(1, 2**31)


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start of the run
    kind: str  # partition | isolate-leader | pause | kill
    target: str
    duration: float  # how long the fault lasts (for kill: how long the process stays down)

    def __str__(self) -> str:
        return f"t+{self.at:6.1f}s {self.kind:14} {self.target:12} for {self.duration:4.1f}s"


def schedule(seed: int, seconds: float, settings: Settings) -> list[Fault]:
    """Faults for a run of *seconds*, drawn from *seed* alone."""
    rng = random.Random(seed)
    # A pause must outlast every timeout a paused process could be judged by.
    longest = max(settings.client_session, settings.lock_ttl, settings.oracle_session)
    faults: list[Fault] = []
    at = rng.uniform(2.0, 4.0)
    while True:
        kind = rng.choice(list(KINDS))
        target = rng.choice(KINDS[kind])
        if kind == "pause" and target.startswith("observer:"):
            # observer workers keep the library's default session (python -m observers
            # has no option for it): outlast that too
            duration = rng.uniform(OBSERVER_SESSION + 1.0, OBSERVER_SESSION + 5.0)
        elif kind == "pause":
            duration = rng.uniform(longest + 1.0, longest + 5.0)
        elif kind == "kill":
            duration = rng.uniform(0.5, 4.0)
        else:
            duration = rng.uniform(2.0, 8.0)
        if at + duration > seconds:
            return faults
        faults.append(Fault(round(at, 1), kind, target, round(duration, 1)))
        at += duration + rng.uniform(1.0, 4.0)


@dataclass
class Applied:
    fault: Fault
    target: str  # the node or process it hit (a resolved "leader")
    start: float  # wall time
    end: float = 0.0


@dataclass
class Nemesis:
    cluster: FaultCluster
    faults: list[Fault]
    applied: list[Applied] = field(default_factory=list)

    def _pid(self, target: str) -> int | None:
        c = self.cluster
        if target == "zk":
            return c.zk.process.pid if c.zk is not None and c.zk.process is not None else None
        if target == "st" and c.emulator is not None:
            return c.emulator.pid
        proc = self._proc(target)
        return proc.pid if proc is not None and proc.running else None

    def _proc(self, target: str) -> NodeProcess | None:
        c = self.cluster
        if target in c.oracles:
            return c.oracles[target]
        if target == "st":
            return c.hbase
        kind, _, node = target.partition(":")
        return {"workload": c.workloads, "observer": c.observers}.get(kind, {}).get(node)

    def _signal(self, target: str, sig: int) -> None:
        """SIGSTOP/SIGCONT a process (node processes through their own methods, so
        that a heal knows which ones are paused)."""
        proc = self._proc(target)
        if proc is not None:
            if sig == signal.SIGSTOP:
                proc.pause()
            else:
                proc.resume()
            return
        pid = self._pid(target)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _resolve(self, target: str) -> str:
        if target != "leader":
            return target
        return self.cluster.leader() or "or1"

    def _apply(self, fault: Fault) -> Applied:
        target = self._resolve(fault.target)
        net = self.cluster.net
        applied = Applied(fault, target, time.time())
        if fault.kind == "partition":
            net.partition(target)
        elif fault.kind == "isolate-leader":
            net.partition(target, ["main"])  # still reachable on "side"
        elif fault.kind == "pause":
            self._signal(target, signal.SIGSTOP)
        elif fault.kind == "kill" and target == "zk":
            assert self.cluster.zk is not None
            self.cluster.zk.kill()  # its data directory stays: a restart recovers it
        elif fault.kind == "kill":
            proc = self._proc(target)
            if proc is not None:
                proc.kill()
        return applied

    def _undo(self, applied: Applied) -> None:
        fault, target = applied.fault, applied.target
        if fault.kind in ("partition", "isolate-leader"):
            self.cluster.net.heal(target)
        elif fault.kind == "pause":
            self._signal(target, signal.SIGCONT)
        elif fault.kind == "kill" and target == "zk":
            assert self.cluster.zk is not None
            self.cluster.zk.start()
        elif fault.kind == "kill":
            proc = self._proc(target)
            if proc is not None:
                proc.start()
        applied.end = time.time()

    def run(self, seconds: float) -> None:
        """Run the schedule (the calling thread sleeps between faults) for *seconds*,
        then heal everything."""
        began = time.monotonic()
        try:
            for fault in self.faults:
                delay = began + fault.at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                applied = self._apply(fault)
                self.applied.append(applied)
                print(f"nemesis: {fault} -> {applied.target}", flush=True)
                time.sleep(fault.duration)
                self._undo(applied)
            rest = began + seconds - time.monotonic()
            if rest > 0:
                time.sleep(rest)
        finally:
            self.heal_all()

    def heal_all(self) -> None:
        """Heal every link, resume every process, start every killed one again."""
        c = self.cluster
        c.net.heal()
        for target in ("zk", "st"):
            self._signal(target, signal.SIGCONT)
        c.net.resume_all()
        if c.zk is not None and not c.zk.running:
            c.zk.start()
        for proc in [*c.oracles.values(), *c.workloads.values(), *c.observers.values()]:
            if not proc.running and not (c.dir / "stop").exists():
                proc.start()
        for applied in self.applied:
            if not applied.end:
                applied.end = time.time()

    def fault_windows(self) -> list[tuple[float, float]]:
        return [(a.start, a.end) for a in self.applied]
