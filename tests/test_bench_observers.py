"""bench/observers.py's drains by worker processes (``--backend hbase-real``, issue 47),
run on the embedded store so that they cost seconds: the worker processes start
together, every notification is served once, and their own store calls are counted
per notification into the table (a smoke test: no timing is asserted; the real-HBase
run is the benchmark's)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import HBaseServers  # noqa: E402
from bench.observers import hbase_drain, hbase_report  # noqa: E402


def test_a_drain_by_two_worker_processes_counts_their_store_calls(tmp_path: Path) -> None:
    n = 40
    no_servers = HBaseServers(None, "", "", {}, "the embedded store")
    row = hbase_drain(f"sqlite:///{tmp_path}/drain.db", 2, n, 5, no_servers, "thrift2",
                      tmp_path)  # raises unless every one of the n rows was copied
    assert len(row["worker_cpu_pct"]) == 2
    # Each run of the Copier reads the cell it copies: at least one store read per
    # notification, counted in the worker processes (not in this one).
    assert row["calls"]["read_rows"] >= 1, row["calls"]
    args = argparse.Namespace(rounds=1, trickle_notifications=200, trickle_rate=20.0)
    text = hbase_report([2], n, {"thrift2": {2: [row]}}, {"thrift2": []}, no_servers,
                        "smoke", args, (0.0, 0.0))
    line = next(line for line in text.splitlines() if line.startswith("| thrift2 | 2 |"))
    everything = sum(row["calls"].values())
    timestamps = row["calls"].get("increment", 0.0)
    assert f"**{everything - timestamps:.2f}** ({everything:.2f})" in line
