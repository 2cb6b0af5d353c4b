"""The transaction tests run over every backend and over HBase's Thrift1 lane too
(``hbase-thrift1``: happybase, for gateways that speak only Thrift1), a module's own
``backend`` fixture aside."""

from __future__ import annotations

from tests._backends import WITH_THRIFT1, backend_fixture

backend = backend_fixture(WITH_THRIFT1)
