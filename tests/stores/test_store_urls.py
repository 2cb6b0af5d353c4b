"""The same URL option means the same on every backend (``percolator/stores/_url.py``):
a keyword overrides the url's query, durations are seconds, and bad options and scan
arguments are refused alike, at the call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from percolator import InvalidArgument
from percolator._store import Read, Store
from percolator.stores import open_store

DEADLINE = {"sqlite": "busy_timeout", "hbase": "timeout", "bigtable": "timeout"}
"""Each backend's option for how long one store call may wait, in seconds."""


def deadline(store: Any) -> float:
    """The wait *store* was opened with, in seconds, read where each backend keeps it."""
    if hasattr(store, "_busy_timeout"):
        return float(store._busy_timeout)
    if hasattr(store, "timeout_ms"):
        return float(store.timeout_ms) / 1000
    return float(store.timeout)


def with_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


@pytest.fixture
def opened() -> Iterator[list[Store]]:
    stores: list[Store] = []
    yield stores
    for store in stores:
        store.close()


def test_a_duration_in_the_url_is_seconds(
    backend: str, store_url: str, opened: list[Store]
) -> None:
    store = open_store(with_query(store_url, f"{DEADLINE[backend]}=7.5"))
    opened.append(store)
    assert deadline(store) == 7.5


def test_a_keyword_overrides_the_url(
    backend: str, store_url: str, opened: list[Store]
) -> None:
    option = DEADLINE[backend]
    store = open_store(with_query(store_url, f"{option}=7"), **{option: 3})
    opened.append(store)
    assert deadline(store) == 3.0


@pytest.mark.parametrize(
    ("query", "keywords"),
    [
        ("{option}=0", {}),
        ("{option}=-1", {}),
        ("{option}=soon", {}),
        ("{option}=nan", {}),
        ("", {"{option}": True}),
        ("", {"{option}": "soon"}),
        ("colour=blue", {}),
        ("", {"colour": "blue"}),
        ("{option}=1&{option}=2", {}),
        ("{option}", {}),
        ("{option}=120000", {}),
    ],
    ids=["zero", "negative", "text", "nan", "bool", "keyword-text", "unknown-key",
         "unknown-keyword", "twice", "malformed", "milliseconds"],
)
def test_bad_options_are_refused_alike(
    backend: str, store_url: str, query: str, keywords: dict[str, object]
) -> None:
    option = DEADLINE[backend]
    url = with_query(store_url, query.format(option=option)) if query else store_url
    with pytest.raises(InvalidArgument):
        open_store(url, **{k.format(option=option): v for k, v in keywords.items()})


def test_a_duration_that_looks_like_milliseconds_says_so(store_url: str, backend: str) -> None:
    with pytest.raises(InvalidArgument, match=r"seconds \(was this milliseconds\? 120 s\)"):
        open_store(with_query(store_url, f"{DEADLINE[backend]}=120000"))


@pytest.mark.parametrize(
    ("start", "batch_size"),
    [(None, True), (None, 0), (None, 2.0), (None, "10"), ("a", 10)],
    ids=["batch-bool", "batch-zero", "batch-float", "batch-text", "bound-str"],
)
def test_bad_scan_arguments_are_refused_at_the_call(
    store_url: str, opened: list[Store], start: object, batch_size: object
) -> None:
    store = open_store(store_url)
    opened.append(store)
    store.create_table("t", {"f": 0})
    with pytest.raises(InvalidArgument):
        store.scan("t", start, None, [Read("f")], batch_size=batch_size)  # type: ignore[arg-type]
    store.drop_table("t")
