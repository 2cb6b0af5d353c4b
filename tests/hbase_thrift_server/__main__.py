"""``python -m tests.hbase_thrift_server --host 127.0.0.1 --port P [--namespace NS]``."""

from __future__ import annotations

from tests.hbase_thrift_server.server import main

if __name__ == "__main__":
    main()
