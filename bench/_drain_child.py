"""One drain of the demo pipeline on a store, for ``bench/observers_remote.py``: run with
``PYTHONPATH`` set to the checkout under test (only public APIs, so that an older
commit runs it too). Prints one JSON line: drain seconds and change latencies."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import percolator
from observers import Worker, demo, wait_for_observers


def _cpu_busy_seconds() -> float:
    """Seconds of CPU time the whole machine has spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    url, documents, changes, checkout, tmp = sys.argv[1:6]
    rng = random.Random(2010)
    cluster = percolator.connect(url)
    for table in ("documents", "clusters", "links"):
        cluster.create_table(table)
    Worker(cluster, demo.OBSERVERS).register()
    env = dict(os.environ, PYTHONPATH=checkout)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "observers", "--cluster", url, "--observers",
         "observers.demo:OBSERVERS", "--threads", "4", "--log-level", "WARNING",
         "--stats-file", f"{tmp}/drain{i}.json"],
        cwd=checkout, env=env, stdout=subprocess.DEVNULL) for i in range(2)]
    try:
        time.sleep(3)  # the workers start up (and go idle)
        docs = demo.make_documents(int(documents), rng)
        items = list(docs.items())
        t0 = time.perf_counter()
        busy0 = _cpu_busy_seconds()
        for i in range(0, len(items), 25):
            with percolator.Transaction(cluster) as txn:
                for u, html in items[i : i + 25]:
                    txn.set("documents", u.encode(), "raw:html", html.encode())
        wait_for_observers(cluster, 1800)
        drain = time.perf_counter() - t0
        busy = _cpu_busy_seconds() - busy0
        time.sleep(3)  # idle again
        urls = sorted(docs)
        latencies = []
        for j in range(int(changes)):
            u = rng.choice(urls)
            html = docs[u].replace("</body>", f'<a href="{rng.choice(urls)}">fresh {j}</a></body>')
            docs[u] = html
            before = percolator.Snapshot(cluster).get("documents", u.encode(), "parsed:links")
            with percolator.Transaction(cluster) as txn:
                txn.set("documents", u.encode(), "raw:html", html.encode())
            t1 = time.perf_counter()
            while percolator.Snapshot(cluster).get("documents", u.encode(),
                                                   "parsed:links") == before:
                time.sleep(0.005)
                if time.perf_counter() - t1 > 60:
                    raise SystemExit(f"change {j} never observed")
            latencies.append(time.perf_counter() - t1)
            time.sleep(0.2)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    runs = 0
    for i in range(2):
        try:
            with open(f"{tmp}/drain{i}.json") as f:
                runs += json.load(f).get("committed", 0)
        except OSError:
            pass
    latencies.sort()
    print(json.dumps({"seconds": drain, "documents": len(items), "runs": runs,
                      "cpu_busy_cores": busy / drain,
                      "p50_ms": 1000 * latencies[len(latencies) // 2],
                      "p95_ms": 1000 * latencies[int(len(latencies) * 0.95)]}))


if __name__ == "__main__":
    main()
