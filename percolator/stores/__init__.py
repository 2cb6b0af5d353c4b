"""Store backends behind the contract of :mod:`percolator._store`.

``open_store(url)`` picks the backend by URL scheme. Backends for optional
dependencies are imported only when their scheme is used.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import urlsplit

from percolator import metrics
from percolator._errors import InvalidArgument
from percolator._store import Store

__all__ = ["BACKENDS", "CountingStore", "open_store"]

BACKENDS: dict[str, str] = {
    "sqlite": "percolator.stores.sqlite:open_sqlite_store",
    "hbase": "percolator.stores.hbase:open_hbase_store",
    "bigtable": "percolator.stores.bigtable:open_bigtable_store",
}
"""URL scheme -> ``module:function`` that opens a store of that scheme (imported only
when a url of the scheme is opened, so optional dependencies stay optional)."""


def open_store(url: str, **options: Any) -> Store:
    """Open the store at *url* (``sqlite:///abs/path.db``, ``hbase://host:9090``,
    ``bigtable://project/instance``)."""
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
    opener = getattr(importlib.import_module(module_name), func)
    store: Store = opener(url, **options)
    return CountingStore(store)  # type: ignore[return-value]


_COUNTED = frozenset({
    "read_rows", "mutate_rows", "check_and_set", "check_and_set_many", "scan", "increment",
    "set_unless", "any_untagged", "create_table", "drop_table", "list_tables",
})


class CountingStore:
    """A store that counts its calls by operation in ``percolator_store_requests_total``
    (see :mod:`percolator.metrics`), once for every backend.

    Everything else, capabilities included, is the wrapped store's: attributes are read
    from it and set on it (so a test that patches a method of ``cluster.store`` patches
    the backend, whose own internal calls see the patch too).
    """

    def __init__(self, store: Store) -> None:
        object.__setattr__(self, "_store", store)

    def __getattr__(self, name: str) -> Any:
        inner = self._store
        value = getattr(inner, name)
        if name not in _COUNTED or not callable(value):
            return value

        key = ("percolator_store_requests_total", (name,))

        def counted(*args: Any, **kwargs: Any) -> Any:
            if metrics._enabled:
                next(metrics._steps.get(key) or metrics._stepper(key))
            return value(*args, **kwargs)

        counted.__name__ = name
        object.__setattr__(self, name, counted)  # later calls skip __getattr__
        return counted

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__.pop(name, None)
        setattr(self._store, name, value)

    def __delattr__(self, name: str) -> None:
        self.__dict__.pop(name, None)
        delattr(self._store, name)

    def __repr__(self) -> str:
        return repr(self._store)
