"""An HBase Thrift1 test server: happybase's ``Hbase.thrift`` served by thriftpy2.

Run it in its own process with ``python -m tests.hbase_thrift_server --host 127.0.0.1
--port P``; :mod:`tests.hbase_thrift_server.server` says which HBase semantics it
reproduces and which faults of a real cluster it can play (``--fault``, ``--servers``...).
``tests/_hbase.py`` starts it for the test suite.
"""

from __future__ import annotations

from tests.hbase_thrift_server.server import (
    HBASE_THRIFT,
    Faults,
    HBaseHandler,
    main,
    make_server,
    round_robin_proxy,
)

__all__ = ["HBASE_THRIFT", "Faults", "HBaseHandler", "main", "make_server", "round_robin_proxy"]
