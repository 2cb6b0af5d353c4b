"""Ubiq's units one step at a time, on the embedded store: each test drives the
tracker, the cutter, the lease, the processing and the commit of a unit by hand
(no worker process, no timing), and asks what each step wrote. The end-to-end tests
(``test_ubiq.py``, ``test_bookkeeping.py``) show the whole pipeline exact; these pin
down the decisions inside it: which offsets a unit covers, who holds a lease and
until when, which commit wins."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import percolator
from observers import Worker, wait_for_observers
from observers._logs import HEAD_BYTES, head_digest
from observers.ubiq import LogPipeline, Output, WorkUnit, _pipeline
from percolator import Cluster, Snapshot, Transaction
from percolator._internals import internals
from percolator.ext import pending_notifications
from tests.ubiq import _app
from tests.ubiq.test_bookkeeping import _expire_every_lease, _index, _stored, _write
from tests.ubiq.test_ubiq import settle


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as found:
        yield found


def _units(p: LogPipeline) -> dict[bytes, dict[str, bytes]]:
    with Snapshot(p.cluster) as snap:
        return dict(snap.scan(p.units))


def _owner(p: LogPipeline) -> str:
    return internals(p.cluster).coordination.current_owner()


def test_a_tail_that_stopped_growing_is_cut_alone_when_files_are_not_packed(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Without packing, a short tail waits for more bytes while it is young: the
    cutter, woken by the report of its growth, cuts nothing. Once it has waited
    max_unit_delay (its ``f:since`` that old), the tracker's next pass, which finds no
    growth, wakes the cutter of that file, which cuts the tail as a unit of its own."""
    _write(tmp_path, "one.jsonl", 10)
    size = (tmp_path / "a" / "one.jsonl").stat().st_size
    p = _app.pipeline(cluster, tmp_path, unit_bytes=4096, max_unit_delay=600.0,
                      pack_files=False)
    p.create()
    cutters = [o for o in p.observers("a") if (o.table, o.column) == (p.files, "f:size")]
    with Worker(cluster, cutters, threads=1):
        assert p.track("a") == 1
        wait_for_observers(cluster, 60)
    assert _units(p) == {}  # a young tail waits
    assert p.track("a") == 0 and list(pending_notifications(cluster)) == []  # nor woken
    with Transaction(cluster) as txn:  # max_unit_delay has passed since its report
        txn.set(p.files, b"one.jsonl", "f:since", b"0")
    assert p.track("a") == 0
    assert [(n.table, n.row, n.column) for n in pending_notifications(cluster)] == [
        (p.files, b"one.jsonl", "f:size")]
    with Worker(cluster, cutters, threads=1):
        deadline = time.monotonic() + 60
        while not _units(p):
            assert time.monotonic() < deadline, "the tail was not cut"
            time.sleep(0.02)
    assert {row: cells["u:range"] for row, cells in _units(p).items()} == {
        _pipeline.unit_row("one.jsonl", 0): b"%d" % size}
    assert p.track("a") == 0  # cut to its end: nothing to wake
    assert list(pending_notifications(cluster, [p.files, p.packer])) == []


def test_an_application_deletes_cells_in_its_units_commit(cluster: Cluster,
                                                          tmp_path: Path) -> None:
    """``Output.delete`` deletes a cell in the unit's commit transaction: gone once
    the unit commits, and only then."""
    _write(tmp_path, "one.jsonl", 10)

    class Consume(_app.Counts):
        def process(self, unit: WorkUnit, out: Output) -> None:
            super().process(unit, out)
            out.delete(_app.ATTEMPTS, b"todo", "a:owner")

    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, app=Consume())
    p.create()
    with Transaction(cluster) as txn:
        txn.set(_app.ATTEMPTS, b"todo", "a:owner", b"x")
        txn.set(_app.ATTEMPTS, b"kept", "a:owner", b"y")
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    row = _pipeline.unit_row("one.jsonl", 0)
    assert _pipeline.process_unit(p, "a", row, _owner(p))
    with Snapshot(cluster) as snap:
        assert snap.get(_app.ATTEMPTS, b"todo", "a:owner") is None
        assert snap.get(_app.ATTEMPTS, b"kept", "a:owner") == b"y"


def test_create_fills_the_index_that_the_lease_sweep_reads(cluster: Cluster,
                                                           tmp_path: Path) -> None:
    """A pipeline made before the pending-units index: ``create`` fills it, and the
    lease sweep finds every pending unit through it (their leases expired)."""
    _write(tmp_path, "one.jsonl", 100)
    p = _app.pipeline(cluster, tmp_path, unit_bytes=1024, max_unit_delay=0)
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") > 1
    units = _index(p)
    cluster.drop_table(p.pending)  # as an older version left it
    p.create()
    _expire_every_lease(p, units)
    assert p.sweep_leases() == len(units)


def test_output_files_are_named_plainly_and_a_unit_may_stage_several(
    cluster: Cluster, tmp_path: Path
) -> None:
    """An output file's name is refused when empty, holding a '/' or starting with
    '.' (it would land outside the sink or hidden); a unit may stage several files,
    each published once the unit commits."""
    _write(tmp_path, "one.jsonl", 10)

    class TwoFiles(_app.Counts):
        def process(self, unit: WorkUnit, out: Output) -> None:
            super().process(unit, out)
            for name in ("first.txt", "second.txt"):
                with out.file(name) as f:
                    f.write(name.encode())

    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, app=TwoFiles())
    p.create()
    with Transaction(cluster) as txn:
        out = Output(txn, tmp_path / "staging")
        for bad in ("", "a/b", ".hidden"):
            with pytest.raises(percolator.InvalidArgument) as refusal:
                out.file(bad)
            assert str(refusal.value) == f"bad output file name {bad!r}"
        txn.rollback()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    assert _pipeline.process_unit(p, "a", _pipeline.unit_row("one.jsonl", 0), _owner(p))
    for name in ("first.txt", "second.txt"):
        assert (p.sink / f"one.jsonl@0.{name}").read_bytes() == name.encode()


def test_only_a_quarantined_range_can_be_retried(cluster: Cluster, tmp_path: Path) -> None:
    _write(tmp_path, "one.jsonl", 10)
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0)
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    with pytest.raises(percolator.InvalidArgument) as refusal:
        p.retry_range("one.jsonl", 0)  # pending, not quarantined
    assert str(refusal.value) == "no quarantined range at ('one.jsonl', 0)"


def test_a_retried_range_gets_its_failed_attempts_again(cluster: Cluster,
                                                         tmp_path: Path) -> None:
    """A record that failed MAX_FAILURES times is quarantined; put back to work, its
    failures count from zero again: it is quarantined after as many failed attempts
    as the first time, not at its first one."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "bad.jsonl").write_bytes(b"{not json\n")
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0)
    p.create()
    p.track("a")
    assert _app.cut(p, "bad.jsonl") == 1
    row = _pipeline.unit_row("bad.jsonl", 0)

    def fail_once() -> None:
        assert _pipeline._take_lease(cluster, p, row, _owner(p), _pipeline._now_ms())
        _pipeline._fail(cluster, p, row, _owner(p), "BadRecord: test")

    for retried in (False, True):
        for _ in range(_pipeline.MAX_FAILURES - 1):
            fail_once()
            assert p.quarantined() == [] and _index(p) == {row}
        fail_once()
        assert p.quarantined() == [("bad.jsonl", 0, 10, "BadRecord: test")]
        assert _index(p) == set()
        if not retried:
            p.retry_range("bad.jsonl", 0)


def _lease(p: LogPipeline, row: bytes) -> tuple[str, int] | None:
    with Snapshot(p.cluster) as snap:
        raw = snap.get(p.units, row, "u:lease")
    return None if raw is None else _pipeline._lease(raw)


def _dead(owner: str) -> str:
    """An owner id of this host from another boot: certainly dead."""
    parts = owner.split("/")
    parts[2] = "0" * len(parts[2])
    return "/".join(parts)


def _one_unit(p: LogPipeline, tmp_path: Path) -> tuple[bytes, list[tuple[str, int, int]]]:
    _write(tmp_path, "one.jsonl", 10)
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    return (_pipeline.unit_row("one.jsonl", 0),
            [("one.jsonl", 0, (tmp_path / "a" / "one.jsonl").stat().st_size)])


def _take(p: LogPipeline, row: bytes, owner: str, now: int, *, renew: bool
          ) -> list[tuple[str, int, int]] | None:
    with Transaction(p.cluster) as txn:
        return _pipeline._lease_unit(txn, p, row, owner, now, renew=renew)


def test_a_lease_holds_until_its_expiry_for_a_live_owner_and_not_at_all_for_a_dead_one(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A lease names its owner and expires local_eta after it was taken. Until then
    nobody else takes the unit; the owner takes it again only when renewing (its
    processing thread), not as a second run of its processor; at its expiry anyone
    takes it. A lease of a dead owner is taken over at once. A unit no longer pending
    is not leased at all."""
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, local_eta=30.0)
    row, parts = _one_unit(p, tmp_path)
    me, other = _owner(p), "another-host/worker"  # other: liveness unknown, so alive
    assert internals(cluster).coordination.is_alive(_dead(me)) is False
    t = 1_000_000
    assert _take(p, row, other, t, renew=False) == parts
    expiry = t + 30_000
    assert _lease(p, row) == (other, expiry)
    for renew in (False, True):
        assert _take(p, row, me, expiry - 1, renew=renew) is None
    assert _take(p, row, other, expiry - 1, renew=False) is None
    assert _lease(p, row) == (other, expiry)
    assert _take(p, row, other, expiry - 1, renew=True) == parts  # renewed
    expiry += 29_999
    assert _lease(p, row) == (other, expiry)
    assert _take(p, row, me, expiry - 1, renew=False) is None
    assert _take(p, row, me, expiry, renew=False) == parts  # expired: taken over
    assert _lease(p, row) == (me, expiry + 30_000)
    for owner in (other, me):  # a live owner's (this process's) lease in force
        assert _take(p, row, owner, expiry + 29_999, renew=False) is None
    # A dead owner's lease, far from its expiry, is taken over at once.
    assert _take(p, row, _dead(me), expiry + 30_000, renew=False) == parts
    assert _take(p, row, me, expiry + 30_001, renew=False) == parts
    assert _lease(p, row) == (me, expiry + 60_001)
    with Transaction(cluster) as txn:
        assert _pipeline.finish_unit(txn, p, row, me, "attempt", [])
    assert _take(p, row, me, expiry + 60_001, renew=True) is None  # committed
    assert _take(p, row, other, expiry + 10**9, renew=False) is None


