"""HBase Thrift1 semantics the hbase backend relies on, checked through happybase and
the raw Thrift client as a user would.

Each runs twice: against a real HBase (``hbase_thrift``: the standalone HBase the suite
starts, or ``PERCOLATOR_HBASE_THRIFT``) and against ``tests/hbase_thrift_server``, so
the test server, which the fault tests still use, is held to the same expectations as
HBase itself. Each test cites what it checks: the HBase Reference
Guide (https://hbase.apache.org/book.html), the Javadoc, the comments of ``Hbase.thrift``
or the Thrift1 handler (``ThriftHBaseServiceHandler``, ``ThriftServerRunner`` in 1.x).
"""

from __future__ import annotations

import struct
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from thriftpy2.thrift import TApplicationException

from tests._hbase import is_real_hbase, unique_name

pytestmark = pytest.mark.hbase

try:  # a missing client fails in CI and skips elsewhere, through the hbase_thrift fixture
    import happybase
except ImportError:  # pragma: no cover - depends on the environment
    happybase = None

hb: Any = sys.modules.get("Hbase_thrift")


@pytest.fixture(params=["hbase", "test-server"])
def server(request: pytest.FixtureRequest) -> str:
    """Which server: a real HBase, or the Python test server."""
    return str(request.param)


@pytest.fixture
def conn(server: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    hostport = request.getfixturevalue("hbase_thrift" if server == "hbase" else "hbase_test_server")
    host, _, port = hostport.rpartition(":")
    connection = happybase.Connection(host, int(port))
    yield connection
    connection.close()


@pytest.fixture
def name(conn: Any, request: pytest.FixtureRequest) -> Iterator[bytes]:
    """A fresh table: f keeps 3 versions, g 1, h all; dropped afterwards."""
    table = unique_name(request.node.name)
    conn.create_table(
        table,
        {"f": {"max_versions": 3}, "g": {"max_versions": 1}, "h": {"max_versions": 2**31 - 1}},
    )
    yield table.encode()
    conn.delete_table(table, disable=True)


def cells(conn: Any, name: bytes, row: bytes, column: bytes) -> list[tuple[int, bytes]]:
    return [(c.timestamp, c.value) for c in conn.client.getVer(name, row, column, 100, {})]


def put(conn: Any, name: bytes, row: bytes, column: bytes, value: bytes, ts: int) -> None:
    conn.client.mutateRowTs(name, row, [hb.Mutation(column=column, value=value)], ts, {})


# ---- versions ---------------------------------------------------------------------


def test_family_keeps_its_newest_max_versions(conn: Any, name: bytes) -> None:
    """Reference Guide, "Versions": a column family keeps at most VERSIONS versions;
    the oldest are the ones dropped ("Maximum Number of Versions")."""
    for ts in (2, 5, 1, 4, 3):
        put(conn, name, b"r", b"f:a", b"v%d" % ts, ts)
        put(conn, name, b"r", b"g:a", b"v%d" % ts, ts)
    assert cells(conn, name, b"r", b"f:a") == [(5, b"v5"), (4, b"v4"), (3, b"v3")]
    assert cells(conn, name, b"r", b"g:a") == [(5, b"v5")]


def test_versions_are_returned_newest_first(conn: Any, name: bytes) -> None:
    """Reference Guide, "Versions": "the versions are sorted from newest to oldest";
    happybase ``Table.cells`` documents the same order."""
    for ts in (10, 30, 20):
        put(conn, name, b"r", b"h:a", b"%d" % ts, ts)
    table = conn.table(name)
    assert table.cells(b"r", b"h:a", include_timestamp=True) == [
        (b"30", 30),
        (b"20", 20),
        (b"10", 10),
    ]
    assert table.cells(b"r", b"h:a", versions=2) == [b"30", b"20"]


def test_put_at_an_existing_timestamp_overwrites_it(conn: Any, name: bytes) -> None:
    """Reference Guide, "Versions" > "Put": to overwrite an existing value, do a put at
    exactly the same row, column, and version as the cell to overwrite."""
    put(conn, name, b"r", b"h:a", b"first", 7)
    put(conn, name, b"r", b"h:a", b"second", 7)
    assert cells(conn, name, b"r", b"h:a") == [(7, b"second")]


def test_put_without_timestamp_uses_server_time(conn: Any, name: bytes) -> None:
    """Reference Guide, "Versions" > "Implicit Version Example": without an explicit
    version the region server uses its current time in milliseconds."""
    conn.table(name).put(b"r", {b"h:a": b"x"})
    [(ts, _)] = cells(conn, name, b"r", b"h:a")
    assert ts > 10**12  # milliseconds since the epoch, not a small logical number


# ---- time ranges -------------------------------------------------------------------


def test_ts_reads_use_an_exclusive_upper_bound(conn: Any, name: bytes) -> None:
    """``getRowWithColumnsTs``/``getRowsWithColumnsTs``/``getVerTs`` build the Get with
    ``setTimeRange(0, timestamp)`` (ThriftHBaseServiceHandler) and ``TimeRange`` is
    ``[minStamp, maxStamp)`` (TimeRange Javadoc), although the comment in Hbase.thrift
    says "less than or equal": a cell at exactly *timestamp* is not returned."""
    for ts in (3, 5, 8):
        put(conn, name, b"r", b"h:a", b"%d" % ts, ts)
    client = conn.client
    [row] = client.getRowWithColumnsTs(name, b"r", [b"h:a"], 5, {})
    assert row.columns[b"h:a"].timestamp == 3
    [row] = client.getRowWithColumnsTs(name, b"r", [b"h:a"], 6, {})
    assert row.columns[b"h:a"].timestamp == 5
    assert client.getRowWithColumnsTs(name, b"r", [b"h:a"], 3, {}) == []
    assert [c.timestamp for c in client.getVerTs(name, b"r", b"h:a", 8, 10, {})] == [5, 3]
    [row] = client.getRowsWithColumnsTs(name, [b"r"], [b"h"], 9, {})
    assert row.columns[b"h:a"].timestamp == 8


def test_row_reads_return_only_the_newest_version_per_column(conn: Any, name: bytes) -> None:
    """Thrift1 ``getRow*`` and scanners build a Get/Scan with the default of one version
    (Get/Scan Javadoc: "by default only the latest version is returned")."""
    for ts in (1, 2):
        put(conn, name, b"r", b"h:a", b"%d" % ts, ts)
        put(conn, name, b"r", b"h:b", b"%d" % ts, ts)
    [row] = conn.client.getRow(name, b"r", {})
    assert {k: (c.timestamp, c.value) for k, c in row.columns.items()} == {
        b"h:a": (2, b"2"),
        b"h:b": (2, b"2"),
    }
    assert [c.value for c in conn.client.get(name, b"r", b"h:a", {})] == [b"2"]


def test_get_rows_omits_rows_without_cells(conn: Any, name: bytes) -> None:
    """ThriftUtilities.rowResultFromHBase skips empty Results."""
    put(conn, name, b"b", b"f:a", b"x", 1)
    rows = conn.client.getRowsWithColumns(name, [b"a", b"b", b"c"], [b"f"], {})
    assert [r.row for r in rows] == [b"b"]


def test_column_after_family_narrows_the_get(conn: Any, name: bytes) -> None:
    """Get Javadoc: ``addColumn`` "overrides previous calls to addFamily for this
    family"; ``addFamily`` "overrides previous calls to addColumn for this family"."""
    put(conn, name, b"r", b"f:a", b"1", 1)
    put(conn, name, b"r", b"f:b", b"2", 1)
    [row] = conn.client.getRowWithColumns(name, b"r", [b"f", b"f:a"], {})
    assert set(row.columns) == {b"f:a"}
    [row] = conn.client.getRowWithColumns(name, b"r", [b"f:a", b"f"], {})
    assert set(row.columns) == {b"f:a", b"f:b"}


def test_qualifier_may_contain_colons(conn: Any, name: bytes) -> None:
    """``CellUtil.parseColumn`` splits ``family:qualifier`` at the first colon."""
    put(conn, name, b"r", b"h:doc:contents", b"x", 4)
    [row] = conn.client.getRowWithColumns(name, b"r", [b"h:doc:contents"], {})
    assert row.columns[b"h:doc:contents"].value == b"x"


# ---- deletes -----------------------------------------------------------------------


def test_delete_all_ts_deletes_versions_at_or_below(conn: Any, name: bytes) -> None:
    """Hbase.thrift ``deleteAllTs``: "Delete all cells that match the passed row and
    column and whose timestamp is equal-to or older than the passed timestamp"
    (``Delete.addColumns``)."""
    for ts in (1, 2, 3, 4):
        put(conn, name, b"r", b"h:a", b"%d" % ts, ts)
    put(conn, name, b"r", b"h:b", b"other", 1)
    conn.client.deleteAllTs(name, b"r", b"h:a", 3, {})
    assert cells(conn, name, b"r", b"h:a") == [(4, b"4")]
    assert cells(conn, name, b"r", b"h:b") == [(1, b"other")]


def test_deletes_mask_later_puts_at_or_below_them(conn: Any, name: bytes) -> None:
    """Reference Guide, "Current Limitations" > "Deletes mask Puts": a put with a
    timestamp at or below a delete marker is hidden even if it is written later."""
    put(conn, name, b"r", b"h:a", b"old", 5)
    conn.client.deleteAllTs(name, b"r", b"h:a", 10, {})
    put(conn, name, b"r", b"h:a", b"masked", 8)
    put(conn, name, b"r", b"h:a", b"visible", 11)
    assert cells(conn, name, b"r", b"h:a") == [(11, b"visible")]


def test_mutate_rows_ts_applies_puts_then_deletes(conn: Any, name: bytes) -> None:
    """ThriftHBaseServiceHandler.mutateRowsTs runs ``table.put(puts)`` then
    ``table.delete(deletes)``, with the call's timestamp for both: a put and a delete
    of the same column in one call leave nothing."""
    batch = hb.BatchMutation(
        row=b"r",
        mutations=[
            hb.Mutation(column=b"h:a", value=b"x"),
            hb.Mutation(isDelete=True, column=b"h:a"),
            hb.Mutation(column=b"h:b", value=b"y"),
        ],
    )
    conn.client.mutateRowsTs(name, [batch], 5, {})
    assert cells(conn, name, b"r", b"h:a") == []
    assert cells(conn, name, b"r", b"h:b") == [(5, b"y")]


def test_mutate_rows_ts_delete_is_at_or_below_the_timestamp(conn: Any, name: bytes) -> None:
    """mutateRowsTs turns ``isDelete`` into ``Delete.addColumns(family, qualifier, ts)``:
    every version at or below *ts* (Delete Javadoc)."""
    for ts in (3, 6):
        put(conn, name, b"r", b"h:a", b"%d" % ts, ts)
    batch = hb.BatchMutation(row=b"r", mutations=[hb.Mutation(isDelete=True, column=b"h:a")])
    conn.client.mutateRowsTs(name, [batch], 5, {})
    assert cells(conn, name, b"r", b"h:a") == [(6, b"6")]


def test_put_of_a_family_without_qualifier_is_refused(conn: Any, name: bytes) -> None:
    """mutateRowsTs: "Invalid famAndQf provided.", an IllegalArgumentException HBase 2.6
    throws outside the handler's catch, so the answer is Thrift's internal error (seen
    on 2.6.1; the store refuses such columns before sending them)."""
    batch = hb.BatchMutation(row=b"r", mutations=[hb.Mutation(column=b"h", value=b"x")])
    with pytest.raises(TApplicationException):
        conn.client.mutateRowsTs(name, [batch], 5, {})


# ---- checkAndPut -------------------------------------------------------------------


def check_and_put(conn: Any, name: bytes, expected: bytes | None, new: bytes) -> bool:
    mput = hb.Mutation(column=b"g:lock", value=new)
    return bool(conn.client.checkAndPut(name, b"r", b"g:lock", expected, mput, {}))


def test_check_and_put_without_value_means_column_must_not_exist(conn: Any, name: bytes) -> None:
    """Hbase.thrift ``checkAndPut``: "if not provided the check is for the
    non-existence of the column in question"."""
    assert check_and_put(conn, name, None, b"one")
    assert not check_and_put(conn, name, None, b"two")
    assert [v for _, v in cells(conn, name, b"r", b"g:lock")] == [b"one"]


def test_check_and_put_compares_with_the_latest_value(conn: Any, name: bytes) -> None:
    """Table.checkAndMutate Javadoc: the put is applied only if the current value
    equals the expected one."""
    assert check_and_put(conn, name, None, b"one")
    assert not check_and_put(conn, name, b"other", b"two")
    assert check_and_put(conn, name, b"one", b"two")
    assert not check_and_put(conn, name, b"one", b"three")
    assert [v for _, v in cells(conn, name, b"r", b"g:lock")] == [b"two"]


def test_check_and_put_treats_empty_as_absent(conn: Any, name: bytes) -> None:
    """The handler passes a missing value as an empty array and HRegion.checkAndMutate
    matches an empty expected value against a missing cell *or* an empty one."""
    assert check_and_put(conn, name, b"", b"")
    assert check_and_put(conn, name, None, b"full")
    assert not check_and_put(conn, name, b"", b"again")


def test_check_and_put_writes_at_server_time_never_below_the_checked_cell(
    conn: Any, name: bytes
) -> None:
    """checkAndPut builds its Put with HConstants.LATEST_TIMESTAMP (server time), and
    HRegion.checkAndMutate writes it at ``max(now, timestamp of the checked cell)``
    "to ensure the write is not eclipsed" (HBASE-14054)."""
    assert check_and_put(conn, name, None, b"one")
    [(ts, _)] = cells(conn, name, b"r", b"g:lock")
    assert ts > 10**12
    future = int(time.time() * 1000) + 10**9
    put(conn, name, b"r", b"g:lock", b"future", future)
    assert check_and_put(conn, name, b"future", b"after")
    assert cells(conn, name, b"r", b"g:lock") == [(future, b"after")]


# ---- atomicIncrement ---------------------------------------------------------------


def test_atomic_increment_counts_from_absent_in_an_8_byte_long(conn: Any, name: bytes) -> None:
    """Hbase.thrift ``atomicIncrement`` is ``Table.incrementColumnValue`` (happybase
    ``counter_inc``): an absent cell counts as 0, the sum is returned and stored as
    ``Bytes.toBytes(long)``, 8 bytes big-endian."""
    table = conn.table(name)
    assert table.counter_inc(b"r", b"g:n") == 1
    assert table.counter_inc(b"r", b"g:n", 41) == 42
    assert table.counter_dec(b"r", b"g:n", 50) == -8
    assert conn.client.atomicIncrement(name, b"r", b"g:n", 0) == -8
    assert [v for _, v in cells(conn, name, b"r", b"g:n")] == [struct.pack(">q", -8)]
    assert table.counter_get(b"r", b"g:n") == -8
    assert table.counter_inc(b"other", b"g:n") == 1


def test_atomic_increment_of_a_cell_that_is_no_long_is_an_io_error(
    conn: Any, name: bytes
) -> None:
    """HRegion.getLongValue: ``DoNotRetryIOException("Field is not a long, it's " + len
    + " bytes wide")``, which the handler returns as an ``IOError``; nothing is written."""
    put(conn, name, b"r", b"f:s", b"abc", 5)
    with pytest.raises(hb.IOError, match="Field is not a long, it's 3 bytes wide"):
        conn.client.atomicIncrement(name, b"r", b"f:s", 1)
    assert cells(conn, name, b"r", b"f:s") == [(5, b"abc")]


def test_atomic_increment_writes_after_the_previous_cell(conn: Any, name: bytes) -> None:
    """HRegion.reckonDelta: the sum is written at ``max(timestamp of the current cell + 1,
    now)``, so it never lands at or below the cell it read; a new counter at ``now``."""
    before = int(time.time() * 1000)
    assert conn.client.atomicIncrement(name, b"r", b"f:n", 1) == 1
    [(first, _)] = cells(conn, name, b"r", b"f:n")
    assert before <= first <= int(time.time() * 1000)
    future = int(time.time() * 1000) + 10**9
    put(conn, name, b"r", b"f:n", struct.pack(">q", 7), future)
    assert conn.client.atomicIncrement(name, b"r", b"f:n", 1) == 8
    assert cells(conn, name, b"r", b"f:n") == [
        (future + 1, struct.pack(">q", 8)),
        (future, struct.pack(">q", 7)),
        (first, struct.pack(">q", 1)),
    ]


# ---- tables ------------------------------------------------------------------------


def test_create_existing_table_raises_already_exists(conn: Any, name: bytes) -> None:
    """Hbase.thrift ``createTable``: "throws AlreadyExists if table name already in use"."""
    with pytest.raises(hb.AlreadyExists):
        conn.client.createTable(name, [hb.ColumnDescriptor(name=b"f:")])


def test_column_descriptors_carry_max_versions(conn: Any, name: bytes) -> None:
    """getColumnDescriptors returns each family as ``family:`` with its maxVersions."""
    descriptors = conn.client.getColumnDescriptors(name)
    assert {k: d.maxVersions for k, d in descriptors.items()} == {
        b"f:": 3,
        b"g:": 1,
        b"h:": 2**31 - 1,
    }


def test_family_settings_are_kept_as_sent(conn: Any, request: pytest.FixtureRequest) -> None:
    """``ThriftUtilities.colDescFromThrift``/``colDescFromHbase``: compression, in-memory,
    bloom filter, block cache and time to live round-trip (a TTL <= 0 is FOREVER)."""
    table = unique_name(request.node.name).encode()
    conn.client.createTable(table, [
        hb.ColumnDescriptor(name=b"f:", maxVersions=5, compression="GZ", inMemory=True,
                            bloomFilterType="ROW", blockCacheEnabled=True, timeToLive=-1),
        hb.ColumnDescriptor(name=b"g:", maxVersions=1, timeToLive=60),
    ])
    try:
        got = conn.client.getColumnDescriptors(table)
        f, g = got[b"f:"], got[b"g:"]
        assert (f.maxVersions, f.compression, f.inMemory, f.bloomFilterType,
                f.blockCacheEnabled, f.timeToLive) == (5, b"GZ", True, b"ROW", True, 2**31 - 1)
        assert (g.maxVersions, g.timeToLive, g.bloomFilterType) == (1, 60, b"NONE")
    finally:
        conn.delete_table(table, disable=True)


def test_unknown_compression_or_bloom_type_is_refused(
    conn: Any, request: pytest.FixtureRequest
) -> None:
    """``Compression.getCompressionAlgorithmByName`` and ``BloomType.valueOf`` throw
    IllegalArgumentException, which ``createTable`` answers as IllegalArgument."""
    table = unique_name(request.node.name).encode()
    for bad in (hb.ColumnDescriptor(name=b"f:", compression="NOSUCH"),
                hb.ColumnDescriptor(name=b"f:", bloomFilterType="NOSUCH")):
        with pytest.raises(hb.IllegalArgument):
            conn.client.createTable(table, [bad])
    assert table not in conn.client.getTableNames()


def test_cells_older_than_the_ttl_are_gone(conn: Any, request: pytest.FixtureRequest) -> None:
    """Reference Guide, "Time To Live (TTL)": a cell whose timestamp (milliseconds) is
    older than the family's TTL is not returned, so small logical timestamps are."""
    table = unique_name(request.node.name).encode()
    conn.client.createTable(table, [hb.ColumnDescriptor(name=b"f:", timeToLive=3600)])
    try:
        now_ms = int(time.time() * 1000)
        put(conn, table, b"r", b"f:old", b"v", 5)
        put(conn, table, b"r", b"f:new", b"v", now_ms)
        assert cells(conn, table, b"r", b"f:old") == []
        assert cells(conn, table, b"r", b"f:new") == [(now_ms, b"v")]
    finally:
        conn.delete_table(table, disable=True)


def test_delete_table_requires_disable(conn: Any, request: pytest.FixtureRequest) -> None:
    """Reference Guide, HBase shell "drop": "the table must be disabled first"
    (Admin.deleteTable throws TableNotDisabledException)."""
    table = unique_name(request.node.name).encode()
    conn.client.createTable(table, [hb.ColumnDescriptor(name=b"f:")])
    with pytest.raises(hb.IOError):
        conn.client.deleteTable(table)
    assert conn.client.isTableEnabled(table)
    conn.client.disableTable(table)
    assert not conn.client.isTableEnabled(table)
    conn.client.deleteTable(table)
    assert table not in conn.client.getTableNames()


def test_unknown_table_and_family_are_io_errors(conn: Any, name: bytes) -> None:
    """Reads and writes of a missing table fail with TableNotFoundException, of a missing
    family with NoSuchColumnFamilyException, both sent as IOError."""
    missing = unique_name("missing").encode()
    with pytest.raises(hb.IOError, match="TableNotFoundException"):
        conn.client.getRow(missing, b"r", {})
    # A batch names the missing table only as its failed actions' cause (HBase 2.6.1):
    # the store recognises this form (hbase._batch_failed_on_missing_table).
    batches = [
        hb.BatchMutation(row=r, mutations=[hb.Mutation(column=b"f:a")]) for r in (b"a", b"b")
    ]
    with pytest.raises(hb.IOError) as raised:
        conn.client.mutateRowsTs(missing, batches, 1, {})
    assert (f"RetriesExhaustedWithDetailsException: Failed 2 actions: {missing.decode()}: "
            "2 times") in raised.value.message.decode()
    with pytest.raises(hb.IOError):
        conn.client.getRowWithColumns(name, b"r", [b"nosuch:a"], {})


def test_table_names_are_sorted(conn: Any, name: bytes, request: pytest.FixtureRequest) -> None:
    """Admin.listTableNames returns TableNames in their natural (sorted) order."""
    other = unique_name("a" + request.node.name)
    conn.create_table(other, {"f": {}})
    try:
        names = conn.client.getTableNames()
        assert names == sorted(names)
        assert name in names and other.encode() in names
    finally:
        conn.delete_table(other, disable=True)


def test_table_in_a_missing_namespace_cannot_be_created(conn: Any) -> None:
    """Reference Guide, "Namespace": a table is created in an existing namespace;
    otherwise NamespaceNotFoundException (IOError)."""
    table = b"nosuchns_" + unique_name("x").encode() + b":t"
    with pytest.raises(hb.IOError):
        conn.client.createTable(table, [hb.ColumnDescriptor(name=b"f:")])


def test_table_in_a_namespace_is_listed_with_it(conn: Any, server: str) -> None:
    """Reference Guide, "Namespace": tables outside ``default`` are named ``ns:table``."""
    if server == "hbase" and is_real_hbase():
        pytest.skip("needs the namespace the test server creates (Thrift1 cannot make one)")
    table = b"percolator_test:" + unique_name("ns").encode()
    conn.client.createTable(table, [hb.ColumnDescriptor(name=b"f:")])
    assert table in conn.client.getTableNames()
    conn.client.disableTable(table)
    conn.client.deleteTable(table)


# ---- scanners ----------------------------------------------------------------------


def fill_rows(conn: Any, name: bytes) -> None:
    for key in (b"a", b"b", b"c", b"d"):
        put(conn, name, key, b"f:x", key, 1)
    put(conn, name, b"b", b"h:y", b"hy", 2)
    put(conn, name, b"c", b"h:z", b"hz", 3)


def test_scan_start_is_inclusive_stop_is_exclusive(conn: Any, name: bytes) -> None:
    """Scan Javadoc: ``withStartRow`` is inclusive, ``withStopRow`` exclusive."""
    fill_rows(conn, name)
    table = conn.table(name)
    assert [k for k, _ in table.scan(row_start=b"b", row_stop=b"d")] == [b"b", b"c"]
    assert [k for k, _ in table.scan(row_start=b"c")] == [b"c", b"d"]
    assert [k for k, _ in table.scan(row_start=b"c", row_stop=b"b")] == []


def test_scan_from_a_row_to_itself_reads_that_row(conn: Any, name: bytes) -> None:
    """Scan.isGetScan: start == stop is read as a Get of that row, not an empty range
    (seen on HBase 2.6.1; the store returns nothing for such a range without asking)."""
    fill_rows(conn, name)
    table = conn.table(name)
    assert [k for k, _ in table.scan(row_start=b"b", row_stop=b"b")] == [b"b"]


def test_scan_columns_select_families_or_columns(conn: Any, name: bytes) -> None:
    """Scan.addFamily / Scan.addColumn; rows with no selected cell are not returned."""
    fill_rows(conn, name)
    table = conn.table(name)
    assert list(table.scan(columns=[b"h"])) == [(b"b", {b"h:y": b"hy"}), (b"c", {b"h:z": b"hz"})]
    assert list(table.scan(columns=[b"h:z"])) == [(b"c", {b"h:z": b"hz"})]


def test_scan_timestamp_is_an_exclusive_upper_bound(conn: Any, name: bytes) -> None:
    """scannerOpenWithScan: ``scan.setTimeRange(0, tScan.getTimestamp())``."""
    fill_rows(conn, name)
    table = conn.table(name)
    assert [k for k, _ in table.scan(columns=[b"h"], timestamp=3)] == [b"b"]


def test_scanner_get_list_pages_then_returns_empty(conn: Any, name: bytes) -> None:
    """Hbase.thrift ``scannerGetList``: "Returns, starting at the scanner's current
    row value, nbRows worth of rows"; an empty list once the scanner is exhausted; a
    closed or unknown scanner is an IllegalArgument ("scanner ID is invalid")."""
    fill_rows(conn, name)
    client = conn.client
    scanner = client.scannerOpenWithScan(name, hb.TScan(columns=[b"f"], caching=3), {})
    assert [r.row for r in client.scannerGetList(scanner, 3)] == [b"a", b"b", b"c"]
    assert [r.row for r in client.scannerGetList(scanner, 3)] == [b"d"]
    assert client.scannerGetList(scanner, 3) == []
    client.scannerClose(scanner)
    with pytest.raises(hb.IllegalArgument):
        client.scannerGetList(scanner, 1)
