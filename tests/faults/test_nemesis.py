"""Issue 21: the whole system in network namespaces under a seeded nemesis.

ZooKeeper, the Bigtable emulator, two oracle replicas and client hosts (each with a
workload process and an observer worker) run in their own namespaces
(``tests/faults/_cluster.py``); a nemesis (``tests/faults/_nemesis.py``) partitions
nodes, isolates the oracle leader from ZooKeeper, pauses processes past the session
timeout and the lock TTL, and kills and restarts them. Every run then heals, waits for
quiescence and checks the histories (``tests/faults/_checks.py``): bank, list-append
(Elle-style), timestamps, observers. It prints the seed (replay with
``PERCOLATOR_NEMESIS_SEED=N``), the schedule, the operations attempted, acknowledged,
failed and indeterminate, the throughput with and without faults, and the anomalies.

The short run is part of the normal test command; the long one needs ``--run-slow``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.faults._checks import Report, check_run
from tests.faults._cluster import FaultCluster
from tests.faults._nemesis import SEED_ENV, Nemesis, nemesis_seed, schedule
from tests.faults._netns import require_netns

pytestmark = [pytest.mark.zk, pytest.mark.bigtable, pytest.mark.hbase, pytest.mark.oracle]

#: How long the workloads may take to stop once asked after the heal: every client
#: call has a deadline (oracle, store RPC, lock wait), so this is "never", not speed.
STOP_WITHIN = 90.0


def run_nemesis(workdir: Path, seconds: float, store: str, *,
                split_brain: bool = False) -> Report:
    require_netns()
    seed = nemesis_seed()
    print(f"\nnemesis seed {seed} (replay: {SEED_ENV}={seed}), store {store}")
    began = time.monotonic()
    with FaultCluster(workdir, store=store, split_brain=split_brain) as cluster:
        cluster.start()
        faults = [] if split_brain else schedule(seed, seconds, cluster.settings)
        for fault in faults:
            print(f"  {fault}")
        nemesis = Nemesis(cluster, faults)
        cluster.wait_workloads_running(180.0)
        run_from = time.time()
        nemesis.run(seconds)
        run_to = time.time()
        hung = cluster.stop_workloads(STOP_WITHIN)
        # (a broken system may never catch up: no need to wait long to see it)
        final = cluster.wait_observers_caught_up(15.0 if split_brain else 90.0)
        run = {
            "seed": seed, "store": store, "from": run_from, "to": run_to,
            "lease": cluster.settings.oracle_session * 0.5,
            "applied": [{"kind": a.fault.kind, "target": a.target, "start": a.start,
                         "end": a.end} for a in nemesis.applied],
        }
        # kept with the histories: python -m tests.faults._checks DIR checks them again
        (cluster.dir / "run.json").write_text(json.dumps(run))
        (cluster.dir / "final.json").write_text(json.dumps(final))
        report = check_run(cluster.dir)
        for name in hung:
            report.add("hung", f"did not stop within {STOP_WITHIN:g}s: {name}")
        kinds = Counter(f.kind for f in faults)
        report.notes.insert(0, f"faults injected: {len(faults)} ("
                            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + ")")
    report.notes.append(f"runtime: {time.monotonic() - began:.0f}s "
                        f"(nemesis {seconds:.0f}s)")
    print(report.summary())
    return report


STORES = ["bigtable", "hbase"]


@pytest.mark.parametrize("store", STORES)
def test_short_nemesis_run(tmp_path: Path, store: str) -> None:
    """About a minute per store (two minutes in all) of faults, then the checks."""
    report = run_nemesis(tmp_path, 50.0, store)
    assert report.anomalies == {}, report.summary()
    assert report.counts["bank"]["ok"] > 0 and report.counts["append"]["ok"] > 0


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("store", STORES)
def test_long_nemesis_run(tmp_path: Path, store: str) -> None:
    """Twenty minutes of faults per store (``--run-slow``)."""
    report = run_nemesis(tmp_path, 20 * 60.0, store)
    assert report.anomalies == {}, report.summary()


def test_the_checks_catch_a_split_brain_oracle(tmp_path: Path) -> None:
    """The same run against a system broken on purpose (two oracles that each serve
    from their own ceiling, one per client host; no fault injected): the checkers must
    report it. Without this, "anomalies: 0" above could mean checkers that see nothing."""
    report = run_nemesis(tmp_path, 10.0, "bigtable", split_brain=True)
    assert "timestamp-reissued" in report.anomalies, report.summary()
