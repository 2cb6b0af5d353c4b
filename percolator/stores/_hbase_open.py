"""Opening an HBase store from its url (``percolator.stores.BACKENDS["hbase"]``):
the options, and the store's kind, which may be Thrift1 (:mod:`percolator.stores.hbase`),
Thrift2 (:mod:`percolator.stores._hbase_thrift2`) or Thrift1 with a Thrift2 server beside
it for what Thrift1 cannot say (:class:`HBaseStoreWithThrift2`). Apart from both store
modules so that neither imports the other's back (the Thrift2 store builds on the
Thrift1 one's helpers)."""

from __future__ import annotations

from typing import Any

from percolator._errors import InvalidArgument, StoreUnavailable
from percolator._store import DELETE_IF, Store
from percolator._tls import TlsConfig, check_tls
from percolator.stores._hbase_thrift2 import HBaseThrift2Store, parse_address
from percolator.stores._url import parse_store_url
from percolator.stores.hbase import (
    _APIS,
    _COMPRESSIONS,
    _HTTP,
    _NAMESPACE,
    _OPTIONS,
    _PROTOCOLS,
    _TABLE,
    _TRANSPORTS,
    _UNSUPPORTED_TRANSPORTS,
    DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_POOL_SIZE,
    DEFAULT_PORT,
    DEFAULT_TIMEOUT_MS,
    HBaseStore,
)

__all__ = ["HBaseStoreWithThrift2", "open_hbase_store"]


class HBaseStoreWithThrift2(HBaseStore):
    """:class:`HBaseStore` that also reaches the cluster's Thrift2 server (*thrift2*:
    ``(host, port)``) for what Thrift1 cannot say: the conditional delete
    (:class:`percolator._store.ConditionalDelete`) with which garbage collection
    removes a deleted cell's last FREE lock, through a Thrift2 store on the same
    tables (``percolator/stores/_hbase_thrift2.py``)."""

    capabilities = HBaseStore.capabilities | {DELETE_IF}

    def __init__(self, host: str, port: int, *, thrift2: tuple[str, int], **options: Any) -> None:
        super().__init__(host, port, **options)
        try:
            self._thrift2 = HBaseThrift2Store(*thrift2, **{**options, "pool_size": 1})
        except BaseException:
            super().close()
            raise

    def delete_if(self, table: str, row: bytes, column: str, expected: bytes) -> bool:
        """Remove every version of ``(row, column)`` if its latest value is *expected*:
        one Thrift2 ``checkAndMutate``.

        :raises UnknownTableError: *table* does not exist.
        :raises StoreUnavailable: the Thrift2 server could not be reached or failed; the
            delete may or may not have been applied.
        """
        if self._closed:
            raise StoreUnavailable(f"the store {self.url} is closed")
        return self._thrift2.delete_if(table, row, column, expected)

    def close(self) -> None:
        self._thrift2.close()
        super().close()


def _tls_option(parsed: Any, url: str) -> TlsConfig | None:
    """The ``tls`` keyword (a :class:`~percolator.TlsConfig`), or one made of the
    url's ``tls_ca``, ``tls_cert`` and ``tls_key`` paths; None without either."""
    given = check_tls(parsed.options.get("tls"), "option tls")
    paths = {k: parsed.text(f"tls_{k}", "") or None for k in ("ca", "cert", "key")}
    if given is not None and any(paths.values()):
        raise InvalidArgument(f"give either tls= or tls_ca/tls_cert/tls_key in {url!r}, not both")
    if given is None and any(paths.values()):
        return TlsConfig(**paths)
    return given


