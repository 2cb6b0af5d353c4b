"""Smoke test of bench/peers.py (Apache Omid beside us on one real HBase), so that the
benchmark cannot rot while it is not run: the Java harness builds with Maven, Omid's
TSO starts against the HBase, and both sides complete a handful of transactions and a
short contended bank whose totals hold.

Omid speaks HBase's native RPC (it finds the cluster through ZooKeeper), so it needs a
standalone HBase started here (``tests/_hbase_local.py``), not a Thrift address: the
test is skipped when ``PERCOLATOR_HBASE_THRIFT`` names another server, and where Java
or Maven are missing (failed in CI). It starts an HBase of its own (module scope): the
suite's session HBase yields only its Thrift address, not the launcher whose
``hbase-site.xml`` the Java side needs.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests._services import service_missing

if TYPE_CHECKING:
    from tests._hbase_local import LocalHBase

pytestmark = pytest.mark.hbase


@pytest.fixture(scope="module")
def local_hbase() -> Iterator[LocalHBase]:
    if os.environ.get("PERCOLATOR_HBASE_THRIFT"):
        pytest.skip("Omid needs a standalone HBase of the suite's own (its ZooKeeper and "
                    "native RPC), not the Thrift server PERCOLATOR_HBASE_THRIFT names")
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            service_missing(f"{tool} is not installed (Omid and HBase are Java, built by Maven)")
    from tests._hbase_local import HBaseStartError, LocalHBase

    hbase = LocalHBase()
    try:
        hbase.start()
    except HBaseStartError as e:
        hbase.stop()
        service_missing(f"could not start a standalone HBase: {e}")
    try:
        yield hbase
    finally:
        hbase.stop()


# Starting HBase, building the harness (Maven, first time) and starting the TSO take
# 1-3 minutes on the shared 2-core machine; the operations themselves seconds.
@pytest.mark.timeout(900)
def test_both_sides_complete_transactions_and_keep_their_bank_totals(
    local_hbase: LocalHBase,
) -> None:
    from bench import peers

    args = argparse.Namespace(ops=4, chunk=2, rounds=1, threads=2, bank_seconds=1.0,
                              batch_timeout_ms=10, idle_seconds=0.5)
    with peers.session(args, local_hbase) as (run, java, py):
        peers.measure(args, run, java, py)
        banks = peers.bank(args, java, py)
    for started in ("java client", "tso", "oracle"):  # the session's own processes
        assert _gone(run.procs[started]), f"{started} left running"
    for name in peers.OPS:
        assert run.ops_done[name] == args.ops * args.rounds, name
        assert run.trips[name], name
    for side, result in banks.items():
        assert result["committed"] > 0, side
        assert result["total"] == peers.ACCOUNTS * peers.BALANCE, side
    lines = peers.report(args, run, banks, "smoke")
    assert any(line.startswith("| Omid single-cell txn |") for line in lines)
    assert any(line.startswith("| ours single-cell txn |") for line in lines)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True
