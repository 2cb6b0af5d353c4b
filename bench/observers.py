"""Observer benchmarks (issue 5): throughput per worker process, scan cost against
table size, commit-to-observer latency, and clumping of 2 processes x 8 threads.

    python bench/observers.py [--notifications 3000] [--big-rows 1000000] [--write]
    python bench/observers.py --metrics [--rounds 5] [--write]
    python bench/observers.py --backend bigtable [--backend hbase]
        [--processes 1,2,4] [--notifications 1000] [--rounds 5] [--write]
    python bench/observers.py --backend hbase-real [--api thrift2|thrift1|both]
        [--processes 1,2,4] [--notifications 20000] [--rounds 1] [--no-trickle] [--write]

``--write`` replaces the section ``## Observers (bench/observers.py)`` of BENCHMARKS.md
(with ``--metrics``: ``## Metrics overhead (bench/observers.py --metrics)``; with
``--backend bigtable`` or ``hbase``: ``## Worker processes on the cluster stores
(bench/observers.py --backend)``; with ``--backend hbase-real`` and the default
``--processes``: ``## Observer drains on real HBase, 1, 2 and 4 worker processes
(issue 47)``).

``--backend`` measures how observer throughput grows with worker processes on a
cluster store (issue 15): the Copier drained by each count of ``--processes`` worker
processes on the Bigtable emulator or the HBase Thrift1 test server, against raw
single-cell puts per second on the same store in the same round, with the CPU of every
process involved, to tell whether the store server, the clients or the protocol is the
limit.

``--backend hbase-real`` does the same on a real HBase (issue 47): the one
``PERCOLATOR_HBASE_THRIFT`` and ``PERCOLATOR_HBASE_THRIFT2`` name (``scripts/hbase``'s;
with ``PERCOLATOR_HBASE_CONF``, its conf directory, HBase's own JVM is found and its
CPU measured too), or a standalone HBase started here. The store speaks Thrift2, its
default (``--api``). A backlog of ``--notifications`` is loaded before any worker
runs; the worker processes start together and are timed to the last observer commit;
their own store calls (``percolator_store_requests_total``) are counted per
notification, by operation. Then, on the same HBase, the trickle of
``bench/per_notification.py --trickle`` (one worker, a writer committing one change at
a time), whose store calls per notification and commit-to-observer latency go in the
same section.

``--metrics`` measures what recording metrics costs (issue 20): single-thread worker
throughput with metrics on (recording, an endpoint served and scraped every second)
and off (recording switched off, the store unwrapped), alternating on and off for
``--rounds`` rounds in one run; the ratio is of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import percolator  # noqa: E402
from bench._common import (  # noqa: E402
    HBaseServers,
    cpu_model,
    hbase_servers_from_env,
    hbase_servers_of,
    write_section,
)
from observers import Observer, Worker, wait_for_observers  # noqa: E402
from percolator import TransactionBase  # noqa: E402
from percolator.ext import (  # noqa: E402
    Mutation,
    Read,
    internals,
)

SECTION = "## Observers (bench/observers.py)"


class Copier(Observer):
    table, column = "bench", "in:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, "out:v", txn.get(self.table, row, column) or b"")


OBSERVERS = [Copier]


def load(cluster: percolator.Cluster, n: int, tag: bytes, per_txn: int = 100) -> None:
    for i in range(0, n, per_txn):
        with percolator.Transaction(cluster) as txn:
            for j in range(i, min(n, i + per_txn)):
                txn.set("bench", b"r%07d" % j, "in:v", tag + b"%d" % j)


def fresh(tmp: str, name: str) -> tuple[str, percolator.Cluster]:
    url = f"sqlite:///{tmp}/{name}.db"
    cluster = percolator.connect(url)
    cluster.create_table("bench")
    cluster.observe("bench", "in:v")
    return url, cluster


def throughput(tmp: str, n: int, threads: int) -> dict[str, float]:
    """Notifications drained per second by one worker (a process running a Worker)."""
    _, cluster = fresh(tmp, f"tp{threads}-{time.monotonic_ns()}")
    with cluster:
        load(cluster, n, b"a")
        worker = Worker(cluster, OBSERVERS, threads=threads)
        t0, cpu0 = time.perf_counter(), time.process_time()
        worker.start()
        while worker.stats["committed"] < n:
            time.sleep(0.01)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        wait_for_observers(cluster, 60)
        worker.stop()
    return {"threads": threads, "per_s": n / elapsed, "seconds": elapsed,
            "cpu_us": 1e6 * cpu / n}


def clumping(tmp: str, n: int) -> dict[str, float]:
    """2 worker processes x 8 threads draining n notifications."""
    url, cluster = fresh(tmp, "clump")
    with cluster:
        load(cluster, n, b"c")
        procs = [subprocess.Popen(
            [sys.executable, "-m", "observers", "--cluster", url, "--observers",
             "bench.observers:OBSERVERS", "--threads", "8", "--log-level", "WARNING",
             "--stats-file", f"{tmp}/clump{i}.json"], cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT))) for i in range(2)]
        t0 = time.perf_counter()
        try:
            wait_for_observers(cluster, 600)
            elapsed = time.perf_counter() - t0
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(60)
    stats = [json.loads(Path(f"{tmp}/clump{i}.json").read_text()) for i in range(2)]
    total = {k: sum(s.get(k, 0) for s in stats) for k in
             ("committed", "skipped", "conflicts", "meetings", "passes", "idle")}
    rows = total["committed"] + total["skipped"]
    return {**total, "seconds": elapsed, "per_s": n / elapsed,
            "meetings_per_1000_rows": 1000 * total["meetings"] / max(rows, 1),
            "duplicate_pct": 100 * (total["skipped"] + total["conflicts"]) / max(rows, 1)}


def scan_cost(tmp: str, big: int, dirty: int = 1000, repeats: int = 20) -> dict[str, float]:
    """Time to scan the notify family with *dirty* dirty cells, big table vs small."""
    result = {}
    for name, rows in (("small", dirty), ("big", big)):
        url = f"sqlite:///{tmp}/scan-{name}.db"
        with percolator.connect(url) as cluster:
            cluster.create_table("t")
            store = internals(cluster).store
            t0 = time.perf_counter()
            for i in range(0, rows, 20000):  # bulk: data + write cells, as if committed
                store.mutate_rows("t", [
                    Mutation(b"r%08d" % j, [("d:c:x", 5, b"v" * 20), ("w:c:x", 6, b"P" + bytes(8))])
                    for j in range(i, min(rows, i + 20000))])
            step = max(rows // dirty, 1)
            store.mutate_rows("t", [Mutation(b"r%08d" % j, [("n:c:x", 6, b"1")])
                                    for j in range(0, rows, step)][:dirty])
            build = time.perf_counter() - t0
        # measure on a fresh connection (as a worker would see it), after a checkpoint
        with percolator.connect(url) as cluster:
            store = internals(cluster).store
            times = []
            for _ in range(repeats):
                t1 = time.perf_counter()
                found = sum(1 for _ in store.scan("t", None, None, [Read("n", versions=None)]))
                times.append(time.perf_counter() - t1)
            assert found == dirty, found
            result[name] = statistics.median(times)
            result[f"{name}_build_s"] = build
    result["ratio"] = result["big"] / result["small"]
    return result


def latency(tmp: str, writes: int) -> dict[str, float]:
    """From a write's commit to its observer's commit, one write every ~20 ms, 4 threads."""
    from bench.scaling import commit_latency

    return commit_latency(tmp, writes, threads=4)


def report(args: argparse.Namespace, tp: list[dict[str, float]], clump: dict[str, float],
           scan: dict[str, float], lat: dict[str, float]) -> str:
    best = max(tp, key=lambda r: r["per_s"])
    lines = [
        SECTION, "",
        f"Machine: {os.cpu_count()} cores (nproc), {cpu_model()}, Python "
        f"{platform.python_version()}; shared with other jobs. Date: {time.strftime('%Y-%m-%d')}.",
        f"Command: `python bench/observers.py --notifications {args.notifications} "
        f"--big-rows {args.big_rows} --write` (embedded SQLite store; observer `Copier` reads "
        "one cell and writes one, plus its acknowledgement).", "",
        "| measure | result | target (paper / Fluo) | ratio |",
        "|---|---|---|---|",
    ]
    for r in tp:
        lines.append(f"| notifications/s, 1 worker process, {r['threads']:.0f} threads | "
                     f"{r['per_s']:.0f} | >= 1,000 per process (Fluo: ~165 per node) | "
                     f"{r['per_s'] / 1000:.2f}x |")
    lines += [
        f"| notifications/s, 2 processes x 8 threads (total) | {clump['per_s']:.0f} | - | - |",
        f"| notify scan, 1,000 dirty cells in {args.big_rows:,} rows vs in 1,000 rows | "
        f"{1000 * scan['big']:.1f} ms vs {1000 * scan['small']:.1f} ms | <= 2x | "
        f"{scan['ratio']:.2f}x |",
        f"| commit-to-observer-commit latency p50 | {lat['p50_ms']:.1f} ms | < 100 ms "
        f"(paper: ~2 s) | {lat['p50_ms'] / 100:.2f}x of target |",
        f"| commit-to-observer-commit latency p95 | {lat['p95_ms']:.1f} ms | - | - |", "",
        f"Clumping, 2 worker processes x 8 scanner threads draining {args.notifications} "
        f"notifications: {clump['meetings']:.0f} meetings (a scanner found another on its row "
        f"and jumped), {clump['meetings_per_1000_rows']:.1f} per 1,000 rows processed; "
        f"{clump['committed']:.0f} observer commits, {clump['skipped']:.0f} runs rejected by "
        f"the acknowledgement (the change was already processed) and {clump['conflicts']:.0f} "
        f"commit conflicts: {clump['duplicate_pct']:.1f}% duplicate work.", "",
        f"Best single-process rate: {best['per_s']:.0f}/s with {best['threads']:.0f} threads. "
        "On the embedded store a run holds the GIL for about three quarters of its time "
        "(perf, 2026-11-26), so threads of one process cannot overlap much; they take "
        "turns at the store work, and worker processes scale instead "
        "(`bench/scaling.py`). More threads pay off when observers wait on something "
        "other than the store.", "",
    ]
    return "\n".join(lines)


REMOTE_SECTION = "## Worker processes on the cluster stores (bench/observers.py --backend)"


def remote_curve(backend: str, processes: list[int], n: int, rounds: int) -> dict[str, Any]:
    """The Copier drained by 1, 2, 4... worker processes (default threads each) on the
    Bigtable emulator or the HBase Thrift1 test server (a real HBase:
    :func:`hbase_drains`): notifications/s, and the CPU
    share of each worker process, of the store server and of this process (its
    completion checks) over the drain."""
    from bench.observers_remote import _cpu_seconds, _url
    from percolator.ext import wait_until_idle
    from tests._hbase import hbase_store_url

    servers, hostport, stop = _start_store_server(backend)
    found: dict[int, list[dict[str, Any]]] = {}
    try:
        for r in range(rounds):
            for p in processes:
                # The test server's own URL: _url would pick a real HBase's Thrift2
                # server that PERCOLATOR_HBASE_THRIFT2 names.
                url = (_url(backend, hostport, f"curve{r}x{p}") if backend == "bigtable" else
                       hbase_store_url(hostport, f"curve{r}x{p}"))
                with percolator.connect(url) as cluster:
                    raw_puts = _raw_puts_per_s(cluster, n)
                    cluster.create_table("bench")
                    cluster.observe("bench", "in:v")
                    procs = [subprocess.Popen(
                        [sys.executable, "-m", "observers", "--cluster", url, "--observers",
                         "bench.observers:OBSERVERS", "--log-level", "WARNING"], cwd=ROOT,
                        env=dict(os.environ, PYTHONPATH=str(ROOT))) for _ in range(p)]
                    try:
                        time.sleep(4)  # started and idle
                        load(cluster, n, b"c", per_txn=n)
                        t0, own0 = time.perf_counter(), time.process_time()
                        cpu0 = [_cpu_seconds(x.pid) for x in procs]
                        srv0 = sum(_cpu_seconds(x.pid) for x in servers)
                        wait_until_idle(cluster, 600, poll=0.2)
                        elapsed = time.perf_counter() - t0
                        cpu = [_cpu_seconds(x.pid) - c for x, c in zip(procs, cpu0, strict=True)]
                        srv = sum(_cpu_seconds(x.pid) for x in servers) - srv0
                        own = time.process_time() - own0
                    finally:
                        for x in procs:
                            x.send_signal(signal.SIGTERM)
                        for x in procs:
                            x.wait(60)
                row = {"per_s": n / elapsed, "raw_puts_per_s": raw_puts,
                       "worker_cpu_pct": [100 * c / elapsed for c in cpu],
                       "server_cpu_pct": 100 * srv / elapsed, "bench_cpu_pct": 100 * own / elapsed}
                print(backend, p, row, flush=True)
                found.setdefault(p, []).append(row)
    finally:
        stop()
    return {"backend": backend, "n": n, "rounds": rounds, "by_processes": found}


def _start_store_server(backend: str) -> tuple[list[Any], str, Any]:
    """The store's server processes (their CPU is measured), its ``host:port``, and
    how to stop it: the Bigtable emulator or the HBase Thrift test server (a real
    HBase: :func:`hbase_drains`)."""
    if backend == "bigtable":
        from tests._bigtable import start_emulator as start
    else:
        from tests._hbase import start_test_server as start
    server, hostport = start()

    def stop() -> None:
        server.kill()
        server.wait()
    return [server], hostport, stop


def _raw_puts_per_s(cluster: percolator.Cluster, n: int) -> float:
    """Single-cell raw store puts per second, one call each, as the drain's baseline."""
    from percolator.ext import Mutation

    store = internals(cluster).store
    store.create_table("rawputs", {"c": 1})
    t0 = time.perf_counter()
    for i in range(n):
        store.mutate_rows("rawputs", [Mutation(b"row%06d" % i, puts=[("c:v", 1, b"v")])])
    rate = n / (time.perf_counter() - t0)
    store.drop_table("rawputs")  # not a percolator table: the drain's scans skip none
    return rate


