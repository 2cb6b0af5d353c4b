"""The ``percolator`` command: ``status``, ``wait`` and ``retry``.

::

    percolator status --cluster sqlite:///var/lib/app/repo.db
    percolator wait   --cluster URL --timeout 60
    percolator retry  --cluster URL [TABLE [ROW [COLUMN]]]

Rows are written as UTF-8 text, or ``hex:...`` for other bytes (as ``status`` shows them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from urllib.parse import urlsplit

from percolator._cluster import Cluster, connect
from percolator._errors import InvalidArgument, PercolatorError
from percolator._notifications import (
    WaitTimeout,
    format_row,
    held_locks,
    parse_row,
    pending_notifications,
    quarantined,
    retry_quarantined,
    wait_until_idle,
)
from percolator._tls import add_zookeeper_tls_arguments, zookeeper_tls_from_arguments


def _status(cluster: Cluster) -> int:
    tables = cluster.tables()
    observed = sorted(cluster.observed_columns())
    print(f"cluster {cluster.store.url}")
    print(f"tables ({len(tables)}): {', '.join(tables) or '-'}")
    print("observed columns: " + (", ".join(f"{t}/{c}" for t, c in observed) or "-"))
    pending: Counter[tuple[str, str]] = Counter()
    weak: Counter[tuple[str, str]] = Counter()
    for p in pending_notifications(cluster, tables):
        pending[(p.table, p.column)] += 1
        if p.weak and not p.strong:
            weak[(p.table, p.column)] += 1
    print(f"pending notifications: {sum(pending.values())}")
    for (table, column), n in sorted(pending.items()):
        print(f"  {table}/{column}: {n}" + (f" ({weak[(table, column)]} weak)"
                                           if weak[(table, column)] else ""))
    locks = list(held_locks(cluster, tables))
    print(f"locks held: {len(locks)}")
    now_ms = time.time() * 1000
    for lk in locks[:20]:
        state = lk.state
        age = f", {(now_ms - state.wall_ms) / 1000:.1f}s old" if hasattr(state, "wall_ms") else ""
        print(f"  {lk.table}/{format_row(lk.row)}/{lk.column}: {type(state).__name__.lower()} "
              f"by transaction {getattr(state, 'start_ts', '?')}{age}")
    if len(locks) > 20:
        print(f"  ... and {len(locks) - 20} more")
    if cluster.lock_census is not None:
        if not locks:
            cluster.sweep_locks(force=True)
        print("lock census: " + ("clear (reads skip the lock family)" if cluster.lock_census.clean()
                                 else "set (reads check locks until a sweep finds none held)"))
    records = quarantined(cluster)
    print(f"quarantined notifications: {len(records)}")
    for q in records:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(q.since))
        print(f"  {q.table}/{format_row(q.row)}/{q.column}: observer {q.observer}, "
              f"{q.failures} failure(s), since {when}{' (weak)' if q.weak else ''}")
        print(f"      error: {q.error}")
    if records:
        print("  (put them back with: percolator retry --cluster URL [TABLE [ROW [COLUMN]]])")
    return 0


def _check_store_exists(url: str) -> None:
    """These commands look at a repository; opening an embedded store that is not there
    would create an empty one (and report it idle), so refuse instead."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite" and parts.path.startswith("/") and not os.path.exists(parts.path):
        raise InvalidArgument(
            f"no store at {parts.path} ({url}): these commands never create one; check the "
            "path (it is the --cluster URL the workers and programs use)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="percolator", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="tables, pending notifications, locks, quarantine")
    wait = sub.add_parser("wait", help="wait until observers have processed every notification")
    wait.add_argument("--timeout", type=float, default=None, help="seconds (default: forever)")
    retry = sub.add_parser("retry", help="put quarantined notifications back")
    retry.add_argument("table", nargs="?")
    retry.add_argument("row", nargs="?", help="row key (text, or hex:...)")
    retry.add_argument("column", nargs="?")
    for p in (status, wait, retry):
        p.add_argument("--cluster", required=True, help="store url, e.g. sqlite:///path.db")
        p.add_argument("--oracle",
                       help="timestamp oracle, grpc://host:port, grpcs://host:port or zk://...")
        p.add_argument("--zookeeper", help="ZooKeeper for coordination, host:port/chroot")
        add_zookeeper_tls_arguments(p, "oracle")
        add_zookeeper_tls_arguments(p, "zookeeper")
    args = parser.parse_args(argv)
    try:
        _check_store_exists(args.cluster)
        cluster = connect(
            args.cluster,
            oracle=args.oracle,
            oracle_tls=zookeeper_tls_from_arguments(args, "oracle"),
            zookeeper=args.zookeeper,
            zookeeper_tls=zookeeper_tls_from_arguments(args),
        )
    except PercolatorError as e:
        print(f"percolator: {e}", file=sys.stderr)
        return 2
    try:
        if args.command == "status":
            return _status(cluster)
        if args.command == "wait":
            try:
                wait_until_idle(cluster, args.timeout)
            except WaitTimeout as e:
                print(f"percolator wait: {e}", file=sys.stderr)
                return 1
            print("idle: no pending notification, no lock held")
            return 0
        row = parse_row(args.row) if args.row is not None else None
        records = retry_quarantined(cluster, args.table, row, args.column)
        for q in records:
            print(f"retrying {q.table}/{format_row(q.row)}/{q.column} (observer {q.observer})")
        print(f"{len(records)} notification(s) put back")
        return 0
    except PercolatorError as e:
        print(f"percolator: {e}", file=sys.stderr)
        return 2
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
