"""The embedded store's timestamp sidecar alone, and a transaction at several rates
(issue 33: a process alone on the sidecar keeps its flock between sections once it
draws often; docs/timestamps.md, "A process alone on the sidecar keeps its lock").

    python bench/sidecar.py [--n 100000] [--rounds 3]
    PYTHONPATH=/path/to/base python -P bench/sidecar.py    # a base commit's tree

Prints, in microseconds of the process's CPU time (every thread: the releaser's
looks count): a start draw; a start draw and a one-phase commit's sidecar sections
(draw, close the gap, clear the slot) around an empty write step; and one single-cell
transaction followed by a pause of each ``--gaps`` (milliseconds), per transaction.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import percolator
from percolator.ext import HostTimestamps, internals


class _NoWriteStep:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="draws per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gaps", default="0,2,6,20",
                        help="pauses after each transaction, in ms (comma-separated)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="how long each paced run lasts")
    args = parser.parse_args()
    print(f"# percolator from {os.path.dirname(percolator.__file__)}, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = percolator.connect(f"sqlite://{tmp}/db")
        source = internals(cluster).timestamps
        assert isinstance(source, HostTimestamps)
        draws, cycles = [], []
        for _ in range(args.rounds):
            began = time.process_time()
            for _ in range(args.n):
                source.get_timestamp()
            draws.append((time.process_time() - began) / args.n * 1e6)
            began = time.process_time()
            for _ in range(args.n):
                source.get_timestamp()
                with source.in_flight(_NoWriteStep) as draw:
                    draw(1)
            cycles.append((time.process_time() - began) / args.n * 1e6)
        print(f"start draw: {statistics.median(draws):.2f} us")
        print(f"start draw + one-phase commit's sections: {statistics.median(cycles):.2f} us")
        cluster.create_table("t")
        for gap_ms in (float(g) for g in args.gaps.split(",")):
            gap = gap_ms / 1000
            count = 0
            began, deadline = time.process_time(), time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                with percolator.Transaction(cluster) as txn:
                    txn.set("t", b"r%d" % (count % 100), "c:v", b"x")
                count += 1
                if gap:
                    time.sleep(gap)
            per = (time.process_time() - began) / count * 1e6
            print(f"single-cell txn, then {gap_ms:g} ms pause: {per:.1f} us CPU per txn "
                  f"({count} txns)")
        cluster.close()


if __name__ == "__main__":
    main()
