"""The hbase backend (``percolator.stores.hbase``) through ``open_store``, against the
HBase Thrift1 test server (or a real HBase with ``PERCOLATOR_HBASE_THRIFT``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from percolator._errors import InvalidArgument, StoreUnavailable, UnknownTableError
from percolator._store import Mutation, Read, Store
from percolator.stores import open_store
from tests._backends import drop_tables
from tests._hbase import (
    hbase_store_url,
    require_hbase_client,
    start_test_server,
    unique_name,
)
from tests._services import free_port, stop_process

pytestmark = pytest.mark.hbase

FAMILIES = {"d": 0, "w": 0, "l": 1, "n": 0}


@pytest.fixture(autouse=True)
def _client_libraries() -> None:
    require_hbase_client()  # fails in CI, skips elsewhere, without happybase/thriftpy2


Q = "doc:contents"


@pytest.fixture
def store(hbase_thrift: str, request: pytest.FixtureRequest) -> Iterator[Store]:
    s = open_store(hbase_store_url(hbase_thrift, request.node.name))
    s.create_table("t", FAMILIES)
    yield s
    drop_tables(s)
    s.close()


def put_versions(store: Store, row: bytes, column: str, stamps: list[int]) -> None:
    store.mutate_rows("t", [Mutation(row=row, puts=[(column, ts, b"v%d" % ts) for ts in stamps])])


def read1(store: Store, row: bytes, *reads: Read) -> dict[str, list[tuple[int, bytes]]]:
    return store.read_rows("t", [row], reads).get(row, {})


# ---- tables ------------------------------------------------------------------------


def test_is_a_store_without_atomic_row_cas(store: Store) -> None:
    assert isinstance(store, Store)
    assert store.atomic_row_cas is False
    assert store.url.startswith("hbase://")


def test_tables_are_created_idempotently_listed_and_dropped(store: Store) -> None:
    store.create_table("__percolator", {"m": 1})
    store.create_table("__percolator", {"m": 1})
    store.create_table("a-b.c", {"d": 0})
    assert store.list_tables() == ["__percolator", "a-b.c", "t"]
    store.drop_table("a-b.c")
    store.drop_table("a-b.c")  # missing: not an error
    assert store.list_tables() == ["__percolator", "t"]


@pytest.mark.parametrize(("api", "families_call"), [
    ("thrift1", b"getColumnDescriptors"), ("thrift2", b"getTableDescriptor")])
def test_create_table_asks_for_the_families_first_and_creates_only_a_missing_table(
    api: str, families_call: bytes, request: pytest.FixtureRequest,
) -> None:
    """HBase's master answers ``createTable`` of an existing table only once a create
    procedure has run and failed, and most ``create_table`` calls find their table
    there (every client's and worker's start makes its tables). So the store asks for
    the table's families first: an existing table costs that and ``isTableEnabled``,
    with no ``createTable``; a new one that question and ``createTable``. (An existing
    table cost ``createTable``, the families and ``isTableEnabled``, and on Thrift2
    ``tableExists`` too: in the Ubiq "any step" kill test on HBase, 244 such calls
    took 32 s.) The real HBase's calls, as a TCP relay in front of it sees them."""
    from tests._thrift_relay import Relay

    relay = Relay(request.getfixturevalue("hbase_thrift2" if api == "thrift2"
                                          else "hbase_thrift"))
    store = open_store(hbase_store_url(relay.hostport, request.node.name, api=api))
    try:
        relay.calls.clear()  # the store's opening
        store.create_table("t", {"d": 0, "l": 1})
        assert relay.calls == [families_call, b"createTable"]
        relay.calls.clear()
        store.create_table("t", {"d": 0, "l": 1})
        assert relay.calls == [families_call, b"isTableEnabled"]
        store.mutate_rows("t", [Mutation(b"r", [("d:q", 1, b"v")])])
        assert store.read_rows("t", [b"r"], [Read("d")]) == {b"r": {"d:q": [(1, b"v")]}}
        with pytest.raises(InvalidArgument, match="without families"):
            store.create_table("t", {"d": 0, "x": 0})
        drop_tables(store)
    finally:
        store.close()
        relay.close()


