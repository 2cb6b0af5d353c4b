"""The change feed's store half (spark_loader._commit_range), without Spark: where a batch
may end while a two-phase commit is between drawing its commit timestamp and making
its commit point, or has made it but not yet written its write records, run
deterministically with the interleaving harness on SQLite and HBase."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import percolator
from percolator._encoding import INLINE_MAX_BYTES, LOCK, Free, Lock, decode_lock, encode_lock
from percolator._interleaving import Actor, Interleaving
from percolator._internals import internals
from percolator._observer_hooks import internal_columns
from percolator._store import Read
from percolator.testing import CrashPoint, client_of, crash_commit
from spark_loader._commit_range import changes, safe_end
from tests._backends import drop_tables, make_store_url


def _feed(cluster: percolator.Cluster, start: int, end: int) -> list[tuple[object, ...]]:
    return list(changes(cluster, "t", None, None, None, start, end))


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[percolator.Cluster]:
    with percolator.connect(f"sqlite:///{tmp_path}/feed.db") as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"before", "f:v", b"0")
        yield cluster


def test_a_dead_committers_decided_change_is_rolled_forward_and_delivered_at_once(
    embedded: percolator.Cluster,
) -> None:
    """The committer died after its commit point: p (the primary) committed, s still
    locked by a dead owner. The safe end rolls s forward as a reader would and ends
    above the commit at once, not at the dead transaction's start (where it would stay
    until some reader resolved s): the batch delivers both cells."""
    dying = percolator.Transaction(client_of(embedded))
    dying.set("t", b"p", "f:v", b"1")  # the primary: the first cell set
    dying.set("t", b"s", "f:v", b"2")
    assert crash_commit(dying, CrashPoint("commit_point")) is True
    assert dying.commit_ts is not None
    end = safe_end(embedded, "t", None, 0)
    assert end > dying.commit_ts
    lock = internals(embedded).store.read_rows("t", [b"s"], [Read(LOCK, ("f:v",))])
    assert isinstance(decode_lock(lock[b"s"][f"{LOCK}:f:v"][0][1]), Free)  # rolled forward
    assert sorted(c[:3] for c in _feed(embedded, 0, end)) == [
        (b"before", "f:v", b"0"), (b"p", "f:v", b"1"), (b"s", "f:v", b"2")]


def live_on_g_before_its_commit_timestamp(
    cluster: percolator.Cluster, world: Interleaving
) -> tuple[percolator.Transaction, Actor[int]]:
    """A transaction of another client of *cluster* that writes g:v of row r, played by
    *world* up to the draw of its commit timestamp: prewritten, its lock held."""
    writer = client_of(cluster)
    writer.one_phase_commit = False
    live = percolator.Transaction(writer)
    live.set("t", b"r", "g:v", b"1")
    actor = world.actor("live", live.commit, clients=[writer])
    actor.run_until(lambda s: s.matches("timestamp"))  # prewritten; commit ts next
    return live, actor


def test_a_feed_of_some_columns_waits_only_for_writers_of_those(
    embedded: percolator.Cluster,
) -> None:
    """A live transaction holds a lock on g:v, prewritten, its commit timestamp not yet
    drawn: the end of a feed of every column stops at its start (it may commit
    below a fresh timestamp), the end of a feed of f:v only does not wait for it."""
    with Interleaving(embedded) as world:
        live, actor = live_on_g_before_its_commit_timestamp(embedded, world)
        reader = client_of(embedded)  # the test's thread: its calls are not steps
        assert safe_end(reader, "t", None, 0) <= live.start_ts
        assert safe_end(reader, "t", ["f:v"], 0) > live.start_ts
        actor.finish()


def test_with_no_lock_held_the_end_is_a_fresh_timestamp_and_never_below_its_floor(
    embedded: percolator.Cluster,
) -> None:
    """The embedded store's lock census says no lock is held: the end is the fresh
    timestamp, without a scan of the locks, and never below the floor it is given."""
    with percolator.Transaction(embedded) as txn:
        txn.set("t", b"r", "f:v", b"1")
    assert txn.commit_ts is not None
    census = internals(embedded).lock_census
    internals(embedded).sweep_locks(force=True)  # a new census file starts unclean
    assert census is not None and census.clean()
    end = safe_end(embedded, "t", None, 0)
    assert end > txn.commit_ts  # the commit is in the next batch
    assert safe_end(embedded, "t", None, end + 1_000_000) == end + 1_000_000


def test_a_lock_of_a_transaction_started_after_the_end_was_drawn_does_not_hold_it(
    embedded: percolator.Cluster,
) -> None:
    """A transaction that drew its start after the end's timestamp and locked a cell
    before the end's scan reached it commits above the end: the end does not wait
    for it (here its lock is written as it would find it, its start in the future)."""
    host = internals(embedded)
    start_ts = host.timestamps.get_timestamp() + 1_000_000
    later = Lock(start_ts, "t", b"later", "f:v", owner="nobody", wall_ms=0, ttl_ms=0)
    assert host.store.check_and_set("t", b"later", f"{LOCK}:f:v", None, encode_lock(later))
    drawn = host.timestamps.get_timestamp()
    end = safe_end(embedded, "t", None, 0)
    assert drawn < end < start_ts  # a fresh timestamp: not held back
    lock = host.store.read_rows("t", [b"later"], [Read(LOCK, ("f:v",))])
    assert decode_lock(lock[b"later"][f"{LOCK}:f:v"][0][1]) == later  # left alone


def test_a_batch_delivers_each_commit_of_its_range_rows_and_columns_once_in_order(
    embedded: percolator.Cluster,
) -> None:
    """``changes(from, to)``: every commit with ``from <= commit_ts < to``, of the rows
    and columns asked, row by row, each row's in commit order (then by column); each
    version of a cell; values stored apart from their write records (over
    INLINE_MAX_BYTES) too; deletes as None; never a rolled-back transaction nor an
    internal ``_`` family (an observer's acknowledgement)."""
    big1, big2 = b"1" * (INLINE_MAX_BYTES + 1), b"2" * (INLINE_MAX_BYTES + 1)
    two_phase = client_of(embedded)
    two_phase.one_phase_commit = False  # a one-phase commit keeps every value in its record

    def commit(*cells: tuple[bytes, str, bytes | None]) -> int:
        with percolator.Transaction(two_phase) as txn:
            internal_columns(txn, True)
            for row, column, value in cells:
                if value is None:
                    txn.delete("t", row, column)
                else:
                    txn.set("t", row, column, value)
        assert txn.commit_ts is not None
        return txn.commit_ts

    c1 = commit((b"a", "_ack:x", b"internal"), (b"a", "f:v", b"z"), (b"a", "g:v", b"a"),
                (b"b", "f:v", big1))
    dying = percolator.Transaction(client_of(embedded))
    dying.set("t", b"a", "f:v", b"never")
    assert crash_commit(dying, CrashPoint("prewrite", 0)) is False
    assert percolator.Transaction(embedded).get("t", b"a", "f:v") == b"z"  # rolled back
    c2 = commit((b"a", "f:v", b"2"), (b"b", "f:v", big2), (b"c", "f:v", None))
    c3 = commit((b"a", "f:v", b"after"))

    def feed(start: bytes | None = None, stop: bytes | None = None,
             columns: list[str] | None = None) -> list[tuple[object, ...]]:
        return list(changes(embedded, "t", start, stop, columns, c1, c3))

    assert feed() == [
        (b"a", "f:v", b"z", c1), (b"a", "g:v", b"a", c1), (b"a", "f:v", b"2", c2),
        (b"b", "f:v", big1, c1), (b"b", "f:v", big2, c2), (b"c", "f:v", None, c2)]
    assert feed(columns=["g:v"]) == [(b"a", "g:v", b"a", c1)]
    assert feed(start=b"b", stop=b"c") == [(b"b", "f:v", big1, c1), (b"b", "f:v", big2, c2)]
    assert list(changes(embedded, "t", None, None, None, c3, c3 + 1)) == [
        (b"a", "f:v", b"after", c3)]


def test_a_batch_holds_garbage_collection_back_at_its_start_while_it_reads(
    embedded: percolator.Cluster,
) -> None:
    """A garbage-collection pass while a batch is being read (the batch parked after
    its first row) may not collect the versions the batch has still to deliver: the
    read holds the safe point at the batch's start, and the rest of the batch comes
    whole, with no SnapshotTooOldError."""
    stamps = []
    for value in (b"1", b"2"):
        with percolator.Transaction(embedded) as txn:
            txn.set("t", b"a", "f:v", value)
            txn.set("t", b"z", "f:v", value)
        assert txn.commit_ts is not None
        stamps.append(txn.commit_ts)
    c1, c2 = stamps
    batch = changes(embedded, "t", None, None, None, c1, c2 + 1)
    assert [next(batch), next(batch)] == [(b"a", "f:v", b"1", c1), (b"a", "f:v", b"2", c2)]
    embedded.gc(retention=0)  # would collect z's first version, shadowed by its second
    assert list(batch) == [(b"z", "f:v", b"1", c1), (b"z", "f:v", b"2", c2)]


def test_a_lock_taken_over_while_the_end_resolves_the_old_one_holds_the_end(
    embedded: percolator.Cluster,
) -> None:
    """The end meets a dead transaction X's lock on a and sets out to resolve it; before
    it does, a reader rolls X back and a live transaction Y, started before the end's
    timestamp, locks a. The end's release of X's lock finds the cell changed: it must
    read the cell again and stop at Y's start (Y may still commit below a fresh
    timestamp), not take "changed" for "free". Y's primary is in a row the end's scan
    has passed, so a alone tells it about Y."""
    dying = percolator.Transaction(client_of(embedded))
    dying.set("t", b"p", "f:v", b"x")  # X's primary
    dying.set("t", b"a", "f:v", b"x")
    assert crash_commit(dying, CrashPoint("prewrite", 1)) is False
    with Interleaving(embedded) as world:
        writer = client_of(embedded)
        writer.one_phase_commit = False
        y = percolator.Transaction(writer)
        y.set("t", b"0", "f:v", b"y")  # Y's primary, before a
        y.set("t", b"a", "f:v", b"y")
        reader = client_of(embedded)
        end = world.actor("end", lambda: safe_end(reader, "t", None, 0), clients=[reader])
        end.run_until(lambda s: s.matches("read_rows", row=b"p"))  # X's status, next
        assert percolator.Transaction(embedded).get("t", b"a", "f:v") is None  # X rolled back
        live = world.actor("Y", y.commit, clients=[writer])
        live.run_until(lambda s: s.matches("timestamp"))  # prewritten; commit ts next
        assert end.finish() <= y.start_ts
        live.finish()
    assert percolator.Transaction(embedded).get("t", b"a", "f:v") == b"y"


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
