"""Store calls and CPU per notification (issue 15): one worker thread running the plain
one-cell Copier of bench/observers.py, on the embedded store and on the Bigtable
emulator; store calls counted by operation (the store metrics), client CPU from
``time.process_time``.

    python bench/per_notification.py [--base CHECKOUT] [--threads N] [--notifications N]
        [--workers N] [--backend sqlite|bigtable|hbase] [--rounds N] [--write]
    python bench/per_notification.py --trickle [--rate 20] [--notifications N]
        [--poll-interval S ...] [--backend ...] [--threads N] [--base CHECKOUT]
        [--rounds N] [--write]

Drain mode (the default) loads a backlog of notifications, then starts the worker and
counts what it takes to serve them all. Trickle mode (``--trickle``, issue 47) starts
the worker first, lets it go idle, then has a writer process commit one change at a
time, ``--rate`` changes a second on a steady schedule, each to a row of its own: the
worker's store calls per notification then include what it spends finding work that
arrives one change at a time (idle scans, the lookout's looks, wake-ups), and each
change's latency is measured from its commit returning in the writer to its observer's
commit returning in the worker (wall clock; both processes on this host), reported as
median and 90th percentile. ``--poll-interval`` (repeatable: one row per value) sets
the worker's ``poll_interval``, the knob that trades the looks' scans for latency;
``--threads`` defaults there to the worker's own default (4 on remote stores), and
``--notifications`` to 200 on every store. ``--write`` puts the table in BENCHMARKS.md's
section "Observers at a trickle", replacing it.

``--threads`` gives the worker N scanner threads (default 1): concurrent runs share
timestamp requests (``percolator/_batching.py``). ``--notifications`` (default 400)
sets how many the Bigtable run serves: the worker's few calls that are not per
notification (its registration, its heartbeat, the index scans) weigh 1/N each.
``--base`` runs the same measurement with another checkout's code (a subprocess with
its ``PYTHONPATH``), in the same sitting, for a before/after table; ``--rounds``
repeats it, this checkout and the base alternated. ``--workers`` runs N ``Worker``s of
``--threads`` scanner threads each in the one process: each has its own ``Served``
set, as workers of separate processes have, so a run may find its notification
served by another worker (an ``absent`` run, counted per notification in the
``absent`` column). ``--backend`` measures one store only; ``hbase`` (not measured
unless named) is the HBase of ``PERCOLATOR_HBASE_THRIFT`` (host:port of its Thrift
server), as the test suite's, over Thrift2 when ``PERCOLATOR_HBASE_THRIFT2`` names its
Thrift2 server (as ``scripts/hbase`` prints both).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SECTION = "## Store calls and CPU per notification (bench/per_notification.py)"
TRICKLE_SECTION = "## Observers at a trickle (bench/per_notification.py --trickle)"


def calls() -> dict[str, float]:
    """This process's store calls so far, by operation."""
    from percolator import metrics

    values, _ = metrics.snapshot()
    return {labels[0]: v for (name, labels), v in values.items()
            if name == "percolator_store_requests_total"}


def absent() -> float:
    """This process's observer runs so far that found their notification served."""
    from percolator import metrics

    values, _ = metrics.snapshot()
    return sum(v for (name, labels), v in values.items()
               if name == "percolator_observer_runs_total" and labels[-1] == "absent")


def measure(url: str, n: int, threads: int = 1, workers: int = 1) -> dict[str, float]:
    import percolator
    from bench.observers import Copier, load
    from observers import Worker

    with percolator.connect(url) as cluster:
        cluster.create_table("bench")
        cluster.observe("bench", "in:v")
        load(cluster, n, b"a")
        pool = [Worker(cluster, [Copier], threads=threads) for _ in range(workers)]
        pool[0].register()
        before, absent0, cpu0 = calls(), absent(), time.process_time()
        for worker in pool:
            worker.start()
        while sum(worker.stats["committed"] for worker in pool) < n:
            time.sleep(0.01)
        cpu = time.process_time() - cpu0
        after, absent1 = calls(), absent()
        for worker in pool:
            worker.stop()
    found = {k: (after.get(k, 0) - before.get(k, 0)) / n for k in after}
    found = {k: v for k, v in found.items() if v >= 0.005}
    return {**found, "calls": sum(found.values()), "cpu_us": 1e6 * cpu / n,
            "absent": (absent1 - absent0) / n}


