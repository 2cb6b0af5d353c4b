"""The loader's import surface and its pure-Python record handling (no Spark)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import percolator
import spark_loader
from spark_loader.__main__ import main
from spark_loader._records import ColumnMap, Reject, dedupe, parse_csv, parse_json


def test_all_is_sorted_and_exported() -> None:
    assert spark_loader.__all__ == sorted(spark_loader.__all__)
    for name in spark_loader.__all__:
        assert hasattr(spark_loader, name)


def test_mapping_is_checked_at_the_door() -> None:
    with pytest.raises(percolator.InvalidArgument, match="both map to column"):
        ColumnMap.of("k", {"a": "f:x", "b": "f:x"})
    with pytest.raises(percolator.InvalidArgument, match="reserved"):
        ColumnMap.of("k", {"a": "_ack:x"})
    with pytest.raises(percolator.InvalidArgument, match="at least one field"):
        ColumnMap.of("k", {})


def test_parse_and_dedupe() -> None:
    m = ColumnMap.of("k", {"v": "f:v", "n": "f:n"})
    out = list(parse_json(['{"k": "a", "v": "x", "n": 3}', "", '{"k": 1, "v": [1, {"b": 2}]}',
                           '{"k": "z"}'], m))
    assert out[0] == (b"a", ({"f:v": b"x", "f:n": b"3"}, '{"k": "a", "v": "x", "n": 3}'))
    assert out[1][0] == b"1" and out[1][1][0] == {"f:v": b'[1,{"b":2}]'}
    assert isinstance(out[2], Reject) and "no mapped field" in out[2].reason
    csv_out = list(parse_csv(["k,v,n", "a,x,1", "b,y", 'c,"q,r",2'], m, ["k", "v", "n"], "k,v,n"))
    assert isinstance(csv_out[1], Reject) and "2 fields" in csv_out[1].reason
    assert csv_out[2] == (b"c", ({"f:v": b"q,r", "f:n": b"2"}, 'c,"q,r",2'))
    # a lone surrogate (valid JSON, not valid UTF-8) is a reject, not a failed load
    bad = list(parse_json(['{"k": "a", "v": "\\udc80"}', '{"k": "\\ud800", "v": "x"}'], m))
    assert [isinstance(r, Reject) and "is not valid text" in r.reason for r in bad] == [True] * 2
    assert isinstance(bad[0], Reject) and bad[0].row == "a"
    rejects: list[Reject] = []
    rows = list(dedupe([(b"a", ({"f:v": b"1"}, "l1")), (b"a", ({"f:v": b"1"}, "l2")),
                        (b"b", ({"f:v": b"1"}, "l3")), (b"b", ({"f:v": b"2"}, "l4"))], rejects))
    assert rows == [(b"a", {"f:v": b"1"})]
    assert [r.line for r in rejects] == ["l3", "l4"]


def test_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--cluster", "sqlite:///tmp/x.db", "--table", "t", "--input", "x",
              "--format", "xml", "--row-key", "k", "--column", "a=f:a"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        main(["--cluster", "u", "--table", "t", "--input", "x", "--format", "csv",
              "--row-key", "k", "--column", "nocolumn"])
    assert "expected FIELD=family:qualifier" in capsys.readouterr().err


def test_load_subcommand_is_the_default_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["load", "--cluster", "u", "--table", "t", "--input", "x", "--format", "xml",
              "--row-key", "k", "--column", "a=f:a"])
    assert e.value.code == 2 and "invalid choice: 'xml'" in capsys.readouterr().err


def test_row_ranges_cover_the_table_and_spread_its_rows(tmp_path: Any) -> None:
    """Sampled split keys cut 1,000 rows into ranges of about equal size that cover
    every row once; given keys are sorted and deduplicated; bad splits are refused."""
    from spark_loader._snapshot import plan_ranges

    with percolator.connect(f"sqlite://{tmp_path}/r.db") as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            for i in range(1000):
                txn.set("t", b"r%05d" % (i * 7), "f:v", b"x")
        rows = sorted(row for row, _ in percolator.Snapshot(cluster).scan("t"))
        ranges = plan_ranges(cluster, "t", 4, default_parts=2)
        assert len(ranges) == 4 and ranges[0][0] is None and ranges[-1][1] is None
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        sizes = [sum(1 for r in rows if (lo is None or r >= lo) and (hi is None or r < hi))
                 for lo, hi in ranges]
        assert sum(sizes) == 1000 and min(sizes) >= 150, sizes
        assert len(plan_ranges(cluster, "t", None, default_parts=3)) == 3  # sqlite: sampled
        assert plan_ranges(cluster, "t", 1, default_parts=2) == [(None, None)]
        assert plan_ranges(cluster, "t", [b"b", b"a", b"b"], default_parts=2) == [
            (None, b"a"), (b"a", b"b"), (b"b", None)]
        for bad, message in ((0, "positive number"), ("ab", "splits must be None"),
                             ([b""], "non-empty bytes"), (True, "splits must be None")):
            with pytest.raises(percolator.InvalidArgument, match=message):
                plan_ranges(cluster, "t", bad, default_parts=2)  # type: ignore[arg-type]


def test_the_old_cluster_url_keyword_still_works_with_a_warning() -> None:
    from spark_loader import export_table, read_table

    # Refused for the bad session before anything connects: the url reached the body.
    with (pytest.warns(DeprecationWarning, match=r"read_table\(cluster_url=...\) is deprecated"),
          pytest.raises(percolator.InvalidArgument, match="spark must be a SparkSession")):
        read_table(None, cluster_url="sqlite:///nowhere.db", table="t")  # type: ignore[call-arg]
    with (pytest.warns(DeprecationWarning, match="call it url="),
          pytest.raises(percolator.InvalidArgument, match="unknown export format")):
        export_table(None, cluster_url="sqlite:///x.db", table="t",  # type: ignore[call-arg]
                     fmt="csv", output="o")
    with pytest.raises(percolator.InvalidArgument, match="both 'url' and its old name"):
        read_table(None, url="a", cluster_url="b", table="t")  # type: ignore[call-arg]
