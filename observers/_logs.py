"""Following growing log files: what Ubiq's tracker and cutter do to a file, shared
with the recipes' log sources (``millwheel.LogSource``, ``photon.LogFeed``).

A log is a directory of files matching a pattern, each growing by appending
newline-framed records. A file is followed from what was already taken of it (a byte
offset, always at a record boundary): only *complete* records are taken (up to the
last newline), a file that shrank below its offset (truncated) or whose first KiB
changed (replaced) is refused, never re-read.

:class:`LogTail` reads a log from a position that the caller commits with what it
does with the records (Ubiq keeps the same facts in its ``files`` table instead).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from percolator import InvalidArgument

__all__ = ["HEAD_BYTES", "LogTail", "Record", "complete_size", "decode_position",
           "encode_position", "head_digest", "matching_files", "read_records", "refusal"]

log = logging.getLogger(__name__)

HEAD_BYTES = 1024
"""How much of a file's beginning identifies it: a change there means it was replaced."""
CHUNK_BYTES = 1 << 20
"""At most this much of a file is read per step of a tail (more for a longer record)."""


@dataclass(frozen=True)
class Record:
    """One newline-framed record: its file, its offset and its bytes (no newline)."""

    file: str
    offset: int
    data: bytes


def matching_files(directory: Path, pattern: str) -> list[str]:
    """Names of the files of *directory* matching *pattern*, sorted (none if it is
    not a directory)."""
    if not directory.is_dir():
        return []
    return sorted(n for n in os.listdir(directory) if fnmatch.fnmatch(n, pattern))


def complete_size(path: Path, known: int) -> int:
    """The offset after the last newline of *path* at or after *known*."""
    size = path.stat().st_size
    if size <= known:
        return min(size, known)
    with open(path, "rb") as f:
        pos = size
        while pos > known:
            step = min(65536, pos - known)
            f.seek(pos - step)
            chunk = f.read(step)
            at = chunk.rfind(b"\n")
            if at >= 0:
                return pos - step + at + 1
            pos -= step
    return known


def head_digest(path: Path) -> bytes:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(HEAD_BYTES)).digest()


def refusal(seen: int, size: int, old_head: bytes | None, head: bytes) -> str:
    """Why a file of which *seen* bytes were taken, now *size* bytes long with first
    KiB digest *head* (it was *old_head*), can no longer be followed; "" if it can."""
    if size < seen:
        return f"shrank from {seen} to {size} bytes (truncated)"
    if head and old_head and seen >= HEAD_BYTES and old_head != head:
        return f"its first {HEAD_BYTES} bytes changed (replaced)"
    return ""


def read_records(path: Path, name: str, begin: int, end: int, where: str = ""
                 ) -> Iterator[Record]:
    """The records of bytes ``[begin, end)`` of *path* (cut at newlines), as file *name*.

    :raises OSError: the file is shorter than *end* (*where*: said after the path)."""
    with open(path, "rb") as f:
        f.seek(begin)
        data = f.read(end - begin)
    if len(data) != end - begin:
        raise OSError(f"{path}{where} is shorter than {end}")
    offset = begin
    for line in data.split(b"\n")[:-1]:
        yield Record(name, offset, line)
        offset += len(line) + 1


def encode_position(position: dict[str, Any]) -> bytes:
    return json.dumps(position, sort_keys=True, separators=(",", ":")).encode()


def decode_position(raw: bytes | None) -> dict[str, Any]:
    """The position *raw* encodes ({} for None: the start).

    :raises InvalidArgument: *raw* is not a position of this module's readers."""
    if raw is None:
        return {}
    try:
        position = json.loads(raw)
    except ValueError:
        position = None
    if not isinstance(position, dict):
        raise InvalidArgument(f"not a log or table position: {raw[:80]!r}")
    return position


class LogTail:
    """Reads the complete records of the files of *directory* matching *pattern*,
    oldest name first, from a position (a dict, see :func:`encode_position`):
    ``{"f": {name: [offset, head hex]}, "x": {name: why refused}}``. Reading is a
    function of the position and the files, so reading again from a committed
    position gives the same records while the files only grow. The position keeps an
    entry for every file ever seen, so that a file gone for a while (an unmounted
    directory) is not read again from its start when it comes back."""

    def __init__(self, directory: str | os.PathLike[str], pattern: str = "*.log") -> None:
        if not isinstance(pattern, str) or not pattern:
            raise InvalidArgument(f"pattern must be a non-empty glob, got {pattern!r}")
        self.directory = Path(directory)
        self.pattern = pattern

    def read(self, position: dict[str, Any], limit: int) -> tuple[list[Record], dict[str, Any]]:
        """Up to *limit* records after *position*, and the position after them."""
        if not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(f"limit must be an int >= 1, got {limit!r}")
        files: dict[str, list[Any]] = {k: list(v) for k, v in position.get("f", {}).items()}
        refused: dict[str, str] = dict(position.get("x", {}))
        found: list[Record] = []
        for name in matching_files(self.directory, self.pattern):
            if len(found) >= limit:
                break
            if name in refused:
                continue
            path = self.directory / name
            offset, old_head = files.get(name, [0, ""])
            try:
                size = path.stat().st_size
                head = head_digest(path) if size else b""
                why = refusal(offset, size, bytes.fromhex(old_head), head)
                if why:
                    log.error("log %s: refusing %s: %s", self.directory, name, why)
                    refused[name] = why
                    continue
                end = complete_size(path, offset)
                if end - offset > CHUNK_BYTES:  # a step at a time, whole records
                    end = complete_size_within(path, offset, offset + CHUNK_BYTES) or end
                records = list(read_records(path, name, offset, end))
            except FileNotFoundError:
                continue  # rotated away between the listing and the read
            records = records[:limit - len(found)]
            if not records:
                continue
            found += records
            offset = records[-1].offset + len(records[-1].data) + 1
            files[name] = [offset, head.hex() if offset >= HEAD_BYTES else ""]
        return found, {"f": files, "x": refused} if refused else {"f": files}


def complete_size_within(path: Path, begin: int, end: int) -> int:
    """The offset after the last newline of bytes ``[begin, end)`` of *path*, or 0."""
    with open(path, "rb") as f:
        f.seek(begin)
        at = f.read(end - begin).rfind(b"\n")
    return begin + at + 1 if at >= 0 else 0
