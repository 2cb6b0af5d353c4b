"""A join pipeline: tables, the ingest and join transactions, deadlines, retention.

Tables of pipeline ``<p>`` (row key of an id: ``hex2(crc32(id) % 256) + "/" + id``,
the prefix spreading the rows over tablets):

* ``photon.<p>.foreign``: ``ev:raw`` the foreign event (observed by the joiner),
  ``ev:t`` its time, ``j:state`` the registry cell (``J<ms>`` joined, ``U`` unjoinable,
  ``S`` skipped; absent: undecided), ``j:wait`` ``be64(deadline ms) + primary key``
  while it waits for its primary, ``j:due`` once the sweep has fired its deadline;
* ``photon.<p>.primary``: ``ev:raw`` the primary event, or :data:`PLACEHOLDER` while
  foreign events wait for it; ``ev:t``; ``j:waiters`` the keys of the waiting events;
  ``j:held`` ``be64(ms)``, the latest deadline of a placeholder's waiters;
* ``photon.<p>.joined``: ``ev:joined`` the adapter's output, one row per joined event;
* ``photon.<p>.deadlines``: one row ``be64(deadline ms) + "/" + foreign key`` per
  waiting event;
* ``photon.<p>.meta``: the configuration and the retention boundary.

Why every event is joined exactly once (docs/photon.md has the long form):

* **At most once.** Output is written only by a join transaction that also writes the
  event's ``j:state``; two runs for the same event both write it, so snapshot
  isolation commits at most one, and a later run reads the state and stops. Two
  ingesters feeding the same event both write ``ev:raw`` of one row: one commits, the
  other's retry finds it (a duplicate). Registration and output are one commit, so
  Photon's joiner tokens and its window between registry and output do not exist.
* **No lost wake-up.** A foreign event whose primary is absent registers as a waiter
  in the primary's row *and writes the primary's* ``ev:raw`` (a placeholder), so it
  and a concurrent ingest of the primary write a common cell: one of them aborts and
  its retry sees the other (the joiner then finds the primary; the ingest finds the
  waiter and notifies it). Without the placeholder this is write skew (the joiner
  reads ``ev:raw`` and writes ``j:waiters``, the ingest the reverse).
* **At least once.** Every committed ingest leaves a notification (strong, or weak to
  a waiter), written before the commit point, so crashes do not lose it; the worker
  runs it until one run commits, or quarantines it (``verify`` lists those).
* **Clocks decide when, never whether.** The sweep fires a deadline by its own clock;
  it records that in the event's row (``j:due``) in the transaction that deletes the
  deadline row, and the joiner takes ``j:due`` as the deadline having passed whatever
  its own clock says. Without it a joiner whose clock lags the sweeper's would find
  the event still in time, with no deadline row left to fire again.
* **Retention.** The boundary only moves forward and is committed before anything
  older is deleted; an ingest reads it in its own transaction, so an event older than
  it is refused (``too_late``) rather than joined again after its rows are gone. A
  placeholder, which has no event time, ages by ``j:held``: once the boundary passes
  its waiters' last deadline, no waiter needs it.
"""

from __future__ import annotations

import enum
import json
import logging
import struct
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from observers import Observer, Periodic
from observers import VerifyReport as _SharedReport
from observers._recipes import check_pipeline, seconds
from observers.photon._adapter import Adapter, BadEvent, JsonAdapter
from observers.photon._events import LOGGED, EventStore
from percolator import Cluster, InvalidArgument, Snapshot, TransactionBase, transactional
from percolator.ext import committed_puts, pending_notifications, quarantined

__all__ = ["PLACEHOLDER", "IngestResult", "JoinPipeline", "State", "VerifyReport", "row_key"]

log = logging.getLogger(__name__)

PLACEHOLDER = b"\x00photon:placeholder"
"""``ev:raw`` of a primary that foreign events wait for but that has not arrived."""
RESERVED = b"\x00photon:"
"""The prefix of photon's own ``ev:raw`` values (the placeholder, a log reference)."""
RAW, TIME, STATE, WAIT, DUE, WAITERS, HELD, JOINED, DEADLINE = (
    "ev:raw", "ev:t", "j:state", "j:wait", "j:due", "j:waiters", "j:held", "ev:joined", "d:x")
