"""The ``percolator`` command: status, wait, retry, gc, backup, restore and conformance.

::

    percolator status --cluster sqlite:///var/lib/app/repo.db   (or: percolator status URL)
    percolator wait   --cluster URL --timeout 60
    percolator retry  --cluster URL [TABLE [ROW [COLUMN]]]
    percolator gc     --cluster URL [--retention SECONDS] [--dry-run] [--vacuum]
    percolator backup  URL FILE       (embedded store: one consistent file, writers running)
    percolator restore FILE URL       (a new embedded store from it)
    percolator conformance --cluster URL [--checks ...] [--duration S] [--json FILE]

Rows are written as UTF-8 text, or ``hex:...`` for other bytes (as ``status`` shows them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

from percolator._cluster import Cluster, connect
from percolator._errors import InvalidArgument, PercolatorError
from percolator._gc import DEFAULT_MAX_TXN_AGE, DEFAULT_RETENTION, GcSummary
from percolator._internals import internals
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
from percolator.stores.sqlite import sqlite_path


def _status(cluster: Cluster) -> int:
    tables = cluster.tables()
    observed = sorted(cluster.observed_columns())
    print(f"cluster {cluster.url}")
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
    parts = internals(cluster)
    if parts.lock_census is not None:
        if not locks:
            parts.sweep_locks(force=True)
        print("lock census: " + ("clear (reads skip the lock family)" if parts.lock_census.clean()
                                 else "set (reads check locks until a sweep finds none held)"))
    _safe_point_status(cluster)
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


def _safe_point_status(cluster: Cluster) -> None:
    parts = internals(cluster)
    sp = parts.safe_point
    record = sp.read_record()
    if record is None:
        print("gc safe point: none (no garbage collection has run)")
    else:
        ts, wall_ms = record
        age = time.time() - wall_ms / 1000
        print(f"gc safe point: {ts}, set {_duration(age)} ago")
    holders = [h for h in sp.holders() if h.owner != parts.coordination.current_owner()]
    if not holders:
        print("  held back by: no running transaction (only the retention limits it)")
    for h in holders[:5]:
        alive = {True: "alive", False: "dead", None: "liveness unknown"}[h.alive]
        print(f"  held back by: transaction {h.start_ts} of {h.owner} ({alive}), "
              f"running for {_duration(time.time() - h.began)}")
    if len(holders) > 5:
        print(f"  ... and {len(holders) - 5} more clients")


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"


class _Progress:
    """A progress bar of rows scanned: tqdm (the ``progress`` extra) when installed,
    else a line on stderr every few seconds."""

    def __init__(self) -> None:
        self.rows, self._last = 0, time.monotonic()
        try:
            from tqdm import tqdm

            self._bar: Any = tqdm(desc="gc", unit=" rows", file=sys.stderr)
        except ImportError:
            self._bar = None

    def __call__(self, rows: int) -> None:
        self.rows += rows
        if self._bar is not None:
            self._bar.update(rows)
        elif time.monotonic() - self._last > 5:
            print(f"gc: {self.rows} rows scanned", file=sys.stderr, flush=True)
            self._last = time.monotonic()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _gc(cluster: Cluster, args: argparse.Namespace) -> int:
    progress = _Progress()
    try:
        summary = cluster.gc(retention=args.retention, max_txn_age=args.max_txn_age,
                             dry_run=args.dry_run, vacuum=args.vacuum, progress=progress)
    finally:
        progress.close()
    _print_summary(summary)
    return 0


def _print_summary(s: GcSummary) -> None:
    verb = "would remove" if s.dry_run else "removed"
    print(f"safe point: {s.safe_point} (was {s.previous_safe_point}; {s.held_back_by})"
          + ("" if s.collected_below == s.safe_point else
             f"; collected below {s.collected_below} only: {s.locks_left} live lock(s) older"))
    print(f"rows scanned: {s.rows_scanned}")
    print(f"{verb}: {s.versions_removed} versions ({s.bytes_removed} bytes), "
          f"{s.cells_removed} deleted cells entirely; locks resolved: {s.locks_resolved}")
    if s.bytes_freed is not None:
        print(f"vacuum returned {s.bytes_freed} bytes to the file system")
    print(f"took {s.seconds:.1f}s" + (" (dry run: nothing changed)" if s.dry_run else ""))


def _check_store_exists(url: str) -> None:
    """These commands look at a repository; opening an embedded store that is not there
    would create an empty one (and report it idle), so refuse instead."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc or not parts.path.strip("/"):
        return  # not an embedded store's file (open_store says what is wrong with it)
    path = sqlite_path(parts.path)
    if not os.path.exists(path):
        raise InvalidArgument(
            f"no store at {path} ({url}): these commands never create one; check the "
            "path (it is the --cluster URL the workers and programs use)"
        )


def _looks_like_url(text: str | None) -> bool:
    scheme = urlsplit(text or "").scheme
    return bool(scheme) and (scheme == "sqlite" or "://" in (text or ""))


