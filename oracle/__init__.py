"""The timestamp oracle of percolator: strictly increasing timestamps from one service.

Every transaction asks the oracle twice (start and commit timestamps; Percolator paper
section 2.3, DESIGN.md section 6). The pieces:

* :class:`OracleServer`, run as ``python -m oracle`` / ``percolator-oracle``: a gRPC
  service (``oracle/timestamp_oracle.proto``) that hands out blocks of consecutive
  timestamps from memory below a ceiling it records durably *before* serving (a fsynced
  file for a single oracle, or a fenced versioned set in ZooKeeper where several servers
  elect one leader);
* :class:`OracleClient`: a thread-safe client that keeps at most one RPC in flight and
  serves every caller waiting for it from the next block, so batching grows with load.

Targets are ``"grpc://host:port"``, ``"grpcs://host:port"`` (TLS) or
``"zk://host:port[,host:port...]/chroot"``; TLS settings are :class:`percolator.TlsConfig`
(docs/tls.md).

For clients and tools of their own (a load generator sending one RPC per timestamp, a
script reading the ZooKeeper state): the generated code of
``oracle/timestamp_oracle.proto`` (``from oracle import timestamp_oracle_pb2,
timestamp_oracle_pb2_grpc``; the proto file documents them), the channel options
:class:`OracleClient` uses (:data:`CHANNEL_OPTIONS`), and the ZooKeeper paths of a
chroot (:func:`zk_paths`).
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from oracle._target import CHANNEL_OPTIONS, MAX_COUNT, parse_target, zk_paths

if _typing.TYPE_CHECKING:
    from oracle._client import OracleClient, OracleStatus
    from oracle._proto import timestamp_oracle_pb2 as timestamp_oracle_pb2
    from oracle._proto import timestamp_oracle_pb2_grpc as timestamp_oracle_pb2_grpc
    from oracle._server import OracleServer

__all__ = [
    "CHANNEL_OPTIONS", "MAX_COUNT", "OracleClient", "OracleServer", "OracleStatus",
    "parse_target", "zk_paths",
]
# The generated modules (timestamp_oracle_pb2, timestamp_oracle_pb2_grpc) are importable
# from here too (see the module docstring), but stay out of __all__: generated code has
# no API reference of its own to render; the proto file is its documentation.

_INSTALL_HINT = "the timestamp oracle needs grpcio: pip install 'percolator-txn[oracle]'"

# Loaded at first use: the client and server need grpcio (the ``oracle`` extra), and
# ``python -m oracle`` without it must say so instead of failing while importing.
_LAZY = {"OracleClient": "oracle._client", "OracleStatus": "oracle._client",
         "OracleServer": "oracle._server"}
_LAZY_MODULES = {"timestamp_oracle_pb2": "oracle._proto.timestamp_oracle_pb2",
                 "timestamp_oracle_pb2_grpc": "oracle._proto.timestamp_oracle_pb2_grpc"}
"""The generated code of ``oracle/timestamp_oracle.proto`` (``scripts/gen_proto.sh``):
its messages, and its service's stub and servicer."""


def __getattr__(name: str) -> _typing.Any:
    if name in _LAZY_MODULES:
        value = _importlib.import_module(_LAZY_MODULES[name])
    else:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'oracle' has no attribute {name!r}")
        value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value