def remote_report(results: list[dict[str, Any]], command: str) -> str:
    from bench._common import header

    cores = os.cpu_count() or 1
    lines = [*header(REMOTE_SECTION, command, "observer `Copier`; each worker process "
                     "with its default scanner threads (4 on remote stores); median of the "
                     "rounds; CPU as % of one core over the drain, measured from /proc"), "",
             "| store | worker processes | notifications/s | vs 1 process | raw puts/s "
             "(same round) | notifications / raw puts | CPU per worker "
             "process | store server CPU | bench process CPU | CPU ms per notification: "
             "workers + server | the machine's bound from CPU alone |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        rates = {p: statistics.median(r["per_s"] for r in rows)
                 for p, rows in result["by_processes"].items()}
        first = rates[min(rates)]
        for p, rows in result["by_processes"].items():
            worker = statistics.median(c for r in rows for c in r["worker_cpu_pct"])
            server = statistics.median(r["server_cpu_pct"] for r in rows)
            own = statistics.median(r["bench_cpu_pct"] for r in rows)
            raw = statistics.median(r["raw_puts_per_s"] for r in rows)
            ratio = statistics.median(r["per_s"] / r["raw_puts_per_s"] for r in rows)
            client_ms = 10 * worker * p / rates[p]
            server_ms = 10 * server / rates[p]
            bound = 1000 * cores / (client_ms + server_ms + 10 * own / rates[p])
            lines.append(f"| {result['backend']} | {p} | {rates[p]:,.0f} | "
                         f"{rates[p] / first:.2f}x | {raw:,.0f} | {ratio:.2f} | "
                         f"{worker:.0f}% | {server:.0f}% | "
                         f"{own:.0f}% | {client_ms:.1f} + {server_ms:.1f} | "
                         f"{bound:,.0f}/s |")
    lines += ["", "Reading: the last column is what this machine's cores could do if "
              "the workers, the store server and the completion checks were the only work "
              "and never waited; where the measured rate is well below it, the processes "
              "wait (round trips, or other jobs on the shared machine). Where client CPU "
              "per notification dominates the sum, the Python client (gRPC or Thrift "
              "marshalling, 11 round trips per run) is the limit; more worker processes "
              "cannot go past the bound."]
    return "\n".join([*lines, ""])


