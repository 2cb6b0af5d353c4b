"""The default scanner thread count (issue 15): notifications/s of one worker process
running the plain one-cell Copier of bench/observers.py with 1, 2, 4 and 8 threads, on
the embedded store and on the Bigtable emulator, alternated in one run.

    python bench/threads.py [--rounds 2] [--write]

``--write`` replaces the section ``## Scanner threads per worker (bench/threads.py)``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import percolator  # noqa: E402
from bench._common import header, publish  # noqa: E402
from bench.observers import Copier, load  # noqa: E402
from bench.observers_remote import _url  # noqa: E402
from observers import Worker, wait_for_observers  # noqa: E402

SECTION = "## Scanner threads per worker (bench/threads.py)"
THREADS = (1, 2, 4, 8)


def rate(url: str, n: int, threads: int) -> float:
    with percolator.connect(url) as cluster:
        cluster.create_table("bench")
        cluster.observe("bench", "in:v")
        load(cluster, n, b"a")
        worker = Worker(cluster, [Copier], threads=threads)
        t0 = time.perf_counter()
        worker.start()
        while worker.stats["committed"] < n:
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
        wait_for_observers(cluster, 120)
        worker.stop()
    return n / elapsed


def main() -> int:
    from tests._bigtable import start_emulator

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    found: dict[tuple[str, int], list[float]] = {}
    emulator, hostport = start_emulator()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
            for r in range(args.rounds):
                for threads in THREADS:
                    found.setdefault(("sqlite", threads), []).append(
                        rate(f"sqlite:///{tmp}/s{r}{threads}.db", 3000, threads))
                    found.setdefault(("bigtable", threads), []).append(
                        rate(_url("bigtable", hostport, f"t{r}{threads}"), 600, threads))
    finally:
        emulator.kill()
        emulator.wait()
    lines = [*header(SECTION, f"python bench/threads.py --rounds {args.rounds}",
                     "one worker process, the Copier observer; median of the rounds, "
                     "alternated"), "",
             "| threads | embedded (SQLite), notifications/s | Bigtable emulator |",
             "|---|---|---|"]
    for threads in THREADS:
        lines.append(f"| {threads} | {statistics.median(found[('sqlite', threads)]):,.0f} | "
                     f"{statistics.median(found[('bigtable', threads)]):,.0f} |")
    lines += ["", "`Worker(threads=None)` (the default) takes 1 on the embedded store and 4 on "
              "remote stores.", ""]
    publish(SECTION, lines, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
