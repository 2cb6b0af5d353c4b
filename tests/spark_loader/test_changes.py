"""The change feed's store half (spark_loader._commit_range), without Spark: where a batch
may end while a two-phase commit is between drawing its commit timestamp and making
its commit point, or has made it but not yet written its write records, run
deterministically with the interleaving harness on SQLite and HBase."""

from __future__ import annotations

from pathlib import Path

import pytest

import percolator
from percolator._interleaving import Interleaving
from percolator._internals import internals
from percolator.testing import client_of
from spark_loader._commit_range import changes, safe_end
from tests._backends import drop_tables, make_store_url


def _feed(cluster: percolator.Cluster, start: int, end: int) -> list[tuple[object, ...]]:
    return list(changes(cluster, "t", None, None, None, start, end))


def test_a_commit_drawn_below_the_end_but_not_yet_visible_is_delivered_once(
    tmp_path: Path,
) -> None:
    """T1 has prewritten rows p (primary) and s and drawn its commit timestamp, but
    not yet made its commit point: a batch ending at a fresh timestamp would be above
    T1's commit and miss it (its write records are not there yet), and the next
    batch would start above it. The end stops at T1's start instead; once the commit
    point is made, the next end rolls s forward (resolving the lock as a reader does)
    and the batch delivers both cells; none is delivered twice."""
    url = f"sqlite://{tmp_path}/feed.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"before", "f:v", b"0")
        with Interleaving(cluster) as world:
            writer = client_of(cluster)
            writer.one_phase_commit = False
            t1 = percolator.Transaction(writer)
            t1.set("t", b"p", "f:v", b"1")
            t1.set("t", b"s", "f:v", b"2")
            actor = world.actor("T1", t1.commit, clients=[writer])
            actor.run_until(lambda s: s.matches("timestamp"))  # prewritten; commit ts next
            actor.step()  # drew its commit timestamp
            reader = client_of(cluster)  # the test's thread: its calls are not steps
            end1 = safe_end(reader, "t", None, 0)
            assert end1 <= t1.start_ts
            delivered = _feed(reader, 0, end1)
            actor.run_until(lambda s: b"s" in s.rows)  # committed at p; s still locked
            end2 = safe_end(reader, "t", None, end1)
            delivered += _feed(reader, end1, end2)
            commit_ts = actor.finish()
            end3 = safe_end(reader, "t", None, end2)
            delivered += _feed(reader, end2, end3)
            assert end1 <= end2 <= end3
    assert sorted(delivered) == sorted([
        (b"before", "f:v", b"0", delivered[0][3]),
        (b"p", "f:v", b"1", commit_ts), (b"s", "f:v", b"2", commit_ts)])


@pytest.mark.hbase
def test_a_commit_decided_at_its_primary_without_its_write_record_is_delivered_once(
    request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    """On a store without atomic row compare-and-set (HBase through Thrift1) the commit
    point decides the primary's lock (COMMITTED, with its commit timestamp) and the
    release writes its write record after it (over Thrift2 one call does both). A batch ending
    between the two must wait for that commit: ``safe_end`` rolls the decided lock
    forward as a reader would (or ends below it), and the batch delivers the primary's
    cell once. The primary is the transaction's only cell here: resolving a secondary
    would roll it forward too, and hide the bug below.

    Catches the safe end that treats a COMMITTED lock as nothing to wait for (the
    ``Committed`` branch of ``_below`` removed): the end goes above the commit, the
    batch finds no write record for the primary, the next starts above it, and the
    primary's change is never delivered."""
    url = make_store_url("hbase-thrift1", request, tmp_path)
    with percolator.connect(url) as cluster:
        assert not internals(cluster).store.atomic_row_cas  # decides, then releases
        cluster.create_table("t")
        try:
            with Interleaving(cluster) as world:
                writer = client_of(cluster)
                t1 = percolator.Transaction(writer)
                t1.set("t", b"p", "f:v", b"1")  # its only cell: no secondary rolls it forward
                actor = world.actor("T1", t1.commit, clients=[writer])
                actor.run_until(lambda s: s.matches("timestamp"))  # prewritten
                actor.step()  # drew its commit timestamp
                actor.run_until(lambda s: s.matches("check_and_set", row=b"p"))
                actor.step()  # the commit point: p's lock COMMITTED, no write record yet
                reader = client_of(cluster)  # the test's thread: its calls are not steps
                end1 = safe_end(reader, "t", None, 0)
                delivered = _feed(reader, 0, end1)
                commit_ts = actor.finish()
                end2 = safe_end(reader, "t", None, end1)
                delivered += _feed(reader, end1, end2)
        finally:
            drop_tables(cluster)
    assert delivered == [(b"p", "f:v", b"1", commit_ts)]
