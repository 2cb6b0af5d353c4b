"""``python -m observers.photon``: run, feed and check a join pipeline.

::

    python -m observers.photon create --cluster URL --name clicks \\
        --foreign-id click_id --primary-id query_id --primary-ref query_id --time ts \\
        --unjoinable-after 3600 --retention-days 3
    python -m observers.photon ingest --cluster URL --name clicks --kind primary queries.jsonl
    python -m observers.photon run --cluster URL --name clicks [--threads N]
    python -m observers.photon status --cluster URL --name clicks
    python -m observers.photon verify --cluster URL --name clicks    # exit 1 on a violation
    python -m observers.photon rejoin --cluster URL --name clicks --state unjoinable

A pipeline with a custom adapter names it with ``--adapter package.module:NAME``.
"""

from __future__ import annotations

import argparse
import logging
import struct
import sys
import time
from datetime import timedelta
from typing import Any

import percolator
from observers import Worker
from observers._recipes import load_object, run_command
from observers.photon._adapter import Adapter, JsonAdapter
from observers.photon._pipeline import JoinPipeline, State, iter_jsonl
from percolator import Snapshot
from percolator.ext import quarantined


def _adapter(spec: str | None) -> Adapter | None:
    if spec is None:
        return None
    value = load_object(spec, "--adapter")
    adapter: Adapter = value() if isinstance(value, type) else value
    return adapter


def _create(cluster: percolator.Cluster, args: argparse.Namespace) -> int:
    adapter = _adapter(args.adapter) or JsonAdapter(
        foreign_id=args.foreign_id, primary_id=args.primary_id, primary_ref=args.primary_ref,
        time=args.time)
    retention = None if args.retention_days is None else timedelta(days=args.retention_days)
    JoinPipeline(cluster, args.name, adapter, unjoinable_after=args.unjoinable_after,
                 retention=retention).create()
    print(f"created photon pipeline {args.name}")
    return 0


def _ingest(p: JoinPipeline, args: argparse.Namespace) -> int:
    stream = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")  # noqa: SIM115
    with stream:
        events = list(iter_jsonl(stream))
    log = p.log_primary if args.kind == "primary" else p.log_foreign
    result = log(p.cluster, events)
    print(f"{args.kind}: {result.written} written, {result.duplicates} duplicates, "
          f"{result.too_late} too late, {len(result.rejected)} rejected")
    for index, why in result.rejected[:20]:
        print(f"  line {index + 1}: {why}")
    return 1 if result.rejected else 0


def _status(p: JoinPipeline, args: argparse.Namespace) -> int:
    report = p.verify()
    with Snapshot(p.cluster) as snap:
        boundary = p.boundary_ms(snap)
        waiting = [row for row, _ in snap.scan(p.deadlines, None, None, ["d:x"])]
    print(f"photon pipeline {p.name} on {p.cluster.url}")
    print(f"events: {report.events}")
    for state in State:
        print(f"  {state.value}: {report.by_state.get(state.value, 0)}")
    if waiting:
        oldest = struct.unpack(">Q", waiting[0][:8])[0] / 1000
        print(f"next deadline: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(oldest))}")
    print(f"retention boundary: {boundary or '-'} (ms)")
    held = quarantined(p.cluster, p.foreign)
    print(f"quarantined events: {len(held)}")
    for q in held[:20]:
        print(f"  {q.row[3:]!r}: {q.error}")
    return 0


def _verify(p: JoinPipeline, args: argparse.Namespace) -> int:
    report = p.verify()
    print(f"events: {report.events} {report.by_state}; in flight: {report.in_flight}; "
          f"quarantined: {len(report.quarantined)}")
    for line in report.counts():
        print(line)
    print("OK" if report.ok else "VIOLATIONS FOUND")
    return 0 if report.ok else 1


def _rejoin(p: JoinPipeline, args: argparse.Namespace) -> int:
    n = p.rejoin(State(args.state))
    print(f"{n} {args.state} event(s) put back to the joiner")
    return 0


def _run(p: JoinPipeline, args: argparse.Namespace) -> int:
    Worker(p.cluster, p.observers(), tasks=p.tasks(), threads=args.threads,
           max_failures=args.max_failures).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m observers.photon", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help)
        sub.add_argument("--cluster", required=True, help="repository URL")
        sub.add_argument("--name", required=True, help="the pipeline's name")
        sub.add_argument("--adapter", help="package.module:NAME of a custom adapter")
        return sub

    create = command("create", "create a pipeline (JSON events, or --adapter)")
    for flag in ("--foreign-id", "--primary-id", "--primary-ref"):
        create.add_argument(flag, help="JSON field")
    create.add_argument("--time", help="JSON field with the event time in ms")
    create.add_argument("--unjoinable-after", type=float, required=True, metavar="SECONDS")
    create.add_argument("--retention-days", type=float)
    ingest = command("ingest", "ingest a JSONL file (or - for stdin)")
    ingest.add_argument("--kind", choices=("primary", "foreign"), required=True)
    ingest.add_argument("input")
    run = command("run", "run the joiner, the deadline sweep and retention")
    run.add_argument("--threads", type=int, default=2)
    run.add_argument("--max-failures", type=int, default=5)
    command("status", "counts by state, deadlines, boundary, quarantined events")
    command("verify", "check the invariants; exit 1 on a violation")
    rejoin = command("rejoin", "put unjoinable or skipped events back to the joiner")
    rejoin.add_argument("--state", choices=("unjoinable", "skipped"), required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    handlers: dict[str, Any] = {"ingest": _ingest, "status": _status, "verify": _verify,
                                "rejoin": _rejoin, "run": _run}
    def body() -> int:
        with percolator.connect(args.cluster) as cluster:
            if args.command == "create":
                if args.adapter is None and not (args.foreign_id and args.primary_id
                                                 and args.primary_ref):
                    parser.error("create needs --foreign-id, --primary-id and --primary-ref "
                                 "(or --adapter)")
                return _create(cluster, args)
            pipeline = JoinPipeline.open(cluster, args.name, _adapter(args.adapter))
            result: int = handlers[args.command](pipeline, args)
            return result
    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
