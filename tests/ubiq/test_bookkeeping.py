"""Ubiq's bookkeeping stays bounded (issue 35): the pending-units index holds exactly
the pending units, so the lease sweep finds every one of them without scanning every
unit ever cut; the garbage collector forgets fully committed, old files (units and
row), never what a worker still needs, and a forgotten file is never tracked anew."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import Worker, wait_for_observers
from observers.ubiq import LogPipeline, Output, WorkUnit, _pipeline
from percolator import Cluster, Snapshot, Transaction
from percolator._encoding import FAMILIES, FREE_TAG, LOCK
from percolator._internals import internals
from percolator._notifications import pending_notifications
from percolator._store import Read
from percolator.testing import CrashPoint, client_of, crash_commit
from tests._backends import SQLITE_AND_BIGTABLE, backend_fixture
from tests._concurrency import spawn_module
from tests.ubiq import _app
from tests.ubiq.test_ubiq import assert_exact, settle

# On the embedded store and Bigtable: the recipe's code is the same on every store
# (the note in tests/ubiq/test_ubiq.py).
backend = backend_fixture(SQLITE_AND_BIGTABLE)


def _write(root: Path, name: str, records: int, key: str = "k") -> None:
    for site in "ab":
        (root / site).mkdir(exist_ok=True)
    with open(root / "a" / name, "ab") as f:
        f.write(b"".join(json.dumps({"k": f"{key}{i % 3}", "i": i}).encode() + b"\n"
                         for i in range(records)))


def _pending_by_scan(p: LogPipeline) -> set[bytes]:
    with Snapshot(p.cluster) as snap:
        return {row for row, c in snap.scan(p.units, None, None, ["u:state"])
                if c.get("u:state") == b"P"}


def _index(p: LogPipeline) -> set[bytes]:
    with Snapshot(p.cluster) as snap:
        return {row for row, _ in snap.scan(p.pending)}


def _rows(p: LogPipeline, table: str) -> list[bytes]:
    """Rows of *table* (of the files table: files tracked, not the forgotten ones)."""
    with Snapshot(p.cluster) as snap:
        return [row for row, c in snap.scan(table) if table != p.files or "f:size" in c]


def _stored(p: LogPipeline) -> dict[str, list[str]]:
    """Every cell the store still holds for the bookkeeping tables (any family, any
    version), once Percolator's GC has removed what no reader can see; but a FREE
    lock cell, which HBase keeps for good (docs/garbage-collection.md: Thrift1 can
    only put)."""
    p.cluster.gc(retention=0)
    reads = [Read(family, None, versions=None) for family in FAMILIES]
    return {table: [f"{row!r}/{column}" for row, cells in internals(p.cluster).store.scan(
        table, None, None, reads) for column, versions in cells.items()
        if not (column.startswith(f"{LOCK}:")
                and all(v.startswith(FREE_TAG) for _, v in versions))]
        for table in (p.files, p.units, p.pending)}


def _expire_every_lease(p: LogPipeline, rows: set[bytes]) -> None:
    """Lease each of *rows* to this (live) process, already expired."""
    owner = internals(p.cluster).coordination.current_owner()
    for row in rows:
        assert _pipeline._take_lease(p.cluster, p, row, owner, _pipeline._now_ms()
                                     - 2 * p.local_eta_ms)


def test_the_pending_index_holds_exactly_the_pending_units_and_the_sweep_finds_them(
    tmp_path: Path
) -> None:
    """Through cuts, failures, splits, a quarantine, a retry and commits, the index
    equals the pending units found by a full scan, and one sweep re-notifies every
    pending unit whose lease expired. Fails when a split piece, a retried range or a
    cut unit is not indexed (the sweep misses it), or when a commit or a quarantine
    leaves its index row behind (the index grows with every unit ever cut)."""
    _write(tmp_path, "one.jsonl", 120)
    (tmp_path / "a" / "one.jsonl").open("ab").write(b"{not json\n")
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        p = _app.pipeline(cluster, tmp_path, unit_bytes=1024, max_unit_delay=0)
        p.create()
        p.track("a")
        assert _app.cut(p, "one.jsonl") > 2
        assert _index(p) == _pending_by_scan(p) and len(_index(p)) > 2
        owner = internals(cluster).coordination.current_owner()
        while p.quarantined() == []:  # split down to the bad record, the file's last
            last = max(_index(p))
            for _ in range(_pipeline.MAX_FAILURES):
                assert _pipeline._take_lease(cluster, p, last, owner, _pipeline._now_ms())
                _pipeline._fail(cluster, p, last, owner, "BadRecord: test")
            assert _index(p) == _pending_by_scan(p)  # both split pieces, or quarantined
        assert last not in _index(p)
        p.retry_range(*_pipeline.parse_unit_row(last))
        assert last in _index(p) and _index(p) == _pending_by_scan(p)
        pending = _index(p)
        _expire_every_lease(p, pending)
        assert p.sweep_leases() == len(pending)  # every one of them, the retried one too
        with Worker(cluster, [*p.observers("a"), _app.RollUp], threads=1):
            deadline = time.monotonic() + 60
            while p.quarantined() == [] or _index(p) != set():
                assert time.monotonic() < deadline, (_index(p), p.quarantined())
                time.sleep(0.05)
        assert _pending_by_scan(p) == set()  # committed or quarantined: none indexed


def test_create_fills_the_index_of_a_pipeline_made_before_it(tmp_path: Path) -> None:
    """``create`` fills the index in transactions of 200 units: 401 pending units,
    one a record, fill three, the last of one unit."""
    _write(tmp_path, "one.jsonl", 401)
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        p = _app.pipeline(cluster, tmp_path, unit_bytes=1, max_unit_delay=0)
        p.create()
        p.track("a")
        assert _app.cut(p, "one.jsonl") == 401
        units = _index(p)
        cluster.drop_table(p.pending)  # as an older version left it
        p.create()
        assert _index(p) == units == _pending_by_scan(p)


def _committed_and_aged(p: LogPipeline, root: Path, age: float) -> None:
    """Process everything, then make every file at every site look *age* s old."""
    with Worker(p.cluster, [*p.observers("a"), _app.RollUp], tasks=p.tasks("a"), threads=1):
        settle(p)
    old = time.time() - age
    for path in [*(root / "a").glob("*.jsonl"), *(root / "b").glob("*.jsonl")]:
        os.utime(path, (old, old))


def test_the_collector_forgets_old_committed_files_and_the_tracker_never_sees_them_again(
    tmp_path: Path
) -> None:
    """Two old files fully committed are forgotten (no file row, no unit left; a
    file that grew recently is kept: the first collection, on the real clock), a file
    with a quarantined record is kept; tracking and processing again changes
    nothing: the counts stay exact, and the store keeps no cell of the forgotten
    files. Fails when the tracker follows a forgotten file anew (it is counted
    twice), when the collector forgets a file not fully committed (its quarantined
    range is lost), or leaves the observers' acknowledgements on forgotten rows."""
    for name in ("old1.jsonl", "old2.jsonl"):
        _write(tmp_path, name, 150)
    _write(tmp_path, "bad.jsonl", 20)
    (tmp_path / "a" / "bad.jsonl").open("ab").write(b"{not json\n")
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        p = _app.pipeline(cluster, tmp_path, unit_bytes=512, forget_after=3600.0)
        p.create()
        _committed_and_aged(p, tmp_path, 7200)
        units = len(_rows(p, p.units))
        assert p.collect_garbage() == 0  # it grew (was reported) less than an hour ago
        assert p.collect_garbage(_pipeline._now_ms() + 3_601_000) == 2
        assert sorted(_rows(p, p.files)) == [b"bad.jsonl"]
        kept = {_pipeline.parse_unit_row(row)[0] for row in _rows(p, p.units)}
        assert kept == {"bad.jsonl"} and len(_rows(p, p.units)) < units
        assert _index(p) == set()
        # The trackers and workers go on: the old files are still on disk.
        with Worker(cluster, [*p.observers("a"), _app.RollUp], tasks=p.tasks(), threads=1):
            for site in "ab":
                p.track(site)
            settle(p)
        assert sorted(_rows(p, p.files)) == [b"bad.jsonl"]
        assert_exact(p, tmp_path)
        assert len(p.quarantined()) == 1
        p.collect_garbage()  # the acknowledgements written since on forgotten rows
        left = _stored(p)
        assert all(cell.startswith("b'bad.jsonl") for cells in left.values() for cell in cells)
        assert left[p.units], "the quarantined file's units are kept"


