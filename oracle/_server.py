"""The timestamp oracle server: gRPC front, one allocator thread, a durable ceiling.

How a timestamp is served (DESIGN.md section 6):

* a gRPC handler checks the count and enqueues a request, then waits for it (on a lock
  of its own that the allocator releases: one wake-up, no condition variable);
* the one allocator thread takes *everything* queued, and serves it in one allocation:
  if the block would pass the persisted ceiling it first records a new ceiling durably
  (a fsynced file, or a versioned ``set`` in ZooKeeper), then hands each request its own
  consecutive range from memory;
* after a restart (or ``kill -9``) the server starts above the recorded ceiling, so it
  never reissues a timestamp nor goes backwards.

In ZooKeeper mode several servers run; one wins a kazoo election, publishes its address
in an ephemeral node, and serves. A leader stops serving at once when its session is
suspended or lost, when its lease (renewed by ZooKeeper round trips, shorter than the
session timeout) runs out, or when a versioned set of the ceiling fails (someone else
wrote it: we were deposed).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from oracle._proto import timestamp_oracle_pb2 as pb
from oracle._proto import timestamp_oracle_pb2_grpc as pb_grpc
from oracle._target import (
    MAX_COUNT,
    parse_host_port,
    parse_zookeeper,
    published_address,
    zk_paths,
)
from percolator import InvalidArgument, TlsConfig
from percolator.ext import (
    check_tls,
    describe_server,
    make_client,
    pause_point,
    start_client,
    validity_problem,
)
from percolator.metrics import observe as _observe

if TYPE_CHECKING:
    from kazoo.client import KazooClient

log = logging.getLogger("oracle.server")

#: Default number of timestamps reserved by one durable write of the ceiling.
DEFAULT_BLOCK_SIZE = 1_000_000
#: Default ZooKeeper session timeout of a server (seconds); failover takes about this long
#: after a leader dies without closing its session.
DEFAULT_SESSION_TIMEOUT = 2.0
#: How long a handler waits for the allocator before answering UNAVAILABLE (seconds).
_HANDLER_WAIT = 10.0


class _Fenced(Exception):
    """The ceiling was written by someone else: this server is no longer the leader."""


class _Request:
    """One queued GetTimestamps call; ``done`` is held until the request is answered."""

    __slots__ = ("answered", "code", "count", "done", "error", "first")

    def __init__(self, count: int) -> None:
        self.count = count
        self.first = 0
        self.code: grpc.StatusCode | None = None
        self.error = ""
        self.answered = False
        self.done = threading.Lock()
        self.done.acquire()

    def answer(self) -> None:
        """Wake the handler waiting for this request (once; later calls do nothing)."""
        if not self.answered:
            self.answered = True
            self.done.release()


@dataclass
class _Counters:
    served: int = 0
    requests: int = 0
    allocations: int = 0


class _Allocator:
    """Serves queued requests from memory below a durably persisted ceiling.

    *persist(new_ceiling)* must record the ceiling durably and raise :class:`_Fenced` when
    this server may no longer write it; *may_serve()* returns ``None`` when serving is
    allowed, else the reason it is not (checked under the state lock right before any
    range is handed out).
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._qlock = threading.Lock()  # guards _queue, _sleeping, _stopped
        self._queue: list[_Request] = []
        self._stopped = False
        # The allocator thread sleeps on _wake (held) when the queue is empty; the first
        # request queued after that releases it: one wake-up per batch, none while it works.
        self._sleeping = False
        self._wake = threading.Lock()
        self._wake.acquire()
        self._state = threading.Lock()  # guards active/next/ceiling and the hand-out
        self._active = False
        self._next = 0
        self._ceiling = 0
        self._persist: Callable[[int], None] | None = None
        self._may_serve: Callable[[], str | None] = lambda: None
        self.counters = _Counters()
        self._thread = threading.Thread(target=self._run, name="oracle-allocator", daemon=True)

    # -- control ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._qlock:
            self._stopped = True
            self._rouse()
        self._thread.join(timeout=5)
        self._fail(self._take_all(), grpc.StatusCode.UNAVAILABLE, "oracle server is stopping")

    def activate(
        self,
        ceiling: int,
        persist: Callable[[int], None],
        may_serve: Callable[[], str | None] = lambda: None,
        *,
        persisted: int | None = None,
    ) -> None:
        """Start serving above *ceiling* (every timestamp ever served is <= it).

        *persisted* (default *ceiling*) is the ceiling already recorded durably, up to
        which timestamps may be served without another write.
        """
        with self._state:
            self._next = ceiling + 1
            self._ceiling = ceiling if persisted is None else persisted
            self._persist = persist
            self._may_serve = may_serve
            self._active = True
        log.info("serving timestamps above %d", ceiling)

    def deactivate(self) -> None:
        """Stop serving; once this returns no further timestamp is handed out."""
        with self._state:
            was = self._active
            self._active = False
        if was:
            log.warning("stopped serving timestamps")

    @property
    def active(self) -> bool:
        return self._active and self._may_serve() is None

    @property
    def ceiling(self) -> int:
        return self._ceiling

    # -- requests ---------------------------------------------------------------------

    def submit(self, count: int) -> _Request:
        req = _Request(count)
        with self._qlock:
            if self._stopped:
                req.code, req.error = grpc.StatusCode.UNAVAILABLE, "oracle server is stopping"
                req.answer()
                return req
            self._queue.append(req)
            self._rouse()
        return req

    def _rouse(self) -> None:
        """Wake the allocator thread if it sleeps (called with _qlock held)."""
        if self._sleeping:
            self._sleeping = False
            self._wake.release()

    def _take_all(self) -> list[_Request]:
        with self._qlock:
            batch, self._queue = self._queue, []
        return batch

    @staticmethod
    def _fail(batch: list[_Request], code: grpc.StatusCode, message: str) -> None:
        for req in batch:
            if not req.answered:
                req.code, req.error = code, message
                req.answer()

    def _run(self) -> None:
        while True:
            with self._qlock:
                if self._stopped:
                    return
                batch, self._queue = self._queue, []
                self._sleeping = not batch
            if not batch:
                self._wake.acquire()
                continue
            try:
                self._serve(batch)
            except Exception:  # never let the allocator die silently
                log.exception("allocator failed")
                self._fail(batch, grpc.StatusCode.INTERNAL, "oracle allocator failed")

    def _serve(self, batch: list[_Request]) -> None:
        total = sum(req.count for req in batch)
        with self._state:
            if not self._active:
                self._fail(batch, grpc.StatusCode.FAILED_PRECONDITION, "not leader")
                return
            last = self._next + total - 1
            if last > self._ceiling:
                new_ceiling = last + max(self.block_size, 2 * total)
                assert self._persist is not None
                try:
                    self._persist(new_ceiling)
                except _Fenced as e:
                    self._active = False
                    log.error("deposed while persisting the ceiling: %s", e)
                    self._fail(batch, grpc.StatusCode.FAILED_PRECONDITION, f"not leader: {e}")
                    return
                except Exception as e:
                    log.error("could not persist ceiling %d: %s", new_ceiling, e)
                    self._fail(
                        batch, grpc.StatusCode.UNAVAILABLE, f"could not persist the ceiling: {e}"
                    )
                    return
                self._ceiling = new_ceiling
            reason = self._may_serve()
            if reason is not None:
                self._fail(batch, grpc.StatusCode.FAILED_PRECONDITION, f"not leader: {reason}")
                return
            nxt = self._next
            for req in batch:
                req.first = nxt
                nxt += req.count
            self._next = nxt
            c = self.counters
            _observe("percolator_oracle_batch_size", len(batch))
            c.served += total
            c.requests += len(batch)
            c.allocations += 1
        for req in batch:
            req.answer()


