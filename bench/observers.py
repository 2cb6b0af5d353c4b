"""Observer benchmarks (issue 5): throughput per worker process, scan cost against
table size, commit-to-observer latency, and clumping of 2 processes x 8 threads.

    python bench/observers.py [--notifications 3000] [--big-rows 1000000] [--write]
    python bench/observers.py --metrics [--rounds 5] [--write]
    python bench/observers.py --backend bigtable [--backend hbase] [--backend hbase-real]
        [--processes 1,2,4]
        [--notifications 1000] [--rounds 5] [--write]

``--write`` replaces the section ``## Observers (bench/observers.py)`` of BENCHMARKS.md
(with ``--metrics``: ``## Metrics overhead (bench/observers.py --metrics)``; with
``--backend``: ``## Worker processes on the cluster stores (bench/observers.py
--backend)``).

``--backend`` measures how observer throughput grows with worker processes on a
cluster store (issue 15): the Copier drained by each count of ``--processes`` worker
processes on the Bigtable emulator, the HBase test server or (``hbase-real``) a
standalone HBase 2.6 (started here, as the suite does), against raw single-cell puts
per second on the same store in the same round, with the CPU of every process
involved, to tell whether the store server, the clients or the protocol is the limit.

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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import percolator  # noqa: E402
from bench._common import cpu_model, write_section  # noqa: E402
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
    Bigtable emulator or the HBase Thrift1 test server: notifications/s, and the CPU
    share of each worker process, of the store server and of this process (its
    completion checks) over the drain."""
    from bench.observers_remote import _cpu_seconds, _url
    from percolator.ext import wait_until_idle

    servers, hostport, stop = _start_store_server(backend)
    found: dict[int, list[dict[str, Any]]] = {}
    try:
        for r in range(rounds):
            for p in processes:
                url = _url(backend.removesuffix("-real"), hostport, f"curve{r}x{p}")
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
    how to stop it: the Bigtable emulator, the HBase Thrift test server, or
    (``hbase-real``) a standalone HBase 2.6 (its HBase and Thrift JVMs)."""
    if backend == "hbase-real" and os.environ.get("PERCOLATOR_HBASE_THRIFT"):
        # An HBase of the caller's (scripts/hbase): its CPU is not measured here.
        return [], os.environ["PERCOLATOR_HBASE_THRIFT"], lambda: None
    if backend == "hbase-real":
        from tests._hbase_local import LocalHBase

        hbase = LocalHBase().start()
        return [hbase.hbase, hbase.thrift], hbase.hostport, hbase.stop
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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--metrics", action="store_true",
                        help="only measure metrics on against off")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--notifications", type=int, default=3000)
    parser.add_argument("--big-rows", type=int, default=1_000_000)
    parser.add_argument("--latency-writes", type=int, default=200)
    parser.add_argument("--backend", action="append",
                        choices=("bigtable", "hbase", "hbase-real"),
                        help="only the worker-process curve on this cluster store "
                             "(repeatable)")
    parser.add_argument("--processes", default="1,2,4",
                        help="worker process counts for --backend (comma-separated)")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    if args.backend:
        counts = [int(x) for x in args.processes.split(",")]
        n = args.notifications if args.notifications != 3000 else 1000
        results = [remote_curve(b, counts, n, args.rounds) for b in args.backend]
        text = remote_report(results, "python bench/observers.py " + " ".join(
            [f"--backend {b}" for b in args.backend] +
            [f"--processes {args.processes}", f"--notifications {n}",
             f"--rounds {args.rounds}"]))
        print(text)
        if args.write:
            write_section(REMOTE_SECTION, text)
        return 0
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