BATCH = 500
MAX_WAITERS = 10_000
"""Waiters remembered per primary; beyond it an event relies on its deadline alone."""
MAX_SKEW_MS = 5 * 60 * 1000
"""Event times further in the future than this are refused (a producer's clock)."""
_MS = struct.Struct(">Q")


def row_key(event_id: bytes) -> bytes:
    """The row of *event_id* in the pipeline's tables."""
    return b"%02x/" % (zlib.crc32(event_id) & 0xFF) + event_id


def _deprecated_options(
    options: dict[str, Any], retention: float | timedelta | None,
    now: Callable[[], float] | None,
) -> tuple[float | timedelta | None, Callable[[], float] | None]:
    """*retention* and *now* with the first release's ``retention_days`` (days) and
    ``clock`` (milliseconds) folded in, each with a warning."""
    if "retention_days" in options:
        days = options.pop("retention_days")
        if retention is not None:
            raise InvalidArgument("pass retention (seconds or a timedelta), not also "
                                  "its old form retention_days")
        warnings.warn("JoinPipeline(retention_days=N) is deprecated: pass "
                      "retention=timedelta(days=N) (or seconds)", DeprecationWarning,
                      stacklevel=3)
        if days is not None:
            if isinstance(days, bool) or not isinstance(days, int | float) or days <= 0:
                raise InvalidArgument(f"retention_days must be positive or None, got {days!r}")
            retention = timedelta(days=days)
    if "clock" in options:
        clock = options.pop("clock")
        if now is not None:
            raise InvalidArgument("pass now (seconds), not also its old form clock")
        warnings.warn("JoinPipeline(clock=...) (milliseconds) is deprecated: pass now=... "
                      "returning seconds, as time.time", DeprecationWarning, stacklevel=3)
        if clock is not None:
            if not callable(clock):
                raise InvalidArgument(f"clock must be a callable returning ms, got {clock!r:.80}")
            def now_of_clock() -> float:  # _now_ms's round() gives clock()'s ms back
                return float(clock()) / 1000

            now = now_of_clock
    if options:
        raise InvalidArgument(f"JoinPipeline got unknown option(s) {sorted(options)}")
    return retention, now


class State(enum.Enum):
    """Where a foreign event stands."""

    PENDING = "pending"
    """Ingested, not yet processed by the joiner."""
    WAITING = "waiting"
    """Its primary has not arrived; it is joined when it does, or given up at its deadline."""
    JOINED = "joined"
    UNJOINABLE = "unjoinable"
    """No primary arrived before its deadline (``unjoinable_after``)."""
    SKIPPED = "skipped"
    """The adapter declined to join it."""


@dataclass
class IngestResult:
    """What an ingest call did with its events."""

    written: int = 0
    duplicates: int = 0
    """Already there (another feed, a replay): not written again."""
    too_late: int = 0
    """Older than the retention boundary: refused, never joined."""
    rejected: list[tuple[int, str]] = field(default_factory=list)
    """``(index in the input, reason)`` of events the adapter could not read."""

    def __iadd__(self, other: IngestResult) -> IngestResult:
        self.written += other.written
        self.duplicates += other.duplicates
        self.too_late += other.too_late
        self.rejected += other.rejected
        return self


@dataclass
class VerifyReport(_SharedReport):
    """What :meth:`JoinPipeline.verify` found: the shared report's :attr:`problems`
    (one line per kind of violation, naming up to 20 ids) with the ids and counts behind
    them; :attr:`ok` when no invariant is broken."""

    events: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    duplicates: list[bytes] = field(default_factory=list)
    """Foreign ids whose output was committed more than once."""
    orphans: list[bytes] = field(default_factory=list)
    """Output rows whose event is not marked joined (or the reverse)."""
    missing: list[bytes] = field(default_factory=list)
    """Events nothing will process: undecided with no pending notification and not
    quarantined, or waiting (with none) for a primary that is there or without the
    deadline row that would wake it."""
    quarantined: list[bytes] = field(default_factory=list)
    in_flight: int = 0
    """Undecided events with a pending notification (not a violation; workers busy)."""

    def counts(self) -> list[str]:
        """One line per kind of violation, with its count (0 too) and up to 20 ids:
        what ``python -m observers.photon verify`` prints."""
        return [_violation(label, ids) for label, ids in self._kinds()]

    def _kinds(self) -> tuple[tuple[str, list[bytes]], ...]:
        return (("duplicate output", self.duplicates),
                ("output and state disagree", self.orphans),
                ("never to be processed", self.missing))

    def _found(self) -> None:
        """Fill :attr:`problems`: a line per kind of violation found."""
        self.problems[:] = [_violation(label, ids) for label, ids in self._kinds() if ids]


