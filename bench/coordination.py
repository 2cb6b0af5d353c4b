"""Benchmark of ZooKeeper coordination (issue 4).

    python bench/coordination.py                 # about a minute; updates BENCHMARKS.md
    python bench/coordination.py --no-write      # print only

Starts its own ZooKeeper (Debian's ``zookeeper`` package, as the tests do) and kills it
at the end.

1. **Death to resolution**: a child process connects with ZooKeeper coordination
   (session timeout ``--session-timeout``, lock ttl 60 s), prewrites two cells and is
   killed with SIGKILL; the parent reads a locked cell; time from the kill to the read
   returning (the locks rolled back). Same with the embedded coordination (pid check).
2. **ZooKeeper operations per committed transaction** in the steady state: counted by
   the coordinator (every call it makes) and by the server (``srvr`` Received packets,
   minus the pings counted over an idle period of the same length).
3. **Advisory locks per processed notification**: two coordinators (two sessions, as
   two worker processes) with two scanner threads each take ``try_advisory_lock`` on
   keys ``table/<row hash bucket>`` (256 buckets, as the observer scanners use) for random
   notifications and release them; ZooKeeper writes per processed notification, the
   cost of a try/release pair, and how often a scanner was sent elsewhere.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, ROOT)

import percolator  # noqa: E402
from bench._common import cpu_model, write_section  # noqa: E402
from percolator.ext import (  # noqa: E402
    CrashPoint,
    SimulatedCrash,
    commit_transaction,
    internals,
)
from tests._zookeeper import ZooKeeperServer, four_letter  # noqa: E402

SECTION = "## ZooKeeper coordination (bench/coordination.py)"


def locker(store: str, zookeeper: str, session_timeout: float) -> None:
    """``bench/coordination.py _locker``: prewrite two cells, report, wait to be killed."""
    options: dict[str, Any] = {}
    if zookeeper != "-":
        options = {"zookeeper": zookeeper, "zookeeper_session_timeout": session_timeout}
    cluster = percolator.connect(store, lock_ttl=60.0, **options)
    txn = cluster.transaction()
    txn.set("t", b"r1", "c:v", b"new")
    txn.set("t", b"r2", "c:v", b"new")
    try:
        commit_transaction(txn, CrashPoint("prewrite", 1))
    except SimulatedCrash:
        pass
    print("LOCKED", flush=True)
    sys.stdin.read()


def seed(path: str) -> str:
    url = f"sqlite:///{path}"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with cluster.transaction() as txn:
            txn.set("t", b"r1", "c:v", b"old")
            txn.set("t", b"r2", "c:v", b"old")
    return url


def death_to_resolution(
    zk: ZooKeeperServer | None, session_timeout: float, runs: int
) -> list[float]:
    times = []
    for _ in range(runs):
        tmp = tempfile.mkdtemp(prefix="bench-coord-")
        url = seed(os.path.join(tmp, "repo.db"))
        chroot = zk.create_chroot() if zk is not None else "-"
        options: dict[str, Any] = {} if zk is None else {
            "zookeeper": chroot, "zookeeper_session_timeout": session_timeout,
        }
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_locker", url, chroot,
             str(session_timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("LOCKED")
            with percolator.connect(url, lock_ttl=60.0, **options) as cluster:
                proc.send_signal(signal.SIGKILL)
                killed = time.monotonic()
                proc.wait()
                with cluster.transaction() as txn:
                    assert txn.get("t", b"r2", "c:v") == b"old"
                times.append(time.monotonic() - killed)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return times


def received(zk: ZooKeeperServer) -> int:
    m = re.search(r"Received: (\d+)", four_letter(zk.hosts, "srvr"))
    assert m, "srvr gave no Received count"
    return int(m.group(1))


def ops_per_transaction(zk: ZooKeeperServer, transactions: int) -> dict[str, float]:
    tmp = tempfile.mkdtemp(prefix="bench-coord-")
    url = seed(os.path.join(tmp, "repo.db"))
    chroot = zk.create_chroot()
    with percolator.connect(url, zookeeper=chroot) as cluster:
        cluster.observe("t", "c:v")
        for i in range(20):  # warm up: watches set, caches filled
            with cluster.transaction() as txn:
                txn.set("t", b"w%d" % i, "c:v", b"x")
        coord: Any = internals(cluster).coordination
        ops0, recv0, t0 = coord.stats["zk_ops"], received(zk), time.monotonic()
        for i in range(transactions):
            with cluster.transaction() as txn:
                txn.get("t", b"r%d" % (i % 50), "c:v")
                txn.set("t", b"r%d" % (i % 50), "c:v", b"%d" % i)
                txn.set("t", b"s%d" % (i % 50), "c:v", b"%d" % i)
        elapsed = time.monotonic() - t0
        ops, recv1 = coord.stats["zk_ops"] - ops0, received(zk)
        time.sleep(elapsed)  # the same length of idleness: pings only
        idle = received(zk) - recv1
        busy = recv1 - recv0  # each count includes one srvr exchange, like idle below
    return {
        "transactions": transactions,
        "seconds": elapsed,
        "client_ops": ops,
        "server_packets_busy": busy,
        "server_packets_idle": idle,
        "per_txn": ops / transactions,
        "per_txn_server": max(0, busy - idle) / transactions,
    }


def advisory(zk: ZooKeeperServer, seconds: float) -> dict[str, float]:
    from percolator.ext import ZooKeeperCoordination

    chroot = zk.create_chroot()
    coords = [ZooKeeperCoordination(chroot) for _ in range(2)]
    stop = threading.Event()
    counts = {"processed": 0, "refused": 0, "seconds_in_calls": 0.0}
    lock = threading.Lock()

    def scanner(coord: ZooKeeperCoordination, seed_: int) -> None:
        import random

        rnd = random.Random(seed_)
        processed = refused = 0
        spent = 0.0
        row = rnd.randrange(1_000_000)
        while not stop.is_set():
            row += 1  # a scanner walks rows in key order from a random start
            key = f"t/{zlib.crc32(b'row%d' % row) % 256}"
            t = time.perf_counter()
            ok = coord.try_advisory_lock(key)
            if ok:
                coord.release_advisory_lock(key)
            spent += time.perf_counter() - t
            if ok:
                processed += 1
                time.sleep(0.0005)  # the observer's transaction (kept short)
            else:
                refused += 1
                row = rnd.randrange(1_000_000)  # anti-clumping: jump elsewhere
        with lock:
            counts["processed"] += processed
            counts["refused"] += refused
            counts["seconds_in_calls"] += spent

    ops0 = sum(c.stats["zk_ops"] for c in coords)
    threads = [
        threading.Thread(target=scanner, args=(c, i * 2 + j))
        for i, c in enumerate(coords) for j in range(2)
    ]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    ops = sum(c.stats["zk_ops"] for c in coords) - ops0
    leases = sum(c.stats["lease_acquired"] for c in coords)
    for c in coords:
        c.close()
    calls = counts["processed"] + counts["refused"]
    return {
        "seconds": seconds,
        "processed": counts["processed"],
        "refused": counts["refused"],
        "zk_ops": ops,
        "leases": leases,
        "ops_per_notification": ops / max(1, counts["processed"]),
        "us_per_call": 1e6 * counts["seconds_in_calls"] / max(1, calls),
    }


def report(args: argparse.Namespace, res: dict[str, Any]) -> str:
    zk_times, local_times = res["zk_death"], res["local_death"]
    ops, adv = res["ops"], res["advisory"]
    zk_row = (
        f"| ZooKeeper, session timeout {args.session_timeout:g} s "
        f"| {statistics.mean(zk_times):.2f} s | {min(zk_times):.2f} s "
        f"| {max(zk_times):.2f} s | session timeout, not the 60 s ttl |"
    )
    local_row = (
        f"| embedded (pid check) | {statistics.mean(local_times) * 1000:.1f} ms "
        f"| {min(local_times) * 1000:.1f} ms | {max(local_times) * 1000:.1f} ms | immediate |"
    )
    rows = zk_row + "\n" + local_row + "\n"
    return f"""{SECTION}