def test_the_lease_sweep_renotifies_a_unit_once_its_lease_expired_or_its_owner_died(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processor's run on a ready unit leases it and acknowledges its notification
    in one transaction (its thread, which would process the unit, never runs here).
    The unit is then in hand until its lease's expiry, when the sweep notifies it
    again (exactly at it, not a millisecond before); a unit leased by a dead owner is
    notified again at once."""
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, local_eta=30.0)
    row, parts = _one_unit(p, tmp_path)
    handed: list[bytes] = []
    monkeypatch.setattr(_pipeline._Processor, "_start",
                        lambda self, row, owner: handed.append(row))
    worker = Worker(cluster, p.observers("a"), threads=1)
    worker.register()
    assert worker._scanner.serve_row(p.units, row) and handed == [row]

    def notified() -> list[tuple[bytes, str]]:
        return [(n.row, n.column) for n in pending_notifications(cluster, [p.units])]

    assert notified() == []
    lease = _lease(p, row)
    assert lease is not None and lease[0] == _owner(p)
    assert p.stranded() == []  # leased: in hand, not stranded
    assert p.sweep_leases(lease[1] - 1) == 0
    assert notified() == []
    assert p.sweep_leases(lease[1]) == 1
    assert notified() == [(row, "u:ready")]
    # In real time this process's lease is still in force: the run leaves the unit to
    # the thread that holds it.
    assert worker._scanner.serve_row(p.units, row) and handed == [row]
    assert notified() == []
    lease = _lease(p, row)
    assert lease is not None
    assert _take(p, row, _dead(_owner(p)), lease[1], renew=False) == parts
    assert p.sweep_leases(lease[1]) == 1  # its new owner is dead, its lease in force
    assert notified() == [(row, "u:ready")]
    assert handed == [row]


def test_the_collector_clears_the_acknowledgements_of_every_sites_processors(
    cluster: Cluster, tmp_path: Path
) -> None:
    """With a site ETA each site's processors observe a column of their own
    (``u:ready.<site>``). A file only site b holds is processed there and forgotten;
    the deletion of its units' ``u:ready.b`` is acknowledged by b's processor, and the
    next pass of the collector deletes that acknowledgement too: nothing of the file
    is left in the store."""
    _write(tmp_path, "one.jsonl", 30)
    (tmp_path / "a" / "one.jsonl").rename(tmp_path / "b" / "one.jsonl")
    p = _app.pipeline(cluster, tmp_path, unit_bytes=512, max_unit_delay=0,
                      forget_after=3600.0, site_eta=600.0)
    p.create()
    with Worker(cluster, [*p.observers("b"), _app.RollUp], threads=1):
        p.track("b")
        settle(p)
    assert {c["u:home"] for c in _units(p).values() if "u:home" in c} == {b"b"}
    assert p.collect_garbage(_pipeline._now_ms() + 3_601_000) == 1
    with Worker(cluster, p.observers("b"), threads=1):
        wait_for_observers(cluster, 60)
    assert p.coverage() == {}  # its unit rows hold acknowledgements only
    # While a notification of the file's row or of a unit's is pending, nothing is
    # cleared (its observer's run is still to acknowledge it).
    unit = _pipeline.unit_row("one.jsonl", 0)
    for pending in ({(p.files, b"one.jsonl")}, {(p.units, unit)}):
        assert not _pipeline._clear_forgotten(cluster, p, b"one.jsonl", pending)
    assert _stored(p)[p.units] != []
    assert _pipeline._clear_forgotten(cluster, p, b"one.jsonl", set())
    assert _stored(p) == {p.files: [], p.units: [], p.pending: []}
    assert p.collect_garbage() == 0


def _one_file_processed(cluster: Cluster, tmp_path: Path) -> LogPipeline:
    """A pipeline (no site ETA, files forgotten an hour after they last grew) whose
    one file of site a is cut, processed and committed."""
    _write(tmp_path, "one.jsonl", 10)
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, forget_after=3600.0)
    p.create()
    with Worker(cluster, [*p.observers("a"), _app.RollUp], threads=1):
        p.track("a")
        settle(p)
    return p


def test_the_collector_leaves_a_forgotten_file_cut_anew_to_be_tracked(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A forgotten file that grows again is tracked anew and cut from its first
    byte. Clearing what its forgetting left (``f:forgotten``, acknowledgements) then
    finds units in their rows, and does nothing: they are the file's new units. Once
    those are committed and old, the collector forgets the file again."""
    p = _one_file_processed(cluster, tmp_path)
    with Snapshot(cluster) as snap:
        grown = int(snap.get(p.files, b"one.jsonl", "f:grown") or b"")
    assert p.collect_garbage(grown + 3_599_999) == 0
    assert p.collect_garbage(grown + 3_600_000) == 1  # not grown for forget_after
    # Forgetting deleted its f:size, which notifies the cutter: a run on a file row
    # without one cuts nothing.
    assert _app.cut(p, "one.jsonl") == 0
    _write(tmp_path, "one.jsonl", 5)  # it grows again, now
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    row = b"one.jsonl"
    assert not _pipeline._clear_forgotten(cluster, p, row, set())
    with Snapshot(cluster) as snap:
        assert snap.get(p.files, row, "f:forgotten") is not None
    assert _units(p)[_pipeline.unit_row("one.jsonl", 0)]["u:state"] == b"P"
    assert _pipeline.process_unit(p, "a", _pipeline.unit_row("one.jsonl", 0), _owner(p))
    assert p.collect_garbage(_pipeline._now_ms() + 3_601_000) == 1
    assert _units(p) == {}


def test_a_committed_unit_keeps_its_range_state_and_commit_record_only(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The commit of a unit records its attempt, staged files and owner
    (``u:commit``, which the dispatcher publishes from) and deletes its lease and
    failure count; only the unit's owner commits it, once."""
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0)
    row, parts = _one_unit(p, tmp_path)
    me, other = _owner(p), "another-host/worker"
    now = _pipeline._now_ms()
    assert _take(p, row, me, now, renew=True) == parts
    _pipeline._fail(cluster, p, row, me, "Error: once")
    assert _units(p)[row]["u:fail"] == b"1"
    assert _take(p, row, me, now, renew=True) == parts
    for owner in (other, _dead(me)):  # not its lease
        with Transaction(cluster) as txn:
            assert not _pipeline.finish_unit(txn, p, row, owner, "theirs", [])
    with Transaction(cluster) as txn:
        assert _pipeline.finish_unit(txn, p, row, me, "attempt1", ["counts.json"])
    assert set(_units(p)[row]) == {"u:range", "u:state", "u:commit", "u:ready"}
    assert _units(p)[row]["u:state"] == b"C"
    assert json.loads(_units(p)[row]["u:commit"]) == {
        "attempt": "attempt1", "files": ["counts.json"], "owner": me}
    with Transaction(cluster) as txn:
        assert not _pipeline.finish_unit(txn, p, row, me, "attempt2", [])  # once


def test_processing_a_unit_commits_its_output_or_nothing(cluster: Cluster,
                                                         tmp_path: Path) -> None:
    """process_unit: a unit leased by another live owner is not processed; an
    application's failure counts an attempt and leaves no staged file; an attempt
    that loses its commit to another leaves neither output nor staged files (the
    winner's commit stands); a winning attempt publishes its files; a failing
    on_commit is logged, the commit stands."""
    _write(tmp_path, "one.jsonl", 10)
    data = (tmp_path / "a" / "one.jsonl").read_bytes()
    calls: list[str] = []
    committed: list[str] = []

    class Scripted(_app.Counts):
        def __init__(self) -> None:
            super().__init__(files=True)
            self.plan = ["fail", "lose", "win"]

        def process(self, unit: WorkUnit, out: Output) -> None:
            step = self.plan.pop(0)
            calls.append(step)
            assert b"".join(r.data + b"\n" for r in unit.records()) == data
            assert {r.file for r in unit.records()} == {unit.file}
            assert unit.parts == []  # one range: no parts
            super().process(unit, out)
            if step == "fail":
                raise ValueError("no")
            if step == "lose":  # another attempt of the same owner commits first
                with Transaction(p.cluster) as txn:
                    assert _pipeline.finish_unit(txn, p, row, me, "winner", [])
                    txn.set(_app.ATTEMPTS, b"winner", "a:owner", b"w")

    def on_commit(unit: WorkUnit) -> None:
        committed.append(unit.id)
        raise RuntimeError("metrics down")

    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, app=Scripted(),
                      on_commit=on_commit)
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    row, me = _pipeline.unit_row("one.jsonl", 0), _owner(p)
    assert _take(p, row, "another-host/worker", _pipeline._now_ms(), renew=False)
    assert not _pipeline.process_unit(p, "a", row, me)
    assert calls == []  # leased by a live owner: not taken
    t = _pipeline._now_ms() + 60_000  # that lease expired
    assert _take(p, row, me, t, renew=False)
    assert not _pipeline.process_unit(p, "a", row, me)
    assert calls == ["fail"] and _units(p)[row]["u:fail"] == b"1"
    assert not list(p.staging.rglob("*.json"))
    assert not _pipeline.process_unit(p, "a", row, me)  # loses to "winner"
    assert calls == ["fail", "lose"] and _units(p)[row]["u:state"] == b"C"
    assert not list(p.staging.rglob("*.json")) and not list(p.sink.glob("*.json"))
    with Snapshot(cluster) as snap:
        assert snap.get(_app.ATTEMPTS, b"one.jsonl@0-%d" % len(data), "a:owner") is None
    # A unit of its own for the winning attempt and the failing on_commit.
    _write(tmp_path, "two.jsonl", 10)
    data = (tmp_path / "a" / "two.jsonl").read_bytes()
    p.track("a")
    assert _app.cut(p, "two.jsonl") == 1
    row = _pipeline.unit_row("two.jsonl", 0)
    assert _pipeline.process_unit(p, "a", row, me)
    assert committed == [f"two.jsonl@0-{len(data)}"]
    assert json.loads((p.sink / "two.jsonl@0.counts.json").read_bytes()) == {
        "k0": 4, "k1": 3, "k2": 3}
    assert not list(p.staging.rglob("*.json"))