def _violation(label: str, ids: list[bytes]) -> str:
    return f"{label}: {len(ids)}" + "".join(f"\n  {i!r}" for i in ids[:20])


@dataclass(frozen=True)
class _Event:
    index: int
    key: bytes
    raw: bytes
    time_ms: int | None
    stored: bytes | None = None
    """What ``ev:raw`` holds instead of *raw*: a log reference (``_events.py``)."""


class JoinPipeline:
    """Joins foreign events with the primary events they reference, exactly once
    (Photon, seed 000, on Percolator transactions)::

        from datetime import timedelta
        from observers import Worker, photon

        clicks = photon.JoinPipeline(cluster, "clicks", photon.JsonAdapter(
            foreign_id="click_id", primary_id="query_id", primary_ref="query_id",
            time="ts"), unjoinable_after=3 * 3600, retention=timedelta(days=3))
        clicks.create()
        clicks.log_primary(cluster, [{"query_id": "q1", "ts": 1700000000000}])
        clicks.log_foreign(cluster, [{"click_id": "c1", "query_id": "q1", "ts": 1700000000000}])
        Worker(cluster, clicks.observers(), tasks=clicks.tasks()).run()

    Durations are seconds (int or float) or :class:`~datetime.timedelta`:
    *unjoinable_after* (after the foreign event's time, or after it first waited when
    it has none) is how long an event waits for its primary; *retention* (None:
    forever) how long events are kept and deduplicated: an event older than that is
    refused as too late. *sweep_interval* is how often deadlines are checked. *now*
    (seconds since the epoch, as :func:`time.time`, which is the default) is the clock
    this process's joiner, sweep and retention read: hosts may disagree, and that
    changes only when an event is given up, never whether. (Event times, in the events
    and in :meth:`sweep` and :meth:`apply_retention`, are milliseconds since the epoch.)

    The old ``retention_days=`` (days) and ``clock=`` (a callable returning
    milliseconds) still work, with a :class:`DeprecationWarning`.

    :raises InvalidArgument: for a bad argument, naming it.
    """

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        adapter: Adapter,
        *,
        unjoinable_after: float | timedelta,
        retention: float | timedelta | None = None,
        sweep_interval: float | timedelta = 1.0,
        now: Callable[[], float] | None = None,
        **deprecated: Any,
    ) -> None:
        check_pipeline("JoinPipeline", cluster, name)
        if not isinstance(adapter, Adapter):
            raise InvalidArgument(f"adapter must implement photon.Adapter, got {adapter!r:.80}")
        retention, now = _deprecated_options(deprecated, retention, now)
        self.cluster = cluster
        self.name = name
        self.adapter = adapter
        self.unjoinable_after = seconds("unjoinable_after", unjoinable_after)
        self.retention = None if retention is None else seconds("retention", retention)
        self.sweep_interval = seconds("sweep_interval", sweep_interval)
        if now is not None and not callable(now):
            raise InvalidArgument(f"now must be a callable returning seconds, got {now!r:.80}")
        self.now: Callable[[], float] = now or time.time
        self._unjoinable_after_ms = round(self.unjoinable_after * 1000)
        self.events = EventStore()
        """Where the joiner looks up primaries kept as log references (an index
        :class:`LogFeed`); replace it to size its cache."""
        prefix = f"photon.{name}."
        self.foreign, self.primary, self.joined_table, self.deadlines, self.meta = (
            prefix + part for part in ("foreign", "primary", "joined", "deadlines", "meta"))
        self._created = False

    def _now_ms(self) -> int:
        """*now* in the events' unit, milliseconds since the epoch."""
        return round(self.now() * 1000)

    # --- set-up -----------------------------------------------------------------------

    def create(self) -> None:
        """Create the tables and register the joiner's column (idempotent). Call it
        before ingesting: a change committed before the column is observed would
        carry no notification."""
        for table in (self.foreign, self.primary, self.joined_table, self.deadlines, self.meta):
            self.cluster.create_table(table)
        self.cluster.observe(self.foreign, RAW)
        # The stored keys and units are the first release's: pipelines made by it open.
        config: dict[str, Any] = {
            "unjoinable_after_ms": self._unjoinable_after_ms,
            "retention_days": None if self.retention is None else self.retention / 86_400}
        if isinstance(self.adapter, JsonAdapter):
            config["json_adapter"] = self.adapter.fields
        _write_config(self.cluster, self.meta, json.dumps(config, sort_keys=True).encode())
        self._created = True

    @classmethod
    def open(cls, cluster: Cluster, name: str, adapter: Adapter | None = None,
             **options: Any) -> JoinPipeline:
        """The pipeline *name* as :meth:`create` recorded it (its JSON adapter, unless
        *adapter* is given)."""
        meta = f"photon.{name}.meta"
        if meta not in cluster.tables():
            raise InvalidArgument(f"no photon pipeline {name!r} in {cluster.url}: "
                                  "create() it first")
        raw = Snapshot(cluster).get(meta, b"config", "m:config")
        config = json.loads(raw or b"{}")
        if adapter is None:
            fields = config.get("json_adapter")
            if not fields:
                raise InvalidArgument(f"pipeline {name!r} has a custom adapter: pass it "
                                      "(--adapter package.module:NAME)")
            adapter = JsonAdapter(**fields)
        options.setdefault("unjoinable_after", config.get("unjoinable_after_ms", 3_600_000) / 1000)
        if "retention_days" not in options:  # an old caller's, which warns
            days = config.get("retention_days")
            options.setdefault("retention", None if days is None else days * 86_400)
        # Not taken as created: create() makes the meta table before it observes the
        # joiner's column, so one cut short between the two leaves a pipeline that
        # opens; its first ingest asks whether the column is observed (_check_created).
        return cls(cluster, name, adapter, **options)

    def _check_created(self) -> None:
        if not self._created:
            if not self.cluster.is_observed(self.foreign, RAW):
                raise InvalidArgument(f"photon pipeline {self.name!r} is not created: call "
                                      "create() before ingesting")
            self._created = True

    def observers(self) -> list[Observer]:
        """The joiner, for a :class:`~observers.Worker` (or ``python -m observers``)."""
        return [_Joiner(self)]

    def tasks(self) -> list[Periodic]:
        """The deadline sweep (every *sweep_interval*) and, with a retention, the
        retention pass (hourly), for ``Worker(..., tasks=...)``."""
        found = [Periodic(self.cluster, f"photon.{self.name}.sweep", self.sweep,
                          interval=self.sweep_interval)]
        if self.retention is not None:
            found.append(Periodic(self.cluster, f"photon.{self.name}.retention",
                                  self.apply_retention, interval=3600))
        return found

    # --- ingest -------------------------------------------------------------------------

    def _prepare(self, events: Iterable[bytes | str | Mapping[str, Any]], foreign: bool,
                 stored: Sequence[bytes] | None = None
                 ) -> tuple[list[_Event], list[tuple[int, str]]]:
        if isinstance(events, bytes | str | Mapping):
            raise InvalidArgument("events must be an iterable of events, not a single event")
        prepared, rejected = [], []
        limit = self._now_ms() + MAX_SKEW_MS
        read_id = self.adapter.foreign_id if foreign else self.adapter.primary_id
        for i, event in enumerate(events):
            if isinstance(event, Mapping):
                raw = json.dumps(event, sort_keys=True, separators=(",", ":")).encode()
            elif isinstance(event, str):
                raw = event.encode()
            elif isinstance(event, bytes):
                raw = event
            else:
                rejected.append((i, f"an event must be bytes, str or a JSON mapping, "
                                    f"got {type(event).__name__}"))
                continue
            try:
                event_id = read_id(raw)
                when = self.adapter.event_time(raw)
                if foreign:
                    self.adapter.primary_ref(raw)
            except BadEvent as e:
                rejected.append((i, str(e)))
                continue
            if not isinstance(event_id, bytes) or not event_id:
                rejected.append((i, f"the adapter gave an empty or non-bytes id {event_id!r}"))
            elif raw.startswith(RESERVED):
                rejected.append((i, f"the event begins with photon's reserved {RESERVED!r}"))
            elif when is not None and when > limit:
                rejected.append((i, f"event time {when} is more than {MAX_SKEW_MS // 1000}s "
                                    "in the future (check the producer's clock)"))
            else:
                prepared.append(_Event(i, row_key(event_id), raw, when,
                                       stored[i] if stored is not None else None))
        return prepared, rejected

    def log_foreign(self, target: Cluster | TransactionBase,
                    events: Iterable[bytes | str | Mapping[str, Any]]) -> IngestResult:
        """Ingest foreign events (committed in batches of 500 with a cluster, or
        written into the transaction *target*). Each new event is joined by a worker."""
        return self._ingest(target, events, foreign=True)

    def log_primary(self, target: Cluster | TransactionBase,
                    events: Iterable[bytes | str | Mapping[str, Any]]) -> IngestResult:
        """Ingest primary events; foreign events waiting for one are woken."""
        return self._ingest(target, events, foreign=False)

    def _ingest(self, target: Cluster | TransactionBase,
                events: Iterable[bytes | str | Mapping[str, Any]], *, foreign: bool,
                stored: Sequence[bytes] | None = None) -> IngestResult:
        """*stored*: per event, what ``ev:raw`` keeps instead of it (a log reference)."""
        self._check_created()
        prepared, rejected = self._prepare(events, foreign, stored)
        result = IngestResult(rejected=rejected)
        body = _ingest_foreign if foreign else _ingest_primary
        for start in range(0, len(prepared), BATCH):
            result += body(target, self, prepared[start:start + BATCH])
        return result

    def boundary_ms(self, snapshot: Snapshot) -> int:
        """The retention boundary: events older than it are refused."""
        return _boundary(snapshot, self)

    # --- reading ------------------------------------------------------------------------

    def joined(self, snapshot: Snapshot, foreign_id: bytes) -> bytes | None:
        """The output of the join of *foreign_id*, or None."""
        return snapshot.get(self.joined_table, row_key(_id(foreign_id)), JOINED)

    def state(self, snapshot: Snapshot, foreign_id: bytes) -> State | None:
        """Where the foreign event *foreign_id* stands (None: never ingested, or past
        retention)."""
        found = snapshot.get_row(self.foreign, row_key(_id(foreign_id)), [RAW, STATE, WAIT])
        return _state_of(found)

    # --- periodic tasks ---------------------------------------------------------------

    def sweep(self, now_ms: int | None = None) -> int:
        """Wake every waiting event whose deadline has passed (the joiner then marks it
        unjoinable, or joins it if its primary came meanwhile). Returns how many."""
        now = self._now_ms() if now_ms is None else now_ms
        with Snapshot(self.cluster) as snap:
            due = [row for row, _ in snap.scan(self.deadlines, None, _MS.pack(now + 1),
                                               [DEADLINE])]
        for start in range(0, len(due), 200):
            _fire_deadlines(self.cluster, self, due[start:start + 200])
        return len(due)

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Move the retention boundary to now - retention (never back), then delete
        every event older than it, with its output and deadline, and every placeholder
        whose waiters' last deadline is older than it. Returns how many rows went."""
        if self.retention is None:
            return 0
        now = self._now_ms() if now_ms is None else now_ms
        boundary = _advance_boundary(self.cluster, self,
                                     now - round(self.retention * 1000))
        removed = 0
        for table in (self.foreign, self.primary):
            with Snapshot(self.cluster) as snap:
                old = [row for row, cells in snap.scan(table, None, None, [TIME, HELD])
                       if _age(cells) < boundary]
            for start in range(0, len(old), 200):
                removed += _forget(self.cluster, self, table, old[start:start + 200], boundary)
        return removed

    # --- operations ---------------------------------------------------------------------

    def verify(self) -> VerifyReport:
        """Check the invariants over a snapshot: output once per event (counted from the
        write records of the output cells, so a second commit shows even though it
        overwrote the first), ``J`` exactly where output exists, and no undecided event
        that nothing will process."""
        report = VerifyReport()
        cluster = self.cluster
        pending = {p.row for p in pending_notifications(cluster, [self.foreign])}
        held = {q.row for q in quarantined(cluster, self.foreign)}
        with Snapshot(cluster) as snap:
            outputs = {row for row, _ in snap.scan(self.joined_table, None, None, [JOINED])}
            events = list(snap.scan(self.foreign, None, None, [RAW, STATE, WAIT]))
            deadlines = {row for row, _ in snap.scan(self.deadlines, None, None, [DEADLINE])}
            waited_on = {cells[WAIT][8:] for _, cells in events if WAIT in cells}
            primaries = {row for row in waited_on
                         if (p := snap.get(self.primary, row, RAW)) and p != PLACEHOLDER}
        for row, cells in events:
            state = _state_of(cells)
            if state is None:
                continue
            report.events += 1
            report.by_state[state.value] = report.by_state.get(state.value, 0) + 1
            fid = row[3:]
            if (state is State.JOINED) != (row in outputs):
                report.orphans.append(fid)
            if row in held:
                report.quarantined.append(fid)
            elif state is State.PENDING:
                if row in pending:
                    report.in_flight += 1
                else:
                    report.missing.append(fid)
            elif state is State.WAITING and row not in pending and (
                    cells[WAIT][8:] in primaries
                    or cells[WAIT][:8] + b"/" + row not in deadlines):
                report.missing.append(fid)
        ingested = {row for row, _ in events}
        report.orphans += [row[3:] for row in outputs if row not in ingested]
        puts = committed_puts(cluster, self.joined_table, sorted(outputs), JOINED)
        report.duplicates += [row[3:] for row, commits in sorted(puts.items())
                              if len(commits) > 1]
        report._found()
        return report

    def rejoin(self, state: State) -> int:
        """Put every event in *state* (UNJOINABLE or SKIPPED) back to undecided and
        wake the joiner for it: an operator's recovery after a late primary or a fixed
        adapter. Each is still joined at most once. Returns how many."""
        if state not in (State.UNJOINABLE, State.SKIPPED):
            raise InvalidArgument(f"rejoin takes UNJOINABLE or SKIPPED, got {state!r}")
        with Snapshot(self.cluster) as snap:
            rows = [row for row, cells in snap.scan(self.foreign, None, None, [RAW, STATE, WAIT])
                    if _state_of(cells) is state]
        for start in range(0, len(rows), 200):
            _reopen(self.cluster, self, rows[start:start + 200], _STATE_TAG[state])
        return len(rows)

    def __repr__(self) -> str:
        return f"<photon.JoinPipeline {self.name} on {self.cluster.url}>"


