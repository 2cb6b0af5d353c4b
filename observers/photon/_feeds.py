"""Feeds that pull events into a :class:`JoinPipeline` instead of callers pushing
them: a log directory's growing files (:class:`LogFeed`) and another Percolator
table's committed changes (:class:`TableFeed`).

Each step is one transaction: read from the feed's committed position, ingest the
events (``log_foreign``/``log_primary`` into the transaction) and commit the new
position with them, and the feed's counters, in ``photon.<p>.meta`` row
``feed/<name>``. A feed killed at any point goes on from its last commit: it never
reads from the start again, and what it read but did not commit it reads again once
(Photon's id registry would absorb a replay anyway; the counter ``c:dup`` shows one).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from observers import Periodic
from observers._changes import Change, TableChanges
from observers._logs import LogTail, decode_position, encode_position
from observers._logs import Record as LogRecord
from observers.photon._events import encode_ref
from observers.photon._pipeline import JoinPipeline
from percolator import Cluster, InvalidArgument, Snapshot, TransactionBase, transactional

__all__ = ["FeedStatus", "LogFeed", "TableFeed"]

log = logging.getLogger(__name__)

T = TypeVar("T")
COUNTERS = ("written", "dup", "late", "rejected")


class _Reader(Protocol[T]):
    def read(self, position: dict[str, Any], limit: int) -> tuple[list[T], dict[str, Any]]: ...


@dataclass
class FeedStatus:
    """What a feed has committed: its position and its counters."""

    position: dict[str, Any]
    written: int
    dup: int
    late: int
    rejected: int


class _Feed(Generic[T]):
    def __init__(self, pipeline: JoinPipeline, name: str, reader: _Reader[T], *,
                 foreign: bool, event: Callable[[T], bytes], batch: int,
                 interval: float) -> None:
        if not isinstance(pipeline, JoinPipeline):
            raise InvalidArgument(f"a feed needs a photon.JoinPipeline, got {pipeline!r:.80}")
        if not isinstance(name, str) or not name or not all(
                c.isalnum() or c in "_-." for c in name):
            raise InvalidArgument(f"feed name must be letters, digits, '_', '-' or '.', "
                                  f"got {name!r}")
        if not isinstance(foreign, bool):
            raise InvalidArgument(f"foreign must be True (foreign events) or False "
                                  f"(primary events), got {foreign!r}")
        if not callable(event):
            raise InvalidArgument(f"event must be a callable, got {event!r:.80}")
        if not isinstance(batch, int) or batch < 1:
            raise InvalidArgument(f"batch must be an int >= 1, got {batch!r}")
        self.pipeline, self.name, self.reader = pipeline, name, reader
        self.foreign, self.event, self.batch, self.interval = foreign, event, batch, interval
        self.row = f"feed/{name}".encode()
        self.directory: str | None = None
        """Set by an index feed: its directory, committed as ``c:dir`` for joiners."""

    def stored(self, items: Sequence[T]) -> list[bytes] | None:
        """What the primaries' ``ev:raw`` keeps instead of the events (None: the
        events themselves)."""
        return None

    def step(self) -> int:
        """Read and ingest the next events, committing the position with them;
        returns how many were read."""
        return _step(self.pipeline.cluster, self)

    def task(self) -> Periodic:
        """The feed as a periodic task, for ``Worker(..., tasks=...)``."""
        return Periodic(self.pipeline.cluster, f"photon.{self.pipeline.name}.feed.{self.name}",
                        self.step, interval=self.interval)

    def status(self) -> FeedStatus:
        with Snapshot(self.pipeline.cluster) as snap:
            cells = snap.get_row(self.pipeline.meta, self.row,
                                 ["c:pos", *(f"c:{c}" for c in COUNTERS)])
        return FeedStatus(decode_position(cells.get("c:pos")),
                          *(int(cells.get(f"c:{c}", b"0")) for c in COUNTERS))


@transactional
def _step(txn: TransactionBase, feed: _Feed[Any]) -> int:
    p = feed.pipeline
    cells = txn.get_row(p.meta, feed.row, ["c:pos", "c:dir", *(f"c:{c}" for c in COUNTERS)])
    raw = cells.get("c:pos")
    items, after = feed.reader.read(decode_position(raw), feed.batch)
    encoded = encode_position(after)
    if not items and encoded == (raw or encode_position({})):
        return 0
    events = [feed.event(item) for item in items]
    if feed.directory is not None and cells.get("c:dir") != feed.directory.encode():
        txn.set(p.meta, feed.row, "c:dir", feed.directory.encode())
    result = p._ingest(txn, events, foreign=feed.foreign, stored=feed.stored(items))
    for index, why in result.rejected:
        log.warning("photon %s feed %s: event refused: %s: %r", p.name, feed.name, why,
                    items[index])
    txn.set(p.meta, feed.row, "c:pos", encoded)
    for counter, n in zip(COUNTERS, (result.written, result.duplicates, result.too_late,
                                     len(result.rejected)), strict=True):
        if n:
            txn.set(p.meta, feed.row, f"c:{counter}",
                    b"%d" % (int(cells.get(f"c:{counter}", b"0")) + n))
    return len(items)


class LogFeed(_Feed[LogRecord]):
    """The events of the growing files of *directory* matching *pattern*, one per
    line (Ubiq's file following, ``observers/_logs.py``), into *pipeline* as foreign
    events (*foreign*) or primary ones; *event* makes the event's bytes from a record
    (default: the line)::

        from observers import Worker

        clicks = photon.JoinPipeline.open(cluster, "clicks")
        clicks_feed = photon.LogFeed(clicks, "clicks", "/logs/clicks", "*.jsonl",
                                     foreign=True)
        Worker(cluster, clicks.observers(), tasks=[*clicks.tasks(), clicks_feed.task()])
    """

    def __init__(self, pipeline: JoinPipeline, name: str,
                 directory: str | os.PathLike[str], pattern: str = "*.jsonl", *,
                 foreign: bool, event: Callable[[LogRecord], bytes] | None = None,
                 batch: int = 500, interval: float = 0.5, index: bool = False) -> None:
        if not isinstance(index, bool):
            raise InvalidArgument(f"index must be True or False, got {index!r}")
        if index and (foreign is not False or event is not None):
            raise InvalidArgument("an index LogFeed feeds primary events (foreign=False) "
                                  "that are its lines as they are (no event=)")
        super().__init__(pipeline, name, LogTail(directory, pattern), foreign=foreign,
                         event=event or _line, batch=batch, interval=interval)
        if index:
            self.directory = str(Path(directory).resolve())
            pipeline.events.directories[name] = Path(self.directory)

    def stored(self, items: Sequence[LogRecord]) -> list[bytes] | None:
        """With ``index=True``, a log reference per record (the record's bytes stay
        in the log and go into the joiners' cache); otherwise None (the events)."""
        if self.directory is None:
            return None
        refs = [encode_ref(self.name, r.file, r.offset, r.data) for r in items]
        for ref, record in zip(refs, items, strict=True):  # the CacheEventStore's reader
            self.pipeline.events.put(ref, record.data)
        return refs


def _line(record: LogRecord) -> bytes:
    return record.data


class TableFeed(_Feed[Change]):
    """The cells of *table* (its *columns*, None: all) of *cluster* committed since
    the last step (``observers/_changes.py``), into *pipeline*; *event* makes the
    event's bytes from a :class:`Change` (default: the cell's value)."""

    def __init__(self, pipeline: JoinPipeline, name: str, cluster: Cluster, table: str,
                 columns: Sequence[str] | None = None, *, foreign: bool,
                 event: Callable[[Change], bytes] = lambda c: c.value,
                 batch: int = 500, interval: float = 0.5) -> None:
        super().__init__(pipeline, name, TableChanges(cluster, table, columns),
                         foreign=foreign, event=event, batch=batch, interval=interval)