HBASE_SECTION = "## Observer drains on real HBase, 1, 2 and 4 worker processes (issue 47)"


def hbase_section(processes: list[int]) -> str:
    """The section of the real-HBase drains: issue 47's for 1, 2 and 4 processes."""
    if processes == [1, 2, 4]:
        return HBASE_SECTION
    return (f"## Observer drains on real HBase, {', '.join(map(str, processes))} worker "
            "processes (bench/observers.py --backend hbase-real)")


@contextmanager
def real_hbase() -> Iterator[HBaseServers]:
    """The HBase that ``PERCOLATOR_HBASE_THRIFT`` and ``PERCOLATOR_HBASE_THRIFT2`` name
    (``scripts/hbase``'s), or a standalone HBase with both servers started here."""
    servers = hbase_servers_from_env()
    if servers is not None:
        yield servers
        return
    from tests._hbase_local import LocalHBase

    with LocalHBase() as hbase:
        yield hbase_servers_of(hbase)


def hbase_url(servers: HBaseServers, api: str, name: str) -> str:
    """A store URL on *servers* over *api* (``thrift2``, the store's default, or
    ``thrift1``) whose tables no other run shares."""
    from tests._hbase import hbase_store_url

    return hbase_store_url(servers.thrift2 if api == "thrift2" else servers.thrift1, name,
                           api=api)


