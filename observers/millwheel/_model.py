"""What user code sees: records, timers, sources, computations and their context."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from percolator import InvalidArgument

__all__ = ["Computation", "Context", "IterableSource", "KeyRun", "Record", "Source", "State",
           "Timer"]

END_OF_TIME = 2**62
"""The watermark of a source that has nothing more to give."""


@dataclass(frozen=True)
class Record:
    """A record on a stream: *value* at event time *timestamp* (ms), delivered to the
    computation's key *key*. *late*: its timestamp was below the low watermark when it
    was produced or delivered (see the late policy)."""

    value: bytes
    timestamp: int
    key: bytes = b""
    id: str = ""
    stream: str = ""
    late: bool = False


@dataclass(frozen=True)
class Timer:
    """A timer of the current key: *tag* armed for event time *time* (ms)."""

    tag: str
    time: int


@runtime_checkable
class Source(Protocol):
    """Where an injector reads records. ``read(position, limit)`` returns up to *limit*
    records after *position* (None: from the start), the position after them, and the
    source's low watermark: a promise that no record it gives later has an earlier
    timestamp (records that break it are marked late). It must be replayable: reading
    again from a committed position gives the same records."""

    def read(self, position: bytes | None, limit: int) -> tuple[list[Record], bytes, int]:
        """``(records, next position, low watermark in ms)``: up to *limit* records
        after *position* (None: from the start)."""
        ...


class IterableSource:
    """A finite, replayable source over ``(value, timestamp_ms)`` pairs, with an honest
    watermark: the smallest timestamp not yet read (the end of time once all are)."""

    def __init__(self, records: Iterable[tuple[bytes, int]]) -> None:
        self.records = [(bytes(v), int(t)) for v, t in records]
        # suffix minima: the watermark after reading i records
        self._after = [END_OF_TIME] * (len(self.records) + 1)
        for i in range(len(self.records) - 1, -1, -1):
            self._after[i] = min(self.records[i][1], self._after[i + 1])

    def read(self, position: bytes | None, limit: int) -> tuple[list[Record], bytes, int]:
        """Up to *limit* pairs after *position* (their index, as decimal bytes), the
        position after them, and the smallest timestamp still unread."""
        start = int(position or b"0")
        end = min(len(self.records), start + limit)
        records = [Record(v, t) for v, t in self.records[start:end]]
        return records, b"%d" % end, self._after[end]


class KeyRun(Protocol):
    """What :class:`State` and :class:`Context` use of one run of a computation for one
    key, inside its transaction (the pipeline's key run, in
    :mod:`observers.millwheel._pipeline`, is one): the key, its input watermark, its
    state cells, its timers and its productions."""

    key: bytes

    @property
    def input_watermark(self) -> int: ...

    def state_get(self, name: str) -> bytes | None: ...

    def state_set(self, name: str, value: bytes | None) -> None: ...

    def set_timer(self, tag: str, time_ms: int) -> None: ...

    def delete_timer(self, tag: str) -> None: ...

    def produce(self, stream: str, value: bytes, ts: int, key: bytes | None) -> None: ...


class State:
    """A key's persistent state: named cells of its row, read and written in the key
    run's transaction (committed with the records it consumes and produces)."""

    def __init__(self, run: KeyRun) -> None:
        self._run = run

    def get(self, name: str) -> bytes | None:
        """The value of state cell *name*, or None (this run's own writes included)."""
        return self._run.state_get(name)

    def set(self, name: str, value: bytes) -> None:
        """Set state cell *name* to *value* (committed with the run)."""
        self._run.state_set(name, value)

    def delete(self, name: str) -> None:
        """Delete state cell *name* (committed with the run)."""
        self._run.state_set(name, None)

    def get_json(self, name: str, default: Any = None) -> Any:
        """State cell *name* decoded from JSON, or *default* when it is absent."""
        raw = self.get(name)
        return default if raw is None else json.loads(raw)

    def set_json(self, name: str, value: Any) -> None:
        """Set state cell *name* to *value* as compact JSON with sorted keys."""
        self.set(name, json.dumps(value, sort_keys=True, separators=(",", ":")).encode())


class Context:
    """What a handler may do, all of it committed atomically with the consumption of
    its input: :attr:`state`, timers of this key, and productions.

    .. warning:: handlers may run more than once for an input (a conflict, a crash);
       only the committed run counts. Keep side effects out of them.
    """

    def __init__(self, run: KeyRun) -> None:
        self._run = run
        self.key: bytes = run.key
        self.state = State(run)

    @property
    def input_watermark(self) -> int:
        """The computation's input low watermark (ms) at this run's snapshot: no record
        that is not late will arrive with an earlier timestamp."""
        return self._run.input_watermark

    def set_timer(self, tag: str, time_ms: int) -> None:
        """Arm (or re-arm) timer *tag* of this key for event time *time_ms*, from 0 to
        ``END_OF_TIME`` (a flush when the input ends); it fires once the input
        watermark reaches it."""
        self._run.set_timer(tag, time_ms)

    def delete_timer(self, tag: str) -> None:
        """Disarm timer *tag* of this key (nothing happens if it is not armed)."""
        self._run.delete_timer(tag)

    def produce(self, stream: str, value: bytes, timestamp: int, key: bytes | None = None
                ) -> None:
        """Send *value* at event time *timestamp* on *stream* (one of the computation's
        ``outputs``), to *key* of every subscriber (default: each subscriber's key
        extractor). A timestamp below the input being handled is marked late."""
        self._run.produce(stream, value, timestamp, key)


class Computation:
    """A keyed computation (MillWheel's ``ProcessRecord``/``ProcessTimer``). Set
    :attr:`outputs` to the streams it produces (checked, and used to refuse cycles),
    :attr:`name` (default: the class name), :attr:`late_policy`: ``"process"``
    (late records are handled, ``record.late`` set) or ``"drop"`` (counted, skipped),
    and :attr:`productions`: ``"strong"`` (the default: exactly once, the productions
    commit with the consumption of the input) or ``"weak"`` (at least once: each
    production is handed at once to its subscriber's key run, which commits before
    this run does; a crash or a conflict in between hands it again; docs/millwheel.md).
    """

    name: ClassVar[str] = ""
    outputs: ClassVar[Sequence[str]] = ()
    late_policy: ClassVar[str] = "process"
    productions: ClassVar[str] = "strong"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = cls.__name__
        if cls.late_policy not in ("process", "drop"):
            raise InvalidArgument(f"{cls.__name__}.late_policy must be 'process' or 'drop'")
        if cls.productions not in ("strong", "weak"):
            raise InvalidArgument(f"{cls.__name__}.productions must be 'strong' or 'weak', "
                                  f"got {cls.productions!r}")

    def process_record(self, ctx: Context, record: Record) -> None:
        """Handle one input record of key ``ctx.key``."""

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        """Handle a timer of key ``ctx.key`` whose time the input watermark reached."""


KeyExtractor = Callable[[Record], bytes]
