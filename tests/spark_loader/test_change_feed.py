"""The change feed (``readStream.format("percolator").option("readChangeFeed",
"true")``, spark_loader._change_feed) played without Spark's jobs: its offsets,
partitions and records as Spark's micro-batch loop asks for them, on the embedded
store. PySpark is imported for its data source classes; no JVM starts, so these tests
carry no ``spark`` mark and run in the mutation script's ``changes`` group (the feed's
store half is tests/spark_loader/test_changes.py; its Spark runs and kill -9 restarts
are in tests/spark_loader/test_source.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._spark import require_pyspark_module

require_pyspark_module()

from pyspark.sql import Row  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

import percolator  # noqa: E402
from percolator._gc import collect  # noqa: E402
from percolator._interleaving import Interleaving  # noqa: E402
from percolator._internals import internals  # noqa: E402
from spark_loader._change_feed import PercolatorChangeFeed, _ts_of  # noqa: E402
from spark_loader._snapshot import ReadError  # noqa: E402
from spark_loader._source import PercolatorDataSource  # noqa: E402
from tests.spark_loader.test_changes import live_on_g_before_its_commit_timestamp  # noqa: E402

Offset = dict[str, int]


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    """A table t with two commits: row a (f:v "1", g:v "x"), then row b (f:v "2")."""
    url = f"sqlite://{tmp_path}/feed.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"a", "f:v", b"1")
            txn.set("t", b"a", "g:v", b"x")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"b", "f:v", b"2")
    yield url


def _feed(url: str, schema: T.StructType | None = None, **options: str) -> PercolatorChangeFeed:
    source = PercolatorDataSource({"url": url, "table": "t", "readChangeFeed": "true",
                                   **options})
    return source.streamReader(schema if schema is not None else source.schema())


def _batch(feed: PercolatorChangeFeed, start: Offset, end: Offset) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for part in feed.partitions(start, end) for r in feed.read(part)),
                  key=lambda r: (r[0], r[1], r[3]))


def _commit(url: str, row: bytes, column: str, value: bytes | None) -> int:
    with percolator.connect(url) as cluster:
        txn = percolator.Transaction(cluster)
        if value is None:
            txn.delete("t", row, column)
        else:
            txn.set("t", row, column, value)
        txn.commit()
        assert txn.commit_ts is not None
        return txn.commit_ts


def test_micro_batches_written_then_read_back_through_the_change_feed(tmp_path: Path) -> None:
    """The fast twin of test_source.py's round trip (Spark, opt-in), without Spark's jobs:
    two micro-batches through the stream writer (``write_task`` and ``commit``, two
    tasks each), then the change feed from the earliest commit (``availableNow``,
    string-typed as the schema asks): every written cell once, at the commit
    timestamp of its micro-batch's one transaction; a later run of the feed from the
    offset the first ended at adds only a later commit."""

    url = f"sqlite://{tmp_path}/rt.db"
    schema = T.StructType([T.StructField("row", T.StringType()),
                           T.StructField("v:n", T.LongType())])
    writer = PercolatorDataSource({"url": url, "table": "t", "queryId": "rt"}).streamWriter(
        schema, False)
    for batch in range(2):
        rows = [Row(**{"row": f"k{batch}-{i}", "v:n": batch * 10 + i}) for i in range(5)]
        reports = [writer.write_task("run", batch, iter(rows[:3])),
                   writer.write_task("run", batch, iter(rows[3:]))]
        writer.commit(list(reports), batch)
    source = PercolatorDataSource({"url": url, "table": "t", "readChangeFeed": "true",
                                   "startingTs": "earliest"})
    feed_schema = T.StructType([T.StructField("row", T.StringType()),
                                T.StructField("column", T.StringType()),
                                T.StructField("value", T.StringType()),
                                T.StructField("commit_ts", T.LongType())])

    def feed(start: dict[str, int] | None) -> tuple[list[tuple[Any, ...]], dict[str, int]]:
        reader = source.streamReader(feed_schema)
        offset = reader.initialOffset() if start is None else start
        reader.prepareForTriggerAvailableNow()
        got: list[tuple[Any, ...]] = []
        while _ts_of(offset) < (reader.target or 0):
            end = reader.latestOffset(offset, None)
            got += [tuple(r) for part in reader.partitions(offset, end) for r in reader.read(part)]
            offset = end
        return sorted(got), offset

    got, offset = feed(None)
    assert [(r, c, v) for r, c, v, _ in got] == sorted(
        (f"k{b}-{i}", "v:n", str(b * 10 + i)) for b in range(2) for i in range(5))
    assert len({ts for *_, ts in got}) == 2  # one transaction per micro-batch
    with percolator.connect(url) as cluster, percolator.Transaction(cluster) as txn:
        txn.delete("t", b"k0-0", "v:n")
    added, _ = feed(offset)
    assert [(r, c, v) for r, c, v, _ in added] == [("k0-0", "v:n", None)]


def test_the_feeds_schema_is_the_row_key_and_a_record_per_committed_cell(url: str) -> None:
    """The schema the source gives a change feed (row key binary, column string, value
    binary and nullable, commit_ts long), under the row key name of option rowKey;
    from the earliest offset a batch delivers each committed cell once, binary."""
    source = PercolatorDataSource({"url": url, "table": "t", "readChangeFeed": "true",
                                   "rowKey": "key", "startingTs": "earliest"})
    schema = source.schema()
    assert [(f.name, f.dataType, f.nullable) for f in schema.fields] == [
        ("key", T.BinaryType(), False), ("column", T.StringType(), False),
        ("value", T.BinaryType(), True), ("commit_ts", T.LongType(), False)]
    feed = source.streamReader(schema)
    start = feed.initialOffset()
    assert start == {"commit_ts": 0}  # startingTs earliest: every commit
    got = _batch(feed, start, feed.latestOffset(start, None))
    assert [r[:3] for r in got] == [(b"a", "f:v", b"1"), (b"a", "g:v", b"x"),
                                    (b"b", "f:v", b"2")]
    assert all(isinstance(r[0], bytes) and isinstance(r[3], int) for r in got)
    assert got[0][3] == got[1][3] < got[2][3]  # a's two cells in one commit, then b


FIELDS_MESSAGE = (r"^format\('percolator'\): a stream read is the table's change feed: option "
                  r"readChangeFeed \"true\" \(option columns then restricts it to those "
                  r"columns\); its fields are \['row', 'column', 'value', 'commit_ts'\], got "
                  r"\['row', 'column', 'value'\]$")
TYPES_MESSAGE = (r"^format\('percolator'\): the change feed's column is a string and its "
                 r"commit_ts a long$")


@pytest.mark.parametrize(("fields", "message"), [
    ([("row", T.BinaryType()), ("column", T.StringType()), ("value", T.BinaryType())],
     FIELDS_MESSAGE),
    ([("row", T.BinaryType()), ("column", T.BinaryType()), ("value", T.BinaryType()),
      ("commit_ts", T.LongType())], TYPES_MESSAGE),
    ([("row", T.BinaryType()), ("column", T.StringType()), ("value", T.BinaryType()),
      ("commit_ts", T.IntegerType())], TYPES_MESSAGE),
    ([("row", T.BinaryType()), ("column", T.StringType()),
      ("value", T.ArrayType(T.LongType())), ("commit_ts", T.LongType())],
     r"^format\('percolator'\): field 'value' has type array<bigint>"),
    ([("row", T.LongType()), ("column", T.StringType()), ("value", T.BinaryType()),
      ("commit_ts", T.LongType())], "row"),
], ids=["no-commit-ts", "binary-column", "int-commit-ts", "array-value", "long-row-key"])
def test_a_feed_schema_other_than_the_change_records_is_refused(
    url: str, fields: list[tuple[str, T.DataType]], message: str,
) -> None:
    schema = T.StructType([T.StructField(n, t) for n, t in fields])
    with pytest.raises(percolator.InvalidArgument, match=message):
        _feed(url, schema)


@pytest.mark.parametrize("offset", [{"commit_ts": -1}, {"commit_ts": True}, {"commit_ts": "5"},
                                    {"ts": 5}, [5], 5])
def test_an_offset_that_is_not_the_feeds_is_refused(url: str, offset: Any) -> None:
    """An offset from another source's checkpoint: latestOffset and partitions say
    what they expected, instead of reading from a wrong place."""
    feed = _feed(url, startingTs="earliest")
    message = (r"is not an offset of a Percolator change feed \(a checkpoint of another "
               r"source\?\): expected \{\"commit_ts\": N\}$")
    with pytest.raises(percolator.InvalidArgument, match=message):
        feed.latestOffset(offset, None)
    with pytest.raises(percolator.InvalidArgument, match=message):
        feed.partitions(offset, {"commit_ts": 10**6})
    with pytest.raises(percolator.InvalidArgument, match=message):
        feed.partitions({"commit_ts": 0}, offset)


def test_a_feed_starting_latest_delivers_only_later_commits(url: str) -> None:
    """startingTs latest (the default, any case): the first offset is above every
    commit so far; the first batch delivers only the commit made after it."""
    for options in ({}, {"startingTs": "LATEST"}):
        feed = _feed(url, **options)
        start = feed.initialOffset()
        commit_ts = _commit(url, b"c", "f:v", b"3")
        assert start["commit_ts"] <= commit_ts
        assert _batch(feed, start, feed.latestOffset(start, None)) == [
            (b"c", "f:v", b"3", commit_ts)]


def test_a_feed_starting_at_a_timestamp_delivers_the_commits_from_there(url: str) -> None:
    """startingTs N: the first offset is N; the batch delivers the commits at or
    above it. A timestamp not yet issued, below the safe point, or not a number is
    refused, and so is a table that does not exist (option EARLIEST in any case)."""
    with percolator.connect(url) as cluster:
        middle = internals(cluster).timestamps.get_timestamp()
    later = _commit(url, b"c", "f:v", b"3")
    feed = _feed(url, startingTs=str(middle))
    start = feed.initialOffset()
    assert start == {"commit_ts": middle}
    assert _batch(feed, start, feed.latestOffset(start, None)) == [(b"c", "f:v", b"3", later)]
    with pytest.raises(percolator.InvalidArgument, match="in the future"):
        _feed(url, startingTs=str(10**15)).initialOffset()
    with pytest.raises(percolator.InvalidArgument,
                       match="option startingts must be an integer, got 'yesterday'"):
        _feed(url, startingTs="yesterday")
    with percolator.connect(url) as cluster:
        _commit(url, b"c", "f:v", b"4")
        safe = collect(cluster, retention=0).safe_point
    assert safe > middle
    with pytest.raises(percolator.SnapshotTooOldError):
        _feed(url, startingTs=str(middle)).initialOffset()
    missing = PercolatorDataSource({"url": url, "table": "gone", "readChangeFeed": "true",
                                    "startingTs": "EARLIEST"})
    with pytest.raises(percolator.UnknownTableError, match="gone"):
        missing.streamReader(missing.schema()).initialOffset()


def test_an_available_now_run_ends_at_its_target_and_never_below_its_start(url: str) -> None:
    """prepareForTriggerAvailableNow fixes a target, a fresh timestamp: commits made
    after it are left for a later run (the end stops at the target), and a start
    already above the target stays where it is (an end below the start would
    deliver a range backwards)."""
    feed = _feed(url, startingTs="earliest")
    feed.prepareForTriggerAvailableNow()
    target = feed.target
    assert target is not None
    after = _commit(url, b"c", "f:v", b"3")
    end = feed.latestOffset({"commit_ts": 0}, None)
    assert end == {"commit_ts": target} and after > target
    assert (b"c", "f:v", b"3", after) not in _batch(feed, {"commit_ts": 0}, end)
    assert feed.latestOffset({"commit_ts": target + 5}, None) == {"commit_ts": target + 5}
    free = _feed(url, startingTs="earliest")
    assert free.latestOffset({"commit_ts": 0}, None)["commit_ts"] > after


def test_an_empty_range_has_no_partitions_and_the_row_ranges_are_planned_once(
    url: str,
) -> None:
    """A batch whose end is its start (or below) has no partitions. Otherwise the
    partitions are numPartitions row ranges of the table, planned at the first batch of
    the run and kept (the same ranges for every later batch, whatever rows came
    since), each with the batch's commit range; together they deliver every commit
    once."""
    feed = _feed(url, startingTs="earliest", numPartitions="2")
    end = feed.latestOffset({"commit_ts": 0}, None)
    assert feed.partitions(end, end) == []
    assert feed.partitions(end, {"commit_ts": 0}) == []
    parts = feed.partitions({"commit_ts": 0}, end)
    assert len(parts) == 2
    assert [p.value[2:] for p in parts] == [(0, end["commit_ts"])] * 2
    assert parts[0].value[0] is None and parts[-1].value[1] is None
    assert parts[0].value[1] == parts[1].value[0]
    assert [len(list(feed.read(p))) for p in parts] == [2, 1]  # row a | row b
    for row in (b"0", b"1", b"2", b"aa", b"ab"):
        _commit(url, row, "f:v", b"n")
    later = feed.latestOffset(end, None)
    again = feed.partitions(end, later)
    assert [p.value[:2] for p in again] == [p.value[:2] for p in parts]
    assert [p.value[2:] for p in again] == [(end["commit_ts"], later["commit_ts"])] * 2
    assert sum(len(list(feed.read(p))) for p in again) == 5


def test_records_read_with_the_types_of_the_schema_and_a_delete_as_null(url: str) -> None:
    """A string row key and a long value: each record decoded as the schema asks; a
    delete is a null value. A value that does not read as the field's type fails the
    partition with ReadError naming the table, the commit range and rows and the
    cause; so does a batch whose start garbage collection passed."""
    schema = T.StructType([T.StructField("row", T.StringType()),
                           T.StructField("column", T.StringType()),
                           T.StructField("value", T.LongType()),
                           T.StructField("commit_ts", T.LongType())])
    start = {"commit_ts": _commit(url, b"n", "f:v", b"7")}
    deleted = _commit(url, b"n", "f:v", None)
    feed = _feed(url, schema, columns="f:v", numPartitions="1")
    end = feed.latestOffset(start, None)
    assert _batch(feed, start, end) == [("n", "f:v", 7, start["commit_ts"]),
                                        ("n", "f:v", None, deleted)]
    _commit(url, b"n", "f:v", b"seven")
    after = feed.latestOffset(end, None)
    where = rf"reading table 't' at start_ts {end['commit_ts']} \(commits \[{end['commit_ts']}, "
    with pytest.raises(ReadError, match=where + rf"{after['commit_ts']}\) of rows \[None, None\)\) "
                       r"failed: InvalidArgument: row b'n', column f:v: value b'seven' does not "
                       r"read as the field's type"):
        _batch(feed, end, after)
    _commit(url, b"\xff", "f:v", b"8")  # a row key that is not UTF-8, read as a string
    with pytest.raises(ReadError, match=r"InvalidArgument: row b'\\xff', column row: value "
                                        r"b'\\xff' does not read as the field's type"):
        _batch(feed, after, feed.latestOffset(after, None))
    with percolator.connect(url) as cluster:
        safe = collect(cluster, retention=0).safe_point
    assert safe > start["commit_ts"]
    with pytest.raises(ReadError, match=r"SnapshotTooOldError"):
        _batch(feed, start, end)


def test_a_feed_of_some_columns_delivers_waits_for_and_splits_by_those_only(url: str) -> None:
    """Option columns f:v: a live transaction holding a lock on g:v (prewritten, its
    commit timestamp not yet drawn) holds back the end of a feed of every column but
    not this one's (nor the first offset of such a feed starting at the latest); the
    batch delivers no g:v commit; and its numPartitions row ranges are cut at the rows
    holding f:v (a row of f:v in each), not at the many g:v rows."""
    for i in range(6):
        _commit(url, b"c%d" % i, "g:v", b"g")
    every = _feed(url, startingTs="earliest")
    some = _feed(url, startingTs="earliest", columns="f:v", numPartitions="2")
    with percolator.connect(url) as cluster, Interleaving(cluster) as world:
        live, actor = live_on_g_before_its_commit_timestamp(cluster, world)
        assert every.latestOffset({"commit_ts": 0}, None)["commit_ts"] <= live.start_ts
        end = some.latestOffset({"commit_ts": 0}, None)
        assert end["commit_ts"] > live.start_ts
        # started at the latest commit: its first offset is not held back either
        latest = _feed(url, columns="f:v").initialOffset()
        assert latest["commit_ts"] > live.start_ts
        actor.finish()
    parts = some.partitions({"commit_ts": 0}, end)
    assert [[r[:3] for r in some.read(p)] for p in parts] == [
        [(b"a", "f:v", b"1")], [(b"b", "f:v", b"2")]]