def measure_trickle(url: str, n: int, rate: float, threads: int | None,
                    poll_interval: float | None = None) -> dict[str, float]:
    """The worker's store calls per notification (by operation) and the commit-to-
    observer-commit latency (median, 90th percentile, in ms) while a writer process
    commits *n* single changes at *rate* a second (:func:`writer`); *poll_interval*
    is the worker's (None: its default)."""
    import statistics

    import percolator
    from bench.observers import Copier
    from observers import Worker
    from percolator import metrics

    def locks_met() -> float:
        values, _ = metrics.snapshot()
        return values.get(("percolator_locks_met_total", ()), 0)

    served: dict[bytes, float] = {}

    def on_commit(observer: object, table: str, row: bytes, column: str, change: int,
                  commit: int) -> None:
        served.setdefault(row, time.time())

    with percolator.connect(url) as cluster:
        cluster.create_table("bench")
        cluster.observe("bench", "in:v")
        worker = Worker(cluster, [Copier], threads=threads, on_commit=on_commit,
                        **({} if poll_interval is None else {"poll_interval": poll_interval}))
        worker.start()
        try:
            writing = subprocess.Popen(
                [sys.executable, "-P", str(ROOT / "bench" / "per_notification.py"),
                 "--writer", url, str(n), str(rate)],
                env=os.environ, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert writing.stdin is not None and writing.stdout is not None
            assert writing.stdout.readline().strip() == "ready"
            time.sleep(2.5)  # the worker goes idle, as one between bursts is
            before, absent0, met0, cpu0 = calls(), absent(), locks_met(), time.process_time()
            writing.stdin.write("go\n")
            writing.stdin.flush()
            committed: dict[bytes, float] = {
                bytes.fromhex(k): v for k, v in json.loads(writing.stdout.readline()).items()}
            writing.wait()
            deadline = time.monotonic() + 60
            while len(served) < n and time.monotonic() < deadline:
                time.sleep(0.01)
            cpu = time.process_time() - cpu0
            after, absent1, met1 = calls(), absent(), locks_met()
        finally:
            worker.stop()
    if len(served) < n:
        raise SystemExit(f"only {len(served)} of {n} changes observed within 60 s")
    latencies = sorted(1000 * (served[row] - at) for row, at in committed.items())
    found = {k: (after.get(k, 0) - before.get(k, 0)) / n for k in after}
    found = {k: v for k, v in found.items() if v >= 0.005}
    return {**found, "calls": sum(found.values()), "cpu_us": 1e6 * cpu / n,
            "absent": (absent1 - absent0) / n, "locks_met": (met1 - met0) / n,
            "median_ms": statistics.median(latencies),
            "p90_ms": latencies[int(0.9 * (len(latencies) - 1))]}


def writer(url: str, n: int, rate: float) -> None:
    """Trickle mode's writer: connect, say ``ready``, wait for ``go`` on stdin, then
    commit *n* single-cell transactions (rows of their own) at *rate* a second on a
    steady schedule; print one JSON line, ``{row hex: wall time its commit returned}``."""
    import percolator

    with percolator.connect(url) as cluster:
        print("ready", flush=True)
        sys.stdin.readline()
        committed: dict[str, float] = {}
        began = time.monotonic()
        for i in range(n):
            pause = began + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            row = b"t%07d" % i
            with percolator.Transaction(cluster) as txn:
                txn.set("bench", row, "in:v", b"v%d" % i)
            committed[row.hex()] = time.time()
        print(json.dumps(committed), flush=True)


def child() -> None:
    """Measure with the code on this process's path; print one JSON line."""
    mode, url, n, threads, workers, rate, poll = (
        sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
        float(sys.argv[7]), float(sys.argv[8]))
    if mode == "trickle":
        print(json.dumps(measure_trickle(url, n, rate, threads or None, poll or None)))
    else:
        print(json.dumps(measure(url, n, threads, workers)))


def run(checkout: Path, mode: str, url: str, n: int, threads: int, workers: int,
        rate: float, poll: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-P", str(ROOT / "bench" / "per_notification.py"), "--child", mode,
         url, str(n), str(threads), str(workers), str(rate), str(poll)],
        cwd=checkout, env={**os.environ, "PYTHONPATH": f"{checkout}:{ROOT}"},
        check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()  # the code under test is on PYTHONPATH: nothing of ROOT goes first
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--writer":
        writer(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        return 0
    sys.path.insert(0, str(ROOT))
    from bench._common import head_commit, header, publish
    from bench.observers_remote import _url
    from tests._bigtable import start_emulator

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", type=Path, help="a checkout of the commit to compare")
    parser.add_argument("--trickle", action="store_true",
                        help="changes arrive one at a time while the worker runs")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="trickle mode: changes committed per second")
    parser.add_argument("--poll-interval", type=float, action="append",
                        help="trickle mode: the worker's poll_interval (repeatable: a row "
                             "per value; default the worker's default)")
    parser.add_argument("--threads", type=int,
                        help="scanner threads (drain: 1; trickle: the worker's default)")
    parser.add_argument("--notifications", type=int,
                        help="notifications of a cluster store's run (drain: 400; "
                             "trickle: 200, and of every store)")
    parser.add_argument("--workers", type=int, default=1,
                        help="drain mode: Workers in the process, each with its own "
                             "Served set")
    parser.add_argument("--backend", choices=["sqlite", "bigtable", "hbase"],
                        action="append",
                        help="measure this store (repeatable; default sqlite and bigtable)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat, this checkout and the base alternated")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    notifications = args.notifications or (200 if args.trickle else 400)
    threads = args.threads if args.threads is not None else (0 if args.trickle else 1)
    if (min(args.workers, args.rounds, notifications) < 1 or threads < 0
            or (threads == 0 and not args.trickle) or args.rate <= 0):
        parser.error("--threads, --workers, --rounds, --notifications and --rate must be "
                     ">= 1 (> 0 for --rate)")
    if args.trickle and args.workers != 1:
        parser.error("--workers is for drain mode")
    polls = args.poll_interval or [0.0]
    if (not args.trickle and args.poll_interval) or any(
            p <= 0 for p in args.poll_interval or ()):
        parser.error("--poll-interval is for trickle mode, and > 0")
    backends = args.backend or ["sqlite", "bigtable"]
    hbase = os.environ.get("PERCOLATOR_HBASE_THRIFT")
    if "hbase" in backends and not hbase:
        parser.error("--backend hbase needs PERCOLATOR_HBASE_THRIFT=host:port (an HBase "
                     "Thrift server, e.g. one started by scripts/hbase)")
    stores = [(s, n) for s, n in (("sqlite", notifications if args.trickle else 3000),
                                  ("bigtable", notifications), ("hbase", notifications))
              if s in backends]
    checkouts = [("this", ROOT)] + ([("base", args.base)] if args.base else [])
    mode = "trickle" if args.trickle else "drain"
    emulator, hostport = start_emulator() if "bigtable" in backends else (None, "")
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-pernotify-") as tmp:
            for round_ in range(args.rounds):
                for (store, n), poll, (name, checkout) in itertools.product(
                        stores, polls, checkouts):
                    tag = f"pn{mode[0]}{name}{round_}{len(rows)}"
                    url = (f"sqlite:///{tmp}/{tag}.db" if store == "sqlite"
                           else _url(store, hostport if store == "bigtable" else str(hbase),
                                     tag))
                    label = name + (f", poll {poll:g} s" if poll else "")
                    rows.append((store, label, run(checkout, mode, url, n, threads,
                                                   args.workers, args.rate, poll)))
                    print(rows[-1], flush=True)
    finally:
        if emulator is not None:
            emulator.kill()
            emulator.wait()
    command = ("python bench/per_notification.py"
               + (" --trickle" if args.trickle else "")
               + (f" --rate {args.rate:g}" if args.trickle and args.rate != 20 else "")
               + "".join(f" --poll-interval {p:g}" for p in args.poll_interval or ())
               + (f" --base {args.base}" if args.base else "")
               + (f" --threads {args.threads}" if args.threads is not None else "")
               + (f" --workers {args.workers}" if args.workers != 1 else "")
               + "".join(f" --backend {b}" for b in args.backend or ())
               + (f" --rounds {args.rounds}" if args.rounds != 1 else "")
               + (f" --notifications {args.notifications}" if args.notifications else ""))
    load = os.getloadavg()
    if args.trickle:
        section = TRICKLE_SECTION
        notes = [f"commit {head_commit()}, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
                 "at the end",
                 f"one worker of {threads or 'the default'} scanner thread(s), the Copier; "
                 f"a writer process commits {notifications} single changes at "
                 f"{args.rate:g}/s; the worker's store calls per notification by "
                 "operation, absent runs and locks met per notification (a run that found its "
                 "notification newer than its snapshot, or the writer's lock), "
                 "commit-to-observer-commit latency, client CPU per notification"]
        table = ["| store | code | store calls | by operation | absent runs | locks met "
                 "| latency median | p90 | client CPU |", "|---|---|---|---|---|---|---|---|---|"]
    else:
        section = SECTION
        notes = [f"{args.workers} worker(s) of {threads} thread(s), the Copier; "
                 "store calls per notification by operation, absent runs per "
                 "notification, client CPU per notification"]
        table = ["| store | code | store calls | by operation | absent runs | client CPU |",
                 "|---|---|---|---|---|---|"]
    lines = [*header(section, command, *notes), "", *table]
    extra = ("calls", "cpu_us", "absent", "locks_met", "median_ms", "p90_ms")
    for store, name, r in rows:
        ops = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.items()) if k not in extra)
        if args.trickle:
            lines.append(f"| {store} | {name} | {r['calls']:.2f} | {ops} | "
                         f"{r['absent']:.2f} | {r['locks_met']:.2f} | "
                         f"{r['median_ms']:.0f} ms | {r['p90_ms']:.0f} ms | "
                         f"{r['cpu_us']:,.0f} us |")
        else:
            lines.append(f"| {store} | {name} | {r['calls']:.2f} | {ops} | "
                         f"{r.get('absent', 0):.2f} | {r['cpu_us']:,.0f} us |")
    lines.append("")
    publish(section, lines, args.write)
    return 0

if __name__ == "__main__":
    sys.exit(main())
