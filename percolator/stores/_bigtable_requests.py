"""The Bigtable backend's request builders: argument checks, row filters (reads,
guards), mutations, and the merger of a ``ReadRows`` stream's chunks into rows. Pure
functions of the protobuf types; :mod:`percolator.stores.bigtable` sends what they build.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from percolator._encoding import split_column
from percolator._errors import InvalidArgument, ValueTooLargeError
from percolator._store import Guard, Mutation, Read, RowCells, check_skip_tag
from percolator.stores._memo import memo_by_reads

try:  # optional dependency: percolator.stores.bigtable says what to install
    from google.cloud.bigtable_v2.types import data as data_types
except ImportError:  # pragma: no cover - exercised without the extra
    pass
else:
    # the raw protobuf classes, looked up once: proto-plus's .pb() costs a microsecond a call
    _RowFilter = data_types.RowFilter.pb()
    _Mutation = data_types.Mutation.pb()
    # The filter passing the newest version of each column. Shared, like column_range's
    # filters: a shared filter is only ever copied into another message, never changed.
    _LATEST = _RowFilter(cells_per_column_limit_filter=1)

MAX_ROW_KEY = 4096
TS_SCALE = 1000  # logical timestamp -> microseconds
MAX_LOGICAL_TS = (2**63 - 1) // TS_SCALE - 1
_FAMILY = re.compile(r"[-_.a-zA-Z0-9]+")
_MAX_FAMILY = 64


_CACHED_COLUMNS = 4096
"""Columns whose split and filter are kept (a transaction touches a few; more only cost
a rebuild)."""


def family_and_qualifier(column: str) -> tuple[str, bytes]:
    if not isinstance(column, str):  # first: an unhashable one fails the cache lookup
        raise InvalidArgument(f"column must be a str 'family:qualifier', got {column!r}")
    return _family_and_qualifier(column)


@functools.lru_cache(maxsize=_CACHED_COLUMNS)
def _family_and_qualifier(column: str) -> tuple[str, bytes]:
    family, qualifier = split_column(column)
    if ":" not in column:
        raise InvalidArgument(f"column must be 'family:qualifier', got {column!r}")
    check_family(family)
    return family, qualifier.encode("utf-8")


def check_family(family: str) -> None:
    if not isinstance(family, str) or not _FAMILY.fullmatch(family) or len(family) > _MAX_FAMILY:
        raise InvalidArgument(
            f"column family must match [-_.a-zA-Z0-9]+ (at most {_MAX_FAMILY} characters) "
            f"in Bigtable, got {family!r}"
        )


def check_ts(ts: int, what: str) -> int:
    if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0 or ts > MAX_LOGICAL_TS:
        raise InvalidArgument(f"{what!r} must be an integer in [0, {MAX_LOGICAL_TS}], got {ts!r}")
    return ts


def check_row(row: bytes) -> bytes:
    if not isinstance(row, bytes):
        raise InvalidArgument(f"row key must be bytes, got {type(row).__name__}: {row!r}")
    if not row:
        raise InvalidArgument("row key must not be empty (Bigtable rejects b'')")
    if len(row) > MAX_ROW_KEY:
        raise ValueTooLargeError(
            f"row key is {len(row)} bytes; Bigtable allows at most {MAX_ROW_KEY}: {row[:32]!r}..."
        )
    return row


def check_value(value: bytes, column: str) -> bytes:
    if not isinstance(value, bytes):
        raise InvalidArgument(
            f"value of {column!r} must be bytes, got {type(value).__name__}: {value!r}"
        )
    return value


# ---------------------------------------------------------------------------
# Filters and mutations (raw protobuf messages, wrapped once per request)


@functools.lru_cache(maxsize=_CACHED_COLUMNS)
def column_range(family: str, qualifier: bytes) -> Any:
    """The filter passing exactly the column; shared between requests, so never
    change it (chain, interleave and the requests copy it)."""
    pb = _RowFilter()
    columns = pb.column_range_filter
    columns.family_name = family
    columns.start_qualifier_closed = qualifier
    columns.end_qualifier_closed = qualifier
    return pb


def timestamp_range(min_ts: int, max_ts: int | None) -> Any:
    """The filter passing versions with logical timestamps in [min_ts, max_ts]."""
    pb = _RowFilter()
    timestamps = pb.timestamp_range_filter
    timestamps.start_timestamp_micros = min_ts * TS_SCALE
    if max_ts is not None:
        timestamps.end_timestamp_micros = (max_ts + 1) * TS_SCALE
    return pb


def chain(filters: list[Any]) -> Any:
    if len(filters) == 1:
        return filters[0]
    pb = _RowFilter()
    pb.chain.filters.extend(filters)
    return pb


def interleave(filters: list[Any]) -> Any:
    if len(filters) == 1:
        return filters[0]
    pb = _RowFilter()
    pb.interleave.filters.extend(filters)
    return pb


def block_all() -> Any:
    pb = _RowFilter()
    pb.block_all_filter = True
    return pb


def read_filter(read: Read) -> Any:
    """The filter chain that selects what *read* asks for."""
    if not isinstance(read, Read):
        raise InvalidArgument(f"reads must be percolator Read objects, got {read!r}")
    check_family(read.family)
    min_ts = check_ts(read.min_ts, "min_ts")
    max_ts = None if read.max_ts is None else check_ts(read.max_ts, "max_ts")
    if read.versions is not None and (
        isinstance(read.versions, bool) or not isinstance(read.versions, int) or read.versions < 1
    ):
        raise InvalidArgument(
            f"'versions' must be a positive integer or None, got {read.versions!r}"
        )
    if max_ts is not None and max_ts < min_ts:
        return block_all()
    steps: list[Any] = []
    if read.qualifiers is None:
        pb = _RowFilter()
        # validated as [-_.a-zA-Z0-9]+: only "." is special in RE2; anchored both ends
        pb.family_name_regex_filter = "^" + read.family.replace(".", "\\.") + "$"
        steps.append(pb)
    else:
        if isinstance(read.qualifiers, str):
            raise InvalidArgument(f"qualifiers must be a tuple of str, got {read.qualifiers!r}")
        for q in read.qualifiers:
            if not isinstance(q, str):
                raise InvalidArgument(f"qualifiers must be str, got {q!r} in {read!r}")
        qualifiers = sorted({q.encode("utf-8") for q in read.qualifiers})
        if not qualifiers:
            return block_all()
        steps.append(interleave([column_range(read.family, q) for q in qualifiers]))
    if min_ts > 0 or max_ts is not None:
        steps.append(timestamp_range(min_ts, max_ts))
    if read.versions is not None:
        pb = _RowFilter()
        pb.cells_per_column_limit_filter = read.versions
        steps.append(pb)
    tag = check_skip_tag(read)
    if tag is not None:  # after the version limit: a skipped version is not replaced
        below = _RowFilter()
        below.value_range_filter.end_value_open = tag
        ranges = [below]
        if tag != b"\xff":
            above = _RowFilter()
            above.value_range_filter.start_value_closed = bytes([tag[0] + 1])
            ranges.append(above)
        steps.append(interleave(ranges))
    return chain(steps)


def reads_filter(reads: Sequence[Read]) -> Any:
    """The filter of a request reading *reads* (built once per distinct tuple of Reads:
    the message is only ever copied into requests, never changed)."""
    if isinstance(reads, Read):
        reads = (reads,)
    return memo_reads_filter(reads)


def build_reads_filter(reads: tuple[Read, ...]) -> Any:
    if not reads:
        raise InvalidArgument("reads must name at least one family (a Read)")
    return interleave([read_filter(r) for r in reads])


memo_reads_filter = memo_by_reads(build_reads_filter)


def guard_filter(guard: Guard) -> Any:
    """The filter chain that outputs the cells *guard* matches."""
    if not isinstance(guard, Guard):
        raise InvalidArgument(f"guards must be percolator Guard objects, got {guard!r}")
    family, qualifier = family_and_qualifier(guard.column)
    min_ts = check_ts(guard.min_ts, "min_ts")
    max_ts = None if guard.max_ts is None else check_ts(guard.max_ts, "max_ts")
    if max_ts is not None and max_ts < min_ts:
        return block_all()
    steps = [column_range(family, qualifier)]
    if min_ts > 0 or max_ts is not None:
        steps.append(timestamp_range(min_ts, max_ts))
    if guard.latest:
        steps.append(_LATEST)
    if guard.value_from or guard.value_to is not None:
        pb = _RowFilter()
        values = pb.value_range_filter
        values.start_value_closed = check_value(guard.value_from, guard.column)
        if guard.value_to is not None:
            values.end_value_open = check_value(guard.value_to, guard.column)
        steps.append(pb)
    return chain(steps)


def set_cell(family: str, qualifier: bytes, micros: int, value: bytes) -> Any:
    pb = _Mutation()
    cell = pb.set_cell
    cell.family_name = family
    cell.column_qualifier = qualifier
    cell.timestamp_micros = micros
    cell.value = value
    return pb


def delete_column(family: str, qualifier: bytes, end_micros: int | None) -> Any:
    pb = _Mutation()
    delete = pb.delete_from_column
    delete.family_name = family
    delete.column_qualifier = qualifier
    if end_micros is None:
        delete.SetInParent()
    else:
        delete.time_range.start_timestamp_micros = 0
        delete.time_range.end_timestamp_micros = end_micros
    return pb


def put_mutations(puts: Iterable[tuple[str, int, bytes]]) -> list[Any]:
    out = []
    for put in puts:
        try:
            column, ts, value = put
        except (TypeError, ValueError):
            raise InvalidArgument(f"a put must be (column, timestamp, value), got {put!r}")
        family, qualifier = family_and_qualifier(column)
        check_ts(ts, "timestamp")
        out.append(set_cell(family, qualifier, ts * TS_SCALE, check_value(value, column)))
    return out


def replace_mutations(
    family: str, qualifier: bytes, new: bytes, puts: Iterable[tuple[str, int, bytes]]
) -> list[Any]:
    """A compare-and-set's writes: every version of the cell replaced by *new* at
    timestamp 0, then *puts*."""
    return [
        delete_column(family, qualifier, None),
        set_cell(family, qualifier, 0, new),
        *put_mutations(puts),
    ]


def latest_value_is(family: str, qualifier: bytes, expected: bytes | None) -> Any:
    """A filter passing the latest version of the cell, only if its value is *expected*
    (any value when None: then it passes a cell exactly when the cell exists)."""
    steps = [column_range(family, qualifier), _LATEST]
    if expected is not None:
        match = _RowFilter()
        match.value_range_filter.start_value_closed = expected
        match.value_range_filter.end_value_closed = expected
        steps.append(match)
    return chain(steps)


def delete_mutations(deletes: Iterable[tuple[str, int]]) -> list[Any]:
    """``(column, max_ts)``: every version of the column at or below *max_ts*."""
    out = []
    for delete in deletes:
        try:
            column, max_ts = delete
        except (TypeError, ValueError):
            raise InvalidArgument(f"a delete must be (column, max_ts), got {delete!r}")
        family, qualifier = family_and_qualifier(column)
        check_ts(max_ts, "max_ts")
        out.append(delete_column(family, qualifier, (max_ts + 1) * TS_SCALE))
    return out


def row_mutations(mutation: Mutation) -> list[Any]:
    return [*delete_mutations(mutation.deletes), *put_mutations(mutation.puts)]


# ---------------------------------------------------------------------------
# ReadRows chunk merging


class RowMerger:
    """Turns the chunk stream of ReadRows responses (raw protobuf messages) into
    ``(row, RowCells)``."""

    def __init__(self) -> None:
        self._key = b""
        self._family = ""
        self._column = ""
        self._ts = 0
        self._value: list[bytes] = []
        self._cells: dict[str, list[tuple[int, bytes]]] = {}

    def feed(self, response: Any) -> Iterator[tuple[bytes, RowCells]]:
        for chunk in response.chunks:
            if chunk.reset_row:
                self._cells = {}
                self._value = []
                continue
            if not self._value:  # the chunk starts a cell (else it continues a split value)
                if chunk.row_key:
                    self._key = chunk.row_key
                if chunk.HasField("family_name"):
                    self._family = chunk.family_name.value
                if chunk.HasField("qualifier"):
                    qualifier = chunk.qualifier.value.decode("utf-8", "surrogateescape")
                    self._column = f"{self._family}:{qualifier}"
                self._ts = chunk.timestamp_micros
            self._value.append(chunk.value)
            if chunk.value_size == 0:  # the cell is complete
                value = self._value[0] if len(self._value) == 1 else b"".join(self._value)
                self._value = []
                self._cells.setdefault(self._column, []).append((self._ts // TS_SCALE, value))
            if chunk.commit_row:
                cells, self._cells = self._cells, {}
                if cells:
                    yield self._key, normalise(cells)


def normalise(cells: dict[str, list[tuple[int, bytes]]]) -> RowCells:
    """Newest first, one cell per timestamp (overlapping reads may repeat a cell)."""
    for column, versions in cells.items():
        if any(versions[i][0] <= versions[i + 1][0] for i in range(len(versions) - 1)):
            unique = dict(versions)
            cells[column] = sorted(unique.items(), key=lambda c: c[0], reverse=True)
    return cells


# ---------------------------------------------------------------------------
# The store
