"""``observers._changes.TableChanges``: another table's committed changes read pass by
pass from a position, which MillWheel's ``TableSource`` and Photon's ``TableFeed``
commit with what they make of them. What must hold (the module's docstring): a change
is read in the one pass whose interval holds its commit timestamp, never twice and
never missed, whatever commits during a pass; deletes are not reported."""

from __future__ import annotations

from typing import Any

import pytest

from observers._changes import Change, TableChanges
from percolator import Cluster, InvalidArgument, Transaction

T = "clicks"


@pytest.fixture
def cluster_tables() -> tuple[str, ...]:
    return (T,)


def _commit(cluster: Cluster, cells: dict[tuple[bytes, str], bytes | None]) -> int:
    with Transaction(cluster) as txn:
        for (row, column), value in cells.items():
            if value is None:
                txn.delete(T, row, column)
            else:
                txn.set(T, row, column, value)
    assert txn.commit_ts is not None
    return txn.commit_ts


def _drain(changes: TableChanges, position: dict[str, Any], limit: int
           ) -> tuple[list[Change], dict[str, Any], int]:
    """Every change after *position*, read *limit* at a time to the pass's end."""
    found: list[Change] = []
    reads = 0
    while True:
        batch, position = changes.read(position, limit)
        reads += 1
        found += batch
        if "p" not in position:
            return found, position, reads


def test_a_pass_reads_each_committed_cell_once_with_its_commit_timestamp(
        cluster: Cluster) -> None:
    first = _commit(cluster, {(b"a", "c:v"): b"1", (b"b", "c:v"): b"2"})
    second = _commit(cluster, {(b"a", "c:w"): b"3"})
    changes = TableChanges(cluster, T)
    found, position, _ = _drain(changes, {}, 100)
    assert found == [Change(b"a", "c:v", b"1", first), Change(b"a", "c:w", b"3", second),
                     Change(b"b", "c:v", b"2", first)]
    assert position["a"] >= second
    # the next pass starts where this one ended: nothing again, the position kept
    assert changes.read(position, 100) == ([], position)
    third = _commit(cluster, {(b"b", "c:v"): b"4"})
    assert _drain(changes, position, 100)[0] == [Change(b"b", "c:v", b"4", third)]


def test_a_limited_read_stops_after_whole_rows_and_goes_on_after_the_last(
        cluster: Cluster) -> None:
    _commit(cluster, {(b"a", "c:v"): b"1", (b"a", "c:w"): b"2", (b"b", "c:v"): b"3",
                      (b"c", "c:v"): b"4"})
    changes = TableChanges(cluster, T)
    batch, position = changes.read({}, 1)
    # row a has two changes: the read takes it whole rather than split it
    assert [(c.row, c.column) for c in batch] == [(b"a", "c:v"), (b"a", "c:w")]
    assert position["r"] == b"a".hex() and position["p"] >= position["a"]
    batch, position = changes.read(position, 1)
    assert [c.row for c in batch] == [b"b"]
    rest, end, reads = _drain(changes, position, 1)
    assert [c.row for c in rest] == [b"c"]
    assert reads == 2 and end == {"a": position["p"]}  # c, then the pass's end


def test_a_commit_during_a_pass_is_read_by_the_next_pass_not_twice(cluster: Cluster) -> None:
    """A pass's later reads take new snapshots; a commit made after the pass's first
    snapshot lies above its interval, whichever row it lands on, and a newer value of a
    cell already read hides nothing the pass has not read."""
    _commit(cluster, {(b"a", "c:v"): b"1", (b"b", "c:v"): b"2"})
    changes = TableChanges(cluster, T)
    batch, position = changes.read({}, 1)
    assert [c.value for c in batch] == [b"1"]
    later = _commit(cluster, {(b"a", "c:v"): b"1'", (b"c", "c:v"): b"3"})
    rest, end, _ = _drain(changes, position, 1)
    assert [c.value for c in rest] == [b"2"]  # c's is above the pass: not now
    assert end["a"] < later
    following, _, _ = _drain(changes, end, 100)
    assert following == [Change(b"a", "c:v", b"1'", later), Change(b"c", "c:v", b"3", later)]


def test_only_the_columns_asked_are_read_and_deletes_are_not_reported(
        cluster: Cluster) -> None:
    _commit(cluster, {(b"a", "c:v"): b"1", (b"a", "c:other"): b"x"})
    changes = TableChanges(cluster, T, ["c:v"])
    found, position, _ = _drain(changes, {}, 100)
    assert [(c.row, c.column) for c in found] == [(b"a", "c:v")]
    _commit(cluster, {(b"a", "c:v"): None})
    assert _drain(changes, position, 100)[0] == []


@pytest.mark.parametrize(("args", "message"), [
    (("not a cluster", T), "needs a percolator.Cluster"),
    ((None, ""), "table must be a table name"),
    ((None, T, "c:v"), "columns must be a list of column names"),
    ((None, T, ["c:v", ""]), "columns must be a list of column names"),
])
def test_bad_arguments_are_refused_with_what_to_pass(
        sqlite_cluster: Cluster, args: tuple[Any, ...], message: str) -> None:
    args = tuple(sqlite_cluster if a is None else a for a in args)
    with pytest.raises(InvalidArgument, match=message):
        TableChanges(*args)


@pytest.mark.parametrize("limit", [0, -1, 1.5, "10"])
def test_a_limit_must_be_a_positive_int(sqlite_cluster: Cluster, limit: Any) -> None:
    with pytest.raises(InvalidArgument, match="limit must be an int >= 1"):
        TableChanges(sqlite_cluster, T).read({}, limit)