_STATE_TAG = {State.UNJOINABLE: b"U", State.SKIPPED: b"S"}


def _id(value: bytes | str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes) and value:
        return value
    raise InvalidArgument(f"an event id must be non-empty bytes or str, got {value!r:.80}")


def _age(cells: Mapping[str, bytes]) -> int:
    """What retention compares with its boundary: an event's time, or a
    placeholder's ``j:held``."""
    age: int = _MS.unpack(cells[TIME] if TIME in cells else cells[HELD])[0]
    return age


def _state_of(cells: Mapping[str, bytes]) -> State | None:
    if RAW not in cells:
        return None
    tag = cells.get(STATE, b"")[:1]
    if tag == b"J":
        return State.JOINED
    if tag == b"U":
        return State.UNJOINABLE
    if tag == b"S":
        return State.SKIPPED
    return State.WAITING if WAIT in cells else State.PENDING


# --- transactions (module-level, so that tests commit them with crash points) ----------


@transactional
def _write_config(txn: TransactionBase, meta: str, config: bytes) -> None:
    if txn.get(meta, b"config", "m:config") != config:
        txn.set(meta, b"config", "m:config", config)


def _boundary(txn: Snapshot, p: JoinPipeline) -> int:
    raw = txn.get(p.meta, b"gc", "m:boundary_ms")
    return int(raw) if raw else 0