def open_hbase_store(url: str, **options: Any) -> Store:
    """Open the HBase store at *url*
    (``hbase://host:port?namespace=NS&table_prefix=P&transport=framed&protocol=compact``).

    *options* may give any query option (``namespace``, ``table_prefix``, ``pool_size``,
    ``timeout`` and ``idle_timeout`` in seconds, ``transport``, ``protocol``,
    ``max_request_bytes``, ``compression``, ``thrift2``) instead of, or over, the URL's
    query. ``thrift2=host:port`` names the cluster's Thrift2 server, through which
    garbage collection removes the FREE lock of a deleted cell (Thrift1 cannot).

    :raises InvalidArgument: a malformed URL or option, or a Thrift transport that
        happybase cannot speak (HTTP, SASL/Kerberos).
    :raises StoreUnavailable: the Thrift server cannot be reached.
    """
    parsed = parse_store_url(url, "hbase", options, known=_OPTIONS)
    parts = parsed.parts
    try:
        host, port = parts.hostname, parts.port or DEFAULT_PORT
    except ValueError:
        raise InvalidArgument(f"bad port in store url {url!r}")
    if not host or parts.path not in ("", "/") or parts.fragment or parts.username:
        raise InvalidArgument(
            f"bad store url {url!r}: expected hbase://host:port?namespace=NS&table_prefix=P"
        )
    namespace = parsed.text("namespace", "") or None
    if namespace is not None and not _NAMESPACE.match(namespace):
        raise InvalidArgument(f"bad HBase namespace {namespace!r} in {url!r}")
    prefix = parsed.text("table_prefix", "") or None
    if prefix is not None and not _TABLE.match(prefix):
        raise InvalidArgument(f"bad table_prefix {prefix!r} in {url!r}")
    api = parsed.text("api", "thrift1").lower()
    if api not in _APIS:
        raise InvalidArgument(
            f"option api={api!r} in {url!r} must be one of {list(_APIS)}: the HBase Thrift "
            "server the URL's host:port names (hbase thrift start, or hbase thrift2 start)"
        )
    transport = parsed.text("transport", "buffered").lower()
    tls = _tls_option(parsed, url)
    if api == "thrift2" and transport in ("http", "https"):
        if tls is not None and transport != "https":
            raise InvalidArgument(
                f"TLS options in {url!r} need transport=https: HBase's Thrift server "
                "serves TLS on its HTTP transport (hbase.thrift.ssl.enabled)")
    elif tls is not None:
        raise InvalidArgument(
            f"TLS options in {url!r} need api=thrift2 and transport=https: HBase's Thrift "
            "server serves TLS on its HTTP transport only (hbase.regionserver.thrift.http, "
            "hbase.thrift.ssl.enabled), which happybase cannot speak (docs/tls.md)")
    elif transport in _UNSUPPORTED_TRANSPORTS:
        raise InvalidArgument(
            f"option transport={transport!r} in {url!r}: {_UNSUPPORTED_TRANSPORTS[transport]} "
            "is not supported (happybase speaks Thrift1 over plain sockets only); run the "
            "HBase Thrift server in socket mode (transport=buffered or transport=framed)"
        )
    if transport not in _TRANSPORTS and not (api == "thrift2" and transport in _HTTP):
        raise InvalidArgument(
            f"option transport={transport!r} in {url!r} must be one of {list(_TRANSPORTS)}"
        )
    protocol = parsed.text("protocol", "binary").lower()
    if protocol not in _PROTOCOLS:
        raise InvalidArgument(
            f"option protocol={protocol!r} in {url!r} must be one of {list(_PROTOCOLS)}"
        )
    compression = parsed.text("compression", "NONE").upper()
    if compression not in _COMPRESSIONS:
        raise InvalidArgument(
            f"option compression={compression!r} in {url!r} must be one of "
            f"{list(_COMPRESSIONS)} (and available on the region servers)"
        )
    # Thrift's sockets count milliseconds; the options, like the whole API, seconds.
    timeout_ms = max(1, round(parsed.seconds("timeout", DEFAULT_TIMEOUT_MS / 1000) * 1000))
    idle_timeout_ms = max(
        1, round(parsed.seconds("idle_timeout", DEFAULT_IDLE_TIMEOUT_MS / 1000) * 1000)
    )
    thrift2 = parsed.text("thrift2", "") or None
    kind: type[HBaseStore] = HBaseStore
    extra: dict[str, Any] = {}
    if api == "thrift2":
        if thrift2 is not None:
            raise InvalidArgument(
                f"option thrift2={thrift2!r} in {url!r} names the Thrift2 server of a "
                "Thrift1 store; with api=thrift2 the URL's host:port is the Thrift2 "
                "server: drop the option"
            )
        kind = HBaseThrift2Store
        extra = {"tls": tls}
    elif thrift2 is not None:
        kind, extra = HBaseStoreWithThrift2, {"thrift2": parse_address(thrift2, url)}
    return kind(
        host,
        port,
        **extra,
        namespace=namespace,
        table_prefix=prefix,
        pool_size=parsed.integer("pool_size", DEFAULT_POOL_SIZE),
        timeout_ms=timeout_ms,
        idle_timeout_ms=idle_timeout_ms,
        transport=transport,
        protocol=protocol,
        max_request_bytes=parsed.integer("max_request_bytes", DEFAULT_MAX_REQUEST_BYTES),
        compression=compression,
    )