def _cells(p: LogPipeline, name: str) -> dict[str, bytes]:
    with Snapshot(p.cluster) as snap:
        return snap.get_row(p.files, name.encode(), ["f:size", "f:cut", "f:since"])


def test_units_end_at_the_first_record_end_at_or_past_unit_bytes(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Units are cut at record boundaries: each ends at the first record end at or
    past unit_bytes from its start (a record longer than the reader's 64 KiB chunk
    too), the last one at the file's end once it is due. The boundaries are read from
    a replica that holds the bytes: site a lags, b does not (and a second file is at
    b only). Until the tail is due it
    waits (``f:cut`` at the last unit's end, ``f:since`` kept); once cut, ``f:cut`` is
    the file's size and ``f:since`` is gone."""
    lengths = (8, 3, 20, 1, 1, 5, 70_000, 2, 9, 4, 6, 2)
    data = b"".join(b"x" * n + b"\n" for n in lengths)
    for site in "ab":
        (tmp_path / site).mkdir()
    (tmp_path / "b" / "one.jsonl").write_bytes(data)
    (tmp_path / "a" / "one.jsonl").write_bytes(data[:40])
    p = _app.pipeline(cluster, tmp_path, unit_bytes=10, max_unit_delay=600.0,
                      pack_files=False)
    p.create()
    p.track("a")
    p.track("b")
    ends = [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    expected, begin = [], 0
    while len(data) - begin > 10:
        end = next(e for e in ends if e >= begin + 10)
        expected.append((begin, end))
        begin = end
    assert _app.cut(p, "one.jsonl") == len(expected)  # the young tail waits
    cells = _cells(p, "one.jsonl")
    assert cells["f:cut"] == b"%d" % begin and "f:since" in cells
    with Transaction(cluster) as txn:  # max_unit_delay has passed
        txn.set(p.files, b"one.jsonl", "f:since", b"0")
    assert _app.cut(p, "one.jsonl") == 1
    expected.append((begin, len(data)))
    assert [(_pipeline.parse_unit_row(row)[1], int(c["u:range"]))
            for row, c in sorted(_units(p).items())] == expected
    assert _cells(p, "one.jsonl") == {"f:size": b"%d" % len(data),
                                      "f:cut": b"%d" % len(data)}
    # A file site a lacks altogether is cut from b's replica the same way.
    (tmp_path / "b" / "two.jsonl").write_bytes(data)
    p.track("b")
    with Transaction(cluster) as txn:
        txn.set(p.files, b"two.jsonl", "f:since", b"0")
    assert _app.cut(p, "two.jsonl") == len(expected)
    assert [(_pipeline.parse_unit_row(row)[1], int(c["u:range"]))
            for row, c in sorted(_units(p).items()) if row.startswith(b"two")] == expected


def test_the_lease_sweep_hands_an_expired_lease_back_to_its_units_site(
    cluster: Cluster, tmp_path: Path
) -> None:
    """With a site ETA, a unit whose lease expired before its site's time is up is
    notified again to its own site's processors only; once its site's time is up,
    to every site's."""
    _write(tmp_path, "one.jsonl", 10)
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, site_eta=600.0, local_eta=30.0)
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    row = _pipeline.unit_row("one.jsonl", 0)
    assert _units(p)[row]["u:home"] == b"a"  # only site a holds it
    t = int(_units(p)[row]["u:born"])
    assert _take(p, row, "another-host/worker", t, renew=False)
    assert p.sweep_leases(t + 30_000) == 1
    assert [n.column for n in pending_notifications(cluster, [p.units])] == ["u:ready.a"]
    # Past the site's time (the lease taken then expired too): every site's.
    assert _take(p, row, "another-host/worker", t + 600_000, renew=False)
    assert p.sweep_leases(t + 630_000) == 1
    assert sorted(n.column for n in pending_notifications(cluster, [p.units])) == [
        "u:ready.a", "u:ready.b"]


def test_a_tail_is_due_exactly_max_unit_delay_after_its_first_report(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A tail shorter than a unit waits until max_unit_delay has passed since its
    oldest byte was reported (``f:since``), and not a millisecond less; bytes that
    fill a whole unit never wait."""
    for site in "ab":
        (tmp_path / site).mkdir()
    (tmp_path / "a" / "one.jsonl").write_bytes(b"x" * 9 + b"\n")
    (tmp_path / "a" / "full.jsonl").write_bytes(b"y" * 19 + b"\n")
    p = _app.pipeline(cluster, tmp_path, unit_bytes=20, max_unit_delay=5.0,
                      pack_files=False)
    p.create()
    p.track("a")
    since = int(_cells(p, "one.jsonl")["f:since"])
    for name, now in (("one.jsonl", since + 4_999), ("full.jsonl", since)):
        with Transaction(cluster) as txn:
            assert _pipeline.cut_file(txn, p, name, now) == (name == "full.jsonl")
    with Transaction(cluster) as txn:
        assert _pipeline.cut_file(txn, p, "one.jsonl", since + 5_000) == 1
    assert sorted(_units(p)) == [_pipeline.unit_row("full.jsonl", 0),
                                 _pipeline.unit_row("one.jsonl", 0)]


def test_a_unit_is_given_to_a_site_that_holds_its_bytes(cluster: Cluster,
                                                        tmp_path: Path) -> None:
    """With a site ETA, a unit goes to one of the sites whose replica holds all its
    bytes (spread over them by its row), even where the spreading over every site
    would have picked another: a file only site a holds, named so that it would
    have gone to b."""
    for site in "ab":
        (tmp_path / site).mkdir()
    name = next(f"f{i}.jsonl" for i in range(100)
                if _pipeline._home(f"f{i}.jsonl", 0, ["a", "b"]) == "b")
    (tmp_path / "a" / name).write_bytes(b"x" * 9 + b"\n")
    p = _app.pipeline(cluster, tmp_path, unit_bytes=10, max_unit_delay=0, site_eta=600.0,
                      pack_files=False)
    p.create()
    p.track("a")
    assert _app.cut(p, name) == 1
    assert _units(p)[_pipeline.unit_row(name, 0)]["u:home"] == b"a"
    # Tails packed from a file only site a holds and one only b holds: no site holds
    # the unit whole, so it goes to any site (spread by its row).
    (tmp_path / "a" / "p1.jsonl").write_bytes(b"y\n")
    (tmp_path / "b" / "p2.jsonl").write_bytes(b"z\n")
    p.track("a")
    p.track("b")
    with Transaction(cluster) as txn:
        assert _pipeline.pack_tails(txn, p, _pipeline._now_ms()) == 1
    assert _units(p)[_pipeline.unit_row("p1.jsonl", 0)]["u:home"] == _pipeline._home(
        "p1.jsonl", 0, ["a", "b"]).encode()


def test_a_worker_whose_lease_was_taken_over_commits_nothing(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker takes the unit's lease, and before its attempt's transaction begins
    the lease expires and another owner takes the unit over: the attempt does not
    commit (its output and staged files go), and the unit stays the other owner's."""
    _write(tmp_path, "one.jsonl", 10)
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, local_eta=30.0,
                      app=_app.Counts(files=True))
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    row, other = _pipeline.unit_row("one.jsonl", 0), "another-host/worker"
    take = _pipeline._take_lease

    def taken_over(*args: object) -> object:
        taken = take(*args)  # type: ignore[arg-type]
        assert _take(p, row, other, _pipeline._now_ms() + 30_000, renew=False)
        return taken

    monkeypatch.setattr(_pipeline, "_take_lease", taken_over)
    assert not _pipeline.process_unit(p, "a", row, _owner(p))
    assert _units(p)[row]["u:state"] == b"P" and _lease(p, row) is not None
    assert _lease(p, row)[0] == other  # type: ignore[index]
    assert not list(p.staging.rglob("*.json")) and not list(p.sink.glob("*.json"))
    assert _app.partial_totals(cluster) == {}


def test_the_dispatcher_publishes_what_a_committer_that_died_did_not(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Units committed by a process that died before publishing their files (each
    ``u:commit`` names the attempt and files): the dispatcher's run on a unit's row
    publishes them from the attempt's staging directory, which it then removes with
    its unit's, and leaves a file published already alone, or taken away since (a
    row without a commit: nothing); the dispatcher is woken by the commit."""
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, app=_app.Counts(files=True))
    p.create()
    names = ("one.jsonl", "two.jsonl")
    for name in names:
        _write(tmp_path, name, 10)
        p.track("a")
        assert _app.cut(p, name) == 1
        with monkeypatch.context() as dying:
            dying.setattr(_pipeline, "publish", lambda *args: None)
            assert _pipeline.process_unit(p, "a", _pipeline.unit_row(name, 0), _owner(p))
    final = {name: p.sink / f"{name}@0.counts.json" for name in names}
    assert not any(path.exists() for path in final.values())
    assert len(list(p.staging.rglob("counts.json"))) == 2
    [dispatcher] = [o for o in p.observers("a") if o.column == "u:commit"]
    row = _pipeline.unit_row("one.jsonl", 0)
    for run in (_pipeline.unit_row("none.jsonl", 0), row):
        with Transaction(cluster) as txn:
            dispatcher.process(txn, run, "u:commit")
    assert json.loads(final["one.jsonl"].read_bytes()) == {"k0": 4, "k1": 3, "k2": 3}
    assert not final["two.jsonl"].exists() and not (p.staging / row.hex()).exists()
    final["one.jsonl"].write_bytes(b"kept")
    with Transaction(cluster) as txn:
        dispatcher.process(txn, row, "u:commit")
    assert final["one.jsonl"].read_bytes() == b"kept"
    final["one.jsonl"].unlink()  # taken away downstream: a run again publishes nothing
    with Transaction(cluster) as txn:
        dispatcher.process(txn, row, "u:commit")
    assert not final["one.jsonl"].exists()
    with Worker(cluster, [dispatcher], threads=1):
        deadline = time.monotonic() + 60
        while not final["two.jsonl"].exists():
            assert time.monotonic() < deadline, "not published"
            time.sleep(0.02)
    assert json.loads(final["two.jsonl"].read_bytes()) == {"k0": 4, "k1": 3, "k2": 3}
    assert not list(p.staging.rglob("counts.json"))


def test_a_unit_whose_bytes_no_replica_holds_is_quarantined_with_why(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A unit of one record whose file every replica lost bytes of (after it was
    cut): each attempt fails reading it (``unit.records()`` says the file, site and
    missing end), and after MAX_FAILURES the record is quarantined with that error."""
    _write(tmp_path, "one.jsonl", 1)
    path = tmp_path / "a" / "one.jsonl"
    size = path.stat().st_size
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0)
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    path.write_bytes(path.read_bytes()[:5])
    row = _pipeline.unit_row("one.jsonl", 0)
    for _ in range(_pipeline.MAX_FAILURES):
        assert not _pipeline.process_unit(p, "a", row, _owner(p))
    assert p.quarantined() == [
        ("one.jsonl", 0, size, f"OSError: {path} at site a is shorter than {size}")]


def test_a_refused_file_is_never_cut_again(cluster: Cluster, tmp_path: Path) -> None:
    """A file whose tail waits to be cut is truncated: the tracker refuses it, and a
    cutter or packer run after that, however late, cuts nothing of it; nor does the
    tracker wake the packer for it, even once its old bytes are back and long due."""
    _write(tmp_path, "one.jsonl", 10)
    path = tmp_path / "a" / "one.jsonl"
    data = path.read_bytes()
    p = _app.pipeline(cluster, tmp_path, unit_bytes=4096, max_unit_delay=600.0,
                      pack_files=False)
    p.create()
    p.track("a")
    with Transaction(cluster) as txn:
        assert _pipeline.cut_file(txn, p, "one.jsonl", _pipeline._now_ms()) == 0  # young
    path.write_bytes(path.read_bytes()[:20])
    assert p.track("a") == 0  # refused: no growth
    with Snapshot(cluster) as snap:
        assert snap.get(p.files, b"one.jsonl", "f:refused") is not None
    with Transaction(cluster) as txn:
        assert _pipeline.cut_file(txn, p, "one.jsonl", _pipeline._now_ms() + 10**9) == 0
    with Transaction(cluster) as txn:  # nor packed
        assert _pipeline.pack_tails(txn, p, _pipeline._now_ms() + 10**9) == 0
    assert _units(p) == {}
    path.write_bytes(data)
    with Transaction(cluster) as txn:
        txn.set(p.files, b"one.jsonl", "f:since", b"0")
    packing = _app.pipeline(cluster, tmp_path, unit_bytes=4096, max_unit_delay=600.0)
    assert packing.track("a") == 0
    assert list(pending_notifications(cluster, [p.packer])) == []


def test_a_tail_that_grew_while_the_cutter_cut_is_cut_at_its_next_run(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The cutter cuts a file to its end (deleting ``f:since``) while the tracker
    reports that it grew: the two transactions write different cells, so both
    commit, and the file is left with a tail past ``f:cut`` and no ``f:since``. The
    cutter's next run (the growth notified it) takes that tail as due, so it is cut
    at once rather than never."""
    _write(tmp_path, "one.jsonl", 10)
    p = _app.pipeline(cluster, tmp_path, unit_bytes=4096, max_unit_delay=600.0,
                      pack_files=False)
    p.create()
    p.track("a")
    since = int(_cells(p, "one.jsonl")["f:since"])
    cutter = Transaction(cluster)
    assert _pipeline.cut_file(cutter, p, "one.jsonl", since + 600_000) == 1
    _write(tmp_path, "one.jsonl", 5)  # meanwhile the file grows, and is reported
    assert p.track("a") == 1
    cutter.commit()
    size = (tmp_path / "a" / "one.jsonl").stat().st_size
    cells = _cells(p, "one.jsonl")
    assert "f:since" not in cells and int(cells["f:cut"]) < int(cells["f:size"]) == size
    with Transaction(cluster) as txn:  # young as the tail is, it has no f:since
        assert _pipeline.cut_file(txn, p, "one.jsonl", since + 600_001) == 1
    assert _cells(p, "one.jsonl") == {"f:size": b"%d" % size, "f:cut": b"%d" % size}
    # With packing, the packer takes such a tail as due too.
    _write(tmp_path, "two.jsonl", 5)
    p.track("a")
    with Transaction(cluster) as txn:
        txn.delete(p.files, b"two.jsonl", "f:since")
    with Transaction(cluster) as txn:
        assert _pipeline.pack_tails(txn, p, since + 600_001) == 1


def test_with_packing_a_cutter_cuts_whole_units_and_leaves_a_due_tail_to_the_packer(
    cluster: Cluster, tmp_path: Path
) -> None:
    """With pack_files, a file's cutter still cuts its whole units itself (one of
    exactly unit_bytes too), up to where its short tail begins, and wakes the packer
    for that tail once it is due."""
    for site in "ab":
        (tmp_path / site).mkdir()
    (tmp_path / "a" / "one.jsonl").write_bytes(b"x" * 9 + b"\n")
    (tmp_path / "a" / "two.jsonl").write_bytes((b"y" * 9 + b"\n") * 5)
    p = _app.pipeline(cluster, tmp_path, unit_bytes=20, max_unit_delay=600.0)
    p.create()
    p.track("a")
    since = int(_cells(p, "two.jsonl")["f:since"])
    with Transaction(cluster) as txn:
        assert _pipeline.cut_file(txn, p, "two.jsonl", since + 600_000) == 2
    assert _cells(p, "two.jsonl")["f:cut"] == b"40"
    assert [(n.table, n.row, n.column) for n in pending_notifications(cluster, [p.packer])
            ] == [(p.packer, b"tails", "k:due")]
    (tmp_path / "a" / "one.jsonl").write_bytes(b"x" * 19 + b"\n")  # a whole unit now
    p.track("a")
    with Transaction(cluster) as txn:
        assert _pipeline.cut_file(txn, p, "one.jsonl", since) == 1
    assert _cells(p, "one.jsonl")["f:cut"] == b"20"
    # The packer packs both tails, from each file's f:cut, into one unit, the older
    # (two's) first.
    with open(tmp_path / "a" / "one.jsonl", "ab") as f:
        f.write(b"x" * 4 + b"\n")
    p.track("a")
    with Transaction(cluster) as txn:
        assert _pipeline.pack_tails(txn, p, _pipeline._now_ms() + 600_000) == 1
    assert json.loads(_units(p)[_pipeline.unit_row("two.jsonl", 40)]["u:parts"]) == [
        ["two.jsonl", 40, 50], ["one.jsonl", 20, 25]]


def test_a_unit_stranded_before_its_sites_time_is_up_is_woken_at_its_site(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a site ETA, a pending unit left with neither a lease nor a notification
    (as an older version's processor left it) is woken by the sweep at its own site
    only, while its site's time runs."""
    _write(tmp_path, "one.jsonl", 10)
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, site_eta=600.0)
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    row = _pipeline.unit_row("one.jsonl", 0)
    with monkeypatch.context() as old:  # the lease left to a thread that never ran
        old.setattr(_pipeline, "_lease_unit", lambda *args, **kwargs: [("one.jsonl", 0, 1)])
        old.setattr(_pipeline._Processor, "_start", lambda self, row, owner: None)
        worker = Worker(cluster, p.observers("a"), threads=1)
        worker.register()
        assert worker._scanner.serve_row(p.units, row)
    assert p.stranded() == [row]
    assert p.sweep_leases(int(_units(p)[row]["u:born"])) == 1
    assert [n.column for n in pending_notifications(cluster, [p.units])] == ["u:ready.a"]