@transactional
def _advance_boundary(txn: TransactionBase, p: JoinPipeline, boundary: int) -> int:
    old = _boundary(txn, p)
    if boundary <= old:
        return old
    txn.set(p.meta, b"gc", "m:boundary_ms", b"%d" % boundary)
    return boundary


def _admit(txn: TransactionBase, p: JoinPipeline, batch: Sequence[_Event],
           result: IngestResult) -> dict[bytes, _Event]:
    """The events of *batch* not older than the retention boundary, once per row
    (counting the others in *result*)."""
    boundary = _boundary(txn, p)
    fresh: dict[bytes, _Event] = {}
    for event in batch:
        if event.time_ms is not None and event.time_ms < boundary:
            result.too_late += 1
        elif event.key in fresh:
            result.duplicates += 1
        else:
            fresh[event.key] = event
    return fresh


def _store(txn: TransactionBase, table: str, key: bytes, event: _Event) -> None:
    txn.set(table, key, RAW, event.raw if event.stored is None else event.stored)
    if event.time_ms is not None:
        txn.set(table, key, TIME, _MS.pack(event.time_ms))


@transactional
def _ingest_foreign(txn: TransactionBase, p: JoinPipeline, batch: Sequence[_Event]
                    ) -> IngestResult:
    result = IngestResult()
    fresh = _admit(txn, p, batch, result)
    found = txn.get_rows(p.foreign, list(fresh), [RAW])
    for key, event in fresh.items():
        if found[key]:
            result.duplicates += 1
            continue
        _store(txn, p.foreign, key, event)
        result.written += 1
    return result


