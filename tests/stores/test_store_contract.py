"""The store contract (``percolator/_store.py``, DESIGN.md §4), stated once and run
over every backend: sqlite, hbase (a real HBase through Thrift2, and through Thrift1:
``hbase-thrift1``) and bigtable (the emulator).

Everything here goes through :func:`percolator.stores.open_store` on the
``store_url`` fixture, so a backend passes only if it honours the contract exactly
as the transaction protocol relies on it. Semantics that belong to one backend
(its URL options, its RPC counts, HBase's refusal of empty CAS values, Bigtable's
row-key limits...) are tested in ``tests/hbase/`` and ``tests/bigtable/``.

Timestamps of cells written by ``check_and_set`` are the backend's own (HBase puts
server time there), so these tests compare only their values.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from percolator import InvalidArgument, PercolatorError, UnknownTableError
from percolator._store import (
    Cell,
    Guard,
    GuardedSet,
    Incrementing,
    Mutation,
    Read,
    RowCells,
    Store,
)
from percolator.stores import open_store
from tests._backends import WITH_THRIFT1, backend_fixture, drop_tables
from tests._concurrency import run_concurrently

T = "t"
FAMILIES = {"d": 0, "w": 0, "l": 1, "n": 0}
"""The shape of a percolator table: data and write records keep every version, the
lock family one, the notify family every version."""

# HBase cannot do these: its deletes are tombstones that hide versions put later at or
# below their timestamp until a major compaction ("Deletes mask Puts"), and on Thrift1
# a row mutation mixing timestamps or deletes and puts takes several calls.
HBASE_TOMBSTONES = (
    "HBase deletes are tombstones: they mask versions put later at or below their "
    "timestamp (documented in percolator/stores/hbase.py)"
)
HBASE_SPLIT_MUTATIONS = (
    "HBase Thrift1 applies a row mutation spanning several timestamps, or mixing deletes "
    "and puts, in several calls (documented in percolator/stores/hbase.py)"
)


backend = backend_fixture(WITH_THRIFT1)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    s.create_table(T, FAMILIES)
    yield s
    drop_tables(s)
    s.close()


def put(store: Store, row: bytes, column: str, stamps: list[int]) -> None:
    """Write *column* of *row* at each of *stamps*, with value ``b"v<ts>"``."""
    store.mutate_rows(T, [Mutation(row, puts=[(column, ts, b"v%d" % ts) for ts in stamps])])


def cells(store: Store, row: bytes, *reads: Read) -> RowCells:
    return store.read_rows(T, [row], reads).get(row, {})


def versions(store: Store, row: bytes, column: str, **kw: object) -> list[Cell]:
    family, _, qualifier = column.partition(":")
    return cells(store, row, Read(family, (qualifier,), **kw)).get(column, [])  # type: ignore[arg-type]


def values(row_cells: RowCells) -> dict[str, list[bytes]]:
    """*row_cells* without timestamps (for cells a ``check_and_set`` wrote)."""
    return {column: [v for _, v in got] for column, got in row_cells.items()}


# ---- the store object --------------------------------------------------------------


def test_is_a_store(store: Store, store_url: str) -> None:
    assert isinstance(store, Store)
    assert isinstance(store.atomic_row_cas, bool)
    assert store.url.split("://")[0] == store_url.split("://")[0]


# ---- tables ------------------------------------------------------------------------


def test_tables_are_created_idempotently_listed_sorted_and_dropped(store: Store) -> None:
    assert store.list_tables() == [T]
    store.create_table("__percolator", {"m": 1})
    store.create_table("__percolator", {"m": 1})  # idempotent
    store.create_table("b-c.d", {"d": 0})
    store.create_table("a_b", {"d": 0})
    assert store.list_tables() == ["__percolator", "a_b", "b-c.d", T]
    store.mutate_rows("b-c.d", [Mutation(b"r", puts=[("d:x", 1, b"1")])])
    store.create_table("b-c.d", {"d": 0})  # creating it again keeps its cells
    assert store.read_rows("b-c.d", [b"r"], [Read("d")]) == {b"r": {"d:x": [(1, b"1")]}}
    store.drop_table("b-c.d")
    store.drop_table("b-c.d")  # dropping a missing table is not an error
    store.drop_table("never-created")
    assert store.list_tables() == ["__percolator", "a_b", T]


def test_a_dropped_table_loses_its_cells(store: Store) -> None:
    store.create_table("gone", {"d": 0})
    store.mutate_rows("gone", [Mutation(b"r", puts=[("d:x", 1, b"1")])])
    store.drop_table("gone")
    with pytest.raises(UnknownTableError):
        store.read_rows("gone", [b"r"], [Read("d")])
    store.create_table("gone", {"d": 0})
    assert store.read_rows("gone", [b"r"], [Read("d")]) == {}


def test_family_with_one_version_keeps_one_through_check_and_set(store: Store) -> None:
    """What the protocol relies on: the lock family (one version) holds one lock."""
    assert store.check_and_set(T, b"r", "l:c", None, b"a")
    assert store.check_and_set(T, b"r", "l:c", b"a", b"b")
    assert store.check_and_set(T, b"r", "l:c", b"b", b"c")
    assert values(cells(store, b"r", Read("l", versions=None))) == {"l:c": [b"c"]}


def test_family_with_one_version_keeps_the_latest(store: Store, backend: str) -> None:
    if backend == "bigtable":
        pytest.xfail(
            "Bigtable garbage-collects versions beyond a family's max_num_versions lazily, "
            "in the background: reads may return them until it has run"
        )
    store.mutate_rows(T, [Mutation(b"r", puts=[("l:c", 1, b"a"), ("l:c", 2, b"b")])])
    store.mutate_rows(T, [Mutation(b"r", puts=[("l:c", 3, b"c")])])
    assert versions(store, b"r", "l:c", versions=None) == [(3, b"c")]
    store.mutate_rows(T, [Mutation(b"r", puts=[("l:c", 2, b"older")])])  # not the latest
    assert versions(store, b"r", "l:c", versions=None) == [(3, b"c")]


# ---- read_rows ---------------------------------------------------------------------


def test_latest_version_by_default_newest_first_otherwise(store: Store) -> None:
    put(store, b"r", "d:c", [3, 1, 5, 2, 4])
    assert versions(store, b"r", "d:c") == [(5, b"v5")]
    assert versions(store, b"r", "d:c", versions=None) == [
        (5, b"v5"),
        (4, b"v4"),
        (3, b"v3"),
        (2, b"v2"),
        (1, b"v1"),
    ]


def test_max_ts_and_min_ts_are_inclusive(store: Store) -> None:
    put(store, b"r", "d:c", [1, 3, 5, 7, 9])

    def stamps(**kw: object) -> list[int]:
        return [ts for ts, _ in versions(store, b"r", "d:c", **kw)]

    assert stamps(max_ts=7) == [7]
    assert stamps(max_ts=6) == [5]
    assert stamps(max_ts=7, versions=None) == [7, 5, 3, 1]
    assert stamps(min_ts=3, versions=None) == [9, 7, 5, 3]
    assert stamps(min_ts=4, versions=None) == [9, 7, 5]
    assert stamps(min_ts=3, max_ts=7, versions=None) == [7, 5, 3]
    assert stamps(min_ts=3, max_ts=7) == [7]
    assert stamps(min_ts=5, max_ts=5, versions=None) == [5]
    assert stamps(min_ts=9, versions=None) == [9]
    assert stamps(min_ts=10) == []
    assert stamps(max_ts=0) == []
    assert stamps(min_ts=6, max_ts=4, versions=None) == []


def test_timestamp_zero_and_large_timestamps(store: Store) -> None:
    big = 2**40  # a real oracle timestamp is about this size
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 0, b"zero"), ("d:c", big, b"big")])])
    assert versions(store, b"r", "d:c", versions=None) == [(big, b"big"), (0, b"zero")]
    assert versions(store, b"r", "d:c", max_ts=big - 1) == [(0, b"zero")]
    assert versions(store, b"r", "d:c", max_ts=0) == [(0, b"zero")]
    assert versions(store, b"r", "d:c", min_ts=big) == [(big, b"big")]
    # a delete at or below 0 is one of the version at 0 (0 does not mean "every version")
    store.mutate_rows(T, [Mutation(b"r", deletes=[("d:c", 0)])])
    assert versions(store, b"r", "d:c", versions=None) == [(big, b"big")]


def test_versions_limit(store: Store) -> None:
    put(store, b"r", "d:c", [1, 2, 3, 4, 5])

    def stamps(**kw: object) -> list[int]:
        return [ts for ts, _ in versions(store, b"r", "d:c", **kw)]

    assert stamps(versions=1) == [5]
    assert stamps(versions=2) == [5, 4]
    assert stamps(versions=5) == [5, 4, 3, 2, 1]
    assert stamps(versions=50) == [5, 4, 3, 2, 1]
    assert stamps(max_ts=4, versions=2) == [4, 3]
    assert stamps(min_ts=2, max_ts=4, versions=10) == [4, 3, 2]


def test_whole_family_when_qualifiers_is_none(store: Store) -> None:
    put(store, b"r", "d:a", [1, 2, 3])
    put(store, b"r", "d:b", [2, 4])
    put(store, b"r", "d:doc:with:colons", [5])
    put(store, b"r", "w:a", [9])
    assert cells(store, b"r", Read("d", None)) == {
        "d:a": [(3, b"v3")],
        "d:b": [(4, b"v4")],
        "d:doc:with:colons": [(5, b"v5")],
    }
    assert cells(store, b"r", Read("d", None, max_ts=3, versions=None)) == {
        "d:a": [(3, b"v3"), (2, b"v2"), (1, b"v1")],
        "d:b": [(2, b"v2")],
    }
    assert cells(store, b"r", Read("d", None, min_ts=4, versions=None)) == {
        "d:b": [(4, b"v4")],
        "d:doc:with:colons": [(5, b"v5")],
    }


def test_qualifiers_select_columns_and_may_contain_colons(store: Store) -> None:
    put(store, b"r", "d:doc:contents", [1])
    put(store, b"r", "d:doc", [2])
    put(store, b"r", "d:other", [3])
    got = cells(store, b"r", Read("d", ("doc:contents", "doc", "missing")))
    assert got == {"d:doc:contents": [(1, b"v1")], "d:doc": [(2, b"v2")]}
    assert cells(store, b"r", Read("d", ("doc",))) == {"d:doc": [(2, b"v2")]}


def test_several_reads_with_their_own_bounds_in_one_call(store: Store) -> None:
    """The shape of a transactional get: the lock's latest, the newest write record
    at or below start_ts, the data at or below it, and the whole notify family."""
    put(store, b"r", "l:c", [30])
    put(store, b"r", "w:c", [12, 22])
    put(store, b"r", "d:c", [10, 20])
    put(store, b"r", "n:c", [22, 23])
    reads = [
        Read("l", ("c",)),
        Read("w", ("c",), max_ts=21),
        Read("d", ("c",), max_ts=15),
        Read("n", None, versions=None),
    ]
    assert cells(store, b"r", *reads) == {
        "l:c": [(30, b"v30")],
        "w:c": [(12, b"v12")],
        "d:c": [(10, b"v10")],
        "n:c": [(23, b"v23"), (22, b"v22")],
    }
    newer = store.read_rows(T, [b"r"], [Read("w", ("c",), min_ts=13, versions=None)])
    assert newer == {b"r": {"w:c": [(22, b"v22")]}}


def test_two_reads_of_one_cell_bring_what_each_selects(store: Store) -> None:
    """The read of a transaction that keeps what its prewrite would read
    (``Snapshot._reads`` where the prewrite compare-and-sets from it): a cell's newest
    version at or below start_ts and its newest after it, both, newest first, on one
    row, on several and in a scan; a version both reads select comes once. (The
    embedded store's one-row read gave only the last read's version.)"""
    put(store, b"r", "w:c", [12, 22])
    put(store, b"s", "w:c", [14])
    at_or_below, after = Read("w", ("c",), max_ts=15), Read("w", ("c",), min_ts=16)
    both = {"w:c": [(22, b"v22"), (12, b"v12")]}
    assert cells(store, b"r", at_or_below, after) == both
    assert cells(store, b"r", after, at_or_below) == both
    assert store.read_rows(T, [b"r", b"s"], [at_or_below, after]) == {
        b"r": both, b"s": {"w:c": [(14, b"v14")]}}
    assert dict(store.scan(T, None, None, [at_or_below, after])) == {
        b"r": both, b"s": {"w:c": [(14, b"v14")]}}
    newest = Read("w", ("c",))
    assert cells(store, b"s", newest, at_or_below) == {"w:c": [(14, b"v14")]}
    assert store.read_rows(T, [b"r", b"s"], [newest, Read("w", ("c",), max_ts=30)]) == {
        b"r": {"w:c": [(22, b"v22")]}, b"s": {"w:c": [(14, b"v14")]}}


def test_skip_tag_leaves_out_selected_versions_starting_with_it(store: Store) -> None:
    """How a transactional read leaves out FREE locks (on the server, where it can)."""
    store.mutate_rows(T, [
        Mutation(b"r", puts=[("l:free", 0, b"F-token"), ("l:held", 0, b"L-lock"),
                             ("l:empty", 0, b""), ("l:ff", 0, b"\xff")]),
        Mutation(b"r", puts=[("w:c", 1, b"Vold"), ("w:c", 2, b"Fnew"), ("w:c", 3, b"Gnewer")]),
        Mutation(b"s", puts=[("l:free", 0, b"F-only")]),
    ])
    got = cells(store, b"r", Read("l", ("free", "held", "empty", "ff", "none"), skip_tag=b"F"))
    assert got == {"l:held": [(0, b"L-lock")], "l:empty": [(0, b"")], "l:ff": [(0, b"\xff")]}
    assert cells(store, b"r", Read("l", None, skip_tag=b"\xff")) == {
        "l:free": [(0, b"F-token")], "l:held": [(0, b"L-lock")], "l:empty": [(0, b"")],
    }
    # the version limit comes first: a skipped newest version is not replaced by an older one
    assert cells(store, b"r", Read("w", ("c",), max_ts=2, skip_tag=b"F")) == {}
    assert cells(store, b"r", Read("w", ("c",), max_ts=2, versions=None, skip_tag=b"F")) == {
        "w:c": [(1, b"Vold")]
    }
    assert cells(store, b"r", Read("w", ("c",), skip_tag=b"F")) == {"w:c": [(3, b"Gnewer")]}
    # other reads of the same call are not filtered; a row left with nothing is omitted
    reads = [Read("l", ("free",), skip_tag=b"F"), Read("w", ("c",), max_ts=2)]
    assert store.read_rows(T, [b"r", b"s"], reads) == {b"r": {"w:c": [(2, b"Fnew")]}}
    assert dict(store.scan(T, None, None, reads)) == {b"r": {"w:c": [(2, b"Fnew")]}}
    assert dict(store.scan(T, None, None, [Read("l", None, skip_tag=b"L")])) == {
        b"r": {"l:free": [(0, b"F-token")], "l:empty": [(0, b"")], "l:ff": [(0, b"\xff")]},
        b"s": {"l:free": [(0, b"F-only")]},
    }


def test_one_row_read_of_newest_cells_and_every_version_of_one_more(store: Store) -> None:
    """An observer run's first read (``ObserverRun.get_row_notified``): the newest
    version of some cells (locks without the FREE ones, write records at or below the
    snapshot) and every version of one notify cell, in one call, as separate reads
    would return them."""
    store.mutate_rows(T, [Mutation(b"r", puts=[
        ("w:c", 1, b"old"), ("w:c", 3, b"new"), ("w:ack", 2, b"a"), ("l:c", 0, b"F-free"),
        ("l:ack", 0, b"L-held"), ("n:c", 2, b"1"), ("n:c", 5, b"w"), ("n:other", 4, b"1")])])
    locks = Read("l", ("c", "ack"), skip_tag=b"F")
    writes = Read("w", ("c", "ack", "none"), max_ts=2)
    notify = Read("n", ("c",), versions=None)
    assert cells(store, b"r", locks, writes, notify) == {
        "l:ack": [(0, b"L-held")], "w:c": [(1, b"old")], "w:ack": [(2, b"a")],
        "n:c": [(5, b"w"), (2, b"1")]}
    assert cells(store, b"r", writes, Read("n", ("c",), max_ts=4, versions=None)) == {
        "w:c": [(1, b"old")], "w:ack": [(2, b"a")], "n:c": [(2, b"1")]}
    assert cells(store, b"r", Read("w", ("none",)), notify) == {"n:c": [(5, b"w"), (2, b"1")]}
    assert cells(store, b"r", Read("w", ("c",)), Read("n", ("none",), versions=None)) == {
        "w:c": [(3, b"new")]}
    assert store.read_rows(T, [b"q"], [writes, notify]) == {}


def test_a_scan_skipping_tagged_versions_pages_over_the_rows_left(store: Store) -> None:
    """Rows whose every cell is skipped take no room in a page; rows that another
    Read of the scan selects still come, with the skipped cells left out."""
    def cells_of(i: int) -> list[tuple[str, int, bytes]]:
        lock = [("l:c", 1, b"L-held" if i % 7 == 3 else b"F-free")]
        return lock + ([("d:c", 2, b"v%d" % i)] if i % 5 == 0 else [])

    store.mutate_rows(T, [Mutation(b"r%03d" % i, cells_of(i)) for i in range(60)])
    held = list(store.scan(T, None, None, [Read("l", skip_tag=b"F")], batch_size=4))
    assert held == [(b"r%03d" % i, {"l:c": [(1, b"L-held")]}) for i in range(60) if i % 7 == 3]
    mixed = dict(store.scan(T, b"r010", b"r050", [Read("l", skip_tag=b"F"), Read("d")],
                            batch_size=3))
    expected: dict[bytes, RowCells] = {}
    for i in range(10, 50):
        row = {c: [(ts, v)] for c, ts, v in cells_of(i) if not v.startswith(b"F")}
        if row:
            expected[b"r%03d" % i] = row
    assert mixed == expected


@pytest.mark.parametrize("tag", [b"", b"FF", "F"])
def test_skip_tag_of_other_than_one_byte_is_invalid(store: Store, tag: object) -> None:
    with pytest.raises(InvalidArgument, match="skip_tag"):
        store.read_rows(T, [b"r"], [Read("l", ("c",), skip_tag=tag)])  # type: ignore[arg-type]


def test_several_rows_in_one_call_and_rows_without_cells_omitted(store: Store) -> None:
    store.mutate_rows(
        T,
        [
            Mutation(b"a", puts=[("d:x", 1, b"a1")]),
            Mutation(b"b", puts=[("w:x", 1, b"b1")]),  # nothing in "d"
            Mutation(b"c", puts=[("d:x", 2, b"c2"), ("d:y", 3, b"c3")]),
            Mutation(b"e", puts=[("d:x", 9, b"e9")]),  # nothing at or below max_ts
        ],
    )
    got = store.read_rows(T, [b"c", b"a", b"b", b"zz", b"e"], [Read("d", ("x",), max_ts=5)])
    assert got == {b"a": {"d:x": [(1, b"a1")]}, b"c": {"d:x": [(2, b"c2")]}}
    assert store.read_rows(T, [b"a", b"a"], [Read("d")]) == {b"a": {"d:x": [(1, b"a1")]}}
    assert store.read_rows(T, [b"nope"], [Read("d"), Read("w")]) == {}
    assert store.read_rows(T, [], [Read("d")]) == {}


def test_many_rows_in_one_call(store: Store) -> None:
    rows = [b"row%04d" % i for i in range(300)]
    store.mutate_rows(T, [Mutation(r, puts=[("d:c", 1, r)]) for r in rows[::2]])
    got = store.read_rows(T, rows, [Read("d")])
    assert got == {r: {"d:c": [(1, r)]} for r in rows[::2]}


def test_values_binary_empty_and_large(store: Store) -> None:
    large = bytes(range(256)) * 4096  # 1 MiB
    puts = [("d:empty", 1, b""), ("d:bin", 1, b"\x00\xff\n"), ("d:big", 1, large)]
    store.mutate_rows(T, [Mutation(b"r", puts=puts)])
    assert cells(store, b"r", Read("d")) == {
        "d:empty": [(1, b"")],
        "d:bin": [(1, b"\x00\xff\n")],
        "d:big": [(1, large)],
    }


# ---- mutate_rows -------------------------------------------------------------------


def test_puts_in_several_rows_and_families(store: Store) -> None:
    store.mutate_rows(
        T,
        [
            Mutation(b"a", puts=[("d:x", 1, b"1"), ("w:x", 2, b"2"), ("d:x", 3, b"3")]),
            Mutation(b"b", puts=[("d:x", 1, b"b1")]),
        ],
    )
    got = store.read_rows(T, [b"a", b"b"], [Read("d", None, versions=None), Read("w", None)])
    assert got == {
        b"a": {"d:x": [(3, b"3"), (1, b"1")], "w:x": [(2, b"2")]},
        b"b": {"d:x": [(1, b"b1")]},
    }
    store.mutate_rows(T, [])  # nothing to do


def test_a_put_at_an_existing_timestamp_replaces_the_value(store: Store) -> None:
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 5, b"old")])])
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 5, b"new")])])
    assert versions(store, b"r", "d:c", versions=None) == [(5, b"new")]


def test_deletes_remove_versions_at_or_below(store: Store) -> None:
    put(store, b"r", "n:c", [1, 2, 3])
    put(store, b"r", "n:other", [1])
    put(store, b"r", "d:c", [1])
    store.mutate_rows(T, [Mutation(b"r", deletes=[("n:c", 2)])])
    assert cells(store, b"r", Read("n", None, versions=None)) == {
        "n:c": [(3, b"v3")],
        "n:other": [(1, b"v1")],
    }
    store.mutate_rows(T, [Mutation(b"r", deletes=[("n:c", 3), ("d:c", 1), ("d:never", 9)])])
    assert cells(store, b"r", Read("n", None), Read("d", None)) == {"n:other": [(1, b"v1")]}
    store.mutate_rows(T, [Mutation(b"absent", deletes=[("d:c", 5)])])
    assert store.read_rows(T, [b"absent"], [Read("d")]) == {}


def test_deletes_apply_before_puts(store: Store) -> None:
    put(store, b"r", "d:c", [1, 2, 3])
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 4, b"new4")], deletes=[("d:c", 3)])])
    assert versions(store, b"r", "d:c", versions=None) == [(4, b"new4")]


def test_a_put_at_the_timestamp_of_a_delete_in_the_same_mutation_survives(
    store: Store, backend: str, request: pytest.FixtureRequest
) -> None:
    if backend.startswith("hbase"):
        request.applymarker(pytest.mark.xfail(reason=HBASE_TOMBSTONES, strict=True))
    put(store, b"r", "d:c", [1, 2, 3])
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 3, b"new3")], deletes=[("d:c", 3)])])
    assert versions(store, b"r", "d:c", versions=None) == [(3, b"new3")]
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 1, b"new1")], deletes=[("d:c", 5)])])
    assert versions(store, b"r", "d:c", versions=None) == [(1, b"new1")]


def test_several_mutations_apply_in_order(
    store: Store, backend: str, request: pytest.FixtureRequest
) -> None:
    if backend.startswith("hbase"):
        request.applymarker(pytest.mark.xfail(reason=HBASE_TOMBSTONES, strict=True))
    store.mutate_rows(
        T,
        [
            Mutation(b"r", puts=[("d:c", 9, b"9")]),
            Mutation(b"r", deletes=[("d:c", 9)]),
            Mutation(b"s", puts=[("d:c", 1, b"s")]),
            Mutation(b"r", puts=[("d:c", 8, b"8")]),
        ],
    )
    assert store.read_rows(T, [b"r", b"s"], [Read("d", ("c",), versions=None)]) == {
        b"r": {"d:c": [(8, b"8")]},
        b"s": {"d:c": [(1, b"s")]},
    }


def test_mutations_keep_their_order_within_each_family_when_families_interleave(
    store: Store, backend: str, request: pytest.FixtureRequest
) -> None:
    """A batch of many rows' puts and deletes in two families (a group commit's shape):
    each family's puts and deletes apply in the batch's order."""
    if backend.startswith("hbase"):
        request.applymarker(pytest.mark.xfail(reason=HBASE_TOMBSTONES, strict=True))
    put(store, b"r", "n:c", [1, 2])
    batch = []
    for row in (b"r", b"s"):
        batch += [
            Mutation(row, puts=[("d:c", 5, b"d5"), ("n:c", 5, b"n5")]),
            Mutation(row, deletes=[("n:c", 5)]),
            Mutation(row, puts=[("n:c", 4, b"n4")], deletes=[("d:c", 6)]),
            Mutation(row, puts=[("d:c", 3, b"d3")]),
        ]
    store.mutate_rows(T, batch)
    expected = {"d:c": [(3, b"d3")], "n:c": [(4, b"n4")]}
    assert store.read_rows(T, [b"r", b"s"], [Read("d", ("c",), versions=None),
                                             Read("n", ("c",), versions=None)]) == {
        b"r": expected, b"s": expected}


def test_a_mutation_is_atomic_within_its_row(
    store: Store, backend: str, request: pytest.FixtureRequest
) -> None:
    """Readers never see part of a row's mutation: every cell of the row changes
    together, or none does."""
    if backend == "hbase-thrift1":  # a race: the torn read is likely, not certain
        request.applymarker(pytest.mark.xfail(reason=HBASE_SPLIT_MUTATIONS, strict=False))
    columns = [f"d:c{i}" for i in range(8)]
    store.mutate_rows(T, [Mutation(b"r", puts=[(c, 1, b"0") for c in columns])])
    stop = threading.Event()
    torn: list[dict[str, list[bytes]]] = []
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                got = values(cells(store, b"r", Read("d")))
                if len({v[0] for v in got.values()}) != 1 or len(got) != len(columns):
                    torn.append(got)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for ts in range(2, 40):
            value = b"%d" % ts
            store.mutate_rows(
                T,
                [Mutation(b"r", puts=[(c, ts, value) for c in columns], deletes=[(columns[0], 1)])],
            )
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert torn == []


# ---- check_and_set -----------------------------------------------------------------


def test_check_and_set_absent_match_and_mismatch(store: Store) -> None:
    lock = "l:doc:contents"
    assert store.check_and_set(T, b"r", lock, None, b"L1")  # absent -> set
    assert not store.check_and_set(T, b"r", lock, None, b"L2")  # present: not absent
    assert not store.check_and_set(T, b"r", lock, b"L", b"L2")  # a prefix is not equal
    assert not store.check_and_set(T, b"r", lock, b"L1x", b"L2")
    assert values(cells(store, b"r", Read("l"))) == {lock: [b"L1"]}
    assert store.check_and_set(T, b"r", lock, b"L1", b"L2")  # match -> set
    assert values(cells(store, b"r", Read("l", versions=None))) == {lock: [b"L2"]}
    # another column of the row, and the same column of another row, are independent
    assert store.check_and_set(T, b"r", "l:doc:other", None, b"O")
    assert not store.check_and_set(T, b"r2", lock, b"L2", b"X")
    assert store.check_and_set(T, b"r2", lock, None, b"X")
    assert values(cells(store, b"r", Read("l"))) == {lock: [b"L2"], "l:doc:other": [b"O"]}


def test_check_and_set_after_the_cell_is_deleted_sees_it_absent(
    store: Store, backend: str, request: pytest.FixtureRequest
) -> None:
    if backend.startswith("hbase"):  # a race: the new cell gets server time, masked in the same ms
        request.applymarker(pytest.mark.xfail(reason=HBASE_TOMBSTONES, strict=False))
    assert store.check_and_set(T, b"r", "l:c", None, b"L")
    [(ts, _)] = cells(store, b"r", Read("l"))["l:c"]
    store.mutate_rows(T, [Mutation(b"r", deletes=[("l:c", ts)])])
    assert store.read_rows(T, [b"r"], [Read("l")]) == {}
    assert not store.check_and_set(T, b"r", "l:c", b"L", b"M")
    assert store.check_and_set(T, b"r", "l:c", None, b"M")
    assert values(cells(store, b"r", Read("l"))) == {"l:c": [b"M"]}


def test_check_and_set_applies_its_puts_on_success(store: Store) -> None:
    puts = [("d:c", 5, b"data@5"), ("w:c", 6, b"PUT@5"), ("n:c", 6, b"")]
    assert store.check_and_set(T, b"r", "l:c", None, b"L", puts=puts)
    got = cells(store, b"r", Read("d"), Read("w"), Read("n"), Read("l"))
    assert got.pop("l:c")[0][1] == b"L"
    assert got == {"d:c": [(5, b"data@5")], "w:c": [(6, b"PUT@5")], "n:c": [(6, b"")]}


def test_check_and_set_puts_on_failure_follow_atomic_row_cas(store: Store) -> None:
    assert store.check_and_set(T, b"r", "l:c", None, b"L1", puts=[("d:c", 7, b"data")])
    assert not store.check_and_set(T, b"r", "l:c", None, b"L2", puts=[("d:c", 8, b"more")])
    assert not store.check_and_set(T, b"r", "l:c", b"x", b"L3", puts=[("w:c", 9, b"w")])
    got = cells(store, b"r", Read("d", versions=None), Read("w"), Read("l"))
    assert values({"l:c": got.pop("l:c")}) == {"l:c": [b"L1"]}
    if store.atomic_row_cas:  # the puts are part of the atomic step: not applied
        assert got == {"d:c": [(7, b"data")]}
    else:  # the puts are written first, unconditionally
        assert got == {"d:c": [(8, b"more"), (7, b"data")], "w:c": [(9, b"w")]}


def test_check_and_set_puts_at_timestamp_zero_are_written_at_zero(store: Store) -> None:
    """0 is a timestamp like any other for the puts of another family (HBase over
    Thrift2 once wrote them at server time, as it writes the compared cell)."""
    puts = [("d:c", 0, b"data@0"), ("w:c", 0, b"PUT@0"), ("d:c", 3, b"data@3")]
    assert store.check_and_set(T, b"r", "l:c", None, b"L", puts=puts)
    assert cells(store, b"r", Read("d", versions=None), Read("w")) == {
        "d:c": [(3, b"data@3"), (0, b"data@0")], "w:c": [(0, b"PUT@0")]}


def test_check_and_set_frees_another_lock_of_its_row_with_a_put_at_zero(
    store: Store,
) -> None:
    """What the commit point relies on where ``atomic_row_cas`` holds: a put at 0 in
    the compared cell's family (a lock of the row, one version) becomes that cell's
    latest value, even over a value a compare-and-set wrote (at server time on HBase)."""
    if not store.atomic_row_cas:
        pytest.skip("without atomic_row_cas the protocol frees each lock with its own "
                    "compare-and-set, never with a put")
    assert store.check_and_set(T, b"r", "l:primary", None, b"LOCKED-p")
    assert store.check_and_set(T, b"r", "l:secondary", None, b"LOCKED-s")
    assert store.check_and_set(T, b"r", "l:primary", b"LOCKED-p", b"FREE-p",
                               puts=[("l:secondary", 0, b"FREE-s")])
    assert values(cells(store, b"r", Read("l", versions=None))) == {
        "l:primary": [b"FREE-p"], "l:secondary": [b"FREE-s"]}


def test_concurrent_check_and_set_has_exactly_one_winner(store: Store) -> None:
    contenders = 8
    results: dict[int, bool] = {}

    def contend(i: int) -> None:
        results[i] = store.check_and_set(
            T, b"hot", "l:c", None, b"owner%d" % i, puts=[("d:c", i, b"x%d" % i)]
        )

    run_concurrently(contend, contenders)
    winners = [i for i, won in results.items() if won]
    assert len(results) == contenders and len(winners) == 1
    [winner] = winners
    assert values(cells(store, b"hot", Read("l"))) == {"l:c": [b"owner%d" % winner]}
    if store.atomic_row_cas:  # only the winner's puts were applied
        assert versions(store, b"hot", "d:c", versions=None) == [(winner, b"x%d" % winner)]


def test_check_and_set_chain_under_contention_loses_no_update(store: Store) -> None:
    """A counter advanced only by compare-and-set from several threads counts every
    successful increment exactly once."""
    assert store.check_and_set(T, b"ctr", "l:n", None, b"0")
    increments = 15

    def bump(_: int) -> None:
        done = 0
        while done < increments:
            [(_, current)] = cells(store, b"ctr", Read("l"))["l:n"]
            if store.check_and_set(T, b"ctr", "l:n", current, b"%d" % (int(current) + 1)):
                done += 1

    run_concurrently(bump, 4)
    assert values(cells(store, b"ctr", Read("l"))) == {"l:n": [b"%d" % (4 * increments)]}


# ---- optional capabilities (percolator/_store.py): increment, set_unless ------------


def capability(store: Store, name: str) -> Callable[..., Any]:
    """The optional method *name* of *store*; the test is skipped for a backend
    without it (callers fall back to the contract methods there)."""
    method = getattr(store, name, None)
    if method is None:
        pytest.skip(f"{type(store).__name__} does not offer the optional {name}()")
    return method  # type: ignore[no-any-return]


def long_(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


def test_increment_counts_from_absent_and_returns_the_new_value(store: Store) -> None:
    increment = capability(store, "increment")
    assert isinstance(store, Incrementing)
    assert increment(T, b"r", "l:n", 5) == 5
    assert increment(T, b"r", "l:n", 1) == 6
    assert increment(T, b"r", "l:n", -10) == -4
    assert increment(T, b"r", "l:n", 0) == -4
    assert values(cells(store, b"r", Read("l"))) == {"l:n": [long_(-4)]}
    assert increment(T, b"r2", "l:n", 1) == 1  # another row: another counter
    assert increment(T, b"r", "d:n", 7) == 7  # a family keeping every version
    assert increment(T, b"r", "d:n", 7) == 14
    assert cells(store, b"r", Read("d"))["d:n"][0][1] == long_(14)


def test_increment_and_check_and_set_share_the_counter(store: Store) -> None:
    """What StoreTimestamps relies on: clients drawing timestamps with either method
    advance the same counter."""
    increment = capability(store, "increment")
    assert store.check_and_set(T, b"r", "l:n", None, long_(100))
    assert increment(T, b"r", "l:n", 2) == 102
    assert not store.check_and_set(T, b"r", "l:n", long_(100), long_(300))
    assert store.check_and_set(T, b"r", "l:n", long_(102), long_(200))
    assert increment(T, b"r", "l:n", 1) == 201
    assert values(cells(store, b"r", Read("l"))) == {"l:n": [long_(201)]}


def test_increment_of_a_cell_that_is_not_8_bytes_is_invalid(store: Store) -> None:
    increment = capability(store, "increment")
    put(store, b"r", "d:c", [1])  # b"v1"
    with pytest.raises(InvalidArgument):
        increment(T, b"r", "d:c", 1)
    assert versions(store, b"r", "d:c", versions=None) == [(1, b"v1")]
    with pytest.raises(UnknownTableError):
        increment("missing", b"r", "l:n", 1)


@pytest.mark.parametrize("amount", [2**63, -(2**63) - 1, True, 1.0, "1"])
def test_increment_by_an_amount_that_is_no_64_bit_integer_is_invalid(
    store: Store, amount: object
) -> None:
    increment = capability(store, "increment")
    assert increment(T, b"r", "l:n", 5) == 5
    with pytest.raises(InvalidArgument, match="64-bit integer"):
        increment(T, b"r", "l:n", amount)
    assert increment(T, b"r", "l:n", 0) == 5  # nothing was added


def test_concurrent_increments_lose_nothing(store: Store) -> None:
    increment = capability(store, "increment")
    got: list[int] = []

    def bump(_: int) -> None:
        for _ in range(25):
            got.append(increment(T, b"ctr", "l:n", 1))

    run_concurrently(bump, 4)
    assert sorted(got) == list(range(1, 101))


def test_set_unless_applies_only_when_no_guard_matches(store: Store) -> None:
    set_unless = capability(store, "set_unless")
    assert isinstance(store, GuardedSet)
    put(store, b"r", "w:c", [5, 9])  # values b"v5", b"v9"

    def applies(*guards: Guard) -> bool:
        return bool(set_unless(T, b"r", "l:c", b"L", list(guards)))

    assert applies()  # no guard
    # timestamps: [min_ts, max_ts], both inclusive
    assert applies(Guard("w:c", min_ts=10))
    assert not applies(Guard("w:c", min_ts=9))
    assert not applies(Guard("w:c", min_ts=6, max_ts=9))
    assert applies(Guard("w:c", min_ts=6, max_ts=8))
    assert not applies(Guard("w:c", min_ts=5, max_ts=5))
    assert applies(Guard("w:c", max_ts=4))
    # values: [value_from, value_to)
    assert not applies(Guard("w:c", value_from=b"v5", value_to=b"v6"))
    assert applies(Guard("w:c", value_from=b"v6", value_to=b"v9"))
    assert not applies(Guard("w:c", value_from=b"v9"))
    assert applies(Guard("w:c", value_to=b"v5"))
    assert applies(Guard("w:c", min_ts=9, value_to=b"v9"))
    # latest: only the newest version inside the timestamp range is tested
    assert applies(Guard("w:c", latest=True, value_to=b"v9"))
    assert not applies(Guard("w:c", value_to=b"v9"))
    assert not applies(Guard("w:c", latest=True, max_ts=8, value_to=b"v9"))
    # one matching guard is enough; guards on other columns or rows see nothing
    assert not applies(Guard("w:other"), Guard("w:c", min_ts=9))
    assert applies(Guard("w:other"), Guard("d:c"), Guard("w:c", min_ts=10))
    put(store, b"elsewhere", "w:c", [20])
    assert applies(Guard("w:c", min_ts=10))
    # a guard on the cell being set sees its current value
    assert not applies(Guard("l:c", value_from=b"L", value_to=b"M"))
    assert set_unless(T, b"r", "l:c", b"F1", [Guard("l:c", value_from=b"M")])
    assert not set_unless(T, b"r", "l:c", b"F2", [Guard("l:c", value_to=b"G")])
    assert values(cells(store, b"r", Read("l", versions=None))) == {"l:c": [b"F1"]}


def test_set_unless_applies_its_puts_only_with_the_set(store: Store) -> None:
    set_unless = capability(store, "set_unless")
    put(store, b"r", "w:c", [9])
    assert not set_unless(T, b"r", "l:c", b"L1", [Guard("w:c")], [("d:c", 3, b"refused")])
    assert store.read_rows(T, [b"r"], [Read("l"), Read("d")]) == {}
    assert set_unless(T, b"r", "l:c", b"L2", [Guard("w:c", min_ts=10)], [("d:c", 4, b"ok")])
    got = cells(store, b"r", Read("l"), Read("d", versions=None))
    assert values({"l:c": got.pop("l:c")}) == {"l:c": [b"L2"]}
    assert got == {"d:c": [(4, b"ok")]}


def test_concurrent_set_unless_has_exactly_one_winner(store: Store) -> None:
    set_unless = capability(store, "set_unless")
    contenders = 8
    results: dict[int, bool] = {}

    def contend(i: int) -> None:
        results[i] = set_unless(
            T, b"hot", "l:c", b"owner%d" % i, [Guard("l:c")], [("d:c", i, b"x%d" % i)]
        )

    run_concurrently(contend, contenders)
    [winner] = [i for i, won in results.items() if won]
    assert len(results) == contenders
    assert values(cells(store, b"hot", Read("l"))) == {"l:c": [b"owner%d" % winner]}
    assert versions(store, b"hot", "d:c", versions=None) == [(winner, b"x%d" % winner)]


# ---- scan --------------------------------------------------------------------------


def test_scan_start_inclusive_stop_exclusive_and_open_bounds(store: Store) -> None:
    rows = [b"k%02d" % i for i in range(20)]
    store.mutate_rows(T, [Mutation(r, puts=[("d:c", 1, r)]) for r in rows])

    def scanned(start: bytes | None, stop: bytes | None) -> list[bytes]:
        return [r for r, _ in store.scan(T, start, stop, [Read("d")])]

    assert scanned(b"k05", b"k10") == rows[5:10]
    assert scanned(b"k045", b"k095") == rows[5:10]
    assert scanned(None, b"k03") == rows[:3]
    assert scanned(b"k17", None) == rows[17:]
    assert scanned(None, None) == rows
    assert scanned(b"k05", b"k05") == []
    assert scanned(b"k06", b"k05") == []
    assert scanned(b"z", None) == []
    assert list(store.scan(T, b"k03", b"k04", [Read("d")])) == [(b"k03", {"d:c": [(1, b"k03")]})]


def test_scan_of_a_sparse_family_yields_only_rows_with_cells(store: Store) -> None:
    rows = [b"k%03d" % i for i in range(60)]
    mutations = [Mutation(r, puts=[("d:c", 1, r)]) for r in rows]
    mutations += [Mutation(r, puts=[("n:doc:c", 2, b"")]) for r in rows[::7]]
    store.mutate_rows(T, mutations)
    for batch_size in (1, 4, 7, 1000):
        got = list(store.scan(T, None, None, [Read("n")], batch_size=batch_size))
        assert got == [(r, {"n:doc:c": [(2, b"")]}) for r in rows[::7]], batch_size
    assert [r for r, _ in store.scan(T, b"k010", b"k020", [Read("n")])] == [b"k014"]
    assert list(store.scan(T, None, None, [Read("w")])) == []
    both = dict(store.scan(T, b"k007", b"k008", [Read("d"), Read("n")]))
    assert both == {b"k007": {"d:c": [(1, b"k007")], "n:doc:c": [(2, b"")]}}


def test_scan_with_batches_smaller_than_the_result(store: Store) -> None:
    rows = [b"k%03d" % i for i in range(25)]
    store.mutate_rows(T, [Mutation(r, puts=[("d:c", 1, r)]) for r in rows])
    for batch_size in (1, 2, 3, 10, 24, 25, 26):
        got = list(store.scan(T, b"k002", b"k023", [Read("d")], batch_size=batch_size))
        assert got == [(r, {"d:c": [(1, r)]}) for r in rows[2:23]], batch_size


def test_scan_honours_bounds_and_versions_of_each_read(store: Store) -> None:
    put(store, b"a", "d:x", [1, 5])
    put(store, b"b", "d:x", [6])  # nothing at or below max_ts: row not yielded
    put(store, b"c", "w:x", [2, 3, 4])
    put(store, b"d", "d:x", [1, 2, 3])
    reads = [Read("d", None, max_ts=4, versions=2), Read("w", None, min_ts=3, versions=None)]
    assert list(store.scan(T, None, None, reads, batch_size=1)) == [
        (b"a", {"d:x": [(1, b"v1")]}),
        (b"c", {"w:x": [(4, b"v4"), (3, b"v3")]}),
        (b"d", {"d:x": [(3, b"v3"), (2, b"v2")]}),
    ]
    assert list(store.scan(T, None, None, [Read("d", ("x",), versions=None)])) == [
        (b"a", {"d:x": [(5, b"v5"), (1, b"v1")]}),
        (b"b", {"d:x": [(6, b"v6")]}),
        (b"d", {"d:x": [(3, b"v3"), (2, b"v2"), (1, b"v1")]}),
    ]


BINARY_ROWS = [b"\x00", b"\x00\x01", b"\n", b"\x7f", b"\x80", b"\xff\xfe", b"a\x00b", b".*", b"\\C"]


def test_binary_row_keys_in_byte_order(store: Store) -> None:
    store.mutate_rows(T, [Mutation(r, puts=[("d:c", 1, r)]) for r in BINARY_ROWS])
    got = store.read_rows(T, BINARY_ROWS, [Read("d")])
    assert got == {r: {"d:c": [(1, r)]} for r in BINARY_ROWS}
    assert [r for r, _ in store.scan(T, None, None, [Read("d")])] == sorted(BINARY_ROWS)
    assert [r for r, _ in store.scan(T, None, None, [Read("d")], batch_size=2)] == sorted(
        BINARY_ROWS
    )
    assert [r for r, _ in store.scan(T, b"\x00\x01", b"\xff", [Read("d")])] == sorted(
        r for r in BINARY_ROWS if b"\x00\x01" <= r < b"\xff"
    )
    for r in BINARY_ROWS:
        assert store.check_and_set(T, r, "l:c", None, b"L")
        assert not store.check_and_set(T, r, "l:c", None, b"L")


def test_an_abandoned_scan_does_not_block_the_store(store: Store) -> None:
    put(store, b"a", "d:x", [1])
    put(store, b"b", "d:x", [1])
    it = store.scan(T, None, None, [Read("d")], batch_size=1)
    assert next(it)[0] == b"a"
    it.close()  # type: ignore[attr-defined]
    put(store, b"c", "d:x", [1])
    assert [r for r, _ in store.scan(T, None, None, [Read("d")])] == [b"a", b"b", b"c"]


# ---- errors ------------------------------------------------------------------------


def test_unknown_table(store: Store) -> None:
    with pytest.raises(UnknownTableError):
        store.read_rows("missing", [b"r"], [Read("d")])
    with pytest.raises(UnknownTableError):
        store.mutate_rows("missing", [Mutation(b"r", puts=[("d:c", 1, b"x")])])
    with pytest.raises(UnknownTableError):
        store.check_and_set("missing", b"r", "l:c", None, b"x")
    with pytest.raises(UnknownTableError):
        list(store.scan("missing", None, None, [Read("d")]))


def test_unknown_family(store: Store) -> None:
    with pytest.raises(PercolatorError):
        store.mutate_rows(T, [Mutation(b"r", puts=[("nofamily:c", 1, b"x")])])
    with pytest.raises(PercolatorError):
        store.check_and_set(T, b"r", "nofamily:c", None, b"x")
    # nothing was written by the refused calls, and the store is still usable
    assert store.read_rows(T, [b"r"], [Read("d"), Read("l")]) == {}
    put(store, b"r", "d:c", [1])
    assert versions(store, b"r", "d:c") == [(1, b"v1")]


def test_unknown_family_in_reads(store: Store, backend: str) -> None:
    put(store, b"r", "d:c", [1])
    if backend == "bigtable":
        # A Bigtable read filter naming no existing family selects nothing; the
        # server does not check it against the schema.
        assert store.read_rows(T, [b"r"], [Read("nofamily")]) == {}
        assert list(store.scan(T, None, None, [Read("nofamily")])) == []
        return
    with pytest.raises(PercolatorError):
        store.read_rows(T, [b"r"], [Read("nofamily")])
    with pytest.raises(PercolatorError):
        list(store.scan(T, None, None, [Read("nofamily")]))


def test_bad_columns_and_arguments_are_invalid(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        store.mutate_rows(T, [Mutation(b"r", puts=[("nocolon", 1, b"x")])])
    with pytest.raises(InvalidArgument):
        store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", -1, b"x")])])
    with pytest.raises(InvalidArgument):
        store.check_and_set(T, b"r", "nocolon", None, b"x")
    assert store.read_rows(T, [b"r"], [Read("d")]) == {}