def test_units_cut_before_a_site_eta_was_set_are_handed_to_every_site(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A pipeline given a site ETA once it has pending units cut without one (no
    ``u:home``, no ``u:born``): the sweep takes them as past their site's time and
    notifies every site's processors of those it must wake (their lease expired)."""
    _write(tmp_path, "one.jsonl", 10)
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0)
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    row = _pipeline.unit_row("one.jsonl", 0)
    t = _pipeline._now_ms()
    assert _take(p, row, "another-host/worker", t, renew=False)
    later = _app.pipeline(cluster, tmp_path, max_unit_delay=0, site_eta=600.0)
    later.create()
    assert later.sweep_leases(t + 30_000) == 1
    assert sorted(n.column for n in pending_notifications(cluster, [p.units])
                  if n.column != "u:ready") == ["u:ready.a", "u:ready.b"]


def test_the_lease_sweep_goes_past_units_in_hand(cluster: Cluster, tmp_path: Path) -> None:
    """Of two pending units, the first (in row order) leased by a live owner until
    later and the second's lease expired: the sweep leaves the first and wakes the
    second."""
    for name in ("a.jsonl", "b.jsonl"):
        _write(tmp_path, name, 10)
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, pack_files=False, local_eta=30.0)
    p.create()
    p.track("a")
    rows = [_pipeline.unit_row(name, 0) for name in ("a.jsonl", "b.jsonl")]
    t = _pipeline._now_ms()
    for name in ("a.jsonl", "b.jsonl"):
        with Transaction(cluster) as txn:
            assert _pipeline.cut_file(txn, p, name, t) == 1
    assert _take(p, rows[0], "another-host/worker", t + 60_000, renew=False)
    assert _take(p, rows[1], "another-host/worker", t, renew=False)
    assert p.sweep_leases(t + 30_000) == 1


