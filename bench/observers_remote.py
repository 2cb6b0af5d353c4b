"""Observers on the remote stores (issue 22): what finding pending notifications costs
against table size, what idle workers cost the store, and the demo pipeline's drain
rate and latency on the Bigtable emulator.

    python bench/observers_remote.py [--big-rows 100000] [--idle-seconds 30] [--write]
    python bench/observers_remote.py --drain-only --checkout DIR   # the same drain
        # measured on another checkout (e.g. the commit this work started from)

Starts its own ``cbtemulator`` and HBase Thrift1 test server (``tests/``), as the
suite does. ``--write`` replaces the section ``## Observers on remote stores
(bench/observers_remote.py)`` of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import percolator  # noqa: E402
from bench._common import cpu_model, write_section  # noqa: E402
from percolator.ext import (  # noqa: E402
    Mutation,
    Read,
    internals,
    write_entries,
)

SECTION = "## Observers on remote stores (bench/observers_remote.py)"
CLK_TCK = os.sysconf("SC_CLK_TCK")
_DRAINS = itertools.count()  # each drain on fresh tables


def _services() -> tuple[list[subprocess.Popen[bytes]], str, str]:
    from tests._bigtable import start_emulator
    from tests._hbase import start_test_server

    emu, emu_hostport = start_emulator()
    hb, hb_hostport = start_test_server()
    return [emu, hb], emu_hostport, hb_hostport


def _url(kind: str, hostport: str, name: str) -> str:
    """The store URL of *kind* on *hostport*: for ``hbase``, the Thrift2 data path when
    ``PERCOLATOR_HBASE_THRIFT2`` names that HBase's Thrift2 server (the default wherever
    the project starts HBase: docs/hbase.md), else Thrift1 on *hostport*."""
    if kind == "bigtable":
        return (f"bigtable://bench-project/bench-instance?emulator={hostport}"
                f"&table_prefix={name}_{os.getpid()}")
    thrift2 = os.environ.get("PERCOLATOR_HBASE_THRIFT2")
    if thrift2:
        return (f"hbase://{thrift2}?api=thrift2&table_prefix={name}_{os.getpid()}"
                "&pool_size=4")
    return f"hbase://{hostport}?table_prefix={name}_{os.getpid()}&pool_size=4"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def scan_cost(kind: str, hostport: str, big: int, dirty: int = 1000,
              repeats: int = 10) -> dict[str, float]:
    """What a worker pays to find *dirty* pending notifications in a table of *dirty*
    rows and of *big* rows: the lookout's read (the index on Bigtable, the notify
    family on HBase), and, for comparison, a notify-family scan on either."""
    from observers import Observer, Worker

    class Probe(Observer):
        table, column = "t", "c:x"

        def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
            pass

    result: dict[str, float] = {}
    for name, rows in (("small", dirty), ("big", big)):
        with percolator.connect(_url(kind, hostport, f"scan{name}")) as cluster:
            cluster.create_table("t")
            store = internals(cluster).store
            t0 = time.perf_counter()
            for i in range(0, rows, 5000):  # data + write cells, as if committed
                store.mutate_rows("t", [
                    Mutation(b"r%08d" % j, [("d:c:x", 5000, b"v" * 20),
                                            ("w:c:x", 6000, b"P" + bytes(8))])
                    for j in range(i, min(rows, i + 5000))])
            step = max(rows // dirty, 1)
            keys = [b"r%08d" % j for j in range(0, rows, step)][:dirty]
            store.mutate_rows("t", [Mutation(k, [("n:c:x", 6000, b"1")]) for k in keys])
            write_entries(cluster, [("t", k, "c:x") for k in keys], 6000)
            result[f"{name}_build_s"] = time.perf_counter() - t0
            worker = Worker(cluster, [Probe], threads=1)
            probe, family = [], []
            for _ in range(repeats):
                t1 = time.perf_counter()
                found = sum(1 for _ in worker._scanner.pending())
                probe.append(time.perf_counter() - t1)
                assert found == dirty, found
                t1 = time.perf_counter()
                found = sum(1 for _ in store.scan("t", None, None, [Read("n", versions=None)]))
                family.append(time.perf_counter() - t1)
                assert found == dirty, found
            result[name] = statistics.median(probe)
            result[f"{name}_family"] = statistics.median(family)
            for table in cluster.tables():
                cluster.drop_table(table)
    result["ratio"] = result["big"] / result["small"]
    result["family_ratio"] = result["big_family"] / result["small_family"]
    return result


def _worker_procs(url: str, n: int, threads: int, checkout: Path, tmp: str,
                  name: str) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(
        [sys.executable, "-m", "observers", "--cluster", url, "--observers",
         "observers.demo:OBSERVERS", "--threads", str(threads), "--log-level", "WARNING",
         "--stats-file", f"{tmp}/{name}{i}.json"],
        cwd=checkout, env=dict(os.environ, PYTHONPATH=str(checkout)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(n)]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(60)


def _preload(url: str, rows: int) -> None:
    """The demo's tables, ``documents`` holding *rows* rows already committed and
    processed (data and write cells, nothing pending), as a pipeline that has run."""
    with percolator.connect(url) as cluster:
        for table in ("documents", "clusters", "links"):
            cluster.create_table(table)
        for i in range(0, rows, 5000):
            internals(cluster).store.mutate_rows("documents", [
                Mutation(b"http://site/%08d" % j, [("d:raw:html", 5000, b"<html/>" * 20),
                                                   ("w:raw:html", 6000, b"P" + bytes(8))])
                for j in range(i, min(rows, i + 5000))])


def per_run_cost(hostport: str, emulator_pid: int, documents: int = 300) -> dict[str, float]:
    """The floor under the drain rate: store round trips per observer run of the demo
    (an in-process worker, counted by the store metrics), and the CPU one round trip
    costs the Python client and the emulator (2,000 single-row reads, measured from
    /proc)."""
    from observers import Worker, demo, wait_for_observers
    from percolator import metrics

    def calls() -> float:
        values, _ = metrics.snapshot()
        return sum(v for (name, _), v in values.items()
                   if name in ("percolator_store_requests_total",
                               "percolator_oracle_requests_total"))

    url = _url("bigtable", hostport, f"cost{next(_DRAINS)}")
    rng = random.Random(7)
    with percolator.connect(url) as cluster:
        for table in ("documents", "clusters", "links"):
            cluster.create_table(table)
        worker = Worker(cluster, demo.OBSERVERS, threads=1)
        worker.register()
        docs = demo.make_documents(documents, rng)
        with percolator.Transaction(cluster) as txn:
            for u, html in docs.items():
                txn.set("documents", u.encode(), "raw:html", html.encode())
        before = calls()
        with worker:
            wait_for_observers(cluster, 600)
        runs = worker.stats["committed"]
        round_trips = (calls() - before) / max(runs, 1)
        n = 2000
        read = [Read("w")]
        c0, e0 = time.process_time(), _cpu_seconds(emulator_pid)
        for i in range(n):
            internals(cluster).store.read_rows("documents", [b"http://site/%d" % (i % 50)], read)
        c1, e1 = time.process_time(), _cpu_seconds(emulator_pid)
    return {"runs": runs, "round_trips_per_run": round_trips,
            "client_ms_per_call": 1000 * (c1 - c0) / n,
            "emulator_ms_per_call": 1000 * (e1 - e0) / n}


def idle_cpu(hostport: str, emulator_pid: int, seconds: float, checkout: Path,
             tmp: str, rows: int) -> dict[str, float]:
    """CPU of the emulator process while 2 idle workers x 4 threads run on the demo's
    tables, ``documents`` holding *rows* processed rows (nothing pending), sampled
    from /proc over *seconds*."""
    url = _url("bigtable", hostport, f"idle{next(_DRAINS)}")
    _preload(url, rows)
    procs = _worker_procs(url, 2, 4, checkout, tmp, "idle")
    try:
        time.sleep(5)  # start-up: registration, migration
        c0, t0 = _cpu_seconds(emulator_pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = _cpu_seconds(emulator_pid), time.monotonic()
    finally:
        _stop(procs)
    return {"cpu_pct": 100 * (c1 - c0) / (t1 - t0), "seconds": t1 - t0}


def drain(hostport: str, checkout: Path, documents: int, changes: int,
          tmp: str, preload: int = 0) -> dict[str, float]:
    """The demo pipeline on the emulator with 2 workers x 4 threads of *checkout*:
    time to index *documents* loaded while they run (3 observer runs a document), then
    the p50/p95 from the commit of a change to its first observer's output being
    visible, over *changes* changes. ``documents`` first holds *preload* processed rows
    (the issue measured a pipeline at 2,800-22,800 rows)."""
    url = _url("bigtable", hostport, f"drain{next(_DRAINS)}")
    if preload:
        _preload(url, preload)
    out = subprocess.run(
        # -P: not bench/ first on sys.path (its observers.py would shadow the package)
        [sys.executable, "-P", str(ROOT / "bench" / "_drain_child.py"), url, str(documents),
         str(changes), str(checkout), tmp],
        cwd=checkout, env=dict(os.environ, PYTHONPATH=str(checkout)), check=True,
        capture_output=True, text=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    result["runs_per_s"] = 3 * result["documents"] / result["seconds"]
    return result


def report(args: argparse.Namespace, scans: dict[str, dict[str, float]],
           idle: dict[str, float] | None, drains: dict[str, list[dict[str, float]]],
           cost: dict[str, float] | None = None) -> str:
    lines = [
        SECTION, "",
        f"Machine: {os.cpu_count()} cores (nproc), {cpu_model()}, Python "
        f"{platform.python_version()}; shared with other jobs. Date: {time.strftime('%Y-%m-%d')}.",
        f"Command: `python bench/observers_remote.py --big-rows {args.big_rows} "
        f"--idle-seconds {args.idle_seconds} --write` (its own cbtemulator and HBase Thrift1 "
        "test server).", "",
        "| measure | result | target | ratio |",
        "|---|---|---|---|",
    ]
    for kind, scan in scans.items():
        how = "index scan" if kind == "bigtable" else "notify-family scan"
        lines.append(
            f"| {kind}: finding 1,000 pending notifications ({how}) in {args.big_rows:,} rows "
            f"vs in 1,000 rows | {1000 * scan['big']:.1f} ms vs {1000 * scan['small']:.1f} ms "
            f"| <= 2x | {scan['ratio']:.2f}x |")
        lines.append(
            f"| {kind}: notify-family scan, same tables (for comparison) | "
            f"{1000 * scan['big_family']:.1f} ms vs {1000 * scan['small_family']:.1f} ms | - | "
            f"{scan['family_ratio']:.2f}x |")
    if idle is not None:
        lines.append(
            f"| emulator CPU, 2 idle workers x 4 threads, {idle['seconds']:.0f} s, "
            f"{args.idle_rows:,} rows, none pending | "
            f"{idle['cpu_pct']:.1f}% of a core | <= 5% | {idle['cpu_pct'] / 5:.2f}x of target |")
        if "base_cpu_pct" in idle:
            lines.append(
                f"| the same at `{args.base}` | {idle['base_cpu_pct']:.1f}% of a core | - | "
                f"{idle['base_cpu_pct'] / max(idle['cpu_pct'], 0.01):.0f}x this |")
    if drains["this"] and drains["base"]:
        this = statistics.median(d["runs_per_s"] for d in drains["this"])
        base = statistics.median(d["runs_per_s"] for d in drains["base"])
        p50 = statistics.median(d["p50_ms"] for d in drains["this"])
        p50_base = statistics.median(d["p50_ms"] for d in drains["base"])
        lines += [
            f"| demo drain on the emulator, 2 workers x 4 threads, {args.documents} documents "
            f"into {args.drain_rows:,} processed rows "
            f"(observer runs/s, median of {len(drains['this'])} alternated) | {this:.0f} vs "
            f"{base:.0f} at `{args.base}` | >= 5x | {this / base:.2f}x |",
            f"| commit-to-observer-output latency p50, same runs | {p50:.0f} ms vs "
            f"{p50_base:.0f} ms | no worse | {p50 / p50_base:.2f}x |",
        ]
        busy = statistics.median(d["cpu_busy_cores"] for d in drains["this"])
        ms_per_run = statistics.median(
            1000 * d["cpu_busy_cores"] * d["seconds"] / (3 * d["documents"])
            for d in drains["this"])
        lines.append(
            f"| machine CPU during this checkout's drains (all processes: workers, loader, "
            f"emulator) | {busy:.2f} of {os.cpu_count()} cores busy, {ms_per_run:.1f} CPU-ms "
            "per observer run | - | - |")
    if cost is not None:
        per_call = cost["client_ms_per_call"] + cost["emulator_ms_per_call"]
        lines.append(
            f"| the floor: store and oracle round trips per demo observer run (one worker, "
            f"{cost['runs']:.0f} runs) x CPU per round trip (client "
            f"{cost['client_ms_per_call']:.2f} ms + emulator "
            f"{cost['emulator_ms_per_call']:.2f} ms, single-row reads) | "
            f"{cost['round_trips_per_run']:.1f} x {per_call:.2f} ms = "
            f"{cost['round_trips_per_run'] * per_call:.1f} CPU-ms per run: at most "
            f"{1000 * (os.cpu_count() or 1) / (cost['round_trips_per_run'] * per_call):.0f} "
            "runs/s on this machine from round trips alone | - | - |")
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--big-rows", type=int, default=100_000)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--kinds", default="bigtable,hbase")
    parser.add_argument("--idle-rows", type=int, default=20000,
                        help="processed rows in the idle workers' table")
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--drain-rows", type=int, default=0,
                        help="processed rows already in the documents table of each drain")
    parser.add_argument("--base", type=Path,
                        help="a checkout of the commit to compare the drain with")
    parser.add_argument("--rounds", type=int, default=2,
                        help="drains of each checkout, alternated")
    parser.add_argument("--per-run-cost", action="store_true",
                        help="measure store round trips per observer run and CPU per round trip")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    procs, emu, hb = _services()
    hostports = {"bigtable": emu, "hbase": hb}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-observers-remote-") as tmp:
            scans = {}
            for kind in [k for k in args.kinds.split(",") if k]:
                scans[kind] = scan_cost(kind, hostports[kind], args.big_rows)
                print(kind, scans[kind], flush=True)
            cost = None
            if args.per_run_cost:
                cost = per_run_cost(emu, procs[0].pid)
                print("per-run cost", cost, flush=True)
            idle = None
            if args.idle_seconds > 0:
                idle = idle_cpu(emu, procs[0].pid, args.idle_seconds, ROOT, tmp,
                                args.idle_rows)
                print("idle", idle, flush=True)
                if args.base is not None:
                    idle["base_cpu_pct"] = idle_cpu(emu, procs[0].pid, args.idle_seconds,
                                                    args.base, tmp, args.idle_rows)["cpu_pct"]
                    print("idle base", idle, flush=True)
            drains: dict[str, list[dict[str, float]]] = {"this": [], "base": []}
            for _ in range(args.rounds if args.documents > 0 else 0):
                for name, checkout in (("base", args.base), ("this", ROOT)):
                    if checkout is None:
                        continue
                    drains[name].append(drain(emu, checkout, args.documents, args.changes, tmp,
                                               args.drain_rows))
                    print("drain", name, drains[name][-1], flush=True)
    finally:
        _stop(procs)
    text = report(args, scans, idle, drains, cost)
    print(text)
    if args.write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