Machine: {os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()},
ZooKeeper from Debian's `zookeeper` package (standalone, tickTime 500 ms), store SQLite.
Date: {datetime.date.today().isoformat()}. Command: `python bench/coordination.py
--runs {args.runs} --session-timeout {args.session_timeout:g}
--transactions {args.transactions} --advisory-seconds {args.advisory_seconds:g}`.

**Owner death to locks resolved** (child prewrites 2 cells with lock ttl 60 s, gets
`kill -9`; parent reads a locked cell; {args.runs} runs each):

| coordination | mean | min | max | bound |
|---|---|---|---|---|
{rows}
**ZooKeeper operations per committed transaction** (steady state, {ops["transactions"]}
transactions each reading 1 and writing 2 cells, one of them an observed column, in
{ops["seconds"]:.1f} s): **{ops["per_txn"]:g}** counted by the coordinator
({ops["client_ops"]} operations); server side `srvr` Received grew by
{ops["server_packets_busy"]} packets while committing vs {ops["server_packets_idle"]} during
the same length of idleness (session pings), i.e. {ops["per_txn_server"]:.3f} per
transaction. Target 0: owner id, liveness and the observed-column registry are all
served from watch-fed memory.

**Advisory locks per processed notification** (2 sessions x 2 scanner threads,
{adv["seconds"]:g} s, keys `table/<row hash % 256>`, 1024 lease buckets, lease kept
2 s after last use): {adv["processed"]} notifications processed, {adv["refused"]}
refusals (scanner jumped elsewhere), {adv["leases"]} bucket leases taken,
{adv["zk_ops"]} ZooKeeper operations in all = **{adv["ops_per_notification"]:.4f} per
processed notification**; a `try_advisory_lock` + `release_advisory_lock` pair costs
{adv["us_per_call"]:.1f} µs on average (in memory when the bucket is already leased; one
ephemeral create when not).
"""


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_locker":
        locker(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--session-timeout", type=float, default=2.0)
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--advisory-seconds", type=float, default=10.0)
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    args = parser.parse_args()
    with ZooKeeperServer() as zk:
        res = {
            "zk_death": death_to_resolution(zk, args.session_timeout, args.runs),
            "local_death": death_to_resolution(None, args.session_timeout, args.runs),
            "ops": ops_per_transaction(zk, args.transactions),
            "advisory": advisory(zk, args.advisory_seconds),
        }
    text = report(args, res)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