def test_existing_table_without_a_family_is_refused(store: Store) -> None:
    with pytest.raises(InvalidArgument, match="without families"):
        store.create_table("t", {"d": 0, "x": 0})


def test_families_are_created_with_settings_that_pay(store: Store, hbase_thrift: str) -> None:
    import happybase

    host, _, port = hbase_thrift.rpartition(":")
    raw = happybase.Connection(host, int(port))
    try:
        got = raw.client.getColumnDescriptors(store._name("t"))  # type: ignore[attr-defined]
    finally:
        raw.close()
    settings = {
        name.decode().rstrip(":"): (d.maxVersions, d.inMemory, d.bloomFilterType,
                                     d.blockCacheEnabled, d.timeToLive)
        for name, d in got.items()
    }
    forever = 2**31 - 1
    assert settings == {
        "d": (forever, False, b"ROW", True, forever),
        "w": (forever, False, b"ROW", True, forever),
        "l": (1, True, b"ROW", True, forever),
        "n": (forever, True, b"ROW", True, forever),
    }


@pytest.mark.parametrize(
    ("family", "problem"),
    [({"max_versions": 1}, "VERSIONS => 1"), ({"time_to_live": 86400}, "TTL => 86400")],
)
def test_existing_table_whose_settings_lose_versions_is_refused(
    store: Store, hbase_thrift: str, family: dict[str, int], problem: str
) -> None:
    # As made in the HBase shell: create 'T', {NAME => 'w', VERSIONS => 1}
    import happybase

    host, _, port = hbase_thrift.rpartition(":")
    raw = happybase.Connection(host, int(port))
    name = store._name("shell").decode()  # type: ignore[attr-defined]
    try:
        raw.create_table(name, {"d": {"max_versions": 2**31 - 1}, "w": family})
        with pytest.raises(InvalidArgument, match=f"{problem}.*alter '{name}'"):
            store.create_table("shell", {"d": 0, "w": 0})
        store.create_table("shell", {"d": 0})  # what it has suffices for this
    finally:
        raw.delete_table(name, disable=True)
        raw.close()


def test_bad_table_and_family_names_are_refused(store: Store) -> None:
    with pytest.raises(InvalidArgument, match="table name"):
        store.create_table("no/slash", {"d": 0})
    with pytest.raises(InvalidArgument, match="family"):
        store.create_table("ok", {"a:b": 0})


def test_lock_family_keeps_one_version(store: Store) -> None:
    store.mutate_rows("t", [Mutation(row=b"r", puts=[("l:c", 1, b"a"), ("l:c", 2, b"b")])])
    assert read1(store, b"r", Read("l", None, versions=None)) == {"l:c": [(2, b"b")]}


# ---- reads -------------------------------------------------------------------------


def test_versions_are_newest_first_and_bounds_inclusive(store: Store) -> None:
    put_versions(store, b"r", "d:" + Q, [1, 2, 3, 4, 5])
    col = "d:" + Q
    assert read1(store, b"r", Read("d", (Q,), versions=None))[col] == [
        (5, b"v5"),
        (4, b"v4"),
        (3, b"v3"),
        (2, b"v2"),
        (1, b"v1"),
    ]
    assert read1(store, b"r", Read("d", (Q,)))[col] == [(5, b"v5")]
    assert read1(store, b"r", Read("d", (Q,), max_ts=3))[col] == [(3, b"v3")]
    assert read1(store, b"r", Read("d", (Q,), max_ts=4, min_ts=2, versions=None))[col] == [
        (4, b"v4"),
        (3, b"v3"),
        (2, b"v2"),
    ]
    assert read1(store, b"r", Read("d", (Q,), max_ts=4, versions=2))[col] == [
        (4, b"v4"),
        (3, b"v3"),
    ]
    assert read1(store, b"r", Read("d", (Q,), min_ts=5, versions=None))[col] == [(5, b"v5")]
    assert read1(store, b"r", Read("d", (Q,), min_ts=2, max_ts=2, versions=3))[col] == [(2, b"v2")]
    assert read1(store, b"r", Read("d", (Q,), min_ts=6)) == {}
    assert read1(store, b"r", Read("d", (Q,), max_ts=0)) == {}
    assert read1(store, b"r", Read("d", (Q,), min_ts=2, max_ts=1, versions=None)) == {}