def test_a_collector_dying_at_any_point_of_its_commit_leaves_all_or_nothing(
    store_url: str, tmp_path: Path
) -> None:
    """Units committed by a worker that died before publishing their files (the
    dispatcher not run yet), one per file; then the collector's transaction forgetting
    each file dies at a point of its commit (before, at and after the commit point;
    the fifth file's is not killed): each file and its unit are either all there or
    all gone (its locks are rolled back or forward), a live collector finishes the
    job, each unit's file is published once with what the unit committed, and a
    restarted worker with its tracker reprocesses nothing; nothing of the files is
    left in the store once the observers acknowledged the deletions and a pass more
    ran. Fails when the collector deletes units without publishing a committed unit's
    files first, or clears the acknowledgements while the deletions' notifications
    are pending (the runs write them again, for good). (One pipeline for the points,
    a file each: a pipeline per point made and dropped its tables five times on
    HBase.)"""
    points = (None, CrashPoint("prewrite", 0), CrashPoint("prewrite", 3),
              CrashPoint("commit_point"), CrashPoint("commit", 2))
    with percolator.connect(store_url) as cluster:
        p = _app.pipeline(cluster, tmp_path, unit_bytes=1 << 20, max_unit_delay=0,
                          forget_after=3600.0, app=_app.Counts(files=True))
        p.create()
        owner = internals(cluster).coordination.current_owner()
        published = []
        for n, point in enumerate(points):
            _write(tmp_path, f"file{n}.jsonl", 60)
            p.track("a")
            assert _app.cut(p, f"file{n}.jsonl") == 1
            row = _pipeline.unit_row(f"file{n}.jsonl", 0)
            [(name, _, end)] = _pipeline._take_lease(cluster, p, row, owner,
                                                     _pipeline._now_ms()) or []
            staging = p.staging / row.hex() / "attempt"
            txn = Transaction(cluster)
            out = Output(txn, staging)
            p.app.process(WorkUnit(name, 0, end, tmp_path / "a" / name, "a"), out)
            assert _pipeline.finish_unit(txn, p, row, owner, "attempt", out.files)
            txn.commit()  # and its process died: nothing published
            final = p.sink / f"{name}@0.counts.json"
            assert not final.exists() and (staging / "counts.json").exists()
            published.append((final, staging))
            old = time.time() - 7200
            os.utime(tmp_path / "a" / name, (old, old))
            later = _pipeline._now_ms() + 3_601_000
            if point is not None:
                dying = client_of(cluster)
                dying.one_phase_commit = False
                gc = Transaction(dying)
                assert _pipeline._forget_file(gc, p, name.encode(), later)
                crash_commit(gc, point)
                with Snapshot(cluster) as snap:  # all or nothing, whichever way it resolved
                    left = (snap.get(p.files, name.encode(), "f:size"),
                            snap.get(p.units, row, "u:state"))
                assert left in ((None, None), (b"%d" % end, b"C")), (point, left)
        later = _pipeline._now_ms() + 3_601_000
        p.collect_garbage(later)
        assert _rows(p, p.files) == [] and _rows(p, p.units) == []
        # The deletions' notifications are pending (no worker ran): a pass now must
        # leave the forgotten rows' acknowledgements, still to be written, to a later one.
        assert p.collect_garbage(later) == 0
        for final, staging in published:
            assert json.loads(final.read_bytes()) == {"k0": 20, "k1": 20, "k2": 20}
            assert not staging.exists()
        with Worker(cluster, [*p.observers("a"), _app.RollUp], tasks=p.tasks("a"),
                    threads=1):
            p.track("a")
            wait_for_observers(cluster, 60)
        assert _rows(p, p.files) == [] and _rows(p, p.units) == []
        assert _app.partial_totals(cluster) == _app.batch_counts(tmp_path / "a")
        # The observers ran on the forgotten rows (deleting an observed cell notifies)
        # and acknowledged; the next pass clears that too: nothing at all is left.
        assert p.collect_garbage() == 0
        assert _stored(p) == {p.files: [], p.units: [], p.pending: []}


