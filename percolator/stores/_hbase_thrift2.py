"""HBase's Thrift2 server, for the one thing Thrift1 cannot say: a conditional delete.

Thrift1's ``checkAndPut`` can only put, so on HBase a garbage collection pass that
removes a deleted cell entirely used to leave that cell's FREE lock behind (a few bytes
per cell, for ever: docs/garbage-collection.md). HBase's Thrift2 server (the same
``hbase-thrift`` artifact: ``hbase thrift2 start``) has ``checkAndMutate``, whose row
mutations may delete. Given a Thrift2 address (``hbase://host:9090?thrift2=host:9091``),
the HBase store declares :class:`percolator._store.ConditionalDelete` and the collector
removes those locks too, each with one ``checkAndMutate`` that deletes the lock column
only while it still holds the FREE value the pass read.

No ABA: a FREE value carries the start timestamp of the transaction that released it,
so it is never written twice; a lock taken and released again meanwhile holds another
value, and the delete does not apply. The Thrift server's HBase client retries
``checkAndMutate`` without a nonce, so a delete that applied may answer False on a
replay: the collector then counts one version fewer, and the cell is gone all the same.

Only the part of HBase 2.6's ``thrift2/hbase.thrift`` these calls use is declared below
(same field ids); thriftpy2 (happybase's Thrift library) compiles it at import.
"""

from __future__ import annotations

import io
import threading
from typing import Any

import thriftpy2
from thriftpy2.protocol import TBinaryProtocolFactory, TCompactProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TException
from thriftpy2.transport import TBufferedTransportFactory, TFramedTransportFactory

from percolator._encoding import split_column
from percolator._errors import InvalidArgument, StoreUnavailable

_IDL = """
struct TColumn {
  1: required binary family,
  2: optional binary qualifier,
  3: optional i64 timestamp
}
enum TDeleteType {
  DELETE_COLUMN = 0,
  DELETE_COLUMNS = 1,
  DELETE_FAMILY = 2,
  DELETE_FAMILY_VERSION = 3
}
struct TColumnValue {
  1: required binary family,
  2: required binary qualifier,
  3: required binary value,
  4: optional i64 timestamp
}
struct TPut {
  1: required binary row,
  2: required list<TColumnValue> columnValues
  3: optional i64 timestamp
}
struct TDelete {
  1: required binary row,
  2: optional list<TColumn> columns,
  3: optional i64 timestamp,
  4: optional TDeleteType deleteType = 1
}
union TMutation {
  1: TPut put
  2: TDelete deleteSingle
}
struct TRowMutations {
  1: required binary row
  2: required list<TMutation> mutations
}
enum TCompareOp {
  LESS = 0,
  LESS_OR_EQUAL = 1,
  EQUAL = 2,
  NOT_EQUAL = 3,
  GREATER_OR_EQUAL = 4,
  GREATER = 5,
  NO_OP = 6
}
exception TIOError {
  1: optional string message
  2: optional bool canRetry
}
exception TIllegalArgument {
  1: optional string message
}
service THBaseService {
  bool checkAndMutate(
    1: required binary table,
    2: required binary row,
    3: required binary family,
    4: required binary qualifier,
    5: required TCompareOp compareOp,
    6: binary value,
    7: required TRowMutations rowMutations
  ) throws (1: TIOError io)
}
"""

_thrift2: Any = thriftpy2.load_fp(io.StringIO(_IDL), module_name="percolator_hbase2_thrift")
ANSWERED = (_thrift2.TIOError, _thrift2.TIllegalArgument)
"""Errors the Thrift2 server answered with (the connection is still good)."""


def parse_address(value: str, url: str) -> tuple[str, int]:
    """``host:port`` of a Thrift2 server, from the store URL's ``thrift2`` option."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(
            f"option thrift2={value!r} in {url!r} must be host:port of an HBase Thrift2 "
            "server (hbase thrift2 start -p PORT)"
        )
    return host, int(port)


class Thrift2Deletes:
    """Conditional deletes through one HBase Thrift2 server, one connection per thread
    (thriftpy2 clients are not thread-safe; a collector is one thread)."""

    def __init__(
        self, host: str, port: int, *, timeout_ms: int, transport: str, protocol: str
    ) -> None:
        self.where = f"HBase Thrift2 server at {host}:{port}"
        self._open_args = dict(
            service=_thrift2.THBaseService, host=host, port=port, timeout=timeout_ms,
            trans_factory=(TFramedTransportFactory() if transport == "framed"
                           else TBufferedTransportFactory()),
            proto_factory=(TCompactProtocolFactory() if protocol == "compact"
                           else TBinaryProtocolFactory()),
        )
        self._local = threading.local()
        self._clients: list[Any] = []
        self._mutex = threading.Lock()
        self._client()  # fail at open, not at the first collection, if unreachable

    def _client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            try:
                client = make_client(**self._open_args)
            except (TException, OSError) as e:
                raise StoreUnavailable(
                    f"cannot reach the {self.where} (the store's thrift2 option): {e}"
                ) from e
            self._local.client = client
            with self._mutex:
                self._clients.append(client)
        return client

    def delete_if(self, table: bytes, row: bytes, column: str, expected: bytes) -> bool:
        """Delete every version of *column* in *row* if its newest value is *expected*."""
        family, qualifier = split_column(column)
        fam, qual = family.encode(), qualifier.encode("utf-8", "surrogateescape")
        delete = _thrift2.TDelete(
            row=row, columns=[_thrift2.TColumn(family=fam, qualifier=qual)],
            deleteType=_thrift2.TDeleteType.DELETE_COLUMNS,
        )
        mutations = _thrift2.TRowMutations(
            row=row, mutations=[_thrift2.TMutation(deleteSingle=delete)]
        )
        client = self._client()
        try:
            return bool(client.checkAndMutate(
                table, row, fam, qual, _thrift2.TCompareOp.EQUAL, expected, mutations
            ))
        except ANSWERED:
            raise  # the server's own answer: the store turns it into our error
        except (TException, OSError, EOFError) as e:
            # The call may have applied: the caller learns it did not know.
            self._drop(client)
            raise StoreUnavailable(f"{self.where}: {e!r}") from e

    def _drop(self, client: Any) -> None:
        self._local.client = None
        with self._mutex:
            if client in self._clients:
                self._clients.remove(client)
        client.close()

    def close(self) -> None:
        with self._mutex:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
