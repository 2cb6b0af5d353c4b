"""``connect`` and ``Cluster``: a store, a timestamp source and a coordinator."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from percolator import _embedded_mode
from percolator._coordination import Coordination
from percolator._encoding import (
    FAMILIES,
    META_FAMILIES,
    META_TABLE,
    check_column,
    check_table,
)
from percolator._errors import (
    CoordinationError,
    InvalidArgument,
    PercolatorError,
    UnknownTableError,
)
from percolator._gc import DEFAULT_MAX_TXN_AGE, DEFAULT_RETENTION, GcSummary, collect
from percolator._internals import Internals
from percolator._notify_index import INDEX_FAMILIES, INDEX_TABLE, uses_index
from percolator._retry import LOCK_WAIT
from percolator._safe_point import SafePoint
from percolator._store import Mutation, Read, Store
from percolator._timestamps import StoreTimestamps, TimestampSource, open_oracle
from percolator._tls import TlsConfig, check_tls
from percolator._transaction import Snapshot, Transaction
from percolator.metrics import record_gc_pass
from percolator.stores import open_store

__all__ = ["Cluster", "connect"]

log = logging.getLogger(__name__)

_OBSERVED_ROW = b"observed"


def connect(
    url: str,
    *,
    oracle: str | None = None,
    oracle_deadline: float = 10.0,
    oracle_tls: TlsConfig | None = None,
    zookeeper: str | None = None,
    zookeeper_auth: str | None = None,
    zookeeper_tls: TlsConfig | None = None,
    zookeeper_session_timeout: float = 10.0,
    lock_ttl: float = 30.0,
    lock_wait: float | None = None,
    safe_point_refresh: float = 1.0,
    **store_options: Any,
) -> Cluster:
    """Connect to the repository at *url*.

    *url* names the store: ``"sqlite:///abs/path.db"`` or ``"sqlite:path.db"`` (relative
    to the current directory) (embedded: durable, shared by every process of the host,
    no server; ``sqlite:///:memory:`` is refused), ``"hbase://host:9090"`` or
    ``"bigtable://project/instance"``. *oracle* (``"grpc://host:port"`` or
    ``"zk://host:port/chroot"``) selects the timestamp oracle; without it the
    embedded store uses its in-file allocator and remote stores an atomic counter in
    the store (one round trip per timestamp). *oracle_deadline* (seconds) is how long
    a timestamp request keeps trying (following leadership changes) before raising
    :class:`OracleUnavailable`. *zookeeper* (``"host:port/chroot"``)
    selects ZooKeeper coordination: every client registers an ephemeral liveness node
    there, locks of dead owners are rolled back at once, scanners take advisory locks
    there and the registry of observed columns lives there (watched by every client).
    *zookeeper_auth* (``"user:password"``) protects that namespace with digest ACLs;
    *zookeeper_session_timeout* (seconds) is how soon a dead client is noticed.
    *oracle_tls* and *zookeeper_tls* (:class:`TlsConfig`: CA, client certificate and key
    paths) make those connections over TLS (mutual TLS when a certificate is given); a
    ``grpcs://`` oracle target uses TLS with the system's roots when *oracle_tls* is not
    given; *zookeeper_tls* also serves a ``zk://`` oracle target's leader discovery.
    See docs/tls.md.

    With *url* ``"zk://host:port[,...]/chroot"`` everything else is learnt from
    ZooKeeper: the store url, the oracle target and the oracle's TLS file paths published
    there with ``publish_config`` (explicit *oracle* and *oracle_tls* still win);
    ZooKeeper coordination is
    then implied. *lock_ttl* (seconds) is how long a lock of a live but silent
    client is honoured; *lock_wait* how long a read waits for a live lock before
    raising :class:`LockedError` (default: twice the ttl). *safe_point_refresh*
    (seconds) is how long a client trusts its cached garbage-collection safe point;
    a GC pass waits twice the largest value among the live clients before it removes
    anything (each announces its own; see :mod:`percolator._safe_point`).
    *store_options* are the store's own options, the same keys as its url's query
    (``busy_timeout`` for SQLite; ``timeout``, ``table_prefix``... for Bigtable and
    HBase: docs/embedded.md, docs/bigtable.md, docs/hbase.md); on every store a keyword
    overrides the same key in the url's query, and durations are seconds.

    The returned :class:`Cluster` is thread-safe: share one per process. Any number of
    processes (and, with a cluster store, hosts) may connect to one repository at once.
    Close it when done (or use it as a context manager)::

        with percolator.connect("sqlite:///var/lib/app/repo.db") as cluster:
            cluster.create_table("documents")

    .. warning:: With ZooKeeper this blocks while connecting (up to 15 s).

    :raises InvalidArgument: for a malformed url or option.
    :raises StoreUnavailable: when the store cannot be reached.
    :raises CoordinationError: when ZooKeeper cannot be reached, kazoo is missing, or
        ``zk://`` names a namespace where no configuration was published.
    :raises TlsError: when a TLS handshake with ZooKeeper cannot succeed (says why).
    """
    oracle_tls = check_tls(oracle_tls, "oracle_tls")
    zookeeper_tls = check_tls(zookeeper_tls, "zookeeper_tls")
    if not isinstance(lock_ttl, int | float) or lock_ttl <= 0:
        raise InvalidArgument(f"lock_ttl must be a positive number of seconds, got {lock_ttl!r}")
    if not isinstance(safe_point_refresh, int | float) or safe_point_refresh <= 0:
        raise InvalidArgument(
            f"safe_point_refresh must be a positive number of seconds, got {safe_point_refresh!r}"
        )
    closers: list[Any] = []
    try:
        coordination: Coordination
        if isinstance(url, str) and url.startswith("zk://"):
            if zookeeper is not None and zookeeper != url[len("zk://"):]:
                raise InvalidArgument(
                    f"connect({url!r}, zookeeper={zookeeper!r}) names two ZooKeeper "
                    "namespaces; pass only the zk:// url"
                )
            zookeeper = url[len("zk://"):]
        if zookeeper is not None:
            from percolator._zookeeper import ZooKeeperCoordination

            zk = ZooKeeperCoordination(
                zookeeper,
                session_timeout=zookeeper_session_timeout,
                auth=zookeeper_auth,
                tls=zookeeper_tls,
            )
            closers.append(zk)
            coordination = zk
            if isinstance(url, str) and url.startswith("zk://"):
                config = zk.config()
                if not config or not config.get("store"):
                    raise CoordinationError(
                        f"no percolator configuration published at {url!r}; publish one "
                        "with percolator.publish_config(zookeeper, store=..., oracle=...)"
                    )
                url = str(config["store"])
                if oracle is None and config.get("oracle"):
                    oracle = str(config["oracle"])
                    if oracle_tls is None and config.get("oracle_tls"):
                        oracle_tls = TlsConfig.from_json(
                            config["oracle_tls"], what=f"oracle_tls published at {url!r}"
                        )
            store = open_store(url, **store_options)
            closers.insert(0, store)
        else:
            store = open_store(url, **store_options)
            closers.append(store)
            coordination = _embedded_mode.local_coordination(store)
            closers.append(coordination)
        timestamps: TimestampSource
        if oracle is not None:
            timestamps = open_oracle(
                oracle, deadline=oracle_deadline, tls=oracle_tls, zookeeper_tls=zookeeper_tls
            )
        else:
            timestamps = _embedded_mode.timestamps(store) or StoreTimestamps(store)
        return Cluster(
            store,
            timestamps,
            coordination,
            lock_ttl=lock_ttl,
            lock_wait=2 * lock_ttl if lock_wait is None else lock_wait,
            safe_point_refresh=safe_point_refresh,
        )
    except BaseException:
        for closer in reversed(closers):
            closer.close()
        raise


class Cluster:
    """A connection to one repository: tables, transactions and snapshots, observed
    columns, garbage collection. Made by :func:`connect`, the way in: the constructor's
    arguments are internal parts (``percolator._internals``) and change with the library.

    Thread-safe: share one per process, from any number of threads. A child process
    that inherits one by ``fork`` reopens what it must not share (SQLite connections,
    lock descriptors) at its first use. Use as a context manager or call
    :meth:`close`; a closed cluster raises :class:`PercolatorError` when used.

    ::

        cluster.create_table("documents")            # idempotent
        cluster.observe("documents", "raw:html")      # commits to it now notify observers
        with percolator.Transaction(cluster) as txn:
            txn.set("documents", b"https://a.example/", "raw:html", b"<html/>")
    """

    def __init__(
        self,
        store: Store,
        timestamps: TimestampSource,
        coordination: Coordination,
        *,
        lock_ttl: float = 30.0,
        lock_wait: float = 60.0,
        config_refresh: float = 0.5,
        safe_point_refresh: float = 1.0,
    ) -> None:
        self.lock_ttl = lock_ttl
        """Seconds a lock of a live but silent client is honoured (``connect(lock_ttl=)``)."""
        self.one_phase_commit = True
        """Commit in one atomic store step where the store and timestamps allow it (set
        False to see every step of the paper's two-phase commit, as tests do)."""
        self._config_refresh = config_refresh
        self._tables: set[str] = set()
        self._observed: frozenset[tuple[str, str]] = frozenset()
        self._observed_at = float("-inf")
        self._lock = threading.Lock()
        self._closed = False
        # With ZooKeeper coordination the registry of observed columns lives there,
        # watched (no polling); otherwise in the store's meta table, polled.
        self._registry = coordination.observed_registry
        store.create_table(META_TABLE, META_FAMILIES)
        safe_point = SafePoint(store, coordination, refresh=safe_point_refresh)
        if uses_index(store):
            store.create_table(INDEX_TABLE, INDEX_FAMILIES)
        # Every client of an embedded store must keep the census, however it was built.
        census = _embedded_mode.lock_census(store)
        self._internals = Internals(
            self, store, timestamps, coordination,
            lock_wait_policy=LOCK_WAIT.with_(deadline=lock_wait),
            safe_point=safe_point,
            lock_census=census,
        )
        """The parts below the public face: :func:`percolator._internals.internals`."""

    # --- tables -----------------------------------------------------------------

    def create_table(self, name: str) -> None:
        """Create table *name* (idempotent)."""
        self._check_open()
        parts = self._internals
        parts.store.create_table(check_table(name), FAMILIES)
        self._tables.add(name)
        if parts.lock_census is not None:
            # Asked once now, while the table is empty, so that the store indexes the
            # lock cells that sweeps look for before the first lock is written.
            parts.any_lock_held()

    def drop_table(self, name: str) -> None:
        """Delete table *name* and everything in it."""
        self._check_open()
        self._internals.store.drop_table(check_table(name))
        self._tables.discard(name)

    def tables(self) -> list[str]:
        """The user tables, sorted."""
        self._check_open()
        return [t for t in self._internals.store.list_tables() if not t.startswith("_")]

    def table_exists(self, name: str) -> bool:
        """Whether table *name* exists.

        :raises InvalidArgument: for a malformed name."""
        try:
            self._require_table(name)
        except UnknownTableError:
            return False
        return True

    def _require_table(self, name: str) -> str:
        """*name*, once it is known to exist (cached: a table once seen is not asked
        about again; see :meth:`Internals.require_table`)."""
        if name in self._tables:
            return name
        check_table(name)
        known = set(self.tables())
        self._tables = known
        if name not in known:
            raise UnknownTableError(name)
        return name

    # --- observed columns -----------------------------------------------------------

    def observe(self, table: str, column: str) -> None:
        """Register (*table*, *column*) as observed: commits to it set notify cells.

        With ZooKeeper coordination the registration goes to ZooKeeper, whose watch tells
        every connected client at once; it is also recorded in the store.

        :raises CoordinationError: when ZooKeeper refuses the registration.
        """
        self._require_table(table)
        check_column(column)
        self._internals.store.mutate_rows(
            META_TABLE, [Mutation(_OBSERVED_ROW, [(f"m:{table}/{column}", 0, b"1")])]
        )
        if self._registry is not None:
            self._registry.register_observed(table, column)
        self._observed_at = float("-inf")

    def observed_columns(self) -> frozenset[tuple[str, str]]:
        """The registered (table, column) pairs: with ZooKeeper, the watched registry
        (no round trip); otherwise read from the store at most every half second."""
        if self._registry is not None:
            return self._registry.observed_columns()
        now = time.monotonic()
        if now - self._observed_at > self._config_refresh:
            cells = self._internals.store.read_rows(META_TABLE, [_OBSERVED_ROW], [Read("m")])
            found = set()
            for column, versions in cells.get(_OBSERVED_ROW, {}).items():
                if versions and versions[0][1] == b"1":
                    table, _, user_column = column[2:].partition("/")
                    found.add((table, user_column))
            self._observed = frozenset(found)
            self._observed_at = now
        return self._observed

    def is_observed(self, table: str, column: str) -> bool:
        """Whether commits to (*table*, *column*) set notifications, as far as this
        client knows (its view of the registry is at most half a second old)."""
        return (table, column) in self.observed_columns()

    # --- garbage collection -----------------------------------------------------------

    def gc(
        self,
        *,
        retention: float = DEFAULT_RETENTION,
        max_txn_age: float = DEFAULT_MAX_TXN_AGE,
        dry_run: bool = False,
        vacuum: bool = False,
        progress: Callable[[int], None] | None = None,
        rows_per_second: float | None = None,
    ) -> GcSummary:
        """One garbage-collection pass: remove the versions that no transaction can
        read any more (docs/garbage-collection.md).

        The safe point moves up to the timestamp that was current *retention* seconds
        ago (0: now), but never past a transaction still running in a live client,
        unless that transaction is older than *max_txn_age* seconds; a transaction
        left below the safe point gets :class:`SnapshotTooOldError`.
        Every user table keeps, per cell, the newest version below the safe point and
        everything newer; deleted cells go entirely. *dry_run* counts what would go
        and changes nothing; *vacuum* then returns free space to the file system
        (embedded store; elsewhere the store's compactions do). *progress* is called
        with the number of rows scanned, batch by batch; *rows_per_second* limits the
        pace.

        .. warning:: blocks for the whole pass, at least twice the largest safe-point
           refresh of a live client (``connect(safe_point_refresh=...)``) plus a scan
           of every table.

        :raises InvalidArgument: for a negative retention or a non-positive max_txn_age.
        """
        self._check_open()
        began = time.monotonic()
        try:
            summary = collect(self, retention=retention, max_txn_age=max_txn_age,
                              dry_run=dry_run, vacuum=vacuum, progress=progress,
                              rows_per_second=rows_per_second)
        except BaseException:
            record_gc_pass(time.monotonic() - began, ok=False)
            raise
        if not dry_run:
            record_gc_pass(summary.seconds, ok=True, deleted=summary.removed_by_table,
                           safe_point=summary.collected_below)
        return summary

    # --- life cycle -----------------------------------------------------------------

    def transaction(self) -> Transaction:
        """A new :class:`~percolator.Transaction` (same as ``Transaction(cluster)``)."""
        return Transaction(self)

    def snapshot(self, *, start_ts: int | None = None) -> Snapshot:
        """A new :class:`~percolator.Snapshot` (same as ``Snapshot(cluster)``): close
        it, or use it as a context manager, as it holds garbage collection back."""
        return Snapshot(self, start_ts=start_ts)

    @property
    def url(self) -> str:
        """The store's url (the one given to :func:`connect`, or learnt from ZooKeeper)."""
        url: str = self._internals.store.url
        return url

    def _check_open(self) -> None:
        if self._closed:
            raise PercolatorError("the cluster is closed")

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Release the store, the timestamp source and the coordinator. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        parts = self._internals
        for part in (parts.safe_point, parts.timestamps, parts.coordination,
                     parts.lock_census, parts.store):
            if part is None:
                continue
            try:
                part.close()
            except Exception:  # closing must go on whatever one part says
                log.exception("closing %r failed", part)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<percolator.Cluster {self.url}{' closed' if self._closed else ''}>"
