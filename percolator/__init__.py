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
from percolator._retry import RetryPolicy, transactional
from percolator._tls import TlsConfig
from percolator._transaction import Snapshot, Transaction, TransactionBase
from percolator._zookeeper import publish_config

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