@transactional
def _ingest_primary(txn: TransactionBase, p: JoinPipeline, batch: Sequence[_Event]
                    ) -> IngestResult:
    result = IngestResult()
    fresh = _admit(txn, p, batch, result)
    found = txn.get_rows(p.primary, list(fresh), [RAW, WAITERS, HELD])
    for key, event in fresh.items():
        cells = found[key]
        if cells.get(RAW, PLACEHOLDER) != PLACEHOLDER:
            result.duplicates += 1
            continue
        _store(txn, p.primary, key, event)
        if WAITERS in cells:
            for waiter in cells[WAITERS].split(b"\n"):
                txn.notify(p.foreign, waiter, RAW)
            txn.delete(p.primary, key, WAITERS)
        if HELD in cells:
            txn.delete(p.primary, key, HELD)
        result.written += 1
    return result


def _hold_primary(txn: TransactionBase, p: JoinPipeline, primary_key: bytes,
                  primary: Mapping[str, bytes], deadline: int) -> None:
    """The race guard: a waiter writes the primary's ``ev:raw`` (a placeholder), so it
    and a concurrent ingest of that primary cannot both commit (module docstring).
    ``j:held`` keeps the latest deadline of its waiters, for retention."""
    txn.set(p.primary, primary_key, RAW, PLACEHOLDER)
    if HELD not in primary or _MS.unpack(primary[HELD])[0] < deadline:
        txn.set(p.primary, primary_key, HELD, _MS.pack(deadline))


