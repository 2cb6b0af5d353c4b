"""Quarantine records on every backend: a notification quarantined, put back with
retry, and quarantined again is visible again (on HBase a delete hides later puts at or
below its timestamp, so records must never be rewritten at an old timestamp)."""

from __future__ import annotations

import time

import percolator
from percolator._notifications import (
    Quarantined,
    clear_failures,
    pending_notifications,
    quarantine,
    quarantined,
    record_failure,
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


def test_failure_counts_are_shared_reset_by_a_new_notification_and_cleared(
    cluster: percolator.Cluster,
) -> None:
    cluster.create_table("docs")
    count = [record_failure(cluster, "docs", b"d1", "in:v", 100) for _ in range(3)]
    assert count == [1, 2, 3]
    assert record_failure(cluster, "docs", b"d2", "in:v", 100) == 1  # per cell
    assert record_failure(cluster, "docs", b"d1", "in:w", 100) == 1
    assert record_failure(cluster, "docs", b"d1", "in:v", 200) == 1  # a newer notification
    assert record_failure(cluster, "docs", b"d1", "in:v", 200) == 2
    clear_failures(cluster, "docs", b"d1", "in:v")
    assert record_failure(cluster, "docs", b"d1", "in:v", 200) == 1
    clear_failures(cluster, "docs", b"d9", "in:v")  # nothing counted: nothing to clear
