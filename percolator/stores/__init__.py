"""Store backends behind the contract of :mod:`percolator._store`.

``open_store(url)`` picks the backend by URL scheme. Backends for optional
dependencies are imported only when their scheme is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from percolator import metrics
from percolator._errors import InvalidArgument
from percolator._store import Store

__all__ = ["BACKENDS", "open_store"]

BACKENDS: dict[str, str] = {
    "sqlite": "percolator.stores.sqlite:open_sqlite_store",
    "hbase": "percolator.stores._hbase_open:open_hbase_store",
    "bigtable": "percolator.stores.bigtable:open_bigtable_store",
}
"""URL scheme -> ``module:function`` that opens a store of that scheme (imported only
when a url of the scheme is opened, so optional dependencies stay optional)."""


def open_store(url: str, **options: Any) -> Store:
    """Open the store at *url* (``sqlite:///abs/path.db``, ``hbase://host:9090``,
    ``bigtable://project/instance``). *options* are the store's own (the keys of its
    url's query); a keyword overrides the same key in the query, on every backend
    (:mod:`percolator.stores._url`)."""
    if not isinstance(url, str):
        raise InvalidArgument(f"store url must be a str, got {type(url).__name__}: {url!r}")
    scheme = urlsplit(url).scheme
    target = BACKENDS.get(scheme)
    if target is None:
        raise InvalidArgument(
            f"unknown store url {url!r}: expected one of "
            + ", ".join(f"{s}://..." for s in BACKENDS)
        )
    module_name, _, func = target.partition(":")
    try:
        opener = getattr(importlib.import_module(module_name), func)
    except ImportError as e:  # the store's extra is not installed
        hint = f"pip install 'percolator-txn[{scheme}]'"
        raise InvalidArgument(str(e) if hint in str(e) else
                              f"the {scheme}:// store needs packages that are not installed "
                              f"({e}): {hint}") from e
    store: Store = opener(url, **options)
    return store


class RequestCounters:
    """The counters of ``percolator_store_requests_total``, one per store operation:
    each backend steps them in line at the top of its calls (``next(REQUESTS.scan)``
    while ``metrics._enabled``), so that counting a round trip costs one C call, not
    a wrapper's call per store call."""

    __slots__ = ("any_untagged", "check_and_set", "check_and_set_many", "create_table",
                 "drop_table", "increment", "list_tables", "mutate_rows", "read_rows",
                 "scan", "set_unless")

    def __init__(self) -> None:
        for operation in self.__slots__:
            setattr(self, operation,
                    metrics.counter("percolator_store_requests_total", operation))

    any_untagged: Iterator[int]
    check_and_set: Iterator[int]
    check_and_set_many: Iterator[int]
    create_table: Iterator[int]
    drop_table: Iterator[int]
    increment: Iterator[int]
    list_tables: Iterator[int]
    mutate_rows: Iterator[int]
    read_rows: Iterator[int]
    scan: Iterator[int]
    set_unless: Iterator[int]


REQUESTS = RequestCounters()
"""The store request counters the backends step (internal to the backends: not in
``__all__``)."""
