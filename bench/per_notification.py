"""Store calls and CPU per notification (issue 15): one worker thread running the plain
one-cell Copier of bench/observers.py, on the embedded store and on the Bigtable
emulator; store calls counted by operation (the store metrics), client CPU from
``time.process_time``.

    python bench/per_notification.py [--base CHECKOUT] [--threads N] [--notifications N]
        [--workers N] [--backend sqlite|bigtable] [--rounds N] [--write]

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
``absent`` column). ``--backend`` measures one store only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SECTION = "## Store calls and CPU per notification (bench/per_notification.py)"


def measure(url: str, n: int, threads: int = 1, workers: int = 1) -> dict[str, float]:
    import percolator
    from bench.observers import Copier, load
    from observers import Worker
    from percolator import metrics

    def calls() -> dict[str, float]:
        values, _ = metrics.snapshot()
        return {labels[0]: v for (name, labels), v in values.items()
                if name == "percolator_store_requests_total"}

    def absent() -> float:
        values, _ = metrics.snapshot()
        return sum(v for (name, labels), v in values.items()
                   if name == "percolator_observer_runs_total" and labels[-1] == "absent")

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


def child() -> None:
    """Measure with the code on this process's path; print one JSON line."""
    url, n, threads, workers = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    print(json.dumps(measure(url, n, threads, workers)))


def run(checkout: Path, url: str, n: int, threads: int, workers: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-P", str(ROOT / "bench" / "per_notification.py"), "--child", url,
         str(n), str(threads), str(workers)],
        cwd=checkout, env={**os.environ, "PYTHONPATH": f"{checkout}:{ROOT}"},
        check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()  # the code under test is on PYTHONPATH: nothing of ROOT goes first
        return 0
    sys.path.insert(0, str(ROOT))
    from bench._common import header, publish
    from bench.observers_remote import _url
    from tests._bigtable import start_emulator

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", type=Path, help="a checkout of the commit to compare")
    parser.add_argument("--threads", type=int, default=1, help="scanner threads")
    parser.add_argument("--notifications", type=int, default=400,
                        help="notifications of the Bigtable run")
    parser.add_argument("--workers", type=int, default=1,
                        help="Workers in the process, each with its own Served set")
    parser.add_argument("--backend", choices=["sqlite", "bigtable"],
                        help="measure this store only")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat, this checkout and the base alternated")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if min(args.threads, args.workers, args.rounds, args.notifications) < 1:
        parser.error("--threads, --workers, --rounds and --notifications must be >= 1")
    stores = [(s, n) for s, n in (("sqlite", 3000), ("bigtable", args.notifications))
              if args.backend in (None, s)]
    checkouts = [("this", ROOT)] + ([("base", args.base)] if args.base else [])
    emulator, hostport = start_emulator()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-pernotify-") as tmp:
            for round_ in range(args.rounds):
                for store, n in stores:
                    for name, checkout in checkouts:
                        url = (f"sqlite:///{tmp}/{name}{round_}.db" if store == "sqlite"
                               else _url("bigtable", hostport, f"pn{name}{round_}"))
                        rows.append((store, name, run(checkout, url, n, args.threads,
                                                      args.workers)))
                        print(rows[-1], flush=True)
    finally:
        emulator.kill()
        emulator.wait()
    lines = [*header(SECTION, "python bench/per_notification.py"
                     + (f" --base {args.base}" if args.base else "")
                     + (f" --threads {args.threads}" if args.threads != 1 else "")
                     + (f" --workers {args.workers}" if args.workers != 1 else "")
                     + (f" --backend {args.backend}" if args.backend else "")
                     + (f" --rounds {args.rounds}" if args.rounds != 1 else "")
                     + (f" --notifications {args.notifications}"
                        if args.notifications != 400 else ""),
                     f"{args.workers} worker(s) of {args.threads} thread(s), the Copier; "
                     "store calls per notification by operation, absent runs per "
                     "notification, client CPU per notification"), "",
             "| store | code | store calls | by operation | absent runs | client CPU |",
             "|---|---|---|---|---|---|"]
    for store, name, r in rows:
        ops = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.items())
                        if k not in ("calls", "cpu_us", "absent"))
        lines.append(f"| {store} | {name} | {r['calls']:.2f} | {ops} | "
                     f"{r.get('absent', 0):.2f} | {r['cpu_us']:,.0f} us |")
    lines.append("")
    publish(SECTION, lines, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
