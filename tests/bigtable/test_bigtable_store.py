"""The Bigtable backend against the real emulator (cbtemulator), through open_store."""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from percolator._errors import InvalidArgument, StoreUnavailable, UnknownTableError
from percolator._store import CAS_DELETES, Guard, Mutation, Read, Store, declares
from percolator.stores import open_store
from tests._bigtable import bigtable_store_url
from tests._services import free_port

pytestmark = pytest.mark.bigtable

FAMILIES = {"d": 0, "w": 0, "l": 1, "n": 0}
T = "__percolator"  # table names may start with "__"


class CountingInterceptor:
    """Counts the RPCs sent on the store's channel, by method name."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()

    def _count(self, details: Any) -> None:
        self.calls[details.method.rsplit("/", 1)[-1]] += 1

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self._count(details)
        return continuation(details, request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        self._count(details)
        return continuation(details, request)


def _interceptor() -> CountingInterceptor:
    import grpc

    unary: Any = grpc.UnaryUnaryClientInterceptor
    stream: Any = grpc.UnaryStreamClientInterceptor

    class _Counting(CountingInterceptor, unary, stream):  # type: ignore[misc]
        pass

    return _Counting()


@pytest.fixture
def open_bt(bigtable_emulator: str, request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """Opens isolated stores on the emulator; drops their tables and closes them after."""
    opened: list[Any] = []

    def _open(**options: Any) -> Any:
        store = open_store(bigtable_store_url(bigtable_emulator, request.node.name), **options)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        for table in store.list_tables():
            store.drop_table(table)
        store.close()


@pytest.fixture
def store(open_bt: Callable[..., Any]) -> Any:
    s = open_bt()
    s.create_table(T, FAMILIES)
    return s


def test_is_a_store_with_atomic_row_cas(store: Any) -> None:
    assert isinstance(store, Store)
    assert store.atomic_row_cas is True
    assert store.url.startswith("bigtable://test-project/test-instance")


def test_tables_create_idempotent_list_drop(open_bt: Callable[..., Any]) -> None:
    s = open_bt()
    assert s.list_tables() == []
    s.create_table("b.t-1", {"d": 0})
    s.create_table("b.t-1", {"d": 0, "x": 2, "xd": 0, "d.x": 0})  # adds missing families
    s.create_table(T, FAMILIES)
    assert s.list_tables() == [T, "b.t-1"]
    puts = [("x:q", 1, b"1"), ("d:q", 1, b"2"), ("xd:q", 1, b"3"), ("d.x:q", 1, b"4")]
    s.mutate_rows("b.t-1", [Mutation(b"r", puts=puts)])
    assert s.read_rows("b.t-1", [b"r"], [Read("x"), Read("d")]) == {
        b"r": {"x:q": [(1, b"1")], "d:q": [(1, b"2")]}
    }
    assert s.read_rows("b.t-1", [b"r"], [Read("d.x")]) == {b"r": {"d.x:q": [(1, b"4")]}}
    s.drop_table("b.t-1")
    s.drop_table("b.t-1")  # missing: not an error
    assert s.list_tables() == [T]


def test_table_prefixes_isolate(open_bt: Callable[..., Any]) -> None:
    a, b = open_bt(), open_bt()
    a.create_table("t", {"d": 0})
    assert a.list_tables() == ["t"]
    assert b.list_tables() == []
    with pytest.raises(UnknownTableError):
        b.read_rows("t", [b"r"], [Read("d")])


def test_max_versions_family_keeps_one(store: Any) -> None:
    # "l" keeps one version (GC in Bigtable is lazy, but CAS keeps exactly one anyway)
    assert store.check_and_set(T, b"r", "l:c", None, b"a")
    assert store.check_and_set(T, b"r", "l:c", b"a", b"b")
    assert store.read_rows(T, [b"r"], [Read("l", versions=None)]) == {b"r": {"l:c": [(0, b"b")]}}


def test_versions_newest_first_bounds_and_limits(store: Any) -> None:
    puts = [("d:c", ts, b"v%d" % ts) for ts in (1, 3, 5, 7, 9)]
    store.mutate_rows(T, [Mutation(b"r", puts=puts)])

    def read(**kw: Any) -> list[int]:
        got = store.read_rows(T, [b"r"], [Read("d", ("c",), **kw)])
        return [ts for ts, _ in got[b"r"]["d:c"]] if got else []

    assert read() == [9]
    assert read(versions=None) == [9, 7, 5, 3, 1]
    assert read(versions=2) == [9, 7]
    assert read(max_ts=7, versions=None) == [7, 5, 3, 1]  # max_ts inclusive
    assert read(max_ts=6) == [5]
    assert read(min_ts=3, max_ts=7, versions=None) == [7, 5, 3]  # min_ts inclusive
    assert read(min_ts=4, max_ts=8, versions=1) == [7]
    assert read(min_ts=9, versions=None) == [9]
    assert read(min_ts=10) == []
    assert read(max_ts=0) == []
    assert read(min_ts=6, max_ts=4) == []
    got = store.read_rows(T, [b"r"], [Read("d", ("c",), max_ts=5, versions=None)])
    assert got == {b"r": {"d:c": [(5, b"v5"), (3, b"v3"), (1, b"v1")]}}


def test_big_timestamps_and_zero(store: Any) -> None:
    big = 2**50
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 0, b"zero"), ("d:c", big, b"big")])])
    got = store.read_rows(T, [b"r"], [Read("d", versions=None)])
    assert got == {b"r": {"d:c": [(big, b"big"), (0, b"zero")]}}
    with pytest.raises(InvalidArgument):
        store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", -1, b"x")])])


def test_transactional_get_shape_in_one_read(store: Any) -> None:
    store.mutate_rows(
        T,
        [
            Mutation(
                b"row",
                puts=[
                    ("d:doc:contents", 10, b"old"),
                    ("w:doc:contents", 12, b"PUT@10"),
                    ("d:doc:contents", 20, b"new"),
                    ("w:doc:contents", 22, b"PUT@20"),
                    ("d:doc:other", 10, b"unrelated"),
                ],
            )
        ],
    )
    assert store.check_and_set(T, b"row", "l:doc:contents", None, b"LOCKED@30")
    reads = [
        Read("l", ("doc:contents",)),
        Read("w", ("doc:contents",), max_ts=21, versions=1),
        Read("d", ("doc:contents",), max_ts=21, versions=1),
    ]
    got = store.read_rows(T, [b"row", b"absent"], reads)
    assert got == {
        b"row": {
            "l:doc:contents": [(0, b"LOCKED@30")],
            "w:doc:contents": [(12, b"PUT@10")],
            "d:doc:contents": [(20, b"new")],
        }
    }


def test_read_rows_many_rows_and_omissions(store: Any) -> None:
    store.mutate_rows(
        T,
        [
            Mutation(b"a", puts=[("d:x", 1, b"a1")]),
            Mutation(b"b", puts=[("w:x", 1, b"b1")]),  # nothing in "d"
            Mutation(b"c", puts=[("d:x", 1, b"c1"), ("d:y", 2, b"c2")]),
        ],
    )
    got = store.read_rows(T, [b"c", b"a", b"b", b"zz", b"a"], [Read("d", ("x", "nope"))])
    assert got == {b"a": {"d:x": [(1, b"a1")]}, b"c": {"d:x": [(1, b"c1")]}}
    assert store.read_rows(T, [], [Read("d")]) == {}
    # the whole family, every qualifier
    assert store.read_rows(T, [b"c"], [Read("d", None)]) == {
        b"c": {"d:x": [(1, b"c1")], "d:y": [(2, b"c2")]}
    }


def test_overlapping_reads_do_not_repeat_cells(store: Any) -> None:
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 1, b"1"), ("d:c", 2, b"2")])])
    got = store.read_rows(
        T, [b"r"], [Read("d", ("c",), versions=None), Read("d", None, max_ts=1, versions=None)]
    )
    assert got == {b"r": {"d:c": [(2, b"2"), (1, b"1")]}}


QUALIFIERS = ["a:b.c*", "x|y", "[z]", "a", "a.", ".*", "(?i)A", "\\C", "é:ü", "", "^$", "a\nb"]


def test_qualifiers_with_colons_and_regex_metacharacters(store: Any) -> None:
    puts = [(f"d:{q}", i + 1, q.encode() or b"empty") for i, q in enumerate(QUALIFIERS)]
    store.mutate_rows(T, [Mutation(b"r", puts=puts)])
    for i, q in enumerate(QUALIFIERS):
        got = store.read_rows(T, [b"r"], [Read("d", (q,))])
        assert got == {b"r": {f"d:{q}": [(i + 1, q.encode() or b"empty")]}}, q
    everything = store.read_rows(T, [b"r"], [Read("d")])[b"r"]
    assert sorted(everything) == sorted(f"d:{q}" for q in QUALIFIERS)
    # CAS and delete on such columns touch exactly that column
    assert store.check_and_set(T, b"r", "l:x|y", None, b"1")
    assert not store.check_and_set(T, b"r", "l:x|y", None, b"2")
    assert store.check_and_set(T, b"r", "l:[z]", None, b"3")
    assert store.read_rows(T, [b"r"], [Read("l")]) == {
        b"r": {"l:x|y": [(0, b"1")], "l:[z]": [(0, b"3")]}
    }
    store.mutate_rows(T, [Mutation(b"r", deletes=[("d:a:b.c*", 100)])])
    left = store.read_rows(T, [b"r"], [Read("d")])[b"r"]
    assert "d:a:b.c*" not in left and "d:a" in left and len(left) == len(QUALIFIERS) - 1


BINARY_ROWS = [b"\x00", b"\x00\x01", b"\n", b"\xff\xfe", b"a\x00b", b".*", b"\\C", b"r" * 4096]


def test_binary_row_keys(store: Any) -> None:
    store.mutate_rows(T, [Mutation(r, puts=[("d:c", 1, r[:8])]) for r in BINARY_ROWS])
    got = store.read_rows(T, BINARY_ROWS, [Read("d")])
    assert got == {r: {"d:c": [(1, r[:8])]} for r in BINARY_ROWS}
    assert [r for r, _ in store.scan(T, None, None, [Read("d")])] == sorted(BINARY_ROWS)
    assert [r for r, _ in store.scan(T, b"\x00\x01", b"\xff", [Read("d")])] == sorted(
        r for r in BINARY_ROWS if b"\x00\x01" <= r < b"\xff"
    )
    for r in BINARY_ROWS:
        assert store.check_and_set(T, r, "l:c", None, b"L")
    with pytest.raises(InvalidArgument):
        store.mutate_rows(T, [Mutation(b"", puts=[("d:c", 1, b"")])])
    with pytest.raises(InvalidArgument):
        store.mutate_rows(T, [Mutation(b"r" * 4097, puts=[("d:c", 1, b"")])])


def test_values_binary_empty_and_large(store: Any) -> None:
    large = os.urandom(6 * 1024 * 1024)  # over gRPC's default 4 MiB message size
    store.mutate_rows(
        T,
        [
            Mutation(
                b"r", puts=[("d:empty", 1, b""), ("d:bin", 1, b"\x00\xff"), ("d:big", 1, large)]
            )
        ],
    )
    got = store.read_rows(T, [b"r"], [Read("d")])
    assert got == {
        b"r": {"d:empty": [(1, b"")], "d:bin": [(1, b"\x00\xff")], "d:big": [(1, large)]}
    }


def test_check_and_set_absent_present_mismatch(store: Any) -> None:
    lock = "l:doc:contents"
    assert store.check_and_set(T, b"r", lock, None, b"L1")  # absent -> set
    assert not store.check_and_set(T, b"r", lock, None, b"L2")  # present: not absent
    assert not store.check_and_set(T, b"r", lock, b"L", b"L2")  # prefix is not equal
    assert not store.check_and_set(T, b"r", lock, b"L1x", b"L2")
    assert not store.check_and_set(T, b"r", lock, b"", b"L2")
    assert store.read_rows(T, [b"r"], [Read("l")]) == {b"r": {lock: [(0, b"L1")]}}
    assert store.check_and_set(T, b"r", lock, b"L1", b"")  # present -> set (to empty)
    assert not store.check_and_set(T, b"r", lock, None, b"L3")  # b"" is a value, not absent
    assert store.check_and_set(T, b"r", lock, b"", b"L3")
    assert store.read_rows(T, [b"r"], [Read("l", versions=None)]) == {b"r": {lock: [(0, b"L3")]}}
    # a different column of the same family is independent
    assert store.check_and_set(T, b"r", "l:doc:other", None, b"O")
    assert not store.check_and_set(T, b"r2", lock, b"L3", b"X")  # other row: absent


def test_check_and_set_puts_only_on_success(store: Any) -> None:
    puts = [("d:doc:c", 5, b"data@5"), ("w:doc:c", 6, b"PUT@5"), ("n:doc:c", 6, b"")]
    assert not store.check_and_set(T, b"r", "l:doc:c", b"nope", b"L", puts=puts)
    assert store.read_rows(T, [b"r"], [Read("d"), Read("w"), Read("n"), Read("l")]) == {}
    assert store.check_and_set(T, b"r", "l:doc:c", None, b"L", puts=puts)
    assert store.read_rows(T, [b"r"], [Read("d"), Read("w"), Read("n"), Read("l")]) == {
        b"r": {
            "d:doc:c": [(5, b"data@5")],
            "w:doc:c": [(6, b"PUT@5")],
            "n:doc:c": [(6, b"")],
            "l:doc:c": [(0, b"L")],
        }
    }
    assert not store.check_and_set(T, b"r", "l:doc:c", None, b"L2", puts=[("d:doc:c", 7, b"x")])
    assert store.read_rows(T, [b"r"], [Read("d", versions=None)]) == {
        b"r": {"d:doc:c": [(5, b"data@5")]}
    }


def test_check_and_set_deletes_at_or_below_only_on_success(store: Any) -> None:
    """``deletes=`` (``cas_deletes``): the versions at or below each max_ts go with the
    compare-and-set, in its atomic step, and only when it sets."""
    assert declares(store, CAS_DELETES)
    store.mutate_rows(T, [Mutation(b"r", [("n:doc:c", ts, b"") for ts in (3, 5, 8)])])
    assert not store.check_and_set(T, b"r", "l:doc:c", b"nope", b"L", deletes=[("n:doc:c", 5)])
    assert store.read_rows(T, [b"r"], [Read("n", versions=None)])[b"r"]["n:doc:c"] == [
        (8, b""), (5, b""), (3, b"")]
    assert store.check_and_set(T, b"r", "l:doc:c", None, b"L", puts=[("w:doc:c", 9, b"P")],
                               deletes=[("n:doc:c", 5)])
    assert store.read_rows(T, [b"r"], [Read("n", versions=None), Read("w"), Read("l")]) == {
        b"r": {"n:doc:c": [(8, b"")], "w:doc:c": [(9, b"P")], "l:doc:c": [(0, b"L")]}
    }


def test_mutations_deletes_at_or_below_then_puts(store: Any) -> None:
    store.mutate_rows(
        T,
        [
            Mutation(
                b"r", puts=[("d:c", ts, b"%d" % ts) for ts in (1, 2, 3, 4)] + [("d:o", 1, b"o")]
            )
        ],
    )
    store.mutate_rows(T, [Mutation(b"r", deletes=[("d:c", 2)])])
    assert store.read_rows(T, [b"r"], [Read("d", versions=None)]) == {
        b"r": {"d:c": [(4, b"4"), (3, b"3")], "d:o": [(1, b"o")]}
    }
    # deletes are applied before puts of the same mutation
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 3, b"new3")], deletes=[("d:c", 3)])])
    assert store.read_rows(T, [b"r"], [Read("d", ("c",), versions=None)]) == {
        b"r": {"d:c": [(4, b"4"), (3, b"new3")]}
    }
    # several mutations of the same row apply in order
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
    store.mutate_rows(T, [])  # nothing to do


def test_scan_ranges_sparse_families_and_paging(store: Any) -> None:
    rows = [b"k%03d" % i for i in range(60)]
    mutations = [Mutation(r, puts=[("d:c", 1, r)]) for r in rows]
    mutations += [Mutation(r, puts=[("n:doc:c", 2, b"")]) for r in rows[::7]]  # sparse
    store.mutate_rows(T, mutations)
    for batch_size in (1, 4, 7, 1000):
        got = list(store.scan(T, None, None, [Read("n")], batch_size=batch_size))
        assert got == [(r, {"n:doc:c": [(2, b"")]}) for r in rows[::7]], batch_size
    assert [r for r, _ in store.scan(T, b"k010", b"k020", [Read("d")], batch_size=3)] == rows[10:20]
    assert [r for r, _ in store.scan(T, b"k010", b"k020", [Read("n")])] == [b"k014"]
    assert [r for r, _ in store.scan(T, b"k0135", None, [Read("n")])] == rows[14::7]
    assert [r for r, _ in store.scan(T, None, b"k014", [Read("n")])] == [b"k000", b"k007"]
    assert [r for r, _ in store.scan(T, b"k014", b"k014", [Read("d")])] == []
    assert [r for r, _ in store.scan(T, b"k015", b"k014", [Read("d")])] == []
    assert list(store.scan(T, None, None, [Read("w")])) == []
    both = dict(store.scan(T, b"k007", b"k008", [Read("d"), Read("n")]))
    assert both == {b"k007": {"d:c": [(1, b"k007")], "n:doc:c": [(2, b"")]}}


def test_unknown_table(store: Any) -> None:
    with pytest.raises(UnknownTableError):
        store.read_rows("missing", [b"r"], [Read("d")])
    with pytest.raises(UnknownTableError):
        list(store.scan("missing", None, None, [Read("d")]))
    with pytest.raises(UnknownTableError):
        store.mutate_rows("missing", [Mutation(b"r", puts=[("d:c", 1, b"")])])
    with pytest.raises(UnknownTableError):
        store.check_and_set("missing", b"r", "l:c", None, b"x")


def test_bad_arguments(store: Any) -> None:
    with pytest.raises(InvalidArgument):
        store.mutate_rows(T, [Mutation(b"r", puts=[("nocolon", 1, b"")])])
    with pytest.raises(InvalidArgument):
        store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 1, "str")])])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument):
        store.mutate_rows(T, [Mutation(b"r", puts=[("unknownfam:c", 1, b"")])])
    with pytest.raises(InvalidArgument):
        store.read_rows(T, [b"r"], [Read("d", versions=0)])
    with pytest.raises(InvalidArgument):
        store.create_table("bad name!", {"d": 0})
    with pytest.raises(InvalidArgument):
        store.create_table("t", {"bad fam": 0})


def test_closed_store(bigtable_emulator: str) -> None:
    s = open_store(bigtable_store_url(bigtable_emulator, "closed"))
    s.create_table("t", {"d": 0})
    s.drop_table("t")
    s.close()
    s.close()
    with pytest.raises(StoreUnavailable):
        s.read_rows("t", [b"r"], [Read("d")])


def test_unreachable_emulator_is_store_unavailable() -> None:
    port = free_port()  # nothing listens there
    url = f"bigtable://proj/inst?emulator=127.0.0.1:{port}&timeout=5"
    s = open_store(url)
    try:
        for call in (
            lambda: s.read_rows("t", [b"r"], [Read("d")]),
            lambda: s.check_and_set("t", b"r", "l:c", None, b"x"),
            lambda: s.mutate_rows("t", [Mutation(b"r", puts=[("d:c", 1, b"")])]),
            lambda: list(s.scan("t", None, None, [Read("d")])),
            lambda: s.create_table("t", {"d": 0}),
            s.list_tables,
        ):
            with pytest.raises(StoreUnavailable) as info:
                call()
            message = str(info.value)
            assert f"127.0.0.1:{port}" in message and "'proj'" in message and "'inst'" in message
    finally:
        s.close()


def test_emulator_from_environment(bigtable_emulator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", bigtable_emulator)
    s = open_store("bigtable://env-project/env-instance?table_prefix=envtest")
    try:
        s.create_table("t", {"d": 0})
        assert s.list_tables() == ["t"]
        s.drop_table("t")
    finally:
        s.close()


@pytest.mark.parametrize(
    "url",
    [
        "bigtable://",
        "bigtable://project",
        "bigtable://project/",
        "bigtable://Project/instance",
        "bigtable://project/Instance",
        "bigtable://project/instance?nope=1",
        "bigtable://project/instance?emulator=nohostport",
        "bigtable://project/instance?table_prefix=bad prefix",
        "bigtable://project/instance?timeout=-1",
        "bigtable://project/instance?timeout=abc",
    ],
)
def test_bad_urls(url: str, bigtable_emulator: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(url.split("?")[0])):
        open_store(url)


def test_bad_options() -> None:
    with pytest.raises(InvalidArgument, match="unknown bigtable store option"):
        open_store("bigtable://p/i?emulator=127.0.0.1:1", colour="blue")


def test_rpcs_per_contract_method(open_bt: Callable[..., Any]) -> None:
    counter = _interceptor()
    s = open_bt(interceptors=[counter])
    s.create_table(T, FAMILIES)

    def rpcs(call: Callable[[], object]) -> dict[str, int]:
        counter.calls.clear()
        call()
        return dict(counter.calls)

    many = [Mutation(b"r%d" % i, puts=[("d:c", 1, b"v"), ("w:c", 2, b"w")]) for i in range(50)]
    assert rpcs(lambda: s.mutate_rows(T, many)) == {"MutateRows": 1}
    get = [
        Read("l", ("c",)),
        Read("w", ("c",), max_ts=10, versions=3),
        Read("d", ("c",), max_ts=10, versions=1),
    ]
    assert rpcs(lambda: s.read_rows(T, [b"r1"], get)) == {"ReadRows": 1}
    assert rpcs(lambda: s.read_rows(T, [b"r%d" % i for i in range(50)], get)) == {"ReadRows": 1}
    assert rpcs(lambda: s.read_rows(T, [], get)) == {}
    puts = [("d:c", 5, b"v"), ("n:c", 6, b"")]
    assert rpcs(lambda: s.check_and_set(T, b"r1", "l:c", None, b"L", puts=puts)) == {
        "CheckAndMutateRow": 1
    }
    assert rpcs(lambda: s.check_and_set(T, b"r1", "l:c", b"L", b"M")) == {"CheckAndMutateRow": 1}
    assert rpcs(lambda: list(s.scan(T, None, None, [Read("d")]))) == {"ReadRows": 1}
    assert rpcs(lambda: list(s.scan(T, None, None, [Read("d")], batch_size=20))) == {"ReadRows": 3}
    assert rpcs(lambda: s.create_table(T, FAMILIES)) == {"CreateTable": 1, "GetTable": 1}
    assert rpcs(s.list_tables) == {"ListTables": 1}


def test_rpcs_of_the_optional_capabilities(open_bt: Callable[..., Any]) -> None:
    counter = _interceptor()
    s = open_bt(interceptors=[counter])
    s.create_table(T, FAMILIES)
    counter.calls.clear()
    assert s.increment(T, b"r", "l:n", 3) == 3
    assert dict(counter.calls) == {"ReadModifyWriteRow": 1}
    counter.calls.clear()
    guards = [Guard("l:c", latest=True, value_from=b"G"), Guard("w:c", min_ts=5, max_ts=9)]
    assert s.set_unless(T, b"r", "l:c", b"L", guards, [("d:c", 4, b"v")])
    assert not s.set_unless(T, b"r", "l:c", b"M", guards)
    assert dict(counter.calls) == {"CheckAndMutateRow": 2}


def test_read_filters_are_built_once_per_distinct_reads(store: Any) -> None:
    from percolator.stores._bigtable_requests import reads_filter as _reads_filter

    get = [Read("l", ("c",)), Read("w", ("c",), max_ts=10), Read("d", ("c",), max_ts=10)]
    assert _reads_filter(get) is _reads_filter(list(get))
    assert _reads_filter(get) is not _reads_filter(get[:2])
    # a list of qualifiers is not hashable: built every time, still right
    listed = Read("d", ["c"])  # type: ignore[arg-type]
    assert _reads_filter([listed]) == _reads_filter([Read("d", ("c",))])
    store.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 3, b"v3"), ("d:c", 12, b"v12")])])
    for _ in range(2):
        assert store.read_rows(T, [b"r"], get) == {b"r": {"d:c": [(3, b"v3")]}}
        assert store.read_rows(T, [b"r"], [listed]) == {b"r": {"d:c": [(12, b"v12")]}}


def test_cloud_without_credentials_is_store_unavailable(
    bigtable_emulator: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.delenv("BIGTABLE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(StoreUnavailable, match="credentials"):
        open_store("bigtable://proj/inst")


def test_check_and_set_has_one_winner_under_contention(store: Any) -> None:
    import threading

    results: list[bool] = []
    barrier = threading.Barrier(6)

    def contend(i: int) -> None:
        barrier.wait()
        results.append(
            store.check_and_set(T, b"hot", "l:c", None, b"owner%d" % i, puts=[("d:c", i, b"x")])
        )

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 5 + [True]
    got = store.read_rows(T, [b"hot"], [Read("l"), Read("d", versions=None)])[b"hot"]
    winner = int(got["l:c"][0][1][len(b"owner") :])
    assert got["d:c"] == [(winner, b"x")]  # only the winner's puts were applied


def test_row_merger_split_values_and_reset() -> None:
    """Cloud Bigtable splits large cells over chunks and may reset a row mid-stream
    (the emulator never does): feed the merger such a response."""
    pytest.importorskip("google.cloud.bigtable_v2")
    from google.cloud.bigtable_v2.types import bigtable as bt

    from percolator.stores._bigtable_requests import RowMerger as _RowMerger

    def chunk(**kw: Any) -> Any:
        return bt.ReadRowsResponse.CellChunk(**kw)

    response = bt.ReadRowsResponse(
        chunks=[
            chunk(row_key=b"a", family_name="d", qualifier=b"q", timestamp_micros=5000, value=b"x"),
            chunk(reset_row=True),
            chunk(
                row_key=b"a",
                family_name="d",
                qualifier=b"q:1",
                timestamp_micros=7000,
                value=b"he",
                value_size=5,
            ),
            chunk(value=b"ll", value_size=5),
            chunk(value=b"o"),
            chunk(timestamp_micros=3000, value=b"old"),
            chunk(family_name="w", qualifier=b"q:1", timestamp_micros=0, value=b"w0"),
            chunk(qualifier=b"r", timestamp_micros=1000, value=b"", commit_row=True),
            chunk(row_key=b"b", family_name="d", qualifier=b"q", value=b"z", commit_row=True),
        ]
    )
    got = dict(_RowMerger().feed(bt.ReadRowsResponse.pb(response)))
    assert got == {
        b"a": {
            "d:q:1": [(7, b"hello"), (3, b"old")],
            "w:q:1": [(0, b"w0")],
            "w:r": [(1, b"")],
        },
        b"b": {"d:q": [(0, b"z")]},
    }


def _recording_interceptor(fail_after_first: set[str] | None = None) -> Any:
    """An interceptor recording the metadata of every RPC by method name; the streaming
    methods named in *fail_after_first* yield their first response and then raise an
    UNAVAILABLE ``RpcError``, as a stream broken by the network does."""
    import grpc

    rpc_error: Any = grpc.RpcError

    class _Broken(rpc_error):  # type: ignore[misc]
        def code(self) -> Any:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return "stream broken by the test"

        def trailing_metadata(self) -> Any:
            return None

    def broken(responses: Any) -> Iterator[Any]:
        yield next(iter(responses))
        raise _Broken()

    class _Recording(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
        def __init__(self) -> None:
            self.metadata: dict[str, dict[str, str]] = {}

        def _record(self, details: Any) -> str:
            method = str(details.method.rsplit("/", 1)[-1])
            self.metadata[method] = dict(details.metadata or ())
            return method

        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            self._record(details)
            return continuation(details, request)

        def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            method = self._record(details)
            responses = continuation(details, request)
            return broken(responses) if method in (fail_after_first or ()) else responses

    return _Recording()


def test_data_calls_send_the_routing_header(open_bt: Callable[..., Any]) -> None:
    """Cloud Bigtable routes a data call by its ``x-goog-request-params`` header (table
    and app profile, url-encoded); the store sends it on every data call as the GAPIC
    client does, though it calls gRPC directly."""
    recorder = _recording_interceptor()
    s = open_bt(interceptors=[recorder], app_profile_id="prof ile")
    s.create_table(T, FAMILIES)
    s.mutate_rows(T, [Mutation(b"r", puts=[("d:c", 1, b"v")])])
    assert s.check_and_set(T, b"r", "l:c", None, b"L")
    assert s.read_rows(T, [b"r"], [Read("d")]) == {b"r": {"d:c": [(1, b"v")]}}
    assert s.increment(T, b"r", "l:n", 2) == 2
    s.split_keys(T)
    table_name = f"{s._instance_path}/tables/{s._table_id(T)}"
    expected = f"table_name={table_name}&app_profile_id=prof+ile"
    for method in (
        "MutateRows", "CheckAndMutateRow", "ReadRows", "ReadModifyWriteRow", "SampleRowKeys"
    ):
        sent = recorder.metadata[method]
        assert sent["x-goog-request-params"] == expected, method
        assert "gapic/" in sent["x-goog-api-client"], method


def test_a_stream_broken_midway_is_store_unavailable(open_bt: Callable[..., Any]) -> None:
    """A ``ReadRows`` or ``MutateRows`` stream that fails after its first response raises
    the ``RpcError`` from the iteration, not from the call: it is still mapped to
    StoreUnavailable (not leaked as a gRPC error)."""
    s = open_bt(interceptors=[_recording_interceptor({"ReadRows", "MutateRows"})])
    s.create_table(T, FAMILIES)
    with pytest.raises(StoreUnavailable, match=r"MutateRows .*stream broken by the test"):
        s.mutate_rows(T, [Mutation(b"r%d" % i, puts=[("d:c", 1, b"v")]) for i in range(3)])
    with pytest.raises(StoreUnavailable, match="stream broken by the test"):
        s.read_rows(T, [b"r0", b"r1"], [Read("d")])
    with pytest.raises(StoreUnavailable, match="stream broken by the test"):
        list(s.scan(T, None, None, [Read("d")]))
