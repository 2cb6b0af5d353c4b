"""``python -m observers --cluster URL --observers package.module:OBSERVERS``: a worker
process (also installed as ``percolator-worker``). Stops cleanly on SIGTERM/SIGINT; a
second one exits at once. Runs a garbage-collection pass every ``--gc-interval`` seconds
(one worker of the cluster at a time)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import percolator
from observers._periodic import Periodic
from observers._worker import Worker, load_observers
from percolator.ext import (
    add_zookeeper_tls_arguments,
    watch_pending_notifications,
    zookeeper_tls_from_arguments,
)
from percolator.metrics import add_arguments as add_metrics_arguments


def _serve_metrics(args: argparse.Namespace, cluster: percolator.Cluster,
                   worker: Worker) -> None:
    from percolator import metrics

    endpoint = metrics.serve(args.metrics_port, args.metrics_host)
    watch_pending_notifications(cluster, sorted({o.table for o in worker.observers}))
    logging.getLogger("observers").info(
        "metrics on http://%s:%d/metrics", args.metrics_host, endpoint.server_port)


def _collect(cluster: percolator.Cluster, retention: float, rate: float) -> None:
    summary = cluster.gc(retention=retention, rows_per_second=rate)
    logging.getLogger("observers.gc").info(
        "gc: safe point %d (%s), %d rows scanned, %d versions removed, %d locks resolved "
        "in %.1fs", summary.safe_point, summary.held_back_by, summary.rows_scanned,
        summary.versions_removed, summary.locks_resolved, summary.seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="percolator-worker",
        description="Run Percolator observers: scan for changed cells and process them.",
    )
    parser.add_argument("--cluster", required=True,
                        help="store url, e.g. sqlite:///var/lib/app/repo.db")
    parser.add_argument("--observers", required=True, metavar="MODULE:NAME",
                        help="where the application lists its observers, "
                             "e.g. myapp.observers:OBSERVERS")
    parser.add_argument("--threads", type=int, default=None,
                        help="scanner threads (default: 1 on the embedded store, 4 on others)")
    parser.add_argument("--oracle",
                        help="timestamp oracle, grpc://host:port, grpcs://host:port or zk://...")
    parser.add_argument("--zookeeper", help="ZooKeeper for coordination, host:port/chroot")
    parser.add_argument("--max-failures", type=int, default=5,
                        help="failures of one notification before it is quarantined")
    parser.add_argument("--retry-delay", type=float, default=0.5,
                        help="seconds before the first retry of a failed notification")
    parser.add_argument("--lock-ttl", type=float, default=30.0,
                        help="seconds a silent client's locks are honoured")
    parser.add_argument("--gc-interval", type=float, default=600.0,
                        help="seconds between garbage-collection passes, run by one "
                             "worker of the cluster at a time (default 600; 0: never)")
    parser.add_argument("--gc-retention", type=float, default=600.0,
                        help="seconds of history garbage collection keeps (default 600)")
    parser.add_argument("--gc-rate", type=float, default=5000.0,
                        help="rows per second a pass scans at most, so that observers "
                             "are not starved (default 5000)")
    parser.add_argument("--stats-file", help="write the worker's counters here as JSON on exit")
    add_zookeeper_tls_arguments(parser, "oracle")
    add_zookeeper_tls_arguments(parser, "zookeeper")
    add_metrics_arguments(parser)
    parser.add_argument("--log-level", default=os.environ.get("PERCOLATOR_LOG", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s worker[{os.getpid()}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        observers = load_observers(args.observers)
        cluster = percolator.connect(args.cluster, oracle=args.oracle,
                                     oracle_tls=zookeeper_tls_from_arguments(args, "oracle"),
                                     zookeeper=args.zookeeper,
                                     zookeeper_tls=zookeeper_tls_from_arguments(args),
                                     lock_ttl=args.lock_ttl)
    except percolator.PercolatorError as e:
        print(f"percolator-worker: {e}", file=sys.stderr)
        return 2
    try:
        tasks = []
        if args.gc_interval > 0:
            retention, rate = args.gc_retention, args.gc_rate
            tasks.append(Periodic(
                cluster, "gc", lambda: _collect(cluster, retention, rate),
                interval=args.gc_interval,
            ))
        worker = Worker(cluster, observers, threads=args.threads,
                        max_failures=args.max_failures, retry_delay=args.retry_delay,
                        tasks=tasks)
        if args.metrics_port is not None:
            _serve_metrics(args, cluster, worker)
        worker.run()
        if args.stats_file:
            with open(args.stats_file, "w") as f:
                json.dump(dict(worker.stats), f)
    except percolator.PercolatorError as e:
        print(f"percolator-worker: {e}", file=sys.stderr)
        return 2
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
