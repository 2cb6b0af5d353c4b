"""Input records -> cells, and the reasons a record is rejected (no Spark here).

A record becomes one row: the row key field gives the row, each mapped field with a
value gives one cell. Values are stored as bytes: ``str`` as UTF-8, ``bytes`` as is,
``bool`` as ``true``/``false``, numbers as their decimal text, lists and dicts as
compact JSON (sorted keys), dates and times in ISO 8601; a missing or null field
writes no cell. A record is loaded whole or rejected whole.
"""

from __future__ import annotations

import csv
import datetime
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from percolator import MAX_ROW_BYTES, MAX_VALUE_BYTES, InvalidArgument
from percolator.ext import check_column

__all__ = ["ColumnMap", "Parsed", "Reject", "dedupe", "parse_csv", "parse_json", "to_cells"]


@dataclass(frozen=True, slots=True)
class Reject:
    """A rejected input record: why, and the source line (or the record as JSON)."""

    reason: str
    line: str
    row: str | None = None

    def to_json(self) -> str:
        """The reject as one line of JSON (``reason``, ``row``, ``line``), as the rejects
        file holds it."""
        return json.dumps({"reason": self.reason, "row": self.row, "line": self.line},
                          ensure_ascii=False)


Parsed = tuple[bytes, tuple[dict[str, bytes], str]] | Reject
"""``(row, (cells, source line))`` of a good record, or a :class:`Reject`."""


@dataclass(frozen=True, slots=True)
class ColumnMap:
    """Which field is the row key and which fields go to which ``family:qualifier``."""

    row_key: str
    columns: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, row_key: str, columns: Mapping[str, str]) -> ColumnMap:
        if not isinstance(row_key, str) or not row_key:
            raise InvalidArgument(f"row_key must name a field, got {row_key!r}")
        if not columns:
            raise InvalidArgument("map at least one field to a column (FIELD=family:qualifier)")
        seen: dict[str, str] = {}
        for field, column in columns.items():
            check_column(column)
            if column in seen:
                raise InvalidArgument(
                    f"fields {seen[column]!r} and {field!r} both map to column {column!r}"
                )
            seen[column] = field
        return cls(row_key, tuple(sorted(columns.items())))

    def fields(self) -> list[str]:
        return [self.row_key, *(f for f, _ in self.columns)]


def to_bytes(value: Any) -> bytes | None:
    if type(value) is str:  # the common case first
        return value.encode()
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, int | float):
        return repr(value).encode()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat().encode()
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    if hasattr(value, "asDict"):  # a Spark Row (struct column)
        return to_bytes(value.asDict(recursive=True))
    return str(value).encode()


def to_cells(record: Mapping[str, Any], mapping: ColumnMap, line: str) -> Parsed:
    """Validate *record* and turn it into ``(row, (cells, line))``, or a :class:`Reject`."""
    key = record.get(mapping.row_key)
    if key is None:
        return Reject(f"missing row key field {mapping.row_key!r}", line)
    try:
        row = to_bytes(key)
    except UnicodeEncodeError as e:
        return Reject(f"row key field {mapping.row_key!r} is not valid text: {e.reason}", line)
    if not row:
        return Reject(f"empty row key field {mapping.row_key!r}", line)
    if len(row) > MAX_ROW_BYTES:
        return Reject(f"row key of {len(row)} bytes is over the limit of {MAX_ROW_BYTES} bytes",
                      line, _shown(row))
    cells: dict[str, bytes] = {}
    for field, column in mapping.columns:
        value = record.get(field)
        if value is None:
            continue
        try:
            data = value.encode() if type(value) is str else to_bytes(value)
        except UnicodeEncodeError as e:
            return Reject(f"value of field {field!r} is not valid text: {e.reason}", line,
                          _shown(row))
        assert data is not None
        if len(data) > MAX_VALUE_BYTES:
            return Reject(f"value of field {field!r} ({len(data)} bytes) is over the limit "
                          f"of {MAX_VALUE_BYTES} bytes", line, _shown(row))
        cells[column] = data
    if not cells:
        return Reject("no mapped field has a value (fields "
                      f"{', '.join(repr(f) for f, _ in mapping.columns)})", line, _shown(row))
    return row, (cells, line)


def _shown(row: bytes) -> str:
    """A row key as reject records show it."""
    return row.decode(errors="replace")[:200]


def parse_json(lines: Iterable[str], mapping: ColumnMap) -> Iterator[Parsed]:
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            yield Reject(f"malformed JSON: {e}", line)
            continue
        if not isinstance(record, dict):
            yield Reject(f"not a JSON object: a {type(record).__name__}", line)
            continue
        yield to_cells(record, mapping, line)


def parse_csv(lines: Iterable[str], mapping: ColumnMap, header: list[str],
              header_line: str) -> Iterator[Parsed]:
    """Lines of CSV files whose first line is *header* (header lines are skipped).
    Quoted fields must not span lines."""
    width = len(header)
    for line in lines:
        if line == header_line or not line.strip():
            continue
        try:
            values = next(csv.reader([line], strict=True))
        except (csv.Error, StopIteration) as e:
            yield Reject(f"malformed CSV: {e}", line)
            continue
        if len(values) != width:
            yield Reject(f"malformed CSV: {len(values)} fields, the header has {width}", line)
            continue
        yield to_cells(dict(zip(header, values, strict=True)), mapping, line)


def dedupe(
    records: Iterable[tuple[bytes, tuple[dict[str, bytes], str]]],
    rejects: list[Reject],
) -> Iterator[tuple[bytes, dict[str, bytes]]]:
    """Collapse records sorted by row key: identical duplicates load once; a key seen
    with different values is rejected in every record that has it."""
    current: bytes | None = None
    group: list[tuple[dict[str, bytes], str]] = []

    def close() -> Iterator[tuple[bytes, dict[str, bytes]]]:
        assert current is not None
        first = group[0][0]
        if all(cells == first for cells, _ in group[1:]):
            yield current, first
            return
        shown = _shown(current)
        for _, line in group:
            rejects.append(Reject(f"duplicate row key {shown!r} with different values "
                                  f"({len(group)} records)", line, shown))

    for row, value in records:
        if row != current:
            if current is not None:
                yield from close()
            current, group = row, []
        group.append(value)
    if current is not None:
        yield from close()