def _take_positional_url(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``percolator status URL`` as ``--cluster URL`` (as git- or kubectl-style tools
    take their target); for ``retry`` a first argument that is a url, not a table."""
    url = getattr(args, "url", None)
    if args.command == "retry" and args.cluster is None and _looks_like_url(args.table):
        url, args.table, args.row, args.column = args.table, args.row, args.column, None
    if url is not None and args.cluster is not None and url != args.cluster:
        parser.error(f"two repositories given: {url} and --cluster {args.cluster}; give one")
    args.cluster = args.cluster or url
    if args.cluster is None:
        parser.error(f"{args.command} needs the repository: percolator {args.command} URL "
                     "(or --cluster URL), e.g. sqlite:///var/lib/app/repo.db")


def _backup_or_restore(argv: list[str]) -> int:
    """``percolator backup URL FILE`` and ``percolator restore FILE URL`` (embedded store)."""
    from percolator._backup import backup, restore

    command = argv[0]
    parser = argparse.ArgumentParser(prog=f"percolator {command}", description=(
        "Copy an embedded store to one file, consistently, while its writers run "
        "(docs/embedded.md)" if command == "backup" else
        "Make a new embedded store from a backup: its locks resolved, its timestamps "
        "above every one in the backup (docs/embedded.md)"))
    if command == "backup":
        parser.add_argument("url", metavar="URL", help="the store, e.g. sqlite:///var/lib/app/repo.db")
        parser.add_argument("file", metavar="FILE",
                            help="the backup file to write (must not exist)")
    else:
        parser.add_argument("file", metavar="FILE", help="a file written by percolator backup")
        parser.add_argument("url", metavar="URL",
                            help="the new store, e.g. sqlite:///var/lib/app/restored.db "
                                 "(its file must not exist)")
    args = parser.parse_args(argv[1:])
    try:
        if command == "backup":
            done = backup(args.url, args.file)
            print(f"backed up {args.url} to {done.destination} ({done.bytes} bytes)")
        else:
            done = restore(args.file, args.url)
            print(f"restored {args.file} to {args.url} ({done.bytes} bytes; "
                  f"{done.locks_resolved} lock(s) of transactions in flight resolved)")
    except PercolatorError as e:
        print(f"percolator {command}: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["backup"], ["restore"]):
        return _backup_or_restore(argv)
    if argv[:1] == ["conformance"]:
        # its own parser (and options): see percolator.conformance
        from percolator.conformance.__main__ import main as conformance

        return conformance(argv[1:], prog="percolator conformance")
    parser = argparse.ArgumentParser(prog="percolator", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="tables, pending notifications, locks, quarantine")
    wait = sub.add_parser("wait", help="wait until observers have processed every notification")
    wait.add_argument("--timeout", type=float, default=None, help="seconds (default: forever)")
    retry = sub.add_parser("retry", help="put quarantined notifications back")
    retry.add_argument("table", nargs="?")
    retry.add_argument("row", nargs="?", help="row key (text, or hex:...)")
    retry.add_argument("column", nargs="?")
    gc = sub.add_parser("gc", help="one garbage-collection pass: remove old versions")
    gc.add_argument("--retention", type=float, default=DEFAULT_RETENTION,
                    help=f"seconds of history to keep (default {DEFAULT_RETENTION:.0f})")
    gc.add_argument("--max-txn-age", type=float, default=DEFAULT_MAX_TXN_AGE,
                    help="seconds after which a running transaction stops holding "
                         f"garbage collection back (default {DEFAULT_MAX_TXN_AGE:.0f})")
    gc.add_argument("--dry-run", action="store_true", help="count, change nothing")
    gc.add_argument("--vacuum", action="store_true",
                    help="then return free space to the file system (embedded store)")
    sub.add_parser("backup", add_help=False,
                   help="copy an embedded store to one file while it runs "
                        "(percolator backup URL FILE)")
    sub.add_parser("restore", add_help=False,
                   help="a new embedded store from a backup (percolator restore FILE URL)")
    sub.add_parser("conformance", add_help=False,
                   help="certify a cluster: snapshot-isolation checks in tables of their own "
                        "(percolator conformance --help)")
    for p in (status, wait, gc):
        p.add_argument("url", nargs="?", metavar="URL",
                       help="the repository's url (the same as --cluster URL)")
    for p in (status, wait, retry, gc):
        p.add_argument("--cluster", help="store url, e.g. sqlite:///path.db (or give it as the "
                                         "first argument: percolator status URL)")
        p.add_argument("--oracle",
                       help="timestamp oracle, grpc://host:port, grpcs://host:port or zk://...")
        p.add_argument("--zookeeper", help="ZooKeeper for coordination, host:port/chroot")
        add_zookeeper_tls_arguments(p, "oracle")
        add_zookeeper_tls_arguments(p, "zookeeper")
    args = parser.parse_args(argv)
    _take_positional_url(parser, args)
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
        if args.command == "gc":
            return _gc(cluster, args)
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
