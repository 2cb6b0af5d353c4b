"""The transaction tests run over every backend and over HBase's Thrift1 lane too
(``hbase-thrift1``: happybase, for gateways that speak only Thrift1), a module's own
``backend`` fixture aside."""

from __future__ import annotations

import pytest

from tests._backends import WITH_THRIFT1


@pytest.fixture(params=WITH_THRIFT1)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
