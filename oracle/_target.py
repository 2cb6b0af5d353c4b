"""Parsing of oracle targets and listen addresses, checked at the door."""

from __future__ import annotations

import re
from dataclasses import dataclass

from percolator import InvalidArgument

MAX_COUNT = 10_000_000
"""Largest block a single ``GetTimestamps`` call (or ``get_timestamps(n)``) may ask for."""

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
)
"""The gRPC channel options of :class:`~oracle.OracleClient`: a channel to an oracle that
restarts or fails over reconnects within half a second (gRPC's default backoff grows
to two minutes)."""

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")
_CHROOT = re.compile(r"^(/[A-Za-z0-9_.\-]+)*$")


@dataclass(frozen=True)
class GrpcTarget:
    """A single oracle server at ``address`` (``"host:port"``), over TLS if ``tls``."""

    address: str
    tls: bool = False

    def __str__(self) -> str:
        return f"{'grpcs' if self.tls else 'grpc'}://{self.address}"


@dataclass(frozen=True)
class ZooKeeperTarget:
    """Oracle servers elected through ZooKeeper ``hosts`` under ``chroot`` ("" is the root)."""

    hosts: str
    chroot: str

    def __str__(self) -> str:
        return f"zk://{self.hosts}{self.chroot}"


Target = GrpcTarget | ZooKeeperTarget


def parse_host_port(value: str, *, what: str = "address") -> tuple[str, int]:
    """Split ``"host:port"`` (IPv6 hosts in brackets) into host and port.

    :param value: the address.
    :param what: how the message names the argument.
    :raises InvalidArgument: if *value* is not ``host:port`` with a port in 0..65535.
    """
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a 'host:port' string, got {value!r}")
    m = _HOST_PORT.match(value)
    if m is None:
        raise InvalidArgument(f"{what} {value!r} is not of the form 'host:port'")
    port = int(m.group("port"))
    if port > 65535:
        raise InvalidArgument(f"{what} {value!r} has a port above 65535")
    return m.group("host"), port


def parse_zookeeper(value: str, *, what: str = "ZooKeeper address") -> ZooKeeperTarget:
    """Parse ``"host:port[,host:port...][/chroot]"``.

    :raises InvalidArgument: if *value* is malformed.
    """
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {value!r}")
    hosts, slash, rest = value.partition("/")
    chroot = (slash + rest).rstrip("/")
    if not hosts:
        raise InvalidArgument(f"{what} {value!r} names no ZooKeeper host")
    for hp in hosts.split(","):
        _host, port = parse_host_port(hp, what=f"{what} {value!r}: host")
        if port == 0:
            raise InvalidArgument(f"{what} {value!r} has port 0")
    if not _CHROOT.match(chroot):
        raise InvalidArgument(
            f"{what} {value!r} has a malformed chroot {chroot!r} (expected /name[/name...])"
        )
    return ZooKeeperTarget(hosts=hosts, chroot=chroot)


def parse_target(target: str) -> Target:
    """Parse an oracle target: ``"grpc://host:port"`` (plaintext), ``"grpcs://host:port"``
    (TLS) or ``"zk://host:port[,...]/chroot"``.

    :param target: the target string.
    :raises InvalidArgument: if *target* is not a string of one of those forms.
    """
    if not isinstance(target, str):
        raise InvalidArgument(f"oracle target must be a string, got {target!r}")
    scheme, sep, rest = target.partition("://")
    if not sep or scheme not in ("grpc", "grpcs", "zk"):
        raise InvalidArgument(
            f"oracle target {target!r} must look like 'grpc://host:port', "
            "'grpcs://host:port' (TLS) or 'zk://host:port/chroot'"
        )
    if scheme in ("grpc", "grpcs"):
        _host, port = parse_host_port(rest, what=f"oracle target {target!r}: address")
        if port == 0:
            raise InvalidArgument(f"oracle target {target!r} has port 0")
        return GrpcTarget(address=rest, tls=scheme == "grpcs")
    return parse_zookeeper(rest, what=f"oracle target {target!r}")


def published_address(address: str, tls: bool) -> str:
    """What a leader writes at the leader node: plaintext servers keep the bare
    ``"host:port"`` of earlier versions (their clients read it unchanged); TLS servers
    write ``"grpcs://host:port"``, which an old client cannot mistake for a plaintext
    address it could use."""
    return f"grpcs://{address}" if tls else address


def parse_published(value: str) -> GrpcTarget:
    """Read a leader node: ``"host:port"`` (plaintext, any version), ``"grpc://host:port"``
    or ``"grpcs://host:port"`` (TLS).

    :raises InvalidArgument: if *value* is none of these.
    """
    if "://" in value:
        target = parse_target(value)
        if not isinstance(target, GrpcTarget):
            raise InvalidArgument(f"published oracle leader {value!r} is not a gRPC address")
        return target
    parse_host_port(value, what="published oracle leader")
    return GrpcTarget(address=value)


def check_count(count: object) -> int:
    """Check a number of timestamps asked for: an int in 1..MAX_COUNT.

    :raises InvalidArgument: otherwise, quoting *count*.
    """
    if not isinstance(count, int) or isinstance(count, bool):
        raise InvalidArgument(f"count must be an integer, got {count!r}")
    if count < 1:
        raise InvalidArgument(f"count must be at least 1, got {count!r}")
    if count > MAX_COUNT:
        raise InvalidArgument(f"count must be at most {MAX_COUNT:,}, got {count!r}")
    return count


# ZooKeeper layout under the chroot, shared by the server and the client.
def zk_paths(chroot: str) -> tuple[str, str, str]:
    """The ZooKeeper paths of the oracles elected under *chroot*: the election (one
    ephemeral sequential node per server), the leader's published address
    (``grpc[s]://host:port``), and the ceiling (the highest timestamp the leader may
    serve, a fenced versioned set)."""
    base = f"{chroot}/percolator-oracle"
    return f"{base}/election", f"{base}/leader", f"{base}/ceiling"
