"""Smoke test of bench/peers.py (Apache Omid beside us on one real HBase), so that the
benchmark cannot rot while it is not run: the Java harness builds with Maven, Omid's
TSO starts against the HBase at each of two batch timeouts in one run, and both sides
complete a handful of operations, a short contended bank and uncontended transfers
from client processes (JVMs and Python processes), every bank's total holding.

Omid speaks HBase's native RPC (it finds the cluster through ZooKeeper), so it needs
the conf directory of the HBase, not only a Thrift address: the suite's session HBase
(``tests._hbase.local_hbase``: the launcher, whose ``hbase-site.xml`` the Java side
needs), or an HBase of your own that ``PERCOLATOR_HBASE_CONF`` names with
``PERCOLATOR_HBASE_THRIFT`` and ``PERCOLATOR_HBASE_THRIFT2``. Skipped when
``PERCOLATOR_HBASE_THRIFT`` names another server without its conf, and where Java or
Maven are missing (failed in CI). Everything is as small as it can be and still run
every step: the test pays for the harness, two TSOs and two client processes a side.
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
        "--batch-timeout-ms", "10,1", "--ops", "2", "--chunk", "2", "--rounds", "1",
        "--threads", "2", "--clients", "1", "--accounts", "10", "--bank-seconds", "0.3",
        "--warmup-seconds", "0.1", "--rows", "10", "--trip-ops", "1", "--idle-seconds", "0.1",
    ])
    with peers.session(args, peers_hbase) as session:
        runs = [peers.measure_at(args, session, t) for t in args.batch_timeout_ms]
    started = [session.java.pid, session.oracle.process.pid, *session.client_pids,
               *(run.procs["tso"] for run in runs)]
    assert len(session.client_pids) == 2 * len(runs)  # one a side at each timeout
    assert [pid for pid in started if not _gone(pid)] == [], "left running"
    assert [run.batch_timeout_ms for run in runs] == [10, 1]
    for run in runs:
        for name in peers.operations(args.api):
            assert run.ops_done[name] == args.ops * args.rounds, name
            assert run.trips[name], name
        for side, result in [*run.banks.items(), *run.uncontended.items()]:
            assert result["committed"] > 0, side
        assert len(run.uncontended) == 4
    # Every bank's total, each side's at each timeout: the benchmark fails a run where
    # one breaks (broken_totals).
    contended, loose = peers.ACCOUNTS * peers.BALANCE, args.accounts * peers.BALANCE
    assert [(run.batch_timeout_ms, side, b["total"]) for run in runs
            for side, b in run.banks.items()] == [
        (t, side, contended) for t in (10, 1) for side in ("Omid", "ours")]
    assert [b["total"] for run in runs for b in run.uncontended.values()] == [loose] * 8
    assert peers.broken_totals(args, runs) == []
    lines = peers.report(args, runs, "smoke", session.servers)
    assert lines[0] == peers.BOTH_HEADING.format(clients=1)
    for row in ("| single-cell txn, one client |", "| uncontended, 1 client processes"):
        assert sum(line.startswith(row) for line in lines) == 1, row  # the summary's
    for row in ("| Omid single-cell txn |", "| ours single-cell txn |",
                "| Omid, 1 client processes (JVMs) |", "| ours, 1 client processes (Python) |"):
        assert sum(line.startswith(row) for line in lines) == len(runs), row  # each timeout's


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True
