"""Percolator for Python: snapshot-isolation transactions across rows and tables over
HBase-like stores, and observers that run when a watched column changes.

::

    import percolator
    with percolator.connect("sqlite:///var/lib/app/repo.db") as cluster:
        cluster.create_table("dups")
        content_hash, url = b"5d41402a", b"https://a.example/"
        with percolator.Transaction(cluster) as txn:       # commits on exit
            if txn.get("dups", content_hash, "c:canonical") is None:
                txn.set("dups", content_hash, "c:canonical", url)

The guides and the concepts: docs/index.md (the site: ``mkdocs serve``).
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from percolator._cluster import Cluster, connect
    from percolator._encoding import MAX_ROW_BYTES, MAX_VALUE_BYTES
    from percolator._errors import (
        CommitUnknownError,
        ConflictError,
        CoordinationError,
        InvalidArgument,
        LockedError,
        ObserverError,
        OracleUnavailable,
        PercolatorError,
        SnapshotTooOldError,
        StoreUnavailable,
        TlsError,
        TransactionClosedError,
        UnknownTableError,
        ValueTooLargeError,
        is_retryable,
    )
    from percolator._retry import RetryPolicy
    from percolator._tls import TlsConfig
    from percolator._transaction import Snapshot, Transaction, TransactionBase
    from percolator._transactional import transactional
    from percolator._zookeeper import publish_config

_PUBLIC: dict[str, str] = {
    "MAX_ROW_BYTES": "_encoding",
    "MAX_VALUE_BYTES": "_encoding",
    "Cluster": "_cluster",
    "CommitUnknownError": "_errors",
    "ConflictError": "_errors",
    "CoordinationError": "_errors",
    "InvalidArgument": "_errors",
    "LockedError": "_errors",
    "ObserverError": "_errors",
    "OracleUnavailable": "_errors",
    "PercolatorError": "_errors",
    "RetryPolicy": "_retry",
    "Snapshot": "_transaction",
    "SnapshotTooOldError": "_errors",
    "StoreUnavailable": "_errors",
    "TlsConfig": "_tls",
    "TlsError": "_errors",
    "Transaction": "_transaction",
    "TransactionBase": "_transaction",
    "TransactionClosedError": "_errors",
    "UnknownTableError": "_errors",
    "ValueTooLargeError": "_errors",
    "connect": "_cluster",
    "is_retryable": "_errors",
    "publish_config": "_zookeeper",
    "transactional": "_transactional",
}
"""Public name -> the module defining it. The names are loaded at first use (PEP 562),
so that a program that needs only the shared base (``_errors``, ``_tls``,
``_zk_client``, ``metrics``: the oracle server) does not load the transaction library:
importing any ``percolator.*`` module runs this file first."""


def __getattr__(name: str) -> _typing.Any:
    module = _PUBLIC.get(name)
    if module is None:
        # ``percolator.stores`` and the like after a bare ``import percolator``.
        try:
            value: _typing.Any = _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups do not come here again
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__version__ = "0.1.0"

__all__ = [
    "MAX_ROW_BYTES",
    "MAX_VALUE_BYTES",
    "Cluster",
    "CommitUnknownError",
    "ConflictError",
    "CoordinationError",
    "InvalidArgument",
    "LockedError",
    "ObserverError",
    "OracleUnavailable",
    "PercolatorError",
    "RetryPolicy",
    "Snapshot",
    "SnapshotTooOldError",
    "StoreUnavailable",
    "TlsConfig",
    "TlsError",
    "Transaction",
    "TransactionBase",
    "TransactionClosedError",
    "UnknownTableError",
    "ValueTooLargeError",
    "connect",
    "is_retryable",
    "publish_config",
    "transactional",
]
