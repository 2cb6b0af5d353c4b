"""Sources that never end: a log directory's growing files (:class:`LogSource`) and
another Percolator table's committed changes (:class:`TableSource`). The injector
commits their position with the records it injects, so a restarted injector goes on
from there and never reads from the start again."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from observers._changes import Change, TableChanges
from observers._logs import LogTail, decode_position, encode_position
from observers._logs import Record as LogRecord
from observers.millwheel._model import Record
from percolator import Cluster, InvalidArgument

__all__ = ["LogSource", "TableSource"]

T = TypeVar("T")


class _Reader(Protocol[T]):
    def read(self, position: dict[str, Any], limit: int) -> tuple[list[T], dict[str, Any]]: ...


class _Tailing(Generic[T]):
    """A :class:`~observers.millwheel.Source` over a reader of positions, with the
    records' values and timestamps from the user's functions and a watermark.

    Event time (*timestamp* given): the watermark is the largest timestamp read so far
    (kept in the position) less *disorder_ms*; a record further behind is injected
    marked late. Ingestion time (no *timestamp*): a record's timestamp is the wall
    clock (ms) when it was read, and the watermark that clock."""

    def __init__(self, reader: _Reader[T], value: Callable[[T], bytes],
                 timestamp: Callable[[T], int] | None, disorder_ms: int) -> None:
        if not callable(value):
            raise InvalidArgument(f"value must be a callable, got {value!r:.80}")
        if timestamp is not None and not callable(timestamp):
            raise InvalidArgument(f"timestamp must be a callable or None, got {timestamp!r:.80}")
        if not isinstance(disorder_ms, int) or disorder_ms < 0:
            raise InvalidArgument(f"disorder_ms must be an int >= 0, got {disorder_ms!r}")
        self.reader, self.value, self.timestamp = reader, value, timestamp
        self.disorder_ms = disorder_ms

    def read(self, position: bytes | None, limit: int) -> tuple[list[Record], bytes, int]:
        state = decode_position(position)
        items, inner = self.reader.read(state.get("s", {}), limit)
        now = int(time.time() * 1000)
        high: int | None = state.get("m")
        records = []
        for item in items:
            value = self.value(item)
            ts = now if self.timestamp is None else self.timestamp(item)
            if not isinstance(value, bytes) or not isinstance(ts, int):
                raise InvalidArgument(f"the source's value and timestamp functions must give "
                                      f"bytes and int ms, got {value!r:.40} and {ts!r:.40} "
                                      f"for {item!r:.80}")
            records.append(Record(value, ts))
            high = ts if high is None else max(high, ts)
        after: dict[str, Any] = {"s": inner}
        if self.timestamp is None:
            mark = now
        else:
            mark = 0 if high is None else max(0, high - self.disorder_ms)
            if high is not None:
                after["m"] = high
        return records, encode_position(after), mark


class LogSource(_Tailing[LogRecord]):
    """The records of the growing files of *directory* matching *pattern* (newline
    framed, oldest file name first; Ubiq's file following, ``observers/_logs.py``):
    complete records only, a truncated or replaced file refused (logged), never read
    again. *value* makes a record's value from it (default: its bytes), *timestamp*
    its event time in ms (default: ingestion time; see :class:`_Tailing`)::

        import json

        from observers import millwheel as mw

        pipeline = mw.Pipeline(cluster, "clicks")
        pipeline.injector("clicks", mw.LogSource("/logs/clicks", "*.jsonl",
                          timestamp=lambda r: json.loads(r.data)["ts"], disorder_ms=5000),
                          stream="clicks")
    """

    def __init__(self, directory: str | os.PathLike[str], pattern: str = "*.log", *,
                 value: Callable[[LogRecord], bytes] = lambda r: r.data,
                 timestamp: Callable[[LogRecord], int] | None = None,
                 disorder_ms: int = 0) -> None:
        super().__init__(LogTail(directory, pattern), value, timestamp, disorder_ms)


class TableSource(_Tailing[Change]):
    """The cells of *table* (its *columns*, None: all) committed since the last read
    (``observers/_changes.py``: passes over the table by commit timestamp; a cell
    changed several times between two reads gives its newest value once). *value*
    makes a record's value from a :class:`Change` (default: the cell's value),
    *timestamp* its event time (default: ingestion time)."""

    def __init__(self, cluster: Cluster, table: str, columns: Sequence[str] | None = None, *,
                 value: Callable[[Change], bytes] = lambda c: c.value,
                 timestamp: Callable[[Change], int] | None = None,
                 disorder_ms: int = 0) -> None:
        super().__init__(TableChanges(cluster, table, columns), value, timestamp, disorder_ms)
