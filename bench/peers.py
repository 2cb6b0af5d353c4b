"""Side by side with the peer: Apache Omid and us on the same HBase, in one run (issues 39
and 47).

    python bench/peers.py                            # at 10 ms and 1 ms: print the section
    python bench/peers.py --write                    # and put it in BENCHMARKS.md
    python bench/peers.py --batch-timeout-ms 1       # one batch timeout, its own section

One HBase for both sides: a standalone HBase 2.6 started here (the test suite's
launcher, ``tests/_hbase_local.py``) with its Thrift2 and Thrift1 servers, or the one
``PERCOLATOR_HBASE_CONF`` (its conf directory: Omid's client finds HBase through its
``hbase-site.xml``), ``PERCOLATOR_HBASE_THRIFT`` and ``PERCOLATOR_HBASE_THRIFT2`` name
(``scripts/hbase --dir DIR``: its conf is ``DIR/conf``). Our side speaks Thrift2, the
HBase store's default (``--api thrift1`` for the Thrift1 store). Our gRPC oracle
(``python -m oracle``) serves our timestamps.

Then, for each Omid TSO batch timeout of ``--batch-timeout-ms`` in turn (default 10
and 1: Omid's default and its low-latency setting), an Omid TSO started for it (its
timestamps and commits in HBase, in the tables Omid's ``OmidTableManager`` made; the
previous TSO stopped):

* alternating in chunks, so that the machine's noise falls on every operation alike,
  after one warm-up round that is not counted: Java (``bench/peers/``, Omid 1.1.3 and
  HBase's own client) raw ``Table.put`` and ``Table.get`` of one cell, Omid's
  single-cell transaction (begin, put, commit), a read-only transaction reading one
  cell, a transfer (read two rows, write both); Python: our store's raw put and get of
  one cell (one Thrift call each), ours, the same three;
* a contended bank: 20 accounts, 8 threads in one client process each side;
* uncontended transfers: 1,000 accounts (``--accounts``), ``--clients`` (8) client
  *processes* each side, 8 JVMs of the harness (each its own HBase connection and TSO
  connection) and 8 Python processes (each its own store connections and oracle
  channel): processes,
  because a Python process runs one thread at a time, so threads in one process would
  measure the GIL, and because threads of one JVM share one TSO connection whose
  requests the TSO batches, which 8 application processes would not. For the record,
  the same transfers from 8 threads in one client process each side follow.

Every bank's total is checked afterwards. Each side's ratio is to its own raw client
(the median of per-round ratios). CPU per operation is read from ``/proc/PID/stat`` of
every process (clients, TSO or oracle, HBase, the Thrift server our side uses) around
each chunk; round trips from the HBase client's metrics (Java) and a counting proxy
round the store (Python).

Every JVM and process started here is killed at the end, on error too (and, through
``PR_SET_PDEATHSIG``, when this process dies).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from percolator.ext import Mutation, Read, internals

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    HBaseServers,
    LineClient,
    hbase_servers_from_env,
    hbase_servers_of,
    head_commit,
    header,
    publish,
    serve_lines,
    spawn,
)
from tests._hbase_local import kill, tail  # noqa: E402

if TYPE_CHECKING:
    import percolator
    from bench.oracle import Server

PEERS = ROOT / "bench" / "peers"
HEADING = "## Side by side with Apache Omid on one HBase (bench/peers.py)"
BOTH_HEADING = ("## Side by side with Apache Omid, redone at 10 ms and 1 ms with {clients} "
                "uncontended client processes (issue 47)")
"""The section of a run at both batch timeouts (the default)."""
VALUE = 100
ACCOUNTS = 20
BALANCE = 1000
JAVA_HEAP = "-Xmx512m"
TSO_CONFLICT_MAP = 1_000_000
"""Omid's default conflictMapSize (100 M entries) allocates ~1.6 GB at start."""
RAW_FAMILY, RAW_QUALIFIER = "d", "value"


class PeerError(RuntimeError):
    """A side could not be built, started or answered; the message says how."""


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
            last = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
            raise PeerError(f"mvn could not build {PEERS} (exit {result.returncode}):\n{last}")
        stamp.write_text(key)
    return os.pathsep.join([str(target / "classes"), cp_file.read_text().strip()])


