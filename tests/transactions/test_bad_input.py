"""Bad input gets a specific error with a clear message, and nothing is written."""

from __future__ import annotations

from typing import Any

import pytest

import percolator
from percolator import Cluster, Transaction
from percolator._internals import internals
from percolator._observer_hooks import internal_columns


@pytest.fixture
def db(sqlite_cluster: Cluster) -> Cluster:
    sqlite_cluster.create_table("t")
    return sqlite_cluster


def _nothing_written(db: Cluster) -> None:
    assert list(Transaction(db).scan("t")) == []
    assert list(internals(db).store.scan("t", None, None, [percolator._store.Read("l")])) == []


BAD_SETS: list[tuple[tuple[Any, ...], type[Exception], str]] = [
    (("t", "alice", "c:q", b"v"), percolator.InvalidArgument, "row must be bytes"),
    (("t", b"", "c:q", b"v"), percolator.InvalidArgument, "row must not be empty"),
    (("t", b"r", "cq", b"v"), percolator.InvalidArgument, "expected 'family:qualifier'"),
    (("t", b"r", ":q", b"v"), percolator.InvalidArgument, "'family:qualifier'"),
    (("t", b"r", "c:", b"v"), percolator.InvalidArgument, "'family:qualifier'"),
    (("t", b"r", "c d:q", b"v"), percolator.InvalidArgument, "bad column family"),
    (("t", b"r", "_ack:q", b"v"), percolator.InvalidArgument, "reserved"),
    (("t", b"r", "c:q\n", b"v"), percolator.InvalidArgument, "control characters"),
    (("t", b"r", b"c:q", b"v"), percolator.InvalidArgument, "column must be a str"),
    (("t", b"r", ["c:q"], b"v"), percolator.InvalidArgument, "column must be a str"),
    (("t", b"r", "c:q", "v"), percolator.InvalidArgument, "value must be bytes"),
    (("t", b"r", "c:q", None), percolator.InvalidArgument, "value must be bytes"),
    (("nope", b"r", "c:q", b"v"), percolator.UnknownTableError, "create_table('nope')"),
    ((1, b"r", "c:q", b"v"), percolator.InvalidArgument, "table must be a str"),
    (("bad/name", b"r", "c:q", b"v"), percolator.InvalidArgument, "bad table name"),
    (
        ("t", b"r" * (percolator.MAX_ROW_BYTES + 1), "c:q", b"v"),
        percolator.ValueTooLargeError,
        "over the limit",
    ),
    (
        ("t", b"r", "c:q", b"v" * (percolator.MAX_VALUE_BYTES + 1)),
        percolator.ValueTooLargeError,
        "over the limit of 4194304 bytes",
    ),
]
"""set's arguments, each bad in one way, with the error and a quote of its message."""


def _match(quote: str) -> str:
    return quote.replace("(", r"\(").replace(")", r"\)")


@pytest.mark.parametrize(("args", "error", "quote"), BAD_SETS)
def test_bad_set_is_refused_at_the_door(
    db: Cluster, args: tuple[Any, ...], error: type[Exception], quote: str
) -> None:
    with Transaction(db) as txn:
        txn.set("t", b"good", "c:q", b"kept?")
        with pytest.raises(error, match=_match(quote)):
            txn.set(*args)
        txn.rollback()
    _nothing_written(db)


@pytest.mark.parametrize(("args", "error", "quote"),
                         [case for case in BAD_SETS if case[0][3] == b"v"])
def test_bad_get_is_refused_at_the_door(
    db: Cluster, args: tuple[Any, ...], error: type[Exception], quote: str
) -> None:
    """get refuses a bad table, row or column as set does, with set's error: get tests
    _check_cell's usual case in line, and whatever that test lets through must be
    exactly what _check_cell accepts."""
    for reader in (Transaction(db), percolator.Snapshot(db)):
        with pytest.raises(error, match=_match(quote)):
            reader.get(*args[:3])


def test_errors_share_one_root() -> None:
    for name in percolator.__all__:
        obj = getattr(percolator, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, percolator.PercolatorError), name
    assert issubclass(percolator.InvalidArgument, ValueError)


def test_reads_validate_too(db: Cluster) -> None:
    txn = Transaction(db)
    with pytest.raises(percolator.UnknownTableError):
        txn.get("missing", b"r", "c:q")
    with pytest.raises(percolator.InvalidArgument, match="list of 'family:qualifier'"):
        txn.get_row("t", b"r", "c:q")
    with pytest.raises(percolator.InvalidArgument, match="start must be bytes"):
        txn.scan("t", start="a")
    with pytest.raises(percolator.InvalidArgument,
                       match=r"^stop must be bytes or None, got int: 7$"):
        txn.scan("t", stop=7)  # type: ignore[arg-type]


