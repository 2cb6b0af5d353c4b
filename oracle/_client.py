"""The batching, linearizable timestamp oracle client.

At most one RPC is in flight per client; callers that arrive while it is out share the
next one (:class:`percolator._batching.BatchedDraws`, which says how), and a caller
never receives a timestamp from an RPC sent before it arrived: if ``get_timestamp()``
returned ``t`` (in any thread or process) before another call began, that call returns
more than ``t``. Spare timestamps are discarded, never cached.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from oracle._proto import timestamp_oracle_pb2 as pb
from oracle._proto import timestamp_oracle_pb2_grpc as pb_grpc
from oracle._target import (
    CHANNEL_OPTIONS,
    MAX_COUNT,
    GrpcTarget,
    Target,
    check_count,
    parse_host_port,
    parse_published,
    parse_target,
    zk_paths,
)
from percolator import InvalidArgument, OracleUnavailable, TlsConfig, TlsError
from percolator.ext import (
    HTTP2_PREFACE,
    BatchedDraws,
    check_tls,
    diagnose,
    make_client,
    start_client,
)

if TYPE_CHECKING:
    from kazoo.client import KazooClient

log = logging.getLogger("oracle.client")

#: Longest single RPC attempt (seconds); a hung leader costs at most this before a retry.
_ATTEMPT_TIMEOUT = 2.0
_RETRY_CODES_REFIND = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE)


@dataclass(frozen=True)
class OracleStatus:
    """What an oracle server says about itself.

    ``leader``: whether it serves timestamps now; ``persisted_ceiling``: highest
    timestamp durably recorded as possibly served; ``served``: timestamps served since it
    started; ``requests``/``allocations``: RPCs answered and allocator rounds that served
    them; ``address``: the address it publishes; ``mode``: ``"file"`` or ``"zookeeper"``.
    """

    leader: bool
    persisted_ceiling: int
    served: int
    requests: int
    allocations: int
    address: str
    mode: str


class _Retry(Exception):
    """One attempt failed in a way worth retrying (after finding the leader again)."""


class OracleClient:
    """Client of the timestamp oracle; thread-safe, one RPC in flight at a time.

    :param target: ``"grpc://host:port"`` (one server), ``"grpcs://host:port"`` (one
        server over TLS) or ``"zk://host:port[,...]/chroot"`` (servers elected through
        ZooKeeper; the client follows the published leader, over TLS if it publishes a
        ``grpcs://`` address).
    :param deadline: seconds a call keeps retrying (following leadership changes) before
        it raises :class:`~percolator._errors.OracleUnavailable`.
    :param tls: the CA that signs the oracle's certificate and this client's certificate
        and key for mutual TLS. With it the client speaks only TLS: a plaintext leader
        published in ZooKeeper is refused (no downgrade). Without it a ``grpcs://``
        server is verified against the system's roots.
    :param zookeeper_tls: TLS for the ZooKeeper connection of a ``zk://`` target.
    :raises InvalidArgument: for a malformed *target* or a non-positive *deadline*, or
        *tls* with a plaintext ``grpc://`` target.

    A TLS handshake that cannot succeed (certificate not trusted or expired, a client
    certificate required and missing or refused, TLS on one side only) raises
    :class:`~percolator._errors.TlsError` at once, saying which side refused and why.

    Usable as a context manager; :meth:`close` releases the channel (and ZooKeeper session).
    Do not share a client across ``fork()``: create one per process.
    """

    def __init__(
        self,
        target: str,
        *,
        deadline: float = 10.0,
        tls: TlsConfig | None = None,
        zookeeper_tls: TlsConfig | None = None,
    ) -> None:
        self._target: Target = parse_target(target)
        self._tls = check_tls(tls, "oracle tls")
        self._zookeeper_tls = check_tls(zookeeper_tls, "zookeeper_tls")
        if tls is not None and isinstance(self._target, GrpcTarget) and not self._target.tls:
            raise InvalidArgument(
                f"oracle target {target!r} is plaintext but TLS settings were given; "
                f"use 'grpcs://{self._target.address}'"
            )
        if not isinstance(deadline, int | float) or isinstance(deadline, bool) or not deadline > 0:
            raise InvalidArgument(
                f"deadline must be a positive number of seconds, got {deadline!r}"
            )
        self.target = target
        self.deadline = float(deadline)
        self._closed = False
        self._draws = BatchedDraws(
            self._get_timestamps_rpc, MAX_COUNT,
            lambda e: OracleUnavailable(f"the timestamp request was interrupted: {e!r}"),
        )
        # Connection state, touched only by the thread driving the current RPC (or status()).
        self._conn_lock = threading.Lock()
        self._address: str | None = None
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._zk: KazooClient | None = None
        self._zk_leader: GrpcTarget | str | None = None  # str: why it is unusable
        self._zk_watch_set = False

    # -- public API -----------------------------------------------------------------------

    def get_timestamp(self) -> int:
        """One fresh timestamp, larger than any returned (anywhere) before this call began.

        .. warning:: Blocks until the oracle answers, retrying for up to ``deadline``.

        :raises OracleUnavailable: if no oracle answered within the deadline.
        """
        return self.get_timestamps(1).start

    def get_timestamps(self, n: int) -> range:
        """*n* consecutive fresh timestamps for this caller, as a ``range``.

        :param n: how many, 1 to 10,000,000.
        :raises InvalidArgument: if *n* is not an integer in that range.
        :raises OracleUnavailable: if no oracle answered within the deadline, or the client
            is closed.
        """
        check_count(n)
        return self._draws.draw(n)

    def status(self) -> OracleStatus:
        """The status of the oracle server this client talks to (the leader, in ZooKeeper mode).

        :raises OracleUnavailable: if no oracle answered within the deadline.
        """
        if self._closed:
            raise OracleUnavailable(f"the oracle client for {self.target!r} is closed")
        r = self._call(lambda stub, timeout: stub.Status(pb.StatusRequest(), timeout=timeout))
        return OracleStatus(
            leader=r.leader,
            persisted_ceiling=r.persisted_ceiling,
            served=r.served,
            requests=r.requests,
            allocations=r.allocations,
            address=r.address,
            mode=r.mode,
        )

    def close(self) -> None:
        """Close the channel and the ZooKeeper session; later calls raise OracleUnavailable."""
        self._closed = True
        self._draws.close(OracleUnavailable(f"the oracle client for {self.target!r} is closed"))
        with self._conn_lock:
            self._drop_channel()
            if self._zk is not None:
                with contextlib.suppress(Exception):
                    self._zk.stop()
                with contextlib.suppress(Exception):
                    self._zk.close()
                self._zk = None

    def __enter__(self) -> OracleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OracleClient({self.target!r}, deadline={self.deadline})"

    def _get_timestamps_rpc(self, count: int) -> int:
        """One GetTimestamps RPC for *count* timestamps (the batch's): the first."""
        first: int = self._call(
            lambda stub, timeout: (
                stub.GetTimestamps(pb.GetTimestampsRequest(count=count), timeout=timeout).first
            )
        )
        return first

    # -- transport --------------------------------------------------------------------------

    def _call(self, op: Any) -> Any:
        """Run *op(stub, timeout)* against the current oracle, retrying until the deadline."""
        deadline = time.monotonic() + self.deadline
        delay = 0.01
        last = "no attempt"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OracleUnavailable(
                    f"no timestamp oracle answered at {self.target!r} within "
                    f"{self.deadline:g}s (last error: {last})"
                )
            try:
                with self._conn_lock:
                    stub = self._connect(remaining)
                return op(stub, min(remaining, _ATTEMPT_TIMEOUT))
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidArgument(f"oracle at {self.target!r}: {e.details()}") from None
                last = f"{code.name}: {e.details()}"
                if code == grpc.StatusCode.UNAVAILABLE:
                    self._diagnose(remaining)
                if code in _RETRY_CODES_REFIND:
                    with self._conn_lock:
                        self._forget_leader()
            except _Retry as e:
                last = str(e)
            except OracleUnavailable:
                raise
            remaining = deadline - time.monotonic()
            time.sleep(max(0.0, min(delay, remaining)))
            delay = min(delay * 2, 0.2)

    def _connect(self, remaining: float) -> Any:
        if self._closed:
            raise OracleUnavailable(f"the oracle client for {self.target!r} is closed")
        target = self._target
        server = target if isinstance(target, GrpcTarget) else self._zk_leader_address(remaining)
        if self._tls is not None and not server.tls:
            raise TlsError(
                f"the oracle leader published at {self.target!r} is plaintext "
                f"({server.address}) but this client requires TLS (tls={self._tls!r}): "
                "start the oracles with --tls-cert/--tls-key, or connect without TLS"
            )
        address = str(server)
        if self._stub is None or address != self._address:
            self._drop_channel()
            if server.tls:
                ca, cert, key = (self._tls or TlsConfig()).read()
                creds = grpc.ssl_channel_credentials(
                    root_certificates=ca, private_key=key, certificate_chain=cert
                )
                self._channel = grpc.secure_channel(server.address, creds, options=CHANNEL_OPTIONS)
            else:
                self._channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)
            self._stub = pb_grpc.TimestampOracleStub(self._channel)
            self._address = address
        return self._stub

    def _diagnose(self, remaining: float) -> None:
        """After UNAVAILABLE: raise TlsError if a handshake of our own shows why TLS (or
        plaintext) cannot work with the current server; otherwise return (it is down, or
        busy, and the call retries)."""
        address = self._address
        if address is None:
            return
        server = parse_published(address)
        host, port = parse_host_port(server.address)
        tls = (self._tls or TlsConfig()) if server.tls else None
        problem = diagnose(
            (host.strip("[]"), port),
            tls,
            peer=f"the oracle at {address}",
            timeout=max(0.1, min(remaining, 2.0)),
            hello=HTTP2_PREFACE,
            answers_hello=True,  # a gRPC server answers the preface with its SETTINGS
            alpn=["h2"],
        )
        if problem is not None:
            raise TlsError(problem)

    def _drop_channel(self) -> None:
        if self._channel is not None:
            with contextlib.suppress(Exception):
                self._channel.close()
        self._channel = None
        self._stub = None
        self._address = None

    def _forget_leader(self) -> None:
        # For a single grpc target a fresh channel reconnects without grpc's backoff; for
        # ZooKeeper the watch keeps the leader address current, so the channel follows it.
        self._drop_channel()

    def _zk_leader_address(self, remaining: float) -> GrpcTarget:
        assert not isinstance(self._target, GrpcTarget)
        _, leader_path, _ = zk_paths(self._target.chroot)
        if self._zk is None:
            hosts = self._target.hosts
            zk = make_client(hosts, session_timeout=10.0, tls=self._zookeeper_tls)
            try:
                start_client(zk, hosts, max(0.1, min(remaining, 5.0)), self._zookeeper_tls)
            except TlsError:
                raise
            except Exception as e:
                raise _Retry(f"cannot connect to ZooKeeper {hosts}: {e}") from None
            self._zk = zk
            self._zk_watch_set = False
        if not self._zk_watch_set:

            def watch(data: bytes | None, stat: Any) -> None:
                if not data:
                    self._zk_leader = None
                    return
                try:
                    self._zk_leader = parse_published(data.decode())
                except (InvalidArgument, UnicodeDecodeError) as e:
                    self._zk_leader = f"malformed leader address at {leader_path}: {e}"

            try:
                self._zk.DataWatch(leader_path, watch)
            except Exception as e:
                raise _Retry(f"cannot read {leader_path} in ZooKeeper: {e!r}") from None
            self._zk_watch_set = True
        leader = self._zk_leader
        if leader is None:
            raise _Retry(f"no oracle leader published at {leader_path}")
        if isinstance(leader, str):
            raise _Retry(leader)
        return leader