def drain_worker(url: str) -> int:
    """``--drain-worker URL``: one worker process of :func:`hbase_drain`, a ``Worker``
    of the Copier with its default scanner threads (4 on remote stores), speaking
    ``bench._common.LineClient``'s protocol: ``go`` starts it; ``stats`` answers its
    observer commits, this process's store calls by operation so far
    (``percolator_store_requests_total``), its observer runs that found their
    notification already served (by another process's scanner), and CPU seconds."""
    from bench._common import serve_lines
    from bench.per_notification import absent, calls

    def handle(words: list[str]) -> dict[str, Any]:
        if words[0] == "go":
            worker.start()
            return {"ok": True}
        if words[0] == "stats":
            return {"committed": worker.stats["committed"], "calls": calls(),
                    "absent": absent(), "cpu": time.process_time()}
        raise ValueError(f"unknown command {words[0]}")

    with percolator.connect(url) as cluster:
        worker = Worker(cluster, OBSERVERS)
        try:
            serve_lines(handle)
        finally:
            worker.stop()
    return 0


def hbase_drain(url: str, processes: int, n: int, raw_puts: int, servers: HBaseServers,
                api: str, workdir: Path, timeout: float = 3600.0) -> dict[str, Any]:
    """A backlog of *n* notifications of the Copier (:func:`_backlog`, before any
    worker runs) drained by *processes* worker processes started
    together (:func:`drain_worker`), timed from their ``go`` to the last observer
    commit; with the workers' store calls per notification by operation, the CPU of
    every worker and of HBase's JVM and the Thrift server in use, and raw single-cell
    puts per second on the same store just before (*raw_puts* of them)."""
    from bench._common import LineClient
    from bench.observers_remote import _cpu_seconds
    from percolator.ext import wait_until_idle

    with percolator.connect(url) as cluster:
        raw = _raw_puts_per_s(cluster, raw_puts)
        cluster.create_table("bench")
        cluster.observe("bench", "in:v")
        _backlog(cluster, n)
        workers = [LineClient([sys.executable, "-P", str(Path(__file__).resolve()),
                               "--drain-worker", url], ROOT, workdir / f"worker{i}.log",
                              f"worker process {i}", env={**os.environ, "PYTHONPATH": str(ROOT)})
                   for i in range(processes)]
        try:
            before = [w.ready().call("stats") for w in workers]
            server = {name: servers.pids[key] for name, key in
                      (("hbase", "hbase"), ("thrift", "thrift2" if api == "thrift2" else "thrift"))
                      if key in servers.pids}
            srv0 = {name: _cpu_seconds(pid) for name, pid in server.items()}
            t0 = time.perf_counter()
            for w in workers:
                w.send("go")
            for w in workers:
                w.answer()
            while True:
                after = [w.call("stats") for w in workers]
                if sum(a["committed"] for a in after) >= n:
                    break
                if time.perf_counter() - t0 > timeout:
                    raise SystemExit(f"the drain of {n} notifications by {processes} worker "
                                     f"processes did not end in {timeout:.0f} s")
                time.sleep(0.1)
            elapsed = time.perf_counter() - t0
            srv = {name: _cpu_seconds(pid) - srv0[name] for name, pid in server.items()}
        finally:
            for w in workers:
                w.stop(wait=60)
        # Checked, not timed: nothing left pending, every row copied.
        wait_until_idle(cluster, 600, poll=0.5)
        copied = sum(1 for _ in percolator.Snapshot(cluster).scan("bench", columns=["out:v"]))
        if copied != n:
            raise SystemExit(f"{copied} rows of {n} copied by the drain")
        cluster.drop_table("bench")
    calls: Counter[str] = Counter()
    for a, b in zip(after, before, strict=True):
        calls.update({op: v - b["calls"].get(op, 0) for op, v in a["calls"].items()})
    return {"per_s": n / elapsed, "raw_puts_per_s": raw, "seconds": elapsed,
            "calls": {op: v / n for op, v in calls.items() if v / n >= 0.005},
            "absent": sum(a["absent"] - b["absent"] for a, b in zip(after, before, strict=True))
            / n,
            "worker_cpu_pct": [100 * (a["cpu"] - b["cpu"]) / elapsed
                               for a, b in zip(after, before, strict=True)],
            "server_cpu_pct": {name: 100 * v / elapsed for name, v in srv.items()}}