# -- durable ceilings ---------------------------------------------------------------------


class _FileCeiling:
    """The ceiling in a local file, replaced atomically and fsynced; one server per file."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise InvalidArgument(f"state file {path!r}: directory {directory!r} does not exist")
        self._lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise InvalidArgument(
                f"state file {path!r} is in use by another oracle server"
            ) from None

    def load(self) -> int:
        try:
            with open(self.path, encoding="ascii") as f:
                text = f.read().strip()
        except FileNotFoundError:
            return 0
        try:
            value = int(text)
        except ValueError:
            raise InvalidArgument(
                f"state file {self.path!r} does not hold a timestamp: {text[:40]!r}"
            ) from None
        if value < 0:
            raise InvalidArgument(f"state file {self.path!r} holds a negative ceiling {value}")
        return value

    def store(self, ceiling: int) -> None:
        tmp = f"{self.path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{ceiling}\n".encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(os.path.dirname(self.path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)


class _ZooKeeperLeadership:
    """Election, address publication, fenced ceiling and lease in ZooKeeper."""

    def __init__(
        self,
        zookeeper: str,
        advertise: str,
        allocator: _Allocator,
        session_timeout: float,
        tls: TlsConfig | None = None,
    ) -> None:
        target = parse_zookeeper(zookeeper, what="--zookeeper")
        self.target = target
        self.election_path, self.leader_path, self.ceiling_path = zk_paths(target.chroot)
        self.advertise = advertise
        self.allocator = allocator
        self.session_timeout = session_timeout
        self.tls = tls
        self.client: KazooClient = make_client(
            target.hosts, session_timeout=session_timeout, tls=tls
        )
        self.client.add_listener(self._on_state)
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._connected = False
        self._leading = False
        self._lease_until = 0.0
        self._version = -1
        self._election: Any = None
        self._thread = threading.Thread(target=self._loop, name="oracle-election", daemon=True)

    # kazoo calls this from its connection thread: never block here.
    def _on_state(self, state: str) -> None:
        from kazoo.protocol.states import KazooState

        self._connected = state == KazooState.CONNECTED
        if state != KazooState.CONNECTED and self._leading:
            log.warning("ZooKeeper session %s: pausing", state.lower())
        if state == KazooState.LOST:
            self._lost.set()

    def start(self) -> None:
        start_client(
            self.client, self.target.hosts, max(10.0, self.session_timeout * 3), self.tls
        )
        self._connected = True
        self.client.ensure_path(self.election_path)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._lost.set()
        self.allocator.deactivate()
        election = self._election
        if election is not None:  # a standby waits in the election's lock: stop waiting
            with contextlib.suppress(Exception):
                election.cancel()
        with contextlib.suppress(Exception):
            self._thread.join(timeout=self.session_timeout + 2)
        with contextlib.suppress(Exception):
            self.client.stop()
        with contextlib.suppress(Exception):
            self.client.close()

    @property
    def leading(self) -> bool:
        return self._leading and self.may_serve() is None

    def may_serve(self) -> str | None:
        if not self._leading:
            return "not elected"
        if not self._connected:
            return "ZooKeeper connection suspended or lost"
        if self._lost.is_set():
            return "ZooKeeper session lost"
        if time.monotonic() >= self._lease_until:
            return "leadership lease expired"
        return None

    def _loop(self) -> None:
        from kazoo.exceptions import CancelledError

        while not self._stop.is_set():
            try:
                self._lost.clear()
                election = self.client.Election(self.election_path, identifier=self.advertise)
                self._election = election
                if self._stop.is_set():
                    break
                log.info("standing for election at %s%s", self.target, self.election_path)
                election.run(self._lead)
            except CancelledError:
                pass
            except Exception as e:
                if self._stop.is_set():
                    break
                log.warning("election attempt failed: %s", e)
            self._stop.wait(0.2)

    def _renew(self) -> bool:
        """One ZooKeeper round trip; extends the lease from the time it was sent."""
        sent = time.monotonic()
        try:
            self.client.exists(self.ceiling_path)
        except Exception as e:
            log.warning("lease renewal failed: %s", e)
            return False
        if self._connected and not self._lost.is_set():
            self._lease_until = sent + self.session_timeout * 0.5
            return True
        return False

    def _persist(self, ceiling: int) -> None:
        from kazoo.exceptions import BadVersionError, NoNodeError

        pause_point("oracle.persist")  # tests park a deposed leader here
        try:
            stat = self.client.set(
                self.ceiling_path, str(ceiling).encode("ascii"), version=self._version
            )
        except (BadVersionError, NoNodeError) as e:
            self._leading = False
            self._lost.set()
            raise _Fenced(f"the ceiling at {self.ceiling_path} changed under us ({e!r})") from e
        self._version = stat.version

    def _lead(self) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        if self._stop.is_set():
            return
        client = self.client
        try:
            client.create(self.ceiling_path, b"0", makepath=True)
        except NodeExistsError:
            pass
        data, stat = client.get(self.ceiling_path)
        ceiling = int(data.decode("ascii") or "0")
        self._version = stat.version
        # Fence every earlier leader right away: bump the ceiling with a versioned set.
        start_ceiling = ceiling + self.allocator.block_size
        self._persist(start_ceiling)
        try:
            client.delete(self.leader_path)
        except NoNodeError:
            pass
        client.create(self.leader_path, self.advertise.encode(), ephemeral=True, makepath=True)
        self._leading = True
        self._renew()
        # Serve above the ceiling we read: everything below it may have been served.
        self.allocator.activate(ceiling, self._persist, self.may_serve, persisted=start_ceiling)
        log.info("elected leader at %s, serving from %d", self.advertise, ceiling + 1)
        try:
            period = self.session_timeout / 6
            while not self._lost.wait(period):
                if self._stop.is_set():
                    break
                self._renew()
        finally:
            self._leading = False
            self.allocator.deactivate()
            if not self._lost.is_set() or self._stop.is_set():
                with contextlib.suppress(Exception):
                    client.delete(self.leader_path)
            log.warning("no longer the leader")


# -- gRPC service ---------------------------------------------------------------------


class _Servicer(pb_grpc.TimestampOracleServicer):  # type: ignore[misc]
    def __init__(self, server: OracleServer) -> None:
        self._server = server

    def GetTimestamps(self, request: Any, context: Any) -> Any:
        count = request.count
        if count < 1 or count > MAX_COUNT:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"count must be between 1 and {MAX_COUNT:,}, got {count}",
            )
        req = self._server._allocator.submit(count)
        if not req.done.acquire(timeout=_HANDLER_WAIT):
            context.abort(grpc.StatusCode.UNAVAILABLE, "the allocator did not answer in time")
        if req.code is not None:
            context.abort(req.code, req.error)
        return pb.GetTimestampsResponse(first=req.first, count=req.count)

    def Status(self, request: Any, context: Any) -> Any:
        s = self._server
        c = s._allocator.counters
        return pb.StatusResponse(
            leader=s._allocator.active,
            persisted_ceiling=s._allocator.ceiling,
            served=c.served,
            requests=c.requests,
            allocations=c.allocations,
            address=s.address,
            mode=s.mode,
        )


class OracleServer:
    """A timestamp oracle server (see the module docstring of :mod:`oracle`).

    Exactly one of *state_file* (a single oracle, ceiling in a local fsynced file) and
    *zookeeper* (``"host:port[,...]/chroot"``: election, leader address and ceiling in
    ZooKeeper) must be given.

    :param listen: ``"host:port"`` to listen on (port 0 picks a free port).
    :param state_file: path of the ceiling file (its directory must exist).
    :param zookeeper: ZooKeeper connection string with optional chroot.
    :param advertise: ``"host:port"`` published to clients in ZooKeeper; defaults to
        *listen* with the bound port.
    :param block_size: timestamps reserved per durable write of the ceiling.
    :param session_timeout: ZooKeeper session timeout in seconds; the leader stops serving
        half of it after its last successful ZooKeeper round trip. ZooKeeper must grant it
        (it lies within the server's minSessionTimeout..maxSessionTimeout).
    :param max_workers: gRPC handler threads.
    :param tls: serve over TLS: ``cert`` and ``key`` are the server's certificate chain
        and private key; with ``ca`` too, clients must present a certificate signed by
        it (mutual TLS). Without *tls* the server is plaintext and says so in its log.
        A TLS leader publishes ``grpcs://host:port`` in ZooKeeper.
    :param zookeeper_tls: TLS for the ZooKeeper connection.
    :raises InvalidArgument: for a malformed argument, a state file in use, or *tls*
        without a certificate and key.
    """

    def __init__(
        self,
        listen: str,
        *,
        state_file: str | None = None,
        zookeeper: str | None = None,
        advertise: str | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        session_timeout: float = DEFAULT_SESSION_TIMEOUT,
        max_workers: int = 32,
        tls: TlsConfig | None = None,
        zookeeper_tls: TlsConfig | None = None,
    ) -> None:
        host, _port = parse_host_port(listen, what="listen address")
        self.tls = check_tls(tls, "tls")
        check_tls(zookeeper_tls, "zookeeper_tls")
        if tls is not None and tls.cert is None:
            raise InvalidArgument(
                "a TLS oracle server needs a certificate and key (--tls-cert, --tls-key)"
            )
        if (state_file is None) == (zookeeper is None):
            raise InvalidArgument(
                "give exactly one of state_file and zookeeper, got "
                f"state_file={state_file!r}, zookeeper={zookeeper!r}"
            )
        if not isinstance(block_size, int) or block_size < 1:
            raise InvalidArgument(f"block_size must be a positive integer, got {block_size!r}")
        if not session_timeout > 0:
            raise InvalidArgument(f"session_timeout must be positive, got {session_timeout!r}")
        if advertise is not None:
            parse_host_port(advertise, what="advertise address")
        if zookeeper is not None:
            parse_zookeeper(zookeeper, what="zookeeper")
        self.mode = "file" if state_file is not None else "zookeeper"
        self._listen = listen
        self._allocator = _Allocator(block_size)
        self._grpc = grpc.server(
            ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="oracle-rpc"),
            options=[("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=max_workers * 64,
        )
        pb_grpc.add_TimestampOracleServicer_to_server(_Servicer(self), self._grpc)
        try:
            if tls is None:
                bound = self._grpc.add_insecure_port(listen)
            else:
                ca, cert, key = tls.read()
                assert cert is not None and key is not None
                creds = grpc.ssl_server_credentials(
                    [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
                )
                bound = self._grpc.add_secure_port(listen, creds)
        except RuntimeError as e:
            raise InvalidArgument(f"cannot listen on {listen!r}: {e}") from None
        if not bound:
            raise InvalidArgument(f"cannot listen on {listen!r}")
        self.port: int = bound
        self.address = advertise or f"{host}:{bound}"
        self._file: _FileCeiling | None = None
        self._zk: _ZooKeeperLeadership | None = None
        if state_file is not None:
            self._file = _FileCeiling(state_file)
        else:
            assert zookeeper is not None
            self._zk = _ZooKeeperLeadership(
                zookeeper,
                published_address(self.address, tls is not None),
                self._allocator,
                session_timeout,
                zookeeper_tls,
            )
        self._stopped = threading.Event()

    def start(self) -> None:
        """Start serving (file mode) or standing for election (ZooKeeper mode).

        :raises InvalidArgument: if the state file is unreadable.
        """
        if self.tls is not None and self.tls.cert is not None:
            problem = validity_problem(self.tls.cert)
            if problem is not None:  # clients will refuse it: say so where operators look
                log.error("the server certificate %s %s: clients will refuse it; renew it",
                          self.tls.cert, problem)
        self._allocator.start()
        if self._file is not None:
            ceiling = self._file.load()
            self._allocator.activate(ceiling, self._file.store)
        self._grpc.start()
        if self._zk is not None:
            self._zk.start()
        log.log(
            logging.INFO if self.tls is not None else logging.WARNING,
            "oracle listening on %s (%s mode, %s)",
            self.address,
            self.mode,
            describe_server(self.tls),
        )

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving, leave the election, close the state file."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._allocator.deactivate()
        if self._zk is not None:
            self._zk.stop()
        self._grpc.stop(grace).wait(grace + 1)
        self._allocator.stop()
        if self._file is not None:
            self._file.close()
        log.info("oracle stopped")

    def metrics(self) -> list[tuple[str, tuple[str, ...], float]]:
        """This server's counters as ``(metric name, labels, value)`` for
        :func:`percolator.metrics.add_gauge_callback` (read at scrape time: serving
        pays nothing for them)."""
        c = self._allocator.counters
        return [
            ("percolator_oracle_timestamps_served_total", (), c.served),
            ("percolator_oracle_requests_total", (), c.requests),
            ("percolator_oracle_batches_total", (), c.allocations),
            ("percolator_oracle_leader", (), 1.0 if self._allocator.active else 0.0),
            ("percolator_oracle_persisted_ceiling", (), self._allocator.ceiling),
        ]

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`stop` is called; returns whether it was."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> OracleServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
