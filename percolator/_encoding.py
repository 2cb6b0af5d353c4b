"""Column layout and the binary codecs of lock and write cells (DESIGN.md §5).

A user column ``c`` of a row is stored in physical families, with ``c`` as qualifier:

=========  ===============================================================
family     content
=========  ===============================================================
``d``      data: the value, at the writer's start_ts (two-phase commits, loads;
           a one-phase commit keeps the value in its write record only)
``w``      write records: at commit_ts, ``kind + start_ts`` of the data, and for a
           put the value itself when the committer inlined it (below)
``l``      the lock cell, one current value (a state machine, below)
``n``      notify: a hint that an observer may need to run (own family)
=========  ===============================================================

Lock cell states (first byte): ``F`` free (with a token never used before; the
embedded store's one-phase commit leaves an existing one as it was, see
``percolator._commit``), ``L`` locked, ``C`` committed and ``R`` rolled back
(short-lived states of a primary).
Values are fixed binary encodings, never pickle.

User families starting with ``_`` are reserved (observer acknowledgements use
``_ack:...``).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from enum import Enum

from percolator._errors import InvalidArgument, ValueTooLargeError

DATA = "d"
"""The family of a large put's value, at its start timestamp (a small one travels in
its lock, then its write record)."""
WRITE = "w"
"""The family of write records, at commit timestamps: a record names the start
timestamp of the commit it records and its :class:`WriteKind`."""
LOCK = "l"
"""The family of locks, one version per cell: :class:`Lock` while a commit holds it,
then the primary's decision or a FREE lock (:func:`decode_lock`)."""
NOTIFY = "n"
"""The family of notifications of observed columns, at commit timestamps (a worker
runs the observers of a cell whose notification is newer than its acknowledgement)."""
FAMILIES: dict[str, int] = {DATA: 0, WRITE: 0, LOCK: 1, NOTIFY: 0}
"""Physical families of every user table: name -> versions kept (0 = all)."""

META_TABLE = "__percolator"
META_FAMILIES: dict[str, int] = {"m": 1}

MAX_VALUE_BYTES = 4 * 1024 * 1024
"""Largest value accepted by ``set`` (4 MiB: below HBase's default cell limit)."""
MAX_ROW_BYTES = 4096
"""Largest row key (Bigtable's limit)."""
MAX_COLUMN_BYTES = 1024

_TABLE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}")
_FAMILY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def physical(family: str, column: str) -> str:
    return f"{family}:{column}"


def check_table(table: object) -> str:
    """*table*, if it is a valid table name.

    :raises InvalidArgument: otherwise, saying what a name may hold."""
    if not isinstance(table, str):
        raise InvalidArgument(f"table must be a str, got {type(table).__name__}: {table!r}")
    if not _TABLE_RE.fullmatch(table):
        raise InvalidArgument(
            f"bad table name {table!r}: use 1-200 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return table


def check_row(row: object) -> bytes:
    """*row*, if it is a valid row key (non-empty bytes of at most
    :data:`~percolator.MAX_ROW_BYTES`).

    :raises InvalidArgument: otherwise."""
    if not isinstance(row, bytes):
        raise InvalidArgument(f"row must be bytes, got {type(row).__name__}: {row!r}")
    if not row:
        raise InvalidArgument("row must not be empty")
    if len(row) > MAX_ROW_BYTES:
        raise ValueTooLargeError(
            f"row key of {len(row)} bytes is over the limit of {MAX_ROW_BYTES} bytes"
        )
    return row


_valid_columns: set[str] = set()
USER_COLUMNS: set[str] = set()
"""Columns :func:`check_column` passed that are outside the reserved families: for a
user's transaction, membership is the whole check (its get and set test it in line)."""


def split_column(column: str) -> tuple[str, str]:
    """``"family:qualifier"`` as ``(family, qualifier)``, split at the first ``:`` (a
    qualifier may hold more). The one place a column name is split; :func:`check_column`
    is the one place it is validated."""
    family, _, qualifier = column.partition(":")
    return family, qualifier


def check_column(column: object, *, internal: bool = False) -> str:
    """Validate a ``"family:qualifier"`` user column name."""
    if not isinstance(column, str):  # first: an unhashable one fails the set lookup
        raise InvalidArgument(f"column must be a str, got {type(column).__name__}: {column!r}")
    if column in _valid_columns and (internal or not column.startswith("_")):
        return column
    family, qualifier = split_column(column)
    if not family or not qualifier or ":" not in column:
        raise InvalidArgument(f"bad column name {column!r}: expected 'family:qualifier'")
    if not _FAMILY_RE.fullmatch(family):
        raise InvalidArgument(
            f"bad column family in {column!r}: use letters, digits, '_', '.' or '-'"
        )
    if family.startswith("_") and not internal:
        raise InvalidArgument(f"column family of {column!r} is reserved: names starting "
                              "with '_' are used by percolator itself")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in qualifier):
        raise InvalidArgument(f"bad column qualifier in {column!r}: control characters")
    if len(column.encode()) > MAX_COLUMN_BYTES:
        raise ValueTooLargeError(f"column name is over the limit of {MAX_COLUMN_BYTES} bytes")
    if len(_valid_columns) < 100_000:
        _valid_columns.add(column)
        if family[:1] != "_":
            USER_COLUMNS.add(column)
    return column