def _fail_until_changed(p: LogPipeline, row: bytes, error: str = "BadRecord: test") -> None:
    """MAX_FAILURES failed attempts of this process at the unit in *row*."""
    for _ in range(_pipeline.MAX_FAILURES):
        assert _pipeline._take_lease(p.cluster, p, row, _owner(p), _pipeline._now_ms())
        _pipeline._fail(p.cluster, p, row, _owner(p), error)


def test_a_failing_unit_is_split_at_the_record_end_past_its_middle(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A unit that failed MAX_FAILURES times is replaced, in one transaction, by two
    pending units partitioning its range at the first record end at or past its
    middle, or, when that is its end, at its first record's end: each indexed and
    notified, given to the unit's site with its age, without lease or failures. A
    unit of one record is quarantined with the error (2000 bytes of it at most)."""
    for site in "ab":
        (tmp_path / site).mkdir()
    # Records [0, 4), [4, 14), [14, 17), [17, 21), [21, 25), [25, 31).
    (tmp_path / "a" / "one.jsonl").write_bytes(b"".join(
        b"x" * n + b"\n" for n in (3, 9, 2, 3, 3, 5)))
    p = _app.pipeline(cluster, tmp_path, unit_bytes=4096, max_unit_delay=0, site_eta=600.0)
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    row = _pipeline.unit_row("one.jsonl", 0)
    born = _units(p)[row]["u:born"]

    def unit(end: int) -> dict[str, bytes]:
        return {"u:range": b"%d" % end, "u:state": b"P", "u:home": b"a", "u:born": born,
                "u:ready.a": b"1"}

    def at(begin: int) -> bytes:
        return _pipeline.unit_row("one.jsonl", begin)

    _fail_until_changed(p, at(0))  # its middle, 15, is in the record [14, 17)
    assert _units(p) == {at(0): unit(17), at(17): unit(31)}
    assert _index(p) == {at(0), at(17)}
    assert {n.row for n in pending_notifications(cluster, [p.units])} == {at(0), at(17)}
    _fail_until_changed(p, at(17))  # its middle, 24, is in [21, 25)
    _fail_until_changed(p, at(0))  # its middle, 8, is in [4, 14)
    assert _units(p) == {at(0): unit(14), at(14): unit(17), at(17): unit(25),
                         at(25): unit(31)}
    _fail_until_changed(p, at(0))  # past its middle, 7, the next end is its end
    assert _units(p)[at(0)] == unit(4) and _units(p)[at(4)] == unit(14)
    _fail_until_changed(p, at(25), "BadRecord: " + "e" * 3000)  # one record
    assert p.quarantined() == [("one.jsonl", 25, 31, ("BadRecord: " + "e" * 3000)[:2000])]
    assert _units(p)[at(25)]["u:state"] == b"Q"
    assert _index(p) == {at(0), at(4), at(14), at(17)}


def test_a_failing_packed_unit_is_split_between_its_files_first(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A unit packed from three files' tails that failed MAX_FAILURES times becomes
    two units of whole files, at the unit's site and of its age: the first file's
    (its row, now of one part: no ``u:parts``) and the other two's (the second
    file's row becomes that unit's, listing both parts; the third's part row points
    at it), which splits again into a unit per file."""
    names = ("f1.jsonl", "f2.jsonl", "f3.jsonl")
    for name in names:
        _write(tmp_path, name, 2)
    sizes = [(tmp_path / "a" / name).stat().st_size for name in names]
    p = _app.pipeline(cluster, tmp_path, unit_bytes=4096, max_unit_delay=0, site_eta=600.0)
    p.create()
    p.track("a")
    with Transaction(cluster) as txn:
        assert _pipeline.pack_tails(txn, p, _pipeline._now_ms()) == 1
    rows = [_pipeline.unit_row(name, 0) for name in names]
    assert len(json.loads(_units(p)[rows[0]]["u:parts"])) == 3
    born = _units(p)[rows[0]]["u:born"]

    def unit(size: int) -> dict[str, bytes]:  # pending, at site a (it alone holds them)
        return {"u:range": b"%d" % size, "u:state": b"P", "u:home": b"a", "u:born": born,
                "u:ready.a": b"1"}

    _fail_until_changed(p, rows[0])
    units = _units(p)
    assert units[rows[0]] == unit(sizes[0])
    assert units[rows[1]] == {
        **unit(sizes[1]),
        "u:parts": json.dumps([["f2.jsonl", 0, sizes[1]], ["f3.jsonl", 0, sizes[2]]]
                              ).encode()}
    assert units[rows[2]] == {"u:range": b"%d" % sizes[2], "u:unit": rows[1]}
    assert _index(p) == set(rows[:2])
    assert p.coverage() == {"f1.jsonl": ["1 unit(s) pending"],
                            "f2.jsonl": ["1 unit(s) pending"],
                            "f3.jsonl": ["1 unit(s) pending"]}
    # The unit of two files splits into two of one file each.
    _fail_until_changed(p, rows[1])
    units = _units(p)
    for row, size in zip(rows[1:], sizes[1:], strict=True):
        assert units[row] == unit(size)
    assert _index(p) == set(rows)


def test_a_failed_or_retried_unit_is_handed_back_to_its_own_site(
    cluster: Cluster, tmp_path: Path
) -> None:
    """With a site ETA, a unit whose attempt failed (fewer than MAX_FAILURES times),
    and a quarantined range put back to work, are notified to their site's
    processors only."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "bad.jsonl").write_bytes(b"{not json\n")
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, site_eta=600.0)
    p.create()
    p.track("a")
    assert _app.cut(p, "bad.jsonl") == 1
    row = _pipeline.unit_row("bad.jsonl", 0)

    def notified() -> list[str]:
        return sorted(n.column for n in pending_notifications(cluster, [p.units]))

    assert notified() == ["u:ready.a"]
    assert _pipeline._take_lease(cluster, p, row, _owner(p), _pipeline._now_ms())
    _pipeline._fail(cluster, p, row, _owner(p), "BadRecord: test")
    assert _units(p)[row]["u:fail"] == b"1" and notified() == ["u:ready.a"]
    assert _pipeline._take_lease(cluster, p, row, _owner(p), _pipeline._now_ms())
    _pipeline._fail(cluster, p, row, _owner(p), "BadRecord: test")
    assert p.quarantined() != []
    p.retry_range("bad.jsonl", 0)
    assert notified() == ["u:ready.a"]


def test_a_report_keeps_each_sites_complete_size_and_the_largest(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The tracker of each site reports the file's complete size there (up to its
    last newline): ``f:site.<S>`` per site, ``f:size`` the largest, ``f:head`` the
    digest of the largest replica's first bytes, ``f:since`` from the first report
    of bytes not yet in a unit, ``f:grown`` when it last grew (never before the
    file's mtime). A pass that finds no growth reports none."""
    for site in "ab":
        (tmp_path / site).mkdir()
    a, b = tmp_path / "a" / "one.jsonl", tmp_path / "b" / "one.jsonl"
    a.write_bytes(b'{"k":"x"}\n' * 3 + b'{"k":')  # a record half written
    b.write_bytes(b'{"k":"x"}\n')
    later = time.time() + 3600
    os.utime(a, (later, later))
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=600.0)
    p.create()

    def cells() -> dict[str, bytes]:
        with Snapshot(cluster) as snap:
            return snap.get_row(p.files, b"one.jsonl", [
                "f:size", "f:site.a", "f:site.b", "f:head", "f:since", "f:grown"])

    before = _pipeline._now_ms()
    assert p.track("a") == 1
    first = cells()
    since = int(first.pop("f:since"))
    assert before <= since <= _pipeline._now_ms()
    assert first == {"f:size": b"30", "f:site.a": b"30", "f:head": head_digest(a),
                     "f:grown": b"%d" % int(later * 1000)}
    assert p.track("b") == 1
    assert cells() == {**first, "f:site.b": b"10", "f:since": b"%d" % since,
                       "f:grown": cells()["f:grown"]}
    assert int(cells()["f:grown"]) >= since
    assert p.track("a") == p.track("b") == 0
    with open(a, "ab") as f:
        f.write(b'"y"}\n')
    assert p.track("a") == 1
    assert cells()["f:size"] == cells()["f:site.a"] == b"%d" % a.stat().st_size
    assert cells()["f:since"] == b"%d" % since


