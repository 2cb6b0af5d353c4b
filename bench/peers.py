"""Side by side with the peer: Apache Omid and us on the same HBase, in one run (issue 39).

    python bench/peers.py                  # print the section
    python bench/peers.py --write          # and put it in BENCHMARKS.md

One standalone HBase 2.6 (the test suite's launcher, ``tests/_hbase_local.py``) with
its Thrift1 server; Omid's TSO against it (commit and timestamp tables made by Omid's
``OmidTableManager``, persisted in HBase); our gRPC oracle (``python -m oracle``). Then,
alternating in chunks so that the shared machine's noise falls on every operation
alike, after one warm-up round that is not counted:

* Java (``bench/peers/``, Omid 1.1.3 and HBase's own client): raw ``Table.put`` and
  ``Table.get`` of one cell; Omid's single-cell transaction (begin, put, commit), a
  read-only transaction reading one cell, a transfer (read two rows, write both);
* Python: raw happybase ``put`` and ``row`` of one cell; ours, the same three.

Each side's ratio is to its own raw client (the median of per-round ratios). CPU per
operation is read from ``/proc/PID/stat`` of every process (clients, TSO or oracle,
HBase, its Thrift server) around each chunk; round trips from the HBase client's
metrics (Java) and a counting proxy round the store (Python). Then a contended bank
(20 accounts, 8 threads) on each side, and each bank's total checked afterwards.

Every JVM started here is killed at the end, on error too (and, through
``PR_SET_PDEATHSIG``, when this process dies).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from percolator._internals import internals

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import header, publish  # noqa: E402

if TYPE_CHECKING:
    from tests._hbase_local import LocalHBase

PEERS = ROOT / "bench" / "peers"
HEADING = "## Side by side with Apache Omid on one HBase (bench/peers.py)"
ROWS = 1000
VALUE = 100
ACCOUNTS = 20
BALANCE = 1000
JAVA_HEAP = "-Xmx512m"
TSO_CONFLICT_MAP = 1_000_000
"""Omid's default conflictMapSize (100 M entries) allocates ~1.6 GB at start."""


class PeerError(RuntimeError):
    """The Java side could not be built, started or answered; the message says how."""


# -- the Java side ----------------------------------------------------------------------


