"""Notifications seen from outside a worker (``percolator/_notifications.py``), on the
embedded store: row keys written for people and read back, the quarantine records
found and put back by table, row and column, the message of a wait that timed out,
and the gauge of pending notifications (the quarantine on every backend:
``test_quarantine_backends.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import percolator
from percolator import InvalidArgument, metrics
from percolator._encoding import LOCK, NOTIFY, Committed, Lock, decode_lock
from percolator._internals import internals
from percolator._notifications import (
    HeldLock,
    Pending,
    Quarantined,
    WaitTimeout,
    _describe,
    _failures_key,
    _read_failures,
    clear_failures,
    format_row,
    held_locks,
    parse_row,
    pending_notifications,
    quarantine,
    quarantined,
    record_failure,
    retry_quarantined,
    wait_until_idle,
    watch_pending_notifications,
)
from percolator._notify_index import migrate
from percolator._store import Mutation
from percolator._two_phase import TwoPhaseCommit


@pytest.fixture
def cluster(sqlite_cluster: percolator.Cluster) -> Iterator[percolator.Cluster]:
    for table in ("apps", "docs", "docs1"):
        sqlite_cluster.create_table(table)
        sqlite_cluster.observe(table, "in:v")
        sqlite_cluster.observe(table, "in:w")
    yield sqlite_cluster


def test_a_row_key_is_written_for_people_and_read_back() -> None:
    for row, text in [(b"doc-1", "doc-1"), (b"\xff\x00", "hex:ff00"), (b"a\tb", "hex:610962"),
                      (b"hex:6869", "hex:6865783a36383639")]:
        assert format_row(row) == text
        assert parse_row(text) == row
    with pytest.raises(InvalidArgument, match="bad hex row key 'hex:zz'"):
        parse_row("hex:zz")


def _notify(cluster: percolator.Cluster, table: str, row: bytes, column: str) -> None:
    with percolator.Transaction(cluster) as txn:
        txn.set(table, row, column, b"x")


def _quarantine(cluster: percolator.Cluster, table: str, row: bytes, column: str,
                weak: bool = False) -> None:
    [notify_ts] = [p.timestamps[0] for p in pending_notifications(cluster, [table])
                   if (p.row, p.column) == (row, column)]
    quarantine(cluster, Quarantined(table, row, column, "Obs", f"{table} {row!r} {column}", 3,
                                    weak, time.time()), notify_ts)


def _cells(found: list[Quarantined]) -> set[tuple[str, bytes, str]]:
    return {(q.table, q.row, q.column) for q in found}


def test_quarantined_notifications_are_found_and_put_back_by_table_row_and_column(
    cluster: percolator.Cluster,
) -> None:
    """The records' keys are ``quarantine/<table>/<row>``: a table's are not those of a
    table whose name it starts (docs, docs1), a row's not those of a row it starts
    (d1, d10), and a row key may hold '/'. Each record puts back the kind of
    notification it took out."""
    cells = [("apps", b"d1", "in:v"), ("docs", b"d1", "in:v"), ("docs", b"d1", "in:w"),
             ("docs", b"d10", "in:v"), ("docs", b"a/b", "in:v"), ("docs1", b"d1", "in:v")]
    for table, row, column in cells:
        _notify(cluster, table, row, column)
        _quarantine(cluster, table, row, column, weak=column == "in:w")
    assert not list(pending_notifications(cluster))
    assert _cells(quarantined(cluster)) == set(cells)
    assert _cells(quarantined(cluster, "docs")) == set(cells[1:5])
    assert _cells(quarantined(cluster, "docs", b"d1")) == set(cells[1:3])
    assert _cells(quarantined(cluster, "docs", b"a/b")) == {cells[4]}
    assert _cells(quarantined(cluster, "docs", b"d1", "in:w")) == {cells[2]}
    assert _cells(quarantined(cluster, "docs", b"d1", "in:v")) == {cells[1]}
    assert [q.error for q in quarantined(cluster, "docs", b"d1", "in:w")] == ["docs b'd1' in:w"]

    assert _cells(retry_quarantined(cluster, "docs", b"d1", "in:w")) == {cells[2]}
    assert _cells(retry_quarantined(cluster, "docs", b"d1")) == {cells[1]}
    assert _cells(retry_quarantined(cluster, "docs")) == set(cells[3:5])
    assert _cells(quarantined(cluster)) == {cells[0], cells[5]}
    back = {(p.table, p.row, p.column): (p.weak, p.strong)
            for p in pending_notifications(cluster)}
    assert back == {cells[1]: (False, True), cells[2]: (True, False), cells[3]: (False, True),
                    cells[4]: (False, True)}
    assert _cells(retry_quarantined(cluster)) == {cells[0], cells[5]}
    assert quarantined(cluster) == []


def _pending(n: int, weak: bool = False, strong: bool = True) -> Pending:
    return Pending("docs", f"r{n}".encode(), "in:v", (9, 7)[: 1 + n % 2], weak, strong)


def test_a_timed_out_wait_lists_what_is_left_up_to_ten_of_each() -> None:
    pending = [_pending(0, weak=True, strong=False), _pending(1, weak=True),
               *(_pending(n) for n in range(2, 11))]
    locks = [HeldLock("docs", b"\xff", "in:v", Lock(41, "docs", b"r", "in:v", "o", 0, 1), b""),
             *(HeldLock("docs", f"k{n}".encode(), "in:v", Committed(n, n + 1), b"")
               for n in range(10))]
    assert _describe(pending, locks).split("\n") == [
        "  notification docs/r0/in:v (weak, 1 version(s))",
        "  notification docs/r1/in:v (strong, 2 version(s))",
        *(f"  notification docs/r{n}/in:v (strong, {1 + n % 2} version(s))"
          for n in range(2, 10)),
        "  ... and 1 more notification(s)",
        "  lock docs/hex:ff/in:v (lock by transaction 41)",
        *(f"  lock docs/k{n}/in:v (committed by transaction {n})" for n in range(9)),
        "  ... and 1 more lock(s)",
    ]
    assert _describe(pending[:10], locks[:10]).split("\n")[9:11] == [
        "  notification docs/r9/in:v (strong, 2 version(s))",
        "  lock docs/hex:ff/in:v (lock by transaction 41)"]
    assert len(_describe(pending[:10], locks[:10]).split("\n")) == 20


GAUGE = "percolator_notifications_pending"


def test_the_pending_gauge_counts_each_table_and_recounts_once_its_interval_passed(
    cluster: percolator.Cluster,
) -> None:
    """Every table (none asked) or the tables asked; a scrape within the interval gets
    the last count, a scrape after it counts again."""
    for row in (b"d1", b"d2"):
        _notify(cluster, "docs", row, "in:v")
    _notify(cluster, "docs", b"d1", "in:w")
    _notify(cluster, "docs1", b"d1", "in:v")
    every_scrape = watch_pending_notifications(cluster, every=0)
    cached = watch_pending_notifications(cluster, ["docs"], every=3600)
    try:
        assert sorted(every_scrape()) == [
            (GAUGE, ("apps",), 0.0), (GAUGE, ("docs",), 3.0), (GAUGE, ("docs1",), 1.0)]
        assert list(cached()) == [(GAUGE, ("docs",), 3.0)]
        _notify(cluster, "docs", b"d3", "in:v")
        assert (GAUGE, ("docs",), 4.0) in every_scrape()
        assert list(cached()) == [(GAUGE, ("docs",), 3.0)]
        values, _ = metrics.snapshot()
        assert values[(GAUGE, ("docs1",))] == 1.0
    finally:
        metrics.remove_gauge_callback(every_scrape)
        metrics.remove_gauge_callback(cached)


def test_clearing_the_failures_of_a_cell_that_never_failed_writes_nothing(
    cluster: percolator.Cluster,
) -> None:
    """A clear writes only over a count there is: a cell never counted (a worker clears
    when its own back-off saw the cell fail, another worker may have counted nothing)
    gets no counter row in the meta table, and a count cleared starts again at one."""
    key = _failures_key("docs", b"d1")
    clear_failures(cluster, "docs", b"d1", "in:v")
    assert _read_failures(cluster, key, "in:v") is None
    assert record_failure(cluster, "docs", b"d1", "in:v", 100) == 1
    clear_failures(cluster, "docs", b"d1", "in:v")
    assert _read_failures(cluster, key, "in:v") is not None
    assert record_failure(cluster, "docs", b"d1", "in:v", 100) == 1


def test_held_locks_are_the_lock_cells_not_free_each_with_its_state(
    cluster: percolator.Cluster,
) -> None:
    txn = percolator.Transaction(cluster)
    txn.set("docs", b"d1", "in:v", b"x")
    txn.set("docs", b"d2", "in:w", b"y")
    committer = TwoPhaseCommit.of(txn)
    committer.prewrite()
    held = sorted(held_locks(cluster), key=lambda lock: lock.row)
    assert [(h.table, h.row, h.column) for h in held] == [("docs", b"d1", "in:v"),
                                                           ("docs", b"d2", "in:w")]
    assert all(isinstance(h.state, Lock) and h.state.start_ts == txn.start_ts for h in held)
    assert [decode_lock(h.raw) for h in held] == [h.state for h in held]
    committer.abort()
    assert list(held_locks(cluster)) == []  # FREE now


def test_waiting_takes_a_timeout_of_seconds_or_none(cluster: percolator.Cluster) -> None:
    wait_until_idle(cluster, None)  # idle: returns, however long it may wait
    for bad in (-1, "5"):
        with pytest.raises(InvalidArgument, match="timeout must be a number of seconds >= 0"):
            wait_until_idle(cluster, bad)  # type: ignore[arg-type]


def test_idle_is_two_clean_passes_in_a_row(cluster: percolator.Cluster) -> None:
    """A change committed after a pass found nothing (work moving between tables while
    a pass reads them one by one) is found by the next pass: one clean pass is not
    idle. The commit lands when the second pass starts (its first scan of the notify
    family, after the first pass's scans of the lock family)."""
    store = internals(cluster).store
    real_scan = store.scan
    passes: list[str] = []

    def scan(table: str, *args: Any, **kwargs: Any) -> Any:
        reads = args[2] if len(args) > 2 else kwargs["reads"]
        if any(read.family == LOCK for read in reads):
            passes.append("locks read")
        elif passes and "committed" not in passes:
            passes.append("committed")
            _notify(cluster, "docs", b"late", "in:v")
        return real_scan(table, *args, **kwargs)

    store.scan = scan  # type: ignore[method-assign]
    with pytest.raises(WaitTimeout) as timed_out:
        wait_until_idle(cluster, 0)
    assert [(p.table, p.row) for p in timed_out.value.pending] == [("docs", b"late")]


def test_idle_needs_two_clean_passes_after_the_last_busy_one_and_no_more(
    cluster: percolator.Cluster,
) -> None:
    """Passes: 1 finds a notification; before 2 it is gone (clean); before 3 a new one
    is committed (busy again: the count of clean passes starts over); before 4 it is
    gone; 4 and 5 are clean: idle after exactly five passes."""
    _notify(cluster, "docs", b"first", "in:v")
    store = internals(cluster).store
    real_scan = store.scan
    passes: list[int] = []
    after_locks = [True]

    def gone(row: bytes) -> None:
        store.mutate_rows("docs", [Mutation(row, deletes=[(f"{NOTIFY}:in:v", 2**62)])])

    actions = {2: lambda: gone(b"first"), 3: lambda: _notify(cluster, "docs", b"late", "in:v"),
               4: lambda: gone(b"late")}

    def scan(table: str, *args: Any, **kwargs: Any) -> Any:
        reads = args[2] if len(args) > 2 else kwargs["reads"]
        locks = any(read.family == LOCK for read in reads)
        if not locks and after_locks[0]:  # a pass starts
            passes.append(len(passes) + 1)
            actions.get(passes[-1], lambda: None)()
        after_locks[0] = locks
        return real_scan(table, *args, **kwargs)

    store.scan = scan  # type: ignore[method-assign]
    wait_until_idle(cluster, None, poll=0)
    assert passes == [1, 2, 3, 4, 5]


def test_a_busy_wait_pauses_poll_seconds_before_its_next_pass(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a pass that found work, a wait pauses *poll* seconds before the next: 50 ms
    unless told (the waits of ``percolator wait`` and ``observers.wait_until_idle``),
    never after a clean pass. Each pause here, instead of sleeping, serves the
    notification found."""
    import percolator._notifications as notifications

    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        cluster_store = internals(cluster).store
        for p in pending_notifications(cluster, ["docs"]):
            cluster_store.mutate_rows("docs", [Mutation(p.row, deletes=[
                (f"{NOTIFY}:{p.column}", p.timestamps[0])])])

    monkeypatch.setattr(notifications.time, "sleep", pause)
    _notify(cluster, "docs", b"first", "in:v")
    wait_until_idle(cluster, None)
    assert pauses == [0.05]
    _notify(cluster, "docs", b"second", "in:v")
    wait_until_idle(cluster, None, poll=0.2)
    assert pauses == [0.05, 0.2]


def test_a_wait_of_no_time_gives_up_after_its_first_busy_pass(
    cluster: percolator.Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A timeout of 0 is one look: after a pass that finds work, the wait reports it,
    even on a clock that has not moved since the wait began (a coarse monotonic clock
    reads the same across a fast pass)."""
    import percolator._notifications as notifications

    def pause(seconds: float) -> None:
        raise AssertionError(f"a wait of no time paused {seconds}s for another pass")

    monkeypatch.setattr(notifications.time, "monotonic", lambda: 1000.0)
    monkeypatch.setattr(notifications.time, "sleep", pause)
    _notify(cluster, "docs", b"first", "in:v")
    with pytest.raises(WaitTimeout) as timed_out:
        wait_until_idle(cluster, 0)
    assert [(p.table, p.row) for p in timed_out.value.pending] == [("docs", b"first")]


def test_a_store_without_the_index_migrates_nothing(cluster: percolator.Cluster) -> None:
    _notify(cluster, "docs", b"d1", "in:v")
    assert migrate(internals(cluster), "docs") == 0
