"""Photon's EventStore (seed 000 §3.4): primary events looked up where they already
sit, in the log files a :class:`~observers.photon.LogFeed` follows, through an index,
with an in-memory cache in front.

A feed with ``index=True`` writes, as a primary's ``ev:raw``, a *reference*
(:func:`encode_ref`): the feed's name, the file, the byte offset and length of the
event's line and a CRC-32 of its bytes; not the event. The joiner resolves a
reference with :meth:`EventStore.lookup`: from the cache (the CacheEventStore, an
LRU filled by the feed's sequential reads in this process and by every lookup), or
else by one read of the log at the offset (the LogsEventStore; the paper needs a
sparse file map and a short scan, an exact offset per event needs neither). The
CRC makes a file replaced or rewritten under the index an error, never a join
with other bytes.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from percolator import InvalidArgument

__all__ = ["LOGGED", "EventStore", "LogRef", "PrimaryUnreadable", "encode_ref"]

LOGGED = b"\x00photon:log:"
"""The prefix of a primary's ``ev:raw`` that is a reference into a log, not the event."""
_REF = struct.Struct(">QII")  # offset, length, crc32


class PrimaryUnreadable(Exception):
    """A primary indexed in a log cannot be read back: its file is gone, shorter, or
    holds other bytes there. The joiner's run fails; the worker retries the event and
    quarantines it after ``max_failures`` (``verify`` lists it)."""


@dataclass(frozen=True)
class LogRef:
    """Where a primary event's bytes sit: line ``[offset, offset + length)`` of
    *file* in the directory of feed *feed*, with CRC-32 *crc*."""

    feed: str
    file: str
    offset: int
    length: int
    crc: int

    def __str__(self) -> str:
        return f"{self.feed}:{self.file}@{self.offset}+{self.length}"


def encode_ref(feed: str, file: str, offset: int, data: bytes) -> bytes:
    """The ``ev:raw`` of a primary whose bytes *data* sit at *offset* of *file*."""
    return (LOGGED + _REF.pack(offset, len(data), zlib.crc32(data))
            + feed.encode() + b"/" + file.encode())


def decode_ref(raw: bytes) -> LogRef:
    body = raw[len(LOGGED):]
    offset, length, crc = _REF.unpack_from(body)
    feed, _, file = body[_REF.size:].partition(b"/")
    return LogRef(feed.decode(), file.decode(), offset, length, crc)


class EventStore:
    """Resolves the primaries a pipeline keeps as log references, through an LRU of
    at most *max_bytes* of events. *directory_of(feed)* names the directory of a
    feed this process has not seen (the pipeline reads the feed's ``c:dir``).
    Thread-safe: the worker's threads share it. :attr:`hits` and :attr:`misses`
    (lookups that read the log) give the cache's hit rate."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidArgument(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.directories: dict[str, Path] = {}
        self._cache: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def hit_rate(self) -> float:
        """Hits per lookup so far (0.0 before any)."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def put(self, ref: bytes, event: bytes) -> None:
        """Remember *event* as what *ref* resolves to (the sequential reader's fill)."""
        if len(event) > self.max_bytes:
            return
        with self._lock:
            if ref in self._cache:
                self._cache.move_to_end(ref)
                return
            self._cache[ref] = event
            self._bytes += len(event)
            while self._bytes > self.max_bytes:
                _, old = self._cache.popitem(last=False)
                self._bytes -= len(old)

    def lookup(self, ref: bytes, directory_of: Callable[[str], Path | None]) -> bytes:
        """The event *ref* points at.

        :raises PrimaryUnreadable: its file is gone or holds other bytes there."""
        with self._lock:
            event = self._cache.get(ref)
            if event is not None:
                self._cache.move_to_end(ref)
                self.hits += 1
                return event
            self.misses += 1
        where = decode_ref(ref)
        directory = self.directories.get(where.feed)
        if directory is None:
            directory = directory_of(where.feed)
            if directory is None:
                raise PrimaryUnreadable(f"primary at {where}: no directory known for feed "
                                        f"{where.feed!r}")
            self.directories[where.feed] = directory
        path = directory / where.file
        try:
            with open(path, "rb") as f:
                f.seek(where.offset)
                event = f.read(where.length)
        except OSError as e:
            raise PrimaryUnreadable(
                f"primary at {where}: {path} cannot be read ({e.strerror or e}); a log "
                "must stay until the retention boundary has passed its events") from None
        if len(event) != where.length or zlib.crc32(event) != where.crc:
            raise PrimaryUnreadable(f"primary at {where}: {path} holds other bytes there "
                                    "(replaced or rewritten after it was indexed)")
        self.put(ref, event)
        return event
