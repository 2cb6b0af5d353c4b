"""Store backends behind the contract of :mod:`percolator._store`.

``open_store(url)`` picks the backend by URL scheme. Backends for optional
dependencies are imported only when their scheme is used.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import urlsplit

from percolator._errors import InvalidArgument
from percolator._store import Store

__all__ = ["BACKENDS", "open_store"]

BACKENDS: dict[str, str] = {
    "sqlite": "percolator.stores.sqlite:open_sqlite_store",
    "hbase": "percolator.stores.hbase:open_hbase_store",
    "bigtable": "percolator.stores.bigtable:open_bigtable_store",
}


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
    return store