def build_harness() -> str:
    """Build ``bench/peers`` with Maven (once per change of its pom or sources) and
    return the class path of the harness: its classes, then Omid's and HBase's jars."""
    target = PEERS / "target"
    sources = [*sorted(PEERS.glob("src/**/*.java")), PEERS / "pom.xml"]
    key = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    stamp, cp_file = target / "built.key", target / "classpath.txt"
    if not (stamp.exists() and stamp.read_text() == key and cp_file.exists()):
        mvn = shutil.which("mvn")
        if mvn is None:
            raise PeerError("mvn is not installed (it builds bench/peers): apt-get install maven")
        result = subprocess.run(
            [mvn, "-q", "-B", "-f", str(PEERS / "pom.xml"), "package",
             "dependency:build-classpath", f"-Dmdep.outputFile={cp_file}"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True,
        )
        if result.returncode != 0 or not cp_file.exists():
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
            raise PeerError(f"mvn could not build {PEERS} (exit {result.returncode}):\n{tail}")
        stamp.write_text(key)
    return os.pathsep.join([str(target / "classes"), cp_file.read_text().strip()])


def _jvm_command(heap: str, classpath: str, log: Path, main: str, *args: str) -> list[str]:
    from tests._hbase_local import JDK17_FLAGS, java, jvm_options

    return [java(), heap, "-XX:+UseG1GC", "-Djava.net.preferIPv4Stack=true", *JDK17_FLAGS,
            *jvm_options(),
            f"-Dhbase.log.file={log}",
            f"-Dlog4j.configurationFile=file:{log.parent}/log4j2.properties",
            "-cp", classpath, main, *args]


def _spawn(command: list[str], cwd: Path, out: Path, **kw: Any) -> subprocess.Popen[bytes]:
    from tests._hbase_local import _die_with_parent

    with open(out, "ab") as f:
        return subprocess.Popen(command, cwd=cwd, stderr=f, preexec_fn=_die_with_parent, **kw)


class JavaHarness:
    """``peers.Harness`` in its own JVM, spoken to one line at a time."""

    def __init__(self, classpath: str, workdir: Path) -> None:
        self.log = workdir / "harness.log"
        self.proc = _spawn(
            _jvm_command(JAVA_HEAP, classpath, self.log, "peers.Harness"), workdir, self.log,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        self._out: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        self._answer()  # {"ready": true}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _answer(self) -> dict[str, Any]:
        line = self._out.readline()
        if not line:
            raise PeerError(f"the Java harness exited ({self.proc.poll()}); see {self.log}:\n"
                            + _tail(self.log))
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise PeerError(f"the Java harness failed: {answer['error']}; see {self.log}")
        return answer

    def call(self, *words: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((" ".join(map(str, words)) + "\n").encode())
        self.proc.stdin.flush()
        return self._answer()

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"quit\n")
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        _kill(self.proc)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
    if proc is not None:
        proc.wait()


def tso_config(port: int, batch_timeout_ms: int) -> str:
    """Omid's ``omid-server-configuration.yml``: timestamps and commits persisted in
    HBase (the tables OmidTableManager made), a conflict map this machine can hold."""
    return (
        f"port: {port}\n"
        f"conflictMapSize: {TSO_CONFLICT_MAP}\n"
        f"batchPersistTimeoutInMs: {batch_timeout_ms}\n"
        "timestampStoreModule: "
        "!!org.apache.omid.timestamp.storage.DefaultHBaseTimestampStorageModule [ ]\n"
        "commitTableStoreModule: "
        "!!org.apache.omid.committable.hbase.DefaultHBaseCommitTableStorageModule [ ]\n"
    )


def start_tso(classpath: str, workdir: Path, batch_timeout_ms: int,
              timeout: float = 120.0) -> tuple[subprocess.Popen[bytes], int]:
    """Omid's TSO server in its own JVM, ready when its port accepts."""
    conf = workdir / "tso-conf"
    conf.mkdir(exist_ok=True)
    port = _free_port()
    (conf / "omid-server-configuration.yml").write_text(tso_config(port, batch_timeout_ms))
    log = workdir / "tso.log"
    proc = _spawn(_jvm_command(JAVA_HEAP, f"{conf}{os.pathsep}{classpath}", log,
                               "org.apache.omid.tso.TSOServer"), workdir, log,
                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return proc, port
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill(proc)
            raise PeerError(f"Omid's TSO did not start ({proc.returncode}); {log}:\n{_tail(log)}")
        time.sleep(0.3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_STARTED = time.monotonic()


def _progress(what: str) -> None:
    print(f"peers: {what} at {time.monotonic() - _STARTED:.1f} s", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User and system CPU of process *pid* so far, all its threads (``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except FileNotFoundError:
        raise PeerError(f"process {pid} died during the run (the TSO's and the harness's "
                        f"logs are kept; PERCOLATOR_HBASE_KEEP=1 keeps HBase's)") from None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the Python side --------------------------------------------------------------------


class PythonSide:
    """Raw happybase and our transactions on the same HBase, through its Thrift1 server."""

    def __init__(self, hostport: str, oracle: str) -> None:
        import happybase

        import percolator

        host, _, port = hostport.rpartition(":")
        self.hb = happybase.Connection(host, int(port))
        if b"peers_hbraw" not in self.hb.tables():
            self.hb.create_table("peers_hbraw", {"f": {}})
        self.raw = self.hb.table("peers_hbraw")
        self.cluster = percolator.connect(
            f"hbase://{hostport}?table_prefix=peers_ours_&pool_size=10", oracle=oracle)
        self.cluster.create_table("data")
        self.cluster.create_table("bank")
        self.rows = [b"row%06d" % i for i in range(ROWS)]
        self._seq = 0
        with self.raw.batch() as batch:
            for row in self.rows:
                batch.put(row, {b"f:value": self.value()})
        with percolator.Transaction(self.cluster) as txn:
            for row in self.rows:
                txn.set("data", row, "c:value", self.value())

    def value(self) -> bytes:
        self._seq += 1
        return bytes([97 + self._seq % 26]) * VALUE

    def row(self) -> bytes:
        return self.rows[random.randrange(ROWS)]

    def timestamp(self) -> None:
        internals(self.cluster).timestamps.get_timestamp()

    def raw_put(self) -> None:
        self.raw.put(self.row(), {b"f:value": self.value()})

    def raw_get(self) -> None:
        if not self.raw.row(self.row(), columns=[b"f:value"]):
            raise PeerError("raw row missing")

    def write(self) -> None:
        import percolator

        with percolator.Transaction(self.cluster) as txn:
            txn.set("data", self.row(), "c:value", self.value())

    def read(self) -> None:
        import percolator

        with percolator.Transaction(self.cluster) as txn:
            if txn.get("data", self.row(), "c:value") is None:
                raise PeerError("row missing")

    def transfer(self) -> None:
        import percolator

        a, b = self.row(), self.row()
        with percolator.Transaction(self.cluster) as txn:
            va = txn.get("data", a, "c:value") or b""
            vb = txn.get("data", b, "c:value") or b""
            txn.set("data", a, "c:value", vb)
            txn.set("data", b, "c:value", va)

    def count_round_trips(self, op: Callable[[], None], n: int = 100) -> str:
        """Thrift round trips (each call the store makes on a Thrift connection), the
        store calls they serve, and oracle calls, per *op*: counted over *n* untimed
        runs by proxies round the store and the timestamp source, and round the store's
        one gateway to Thrift (``_call``; a ``check_and_set`` that carries puts is two)."""
        from bench.overhead import CountingStore, CountingTimestamps

        store, timestamps = internals(self.cluster).store, internals(self.cluster).timestamps
        counting = CountingStore(store)
        thrift_call = store._call  # type: ignore[attr-defined]

        def counted_call(*args: Any, **kwargs: Any) -> Any:
            counting.calls["thrift"] += 1
            return thrift_call(*args, **kwargs)

        store._call = counted_call  # type: ignore[attr-defined]
        internals(self.cluster).store = counting  # type: ignore[assignment]
        internals(self.cluster).timestamps = CountingTimestamps(timestamps, counting.calls)
        try:
            for _ in range(n):
                op()
        finally:
            internals(self.cluster).store, internals(self.cluster).timestamps = store, timestamps
            del store._call  # type: ignore[attr-defined]
        oracle = counting.calls.pop("timestamp", 0) / n
        thrift = counting.calls.pop("thrift", 0) / n
        calls = ", ".join(f"{k} {v / n:g}" for k, v in sorted(counting.calls.items()))
        return f"Thrift {thrift:g}{f' ({calls})' if calls else ''}, oracle {oracle:g}"

    def bank_init(self) -> None:
        import percolator

        with percolator.Transaction(self.cluster) as txn:
            for i in range(ACCOUNTS):
                txn.set("bank", b"acct%03d" % i, "c:balance", str(BALANCE).encode())

    def bank(self, threads: int, seconds: float) -> dict[str, float]:
        import percolator

        committed, aborted, failed = Counter[int](), Counter[int](), []
        deadline = time.monotonic() + seconds

        def worker(k: int) -> None:
            rnd = random.Random(k)
            try:
                while time.monotonic() < deadline:
                    a = rnd.randrange(ACCOUNTS)
                    b = (a + 1 + rnd.randrange(ACCOUNTS - 1)) % ACCOUNTS
                    amount = 1 + rnd.randrange(10)
                    try:
                        with percolator.Transaction(self.cluster) as txn:
                            va = int(txn.get("bank", b"acct%03d" % a, "c:balance") or b"0")
                            vb = int(txn.get("bank", b"acct%03d" % b, "c:balance") or b"0")
                            txn.set("bank", b"acct%03d" % a, "c:balance", str(va - amount).encode())
                            txn.set("bank", b"acct%03d" % b, "c:balance", str(vb + amount).encode())
                        committed[k] += 1
                    except (percolator.ConflictError, percolator.LockedError):
                        aborted[k] += 1
            except Exception as e:  # reported: a thread that dies is not an abort
                failed.append(e)

        started = time.monotonic()
        workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        if failed:
            raise PeerError(f"our bank: {len(failed)} threads failed: {failed[0]!r}")
        return {"committed": sum(committed.values()), "aborted": sum(aborted.values()),
                "seconds": time.monotonic() - started}

    def bank_total(self) -> int:
        import percolator

        with percolator.Transaction(self.cluster) as txn:
            return sum(int(txn.get("bank", b"acct%03d" % i, "c:balance") or b"0")
                       for i in range(ACCOUNTS))

    def close(self) -> None:
        self.cluster.close()
        self.hb.close()


# -- the run ----------------------------------------------------------------------------

OPS: dict[str, tuple[str, str]] = {
    # name: (side, the raw operation its ratio is taken to)
    "Omid timestamp (TSO begin)": ("omid", ""),
    "Java raw put": ("omid", ""),
    "Java raw get": ("omid", ""),
    "Omid single-cell txn": ("omid", "Java raw put"),
    "Omid read-only txn": ("omid", "Java raw get"),
    "Omid transfer txn": ("omid", "Java raw put"),
    "ours timestamp (oracle)": ("ours", ""),
    "happybase raw put": ("ours", ""),
    "happybase raw get": ("ours", ""),
    "ours single-cell txn": ("ours", "happybase raw put"),
    "ours read-only txn": ("ours", "happybase raw get"),
    "ours transfer txn": ("ours", "happybase raw put"),
}
JAVA_OPS = {"Omid timestamp (TSO begin)": "omid_begin",
            "Java raw put": "raw_put", "Java raw get": "raw_get",
            "Omid single-cell txn": "omid_write", "Omid read-only txn": "omid_read",
            "Omid transfer txn": "omid_transfer"}


class Run:
    """Everything one run starts, and its measurements."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.procs: dict[str, int] = {}
        self.seconds: dict[str, list[float]] = defaultdict(list)  # per round
        self.cpu: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.ops_done: Counter[str] = Counter()
        self.trips: dict[str, str] = {}
        self.idle: dict[str, float] = {}  # CPU seconds per second with nothing to do

    def measure_idle(self, seconds: float) -> None:
        """Each process's CPU while no operation runs (HBase's chores, the JVMs' GC and
        compiler threads, the oracle's lease renewal): charged per second of a chunk, it
        would make a slow operation look CPU-hungry, so chunks are charged net of it."""
        before = {p: cpu_seconds(pid) for p, pid in self.procs.items()}
        time.sleep(seconds)
        self.idle = {p: (cpu_seconds(pid) - before[p]) / seconds for p, pid in self.procs.items()}

    def chunk(self, name: str, fn: Callable[[int], float], n: int, counted: bool) -> float:
        before = {p: cpu_seconds(pid) for p, pid in self.procs.items()}
        wall = time.perf_counter()
        seconds = fn(n)
        wall = time.perf_counter() - wall
        if counted:
            for p, pid in self.procs.items():
                used = cpu_seconds(pid) - before[p]
                self.cpu[name][p] += used - self.idle.get(p, 0.0) * wall
            self.ops_done[name] += n
        return seconds


def measure(args: argparse.Namespace, run: Run, java: JavaHarness, py: PythonSide) -> None:
    """Every operation of :data:`OPS` in alternating chunks, a warm-up round first."""
    java_trips: dict[str, tuple[float, float]] = {}

    def java_op(op: str) -> Callable[[int], float]:
        def go(n: int) -> float:
            answer = java.call("run", op, n)
            java_trips[op] = (answer["hbase_rpcs"] / n, answer["tso_requests"] / n)
            return float(answer["seconds"])
        return go

    def py_op(op: Callable[[], None]) -> Callable[[int], float]:
        def go(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                op()
            return time.perf_counter() - start
        return go

    py_ops = {"ours timestamp (oracle)": py.timestamp,
              "happybase raw put": py.raw_put, "happybase raw get": py.raw_get,
              "ours single-cell txn": py.write, "ours read-only txn": py.read,
              "ours transfer txn": py.transfer}
    fns = {**{k: java_op(v) for k, v in JAVA_OPS.items()},
           **{k: py_op(v) for k, v in py_ops.items()}}
    run.measure_idle(args.idle_seconds)
    # Round 0 warms both sides up (JIT, connections, region locations, caches) and is
    # not counted.
    for rnd in range(args.rounds + 1):
        per_round: dict[str, float] = defaultdict(float)
        for first in range(0, args.ops, args.chunk):
            n = min(args.chunk, args.ops - first)
            for name in OPS:
                per_round[name] += run.chunk(name, fns[name], n, counted=rnd > 0)
        if rnd > 0:
            for name in OPS:
                run.seconds[name].append(per_round[name])
    for name, op in JAVA_OPS.items():
        rpcs, tso = java_trips[op]
        run.trips[name] = f"HBase RPC {rpcs:g}, TSO {tso:g}"
    for name, fn in py_ops.items():
        if "raw" in name:  # one happybase call: one Thrift round trip, no store in between
            run.trips[name] = "Thrift 1, oracle 0"
            continue
        run.trips[name] = py.count_round_trips(fn)


def bank(args: argparse.Namespace, java: JavaHarness, py: PythonSide) -> dict[str, dict[str, Any]]:
    java.call("bank_init", ACCOUNTS, BALANCE)
    omid = java.call("bank", ACCOUNTS, args.threads, args.bank_seconds)
    omid["total"] = java.call("bank_total", ACCOUNTS)["total"]
    py.bank_init()
    ours = py.bank(args.threads, args.bank_seconds)
    ours["total"] = py.bank_total()
    return {"Omid": omid, "ours": ours}


def heading(args: argparse.Namespace) -> str:
    """The section's heading: one per Omid batch timeout, so both can stand."""
    return HEADING.replace("HBase", f"HBase, TSO batch timeout {args.batch_timeout_ms} ms")


def report(args: argparse.Namespace, run: Run, banks: dict[str, dict[str, Any]],
           command: str, load: Sequence[float] = ()) -> list[str]:
    def rate(name: str) -> float:
        return float(statistics.median(args.ops / s for s in run.seconds[name]))

    def ratio(name: str, base: str) -> float:
        pairs = zip(run.seconds[name], run.seconds[base], strict=True)
        return float(statistics.median(b / s for s, b in pairs))

    groups = {"client": ("java client", "python client"), "TSO/oracle": ("tso", "oracle"),
              "HBase": ("hbase",), "Thrift": ("thrift",)}
    idle = ", ".join(f"{p} {run.idle.get(p, 0.0) * 1e3:.0f}" for p in run.procs)
    lines = header(
        heading(args), command,
        *([f"load average (1 min) at start and end: {load[0]:.1f}, {load[1]:.1f} (other "
           f"helpers' JVMs and tests share the 2 cores)"] if load else []),
        f"CPU is charged net of each process's idle CPU (ms per second, measured for "
        f"{args.idle_seconds:g} s before the warm-up: {idle})",
        f"same HBase 2.6.1 standalone (one JVM, -Xmx1g, local FS; Thrift1 -Xmx384m), same "
        f"run, alternating chunks of {args.chunk} ops, {args.rounds} rounds of {args.ops} ops "
        f"each after one uncounted warm-up round; {ROWS} rows of {VALUE}-byte values each side",
        f"Omid 1.1.3 (omid-tso-server, omid-hbase-client, omid-hbase-tools from Maven Central, "
        f"HBase client 2.6.1), Java 17, client and TSO {JAVA_HEAP}; TSO: timestamps and commits "
        f"in HBase (OMID_TIMESTAMP_TABLE, OMID_COMMIT_TABLE by OmidTableManager), "
        f"conflictMapSize {TSO_CONFLICT_MAP:,}, batchPersistTimeoutInMs "
        f"{args.batch_timeout_ms}, waitStrategy LOW_CPU, lowLatency false; client: "
        f"postCommitMode SYNC (shadow cells written before commit returns), conflict "
        f"detection CELL; data tables VERSIONS => 2147483647",
        "ours: percolator-txn over happybase/Thrift1 (buffered, binary), store pool 10, "
        "timestamps from `python -m oracle` (gRPC); CPython "
        f"{sys.version.split()[0]}",
    )
    lines += ["", "| operation | ops/s (median of rounds) | ratio to own raw | round trips per op "
              "| CPU ms/op: client | TSO/oracle | HBase | Thrift |",
              "|---|---:|---:|---|---:|---:|---:|---:|"]
    for name, (_, base) in OPS.items():
        done = run.ops_done[name]
        cpu = [sum(run.cpu[name][p] for p in procs if p in run.procs) / done * 1e3
               for procs in groups.values()]
        r = f"{ratio(name, base):.2f}" if base else ""
        lines.append(f"| {name} | {rate(name):,.0f} | {r} | {run.trips[name]} | "
                     + " | ".join(f"{c:.2f}" for c in cpu) + " |")
    lines += ["", f"Contended bank: {ACCOUNTS} accounts of {BALANCE}, {args.threads} threads, "
              f"{args.bank_seconds:g} s each side, transfers read both rows and write both.", "",
              "| side | committed/s | abort rate | total after (expected) |",
              "|---|---:|---:|---:|"]
    for side, b in banks.items():
        tried = b["committed"] + b["aborted"]
        lines.append(f"| {side} | {b['committed'] / b['seconds']:,.0f} | "
                     f"{b['aborted'] / max(tried, 1):.1%} | {b['total']} ({ACCOUNTS * BALANCE}) |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=400, help="operations per op per round")
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--bank-seconds", type=float, default=10.0)
    parser.add_argument("--batch-timeout-ms", type=int, default=10,
                        help="Omid's batchPersistTimeoutInMs (its default: 10)")
    parser.add_argument("--idle-seconds", type=float, default=5.0,
                        help="how long each process's idle CPU is measured, to charge "
                             "chunks net of it")
    parser.add_argument("--write", action="store_true", help="put the section in BENCHMARKS.md")
    args = parser.parse_args(argv)
    for name in ("ops", "chunk", "rounds", "threads", "batch_timeout_ms"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("bank_seconds", "idle_seconds"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be more than 0")
    command = "python bench/peers.py " + " ".join(argv if argv is not None else sys.argv[1:])
    load = [os.getloadavg()[0]]
    with session(args) as (run, java, py):
        measure(args, run, java, py)
        _progress("operations measured")
        banks = bank(args, java, py)
    load.append(os.getloadavg()[0])
    lines = report(args, run, banks, command.strip(), load)
    publish(heading(args), lines, args.write)
    bad = [side for side, b in banks.items() if b["total"] != ACCOUNTS * BALANCE]
    if bad:
        print(f"bank totals do not hold: {bad}", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def session(args: argparse.Namespace, hbase: LocalHBase | None = None
            ) -> Iterator[tuple[Run, JavaHarness, PythonSide]]:
    """The Omid TSO, our oracle, the Java harness and the Python side on *hbase* (a
    standalone HBase started here if None), all stopped (the JVMs killed) when the
    block ends, however it ends; an HBase started here is stopped too."""

    workdir = Path(tempfile.mkdtemp(prefix="percolator-peers-"))
    try:
        with _started(args, hbase, workdir) as started:
            yield started
    except BaseException:
        print(f"peers: the harness's and the TSO's logs are kept in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def _started(args: argparse.Namespace, hbase: LocalHBase | None, workdir: Path
             ) -> Iterator[tuple[Run, JavaHarness, PythonSide]]:
    from bench.oracle import Server
    from tests._hbase_local import LocalHBase

    with contextlib.ExitStack() as stack:
        classpath = build_harness()
        _progress("harness built")
        if hbase is None:
            hbase = LocalHBase()
            stack.callback(hbase.stop)
            hbase.start()
            _progress("HBase ready")
        # The Java processes find HBase (its ZooKeeper) through its hbase-site.xml.
        (workdir / "log4j2.properties").write_text(
            (hbase.dir / "conf" / "log4j2.properties").read_text())
        cp = f"{hbase.dir / 'conf'}{os.pathsep}{classpath}"
        java = JavaHarness(cp, workdir)
        _progress("harness JVM up")
        stack.callback(java.stop)
        java.call("setup", "peers", ROWS)  # Omid's tables first: the TSO reads them
        _progress("tables created")
        tso, port = start_tso(cp, workdir, args.batch_timeout_ms)
        _progress("TSO up")
        stack.callback(_kill, tso)
        java.call("connect", f"127.0.0.1:{port}")
        java.call("load")
        _progress("Omid connected, rows loaded")
        oracle = Server(["--state-file", str(workdir / "oracle.state")], str(workdir))
        stack.callback(oracle.kill)
        oracle.wait()
        py = PythonSide(hbase.hostport, f"grpc://{oracle.address}")
        _progress("oracle up, our tables loaded")
        stack.callback(py.close)
        run = Run(args, workdir)
        hbase_pid, thrift_pid = hbase.jvm_pids  # also when another test process started it
        run.procs = {"java client": java.pid, "python client": os.getpid(), "tso": tso.pid,
                     "oracle": oracle.process.pid, "hbase": hbase_pid, "thrift": thrift_pid}
        yield run, java, py


if __name__ == "__main__":
    raise SystemExit(main())
