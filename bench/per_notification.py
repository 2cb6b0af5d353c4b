"""Store calls and CPU per notification (issue 15): one worker thread running the plain
one-cell Copier of bench/observers.py, on the embedded store and on the Bigtable
emulator; store calls counted by operation (the store metrics), client CPU from
``time.process_time``.

    python bench/per_notification.py [--base CHECKOUT] [--threads N] [--notifications N]
        [--write]

``--threads`` gives the worker N scanner threads (default 1): concurrent runs share
timestamp requests (``percolator/_batching.py``). ``--notifications`` (default 400)
sets how many the Bigtable run serves: the worker's few calls that are not per
notification (its registration, its heartbeat, the index scans) weigh 1/N each.
``--base`` runs the same measurement with another checkout's code (a subprocess with
its ``PYTHONPATH``), in the same sitting, for a before/after table.
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


def measure(url: str, n: int, threads: int = 1) -> dict[str, float]:
    import percolator
    from bench.observers import Copier, load
    from observers import Worker
    from percolator import metrics

    def calls() -> dict[str, float]:
        values, _ = metrics.snapshot()
        return {labels[0]: v for (name, labels), v in values.items()
                if name == "percolator_store_requests_total"}

    with percolator.connect(url) as cluster:
        cluster.create_table("bench")
        cluster.observe("bench", "in:v")
        load(cluster, n, b"a")
        worker = Worker(cluster, [Copier], threads=threads)
        worker.register()
        before, cpu0 = calls(), time.process_time()
        worker.start()
        while worker.stats["committed"] < n:
            time.sleep(0.01)
        cpu = time.process_time() - cpu0
        after = calls()
        worker.stop()
    found = {k: (after.get(k, 0) - before.get(k, 0)) / n for k in after}
    found = {k: v for k, v in found.items() if v >= 0.005}
    return {**found, "calls": sum(found.values()), "cpu_us": 1e6 * cpu / n}


def child() -> None:
    """Measure with the code on this process's path; print one JSON line."""
    url, n, threads = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(measure(url, n, threads)))


def run(checkout: Path, url: str, n: int, threads: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-P", str(ROOT / "bench" / "per_notification.py"), "--child", url,
         str(n), str(threads)],
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
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    checkouts = [("this", ROOT)] + ([("base", args.base)] if args.base else [])
    emulator, hostport = start_emulator()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-pernotify-") as tmp:
            for store, n in (("sqlite", 3000), ("bigtable", args.notifications)):
                for name, checkout in checkouts:
                    url = (f"sqlite:///{tmp}/{name}.db" if store == "sqlite"
                           else _url("bigtable", hostport, f"pn{name}"))
                    rows.append((store, name, run(checkout, url, n, args.threads)))
                    print(rows[-1], flush=True)
    finally:
        emulator.kill()
        emulator.wait()
    lines = [*header(SECTION, "python bench/per_notification.py"
                     + (f" --base {args.base}" if args.base else "")
                     + (f" --threads {args.threads}" if args.threads != 1 else "")
                     + (f" --notifications {args.notifications}"
                        if args.notifications != 400 else ""),
                     f"{args.threads} worker thread(s), the Copier; store calls per "
                     "notification by operation, client CPU per notification"), "",
             "| store | code | store calls | by operation | client CPU |", "|---|---|---|---|---|"]
    for store, name, r in rows:
        ops = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.items())
                        if k not in ("calls", "cpu_us"))
        lines.append(f"| {store} | {name} | {r['calls']:.2f} | {ops} | "
                     f"{r['cpu_us']:,.0f} us |")
    lines.append("")
    publish(SECTION, lines, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
