"""Batched compare-and-set (``check_and_set_many``, :class:`percolator._store.BatchedCas`)
over every backend, through :func:`percolator._bulk.check_and_set_many`: the store's own
on SQLite (one write transaction) and Bigtable (one ``CheckAndMutateRow`` per row), the
one-by-one fallback on HBase, whose Thrift1 ``checkAndPut`` has no batch form.

Whatever the backend, the results and the cells left behind are those of the same
``check_and_set`` calls made one after another.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from percolator._bulk import check_and_set_many
from percolator._presence import Presence
from percolator._store import BatchedCas, CasItem, Read, Store
from percolator.stores import open_store
from tests._backends import drop_tables

ROOT = str(Path(__file__).resolve().parents[2])
FAMILIES = {"d": 0, "w": 0, "l": 1, "n": 0}
ROWS = (b"r0", b"r1", b"r2")
COLUMNS = ("l:a", "l:b")
VALUES = (b"A", b"B", b"C")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    drop_tables(s)
    s.close()


def _table(store: Store) -> str:
    name = f"t{uuid.uuid4().hex[:8]}"
    store.create_table(name, FAMILIES)
    return name


def _state(store: Store, table: str, rows: tuple[bytes, ...] = ROWS
           ) -> dict[tuple[bytes, str], Any]:
    """The value of every lock cell and every version of every data cell of *rows*."""
    found = store.read_rows(table, list(rows), [Read("l"), Read("d", versions=None)])
    state: dict[tuple[bytes, str], Any] = {}
    for row, cells in found.items():
        for column, versions in cells.items():
            # HBase writes compared cells at server time: compare their values only
            state[(row, column)] = (versions[0][1] if column.startswith("l:")
                                    else sorted(versions))
    return state


def _replay(store: Store, table: str, items: list[CasItem]) -> list[bool]:
    return [store.check_and_set(table, *item) for item in items]


item = st.tuples(
    st.sampled_from(ROWS),
    st.sampled_from(COLUMNS),
    st.one_of(st.none(), st.sampled_from(VALUES)),
    st.sampled_from(VALUES),
    st.lists(st.tuples(st.sampled_from(("d:a", "d:b")), st.integers(1, 3),
                       st.sampled_from((b"p", b"q"))), max_size=2),
)
start = st.dictionaries(st.tuples(st.sampled_from(ROWS), st.sampled_from(COLUMNS)),
                        st.sampled_from(VALUES), max_size=4)


@pytest.fixture
def two_tables(store: Store) -> tuple[str, str]:
    """The batched and the replayed table of every example of a test."""
    return _table(store), _table(store)


_examples = itertools.count()


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(initial=start, items=st.lists(item, max_size=12))
def test_a_batch_is_the_same_calls_one_after_another(
    store: Store, two_tables: tuple[str, str], initial: dict[tuple[bytes, str], bytes],
    items: list[CasItem]
) -> None:
    """Each example on rows of its own (its number before the row names) of the same
    two tables: they start empty, as fresh tables would (on HBase, two creations and
    drops per example were a minute of the suite's time)."""
    batched, replayed = two_tables
    prefix = b"%d." % next(_examples)
    rows = tuple(prefix + row for row in ROWS)
    items = [(prefix + row, column, expected, new, data)
             for row, column, expected, new, data in items]
    for table in (batched, replayed):
        assert _state(store, table, rows) == {}
        for (row, column), value in initial.items():
            assert store.check_and_set(table, prefix + row, column, None, value)
    assert check_and_set_many(store, batched, items) == _replay(store, replayed, items)
    assert _state(store, batched, rows) == _state(store, replayed, rows)


def test_the_cases_a_write_without_reading_would_get_wrong(store: Store) -> None:
    table = _table(store)
    assert check_and_set_many(store, table, [
        (b"r0", "l:a", None, b"A", [("d:a", 1, b"p")]),
        (b"r0", "l:a", b"A", b"B", [("d:a", 2, b"q")]),  # sees the item before it
        (b"r0", "l:b", b"A", b"B", []),                   # absent, not A...
        (b"r0", "l:b", None, b"C", []),                   # ...so this one wins
        (b"r1", "l:a", None, b"A", []),
        (b"r1", "l:a", None, b"B", []),                   # taken by the item before it
    ]) == [True, True, False, True, True, False]
    assert _state(store, table) == {
        (b"r0", "l:a"): b"B", (b"r0", "l:b"): b"C", (b"r1", "l:a"): b"A",
        (b"r0", "d:a"): [(1, b"p"), (2, b"q")],
    }
    # one row, one of its cells differs: only that one fails
    assert check_and_set_many(store, table, [
        (b"r0", "l:a", b"B", b"A", []),
        (b"r0", "l:b", b"B", b"A", []),
    ]) == [True, False]
    assert check_and_set_many(store, table, [
        (b"r0", "l:a", b"A", b"B", []),
        (b"r0", "l:b", b"C", b"B", []),
    ]) == [True, True]
    # every item would win written in the wrong order (inserts first, then updates)
    assert check_and_set_many(store, table, [
        (b"r2", "l:a", b"A", b"B", []),
        (b"r2", "l:a", None, b"A", []),
    ]) == [False, True]
    assert _state(store, table)[(b"r2", "l:a")] == b"A"
    assert _state(store, table)[(b"r0", "l:b")] == b"B"
    many = [(row, column, None, b"A", [("d:" + column[2:], 5, row)])
            for row in ROWS for column in COLUMNS]
    assert check_and_set_many(store, table, many) == [
        (row, column) not in {(b"r0", "l:a"), (b"r0", "l:b"), (b"r1", "l:a"), (b"r2", "l:a")}
        for row, column, *_ in many
    ]


# --- the store's own batching ------------------------------------------------------------


@pytest.mark.bigtable
def test_bigtable_sends_one_request_per_row(bigtable_emulator: str,
                                            request: pytest.FixtureRequest) -> None:
    from tests._bigtable import bigtable_store_url
    from tests.bigtable.test_bigtable_store import _interceptor

    counter = _interceptor()
    s = open_store(bigtable_store_url(bigtable_emulator, request.node.name),
                   interceptors=[counter])
    try:
        assert isinstance(s, BatchedCas)
        s.create_table("t", FAMILIES)
        rows = [b"row%02d" % i for i in range(20)]
        locks = [(row, column, None, b"L", [("d:" + column[2:], 7, b"v")])
                 for row in rows for column in ("l:a", "l:b", "l:c")]
        counter.calls.clear()
        assert s.check_and_set_many("t", locks) == [True] * 60
        assert dict(counter.calls) == {"CheckAndMutateRow": 20}

        counter.calls.clear()
        free = [(row, column, b"L", b"F", [("w:" + column[2:], 9, b"P")])
                for row, column, *_ in locks]
        assert s.check_and_set("t", rows[3], "l:b", b"L", b"X")  # one cell changed
        counter.calls.clear()
        won = s.check_and_set_many("t", free)
        assert won == [not (row == rows[3] and column == "l:b") for row, column, *_ in free]
        # 19 rows at once; the row whose request failed, again cell by cell
        assert dict(counter.calls) == {"CheckAndMutateRow": 19 + 1 + 3}
        found = s.read_rows("t", rows, [Read("l"), Read("w", versions=None)])
        assert found[rows[3]]["l:b"][0][1] == b"X" and "w:b" not in found[rows[3]]
        assert found[rows[4]] == {"l:a": [(0, b"F")], "l:b": [(0, b"F")], "l:c": [(0, b"F")],
                                  "w:a": [(9, b"P")], "w:b": [(9, b"P")], "w:c": [(9, b"P")]}
    finally:
        for table in s.list_tables():
            s.drop_table(table)
        s.close()


def test_hbase_has_no_batched_compare_and_set() -> None:
    pytest.importorskip("happybase")
    from percolator.stores.hbase import HBaseStore

    # Thrift1's checkAndPut compares and sets one cell per call, with no batch form:
    # a "batch" would be the same calls, so the store does not claim the capability.
    assert not hasattr(HBaseStore, "check_and_set_many")


_OTHER_WRITER = """
import fcntl, os, sys
from percolator.stores import open_store
store = open_store(f"sqlite://{sys.argv[1]}")  # a writer of the file, in another process
turn = os.open(sys.argv[1] + "-write.lock", os.O_RDWR)
fcntl.flock(turn, fcntl.LOCK_EX)  # its turn, held until told to go
print("holding", flush=True)
sys.stdin.readline()
"""


@contextlib.contextmanager
def other_writer(path: str) -> Iterator[subprocess.Popen[str]]:
    """A process that opens the store at *path* and holds the writers' turn until
    its standard input gets a line."""
    proc = subprocess.Popen([sys.executable, "-c", _OTHER_WRITER, path], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_sqlite_writers_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer waits for the turn of a writer of another process: here one that came
    after this store's first write (its mark makes this store look again at once)."""
    monkeypatch.setattr(Presence, "RECHECK", 3600.0)  # only the mark can tell
    path = f"{tmp_path}/repo.db"
    s = open_store(f"sqlite://{path}")
    s.create_table("t", FAMILIES)  # a write, alone on the file: no turn taken
    with other_writer(path) as other:
        done: list[list[bool]] = []
        writer = threading.Thread(target=lambda: done.append(
            check_and_set_many(s, "t", [(b"r", "l:a", None, b"L", [])])))
        writer.start()
        writer.join(0.5)
        assert writer.is_alive() and not done  # waiting for its turn
        assert s.read_rows("t", [b"r"], [Read("l")]) == {}
        assert other.stdin is not None
        other.stdin.write("go\n")
        other.stdin.flush()
        writer.join()
    assert done == [[True]]
    s.close()


def test_sqlite_writer_alone_on_its_file_takes_no_turn(tmp_path: Path) -> None:
    """No other store object writes the file: a held turn lock (here by a descriptor
    that is no writer's) does not hold the writer up, which takes no turn at all."""
    path = f"{tmp_path}/repo.db"
    s = open_store(f"sqlite://{path}")
    s.create_table("t", FAMILIES)
    turn = os.open(f"{path}-write.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(turn, fcntl.LOCK_EX)
    try:
        writer = threading.Thread(
            target=check_and_set_many, args=(s, "t", [(b"r", "l:a", None, b"L", [])]))
        writer.start()
        writer.join(30)  # waiting for the turn would last busy_timeout, 60 s
        assert not writer.is_alive()
        assert s.read_rows("t", [b"r"], [Read("l")]) == {b"r": {"l:a": [(0, b"L")]}}
    finally:
        os.close(turn)
        s.close()


def test_sqlite_writer_goes_on_after_busy_timeout(tmp_path: Path) -> None:
    path = f"{tmp_path}/repo.db"
    s = open_store(f"sqlite://{path}?busy_timeout=0.2")
    s.create_table("t", FAMILIES)
    with other_writer(path):  # holds its turn and never finishes
        try:
            # the turn is only an order: SQLite's own locking keeps the write correct
            assert check_and_set_many(s, "t", [(b"r", "l:a", None, b"L", [])]) == [True]
        finally:
            s.close()