def _backlog(cluster: percolator.Cluster, n: int, per_txn: int = 500, threads: int = 4) -> None:
    """*n* changes of the Copier's column, rows of their own, in transactions of
    *per_txn* committed by *threads* threads at once (their round trips overlap: 20,000
    took about a minute one transaction at a time on a loaded machine)."""
    from concurrent.futures import ThreadPoolExecutor

    def commit(first: int) -> None:
        with percolator.Transaction(cluster) as txn:
            for j in range(first, min(n, first + per_txn)):
                txn.set("bench", b"r%07d" % j, "in:v", b"c%d" % j)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(commit, range(0, n, per_txn)))


def hbase_drains(args: argparse.Namespace, processes: list[int], n: int) -> str:
    """The real-HBase section: for each ``--api``, the drains by every count of
    *processes*, ``--rounds`` times, then (unless ``--no-trickle``) the trickle of
    ``bench/per_notification.py --trickle`` on the same store."""
    from bench.per_notification import run as per_notification

    apis = ["thrift2", "thrift1"] if args.api == "both" else [args.api]
    drains: dict[str, dict[int, list[dict[str, Any]]]] = {api: {} for api in apis}
    trickles: dict[str, list[dict[str, float]]] = {api: [] for api in apis}
    load_start = os.getloadavg()
    with real_hbase() as servers, tempfile.TemporaryDirectory(prefix="bench-drains-") as tmp:
        for r in range(args.rounds):
            for api in apis:
                for p in processes:
                    url = hbase_url(servers, api, f"drain{r}x{p}")
                    row = hbase_drain(url, p, n, min(n, args.raw_puts), servers, api, Path(tmp))
                    print(api, p, row, flush=True)
                    drains[api].setdefault(p, []).append(row)
                if args.trickle:
                    url = hbase_url(servers, api, f"trickle{r}")
                    found = per_notification(ROOT, "trickle", url, args.trickle_notifications,
                                             0, 1, args.trickle_rate, 0.0)
                    print(api, "trickle", found, flush=True)
                    trickles[api].append(found)
    command = ("python bench/observers.py --backend hbase-real"
               + (f" --api {args.api}" if args.api != "thrift2" else "")
               + f" --processes {args.processes} --notifications {n} --rounds {args.rounds}"
               + (f" --raw-puts {args.raw_puts}" if args.raw_puts != RAW_PUTS else "")
               + ("" if args.trickle else " --no-trickle")
               + (f" --trickle-notifications {args.trickle_notifications}"
                  if args.trickle_notifications != 200 else "")
               + (f" --trickle-rate {args.trickle_rate:g}" if args.trickle_rate != 20 else ""))
    return hbase_report(processes, n, drains, trickles, servers, command, args,
                        (load_start[0], os.getloadavg()[0]))


