"""Smoke test of bench/peers.py (Apache Omid beside us on one real HBase), so that the
benchmark cannot rot while it is not run: the Java harness builds with Maven, Omid's
TSO starts against the HBase at one batch timeout (Omid's default, 10 ms), and both
sides complete a handful of operations, a short contended bank and uncontended
transfers from client processes (JVMs and Python processes), every bank's total
holding. The benchmark's default run goes on to a second timeout with a new TSO in the
same session: the same steps again at a TSO JVM's start and a client JVM's a side, too
dear for the suite (the suite's time, CONTRIBUTING.md).

Omid speaks HBase's native RPC (it finds the cluster through ZooKeeper), so it needs
the conf directory of the HBase, not only a Thrift address: the suite's session HBase
(``tests._hbase.local_hbase``: the launcher, whose ``hbase-site.xml`` the Java side
needs), or an HBase of your own that ``PERCOLATOR_HBASE_CONF`` names with
``PERCOLATOR_HBASE_THRIFT`` and ``PERCOLATOR_HBASE_THRIFT2``. Skipped when
``PERCOLATOR_HBASE_THRIFT`` names another server without its conf, and where Java or
Maven are missing (failed in CI). Everything is as small as it can be and still run
every step: the test pays for the harness, a TSO and a client process a side.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import pytest

from tests._services import service_missing

if TYPE_CHECKING:
    from bench._common import HBaseServers

pytestmark = pytest.mark.hbase


@pytest.fixture
def peers_hbase(request: pytest.FixtureRequest) -> HBaseServers:
    from bench._common import HBASE_CONF_ENV, hbase_servers_from_env, hbase_servers_of

    if os.environ.get(HBASE_CONF_ENV):
        servers = hbase_servers_from_env(need_conf=True)
        assert servers is not None
        return servers
    return hbase_servers_of(request.getfixturevalue("local_hbase"))


# Building the harness (Maven, first time) and starting the TSO take up to a few
# minutes on a crowded 2-core machine; the operations themselves seconds.
@pytest.mark.timeout(900)
def test_both_sides_complete_transactions_and_keep_their_bank_totals(
    peers_hbase: HBaseServers,
) -> None:
    if shutil.which("mvn") is None:
        service_missing("mvn is not installed (it builds the Omid harness, bench/peers/)")
    from bench import peers

    args = peers.parse_args([
        "--batch-timeout-ms", "10", "--ops", "2", "--chunk", "2", "--rounds", "1",
        "--threads", "2", "--clients", "1", "--accounts", "10", "--bank-seconds", "0.3",
        "--warmup-seconds", "0.1", "--rows", "10", "--trip-ops", "1", "--idle-seconds", "0.1",
    ])
    with peers.session(args, peers_hbase) as session:
        run = peers.measure_at(args, session, 10)
    started = [session.java.pid, session.oracle.process.pid, *session.client_pids,
               run.procs["tso"]]
    assert len(session.client_pids) == 2  # one a side
    assert [pid for pid in started if not _gone(pid)] == [], "left running"
    assert run.batch_timeout_ms == 10
    for name in peers.operations(args.api):
        assert run.ops_done[name] == args.ops * args.rounds, name
        assert run.trips[name], name
    for side, result in [*run.banks.items(), *run.uncontended.items()]:
        assert result["committed"] > 0, side
    assert len(run.uncontended) == 4
    # Every bank's total, each side's: the benchmark fails a run where one breaks
    # (broken_totals).
    contended, loose = peers.ACCOUNTS * peers.BALANCE, args.accounts * peers.BALANCE
    assert [(side, b["total"]) for side, b in run.banks.items()] == [
        ("Omid", contended), ("ours", contended)]
    assert [b["total"] for b in run.uncontended.values()] == [loose] * 4
    assert peers.broken_totals(args, [run]) == []
    lines = peers.report(args, [run], "smoke", session.servers)
    # The section a run at one timeout writes to BENCHMARKS.md, under its own heading.
    assert lines[0] == ("## Side by side with Apache Omid on one HBase, TSO batch timeout "
                        "10 ms (bench/peers.py)")
    for row in ("| single-cell txn, one client |", "| uncontended, 1 client processes",
                "| Omid single-cell txn |", "| ours single-cell txn |",
                "| Omid, 1 client processes (JVMs) |", "| ours, 1 client processes (Python) |"):
        assert sum(line.startswith(row) for line in lines) == 1, row
    # The default run, at both timeouts, keeps the section of issue 47.
    assert peers.heading(peers.parse_args(["--clients", "1"])) == peers.BOTH_HEADING.format(
        clients=1)

def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True