def join_event(txn: TransactionBase, p: JoinPipeline, row: bytes, now_ms: int) -> bool:
    """The joiner's transaction body for the foreign event in *row*; returns False
    when there was nothing to do (decided already: a wasted run)."""
    cells = txn.get_row(p.foreign, row, [RAW, TIME, STATE, WAIT, DUE])
    raw = cells.get(RAW)
    if raw is None or STATE in cells:
        return False
    primary_key = row_key(p.adapter.primary_ref(raw))
    primary = txn.get_row(p.primary, primary_key, [RAW, WAITERS, HELD])
    wait = cells.get(WAIT)
    if primary.get(RAW, PLACEHOLDER) != PLACEHOLDER:
        output = p.adapter.join(_primary_event(txn, p, primary[RAW]), raw)
        if output is None:
            txn.set(p.foreign, row, STATE, b"S")
        else:
            txn.set(p.joined_table, row, JOINED, output)
            txn.set(p.foreign, row, STATE, b"J%d" % now_ms)
        _stop_waiting(txn, p, row, cells)
        return True
    if wait is not None:
        deadline = _MS.unpack(wait[:8])[0]
    else:
        when = cells.get(TIME)
        deadline = (_MS.unpack(when)[0] if when else now_ms) + p._unjoinable_after_ms
    # The sweep's j:due decides, not this host's clock: it deleted the deadline row,
    # so an event still "in time" here would never be woken again.
    if DUE in cells or now_ms >= deadline:
        txn.set(p.foreign, row, STATE, b"U")
        _stop_waiting(txn, p, row, cells)
        return True
    if wait is not None:
        return False  # waiting already, and still in time
    _hold_primary(txn, p, primary_key, primary, deadline)
    waiters = [w for w in primary.get(WAITERS, b"").split(b"\n") if w]
    if len(waiters) < MAX_WAITERS:
        txn.set(p.primary, primary_key, WAITERS, b"\n".join([*waiters, row]))
    txn.set(p.foreign, row, WAIT, _MS.pack(deadline) + primary_key)
    txn.set(p.deadlines, _MS.pack(deadline) + b"/" + row, DEADLINE, b"1")
    return True


