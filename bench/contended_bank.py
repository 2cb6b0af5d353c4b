"""Our side of bench/peers.py's contended bank alone, with where its client CPU goes: 20
accounts, 8 threads in one process, over HBase's Thrift2 server, timestamps from a
``python -m oracle`` of the run's own; no JVM.

    python bench/contended_bank.py                      # PERCOLATOR_HBASE_THRIFT2, or
    python bench/contended_bank.py --thrift2 127.0.0.1:9091 --seconds 15 --rounds 2

Per round: committed transfers/s, the abort rate, this process's CPU per attempt and per
committed transfer (``time.process_time``: on a shared machine, the robust figure), store
reads and compare-and-sets per committed transfer, and the lock waits (met, seconds
waited, resolved by the reader); then the CPU per committed transfer of the oracle and
of the servers listening on the ``--charge`` ports (HBase's Thrift2 server and region
server, say: on a shared HBase, other clients' work is charged too). Run it from two
checkouts (``PYTHONPATH``) to compare. ``--accounts 1000`` is the uncontended bank.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import percolator
from bench._common import pid_listening_on
from bench.overhead import standalone_oracle
from bench.peers import ACCOUNTS, BALANCE, account, transfers
from percolator import metrics
from percolator.ext import internals
from tests._hbase import hbase_store_url


def _counters() -> dict[str, float]:
    return {f"{name}{'/' if labels else ''}{','.join(labels)}": value
            for (name, labels), value in metrics.snapshot()[0].items()}


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process *pid* so far (0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--thrift2", default=os.environ.get("PERCOLATOR_HBASE_THRIFT2"),
                        help="host:port of HBase's Thrift2 server (default: "
                             "PERCOLATOR_HBASE_THRIFT2)")
    parser.add_argument("--accounts", type=int, default=ACCOUNTS)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--charge", type=int, action="append", default=[], metavar="PORT",
                        help="also report the CPU per commit of the process listening "
                             "on PORT (repeatable)")
    args = parser.parse_args(argv)
    charged = {port: pid_listening_on(port) for port in args.charge}
    if not args.thrift2:
        parser.error("give --thrift2 HOST:PORT or set PERCOLATOR_HBASE_THRIFT2")
    oracle_pid = None

    def cpu_of() -> dict[str, float]:
        pids = {"oracle": oracle_pid, **{f":{port}": pid for port, pid in charged.items()}}
        return {name: _cpu_seconds(pid) for name, pid in pids.items() if pid is not None}

    with standalone_oracle() as oracle, percolator.connect(
            hbase_store_url(args.thrift2, "contended", api="thrift2"), oracle=oracle) as cluster:
        cluster.create_table("bank")
        oracle_pid = pid_listening_on(int(oracle.rpartition(":")[2]))
        try:
            with percolator.Transaction(cluster) as txn:
                for i in range(args.accounts):
                    txn.set("bank", account(i), "c:balance", str(BALANCE).encode())
            transfers(cluster, args.accounts, args.threads, 2.0)  # warm, uncounted
            for r in range(args.rounds):
                before, resolved = _counters(), internals(cluster).stats["locks_resolved"]
                cpu, servers = time.process_time(), cpu_of()
                done = transfers(cluster, args.accounts, args.threads, args.seconds, seed=r + 1)
                cpu = time.process_time() - cpu
                servers = {k: v - servers[k] for k, v in cpu_of().items()}
                after = _counters()
                spent = {k: v - before.get(k, 0) for k, v in after.items()}.get

                committed, attempts = done["committed"], done["committed"] + done["aborted"]
                print(f"round {r + 1}: {committed / done['seconds']:.1f} committed/s, abort "
                      f"{100 * done['aborted'] / attempts:.1f}%, CPU "
                      f"{1000 * cpu / attempts:.2f} ms/attempt "
                      f"{1000 * cpu / committed:.2f} ms/commit, per commit: reads "
                      f"{spent('percolator_store_requests_total/read_rows', 0) / committed:.2f}"
                      f" compare-and-sets "
                      f"{spent('percolator_store_requests_total/check_and_set', 0) / committed:.2f}"
                      f"; locks met {spent('percolator_locks_met_total', 0):.0f}, waited "
                      f"{spent('percolator_lock_wait_seconds_total', 0):.1f} s, resolved "
                      f"{internals(cluster).stats['locks_resolved'] - resolved}; load "
                      f"{os.getloadavg()[0]:.1f}; CPU per commit elsewhere: "
                      + ", ".join(f"{k} {1000 * v / committed:.2f} ms"
                                  for k, v in servers.items()), flush=True)
            with percolator.Transaction(cluster) as txn:
                found = txn.get_rows("bank", [account(i) for i in range(args.accounts)],
                                     ["c:balance"])
            total = sum(int(found[account(i)]["c:balance"]) for i in range(args.accounts))
            print(f"total {total} (expected {args.accounts * BALANCE})")
            return 0 if total == args.accounts * BALANCE else 1
        finally:
            cluster.drop_table("bank")


if __name__ == "__main__":
    raise SystemExit(main())
