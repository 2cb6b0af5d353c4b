"""ZooKeeper coordination through kazoo (Percolator §2.2 and §2.4; DESIGN.md §3, §5, §7).

One :class:`ZooKeeperCoordination` wraps one ``KazooClient`` and keeps everything the
hot paths need in memory, fed by watches, so that taking locks, reading locks and
committing cost no ZooKeeper round trip in the steady state.

Layout under the cluster's namespace ``<chroot>/percolator``::

    id                     random cluster id (owner ids carry it)
    config                 JSON {"store": url, "oracle": target or null}   (persistent)
    observed/<table/col>   one node per observed column, name percent-encoded (persistent)
    owners/o-<hex>         one ephemeral node per live client or worker
    advisory/b-<n>         ephemeral lease of advisory-lock hash bucket n

* **Liveness.** Every client registers ``owners/o-<hex>`` and puts the owner id
  ``zk/<cluster id>/o-<hex>`` in the locks it takes. A children watch on ``owners``
  keeps the set of live owners in memory; :meth:`ZooKeeperCoordination.is_alive`
  answers from it. An owner absent from the cache (new since the last event, or dead)
  is checked once on the server (``sync`` + ``exists``) and, if gone, remembered as
  dead for good: owner ids are never reused.
* **Session states** (kazoo's documented pattern). SUSPENDED: pause new work
  (:meth:`~ZooKeeperCoordination.current_owner` waits for the connection,
  advisory locks are refused, liveness answers "unknown"). LOST: the identity is
  dropped at once, so nothing commits under it any more; once kazoo has a new
  session a fresh owner node (a *new* owner id) is registered and work goes on.
  The listener only flips flags and wakes the background thread: it never blocks.
* **Advisory locks** are leases of hash buckets (see
  :meth:`~ZooKeeperCoordination.try_advisory_lock`): one ephemeral node per bucket
  per lease, not one ZooKeeper write per row.
* **ACLs.** With ``auth="user:password"`` every node the library creates gets a
  digest ACL (all rights for that user, read for everyone), so nobody else can write
  the namespace of a shared ZooKeeper.
* **TLS.** Every ``KazooClient`` of percolator and the oracle is made by
  :func:`~percolator._zk_client.make_client` and started by
  :func:`~percolator._zk_client.start_client` (``percolator/_zk_client.py``): with a
  :class:`~percolator._tls.TlsConfig` it connects to ZooKeeper's ``secureClientPort``
  (hostname checked), and a handshake that cannot succeed raises ``TlsError`` within
  about a second instead of retrying until the connect timeout (docs/tls.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from percolator._errors import CoordinationError, InvalidArgument
from percolator._tls import TlsConfig, check_tls
from percolator._zk_client import (
    INSTALL_HINT,
    make_client,
    parse_auth,
    parse_zookeeper_address,
    start_client,
)

if TYPE_CHECKING:
    from percolator._coordination import ObservedRegistry

__all__ = ["ZooKeeperCoordination", "parse_zookeeper_address", "publish_config"]

log = logging.getLogger(__name__)

NAMESPACE = "percolator"
_DEAD_CACHE = 100_000


def _client(
    hosts: str, session_timeout: float, auth: tuple[str, str] | None, tls: TlsConfig | None
) -> Any:
    from kazoo.retry import KazooRetry
    from kazoo.security import OPEN_ACL_UNSAFE

    return make_client(
        hosts,
        session_timeout=session_timeout,
        tls=tls,
        auth=auth,
        connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
        command_retry=KazooRetry(max_tries=3, delay=0.1, max_delay=1.0),
        **({} if auth is not None else {"default_acl": OPEN_ACL_UNSAFE}),
    )


def publish_config(
    zookeeper: str,
    *,
    store: str,
    oracle: str | None = None,
    oracle_tls: TlsConfig | None = None,
    zookeeper_auth: str | None = None,
    zookeeper_tls: TlsConfig | None = None,
    timeout: float = 15.0,
) -> None:
    """Publish the shared configuration of the cluster at *zookeeper*
    (``"host:port[,...]/chroot"``): the store url *store* and the oracle target *oracle*
    (None: the store's own timestamps). Afterwards ``percolator.connect("zk://" +
    zookeeper)`` learns both from ZooKeeper alone. *oracle_tls* publishes the TLS files
    clients use for the oracle: their *paths* only (the same on every client host), never
    their content. *zookeeper_auth* (``"user:password"``) protects the namespace with
    digest ACLs; *zookeeper_tls* connects to ZooKeeper over TLS for this call.

    .. warning:: Blocks for up to *timeout* seconds while connecting.

    :raises InvalidArgument: for a malformed argument.
    :raises CoordinationError: when ZooKeeper cannot be reached or refuses the write.
    """
    if not isinstance(store, str) or "://" not in store:
        raise InvalidArgument(
            f"store must be a store url such as 'hbase://host:9090', got {store!r}"
        )
    if oracle is not None and (not isinstance(oracle, str) or "://" not in oracle):
        raise InvalidArgument(f"oracle must be 'grpc://host:port' or 'zk://...', got {oracle!r}")
    oracle_tls = check_tls(oracle_tls, "oracle_tls")
    zookeeper_tls = check_tls(zookeeper_tls, "zookeeper_tls")
    hosts, chroot = parse_zookeeper_address(zookeeper)
    client = _client(hosts, 10.0, parse_auth(zookeeper_auth), zookeeper_tls)
    start_client(client, hosts, timeout, zookeeper_tls)
    try:
        from kazoo.exceptions import NodeExistsError

        base = f"{chroot}/{NAMESPACE}"
        client.ensure_path(base)
        config: dict[str, Any] = {"store": store, "oracle": oracle}
        if oracle_tls is not None:
            config["oracle_tls"] = oracle_tls.to_json()
        data = json.dumps(config, sort_keys=True).encode()
        try:
            client.create(f"{base}/config", data)
        except NodeExistsError:
            client.set(f"{base}/config", data)
    except CoordinationError:
        raise
    except Exception as e:
        raise CoordinationError(f"cannot publish the configuration at {zookeeper!r}: {e}") from e
    finally:
        client.stop()
        client.close()


class _Lease:
    __slots__ = ("last_used", "users")

    def __init__(self) -> None:
        self.users = 0
        self.last_used = time.monotonic()


class ZooKeeperCoordination:
    """Liveness, advisory locks and shared configuration in ZooKeeper.

    *hosts* is ``"host:port[,host:port...][/chroot]"``; the library works under
    ``<chroot>/percolator``. *session_timeout* (seconds) is the ZooKeeper session
    timeout asked for: a killed client is declared dead that long after its last
    heartbeat (the server clamps it to its own min/max). *auth* (``"user:password"``)
    enables digest ACLs. *advisory_buckets* is the number of hash buckets advisory-lock
    keys fall into and *lease_idle* how long (seconds) an unused bucket lease is kept
    before it is given back. *suspend_wait* (default: the session timeout) is how long
    :meth:`current_owner` waits for a suspended connection to come back. *tls* connects
    over TLS with its files (ZooKeeper's ``secureClientPort``).

    .. warning:: The constructor blocks for up to *connect_timeout* seconds while it
        connects and registers this client.

    :raises CoordinationError: when ZooKeeper cannot be reached (or kazoo is missing).
    :raises TlsError: when a TLS handshake with ZooKeeper cannot succeed (says why).
    :raises InvalidArgument: for a malformed argument.
    """

    def __init__(
        self,
        hosts: str,
        *,
        session_timeout: float = 10.0,
        auth: str | None = None,
        connect_timeout: float = 15.0,
        advisory_buckets: int = 1024,
        lease_idle: float = 2.0,
        suspend_wait: float | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        tls = check_tls(tls, "zookeeper_tls")
        if not isinstance(session_timeout, int | float) or session_timeout <= 0:
            raise InvalidArgument(
                f"session_timeout must be positive seconds, got {session_timeout!r}"
            )
        if not isinstance(advisory_buckets, int) or advisory_buckets < 1:
            raise InvalidArgument(
                f"advisory_buckets must be a positive int, got {advisory_buckets!r}"
            )
        self.address = hosts
        zk_hosts, chroot = parse_zookeeper_address(hosts)
        try:
            from kazoo.protocol.states import KazooState
        except ImportError as e:
            raise CoordinationError(INSTALL_HINT) from e

        self._KazooState = KazooState
        self.base = f"{chroot}/{NAMESPACE}"
        self._owners_path = f"{self.base}/owners"
        self._advisory_path = f"{self.base}/advisory"
        self._observed_path = f"{self.base}/observed"
        self._config_path = f"{self.base}/config"
        self.session_timeout = float(session_timeout)
        self._suspend_wait = self.session_timeout if suspend_wait is None else suspend_wait
        self._confirmed_at = -1e9  # monotonic time the server last confirmed our owner node
        self._buckets = advisory_buckets
        self._lease_idle = lease_idle

        self._lock = threading.RLock()
        self._connected = threading.Event()  # connected *and* registered
        self._closed = False
        self._owner: str | None = None
        self._owner_node: str | None = None
        self._alive: frozenset[str] = frozenset()
        self._alive_known = False
        self._dead: OrderedDict[str, None] = OrderedDict()
        self._held_keys: dict[str, int] = {}
        self._leases: dict[int, _Lease] = {}
        self._busy: dict[int, float] = {}  # bucket -> monotonic time until we retry it
        self._acquiring: set[int] = set()
        self._observed: frozenset[tuple[str, str]] = frozenset()
        self._observed_known = threading.Event()
        self._config: dict[str, Any] | None = None
        self._config_known = threading.Event()
        self._config_listeners: list[Any] = []
        self._observed_listeners: list[Any] = []
        self._tasks: queue.Queue[str] = queue.Queue()
        self.stats: dict[str, int] = {
            "zk_ops": 0, "registrations": 0, "sessions_lost": 0, "suspended": 0,
            "liveness_lookups": 0, "lease_acquired": 0, "lease_refused": 0,
            "lease_released": 0,
        }

        self._zk = _client(zk_hosts, self.session_timeout, parse_auth(auth), tls)
        start_client(self._zk, zk_hosts, connect_timeout, tls)
        try:
            self._zk.add_listener(self._listener)
            self._setup()
        except BaseException:
            self._zk.stop()
            self._zk.close()
            raise
        self._thread = threading.Thread(
            target=self._run, name=f"percolator-zk-{self._owner}", daemon=True
        )
        self._thread.start()

    # --- set-up -----------------------------------------------------------------------

    def _op(self, n: int = 1) -> None:
        self.stats["zk_ops"] += n

    def _setup(self) -> None:
        from kazoo.exceptions import NodeExistsError

        zk = self._zk
        try:
            for path in (self._owners_path, self._advisory_path, self._observed_path):
                zk.ensure_path(path)
                self._op()
            try:
                zk.create(f"{self.base}/id", uuid.uuid4().hex[:16].encode())
            except NodeExistsError:
                pass
            data, _ = zk.get(f"{self.base}/id")
            self._op(2)
        except Exception as e:
            raise CoordinationError(
                f"cannot set up the percolator namespace {self.base!r} on {self.address!r}: {e}"
                " (if the namespace is ACL-protected, pass zookeeper_auth='user:password')"
            ) from e
        self.cluster_id = data.decode()
        self._register()
        zk.ChildrenWatch(self._owners_path, self._on_owners)
        zk.ChildrenWatch(self._observed_path, self._on_observed)
        zk.DataWatch(self._config_path, self._on_config)
        self._op(3)

    def _register(self) -> None:
        """Create a fresh ephemeral owner node (a new identity); raises on failure."""
        name = f"o-{uuid.uuid4().hex}"
        info = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()
        self._zk.create(f"{self._owners_path}/{name}", info, ephemeral=True)
        self._op()
        with self._lock:
            self._owner_node = name
            self._owner = f"zk/{self.cluster_id}/{name}"
            self._alive = self._alive | {name}
        self.stats["registrations"] += 1
        self._connected.set()
        log.info("registered as %s on %s", self._owner, self.address)

    # --- session states (kazoo's connection thread: never block here) ---------------------

    def _listener(self, state: Any) -> None:
        if self._closed:
            return
        S = self._KazooState
        if state == S.SUSPENDED:
            self._connected.clear()
            self.stats["suspended"] += 1
            log.warning("ZooKeeper connection suspended: pausing new work")
        elif state == S.LOST:
            self._connected.clear()
            with self._lock:
                lost, self._owner, self._owner_node = self._owner, None, None
                self._leases.clear()
                self._acquiring.clear()
                self._alive_known = False
            self.stats["sessions_lost"] += 1
            log.warning("ZooKeeper session lost: identity %s dropped", lost)
            self._tasks.put("lost")
        else:
            with self._lock:
                registered = self._owner is not None
            if registered:
                self._connected.set()
                log.info("ZooKeeper connection back: resuming")
            self._tasks.put("connected")

    def _run(self) -> None:
        """Background thread: re-registration after LOST, and giving back idle leases."""
        while True:
            try:
                task = self._tasks.get(timeout=min(0.5, self._lease_idle / 2))
            except queue.Empty:
                task = "tick"
            if task == "stop" or self._closed:
                return
            try:
                if self._owner is None and self._zk.connected:
                    self._register()
                self._reap_leases()
            except Exception as e:  # retried at the next tick or state change
                log.warning("ZooKeeper background work failed (will retry): %s", e)

    # --- watches (kazoo's event thread: in-memory work only) --------------------------

    def _on_owners(self, children: list[str]) -> None:
        new = frozenset(children)
        with self._lock:
            if self._alive_known:
                for name in self._alive - new:
                    self._mark_dead(name)
            self._alive = new | ({self._owner_node} if self._owner_node else frozenset())
            self._alive_known = True

    def _mark_dead(self, name: str) -> None:
        self._dead[name] = None
        if len(self._dead) > _DEAD_CACHE:
            self._dead.popitem(last=False)

    def _on_observed(self, children: list[str]) -> None:
        found = set()
        for child in children:
            table, _, column = unquote(child).partition("/")
            found.add((table, column))
        with self._lock:
            self._observed = frozenset(found)
            listeners = list(self._observed_listeners)
        self._observed_known.set()
        for callback in listeners:
            callback(self._observed)

    def _on_config(self, data: bytes | None, stat: Any) -> None:
        config: dict[str, Any] | None = None
        if data:
            try:
                config = json.loads(data)
            except ValueError:
                log.error("malformed configuration at %s: %r", self._config_path, data[:200])
        with self._lock:
            old, self._config = self._config, config
            listeners = list(self._config_listeners)
        self._config_known.set()
        if old is not None and config != old:
            log.warning("shared configuration changed: %s -> %s", old, config)
        for callback in listeners:
            callback(config)

    # --- the Coordination protocol -------------------------------------------------------

    def current_owner(self) -> str:
        """This client's owner id (``zk/<cluster id>/o-<hex>``), from memory.

        .. warning:: While the connection is SUSPENDED this waits up to *suspend_wait*
            seconds for it to come back (or for a new identity after a LOST session).

        :raises CoordinationError: when the session is lost and no new identity is
            registered in time, or the coordinator is closed.
        """
        owner = self._owner
        if owner is not None and self._connected.is_set():
            return owner
        if self._closed:
            raise CoordinationError("the ZooKeeper coordinator is closed")
        if self._connected.wait(self._suspend_wait):
            owner = self._owner
            if owner is not None:
                return owner
        raise CoordinationError(
            f"no live ZooKeeper session at {self.address!r} after {self._suspend_wait:g}s: "
            "not committing under a lost identity; retry the transaction later"
        )

    def confirm_owner(self, owner: str) -> None:
        """Raise unless *owner* is this client's identity and its session is confirmed
        live: from memory when the server answered within the last third of the
        session timeout, else by one ``exists`` of our owner node (a round trip on the
        session, given a third of the session timeout; a suspended connection confirms
        nothing). A process that was paused (SIGSTOP, a long GC) or cut off past its
        session timeout and comes back still believes itself connected until it talks
        to the server: this round trip is where it learns that its session expired,
        before its commit point instead of after."""
        with self._lock:
            node, current = self._owner_node, self._owner
        if node is None or current != owner:
            raise CoordinationError(
                f"the ZooKeeper identity {owner} that holds this transaction's locks is no "
                "longer this client's (its session expired): not committing them; retry "
                "the transaction")
        asked = time.monotonic()
        if asked - self._confirmed_at < self.session_timeout / 3:
            return
        if not self._connected.is_set():
            raise CoordinationError(
                f"the ZooKeeper connection at {self.address!r} is suspended: cannot "
                f"confirm the session of {owner}; not committing; retry the transaction")
        try:  # bounded: a request queued behind a partition must not wait for the heal
            stat = self._zk.exists_async(f"{self._owners_path}/{node}").get(
                timeout=self.session_timeout / 3)
            self._op()
        except Exception as e:
            raise CoordinationError(
                f"cannot confirm the ZooKeeper session of {owner} ({e}): not committing "
                "under an identity that may have expired; retry the transaction") from e
        if stat is None or stat.ephemeralOwner != self._zk.client_id[0]:
            raise CoordinationError(
                f"the ZooKeeper session of {owner} expired (its owner node is gone): not "
                "committing the locks taken under it; retry the transaction")
        self._confirmed_at = asked

    @property
    def suspended(self) -> bool:
        """True while the connection is down or the identity is not (re-)registered."""
        return not self._connected.is_set()

    def is_alive(self, owner: str) -> bool | None:
        """Whether *owner* holds its ZooKeeper node: True, False (gone for good) or None
        (not one of this cluster's ZooKeeper owners, or we are disconnected). Served from
        the watch-fed cache; only an owner unknown to the cache costs one ``sync`` +
        ``exists`` round trip, and a dead one is remembered."""
        parts = owner.split("/")
        if len(parts) != 3 or parts[0] != "zk" or parts[1] != self.cluster_id:
            return None
        name = parts[2]
        with self._lock:
            if name in self._dead:
                return False
            if not self._alive_known or not self._connected.is_set():
                return None
            if name in self._alive:
                return True
        try:
            self.stats["liveness_lookups"] += 1
            self._zk.sync(self._owners_path)
            stat = self._zk.exists(f"{self._owners_path}/{name}")
            self._op(2)
        except Exception as e:
            log.warning("liveness of %s unknown (%s)", owner, e)
            return None
        if stat is not None:
            return True
        with self._lock:
            self._mark_dead(name)
        return False

    def _bucket(self, key: str) -> int:
        return zlib.crc32(key.encode()) % self._buckets

    def try_advisory_lock(self, key: str) -> bool:
        """Take the advisory lock *key* without waiting; True if taken.

        Keys hash into *advisory_buckets* buckets. Across processes a bucket is leased
        with one ephemeral node; inside the process each key is exclusive. Taking a key
        whose bucket this process already leases costs nothing; a bucket leased by
        another process is refused (and not asked again for *lease_idle* seconds). A
        lease is given back *lease_idle* seconds after its last key was released, and
        vanishes with the session. Refused while the connection is suspended.
        """
        from kazoo.exceptions import NodeExistsError

        bucket = self._bucket(key)
        now = time.monotonic()
        with self._lock:
            if key in self._held_keys or not self._connected.is_set() or self._owner is None:
                return False
            lease = self._leases.get(bucket)
            if lease is not None:
                lease.users += 1
                lease.last_used = now
                self._held_keys[key] = bucket
                return True
            if bucket in self._acquiring or self._busy.get(bucket, 0.0) > now:
                return False
            self._acquiring.add(bucket)
            owner = self._owner
        path = f"{self._advisory_path}/b-{bucket}"
        taken = False
        try:
            try:
                self._zk.create(path, owner.encode(), ephemeral=True)
                self._op()
                taken = True
            except NodeExistsError:
                data, _ = self._zk.get(path)
                self._op(2)
                taken = data.decode() == owner  # our own node (a retried create)
        except Exception as e:
            log.warning("advisory lease of bucket %d failed: %s", bucket, e)
        with self._lock:
            self._acquiring.discard(bucket)
            if taken and self._owner == owner:
                lease = _Lease()
                lease.users = 1
                self._leases[bucket] = lease
                self._held_keys[key] = bucket
                self.stats["lease_acquired"] += 1
                return True
            self._busy[bucket] = time.monotonic() + self._lease_idle
            self.stats["lease_refused"] += 1
            return False

    def release_advisory_lock(self, key: str) -> None:
        """Release *key*; its bucket's lease is kept a while for the next keys in it."""
        with self._lock:
            bucket = self._held_keys.pop(key, None)
            if bucket is None:
                return
            lease = self._leases.get(bucket)
            if lease is not None:
                lease.users -= 1
                lease.last_used = time.monotonic()

    def _reap_leases(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [
                b for b, lease in self._leases.items()
                if lease.users <= 0 and now - lease.last_used > self._lease_idle
            ]
            for b in idle:
                del self._leases[b]
                self._acquiring.add(b)
            for b in [b for b, until in self._busy.items() if until <= now]:
                del self._busy[b]
        try:
            for b in idle:
                with contextlib.suppress(Exception):
                    self._zk.delete(f"{self._advisory_path}/b-{b}")
                    self._op()
                    self.stats["lease_released"] += 1
        finally:
            with self._lock:
                self._acquiring.difference_update(idle)

    # --- shared configuration ------------------------------------------------------------

    def config(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The published configuration ``{"store": url, "oracle": target}`` (None if none
        was published), kept current by a watch.

        .. warning:: Waits up to *timeout* seconds for the first watch event.
        """
        self._config_known.wait(timeout)
        with self._lock:
            return None if self._config is None else dict(self._config)

    @property
    def observed_registry(self) -> ObservedRegistry:
        """This coordination: it keeps the registry of observed columns in ZooKeeper."""
        return self

    def observed_columns(self, timeout: float = 5.0) -> frozenset[tuple[str, str]]:
        """The registry of observed ``(table, column)`` pairs, kept current by a watch."""
        if not self._observed_known.is_set():
            self._observed_known.wait(timeout)
        return self._observed

    def register_observed(self, table: str, column: str) -> None:
        """Add (*table*, *column*) to the registry of observed columns (idempotent); every
        client's watch sees it.

        :raises CoordinationError: when ZooKeeper refuses or cannot be reached.
        """
        from kazoo.exceptions import NodeExistsError

        name = quote(f"{table}/{column}", safe="")
        try:
            self._zk.create(f"{self._observed_path}/{name}", b"")
            self._op()
        except NodeExistsError:
            pass
        except Exception as e:
            raise CoordinationError(
                f"cannot register observed column {table}/{column} in ZooKeeper: {e}"
            ) from e
        with self._lock:  # read-your-writes before the watch event arrives
            self._observed = self._observed | {(table, column)}

    def add_observed_listener(self, callback: Any) -> None:
        """Call *callback(frozenset)* on kazoo's event thread whenever the registry changes
        (it must not block)."""
        with self._lock:
            self._observed_listeners.append(callback)

    # --- life cycle -----------------------------------------------------------------

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id (for tests and diagnostics)."""
        cid = self._zk.client_id
        return None if cid is None else int(cid[0])

    @property
    def client(self) -> Any:
        """The underlying ``KazooClient`` (for recipes that receive the client)."""
        return self._zk

    def close(self) -> None:
        """Delete this owner's node (its locks may be rolled back at once), give back the
        leases and close the session. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            node, self._owner, self._owner_node = self._owner_node, None, None
            leases, self._leases = list(self._leases), {}
        self._connected.clear()
        self._tasks.put("stop")
        self._thread.join(timeout=5)
        try:
            if self._zk.connected:
                if node is not None:
                    with contextlib.suppress(Exception):
                        self._zk.delete(f"{self._owners_path}/{node}")
                for b in leases:
                    with contextlib.suppress(Exception):
                        self._zk.delete(f"{self._advisory_path}/b-{b}")
        finally:
            with contextlib.suppress(Exception):
                self._zk.stop()
            with contextlib.suppress(Exception):
                self._zk.close()

    def __repr__(self) -> str:
        return f"<ZooKeeperCoordination {self.address} owner={self._owner}>"