def test_closed_transaction(db: Cluster) -> None:
    """Its message and its repr name it by its start timestamp."""
    txn = Transaction(db)
    txn.set("t", b"r", "c:q", b"v")
    assert repr(txn) == f"<percolator.Transaction start_ts={txn.start_ts} open>"
    assert txn.closed is False
    txn.commit()
    assert repr(txn) == f"<percolator.Transaction start_ts={txn.start_ts} closed>"
    assert txn.closed is True
    for call in (
        lambda: txn.get("t", b"r", "c:q"),
        lambda: txn.set("t", b"r", "c:q", b"w"),
        lambda: txn.commit(),
        lambda: txn.scan("t"),
    ):
        closed = (rf"^transaction {txn.start_ts} is already closed \(committed, rolled back "
                  r"or closed\); start a new one$")
        with pytest.raises(percolator.TransactionClosedError, match=closed):
            call()
    assert Transaction(db).get("t", b"r", "c:q") == b"v"
    with percolator.Snapshot(db) as snapshot:
        assert repr(snapshot) == f"<percolator.Snapshot start_ts={snapshot.start_ts} open>"
    assert repr(snapshot) == f"<percolator.Snapshot start_ts={snapshot.start_ts} closed>"
    with pytest.raises(percolator.TransactionClosedError) as closed_snapshot:
        snapshot.get("t", b"r", "c:q")
    assert str(closed_snapshot.value) == (
        f"snapshot {snapshot.start_ts} is already closed; open a new one "
        "(percolator.Snapshot(cluster), or Snapshot(cluster, start_ts) to read the same "
        "state again)")


def test_reserved_families_are_read_only_where_internal_columns_are_on(db: Cluster) -> None:
    """``get``, ``get_row``, ``get_rows`` and ``scan`` of a ``_`` family (the observers'
    acknowledgements) are refused, and read once ``internal_columns`` is on for the
    transaction, as an observer run's is on request."""
    writer = Transaction(db)
    internal_columns(writer, True)
    writer.set("t", b"r", "_ack:q", b"v")
    writer.set("t", b"r", "c:v", b"user")
    writer.commit()
    reader = Transaction(db)
    # A scan of every column shows the user's only.
    assert list(reader.scan("t")) == [(b"r", {"c:v": b"user"})]
    reads = (
        lambda: reader.get("t", b"r", "_ack:q"),
        lambda: reader.get_row("t", b"r", ["_ack:q"]).get("_ack:q"),
        lambda: reader.get_rows("t", [b"r"], ["_ack:q"])[b"r"].get("_ack:q"),
        lambda: dict(reader.scan("t", columns=["_ack:q"]))[b"r"].get("_ack:q"),
    )
    for read in reads:
        with pytest.raises(percolator.InvalidArgument, match="reserved"):
            read()
    internal_columns(reader, True)
    assert [read() for read in reads] == [b"v"] * len(reads)
    assert list(reader.scan("t")) == [(b"r", {"_ack:q": b"v", "c:v": b"user"})]


def test_bad_urls_and_options(tmp_path: Any) -> None:
    with pytest.raises(percolator.InvalidArgument, match="unknown store url"):
        percolator.connect("mysql://localhost/db")
    with pytest.raises(percolator.InvalidArgument, match="absolute"):
        percolator.connect("sqlite://relative.db")
    with pytest.raises(percolator.InvalidArgument, match="store url must be a str"):
        percolator.connect(None)  # type: ignore[arg-type]
    with pytest.raises(percolator.StoreUnavailable, match="does not exist"):
        percolator.connect(f"sqlite:///{tmp_path}/no/such/dir/x.db")
    with pytest.raises(percolator.InvalidArgument, match="lock_ttl"):
        percolator.connect(f"sqlite:///{tmp_path}/x.db", lock_ttl=-1)
    with pytest.raises(percolator.InvalidArgument,
                       match=r"^a transaction needs a percolator\.Cluster, got str$"):
        Transaction("sqlite:///x.db")  # type: ignore[arg-type]


def test_closed_cluster(tmp_path: Any) -> None:
    cluster = percolator.connect(f"sqlite:///{tmp_path}/x.db")
    cluster.close()
    with pytest.raises(percolator.PercolatorError, match="closed"):
        Transaction(cluster)


def test_an_unhashable_column_is_refused_by_name_on_reads(db: Cluster) -> None:
    # The columns already checked are kept in a set: a list must not reach that lookup
    # (it raised TypeError: unhashable type).
    with Transaction(db) as txn:
        with pytest.raises(percolator.InvalidArgument, match="column must be a str"):
            txn.get("t", b"r", ["c:q"])  # type: ignore[arg-type]
        with pytest.raises(percolator.InvalidArgument, match="column must be a str"):
            txn.get_row("t", b"r", [["c:q"]])  # type: ignore[list-item]
