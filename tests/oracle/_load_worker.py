"""Load worker for the oracle tests: ``python -m tests.oracle._load_worker``.

Runs THREADS threads, each calling ``OracleClient.get_timestamp()`` one at a time, either
COUNT times or until the file STOP exists, and writes every call as a line
``thread invoke_ns return_ns timestamp`` to OUT (``time.monotonic_ns``, comparable across
processes on one Linux host). A failed call is written as ``ERROR message`` and makes the
worker exit with status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from oracle import OracleClient
from percolator._tls import add_zookeeper_tls_arguments, zookeeper_tls_from_arguments


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("target")
    p.add_argument("out")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--count", type=int, default=0, help="calls per thread (0: until --stop)")
    p.add_argument("--stop", default="", help="stop when this file exists")
    p.add_argument("--deadline", type=float, default=20.0)
    add_zookeeper_tls_arguments(p, "oracle")
    add_zookeeper_tls_arguments(p, "zookeeper")
    args = p.parse_args()
    client = OracleClient(
        args.target,
        deadline=args.deadline,
        tls=zookeeper_tls_from_arguments(args, "oracle"),
        zookeeper_tls=zookeeper_tls_from_arguments(args),
    )
    results: list[list[tuple[int, int, int]]] = [[] for _ in range(args.threads)]
    errors: list[str] = []
    go = threading.Event()

    def run(i: int) -> None:
        out = results[i]
        go.wait()
        n = 0
        while True:
            if args.count:
                if n >= args.count:
                    return
            elif n % 16 == 0 and os.path.exists(args.stop):
                return
            n += 1
            t0 = time.monotonic_ns()
            try:
                ts = client.get_timestamp()
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
                return
            out.append((t0, time.monotonic_ns(), ts))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    client.close()
    with open(args.out + ".tmp", "w") as f:
        for i, calls in enumerate(results):
            for t0, t1, ts in calls:
                f.write(f"{i} {t0} {t1} {ts}\n")
        for e in errors:
            f.write(f"ERROR {e}\n")
    os.replace(args.out + ".tmp", args.out)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