def test_forget_after_is_checked(cluster: Cluster, tmp_path: Path) -> None:
    for bad in (0, -1.0, True, "7d"):
        with pytest.raises(percolator.InvalidArgument, match="forget_after"):
            _app.pipeline(cluster, tmp_path, forget_after=bad)
    p = _app.pipeline(cluster, tmp_path, forget_after=None)
    assert p.collect_garbage() == 0
    assert not any(task.name.endswith(".gc") for task in p.tasks())


# --- the data-center ETA ------------------------------------------------------------


def _states(p: LogPipeline) -> dict[bytes, dict[str, bytes]]:
    with Snapshot(p.cluster) as snap:
        return dict(snap.scan(p.units, None, None, ["u:state", "u:home", "u:born", "u:lease"]))


def _until(check: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_unit_whose_site_is_down_is_taken_over_after_its_site_eta(tmp_path: Path) -> None:
    """Both sites hold the file, and its units are given to both; only site b's
    worker runs (site a is down). b commits its own units and none of a's, and a
    sweep short of a's units' site ETA hands them to nobody; a sweep at it hands
    them to every site, and b commits them: exact counts. Fails when the sweep
    ignores the site ETA (a's units are never taken over), or when units go to
    every site at once (b takes a's units before their ETA)."""
    _write(tmp_path, "one.jsonl", 200)
    (tmp_path / "b" / "one.jsonl").write_bytes((tmp_path / "a" / "one.jsonl").read_bytes())
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        p = _app.pipeline(cluster, tmp_path, unit_bytes=256, max_unit_delay=0,
                          site_eta=600.0)
        p.create()
        p.track("a")
        p.track("b")
        assert _app.cut(p, "one.jsonl") > 6
        homes = {row: c["u:home"] for row, c in _states(p).items()}
        at_a = {row for row, home in homes.items() if home == b"a"}
        assert at_a and len(at_a) < len(homes)  # given to both sites
        born = min(int(c["u:born"]) for c in _states(p).values())
        with Worker(cluster, [*p.observers("b"), _app.RollUp], threads=1):
            _until(lambda: all(c["u:state"] == b"C" for row, c in _states(p).items()
                               if row not in at_a), "site b's own units")
            assert p.sweep_leases(born + 600_000 - 1) == 0  # in a's hands until its ETA
            assert all(c["u:state"] == b"P" and "u:lease" not in c
                       for row, c in _states(p).items() if row in at_a)
            assert p.sweep_leases(born + 600_000) == len(at_a)
            _until(lambda: all(c["u:state"] == b"C" for c in _states(p).values()),
                   "site a's units, taken over")
            _until(lambda: _app.partial_totals(cluster) == _app.batch_counts(tmp_path / "a"),
                   "the roll-up")
        assert all(not problems for problems in p.coverage().values()), p.coverage()


def test_units_of_a_paused_site_are_taken_over_by_a_live_one(tmp_path: Path) -> None:
    """Site a's worker process is up (it commits a probe unit only its replica
    holds), then SIGSTOPped while idle (a site in partial outage: alive, silent);
    files arrive at both sites; site b's worker commits its own units, and with
    the lease sweep takes over every one of a's once their site ETA (2 s) is past:
    everything is committed once, exactly, a's units by b."""
    url = f"sqlite:///{tmp_path}/repo.db"
    _write(tmp_path, "probe.jsonl", 3)
    with percolator.connect(url) as cluster:
        p = _app.pipeline(cluster, tmp_path, unit_bytes=512, max_unit_delay=0,
                          site_eta=2.0, local_eta=1.0)
        p.create()
        paused = spawn_module("observers.ubiq", "run", "--cluster", url, "--pipeline",
                              "tests.ubiq._app:make", "--site", "a", "--threads", "1",
                              env={"UBIQ_ROOT": str(tmp_path), "UBIQ_ETA": "1",
                                   "UBIQ_SITE_ETA": "2"})
        try:
            _until(lambda: p.coverage().get("probe.jsonl") == [], "site a never came up")
            _until(lambda: not list(pending_notifications(cluster, [p.files, p.units])),
                   "site a never went idle")  # no row of any transaction in its hands
            paused.send_signal(signal.SIGSTOP)
            for i in range(4):
                _write(tmp_path, f"log{i}.jsonl", 150)
                (tmp_path / "b" / f"log{i}.jsonl").write_bytes(
                    (tmp_path / "a" / f"log{i}.jsonl").read_bytes())
            for site in "ab":
                p.track(site)
            # No periodic tasks: the stopped process may hold their (local, fcntl)
            # singleton locks; the test sweeps the leases itself.
            with Worker(cluster, [*p.observers("b"), _app.RollUp], threads=1):

                def done() -> bool:
                    p.sweep_leases()
                    return not any(p.coverage().values())

                _until(done, "site a's units never taken over", timeout=120)
                _until(lambda: not list(pending_notifications(cluster, [_app.PARTIALS])),
                       "the roll-up")
            at_a = {row for row, c in _states(p).items()
                    if c.get("u:home") == b"a" and not row.startswith(b"probe")}
            assert at_a, "no unit given to site a"
            with Snapshot(cluster) as snap:
                for row in at_a:
                    name, begin = _pipeline.parse_unit_row(row)
                    end = int(snap.get(p.units, row, "u:range") or b"0")
                    parts = json.loads(snap.get(p.units, row, "u:parts") or b"[0]")
                    more = f"+{len(parts) - 1}" if len(parts) > 1 else ""  # packed tails
                    assert snap.get(_app.ATTEMPTS, f"{name}@{begin}-{end}{more}".encode(),
                                    "a:owner") == str(os.getpid()).encode()
        finally:
            paused.send_signal(signal.SIGCONT)
            paused.kill()
            paused.wait()
        assert_exact(p, tmp_path)


class _RowsRead:
    """A store that counts, per table, the rows its scans and reads return."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.rows: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_rows(self, table: str, rows: Any, *args: Any, **kwargs: Any) -> Any:
        found = self._store.read_rows(table, rows, *args, **kwargs)
        self.rows[table] += sum(1 for cells in found.values() if cells)
        return found

    def newest_at(self, table: str, *args: Any) -> Any:  # the embedded store's one cell
        found = self._store.newest_at(table, *args)
        self.rows[table] += found is not None
        return found

    def scan(self, table: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for item in self._store.scan(table, *args, **kwargs):
            self.rows[table] += 1
            yield item


def _sweep_reads(root: Path, committed_records: int) -> tuple[int, Counter[str]]:
    """A pipeline that committed the units of *committed_records* records, then cut
    four more units (pending, leases expired): what one lease sweep re-notifies,
    and the rows it read per table."""
    root.mkdir()
    _write(root, "old.jsonl", committed_records)
    with percolator.connect(f"sqlite:///{root}/repo.db") as cluster:
        p = _app.pipeline(cluster, root, unit_bytes=1024, max_unit_delay=0,
                          forget_after=None)
        p.create()
        with Worker(cluster, [*p.observers("a"), _app.RollUp], tasks=p.tasks("a"),
                    threads=1):
            settle(p)
        _write(root, "new.jsonl", 150)
        p.track("a")
        assert _app.cut(p, "new.jsonl") == 4
        assert len(_index(p)) == 4
        _expire_every_lease(p, _index(p))
        # The index rows of committed units are deleted, but their dead versions stay
        # in the store, and a scan steps over them, until the library's GC removes them.
        cluster.gc(retention=0)
        counting = _RowsRead(internals(cluster).store)
        internals(cluster).store = counting  # type: ignore[assignment]
        try:
            renotified = p.sweep_leases()
        finally:
            internals(cluster).store = counting._store
        return renotified, counting.rows


def test_a_lease_sweep_reads_rows_of_the_pending_units_not_of_every_unit_ever_cut(
    tmp_path: Path
) -> None:
    """Four pending units with expired leases, after some committed units and after
    five times as many, the library's GC having run: the sweep re-notifies the four
    and reads the same rows of the units, pending and files tables either way (at
    most a few per pending unit). A sweep that scans the units table for the pending
    ones reads every unit ever cut."""
    few, few_rows = _sweep_reads(tmp_path / "few", 300)
    many, many_rows = _sweep_reads(tmp_path / "many", 1500)
    assert few == many == 4
    for table in ("ubiq.logs.units", "ubiq.logs.pending", "ubiq.logs.files"):
        assert few_rows[table] == many_rows[table] <= 3 * 4, (table, few_rows, many_rows)


def test_the_collector_forgets_small_files_packed_into_units_of_several_files(
    tmp_path: Path
) -> None:
    """Six small old files, packed two or three to a unit and committed, are all
    forgotten, every row of their units with them, whichever file the unit's own
    row sits in. Fails when the collector judges a further part by its own row
    (which has no state) rather than by its unit's."""
    for i in range(6):
        _write(tmp_path, f"small{i}.jsonl", 5)
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        p = _app.pipeline(cluster, tmp_path, unit_bytes=512, forget_after=3600.0)
        p.create()
        _committed_and_aged(p, tmp_path, 7200)
        with Snapshot(cluster) as snap:
            packed = [row for row, c in snap.scan(p.units, None, None, ["u:parts"])]
        assert packed, "the small files were not packed"
        assert p.collect_garbage(_pipeline._now_ms() + 3_601_000) == 6
        assert _rows(p, p.files) == [] and _rows(p, p.units) == []
        assert p.coverage() == {}


def test_a_unit_the_sweep_found_pending_is_not_woken_once_committed(tmp_path: Path) -> None:
    """A lease sweep reads the pending units in one snapshot and notifies the due ones
    in a later transaction (seconds later, with many pending): a unit committed in
    between must not be notified, or a processor's run on it (its file perhaps
    forgotten and cleared by then) leaves an acknowledgement nothing deletes (the
    leftover cell versions of bench/ubiq.py with the collector on). Fails when the
    notifying transaction does not check that the unit is still pending."""
    _write(tmp_path, "one.jsonl", 20)
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        p = _app.pipeline(cluster, tmp_path, max_unit_delay=0, forget_after=None)
        p.create()
        p.track("a")
        assert _app.cut(p, "one.jsonl") == 1
        row = _pipeline.unit_row("one.jsonl", 0)
        with Worker(cluster, [*p.observers("a"), _app.RollUp], threads=1):
            settle(p)
        _pipeline._renotify(cluster, p, [(row, p.ready_columns())])  # the sweep's list
        assert list(pending_notifications(cluster, [p.units])) == []