def test_transactional_get_shape_in_one_read(store: Store) -> None:
    """Lock latest + write and data records at or below start_ts, several rows."""
    store.mutate_rows(
        "t",
        [
            Mutation(row=b"r1", puts=[("d:" + Q, 10, b"old"), ("w:" + Q, 11, b"w11")]),
            Mutation(row=b"r1", puts=[("d:" + Q, 20, b"new"), ("w:" + Q, 21, b"w21")]),
            Mutation(row=b"r2", puts=[("d:" + Q, 5, b"r2")]),
        ],
    )
    assert store.check_and_set("t", b"r1", "l:" + Q, None, b"LOCK")
    reads = [
        Read("l", (Q,)),
        Read("w", (Q,), max_ts=15, versions=2),
        Read("d", (Q,), max_ts=15),
    ]
    got = store.read_rows("t", [b"r1", b"r2", b"r3"], reads)
    assert set(got) == {b"r1", b"r2"}
    [(_lock_ts, lock)] = got[b"r1"]["l:" + Q]
    assert lock == b"LOCK"
    assert got[b"r1"]["w:" + Q] == [(11, b"w11")]
    assert got[b"r1"]["d:" + Q] == [(10, b"old")]
    assert got[b"r2"] == {"d:" + Q: [(5, b"r2")]}
    newer = store.read_rows("t", [b"r1"], [Read("w", (Q,), min_ts=16, versions=None)])
    assert newer == {b"r1": {"w:" + Q: [(21, b"w21")]}}


def test_whole_family_reads_with_versions(store: Store) -> None:
    put_versions(store, b"r", "d:a", [1, 2, 3])
    put_versions(store, b"r", "d:b", [2, 4])
    put_versions(store, b"r", "w:a", [9])
    got = read1(store, b"r", Read("d", None, max_ts=3, versions=None))
    assert got == {"d:a": [(3, b"v3"), (2, b"v2"), (1, b"v1")], "d:b": [(2, b"v2")]}
    got = read1(store, b"r", Read("d", None, max_ts=3), Read("w", None))
    assert got == {"d:a": [(3, b"v3")], "d:b": [(2, b"v2")], "w:a": [(9, b"v9")]}
    got = read1(store, b"r", Read("d", None, min_ts=3, versions=None))
    assert got == {"d:a": [(3, b"v3")], "d:b": [(4, b"v4")]}


def test_reads_with_different_bounds_in_one_call(store: Store) -> None:
    put_versions(store, b"r", "d:a", [1, 5, 9])
    put_versions(store, b"r", "w:a", [2, 6, 10])
    got = read1(store, b"r", Read("d", ("a",), max_ts=4), Read("w", ("a",), max_ts=7))
    assert got == {"d:a": [(1, b"v1")], "w:a": [(6, b"v6")]}


def test_missing_rows_and_columns_are_omitted(store: Store) -> None:
    put_versions(store, b"r", "d:a", [1])
    assert store.read_rows("t", [b"x", b"r"], [Read("w", None), Read("d", ("b",))]) == {}
    assert store.read_rows("t", [], [Read("d")]) == {}


# ---- writes ------------------------------------------------------------------------


def test_deletes_remove_versions_at_or_below(store: Store) -> None:
    put_versions(store, b"r", "n:" + Q, [1, 2, 3])
    put_versions(store, b"r", "d:a", [1])
    store.mutate_rows("t", [Mutation(row=b"r", deletes=[("n:" + Q, 2)])])
    assert read1(store, b"r", Read("n", None, versions=None)) == {"n:" + Q: [(3, b"v3")]}
    store.mutate_rows("t", [Mutation(row=b"r", deletes=[("n:" + Q, 3), ("d:a", 1)])])
    assert read1(store, b"r", Read("n", None), Read("d", None)) == {}