def hbase_report(processes: list[int], n: int, drains: dict[str, dict[int, list[dict[str, Any]]]],
                 trickles: dict[str, list[dict[str, float]]], servers: HBaseServers,
                 command: str, args: argparse.Namespace, load: tuple[float, float]) -> str:
    from bench._common import head_commit, header

    cores = os.cpu_count() or 1
    rounds = args.rounds
    lines = [*header(
        hbase_section(processes), command, f"commit {head_commit()}",
        f"load average (1 min) at start and end: {load[0]:.1f}, {load[1]:.1f}",
        f"{servers.described}",
        f"observer `Copier` (reads one cell, writes one); {n:,} notifications loaded (500 "
        "changes a transaction, 4 at once) before the workers start; each worker process a "
        "`Worker` with its default scanner threads (4 on remote stores), all started together and "
        "timed to the last observer commit; store calls are the worker processes' own "
        "(`percolator_store_requests_total`), from their start to the end of the drain, "
        "per notification, timestamps apart (their `increment`s, the store's timestamp "
        f"counter) as issue 47 counts them, and all; absent runs: runs that found their "
        "notification served already (by another scanner), per notification; median of "
        f"{rounds} round(s); CPU as % "
        "of one core over the drain, from /proc; raw puts: single-cell puts on the same "
        "store just before, one store call each"), "",
        "| store API | worker processes | notifications/s | vs 1 process | raw puts/s "
        "| notifications / raw puts | store calls per notification, timestamps apart "
        "(all) | by operation | absent runs "
        "| CPU per worker process | HBase CPU | Thrift server CPU | CPU ms per notification: "
        "workers + HBase + Thrift | the machine's bound from CPU alone |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---:|"]

    def med(values: list[float]) -> float:
        return float(statistics.median(values)) if values else float("nan")

    for api, by_processes in drains.items():
        rates = {p: med([r["per_s"] for r in rows]) for p, rows in by_processes.items()}
        first = rates[min(rates)]
        for p, rows in by_processes.items():
            ops = sorted({op for r in rows for op in r["calls"]})
            by_op = {op: med([r["calls"].get(op, 0.0) for r in rows]) for op in ops}
            total = med([sum(r["calls"].values()) for r in rows])
            # Issue 47 counts calls timestamps apart: the increments are timestamp draws
            # (the store's counter; none with an oracle).
            apart = med([sum(v for op, v in r["calls"].items() if op != "increment")
                         for r in rows])
            worker = med([c for r in rows for c in r["worker_cpu_pct"]])
            hbase = med([r["server_cpu_pct"].get("hbase", float("nan")) for r in rows])
            thrift = med([r["server_cpu_pct"].get("thrift", float("nan")) for r in rows])
            ms = [10 * worker * p / rates[p], 10 * hbase / rates[p], 10 * thrift / rates[p]]
            known = [m for m in ms if m == m]  # nan: that server's CPU was not seen
            bound = 1000 * cores / sum(known) if known else float("nan")
            lines.append(
                f"| {api} | {p} | {rates[p]:,.0f} | {rates[p] / first:.2f}x | "
                f"{med([r['raw_puts_per_s'] for r in rows]):,.0f} | "
                f"{med([r['per_s'] / r['raw_puts_per_s'] for r in rows]):.2f} | "
                f"**{apart:.2f}** ({total:.2f}) | "
                f"{', '.join(f'{op} {v:.2f}' for op, v in by_op.items())} | "
                f"{med([r['absent'] for r in rows]):.2f} | {worker:.0f}% | {_pct(hbase)} | "
                f"{_pct(thrift)} | "
                + " + ".join("-" if m != m else f"{m:.1f}" for m in ms)
                + f" | {bound:,.0f}/s |")
    if any(trickles.values()):
        lines += ["", "At a trickle, on the same HBase (`bench/per_notification.py --trickle`'s "
                  f"measurement): one worker (4 scanner threads), a writer process committing "
                  f"{args.trickle_notifications} single changes at {args.trickle_rate:g}/s, "
                  "each to a row of its own; the worker's store calls per notification, and "
                  "the time from a change's commit returning in the writer to its observer's "
                  "commit returning in the worker.", "",
                  "| store API | round | store calls | by operation | absent runs | locks met "
                  "| latency median | p90 | client CPU |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
        extra = ("calls", "cpu_us", "absent", "locks_met", "median_ms", "p90_ms")
        for api, found in trickles.items():
            for i, t in enumerate(found, 1):
                named = ", ".join(f"{k} {v:.2f}" for k, v in sorted(t.items()) if k not in extra)
                lines.append(f"| {api} | {i} | **{t['calls']:.2f}** | {named} | {t['absent']:.2f} "
                             f"| {t['locks_met']:.2f} | {t['median_ms']:.0f} ms | "
                             f"{t['p90_ms']:.0f} ms | {t['cpu_us']:,.0f} us |")
    return "\n".join([*lines, ""])


def _pct(value: float) -> str:
    return "-" if value != value else f"{value:.0f}%"


RAW_PUTS = 1000
"""Raw puts measured before each real-HBase drain (their rate is the baseline)."""
METRICS_SECTION = "## Metrics overhead (bench/observers.py --metrics)"


def metrics_overhead(tmp: str, n: int, rounds: int) -> dict[str, Any]:
    import threading
    import urllib.request

    from percolator import metrics

    server = metrics.serve(0)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    stop = threading.Event()
    scrapes = [0]

    def scraper() -> None:
        while not stop.wait(1.0):
            if scraping.is_set():
                with urllib.request.urlopen(url, timeout=10) as r:
                    r.read()
                scrapes[0] += 1

    scraping = threading.Event()
    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    on: list[float] = []
    off: list[float] = []
    cpu_on: list[float] = []
    cpu_off: list[float] = []
    try:
        for i in range(rounds):
            for enabled in ((True, False) if i % 2 == 0 else (False, True)):
                metrics.set_enabled(enabled)
                (scraping.set if enabled else scraping.clear)()
                r = throughput(tmp, n, 1)
                (on if enabled else off).append(r["per_s"])
                (cpu_on if enabled else cpu_off).append(r["cpu_us"])
                print("metrics" if enabled else "no metrics", f"{r['per_s']:.0f}/s",
                      f"{r['cpu_us']:.0f} us CPU/notification", flush=True)
    finally:
        metrics.set_enabled(True)
        stop.set()
        thread.join()
        server.shutdown()
    return {"on": on, "off": off, "ratio": statistics.median(on) / statistics.median(off),
            "cpu_on": cpu_on, "cpu_off": cpu_off,
            "cpu_ratio": statistics.median(cpu_off) / statistics.median(cpu_on),
            "scrapes": scrapes[0]}


def metrics_report(args: argparse.Namespace, r: dict[str, Any]) -> str:
    ok = "meets" if r["cpu_ratio"] >= 0.95 else "misses"
    return "\n".join([
        METRICS_SECTION, "",
        f"Machine: {os.cpu_count()} cores (nproc), {cpu_model()}, Python "
        f"{platform.python_version()}; shared with other jobs. Date: {time.strftime('%Y-%m-%d')}.",
        f"Command: `python bench/observers.py --metrics --notifications {args.notifications} "
        f"--rounds {args.rounds} --write` (embedded SQLite store, 1 scanner thread, observer "
        "`Copier`; on: recording plus an endpoint scraped every second (Prometheus's default "
        "is 15 s); off: recording "
        "switched off and the store not wrapped; on and off alternate in one run).", "",
        "| metrics | notifications/s per round | median | CPU µs per notification "
        "per round | median |",
        "|---|---|---|---|---|",
        f"| on | {', '.join(f'{x:.0f}' for x in r['on'])} | {statistics.median(r['on']):.0f} "
        f"| {', '.join(f'{x:.0f}' for x in r['cpu_on'])} | "
        f"{statistics.median(r['cpu_on']):.0f} |",
        f"| off | {', '.join(f'{x:.0f}' for x in r['off'])} | "
        f"{statistics.median(r['off']):.0f} | {', '.join(f'{x:.0f}' for x in r['cpu_off'])} "
        f"| {statistics.median(r['cpu_off']):.0f} |", "",
        f"Throughput on/off, as CPU per notification off/on (the measure that the other "
        f"jobs on this shared machine disturb least): **{r['cpu_ratio']:.3f}x** ({ok} the "
        f"target >= 0.95x); as wall-clock notifications/s: {r['ratio']:.3f}x. "
        f"{r['scrapes']} scrapes during the runs with metrics on (their CPU is counted).", "",
    ])


def main() -> int:
    if sys.argv[1:2] == ["--drain-worker"]:
        return drain_worker(sys.argv[2])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--metrics", action="store_true",
                        help="only measure metrics on against off")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--notifications", type=int,
                        help="notifications per drain (default 3000; with --backend 1000, "
                             "with --backend hbase-real 20000)")
    parser.add_argument("--big-rows", type=int, default=1_000_000)
    parser.add_argument("--latency-writes", type=int, default=200)
    parser.add_argument("--backend", action="append",
                        choices=("bigtable", "hbase", "hbase-real"),
                        help="only the worker-process curve on this cluster store "
                             "(repeatable; hbase: the Thrift1 test server; hbase-real: a "
                             "real HBase, its own section)")
    parser.add_argument("--processes", default="1,2,4",
                        help="worker process counts for --backend (comma-separated)")
    parser.add_argument("--api", choices=("thrift2", "thrift1", "both"), default="thrift2",
                        help="--backend hbase-real: the store over HBase's Thrift2 server "
                             "(the default), its Thrift1 server, or both in turn")
    parser.add_argument("--raw-puts", type=int, default=RAW_PUTS,
                        help="--backend hbase-real: raw puts timed before each drain")
    parser.add_argument("--no-trickle", dest="trickle", action="store_false",
                        help="--backend hbase-real: skip the trickle after the drains")
    parser.add_argument("--trickle-notifications", type=int, default=200,
                        help="--backend hbase-real: changes of the trickle (default 200)")
    parser.add_argument("--trickle-rate", type=float, default=20.0,
                        help="--backend hbase-real: changes per second of the trickle")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    if min(args.rounds, args.raw_puts, args.trickle_notifications,
           args.notifications or 1) < 1 or args.trickle_rate <= 0:
        parser.error("--rounds, --notifications, --raw-puts, --trickle-notifications and "
                     "--trickle-rate must be at least 1 (more than 0 for the rate)")
    if args.backend:
        try:
            counts = [int(x) for x in args.processes.split(",")]
        except ValueError:
            parser.error(f"--processes takes counts, comma-separated: {args.processes!r}")
        if min(counts) < 1:
            parser.error("--processes: each at least 1")
        others = [b for b in args.backend if b != "hbase-real"]
        if others:
            n = args.notifications or 1000
            results = [remote_curve(b, counts, n, args.rounds) for b in others]
            text = remote_report(results, "python bench/observers.py " + " ".join(
                [f"--backend {b}" for b in others] +
                [f"--processes {args.processes}", f"--notifications {n}",
                 f"--rounds {args.rounds}"]))
            print(text)
            if args.write:
                write_section(REMOTE_SECTION, text)
        if "hbase-real" in args.backend:
            text = hbase_drains(args, counts, args.notifications or 20_000)
            print(text)
            if args.write:
                write_section(hbase_section(counts), text)
        return 0
    args.notifications = args.notifications or 3000
    if args.metrics:
        with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
            text = metrics_report(args, metrics_overhead(tmp, args.notifications, args.rounds))
        print(text)
        if args.write:
            write_section(METRICS_SECTION, text)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-observers-") as tmp:
        tp = [throughput(tmp, args.notifications, t) for t in (1, 4, 8)]
        print("throughput", tp, flush=True)
        clump = clumping(tmp, args.notifications)
        print("clumping", clump, flush=True)
        lat = latency(tmp, args.latency_writes)
        print("latency", lat, flush=True)
        scan = scan_cost(tmp, args.big_rows)
        print("scan", scan, flush=True)
    text = report(args, tp, clump, scan, lat)
    print(text)
    if args.write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