def _primary_event(txn: TransactionBase, p: JoinPipeline, stored: bytes) -> bytes:
    """The primary event whose ``ev:raw`` is *stored*: itself, or looked up in the
    log it references (through the pipeline's cache)."""
    if not stored.startswith(LOGGED):
        return stored

    def directory_of(feed: str) -> Path | None:
        found = txn.get(p.meta, b"feed/" + feed.encode(), "c:dir")
        return Path(found.decode()) if found else None

    return p.events.lookup(stored, directory_of)


def _stop_waiting(txn: TransactionBase, p: JoinPipeline, row: bytes,
                  cells: Mapping[str, bytes]) -> None:
    """Delete the wait of the event in *row* (its foreign *cells*): ``j:wait``,
    ``j:due`` and the deadline row."""
    wait = cells.get(WAIT)
    if wait is not None:
        txn.delete(p.foreign, row, WAIT)
        txn.delete(p.deadlines, wait[:8] + b"/" + row, DEADLINE)
    if DUE in cells:
        txn.delete(p.foreign, row, DUE)


@transactional
def _fire_deadlines(txn: TransactionBase, p: JoinPipeline, rows: Sequence[bytes]) -> None:
    for row in rows:
        if txn.get(p.deadlines, row, DEADLINE) is None:
            continue  # joined (or fired) meanwhile
        txn.delete(p.deadlines, row, DEADLINE)
        txn.set(p.foreign, row[9:], DUE, row[:8])  # the decision the joiner obeys
        txn.notify(p.foreign, row[9:], RAW)


@transactional
def _forget(txn: TransactionBase, p: JoinPipeline, table: str, rows: Sequence[bytes],
            boundary: int) -> int:
    columns = ([RAW, TIME, STATE, WAIT, DUE] if table == p.foreign
               else [RAW, TIME, WAITERS, HELD])
    removed = 0
    for row, cells in txn.get_rows(table, rows, columns).items():
        if (TIME not in cells and HELD not in cells) or _age(cells) >= boundary:
            continue  # since the scan: gone, a newer waiter's placeholder, or its primary
        removed += 1
        # Every column, not only those read: a joiner deciding (j:state, j:wait) or a
        # waiter registering (j:waiters, j:held) meanwhile then conflicts with this
        # deletion, instead of both committing and leaving its cell alone in a row
        # whose event is gone, which no later pass would delete.
        for column in columns:
            txn.delete(table, row, column)
        if table == p.foreign:
            txn.delete(p.joined_table, row, JOINED)
            if WAIT in cells:
                txn.delete(p.deadlines, cells[WAIT][:8] + b"/" + row, DEADLINE)
    return removed


@transactional
def _reopen(txn: TransactionBase, p: JoinPipeline, rows: Sequence[bytes], tag: bytes) -> None:
    for row, cells in txn.get_rows(p.foreign, rows, [STATE]).items():
        if cells.get(STATE, b"")[:1] == tag:
            txn.delete(p.foreign, row, STATE)
            txn.notify(p.foreign, row, RAW)


class _Joiner(Observer):
    """The observer of a pipeline's foreign events (bound to it at run time)."""

    def __init__(self, pipeline: JoinPipeline) -> None:
        self.pipeline = pipeline
        self.table, self.column = pipeline.foreign, RAW
        self.name = f"photon.{pipeline.name}.joiner"
        self.wasted = 0
        """Runs that found the event decided already (duplicate inputs, reruns)."""

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        if not join_event(txn, self.pipeline, row, self.pipeline._now_ms()):
            self.wasted += 1


def iter_jsonl(lines: Iterable[bytes]) -> Iterator[bytes]:
    """The non-blank lines of a JSONL input, without their line ends."""
    for line in lines:
        line = line.strip()
        if line:
            yield line

