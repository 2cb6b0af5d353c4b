"""The options of ``format("percolator")``, checked on the driver
(:class:`SourceOptions`), and the errors that name the source (:func:`bad`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import percolator
from percolator import InvalidArgument, TlsConfig
from percolator.ext import check_column

__all__ = ["DEFAULT_PARTITIONS", "NAME", "ROW_KEY", "SourceOptions", "bad", "parse",
           "source_options"]

NAME = "percolator"
"""The data source's name: ``format("percolator")``."""

ROW_KEY = "row"
"""Name of the DataFrame's row-key column (user columns always hold a colon); the
data source's option ``rowKey`` names another."""

DEFAULT_PARTITIONS = 4
"""Input partitions where the store reports no cut points and none are asked for
(``numPartitions``); the planning worker cannot know the cluster's parallelism."""

# Option names are case-insensitive (Spark lower-cases them). Aliases first: what
# users of the HBase and Bigtable connectors and of JDBC would try.
_URL_KEYS = ("url", "cluster", "percolator.url")
_TABLE_KEYS = ("table", "dbtable", "path")
_CONNECT_KEYS: dict[str, tuple[str, type]] = {
    "oracle": ("oracle", str),
    "oracledeadline": ("oracle_deadline", float),
    "zookeeper": ("zookeeper", str),
    "zookeeperauth": ("zookeeper_auth", str),
    "zookeepersessiontimeout": ("zookeeper_session_timeout", float),
    "lockttl": ("lock_ttl", float),
    "lockwait": ("lock_wait", float),
    "safepointrefresh": ("safe_point_refresh", float),
}
_TLS_KEYS = {"oracle.tls": "oracle_tls", "zookeeper.tls": "zookeeper_tls"}
_OTHER_KEYS = ("columns", "rowkey", "startts", "numpartitions", "loadid", "maxrejects",
               "rejectspath", "createtable", "observe", "batchcells", "queryid",
               "checkpointlocation", "queryname", "readchangefeed", "startingts")
_KNOWN = {*_URL_KEYS, *_TABLE_KEYS, *_CONNECT_KEYS, *_OTHER_KEYS,
          *(f"{prefix}.{part}" for prefix in _TLS_KEYS for part in ("ca", "cert", "key"))}


def bad(message: str) -> InvalidArgument:
    return InvalidArgument(f"format({NAME!r}): {message}")


def parse(key: str, text: str, kind: type) -> Any:
    if kind is str:
        return text
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise bad(f"option {key} must be true or false, got {text!r}")
        return text.lower() == "true"
    try:
        return kind(text)
    except ValueError:
        raise bad(f"option {key} must be {'an integer' if kind is int else 'a number'}, "
                   f"got {text!r}") from None


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The options of one ``format("percolator")`` read or write, checked (picklable:
    it travels to every executor)."""

    url: str
    table: str
    connect: tuple[tuple[str, Any], ...]
    columns: tuple[str, ...] | None
    row_key: str
    raw: tuple[tuple[str, str], ...]
    """Every option as given (lower-cased keys), for the readers' and writers' own."""

    @classmethod
    def of(cls, options: Mapping[str, str]) -> SourceOptions:
        given = {str(k).lower(): str(v) for k, v in options.items()}
        unknown = sorted(k for k in given if k not in _KNOWN)
        if unknown:
            raise bad(f"unknown option(s) {unknown}; known: {sorted(_KNOWN)}")
        url = next((given[k] for k in _URL_KEYS if given.get(k)), None)
        if url is None:
            raise bad("option url (the cluster: sqlite:///path.db, hbase://host:port, "
                       "bigtable://project/instance or a published zk://host:port/chroot) "
                       "is required")
        table = next((given[k] for k in _TABLE_KEYS if given.get(k)), None)
        if table is None:
            raise bad("option table is required (or load(\"table\"))")
        connect: dict[str, Any] = {}
        for key, (name, kind) in _CONNECT_KEYS.items():
            if key in given:
                connect[name] = parse(key, given[key], kind)
        for prefix, name in _TLS_KEYS.items():
            parts = {p: given[f"{prefix}.{p}"] for p in ("ca", "cert", "key")
                     if f"{prefix}.{p}" in given}
            if parts:
                connect[name] = TlsConfig(**parts)
        columns = None
        if given.get("columns", "").strip():
            names = [c.strip() for c in given["columns"].split(",") if c.strip()]
            columns = tuple(check_column(c) for c in names)
            if len(set(columns)) != len(columns):
                raise bad(f"option columns names a column twice: {list(columns)}")
        return cls(url, table, tuple(sorted(connect.items())), columns,
                   given.get("rowkey", ROW_KEY), tuple(sorted(given.items())))

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        for k, v in self.raw:
            if k == key:
                return parse(key, v, kind)
        return default

    def cluster(self) -> percolator.Cluster:
        return percolator.connect(self.url, **dict(self.connect))


def source_options(connect_options: Mapping[str, Any]) -> dict[str, str]:
    """The data source's options for :func:`percolator.connect`'s keyword arguments
    (what ``read_table`` and the loader take as ``connect_options``)."""
    names = {name: key for key, (name, _) in _CONNECT_KEYS.items()}
    tls = {name: prefix for prefix, name in _TLS_KEYS.items()}
    out: dict[str, str] = {}
    for name, value in connect_options.items():
        if name in names:
            out[names[name]] = str(value)
        elif name in tls and isinstance(value, TlsConfig):
            for part in ("ca", "cert", "key"):
                if getattr(value, part, None) is not None:
                    out[f"{tls[name]}.{part}"] = str(getattr(value, part))
        else:
            raise bad(f"connect option {name}={value!r:.60} has no data source option "
                       f"(known: {sorted([*names, *tls])})")
    return out
