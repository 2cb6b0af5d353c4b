"""The HBase store's Thrift2 side (``thrift2=host:port``) on a real HBase 2.6: the
conditional delete Thrift1 cannot say, and with it garbage collection that leaves no
FREE lock behind (docs/garbage-collection.md).

The session's HBase runs a Thrift2 server next to its Thrift1 server
(``tests/_hbase_local.py``); the Python test server has none, which is what the GC tests
on it check (the lock stays there).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import percolator
from percolator import InvalidArgument, StoreUnavailable, UnknownTableError
from percolator._internals import internals
from percolator._store import DELETE_IF, ConditionalDelete, Mutation, Read
from percolator.stores import open_store
from tests._hbase import hbase_store_url
from tests.stores.test_capabilities import check_declarations

pytestmark = pytest.mark.hbase

LOCK = "l:c:x"


@pytest.fixture
def url(hbase_thrift: str, hbase_thrift2: str, request: pytest.FixtureRequest) -> str:
    return hbase_store_url(hbase_thrift, request.node.name) + f"&thrift2={hbase_thrift2}"


@pytest.fixture
def store(url: str) -> Iterator[ConditionalDelete]:
    s = open_store(url)
    s.create_table("t", {"l": 1, "w": 0, "d": 0, "c": 0})
    yield s  # type: ignore[misc]
    s.drop_table("t")
    s.close()


def _lock(store: object, row: bytes) -> list[tuple[int, bytes]]:
    return store.read_rows("t", [row], [Read("l")]).get(row, {}).get(LOCK, [])  # type: ignore[attr-defined]


def test_the_store_declares_the_conditional_delete_only_with_a_thrift2_server(
    url: str, hbase_thrift: str,
) -> None:
    with_thrift2 = open_store(url)
    without = open_store(hbase_store_url(hbase_thrift, "plain"))
    try:
        assert DELETE_IF in with_thrift2.capabilities
        assert DELETE_IF not in without.capabilities
        assert isinstance(with_thrift2, ConditionalDelete)
        check_declarations(with_thrift2)  # declaring means implementing
    finally:
        with_thrift2.close()
        without.close()


def test_delete_if_removes_the_cell_only_while_it_holds_the_expected_value(
    store: ConditionalDelete,
) -> None:
    raw = store  # the same object, seen as a whole store
    raw.mutate_rows("t", [Mutation(b"r", puts=[(LOCK, 7, b"FREE:7")])])  # type: ignore[attr-defined]
    assert store.delete_if("t", b"r", LOCK, b"FREE:6") is False
    assert _lock(raw, b"r") == [(7, b"FREE:7")], "a different value: the cell stays"
    assert store.delete_if("t", b"r", LOCK, b"FREE:7") is True
    assert _lock(raw, b"r") == []
    assert store.delete_if("t", b"r", LOCK, b"FREE:7") is False, "absent: nothing to delete"


def test_delete_if_on_a_missing_table_or_a_bad_column_says_so(store: ConditionalDelete) -> None:
    with pytest.raises(UnknownTableError):
        store.delete_if("no_such_table", b"r", LOCK, b"FREE:1")
    with pytest.raises(InvalidArgument, match="family:qualifier"):
        store.delete_if("t", b"r", "nocolon", b"FREE:1")


def test_a_bad_or_unreachable_thrift2_address_fails_at_open(hbase_thrift: str) -> None:
    base = hbase_store_url(hbase_thrift, "bad")
    with pytest.raises(InvalidArgument, match="thrift2"):
        open_store(base + "&thrift2=nohostport")
    with pytest.raises(StoreUnavailable, match=r"Thrift2 server at 127\.0\.0\.1:1\b"):
        open_store(base + "&thrift2=127.0.0.1:1")


def test_a_pass_removes_deleted_cells_entirely_locks_included(url: str) -> None:
    with percolator.connect(url, safe_point_refresh=0.02) as c:
        c.create_table("g")
        rows = [b"r%02d" % i for i in range(10)]
        with percolator.Transaction(c) as txn:
            for row in rows:
                txn.set("g", row, "c:x", b"v")
        with percolator.Transaction(c) as txn:
            for row in rows:
                txn.delete("g", row, "c:x")
        with percolator.Transaction(c) as txn:
            txn.set("g", b"kept", "c:x", b"v")
        summary = c.gc(retention=0)
        assert summary.cells_removed == len(rows)
        left = dict(internals(c).store.scan("g", None, None, [Read("l"), Read("w")]))
        assert list(left) == [b"kept"], "only the live cell has a lock and records left"
        with percolator.Transaction(c) as txn:  # a removed cell is written again
            txn.set("g", rows[0], "c:x", b"again")
        assert percolator.Snapshot(c).get("g", rows[0], "c:x") == b"again"
        internals(c).store.drop_table("g")


# ---- the Thrift2 data path (api=thrift2) -------------------------------------------


def test_api_selects_the_gateway_and_a_wrong_port_or_value_says_what_to_do(
    hbase_thrift: str, hbase_thrift2: str,
) -> None:
    from percolator.stores._hbase_thrift2 import HBaseThrift2Store
    from percolator.stores.hbase import HBaseStore

    thrift2 = open_store(hbase_store_url(hbase_thrift2, "api", api="thrift2"))
    thrift1 = open_store(hbase_store_url(hbase_thrift, "api"))
    try:
        assert type(thrift2) is HBaseThrift2Store and type(thrift1) is HBaseStore
        assert thrift2.atomic_row_cas and not thrift1.atomic_row_cas
        assert "api=thrift2" in thrift2.url and "api=" not in thrift1.url
        reopened = open_store(thrift2.url)  # the url names the gateway
        assert type(reopened) is HBaseThrift2Store
        reopened.close()
    finally:
        thrift2.close()
        thrift1.close()
    with pytest.raises(InvalidArgument, match="is HBase's Thrift1 server"):
        open_store(hbase_store_url(hbase_thrift, "api", api="thrift2"))
    with pytest.raises(InvalidArgument, match=r"api='thrift3'.*must be one of"):
        open_store(f"hbase://{hbase_thrift2}?api=thrift3")
    with pytest.raises(InvalidArgument, match="drop the option"):
        open_store(f"hbase://{hbase_thrift2}?api=thrift2&thrift2={hbase_thrift2}")
    with pytest.raises(StoreUnavailable, match=r"Thrift2 server at 127\.0\.0\.1:1\b"):
        open_store("hbase://127.0.0.1:1?api=thrift2&timeout=2")


def test_gc_on_the_thrift2_store_removes_deleted_cells_entirely(
    hbase_thrift2: str, request: pytest.FixtureRequest,
) -> None:
    url = hbase_store_url(hbase_thrift2, request.node.name, api="thrift2")
    with percolator.connect(url, safe_point_refresh=0.02) as c:
        c.create_table("g")
        with percolator.Transaction(c) as txn:
            txn.set("g", b"gone", "c:x", b"v")
        with percolator.Transaction(c) as txn:
            txn.delete("g", b"gone", "c:x")
        assert c.gc(retention=0).cells_removed == 1
        assert list(internals(c).store.scan("g", None, None, [Read("l"), Read("w")])) == []
        internals(c).store.drop_table("g")