def _jvm_command(heap: str, classpath: str, log: Path, main: str, *args: str) -> list[str]:
    from tests._hbase_local import JDK17_FLAGS, java, jvm_options

    return [java(), heap, "-XX:+UseG1GC", "-Djava.net.preferIPv4Stack=true", *JDK17_FLAGS,
            *jvm_options(),
            f"-Dhbase.log.file={log}",
            f"-Dlog4j.configurationFile=file:{log.parent}/log4j2.properties",
            "-cp", classpath, main, *args]


def java_harness(classpath: str, workdir: Path, name: str = "harness") -> LineClient:
    """``peers.Harness`` in a JVM of its own (its commands: its Javadoc)."""
    log = workdir / f"{name}.log"
    return LineClient(_jvm_command(JAVA_HEAP, classpath, log, "peers.Harness"), workdir, log,
                      f"the Java {name}")


def python_client(url: str, oracle: str, workdir: Path, name: str) -> LineClient:
    """This script's ``--client`` mode in a process of its own, on our store *url*."""
    log = workdir / f"{name}.log"
    return LineClient([sys.executable, "-P", str(Path(__file__).resolve()), "--client", url,
                       oracle], ROOT, log, f"our {name}",
                      env={**os.environ, "PYTHONPATH": str(ROOT)})


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
    conf = workdir / f"tso-{batch_timeout_ms}ms"
    conf.mkdir(exist_ok=True)
    port = _free_port()
    (conf / "omid-server-configuration.yml").write_text(tso_config(port, batch_timeout_ms))
    log = workdir / f"tso-{batch_timeout_ms}ms.log"
    proc = spawn(_jvm_command(JAVA_HEAP, f"{conf}{os.pathsep}{classpath}", log,
                               "org.apache.omid.tso.TSOServer"), workdir, log,
                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return proc, port
        if proc.poll() is not None or time.monotonic() > deadline:
            kill(proc)
            raise PeerError(f"Omid's TSO did not start ({proc.returncode}); {log}:\n{tail(log)}")
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


def account(i: int) -> bytes:
    return b"acct%03d" % i


def transfers(cluster: percolator.Cluster, accounts: int, threads: int, seconds: float,
              seed: int = 0) -> dict[str, float]:
    """Transfers between random accounts of the bank table from *threads* threads for
    *seconds*: each reads both balances and writes both. Committed and aborted counts."""
    import percolator

    committed, aborted, failed = Counter[int](), Counter[int](), []
    deadline = time.monotonic() + seconds

    def worker(k: int) -> None:
        rnd = random.Random(seed * 1000 + k)
        try:
            while time.monotonic() < deadline:
                a = rnd.randrange(accounts)
                b = (a + 1 + rnd.randrange(accounts - 1)) % accounts
                amount = 1 + rnd.randrange(10)
                try:
                    with percolator.Transaction(cluster) as txn:
                        va = int(txn.get("bank", account(a), "c:balance") or b"0")
                        vb = int(txn.get("bank", account(b), "c:balance") or b"0")
                        txn.set("bank", account(a), "c:balance", str(va - amount).encode())
                        txn.set("bank", account(b), "c:balance", str(vb + amount).encode())
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


class PythonSide:
    """Our store's raw calls and our transactions on the same HBase, through its
    Thrift2 server (or its Thrift1 server, ``--api thrift1``)."""

    def __init__(self, url: str, oracle: str, api: str, rows: int) -> None:
        import percolator

        self.api = "Thrift2" if api == "thrift2" else "Thrift1"
        self.cluster = percolator.connect(url, oracle=oracle)
        internals(self.cluster).store.create_table("raw", {RAW_FAMILY: 1})
        self.cluster.create_table("data")
        self.cluster.create_table("bank")
        self.rows = [b"row%06d" % i for i in range(rows)]
        self._seq = 0
        # Raw cells at explicit timestamps, newer in every run on the same HBase.
        self._ts = itertools.count(time.time_ns() // 1000)
        internals(self.cluster).store.mutate_rows("raw", [
            Mutation(row, [(f"{RAW_FAMILY}:{RAW_QUALIFIER}", next(self._ts), self.value())])
            for row in self.rows])
        with percolator.Transaction(self.cluster) as txn:
            for row in self.rows:
                txn.set("data", row, "c:value", self.value())

    def value(self) -> bytes:
        self._seq += 1
        return bytes([97 + self._seq % 26]) * VALUE

    def row(self) -> bytes:
        return random.choice(self.rows)

    def timestamp(self) -> None:
        internals(self.cluster).timestamps.get_timestamp()

    def raw_put(self) -> None:
        internals(self.cluster).store.mutate_rows("raw", [Mutation(
            self.row(), [(f"{RAW_FAMILY}:{RAW_QUALIFIER}", next(self._ts), self.value())])])

    def raw_get(self) -> None:
        row = self.row()
        if not internals(self.cluster).store.read_rows(
                "raw", [row], [Read(RAW_FAMILY, (RAW_QUALIFIER,))]).get(row):
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

    def count_round_trips(self, op: Callable[[], None], n: int) -> str:
        """Thrift round trips (each call the store makes on a Thrift connection), the
        store calls they serve, and oracle calls, per *op*: counted over *n* untimed
        runs by proxies round the store and the timestamp source, and round the store's
        one gateway to Thrift (``_call``; on Thrift1 a ``check_and_set`` that carries
        puts is two)."""
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
        return f"{self.api} {thrift:g}{f' ({calls})' if calls else ''}, oracle {oracle:g}"

    def bank_init(self, accounts: int) -> None:
        import percolator

        with percolator.Transaction(self.cluster) as txn:
            for i in range(accounts):
                txn.set("bank", account(i), "c:balance", str(BALANCE).encode())

    def bank(self, accounts: int, threads: int, seconds: float) -> dict[str, float]:
        return transfers(self.cluster, accounts, threads, seconds)

    def bank_total(self, accounts: int) -> int:
        import percolator

        with percolator.Transaction(self.cluster) as txn:
            found = txn.get_rows("bank", [account(i) for i in range(accounts)], ["c:balance"])
            return sum(int(found[account(i)].get("c:balance") or b"0")
                       for i in range(accounts))

    def close(self) -> None:
        """Drop this run's tables (an HBase of your own keeps no litter) and close."""
        with contextlib.suppress(Exception):  # a failed run's cleanup must not mask it
            for table in ("data", "bank"):
                self.cluster.drop_table(table)
            internals(self.cluster).store.drop_table("raw")
        self.cluster.close()


def client_main(url: str, oracle: str) -> int:
    """``--client URL ORACLE``: one of our client processes of the uncontended run,
    speaking the Java harness's line protocol for the command they share, ``bank
    ACCOUNTS THREADS SECONDS`` (and ``quit``)."""
    import percolator

    def handle(words: list[str]) -> dict[str, Any]:
        if words[0] != "bank":
            raise ValueError(f"unknown command {words[0]}")
        return {**transfers(cluster, int(words[1]), int(words[2]), float(words[3]),
                            seed=os.getpid())}

    with percolator.connect(url, oracle=oracle) as cluster:
        serve_lines(handle)
    return 0


# -- the run ----------------------------------------------------------------------------

JAVA_OPS = {"Omid timestamp (TSO begin)": "omid_begin",
            "Java raw put": "raw_put", "Java raw get": "raw_get",
            "Omid single-cell txn": "omid_write", "Omid read-only txn": "omid_read",
            "Omid transfer txn": "omid_transfer"}
PAIRS = {"single-cell txn": ("Omid single-cell txn", "ours single-cell txn"),
         "read-only txn": ("Omid read-only txn", "ours read-only txn"),
         "transfer txn": ("Omid transfer txn", "ours transfer txn")}
"""The operations both sides run, for the summary: (Omid's, ours)."""


def operations(api: str) -> dict[str, tuple[str, str]]:
    """Every operation measured, with its side and the raw operation its ratio is
    taken to (our raw calls are named by the Thrift server our store speaks)."""
    raw = "Thrift2" if api == "thrift2" else "Thrift1"
    return {
        "Omid timestamp (TSO begin)": ("omid", ""),
        "Java raw put": ("omid", ""),
        "Java raw get": ("omid", ""),
        "Omid single-cell txn": ("omid", "Java raw put"),
        "Omid read-only txn": ("omid", "Java raw get"),
        "Omid transfer txn": ("omid", "Java raw put"),
        "ours timestamp (oracle)": ("ours", ""),
        f"{raw} raw put": ("ours", ""),
        f"{raw} raw get": ("ours", ""),
        "ours single-cell txn": ("ours", f"{raw} raw put"),
        "ours read-only txn": ("ours", f"{raw} raw get"),
        "ours transfer txn": ("ours", f"{raw} raw put"),
    }


class Run:
    """The measurements at one batch timeout, and the processes whose CPU they charge."""

    def __init__(self, batch_timeout_ms: int, procs: dict[str, int]) -> None:
        self.batch_timeout_ms = batch_timeout_ms
        self.procs = procs
        self.seconds: dict[str, list[float]] = defaultdict(list)  # per round
        self.cpu: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.ops_done: Counter[str] = Counter()
        self.trips: dict[str, str] = {}
        self.idle: dict[str, float] = {}  # CPU seconds per second with nothing to do
        self.banks: dict[str, dict[str, Any]] = {}
        self.uncontended: dict[str, dict[str, Any]] = {}

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


def measure(args: argparse.Namespace, run: Run, java: LineClient, py: PythonSide) -> None:
    """Every operation in alternating chunks, a warm-up round first."""
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

    names = operations(args.api)
    py_ops = dict(zip([name for name, (side, _) in names.items() if side == "ours"],
                      (py.timestamp, py.raw_put, py.raw_get, py.write, py.read, py.transfer),
                      strict=True))
    fns = {**{k: java_op(v) for k, v in JAVA_OPS.items()},
           **{k: py_op(v) for k, v in py_ops.items()}}
    run.measure_idle(args.idle_seconds)
    # Round 0 warms both sides up (JIT, connections, region locations, caches) and is
    # not counted.
    for rnd in range(args.rounds + 1):
        per_round: dict[str, float] = defaultdict(float)
        for first in range(0, args.ops, args.chunk):
            n = min(args.chunk, args.ops - first)
            for name in names:
                per_round[name] += run.chunk(name, fns[name], n, counted=rnd > 0)
        if rnd > 0:
            for name in names:
                run.seconds[name].append(per_round[name])
    for name, op in JAVA_OPS.items():
        rpcs, tso = java_trips[op]
        run.trips[name] = f"HBase RPC {rpcs:g}, TSO {tso:g}"
    for name, fn in py_ops.items():
        run.trips[name] = py.count_round_trips(fn, args.trip_ops)


def bank(args: argparse.Namespace, java: LineClient, py: PythonSide) -> dict[str, dict[str, Any]]:
    """The contended bank, each side in one client process of ``--threads`` threads."""
    java.call("bank_init", ACCOUNTS, BALANCE)
    omid = _checked("Omid's bank", java.call("bank", ACCOUNTS, args.threads, args.bank_seconds))
    omid["total"] = java.call("bank_total", ACCOUNTS)["total"]
    py.bank_init(ACCOUNTS)
    ours = py.bank(ACCOUNTS, args.threads, args.bank_seconds)
    ours["total"] = py.bank_total(ACCOUNTS)
    return {"Omid": omid, "ours": ours}


def _checked(what: str, answer: dict[str, Any]) -> dict[str, Any]:
    if answer.get("failed_threads"):
        raise PeerError(f"{what}: {answer['failed_threads']} threads failed (see the "
                        "harness's log)")
    return answer


def _together(clients: Sequence[LineClient], args: argparse.Namespace) -> dict[str, Any]:
    """Uncontended transfers from every client process at once, one thread each: a
    warm-up of ``--warmup-seconds`` (not counted), then ``--bank-seconds``. The rate
    is the sum of the processes' own rates."""
    for seconds in (args.warmup_seconds, args.bank_seconds):
        for c in clients:
            c.send("bank", args.accounts, 1, seconds)
        answers = [_checked(c.what, c.answer()) for c in clients]
    return {"committed": sum(a["committed"] for a in answers),
            "aborted": sum(a["aborted"] for a in answers),
            "seconds": max(a["seconds"] for a in answers),
            "rate": sum(a["committed"] / a["seconds"] for a in answers)}


@contextlib.contextmanager
def _clients(start: Callable[[int], LineClient], n: int) -> Iterator[list[LineClient]]:
    """*n* client processes, all started before any is waited for; stopped after."""
    clients: list[LineClient] = []
    try:
        clients = [start(i) for i in range(n)]
        yield [c.ready() for c in clients]
    finally:
        for c in clients:
            c.stop()


def uncontended(args: argparse.Namespace, session: Session, tso_port: int
                ) -> dict[str, dict[str, Any]]:
    """Uncontended transfers over ``--accounts`` (1,000): ``--clients`` client processes each
    side, then, for the record, as many threads in one client process each side.
    Each bank's total is read after its side's runs."""
    java, py, n = session.java, session.py, args.clients
    found: dict[str, dict[str, Any]] = {}
    java.call("bank_init", args.accounts, BALANCE)
    with _clients(lambda i: java_harness(session.classpath, session.workdir,
                                         f"omid-client{i}"), n) as clients:
        for c in clients:
            c.call("setup", "peers", args.rows)
            c.call("connect", f"127.0.0.1:{tso_port}")
        found[f"Omid, {n} client processes (JVMs)"] = _together(clients, args)
        session.client_pids += [c.pid for c in clients]
        for c in clients:
            c.call("disconnect")
    _progress(f"Omid's {n} client processes run")
    found[f"Omid, {n} threads in one JVM"] = _checked("Omid's bank", java.call(
        "bank", args.accounts, n, args.bank_seconds))
    omid_total = java.call("bank_total", args.accounts)["total"]
    _progress(f"Omid's {n} threads run")
    py.bank_init(args.accounts)
    with _clients(lambda i: python_client(session.url, session.oracle_url, session.workdir,
                                          f"our-client{i}"), n) as clients:
        found[f"ours, {n} client processes (Python)"] = _together(clients, args)
        session.client_pids += [c.pid for c in clients]
    _progress(f"our {n} client processes run")
    found[f"ours, {n} threads in one process"] = py.bank(args.accounts, n,
                                                           args.bank_seconds)
    ours_total = py.bank_total(args.accounts)
    for name, result in found.items():
        result.setdefault("rate", result["committed"] / result["seconds"])
        result["total"] = omid_total if name.startswith("Omid") else ours_total
    return found


def heading(args: argparse.Namespace) -> str:
    """The section's heading: the issue-47 section for a run at 10 and 1 ms, else one
    per batch timeout (or set of them), so that each can stand."""
    timeouts = args.batch_timeout_ms
    if sorted(timeouts) == [1, 10]:
        return BOTH_HEADING.format(clients=args.clients)
    which = " and ".join(map(str, timeouts))
    plural = "s" if len(timeouts) > 1 else ""
    return HEADING.replace("HBase", f"HBase, TSO batch timeout{plural} {which} ms")


def _bank_rate(result: dict[str, Any]) -> float:
    return float(result["committed"] / result["seconds"])


def _loose_rate(run: Run, side: str, kind: str) -> float:
    """The uncontended rate of *side*'s clients of *kind* (processes, or threads)."""
    return float(next(v["rate"] for k, v in run.uncontended.items()
                      if k.startswith(side) and kind in k))


def _rate(run: Run, args: argparse.Namespace, name: str) -> float:
    return float(statistics.median(args.ops / s for s in run.seconds[name]))


def report(args: argparse.Namespace, runs: Sequence[Run], command: str,
           servers: HBaseServers, load: Sequence[float] = ()) -> list[str]:
    """The section: a summary of both sides' committed transactions/s at every batch
    timeout, then each timeout's tables."""
    raw = "Thrift2" if args.api == "thrift2" else "Thrift1"
    n = args.clients
    lines = header(
        heading(args), command, f"commit {head_commit()}",
        *([f"load average (1 min) at start and end: {load[0]:.1f}, {load[1]:.1f}"]
          if load else []),
        f"{servers.described}; same run, Omid's TSO started for each batch timeout in "
        f"turn (the previous one stopped), our oracle and both sides' tables kept",
        f"Omid 1.1.3 (omid-tso-server, omid-hbase-client, omid-hbase-tools from Maven Central, "
        f"HBase client 2.6.1), Java 17, clients and TSO {JAVA_HEAP}; TSO: timestamps and "
        f"commits in HBase (OMID_TIMESTAMP_TABLE, OMID_COMMIT_TABLE by OmidTableManager), "
        f"conflictMapSize {TSO_CONFLICT_MAP:,}, batchPersistTimeoutInMs as headed, "
        f"waitStrategy LOW_CPU, lowLatency false; client: postCommitMode SYNC (shadow cells "
        f"written before commit returns), conflict detection CELL; data tables VERSIONS => "
        f"2147483647",
        f"ours: percolator-txn over HBase's {raw} server (the store's api="
        f"{args.api}), timestamps from `python -m oracle` (gRPC); CPython "
        f"{sys.version.split()[0]}",
        f"operations: alternating chunks of {args.chunk} ops, {args.rounds} rounds of "
        f"{args.ops} ops each after one uncounted warm-up round; {args.rows} rows of "
        f"{VALUE}-byte values each side; round trips counted over {args.trip_ops} more",
        f"uncontended: {args.accounts:,} accounts of {BALANCE}, {n} client processes "
        f"each side, one thread each ({n} JVMs of the harness, each with its own HBase and "
        f"TSO connections; {n} Python processes, each with its own store connections and "
        f"oracle channel), {args.warmup_seconds:g} s of warm-up then {args.bank_seconds:g} "
        f"s; then {n} threads in one client process each side for the record (a Python "
        "process runs one thread at a time; a JVM's threads share its TSO connection, "
        "whose requests the TSO batches)",
    )
    rows: list[tuple[str, list[tuple[float, float]]]] = [
        (f"{label}, one client", [(_rate(r, args, omid), _rate(r, args, ours)) for r in runs])
        for label, (omid, ours) in PAIRS.items()]
    rows.append((f"contended bank ({ACCOUNTS} accounts, {args.threads} threads in one client)",
                 [(_bank_rate(r.banks["Omid"]), _bank_rate(r.banks["ours"])) for r in runs]))
    for kind, label in ((f"{n} client processes", f"{n} client processes"),
                        (f"{n} threads in one", f"{n} threads in one client process")):
        rows.append((f"uncontended, {label} ({args.accounts:,} accounts)",
                     [(_loose_rate(r, "Omid", kind), _loose_rate(r, "ours", kind))
                      for r in runs]))
    lines += ["", "Committed transactions/s, ours against Omid's:", "",
              "| transactions | " + " | ".join(
                  f"{r.batch_timeout_ms} ms: Omid | ours | ours / Omid" for r in runs) + " |",
              "|---|" + "---:|---:|---:|" * len(runs)]
    for label, values in rows:
        lines.append(f"| {label} | " + " | ".join(
            f"{o:,.0f} | {u:,.0f} | " + (f"{u / o:.2f}" if o else "-") for o, u in values) + " |")
    for run in runs:
        lines += ["", *_timeout_tables(args, run)]
    return lines


def _timeout_tables(args: argparse.Namespace, run: Run) -> list[str]:
    def ratio(name: str, base: str) -> float:
        pairs = zip(run.seconds[name], run.seconds[base], strict=True)
        return float(statistics.median(b / s for s, b in pairs))

    groups = {"client": ("java client", "python client"), "TSO/oracle": ("tso", "oracle"),
              "HBase": ("hbase",), "Thrift": ("thrift",)}
    idle = ", ".join(f"{p} {run.idle.get(p, 0.0) * 1e3:.0f}" for p in run.procs)
    lines = [f"### TSO batch timeout {run.batch_timeout_ms} ms", "",
             f"CPU is charged net of each process's idle CPU (ms per second, measured for "
             f"{args.idle_seconds:g} s before the warm-up: {idle}); the Thrift column is the "
             f"server our side speaks to.", "",
             "| operation | ops/s (median of rounds) | ratio to own raw | round trips per op "
             "| CPU ms/op: client | TSO/oracle | HBase | Thrift |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    for name, (_, base) in operations(args.api).items():
        done = run.ops_done[name]
        cpu = [f"{sum(run.cpu[name][p] for p in procs if p in run.procs) / done * 1e3:.2f}"
               if any(p in run.procs for p in procs) else "-" for procs in groups.values()]
        r = f"{ratio(name, base):.2f}" if base else ""
        lines.append(f"| {name} | {_rate(run, args, name):,.0f} | {r} | {run.trips[name]} | "
                     + " | ".join(cpu) + " |")
    lines += ["", f"Contended bank: {ACCOUNTS} accounts of {BALANCE}, {args.threads} threads "
              f"in one client process, {args.bank_seconds:g} s each side, transfers read both "
              "rows and write both.", "",
              "| side | committed/s | abort rate | total after (expected) |",
              "|---|---:|---:|---:|"]
    lines += [_bank_row(side, _bank_rate(b), b, ACCOUNTS)
              for side, b in run.banks.items()]
    lines += ["", f"Uncontended: {args.accounts:,} accounts, the same transfers.", "",
              "| clients | committed/s | abort rate | total after (expected) |",
              "|---|---:|---:|---:|"]
    lines += [_bank_row(name, b["rate"], b, args.accounts)
              for name, b in run.uncontended.items()]
    return lines


def _bank_row(name: str, rate: float, bank: dict[str, Any], accounts: int) -> str:
    """One bank run's row: committed/s, abort rate, and its total against the expected."""
    tried = bank["committed"] + bank["aborted"]
    return (f"| {name} | {rate:,.0f} | {bank['aborted'] / max(tried, 1):.1%} | "
            f"{bank['total']} ({accounts * BALANCE}) |")


def broken_totals(args: argparse.Namespace, runs: Sequence[Run]) -> list[str]:
    """Every bank whose total after the run is not the one it started with."""
    bad = [f"{r.batch_timeout_ms} ms, contended, {side}" for r in runs
           for side, b in r.banks.items() if b["total"] != ACCOUNTS * BALANCE]
    return bad + [f"{r.batch_timeout_ms} ms, uncontended, {name}" for r in runs
                  for name, b in r.uncontended.items()
                  if b["total"] != args.accounts * BALANCE]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=200, help="operations per op per round")
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8, help="threads of the contended bank")
    parser.add_argument("--clients", type=int, default=8,
                        help="client processes each side of the uncontended run")
    parser.add_argument("--accounts", type=int, default=1000,
                        help="accounts of the uncontended run (the contended bank has 20)")
    parser.add_argument("--bank-seconds", type=float, default=10.0,
                        help="how long each bank run is measured")
    parser.add_argument("--warmup-seconds", type=float, default=5.0,
                        help="uncounted transfers of the uncontended run's client processes "
                             "before the measured ones")
    parser.add_argument("--batch-timeout-ms", default="10,1",
                        help="Omid's batchPersistTimeoutInMs, comma-separated: every one in "
                             "turn, in one run (default 10,1; Omid's default is 10)")
    parser.add_argument("--api", choices=("thrift2", "thrift1"), default="thrift2",
                        help="the HBase server our store speaks to (default thrift2)")
    parser.add_argument("--rows", type=int, default=1000, help="rows each side reads and writes")
    parser.add_argument("--trip-ops", type=int, default=100,
                        help="untimed runs of each of our operations that count its round trips")
    parser.add_argument("--idle-seconds", type=float, default=5.0,
                        help="how long each process's idle CPU is measured, to charge "
                             "chunks net of it")
    parser.add_argument("--write", action="store_true", help="put the section in BENCHMARKS.md")
    args = parser.parse_args(argv)
    try:
        args.batch_timeout_ms = [int(t) for t in args.batch_timeout_ms.split(",")]
    except ValueError:
        parser.error(f"--batch-timeout-ms takes milliseconds, comma-separated: "
                     f"{args.batch_timeout_ms!r}")
    if min(args.batch_timeout_ms) < 1 or len(set(args.batch_timeout_ms)) < len(
            args.batch_timeout_ms):
        parser.error("--batch-timeout-ms: each at least 1, none twice")
    if args.accounts < 2:
        parser.error("--accounts must be at least 2 (a transfer moves money between two)")
    for name in ("ops", "chunk", "rounds", "threads", "clients", "trip_ops"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.rows < 2:
        parser.error("--rows must be at least 2 (a transfer reads two)")
    for name in ("bank_seconds", "idle_seconds", "warmup_seconds"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be more than 0")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:
        return client_main(argv[1], argv[2])
    args = parse_args(argv)
    command = ("python bench/peers.py " + " ".join(argv)).strip()
    load = [os.getloadavg()[0]]
    runs = []
    with session(args) as s:
        for timeout in args.batch_timeout_ms:
            runs.append(measure_at(args, s, timeout))
    load.append(os.getloadavg()[0])
    lines = report(args, runs, command, s.servers, load)
    publish(heading(args), lines, args.write)
    bad = broken_totals(args, runs)
    if bad:
        print(f"bank totals do not hold: {bad}", file=sys.stderr)
        return 1
    return 0


def measure_at(args: argparse.Namespace, s: Session, batch_timeout_ms: int) -> Run:
    """Everything measured at one batch timeout, with a TSO of its own."""
    with s.tso(batch_timeout_ms) as (run, port):
        measure(args, run, s.java, s.py)
        _progress(f"{batch_timeout_ms} ms: operations measured")
        run.banks = bank(args, s.java, s.py)
        _progress(f"{batch_timeout_ms} ms: contended banks run")
        run.uncontended = uncontended(args, s, port)
        _progress(f"{batch_timeout_ms} ms: uncontended transfers run")
    return run


@dataclass
class Session:
    """What a run starts once and keeps across batch timeouts: the HBase (or the one
    it was given), the Java harness, our oracle and our side."""

    args: argparse.Namespace
    workdir: Path
    servers: HBaseServers
    classpath: str
    java: LineClient
    oracle: Server
    py: PythonSide
    url: str
    loaded: bool = False
    client_pids: list[int] = field(default_factory=list)
    """The uncontended runs' client processes (each stopped after its run)."""

    @property
    def oracle_url(self) -> str:
        return f"grpc://{self.oracle.address}"

    @contextlib.contextmanager
    def tso(self, batch_timeout_ms: int) -> Iterator[tuple[Run, int]]:
        """Omid's TSO at *batch_timeout_ms*, the harness connected to it (and Omid's rows
        loaded, the first time); the harness disconnected and the TSO killed after."""
        proc, port = start_tso(self.classpath, self.workdir, batch_timeout_ms)
        _progress(f"TSO at {batch_timeout_ms} ms up")
        try:
            self.java.call("connect", f"127.0.0.1:{port}")
            if not self.loaded:
                self.java.call("load")
                self.loaded = True
            thrift = "thrift2" if self.args.api == "thrift2" else "thrift"
            procs = {"java client": self.java.pid, "python client": os.getpid(),
                     "tso": proc.pid, "oracle": self.oracle.process.pid,
                     **{name: self.servers.pids[key] for name, key in
                        (("hbase", "hbase"), ("thrift", thrift)) if key in self.servers.pids}}
            yield Run(batch_timeout_ms, procs), port
            self.java.call("disconnect")
        finally:
            kill(proc)


@contextlib.contextmanager
def session(args: argparse.Namespace, servers: HBaseServers | None = None
            ) -> Iterator[Session]:
    """The Java harness, our oracle and our side on the HBase of *servers*, or (None)
    on the one the environment names (``bench._common.hbase_servers_from_env``), or on
    a standalone HBase started here; all stopped (the JVMs killed) when the block
    ends, however it ends; an HBase started here is stopped too. The harness's,
    TSOs' and clients' logs are kept when the block fails."""
    workdir = Path(tempfile.mkdtemp(prefix="percolator-peers-"))
    try:
        with _started(args, servers, workdir) as started:
            yield started
    except BaseException:
        print(f"peers: the harness's and the TSO's logs are kept in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def _started(args: argparse.Namespace, servers: HBaseServers | None, workdir: Path
              ) -> Iterator[Session]:
    from bench.oracle import Server
    from tests._hbase_local import LocalHBase

    with contextlib.ExitStack() as stack:
        classpath = build_harness()
        _progress("harness built")
        servers = servers or hbase_servers_from_env(need_conf=True)
        if servers is None:
            own = LocalHBase()
            stack.callback(own.stop)
            own.start()
            servers = hbase_servers_of(own)
            _progress("HBase ready")
        # The Java processes find HBase (its ZooKeeper) through its hbase-site.xml.
        if servers.conf is None:
            raise PeerError("Omid's client needs the HBase's conf directory (hbase-site.xml)")
        log4j = servers.conf / "log4j2.properties"
        if log4j.exists():
            (workdir / "log4j2.properties").write_text(log4j.read_text())
        cp = f"{servers.conf}{os.pathsep}{classpath}"
        java = java_harness(cp, workdir)
        stack.callback(java.stop)
        java.ready()
        _progress("harness JVM up")
        java.call("setup", "peers", args.rows)  # Omid's tables first: the TSO reads them
        _progress("tables created")
        oracle = Server(["--state-file", str(workdir / "oracle.state")], str(workdir))
        stack.callback(oracle.kill)
        oracle.wait()
        hostport = servers.thrift2 if args.api == "thrift2" else servers.thrift1
        # Tables of this run's own: our oracle starts its timestamps afresh, below
        # those of an earlier run's commits on the same HBase.
        url = (f"hbase://{hostport}?table_prefix=peers_ours_{os.getpid()}_&pool_size=10"
               + ("&api=thrift2" if args.api == "thrift2" else ""))
        py = PythonSide(url, f"grpc://{oracle.address}", args.api, args.rows)
        _progress("oracle up, our tables loaded")
        stack.callback(py.close)
        yield Session(args, workdir, servers, cp, java, oracle, py, url)


if __name__ == "__main__":
    raise SystemExit(main())