def test_deletes_apply_before_puts(store: Store) -> None:
    put_versions(store, b"r", "d:a", [1, 2])
    store.mutate_rows("t", [Mutation(row=b"r", deletes=[("d:a", 2)], puts=[("d:a", 3, b"x")])])
    assert read1(store, b"r", Read("d", None, versions=None)) == {"d:a": [(3, b"x")]}


def test_puts_at_several_timestamps_and_rows(store: Store) -> None:
    store.mutate_rows(
        "t",
        [
            Mutation(row=b"a", puts=[("d:x", 1, b"1"), ("w:x", 2, b"2"), ("d:x", 3, b"3")]),
            Mutation(row=b"b", puts=[("d:x", 1, b"b1")]),
        ],
    )
    got = store.read_rows("t", [b"a", b"b"], [Read("d", None, versions=None), Read("w", None)])
    assert got == {
        b"a": {"d:x": [(3, b"3"), (1, b"1")], "w:x": [(2, b"2")]},
        b"b": {"d:x": [(1, b"b1")]},
    }


# ---- compare-and-set ---------------------------------------------------------------


def test_check_and_set_absent_present_mismatch(store: Store) -> None:
    col = "l:" + Q
    assert store.check_and_set("t", b"r", col, None, b"one")
    assert not store.check_and_set("t", b"r", col, None, b"two")
    assert not store.check_and_set("t", b"r", col, b"nope", b"two")
    assert store.check_and_set("t", b"r", col, b"one", b"two")
    [(_ts, value)] = read1(store, b"r", Read("l", (Q,)))[col]
    assert value == b"two"


def test_check_and_set_writes_puts_first_even_when_it_fails(store: Store) -> None:
    col = "l:" + Q
    assert store.check_and_set("t", b"r", col, None, b"L1", puts=[("d:" + Q, 7, b"data")])
    assert not store.check_and_set("t", b"r", col, None, b"L2", puts=[("d:" + Q, 8, b"more")])
    got = read1(store, b"r", Read("d", (Q,), versions=None))
    assert got == {"d:" + Q: [(8, b"more"), (7, b"data")]}


def test_check_and_set_refuses_empty_values(store: Store) -> None:
    with pytest.raises(InvalidArgument, match="empty"):
        store.check_and_set("t", b"r", "l:c", None, b"")
    with pytest.raises(InvalidArgument, match="empty"):
        store.check_and_set("t", b"r", "l:c", b"", b"x")


def test_check_and_set_has_one_winner_among_threads(store: Store) -> None:
    wins: list[bool] = []
    lock = threading.Lock()

    def contend(i: int) -> None:
        won = store.check_and_set("t", b"r", "l:c", None, b"%d" % i)
        with lock:
            wins.append(won)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]


# ---- scans -------------------------------------------------------------------------


def test_scan_range_and_sparse_family(store: Store) -> None:
    for i in range(10):
        row = b"row%02d" % i
        store.mutate_rows("t", [Mutation(row=row, puts=[("d:a", 1, row)])])
        if i % 3 == 0:
            store.mutate_rows("t", [Mutation(row=row, puts=[("n:a", 5, b"dirty")])])
    got = list(store.scan("t", b"row02", b"row09", [Read("n", None)], batch_size=2))
    assert got == [(b"row03", {"n:a": [(5, b"dirty")]}), (b"row06", {"n:a": [(5, b"dirty")]})]
    rows = [r for r, _ in store.scan("t", None, None, [Read("d", ("a",))], batch_size=3)]
    assert rows == [b"row%02d" % i for i in range(10)]
    assert list(store.scan("t", b"row05", b"row05", [Read("d", None)])) == []


