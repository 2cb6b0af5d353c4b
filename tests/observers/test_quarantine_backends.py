"""Quarantine records on every backend: a notification quarantined, put back with
retry, and quarantined again is visible again (on HBase a delete hides later puts at or
below its timestamp, so records must never be rewritten at an old timestamp)."""

from __future__ import annotations

import time

import percolator
from percolator._notifications import (
    Quarantined,
    pending_notifications,
    quarantine,
    quarantined,
    retry_quarantined,
)


def test_quarantine_retry_quarantine_again(cluster: percolator.Cluster) -> None:
    cluster.create_table("docs")
    cluster.observe("docs", "in:v")
    with percolator.Transaction(cluster) as txn:
        txn.set("docs", b"d1", "in:v", b"x")
    [pending] = list(pending_notifications(cluster))
    record = Quarantined("docs", b"d1", "in:v", "Obs", "boom", 3, False, time.time())
    for round_ in range(2):
        notify_ts = max(p.timestamps[0] for p in pending_notifications(cluster))
        quarantine(cluster, record, notify_ts)
        assert [q.error for q in quarantined(cluster)] == ["boom"], f"round {round_}"
        assert not list(pending_notifications(cluster))
        assert [q.row for q in retry_quarantined(cluster)] == [b"d1"]
        assert quarantined(cluster) == []
        assert [p.row for p in pending_notifications(cluster)] == [b"d1"]
    assert pending.row == b"d1"
