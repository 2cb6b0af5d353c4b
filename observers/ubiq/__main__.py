"""``python -m observers.ubiq``: follow, process and check a log pipeline.

::

    python -m observers.ubiq track --cluster URL --pipeline package.module:FACTORY --site a
    python -m observers.ubiq run --cluster URL --pipeline package.module:FACTORY --site a
    python -m observers.ubiq status --cluster URL --pipeline package.module:FACTORY
    python -m observers.ubiq verify --cluster URL --pipeline package.module:FACTORY
    python -m observers.ubiq retry-range --cluster URL --pipeline ... FILE BEGIN

*FACTORY* is a callable taking the connected ``percolator.Cluster`` and returning the
``ubiq.LogPipeline``. ``track`` follows the site until stopped; ``run`` runs the
cutter, the processor (reading from ``--site``), the dispatcher, that site's tracker
and the lease sweep; ``verify`` exits 1 unless committed and quarantined ranges cover
every tracked byte exactly once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

import percolator
from observers import Worker
from observers._recipes import load_pipeline, run_command
from observers.ubiq._pipeline import LogPipeline
from percolator import InvalidArgument, Snapshot


def _track(p: LogPipeline, site: str) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.is_set():
        p.track(site)
        stop.wait(p.track_interval)
    return 0


def _status(p: LogPipeline) -> int:
    states: dict[str, int] = {}
    leased = 0
    with Snapshot(p.cluster) as snap:
        files = list(snap.scan(p.files, None, None, ["f:size", "f:cut", "f:refused"]))
        for _, cells in snap.scan(p.units, None, None, ["u:state", "u:lease"]):
            state = cells.get("u:state", b"?").decode()
            states[state] = states.get(state, 0) + 1
            leased += "u:lease" in cells
    print(f"ubiq pipeline {p.name} on {p.cluster.url}")
    print(f"files: {len(files)}, bytes tracked: "
          f"{sum(int(c.get('f:size', b'0')) for _, c in files):,}, cut: "
          f"{sum(int(c.get('f:cut', b'0')) for _, c in files):,}")
    for row, cells in files:
        if "f:refused" in cells:
            print(f"  refused {row.decode()}: {cells['f:refused'].decode()}")
    names = {"P": "pending", "C": "committed", "Q": "quarantined", "X": "split"}
    print("units: " + ", ".join(f"{names.get(k, k)} {v}" for k, v in sorted(states.items()))
          + f"; leased {leased}")
    for name, begin, end, error in p.quarantined():
        print(f"  quarantined {name} [{begin}, {end}): {error}")
    return 0


def _verify(p: LogPipeline) -> int:
    report = p.verify()
    for problem in report.problems:
        print(problem)
    print(f"{len(report.files)} file(s); " + ("OK" if report.ok else "VIOLATIONS FOUND"))
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m observers.ubiq", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("track", "run", "status", "verify", "retry-range"))
    parser.add_argument("--cluster", required=True, help="repository URL")
    parser.add_argument("--pipeline", required=True, help="package.module:FACTORY")
    parser.add_argument("--site", help="the site this process reads (default: the first)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("range", nargs="*", help="retry-range: FILE BEGIN")
    args = parser.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    def body() -> int:
        with percolator.connect(args.cluster) as cluster:
            p = load_pipeline(args.pipeline, cluster, LogPipeline)
            site = args.site or next(iter(p.sites))
            if site not in p.sites:
                raise InvalidArgument(f"unknown --site {site!r}; sites: {sorted(p.sites)}")
            if args.command == "track":
                p.create()
                return _track(p, site)
            if args.command == "run":
                p.create()
                Worker(cluster, p.observers(site), tasks=p.tasks(site),
                       threads=args.threads).run()
                return 0
            if args.command == "status":
                return _status(p)
            if args.command == "verify":
                return _verify(p)
            if len(args.range) != 2 or not args.range[1].isdigit():
                parser.error("retry-range needs FILE BEGIN")
            p.retry_range(args.range[0], int(args.range[1]))
            print(f"{args.range[0]} from {args.range[1]} put back to work")
            return 0
    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