def test_scan_honours_reads_it_cannot_push_down(store: Store) -> None:
    put_versions(store, b"a", "d:x", [1, 5])
    put_versions(store, b"b", "d:x", [6])
    put_versions(store, b"c", "w:x", [2, 3])
    reads = [Read("d", None, max_ts=4), Read("w", None, versions=None)]
    got = list(store.scan("t", None, None, reads, batch_size=1))
    assert got == [
        (b"a", {"d:x": [(1, b"v1")]}),
        (b"c", {"w:x": [(3, b"v3"), (2, b"v2")]}),
    ]


def test_abandoned_scan_releases_its_scanner(store: Store) -> None:
    put_versions(store, b"a", "d:x", [1])
    put_versions(store, b"b", "d:x", [1])
    it = store.scan("t", None, None, [Read("d")], batch_size=1)
    assert next(it)[0] == b"a"
    it.close()  # type: ignore[attr-defined]
    assert [r for r, _ in store.scan("t", None, None, [Read("d")])] == [b"a", b"b"]


# ---- errors ------------------------------------------------------------------------


def test_unknown_table(store: Store) -> None:
    with pytest.raises(UnknownTableError):
        store.read_rows("nope", [b"r"], [Read("d")])
    with pytest.raises(UnknownTableError):
        store.mutate_rows("nope", [Mutation(row=b"r", puts=[("d:a", 1, b"x")])])
    with pytest.raises(UnknownTableError):
        store.check_and_set("nope", b"r", "l:a", None, b"x")
    with pytest.raises(UnknownTableError):
        list(store.scan("nope", None, None, [Read("d")]))


def test_unreachable_server_names_it() -> None:
    port = free_port()
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}"):
        open_store(f"hbase://127.0.0.1:{port}?timeout=2")


def test_server_that_goes_away_is_unavailable() -> None:
    # The test server, stopped for good (kill -9 and restarts of a real HBase and of its
    # Thrift server: test_hbase_real_faults.py).
    proc, hostport = start_test_server()
    try:
        s = open_store(f"hbase://{hostport}?table_prefix=gone")
        s.create_table("t", FAMILIES)
    finally:
        stop_process(proc)
    try:
        with pytest.raises(StoreUnavailable, match=hostport):
            s.read_rows("t", [b"r"], [Read("d")])
        with pytest.raises(StoreUnavailable, match=hostport):
            s.list_tables()
    finally:
        s.close()


def test_closed_store_is_unusable(hbase_thrift: str) -> None:
    s = open_store(hbase_store_url(hbase_thrift, "closed"))
    s.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        s.list_tables()


@pytest.mark.parametrize(
    "url",
    [
        "hbase://host:notaport",
        "hbase:///just/a/path",
        "hbase://host:9090/path",
        "hbase://host:9090?colour=blue",
        "hbase://host:9090?pool_size=0",
        "hbase://host:9090?timeout=soon",
        "hbase://host:9090?namespace=bad-ns",
        "hbase://host:9090?table_prefix=-x",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(InvalidArgument):
        open_store(url)


def test_missing_namespace_is_explained(hbase_thrift: str) -> None:
    ns = unique_name("nons")
    s = open_store(f"hbase://{hbase_thrift}?namespace={ns}")
    try:
        with pytest.raises(InvalidArgument, match="create_namespace"):
            s.create_table("t", FAMILIES)
    finally:
        s.close()


def test_namespace_and_prefix_place_the_tables(hbase_test_server: str) -> None:
    # The test server: it is started with a namespace (Thrift1 cannot create one).
    prefix = unique_name("ns")
    s = open_store(f"hbase://{hbase_test_server}?namespace=percolator_test&table_prefix={prefix}")
    try:
        s.create_table("t", FAMILIES)
        assert s.list_tables() == ["t"]
        s.mutate_rows("t", [Mutation(row=b"r", puts=[("d:a", 1, b"x")])])
        assert s.read_rows("t", [b"r"], [Read("d")]) == {b"r": {"d:a": [(1, b"x")]}}
        s.drop_table("t")
        assert s.list_tables() == []
    finally:
        s.close()
