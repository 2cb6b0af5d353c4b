"""What is particular to the embedded SQLite store: its file format, its lock census's
question, its one-cell reads."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import percolator
from percolator._store import Mutation, Read
from percolator.stores import open_store


def test_a_file_of_an_older_format_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = open_store(f"sqlite://{path}")
    store.create_table("t", {"l": 1, "d": 0})
    store.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 1")  # as written by percolator 0.1 before format 2
    db.close()
    with pytest.raises(percolator.StoreUnavailable, match=r"older percolator.*new file"):
        open_store(f"sqlite://{path}")


def test_a_new_file_gets_the_current_format(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    open_store(f"sqlite://{path}").close()
    open_store(f"sqlite://{path}").close()  # and reopens
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    db.close()


def _vm_steps(store: Any, question: Callable[[], object]) -> tuple[object, int]:
    """*question()*'s answer and the work SQLite did for it (virtual machine steps, in
    units of 50): a count, not a time, so the same on a loaded machine."""
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    db = store._db()
    db.set_progress_handler(tick, 50)
    try:
        answer = question()
    finally:
        db.set_progress_handler(None, 0)
    return answer, steps[0]


def test_asking_whether_any_lock_is_held_costs_the_held_locks_not_the_table(
    tmp_path: Path,
) -> None:
    """The lock census's sweep asks whether any lock cell is not FREE, and
    ``percolator wait`` lists the held locks. Neither may read every lock cell of the
    table (a sweep holds back every lock taker of the host; a wait asks every 50 ms):
    a partial index holds only the cells that are not FREE."""
    free, held = b"F" + bytes(9), b"L" + bytes(9)
    stores = {}
    for name, cells in (("small", 100), ("big", 20_000)):
        store = stores[name] = open_store(f"sqlite://{tmp_path / name}.db")
        store.create_table("t", {"l": 1, "d": 0})
        for start in range(0, cells, 5000):
            store.mutate_rows("t", [Mutation(b"r%06d" % i, [("l:c", 0, free)])
                                    for i in range(start, min(cells, start + 5000))])
    for store in stores.values():
        assert store.any_untagged("l", b"F") is False  # (the first question builds the index)
    big = stores["big"]
    costs = {name: _vm_steps(s, lambda s=s: s.any_untagged("l", b"F")) for name, s in
             stores.items()}
    assert costs["small"][0] is False and costs["big"][0] is False
    assert costs["big"][1] <= 2 * costs["small"][1] + 10, costs  # 200x the cells

    big.mutate_rows("t", [Mutation(b"r012345", [("l:c", 0, held)])])  # a lock is taken
    assert _vm_steps(big, lambda: big.any_untagged("l", b"F"))[0] is True
    big.mutate_rows("t", [Mutation(b"r012345", [("l:c", 0, free)])])  # and released
    assert _vm_steps(big, lambda: big.any_untagged("l", b"F")) == (False, costs["big"][1])

    scans = {name: _vm_steps(s, lambda s=s: list(s.scan("t", None, None, [
        Read("l", skip_tag=b"F")]))) for name, s in stores.items()}  # held_locks' scan
    assert scans["small"][0] == [] and scans["big"][0] == []
    assert scans["big"][1] <= 2 * scans["small"][1] + 10, scans

    big.drop_table("t")  # a table created again gets the index again
    big.create_table("t", {"l": 1})
    big.mutate_rows("t", [Mutation(b"r%06d" % i, [("l:c", 0, free)]) for i in range(20_000)])
    big.any_untagged("l", b"F")
    assert _vm_steps(big, lambda: big.any_untagged("l", b"F"))[1] <= costs["big"][1] + 10
    for store in stores.values():
        store.close()


def test_a_table_created_through_a_cluster_indexes_its_held_locks_at_once(
    tmp_path: Path,
) -> None:
    """Every lock written to the table, from the first, is in the index (the same cost
    for every load and commit), not only those written after a first sweep."""
    with percolator.connect(f"sqlite://{tmp_path}/c.db") as cluster:
        cluster.create_table("docs")
    db = sqlite3.connect(tmp_path / "c.db")
    indexes = db.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'docs#l'"
    ).fetchall()
    db.close()
    assert len(indexes) == 1 and "WHERE substr(value, 1, 1) IS NOT x'46'" in indexes[0][0]


@pytest.mark.parametrize("tag", [b"", b"FF", "F", None])
def test_asking_about_a_tag_of_other_than_one_byte_is_invalid(tmp_path: Path, tag: object) -> None:
    store = open_store(f"sqlite://{tmp_path / 's.db'}")
    store.create_table("t", {"l": 1})
    with pytest.raises(percolator.InvalidArgument, match="one byte"):
        store.any_untagged("l", tag)  # type: ignore[attr-defined]
    db = sqlite3.connect(tmp_path / "s.db")
    made = db.execute("SELECT name FROM sqlite_master WHERE name LIKE '%untagged%'").fetchall()
    assert made == []  # nothing written for a refused question
    db.close()
    store.close()


def test_a_thread_that_ends_leaves_no_connection_open(tmp_path: Path) -> None:
    """Each thread reads through a connection of its own; when the thread ends, the
    connection and its file descriptors go with it. (Kept in a list until the store
    closed, 300 short-lived threads held some 900 descriptors: a worker pool that
    recycles threads, or a server with a thread per request, ran out of them.)"""
    import gc
    import os
    import threading

    store = open_store(f"sqlite:///{tmp_path}/repo.db")
    try:
        store.create_table("t", {"c": 1})
        store.mutate_rows("t", [Mutation(b"r", [("c:q", 1, b"v")])])

        def read() -> None:
            assert store.read_rows("t", [b"r"], [Read("c")])

        def open_descriptors() -> int:
            gc.collect()
            return len(os.listdir("/proc/self/fd"))

        def read_in_threads(n: int) -> None:
            for _ in range(n):
                thread = threading.Thread(target=read)
                thread.start()
                thread.join()

        read_in_threads(100)  # SQLite keeps a few spare descriptors of its own
        before = open_descriptors()
        read_in_threads(300)
        assert open_descriptors() - before < 30
        live = threading.Thread(target=lambda: (read(), ready.set(), done.wait()))
        ready, done = threading.Event(), threading.Event()
        live.start()
        ready.wait()
    finally:
        store.close()  # closes the live thread's connection too
    done.set()
    live.join()


# --- newest_at and the one-cell read: one index probe, the same answer ----------------

_VERSIONS = st.dictionaries(st.integers(0, 40), st.binary(max_size=3), max_size=6)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(versions=st.tuples(_VERSIONS, _VERSIONS), bounds=st.tuples(
    st.integers(0, 45), st.integers(0, 45)))
def test_a_one_cell_read_answers_as_the_general_read(
    tmp_path_factory: pytest.TempPathFactory,
    versions: tuple[dict[int, bytes], dict[int, bytes]],
    bounds: tuple[int, int],
) -> None:
    """``newest_at`` and ``read_rows`` of one cell (its own one-probe statement) give
    what the statement of several cells gives for that cell, at every bound: the
    newest version in range, or nothing."""
    store = open_store(f"sqlite://{tmp_path_factory.mktemp('one')}/s.db")
    try:
        store.create_table("t", {"f": 0})
        for qualifier, cells in zip(("q", "other"), versions, strict=True):
            puts = [(f"f:{qualifier}", ts, value) for ts, value in cells.items()]
            store.mutate_rows("t", [Mutation(b"r", puts), Mutation(b"r2", puts)])
        lo, hi = bounds
        together = store.read_rows("t", [b"r"], [Read("f", ("q", "other"), min_ts=lo, max_ts=hi)])
        expected = together.get(b"r", {}).get("f:q")
        alone = store.read_rows("t", [b"r"], [Read("f", ("q",), min_ts=lo, max_ts=hi)])
        assert alone == ({b"r": {"f:q": expected}} if expected else {})
        newest = store.newest_at("t", b"r", "f", "q", hi)  # type: ignore[attr-defined]
        below = [ts for ts in versions[0] if ts <= hi]
        assert newest == ((max(below), versions[0][max(below)]) if below else None)
        assert store.newest_at("t", b"none", "f", "q", hi) is None  # type: ignore[attr-defined]
    finally:
        store.close()


def test_a_one_cell_read_of_a_family_a_table_no_longer_has_is_refused(tmp_path: Path) -> None:
    """The one-cell and one-row statements are kept per table and family; a table
    dropped and made again without the family is asked anew, and the read refused
    with the family's name (not SQLite's missing table)."""
    store: Any = open_store(f"sqlite://{tmp_path}/s.db")
    try:
        store.create_table("t", {"a": 0})
        store.mutate_rows("t", [Mutation(b"r", [("a:q", 3, b"v")])])
        assert store.newest_at("t", b"r", "a", "q", 9) == (3, b"v")
        assert store.read_rows("t", [b"r"], [Read("a", ("q",))]) == {b"r": {"a:q": [(3, b"v")]}}
        assert store.newest_of_row("t", b"r", (("a", "value"),), ("q",)) == (b"v",)
        store.drop_table("t")
        store.create_table("t", {"b": 0})
        for read in (lambda: store.newest_at("t", b"r", "a", "q", 9),
                     lambda: store.read_rows("t", [b"r"], [Read("a", ("q",))]),
                     lambda: store.newest_of_row("t", b"r", (("a", "value"),), ("q",))):
            with pytest.raises(percolator.InvalidArgument, match="no column family 'a'"):
                read()
        with pytest.raises(percolator.UnknownTableError):
            store.newest_at("gone", b"r", "a", "q", 9)
    finally:
        store.close()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(versions=st.tuples(_VERSIONS, _VERSIONS, _VERSIONS),
       fields=st.lists(st.tuples(st.sampled_from(["f", "g"]), st.sampled_from(["ts", "value"])),
                       min_size=1, max_size=3))
def test_newest_of_row_answers_each_field_as_read_rows(
    tmp_path_factory: pytest.TempPathFactory,
    versions: tuple[dict[int, bytes], dict[int, bytes], dict[int, bytes]],
    fields: list[tuple[str, str]],
) -> None:
    """The one-phase commit's conflict read: for each field, for each qualifier, the
    timestamp or the value of the newest version, in that order, None where none."""
    store: Any = open_store(f"sqlite://{tmp_path_factory.mktemp('row')}/s.db")
    try:
        store.create_table("t", {"f": 0, "g": 1})
        store.mutate_rows("t", [Mutation(b"r", [
            (f"{family}:{qualifier}", ts, value)
            for (family, qualifier), cells in zip(
                (("f", "a"), ("f", "b"), ("g", "a")), versions, strict=True)
            for ts, value in cells.items()])])
        qualifiers = ("a", "b")
        expected = []
        for family, part in fields:
            for qualifier in qualifiers:
                cells = store.read_rows("t", [b"r"], [Read(family, (qualifier,))])
                newest = cells.get(b"r", {}).get(f"{family}:{qualifier}")
                expected.append(None if not newest else newest[0][0 if part == "ts" else 1])
        assert store.newest_of_row("t", b"r", tuple(fields), qualifiers) == tuple(expected)
        with pytest.raises(percolator.InvalidArgument, match="'ts'"):
            store.newest_of_row("t", b"r", (("f", "timestamp"),), qualifiers)
    finally:
        store.close()
