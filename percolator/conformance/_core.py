"""What every conformance check shares: the cluster it runs against (and how a child
process reaches it), its tables, its result, and the anomaly it raises."""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass, field
from typing import Any

from percolator._cluster import Cluster, connect
from percolator._encoding import Lock, decode_lock
from percolator._internals import internals
from percolator._store import Read
from percolator._tls import TlsConfig, add_zookeeper_tls_arguments, zookeeper_tls_from_arguments

MAX_DETAILS = 20
"""Details kept per anomaly kind: the first ones say what went wrong, the rest only count."""


class Anomaly(Exception):
    """A check saw the cluster break snapshot isolation (or the check's own invariant).

    *kind* names the anomaly (``"G1b intermediate read"``, ``"lost update"``...), *detail*
    says where and what was seen.
    """

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


@dataclass(frozen=True)
class Connection:
    """How to reach the cluster under test: the arguments of :func:`percolator.connect`
    that a deployment sets, and the same as command-line flags for child processes."""

    url: str
    oracle: str | None = None
    zookeeper: str | None = None
    oracle_tls: TlsConfig | None = None
    zookeeper_tls: TlsConfig | None = None

    def connect(self, **options: Any) -> Cluster:
        return connect(self.url, oracle=self.oracle, zookeeper=self.zookeeper,
                       oracle_tls=self.oracle_tls, zookeeper_tls=self.zookeeper_tls, **options)

    def argv(self) -> list[str]:
        """The flags of :func:`add_connection_arguments` that give this connection."""
        args = ["--cluster", self.url]
        for flag, value in (("--oracle", self.oracle), ("--zookeeper", self.zookeeper)):
            if value is not None:
                args += [flag, value]
        for prefix, tls in (("oracle", self.oracle_tls), ("zookeeper", self.zookeeper_tls)):
            for part, path in (tls.to_json() if tls is not None else {}).items():
                args += [f"--{prefix}-tls-{part}", path]
        return args


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True,
                        help="store url, e.g. hbase://host:9091?api=thrift2, "
                             "bigtable://project/instance")
    parser.add_argument("--oracle",
                        help="timestamp oracle, grpc://host:port, grpcs://host:port or zk://...")
    parser.add_argument("--zookeeper", help="ZooKeeper for coordination, host:port/chroot")
    add_zookeeper_tls_arguments(parser, "oracle")
    add_zookeeper_tls_arguments(parser, "zookeeper")


def connection_from_arguments(args: argparse.Namespace) -> Connection:
    """:raises InvalidArgument: for missing or unsafe TLS files."""
    return Connection(args.cluster, oracle=args.oracle, zookeeper=args.zookeeper,
                      oracle_tls=zookeeper_tls_from_arguments(args, "oracle"),
                      zookeeper_tls=zookeeper_tls_from_arguments(args))


@dataclass
class CheckResult:
    """The outcome of one check: anomalies by kind, or the error that stopped it."""

    name: str
    anomalies: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.anomalies and self.error is None

    def add(self, kind: str, detail: str) -> None:
        self.anomalies.setdefault(kind, []).append(detail)
        self.count(f"anomaly {kind}")

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def anomaly_count(self) -> int:
        return sum(self.counts.get(f"anomaly {kind}", 0) for kind in self.anomalies)

    def to_json(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "seconds": round(self.seconds, 3),
                "error": self.error, "counts": self.counts,
                "anomalies": {k: v[:MAX_DETAILS] for k, v in self.anomalies.items()}}


@dataclass
class Target:
    """The cluster under test as one check sees it: a connected client, the prefix of
    the tables this run owns, a random generator seeded by the run's seed, and the
    moment the check should wind down."""

    connection: Connection
    cluster: Cluster
    prefix: str
    rng: random.Random
    deadline: float
    tables: list[str] = field(default_factory=list)

    def table(self, name: str) -> str:
        """The table *name* of this run (``<prefix>_<name>``), created on first use."""
        full = f"{self.prefix}_{name}"
        if full not in self.tables:
            self.cluster.create_table(full)
            self.tables.append(full)
        return full

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


def unresolved_locks(cluster: Cluster, tables: list[str], start: bytes | None = None,
                     stop: bytes | None = None) -> list[str]:
    """Lock cells that still hold a lock (not a decision, not free) in the rows
    ``[start, stop)`` of *tables*.

    A cleaner killed between its decision and the release of a primary leaves the
    decision (ROLLED_BACK or COMMITTED) in the lock cell; it hides nothing from readers
    and the next writer or the lock sweep finishes it, so it is not counted.
    """
    found = []
    for table in tables:
        for row, cells in internals(cluster).store.scan(table, start, stop, [Read("l")]):
            for column, versions in cells.items():
                state = decode_lock(versions[0][1])
                if isinstance(state, Lock):
                    found.append(f"{table}/{row!r}/{column}: {state}")
    return found