def test_the_pieces_of_a_unit_cut_before_a_site_eta_go_to_one_site(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A unit cut before the pipeline had a site ETA (no ``u:home``, no ``u:born``)
    that fails until split: its pieces are given to one of the pipeline's sites, as
    a unit cut now is, and born now."""
    _write(tmp_path, "one.jsonl", 4)
    p = _app.pipeline(cluster, tmp_path, unit_bytes=4096, max_unit_delay=0)
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    later = _app.pipeline(cluster, tmp_path, unit_bytes=4096, max_unit_delay=0,
                          site_eta=600.0)
    later.create()
    before = _pipeline._now_ms()
    _fail_until_changed(later, _pipeline.unit_row("one.jsonl", 0))
    pieces = _units(later)
    assert len(pieces) == 2
    for cells in pieces.values():
        assert cells["u:home"] in (b"a", b"b") and f"u:ready.{cells['u:home'].decode()}" in cells
        assert before <= int(cells["u:born"]) <= _pipeline._now_ms()


def test_the_packer_packs_due_tails_oldest_first_into_units_of_up_to_unit_bytes(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Short tails (below unit_bytes), oldest ``f:since`` first, are packed whole into
    units of at most unit_bytes (one exactly full); units are cut up to the one
    holding the newest due tail (due exactly max_unit_delay after its report), and a
    younger tail that fits in that unit goes with it; a younger tail that does not
    waits, as does a file whose tail is a whole unit (its cutter's)."""
    for site in "ab":
        (tmp_path / site).mkdir()
    tails = {"t1": (1_000, 8), "t2": (2_000, 12), "t3": (3_000, 10), "t4": (4_000, 5),
             "t7": (4_200, 1), "t5": (4_500, 9), "t6": (0, 20)}
    for name, (_, size) in tails.items():
        (tmp_path / "a" / f"{name}.jsonl").write_bytes(b"x" * (size - 1) + b"\n")
    p = _app.pipeline(cluster, tmp_path, unit_bytes=20, max_unit_delay=5.0)
    p.create()
    p.track("a")
    with Transaction(cluster) as txn:
        for name, (since, _) in tails.items():
            txn.set(p.files, f"{name}.jsonl".encode(), "f:since", b"%d" % since)
    with Transaction(cluster) as txn:
        assert _pipeline.pack_tails(txn, p, 8_000) == 2  # t3 due exactly now
    units = {row: json.loads(c["u:parts"]) for row, c in _units(p).items() if "u:parts" in c}
    assert units == {
        _pipeline.unit_row("t1.jsonl", 0): [["t1.jsonl", 0, 8], ["t2.jsonl", 0, 12]],
        _pipeline.unit_row("t3.jsonl", 0): [["t3.jsonl", 0, 10], ["t4.jsonl", 0, 5],
                                            ["t7.jsonl", 0, 1]]}
    for name, (_, size) in tails.items():
        cut = name in ("t1", "t2", "t3", "t4", "t7")
        assert _cells(p, f"{name}.jsonl").get("f:cut") == (b"%d" % size if cut else None)
        assert ("f:since" in _cells(p, f"{name}.jsonl")) is not cut
    # A one-byte tail, oldest, and a due tail that fits with it make a unit; t5, the
    # next (not due) and too long for what is left of it, waits.
    (tmp_path / "a" / "t8.jsonl").write_bytes(b"\n")
    (tmp_path / "a" / "t9.jsonl").write_bytes(b"x" * 11 + b"\n")
    p.track("a")
    with Transaction(cluster) as txn:
        txn.set(p.files, b"t8.jsonl", "f:since", b"100")
        txn.set(p.files, b"t9.jsonl", "f:since", b"200")
    with Transaction(cluster) as txn:
        assert _pipeline.pack_tails(txn, p, 8_000) == 1
    assert json.loads(_units(p)[_pipeline.unit_row("t8.jsonl", 0)]["u:parts"]) == [
        ["t8.jsonl", 0, 1], ["t9.jsonl", 0, 12]]
    assert "f:cut" not in _cells(p, "t5.jsonl")


def test_the_collector_forgets_no_file_a_pending_unit_a_refusal_or_a_gap_still_holds(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Two files' tails packed into one unit, old enough to forget and cut to their
    ends: while the unit is pending neither is forgotten (the second file's row is a
    part of the first's unit: its state is that unit's). Once the unit committed, the
    first file is truncated and refused, and the second's part row is lost (as an
    operator's hand might): the collector's transaction, which checks again what the
    pass's scan found, keeps the refused file, and the file its units no longer
    cover to its end."""
    for name in ("f1.jsonl", "f2.jsonl"):
        _write(tmp_path, name, 2)
    p = _app.pipeline(cluster, tmp_path, unit_bytes=4096, max_unit_delay=0,
                      forget_after=3600.0)
    p.create()
    p.track("a")
    with Transaction(cluster) as txn:
        assert _pipeline.pack_tails(txn, p, _pipeline._now_ms()) == 1
    row, part = _pipeline.unit_row("f1.jsonl", 0), _pipeline.unit_row("f2.jsonl", 0)
    assert _units(p)[part]["u:unit"] == row
    later = _pipeline._now_ms() + 3_601_000
    assert p.collect_garbage(later) == 0
    assert not _pipeline._forget_file(cluster, p, b"f2.jsonl", later)
    assert _pipeline.process_unit(p, "a", row, _owner(p))
    path = tmp_path / "a" / "f1.jsonl"
    path.write_bytes(path.read_bytes()[:5])
    p.track("a")
    with Transaction(cluster) as txn:
        for column in ("u:range", "u:unit"):
            txn.delete(p.units, part, column)
    assert not _pipeline._forget_file(cluster, p, b"f1.jsonl", later)
    assert not _pipeline._forget_file(cluster, p, b"f2.jsonl", later)
    assert p.collect_garbage(later) == 0
    with Snapshot(cluster) as snap:
        kept = {row: cells for row, cells in snap.scan(p.files, None, None, [
            "f:size", "f:refused", "f:forgotten"])}
    assert sorted(kept) == [b"f1.jsonl", b"f2.jsonl"]
    assert "f:refused" in kept[b"f1.jsonl"]
    assert all("f:size" in cells and "f:forgotten" not in cells for cells in kept.values())


def test_coverage_names_each_files_gaps_overlaps_pending_units_and_uncovered_end(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``coverage`` per file, from rows written by hand: committed and quarantined
    units partitioning ``[0, f:size)`` with ``f:cut`` there are well; otherwise the
    first byte of each gap or overlap, how far the units cover against the cut and
    the size, or, while units are pending, how many (and how many of them have
    neither a lease nor a notification). A further part of a packed unit has its
    unit's state, or, its unit row gone (a forgotten file's), a committed one's; a row
    with neither state nor unit is no unit's."""
    p = _app.pipeline(cluster, tmp_path)
    p.create()
    files = {"whole": (30, 30), "gap": (30, 30), "overlap": (30, 30), "short": (30, 20),
             "uncut": (30, None), "gapshort": (40, 40), "pending": (30, 30),
             "p1": (10, 10), "p2": (10, 10), "p3": (10, 10), "nostate": (30, 30)}
    units = {"whole": [(0, 10, b"C"), (10, 30, b"Q")],
             "gap": [(0, 10, b"C"), (20, 30, b"C")],
             "overlap": [(0, 20, b"C"), (5, 10, b"C"), (20, 30, b"C")],
             "short": [(0, 20, b"C")],
             "gapshort": [(0, 10, b"C"), (20, 30, b"C")],
             "pending": [(0, 10, b"C"), (10, 20, b"P"), (20, 30, b"P")],
             "p1": [(0, 10, b"P")], "nostate": [(0, 30, None)]}
    leased = _pipeline.unit_row("pending.jsonl", 10)
    with Transaction(cluster) as txn:
        for name, (size, cut) in files.items():
            txn.set(p.files, f"{name}.jsonl".encode(), "f:size", b"%d" % size)
            if cut is not None:
                txn.set(p.files, f"{name}.jsonl".encode(), "f:cut", b"%d" % cut)
        for name, found in units.items():
            for begin, end, state in found:
                row = _pipeline.unit_row(f"{name}.jsonl", begin)
                txn.set(p.units, row, "u:range", b"%d" % end)
                if state is not None:
                    txn.set(p.units, row, "u:state", state)
                if state == b"P":
                    txn.set(p.pending, row, "p:u", b"1")
        txn.set(p.units, leased, "u:lease", json.dumps(
            {"owner": "another-host/worker", "expires": 1}).encode())
        for name, unit in (("p2", "p1"), ("p3", "gone")):
            row = _pipeline.unit_row(f"{name}.jsonl", 0)
            txn.set(p.units, row, "u:range", b"10")
            txn.set(p.units, row, "u:unit", _pipeline.unit_row(f"{unit}.jsonl", 0))
    assert p.coverage() == {
        "whole.jsonl": [],
        "gap.jsonl": ["gap at 10"],
        "overlap.jsonl": ["overlap at 5"],
        "short.jsonl": ["covered up to 20, cut at 20, tracked 30"],
        "uncut.jsonl": ["covered up to 0, cut at 0, tracked 30"],
        "gapshort.jsonl": ["gap at 10", "covered up to 30, cut at 40, tracked 40"],
        "pending.jsonl": ["2 unit(s) pending, 1 with neither a lease nor a notification"],
        "p1.jsonl": ["1 unit(s) pending, 1 with neither a lease nor a notification"],
        "p2.jsonl": ["1 unit(s) pending, 1 with neither a lease nor a notification"],
        "p3.jsonl": [],
        "nostate.jsonl": ["covered up to 0, cut at 30, tracked 30"],
    }


def test_a_tracker_pass_wakes_each_due_tails_cutter_or_the_packer_once(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracker pass counts the files that grew; for a tail that did not grow and
    is due (max_unit_delay after its ``f:since``, not a millisecond before; at once
    without one) it wakes the file's cutter, or, with packing and a tail shorter than
    a unit, the packer, once for all of them. It skips a refused file and a file gone
    between the listing and its reading, and goes on with the next."""
    for site in "ab":
        (tmp_path / site).mkdir()
    a = tmp_path / "a"
    (a / "0refused.jsonl").write_bytes(b"w" * 9 + b"\n")
    (a / "exact.jsonl").write_bytes(b"x" * 19 + b"\n")  # a whole unit
    (a / "short.jsonl").write_bytes(b"y" * 9 + b"\n")
    (a / "tail.jsonl").write_bytes((b"z" * 9 + b"\n") * 3)  # a unit cut, then 10 bytes
    p = _app.pipeline(cluster, tmp_path, unit_bytes=20, max_unit_delay=5.0)
    p.create()
    assert p.track("a") == 4
    with Transaction(cluster) as txn:
        for name in ("0refused", "exact", "short"):
            txn.set(p.files, f"{name}.jsonl".encode(), "f:since", b"1000")
        txn.set(p.files, b"0refused.jsonl", "f:refused", b"test")
        txn.set(p.files, b"tail.jsonl", "f:cut", b"20")
        txn.delete(p.files, b"tail.jsonl", "f:since")  # grew while cut: due at once
    woken: list[tuple[object, ...]] = []
    monkeypatch.setattr(_pipeline, "_nudge", lambda *args: woken.append(args))
    monkeypatch.setattr(_pipeline, "_nudge_packer", lambda *args: woken.append(args))
    listing = _pipeline.matching_files
    monkeypatch.setattr(_pipeline, "matching_files",
                        lambda directory, pattern: ["0gone.jsonl", *listing(directory, pattern)])
    clock = [5_999]
    monkeypatch.setattr(_pipeline, "_now_ms", lambda: clock[0])
    assert p.track("a") == 0
    assert woken == [(cluster, p)]  # the tail without f:since
    woken.clear()
    clock[0] = 6_000
    assert p.track("a") == 0
    assert woken == [(cluster, p, "exact.jsonl"), (cluster, p)]
    woken.clear()
    alone = _app.pipeline(cluster, tmp_path, unit_bytes=20, max_unit_delay=5.0,
                          pack_files=False)
    assert alone.track("a") == 0
    assert woken == [(cluster, alone, name) for name in ("exact.jsonl", "short.jsonl",
                                                         "tail.jsonl")]


def test_the_collector_takes_a_files_units_not_those_of_a_file_named_after_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A file's unit rows are its name, a NUL and an offset: a file whose name begins
    with another's (``one.jsonl-2.jsonl``) has units of its own, which the other's
    forgetting neither counts nor deletes. Both, committed and old, are forgotten."""
    names = ("one.jsonl", "one.jsonl-2.jsonl")
    for name in names:
        _write(tmp_path, name, 10)
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, forget_after=3600.0,
                      pack_files=False)
    p.create()
    p.track("a")
    for name in names:
        with Transaction(cluster) as txn:
            assert _pipeline.cut_file(txn, p, name, _pipeline._now_ms()) == 1
        assert _pipeline.process_unit(p, "a", _pipeline.unit_row(name, 0), _owner(p))
    assert p.collect_garbage(_pipeline._now_ms() + 3_601_000) == 2
    assert _units(p) == {}


def test_the_tasks_are_each_sites_tracker_the_lease_sweep_and_the_collector(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``tasks(site)``: that site's tracker (every site's without one), the lease sweep
    every track_interval but at most twice a second, and the collector every quarter
    of forget_after, between half a second and a minute (none without forget_after)."""
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "one.jsonl").write_bytes(b"x" * 9 + b"\n")
    for track, forget, leases, gc in ((0.1, 3600.0, 0.5, 60.0), (2.0, 1.0, 2.0, 0.5),
                                      (0.5, 100.0, 0.5, 25.0), (0.7, 240.0, 0.7, 60.0),
                                      (0.1, 2.0, 0.5, 0.5)):
        p = _app.pipeline(cluster, tmp_path, track_interval=track, forget_after=forget)
        found = p.tasks("b")
        assert [(t.name, t.interval) for t in found] == [
            ("ubiq.logs.track.b", track), ("ubiq.logs.leases", leases), ("ubiq.logs.gc", gc)]
        assert (found[1].task, found[2].task) == (p.sweep_leases, p.collect_garbage)
        assert [t.name for t in p.tasks()][:2] == ["ubiq.logs.track.a", "ubiq.logs.track.b"]
    p.create()
    assert p.tasks("b")[0].task() == 1  # site b's tracker
    with Snapshot(cluster) as snap:
        assert snap.get(p.files, b"one.jsonl", "f:site.b") == b"10"


def test_a_pipelines_arguments_are_checked_and_kept(cluster: Cluster, tmp_path: Path) -> None:
    """Each argument of ``LogPipeline`` is refused, with what was given, when it is
    not what it must be, and kept (durations in ms) when it is; the defaults."""
    app, sites = _app.Counts(), {"a": tmp_path / "a", "b": str(tmp_path / "b")}

    def refused(message: str, **options: object) -> None:
        arguments: dict[str, object] = {"app": app, "sites": sites, **options}
        with pytest.raises(percolator.InvalidArgument) as refusal:
            LogPipeline(cluster, "logs", **arguments)  # type: ignore[arg-type]
        assert str(refusal.value) == message

    with pytest.raises(percolator.InvalidArgument) as refusal:
        LogPipeline(None, "logs", app=app, sites=sites)  # type: ignore[arg-type]
    assert str(refusal.value) == "LogPipeline needs a percolator.Cluster, got None"
    long = "x" * 100
    refused(f"app must be a ubiq.Application, got {long!r:.80}", app=long)
    for bad in ({}, {"a-1": "d"}, {1: "d"}, {"a": "d", "b_": "d"}, {"-" + long: "d"}):
        refused(f"sites must map alphanumeric names to directories, got {bad!r:.80}",
                sites=bad)
    for bad in (0, -1, 1.5, "1"):
        refused(f"unit_bytes must be a positive int, got {bad!r}", unit_bytes=bad)
    for name in ("forget_after", "site_eta"):
        for bad in (0, -1.0, True, "7d"):
            refused(f"{name} must be a positive number of seconds or None, got {bad!r}",
                    **{name: bad})
    p = LogPipeline(cluster, "logs", app=app, sites=sites)
    assert (p.cluster, p.name, p.app, p.on_commit) == (cluster, "logs", app, None)
    assert p.sites == {"a": tmp_path / "a", "b": tmp_path / "b"}
    assert (p.pattern, p.unit_bytes, p.max_unit_delay_ms, p.local_eta_ms, p.track_interval,
            p.forget_after_ms, p.site_eta_ms, p.pack_files) == (
        "*.jsonl", 1 << 20, 5_000, 60_000, 1.0, 7 * 86_400_000, None, True)
    assert (p.sink, p.staging) == (tmp_path / "logs.out", tmp_path / "logs.out" / ".staging")
    assert (p.files, p.units, p.quarantine, p.pending, p.packer) == (
        "ubiq.logs.files", "ubiq.logs.units", "ubiq.logs.quarantine", "ubiq.logs.pending",
        "ubiq.logs.packer")

    def on_commit(unit: WorkUnit) -> None:
        pass

    p = LogPipeline(cluster, "other", app=app, sites={"b": tmp_path / "b"}, pattern="*.log",
                    unit_bytes=1, max_unit_delay=0.25, local_eta=1.5, track_interval=0.2,
                    sink=str(tmp_path / "out"), forget_after=1, site_eta=2.5,
                    pack_files=0, on_commit=on_commit)  # type: ignore[arg-type]
    assert (p.pattern, p.unit_bytes, p.max_unit_delay_ms, p.local_eta_ms, p.track_interval,
            p.forget_after_ms, p.site_eta_ms, p.pack_files, p.on_commit) == (
        "*.log", 1, 250, 1_500, 0.2, 1_000, 2_500, False, on_commit)
    assert (p.sink, p.staging, p.files) == (tmp_path / "out", tmp_path / "out" / ".staging",
                                            "ubiq.other.files")
    assert LogPipeline(cluster, "logs", app=app, sites=sites,
                       forget_after=None).forget_after_ms is None
    assert LogPipeline(cluster, "logs", app=app, sites=sites,
                       site_eta=0.5).site_eta_ms == 500  # any positive ETA


def test_a_report_writes_only_growth_of_a_file_still_followed(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report decides from what its own transaction reads (the tracker's pass read
    the row in an earlier snapshot; another tracker of the site, or a refusal, may
    have committed since): a report of no growth past the site's size, or of a
    refused file, writes and counts nothing. An empty file is followed from its first
    report (``f:size`` 0). A file first seen forget_after after its mtime (exactly
    then) is too old to follow; a file followed already is reported whatever its
    mtime."""
    for site in "ab":
        (tmp_path / site).mkdir()
    a = tmp_path / "a"
    (a / "one.jsonl").write_bytes(b"x" * 9 + b"\n")
    p = _app.pipeline(cluster, tmp_path, forget_after=3600.0)
    p.create()
    assert p.track("a") == 1

    def cells(name: str = "one.jsonl") -> dict[str, bytes]:
        with Snapshot(cluster) as snap:
            return snap.get_row(p.files, name.encode(), [
                "f:size", "f:site.a", "f:site.b", "f:head", "f:since", "f:grown", "f:refused"])

    before, head, now = cells(), head_digest(a / "one.jsonl"), _pipeline._now_ms()
    # Reported already by another tracker of the site.
    assert not _pipeline._report(cluster, p, "one.jsonl", "a", 10, head, now + 9, now + 9)
    assert cells() == before
    with Transaction(cluster) as txn:
        txn.set(p.files, b"one.jsonl", "f:refused", b"test")
    assert not _pipeline._report(cluster, p, "one.jsonl", "a", 20, head, now, now)
    assert cells() == {**before, "f:refused": b"test"}
    with Transaction(cluster) as txn:
        txn.delete(p.files, b"one.jsonl", "f:refused")
    with Transaction(cluster) as txn:
        assert _pipeline.pack_tails(txn, p, now + 10**6) == 1
    assert "f:since" not in cells()
    (tmp_path / "b" / "one.jsonl").write_bytes((a / "one.jsonl").read_bytes())
    assert p.track("b") == 1  # site b caught up: no byte new, none waits to be cut
    assert "f:since" not in cells() and cells()["f:site.b"] == b"10"
    kib = a / "kib.jsonl"  # grows to exactly its first KiB, then past it
    for record in (10, HEAD_BYTES - 10, 10):
        with open(kib, "ab") as f:
            f.write(b"z" * (record - 1) + b"\n")
        assert p.track("a") == 1
    assert "f:refused" not in cells("kib.jsonl")
    assert cells("kib.jsonl")["f:head"] == head_digest(kib)
    t = now + 10 * 3_600_000
    monkeypatch.setattr(_pipeline, "_now_ms", lambda: t)
    (a / "empty.jsonl").write_bytes(b"")
    for name, age in (("old.jsonl", 3_600_000), ("young.jsonl", 3_599_999),
                      ("empty.jsonl", 0), ("one.jsonl", 5 * 3_600_000)):
        if name != "empty.jsonl":
            with open(a / name, "ab") as f:
                f.write(b"y" * 9 + b"\n")
        os.utime(a / name, ns=((t - age) * 1_000_000,) * 2)
    assert p.track("a") == 3
    assert {name: cells(name).get("f:size") for name in (
        "old.jsonl", "young.jsonl", "empty.jsonl", "one.jsonl")} == {
        "old.jsonl": None, "young.jsonl": b"10", "empty.jsonl": b"0", "one.jsonl": b"20"}


def test_a_file_processed_before_a_site_eta_was_set_is_forgotten_whole(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A file cut and processed while the pipeline had no site ETA (its units' ready
    column ``u:ready``, acknowledged by the processor of that column), forgotten once
    the pipeline has one (whose processors observe ``u:ready.<site>``): coverage names
    no unit of it, and once cleared nothing of it is left, neither the old ready cells
    nor their acknowledgements."""
    _one_file_processed(cluster, tmp_path)
    later = _app.pipeline(cluster, tmp_path, max_unit_delay=0, forget_after=3600.0,
                          site_eta=600.0)
    later.create()
    assert later.collect_garbage(_pipeline._now_ms() + 3_601_000) == 1
    assert later.coverage() == {}
    assert _pipeline._clear_forgotten(cluster, later, b"one.jsonl", set())
    # the deletions' notifications aside (no worker of this test runs them)
    left = {t: [c for c in cells if "/n:" not in c] for t, cells in _stored(later).items()}
    assert left == {later.files: [], later.units: [], later.pending: []}


def test_the_observers_of_a_site_and_what_each_observes(cluster: Cluster,
                                                        tmp_path: Path) -> None:
    """``observers(site)``: the cutter, the packer, the site's processor (at most two
    units in flight) and the dispatcher, each named after the pipeline (their names
    make their acknowledgement columns); without a site, the first site's; an unknown
    site is refused. With a site ETA the processor observes its site's column."""
    p = _app.pipeline(cluster, tmp_path)
    with pytest.raises(percolator.InvalidArgument) as refusal:
        p.observers("c")
    assert str(refusal.value) == "unknown site 'c'; sites: ['a', 'b']"
    for pipeline, site, column in ((p, None, "u:ready"), (p, "b", "u:ready"), (
            _app.pipeline(cluster, tmp_path, site_eta=600.0), "b", "u:ready.b")):
        found = pipeline.observers(site)
        assert [(o.name, o.table, o.column) for o in found] == [
            ("ubiq.logs.cutter", p.files, "f:size"), ("ubiq.logs.packer", p.packer, "k:due"),
            ("ubiq.logs.processor", p.units, column),
            ("ubiq.logs.dispatcher", p.units, "u:commit")]
        processor = found[2]
        assert isinstance(processor, _pipeline._Processor)
        assert processor.site == (site or "a") and processor.pipeline is pipeline
        assert all(o.pipeline is pipeline for o in found)  # type: ignore[attr-defined]
        assert [processor._slots.acquire(blocking=False) for _ in range(3)] == [
            True, True, False]


def test_a_processor_run_holds_a_slot_only_while_its_unit_is_in_hand(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processor's run takes one of its two slots and leases the unit for this
    process, handing it to a thread; it gives the slot back at once when it takes no
    lease (its own live lease: a thread holds the unit) or its lease fails (raised).
    The thread gives it back once done, whether the unit committed or failed."""
    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, local_eta=30.0)
    row, _ = _one_unit(p, tmp_path)
    [processor] = [o for o in p.observers("a") if isinstance(o, _pipeline._Processor)]
    started: list[tuple[bytes, str]] = []
    monkeypatch.setattr(_pipeline._Processor, "_start",
                        lambda self, row, owner: started.append((row, owner)))

    def free() -> int:
        n = 0
        while processor._slots.acquire(blocking=False):
            n += 1
        for _ in range(n):
            processor._slots.release()
        return n

    for _ in range(2):  # the second run finds this process's live lease
        with Transaction(cluster) as txn:
            processor.process(txn, row, "u:ready")
        assert started == [(row, _owner(p))] and free() == 1
    assert _lease(p, row) is not None and _lease(p, row)[0] == _owner(p)  # type: ignore[index]
    with monkeypatch.context() as down:
        down.setattr(_pipeline, "_lease_unit", lambda *args, **kwargs: 1 / 0)
        with pytest.raises(ZeroDivisionError), Transaction(cluster) as txn:
            processor.process(txn, row, "u:ready")
    assert free() == 1
    with monkeypatch.context() as failing:
        failing.setattr(_pipeline, "process_unit", lambda *args: 1 / 0)
        processor._slots.acquire()
        processor._run(row, _owner(p))  # logged; the lease expires, the sweep wakes it
    assert free() == 1
    processor._run(row, _owner(p))  # the first run's thread
    assert free() == 2 and _units(p)[row]["u:state"] == b"C"


def test_a_units_thread_is_a_daemon_named_after_its_row(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processor hands a unit to a thread of its own that runs the unit with its
    row and owner: a daemon (a worker's exit does not wait for a unit in hand: its
    lease expires and the sweep hands it on), named after the row's first 40 bytes."""
    p = _app.pipeline(cluster, tmp_path)
    [processor] = [o for o in p.observers("a") if isinstance(o, _pipeline._Processor)]
    seen: list[tuple[bytes, str, bool, str]] = []
    done = threading.Event()

    def run(self: _pipeline._Processor, row: bytes, owner: str) -> None:
        thread = threading.current_thread()
        seen.append((row, owner, thread.daemon, thread.name))
        done.set()

    monkeypatch.setattr(_pipeline._Processor, "_run", run)
    row = b"x" * 50
    processor._start(row, "me")
    assert done.wait(60)
    assert seen == [(row, "me", True, f"ubiq-unit-{row[:40]!r}")]


def test_a_unit_is_read_from_the_workers_own_replica_when_it_holds_the_bytes(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A worker reads a unit from its own site's replica when that holds the unit's
    bytes, exactly up to its end too: another site's, even a longer one, only when its
    own lags."""
    _write(tmp_path, "one.jsonl", 10)
    data = (tmp_path / "a" / "one.jsonl").read_bytes()
    (tmp_path / "b" / "one.jsonl").write_bytes(data + b'{"k": "k0"}\n')  # b is ahead
    read: list[tuple[str, Path]] = []

    class Where(_app.Counts):
        def process(self, unit: WorkUnit, out: Output) -> None:
            read.append((unit.site, unit.path))
            super().process(unit, out)

    p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, app=Where())
    p.create()
    p.track("a")
    assert _app.cut(p, "one.jsonl") == 1
    assert _pipeline.process_unit(p, "a", _pipeline.unit_row("one.jsonl", 0), _owner(p))
    assert read == [("a", tmp_path / "a" / "one.jsonl")]
