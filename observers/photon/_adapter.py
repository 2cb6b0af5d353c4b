"""The business logic of a join: how to read ids, times and references out of events,
and how to join a foreign event with its primary (Photon's adapter, seed 000 §3.3.1)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from percolator import InvalidArgument

__all__ = ["Adapter", "BadEvent", "JsonAdapter"]


class BadEvent(InvalidArgument):
    """An event the adapter cannot read (no id, not JSON, ...): ingest reports it as
    rejected, with this message, and writes the rest of the batch."""


@runtime_checkable
class Adapter(Protocol):
    """What a :class:`~observers.photon.JoinPipeline` needs to know about its events.

    Events are bytes. ``foreign_id``/``primary_id``/``primary_ref`` raise
    :class:`BadEvent` for an event they cannot read. ``event_time`` is the event's time
    in milliseconds since the epoch (None: the event has no time; it then never falls
    behind the retention boundary and its deadline counts from when it first waits).
    ``join`` returns the joined output, or None to skip the pair (business logic
    decides it is not to be joined); if it raises, the worker retries the event and
    quarantines it after ``max_failures``, leaving every other event alone.
    """

    def foreign_id(self, event: bytes) -> bytes:
        """The id of a foreign event (a click), unique per event.

        :raises BadEvent: when *event* cannot be read."""
        ...

    def primary_id(self, event: bytes) -> bytes:
        """The id of a primary event (a query), unique per event.

        :raises BadEvent: when *event* cannot be read."""
        ...

    def primary_ref(self, foreign: bytes) -> bytes:
        """The id of the primary event that the foreign event *foreign* references.

        :raises BadEvent: when *foreign* cannot be read."""
        ...

    def event_time(self, event: bytes) -> int | None:
        """The event's time in milliseconds since the epoch, or None if it has none.

        :raises BadEvent: when *event* cannot be read."""
        ...

    def join(self, primary: bytes, foreign: bytes) -> bytes | None:
        """The joined output of a pair, or None to skip it (not to be joined). Runs in
        the joiner's transaction: it may run more than once, keep it pure."""
        ...


class JsonAdapter:
    """An adapter for JSON events: ids and the reference are fields (any JSON scalar),
    *time* an optional field holding milliseconds since the epoch. The joined output
    is ``{"primary": <primary event>, "foreign": <foreign event>}`` as compact JSON.

    ::

        adapter = photon.JsonAdapter(foreign_id="click_id", primary_id="query_id",
                                     primary_ref="query_id", time="ts_ms")
    """

    def __init__(
        self, *, foreign_id: str, primary_id: str, primary_ref: str, time: str | None = None
    ) -> None:
        for name, value in (("foreign_id", foreign_id), ("primary_id", primary_id),
                            ("primary_ref", primary_ref)):
            if not isinstance(value, str) or not value:
                raise InvalidArgument(f"JsonAdapter {name} must be a field name, got {value!r}")
        if time is not None and (not isinstance(time, str) or not time):
            raise InvalidArgument(f"JsonAdapter time must be a field name or None, got {time!r}")
        self.fields = {"foreign_id": foreign_id, "primary_id": primary_id,
                       "primary_ref": primary_ref, "time": time}

    @staticmethod
    def _parse(event: bytes) -> Mapping[str, Any]:
        try:
            value = json.loads(event)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadEvent(f"not a JSON object: {e}") from None
        if not isinstance(value, dict):
            raise BadEvent(f"not a JSON object: {type(value).__name__}")
        return value

    def _field(self, event: bytes, which: str) -> bytes:
        field = self.fields[which]
        assert field is not None
        value = self._parse(event).get(field)
        if value is None or isinstance(value, dict | list) or value == "":
            raise BadEvent(f"field {field!r} ({which}) is missing or not a scalar")
        return value.encode() if isinstance(value, str) else json.dumps(value).encode()

    def foreign_id(self, event: bytes) -> bytes:
        """The *foreign_id* field (a string as UTF-8, another scalar as JSON)."""
        return self._field(event, "foreign_id")

    def primary_id(self, event: bytes) -> bytes:
        """The *primary_id* field (a string as UTF-8, another scalar as JSON)."""
        return self._field(event, "primary_id")

    def primary_ref(self, foreign: bytes) -> bytes:
        """The *primary_ref* field of the foreign event."""
        return self._field(foreign, "primary_ref")

    def event_time(self, event: bytes) -> int | None:
        """The *time* field (milliseconds since the epoch), or None without *time*.

        :raises BadEvent: when the field is not a non-negative integer."""
        field = self.fields["time"]
        if field is None:
            return None
        value = self._parse(event).get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadEvent(f"field {field!r} (time) must be milliseconds since the epoch, "
                           f"got {value!r}")
        return value

    def join(self, primary: bytes, foreign: bytes) -> bytes | None:
        """``{"foreign": ..., "primary": ...}`` as compact JSON with sorted keys."""
        return json.dumps({"primary": self._parse(primary), "foreign": self._parse(foreign)},
                          separators=(",", ":"), sort_keys=True).encode()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.fields.items() if v is not None)
        return f"JsonAdapter({fields})"
