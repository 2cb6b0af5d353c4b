"""Values and Spark types: how a stored value reads as a value of a field's type
(:data:`DECODERS`), and the checks of a DataFrame's schema against a table (the
row-key field, and a ``family:qualifier`` column per other field)."""

from __future__ import annotations

import datetime
from typing import Any

from pyspark.sql import types as T

import percolator
from percolator import InvalidArgument
from percolator.ext import check_column
from spark_loader._options import bad

__all__ = ["DECODERS", "decoded", "row_key_is_text", "type_name", "value_fields"]


def _boolean(b: bytes) -> bool:
    if b not in (b"true", b"false"):
        raise ValueError("not true or false")
    return b == b"true"


DECODERS: dict[str, Any] = {
    "binary": bytes,
    "string": lambda b: b.decode("utf-8"),
    "long": int, "int": int, "short": int, "byte": int,
    "double": float, "float": float,
    "boolean": _boolean,
    "date": lambda b: datetime.date.fromisoformat(b.decode()),
    "timestamp": lambda b: datetime.datetime.fromisoformat(b.decode()),
}
"""How a stored value becomes a value of a Spark type, by its simple name (as the
bulk loader encodes them: text as UTF-8, numbers as decimal text, booleans as
true/false, dates and times in ISO 8601)."""


def type_name(dtype: T.DataType, field: str) -> str:
    name = str(dtype.simpleString())
    name = {"bigint": "long", "smallint": "short", "tinyint": "byte"}.get(name, name)
    if name not in DECODERS:
        raise bad(f"field {field!r} has type {dtype.simpleString()}: a Percolator value "
                   f"reads as one of {sorted(DECODERS)}")
    return name


def row_key_is_text(schema: T.StructType, row_key: str) -> bool:
    """True when the row key field is a string (else binary); checks the schema."""
    if row_key not in schema.names:
        raise bad(f"the schema has no row key field {row_key!r} (fields {schema.names}); "
                   "name it with option rowKey")
    dtype = schema[row_key].dataType
    if not isinstance(dtype, T.BinaryType | T.StringType):
        raise bad(f"row key field {row_key!r} must be binary or string, got "
                   f"{dtype.simpleString()}")
    return isinstance(dtype, T.StringType)


def value_fields(schema: T.StructType, row_key: str) -> list[str]:
    fields = [f.name for f in schema.fields if f.name != row_key]
    for name in fields:
        try:
            check_column(name)
        except InvalidArgument as e:
            raise bad(f"field {name!r} is not a Percolator column: {e}; every field but "
                       f"the row key ({row_key!r}) must be named 'family:qualifier'") from None
    return fields


def decoded(decode: Any, raw: bytes, row: bytes, column: str) -> Any:
    try:
        return decode(raw)
    except ValueError as e:
        raise percolator.InvalidArgument(
            f"row {row!r}, column {column}: value {raw[:60]!r} does not read as the "
            f"field's type ({type(e).__name__}: {e}); read it as binary or string") from None
