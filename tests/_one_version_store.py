"""A misconfigured store for ``tests/test_conformance.py``: the embedded store, but
every column family keeps one version, as an HBase table created or altered by hand
with HBase's default ``VERSIONS => 1`` does (or a Bigtable family with the GC rule
``max_num_versions=1``). Snapshot reads of anything overwritten since a transaction
began find nothing: ``python -m percolator.conformance`` must say so.

``register()`` adds the scheme ``sqlite-oneversion:///abs/path.db``; the test makes
every process of a run (the bank's clients too) call it, through a
``sitecustomize`` module on ``PYTHONPATH``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from percolator.stores import BACKENDS
from percolator.stores.sqlite import SqliteStore

SCHEME = "sqlite-oneversion"


class OneVersionStore(SqliteStore):
    def create_table(self, table: str, families: Mapping[str, int]) -> None:
        super().create_table(table, dict.fromkeys(families, 1))


def open_one_version_store(url: str, **options: Any) -> OneVersionStore:
    return OneVersionStore(urlsplit(url).path, busy_timeout=60.0)


def register() -> None:
    BACKENDS[SCHEME] = f"{__name__}:open_one_version_store"