def check_value(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise InvalidArgument(f"value must be bytes, got {type(value).__name__}: {value!r:.80}")
    if len(value) > MAX_VALUE_BYTES:
        raise ValueTooLargeError(
            f"value of {len(value)} bytes is over the limit of {MAX_VALUE_BYTES} bytes"
        )
    return value


# --- write records ---------------------------------------------------------------


class WriteKind(Enum):
    """What a write record records, in its first byte: a put, a delete, or the
    rollback of the transaction that started at its start timestamp."""

    PUT = b"P"
    DELETE = b"D"
    ROLLBACK = b"R"


_WRITE = struct.Struct(">cQ")
INLINE_TAG = b"V"
"""First byte of a PUT record that carries its value after ``kind + start_ts`` (TiKV's
"short value"): a read needs no data cell, and a one-phase commit writes none. A
``P`` record points at the data cell at its start_ts instead."""

INLINE_MAX_BYTES = 1024
"""Largest put a two-phase commit or a bulk load carries in its lock and then its write
record, writing no data cell; a larger one gets a data cell and a ``P`` record. (A
one-phase commit has no lock to carry it and inlines every put.)"""


def inlined(value: bytes | None) -> bytes | None:
    """*value* if it is a put that its lock and write record carry (at most
    ``INLINE_MAX_BYTES``), else None (a delete, or a put that needs a data cell)."""
    return value if value is not None and len(value) <= INLINE_MAX_BYTES else None


def encode_write(kind: WriteKind, start_ts: int, value: bytes | None = None) -> bytes:
    """A write record; *value* (PUT only) is inlined after the header."""
    if value is None:
        return _WRITE.pack(kind.value, start_ts)
    assert kind is WriteKind.PUT
    return _WRITE.pack(INLINE_TAG, start_ts) + value


_WRITE_KINDS = {kind.value: kind for kind in WriteKind}  # a dict lookup: cheaper than WriteKind()
_WRITE_KINDS[INLINE_TAG] = WriteKind.PUT


def decode_write(value: bytes) -> tuple[WriteKind, int]:
    """A write record's kind and the start timestamp of the commit it records
    (:func:`encode_write`'s inverse; :func:`inline_value` gives its value, if any)."""
    kind, start_ts = _WRITE.unpack_from(value)
    return _WRITE_KINDS[kind], start_ts


WRITE_RECORD_HEAD = _WRITE.size
"""Bytes of a write record before an inline value."""


def inline_value(record: bytes) -> bytes | None:
    """The value carried by a PUT record, or None when it points at a data cell."""
    return record[WRITE_RECORD_HEAD:] if record[:1] == INLINE_TAG else None


# --- lock cell --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lock:
    """``LOCKED``: held by the transaction that started at ``start_ts``."""

    start_ts: int
    primary_table: str
    primary_row: bytes
    primary_column: str
    owner: str
    wall_ms: int
    ttl_ms: int
    delete: bool = False
    notify: bool = False
    value: bytes | None = None
    """A small put's value, carried by the lock instead of a data cell (TiKV's short
    value): whoever rolls the cell forward copies it into the write record."""

    def is_primary(self, table: str, row: bytes, column: str) -> bool:
        """Whether the cell *table*/*row*/*column* is this lock's primary."""
        return (table, row, column) == (self.primary_table, self.primary_row, self.primary_column)


@dataclass(frozen=True, slots=True)
class Committed:
    """``COMMITTED``: a primary between its commit point and its clean-up."""

    start_ts: int
    commit_ts: int
    delete: bool = False
    notify: bool = False
    value: bytes | None = None
    """As :attr:`Lock.value`."""


@dataclass(frozen=True, slots=True)
class RolledBack:
    """``ROLLED_BACK``: a primary between a cleaner's decision and its clean-up."""

    start_ts: int


@dataclass(frozen=True, slots=True)
class Free:
    """``FREE``: no holder. ``(start_ts, outcome)`` of the last holder makes the value
    unique, so a compare-and-set never succeeds on a value that left and came back."""

    start_ts: int
    committed: bool


LockState = Lock | Committed | RolledBack | Free

_LOCK_HEAD = struct.Struct(">cQQIB")
_LEN = struct.Struct(">I")
_TWO = struct.Struct(">cQQB")
_ONE = struct.Struct(">cQ")
_FREE = struct.Struct(">cQ?")
_VALUE_MARK = b"\x01"
FREE_TAG = b"F"
"""First byte of every FREE lock value (the other states start with another byte), so a
reader can skip a free lock, and a store predicate can match one, without decoding it."""


def with_value(lock: bytes, value: bytes | None) -> bytes:
    """A LOCKED or COMMITTED value *lock* (encoded without a value) carrying *value*:
    an appended suffix, so that a writer of many cells encodes its lock once."""
    return lock if value is None else lock + _VALUE_MARK + value


def _value_after(raw: bytes, offset: int) -> bytes | None:
    if offset == len(raw):
        return None
    if raw[offset : offset + 1] != _VALUE_MARK:
        raise ValueError(f"corrupt lock cell value {raw!r:.80}")
    return raw[offset + 1 :]


def encode_lock(state: LockState) -> bytes:
    if isinstance(state, Lock):
        flags = (1 if state.delete else 0) | (2 if state.notify else 0)
        parts = [_LOCK_HEAD.pack(b"L", state.start_ts, state.wall_ms, state.ttl_ms, flags)]
        for field in (
            state.primary_table.encode(),
            state.primary_row,
            state.primary_column.encode(),
            state.owner.encode(),
        ):
            parts.append(_LEN.pack(len(field)))
            parts.append(field)
        return with_value(b"".join(parts), state.value)
    if isinstance(state, Committed):
        flags = (1 if state.delete else 0) | (2 if state.notify else 0)
        return with_value(_TWO.pack(b"C", state.start_ts, state.commit_ts, flags), state.value)
    if isinstance(state, RolledBack):
        return _ONE.pack(b"R", state.start_ts)
    return _FREE.pack(FREE_TAG, state.start_ts, state.committed)


def decode_lock(value: bytes) -> LockState:
    """A lock cell's state: :class:`Lock` (held), :class:`Committed` or
    :class:`RolledBack` (a primary decided, awaiting clean-up), or :class:`Free`
    (:func:`encode_lock`'s inverse)."""
    tag = value[:1]
    if tag == b"L":
        _, start_ts, wall_ms, ttl_ms, flags = _LOCK_HEAD.unpack_from(value)
        offset = _LOCK_HEAD.size
        fields = []
        for _ in range(4):
            (length,) = _LEN.unpack_from(value, offset)
            offset += _LEN.size
            fields.append(value[offset : offset + length])
            offset += length
        return Lock(
            start_ts=start_ts,
            primary_table=fields[0].decode(),
            primary_row=fields[1],
            primary_column=fields[2].decode(),
            owner=fields[3].decode(),
            wall_ms=wall_ms,
            ttl_ms=ttl_ms,
            delete=bool(flags & 1),
            notify=bool(flags & 2),
            value=_value_after(value, offset),
        )
    if tag == b"C":
        _, start_ts, commit_ts, flags = _TWO.unpack_from(value)
        return Committed(start_ts, commit_ts, bool(flags & 1), bool(flags & 2),
                         _value_after(value, _TWO.size))
    if tag == b"R":
        _, start_ts = _ONE.unpack(value)
        return RolledBack(start_ts)
    if tag == FREE_TAG:
        _, start_ts, committed = _FREE.unpack(value)
        return Free(start_ts, committed)
    raise ValueError(f"corrupt lock cell value {value!r:.80}")
