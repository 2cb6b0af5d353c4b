"""``python -m observers.millwheel``: run a pipeline's key runs, injectors and watermark
advancer, show its progress, check its indexes.

::

    python -m observers.millwheel run --cluster URL --pipeline package.module:FACTORY [--threads N]
    python -m observers.millwheel status --cluster URL --pipeline package.module:FACTORY
    python -m observers.millwheel verify --cluster URL --pipeline package.module:FACTORY

*FACTORY* is a callable taking the connected ``percolator.Cluster`` and returning the
``millwheel.Pipeline`` (user code: computations and sources live in your package).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import percolator
from observers import Worker
from observers._recipes import load_pipeline, run_command
from observers.millwheel._model import END_OF_TIME
from observers.millwheel._pipeline import Pipeline


def _mark(ms: int) -> str:
    if ms >= END_OF_TIME:
        return "end of input"
    if ms <= 0:
        return "-"
    return f"{ms} ({time.time() - ms / 1000:+.1f}s behind wall time)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m observers.millwheel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "status", "verify"))
    parser.add_argument("--cluster", required=True, help="repository URL")
    parser.add_argument("--pipeline", required=True, help="package.module:FACTORY")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    def body() -> int:
        with percolator.connect(args.cluster) as cluster:
            pipeline = load_pipeline(args.pipeline, cluster, Pipeline)
            if args.command == "run":
                pipeline.create()
                Worker(cluster, pipeline.observers(), tasks=pipeline.tasks(),
                       threads=args.threads).run()
                return 0
            if args.command == "status":
                print(f"millwheel pipeline {pipeline.name} on {cluster.url}")
                for s in pipeline.status():
                    print(f"{s.name}:\n  input watermark: {_mark(s.input_watermark)}\n"
                          f"  low watermark:   {_mark(s.low_watermark)}\n"
                          f"  pending records: {s.pending}\n  armed timers:    {s.timers}\n"
                          f"  late records:    {s.late}")
                return 0
            report = pipeline.verify()
            for problem in report.problems:
                print(problem)
            print("OK" if report.ok else "VIOLATIONS FOUND")
            return 0 if report.ok else 1
    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
