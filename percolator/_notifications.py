"""Notifications seen from outside a worker: pending notify cells, held locks, the
quarantine of failing notifications, and waiting until observers are idle.

Shared by the ``percolator`` command line (``status``, ``wait``, ``retry``) and the
``observers`` package (which imports it; nothing here imports ``observers``).

Layout (DESIGN.md §5, §7):

* a pending notification is a version of the notify cell ``n:<column>`` of a user
  table, at the commit timestamp of the change; value ``b"1"`` for a write to an
  observed column (strong) or ``b"w"`` for ``txn.notify`` (weak);
* an observer ``O`` acknowledges the change it processed in the user column
  ``_ack:O@<column>`` of the same row (the commit timestamp of that change);
* a quarantined notification is one JSON cell of the meta table: row
  ``b"quarantine/<table>/" + row``, column ``m:<column>``. Quarantining removes the
  notify cell; :func:`retry_quarantined` writes it back and deletes the record.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from percolator import metrics
from percolator._encoding import (
    FREE_TAG,
    LOCK,
    META_TABLE,
    NOTIFY,
    Free,
    LockState,
    decode_lock,
)
from percolator._errors import InvalidArgument, PercolatorError
from percolator._internals import internals
from percolator._lock_resolver import resolve_lock
from percolator._notify_index import indexed_cells, is_migrated, uses_index, write_entries
from percolator._store import Mutation, Read

if TYPE_CHECKING:
    from percolator._cluster import Cluster

__all__ = [
    "ACK_FAMILY",
    "NOTIFY_STRONG",
    "NOTIFY_WEAK",
    "HeldLock",
    "Pending",
    "Quarantined",
    "WaitTimeout",
    "ack_column",
    "clear_failures",
    "format_row",
    "held_locks",
    "parse_row",
    "pending_notifications",
    "quarantine",
    "quarantined",
    "record_failure",
    "retry_quarantined",
    "wait_until_idle",
    "watch_pending_notifications",
]

ACK_FAMILY = "_ack"
NOTIFY_STRONG = b"1"
"""The value of a notification that a commit of an observed column writes."""
NOTIFY_WEAK = b"w"
"""The value of a weak notification (``Transaction.notify``): it runs the observers
of a cell without a write to it."""
_QUARANTINE = b"quarantine/"
_FAILURES = b"failures/"
_FAILURE = struct.Struct(">QI")  # notify timestamp of the notification, failures of it
_NO_FAILURES = _FAILURE.pack(0, 0)


def ack_column(observer: str, column: str) -> str:
    """The acknowledgement column of observer *observer* on user column *column*."""
    return f"{ACK_FAMILY}:{observer}@{column}"


def format_row(row: bytes) -> str:
    """*row* as text for people: UTF-8 if printable, else ``hex:...``
    (:func:`parse_row` reads both back)."""
    try:
        text = row.decode()
    except UnicodeDecodeError:
        return "hex:" + row.hex()
    if text.isprintable() and not text.startswith("hex:"):
        return text
    return "hex:" + row.hex()


def parse_row(text: str) -> bytes:
    """The row key written as *text* by :func:`format_row`."""
    if text.startswith("hex:"):
        try:
            return bytes.fromhex(text[4:])
        except ValueError:
            raise InvalidArgument(f"bad hex row key {text!r}") from None
    return text.encode()


@dataclass(frozen=True, slots=True)
class Pending:
    """A dirty cell: notify versions (timestamps, newest first) of one column."""

    table: str
    row: bytes
    column: str
    timestamps: tuple[int, ...]
    weak: bool
    strong: bool


@dataclass(frozen=True, slots=True)
class HeldLock:
    """A lock cell not FREE: a transaction in flight, or one a cleaner must finish."""

    table: str
    row: bytes
    column: str
    state: LockState
    raw: bytes


def _tables(cluster: Cluster, tables: Iterable[str] | None) -> list[str]:
    return list(tables) if tables is not None else cluster.tables()


def pending_notifications(
    cluster: Cluster, tables: Iterable[str] | None = None
) -> Iterator[Pending]:
    """Every pending notification of *tables* (all user tables when None). It costs
    in proportion to the dirty cells: a scan of the notify family, or of the
    notification index where the store has one (:mod:`percolator._notify_index`)."""
    for table, row, cells in _dirty_cells(cluster, _tables(cluster, tables), [_NOTIFIED]):
        for name, versions in cells.items():
            values = {value for _, value in versions}
            yield Pending(
                table, row, name[len(NOTIFY) + 1 :],
                tuple(ts for ts, _ in versions),
                weak=NOTIFY_WEAK in values, strong=NOTIFY_STRONG in values,
            )


_NOTIFIED = Read(NOTIFY, versions=None)
_HELD = Read(LOCK, skip_tag=FREE_TAG)


def _dirty_cells(
    cluster: Cluster, tables: list[str], reads: list[Read]
) -> Iterator[tuple[str, bytes, dict[str, list[tuple[int, bytes]]]]]:
    """``(table, row, cells)`` of *reads* over the rows that may hold a notification:
    through the index for the tables it covers, by a scan of the table otherwise."""
    scanned = tables
    if uses_index(internals(cluster).store):
        indexed = [t for t in tables if is_migrated(internals(cluster), t)]
        yield from indexed_cells(internals(cluster), indexed, reads)
        scanned = [t for t in tables if t not in indexed]
    for table in scanned:
        for row, cells in internals(cluster).store.scan(table, None, None, reads):
            yield table, row, cells


def _held(
    found: Iterable[tuple[str, bytes, dict[str, list[tuple[int, bytes]]]]]
) -> Iterator[HeldLock]:
    """The lock cells among *found* (``(table, row, cells)`` of a lock-family read)
    that are not FREE."""
    for table, row, cells in found:
        for name, versions in cells.items():
            state = decode_lock(versions[0][1])
            if not isinstance(state, Free):
                yield HeldLock(table, row, name[len(LOCK) + 1 :], state, versions[0][1])


def _notifying_locks(cluster: Cluster) -> Iterator[HeldLock]:
    """Held locks of cells with a notification index entry: where a store keeps the
    index, the locks whose resolution can still produce a notification (a committer
    writes its entries before its commit point), found in O(entries)."""
    return _held(_dirty_cells(cluster, cluster.tables(), [_HELD]))


def held_locks(cluster: Cluster, tables: Iterable[str] | None = None) -> Iterator[HeldLock]:
    """Every lock cell of *tables* that is not FREE."""
    return _held((table, row, cells) for table in _tables(cluster, tables)
                 for row, cells in internals(cluster).store.scan(table, None, None, [_HELD]))


# --- quarantine -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A notification taken out of circulation after repeated observer failures."""

    table: str
    row: bytes
    column: str
    observer: str
    error: str
    failures: int
    weak: bool
    since: float
    """Wall time (seconds since the epoch) of the quarantine."""


def _record_key(table: str, row: bytes) -> bytes:
    return _QUARANTINE + table.encode() + b"/" + row


def _failures_key(table: str, row: bytes) -> bytes:
    return _FAILURES + table.encode() + b"/" + row


def _read_failures(cluster: Cluster, key: bytes, column: str) -> bytes | None:
    versions = internals(cluster).store.read_rows(META_TABLE, [key], [Read("m", (column,))]).get(
        key, {}
    ).get(f"m:{column}")
    return versions[0][1] if versions else None


def record_failure(cluster: Cluster, table: str, row: bytes, column: str, notify_ts: int) -> int:
    """Count one more failure of the notification whose newest notify version is
    *notify_ts*, for the whole cluster (every worker process shares the count; a newer
    notification of the cell starts again from zero). Returns the new count."""
    key = _failures_key(table, row)
    while True:
        raw = _read_failures(cluster, key, column)
        seen_ts, count = _FAILURE.unpack(raw) if raw is not None else (0, 0)
        count = count + 1 if seen_ts == notify_ts else 1
        if internals(cluster).store.check_and_set(
            META_TABLE, key, f"m:{column}", raw, _FAILURE.pack(notify_ts, count)
        ):
            return count


def clear_failures(cluster: Cluster, table: str, row: bytes, column: str) -> None:
    """Reset the cell's failure count (its notification succeeded or was quarantined).
    A compare-and-set, not a delete: the counter is only ever compare-and-set, which
    HBase writes at server time, so a delete at one of our timestamps could miss it.
    Losing a race to a newer failure leaves that failure counted, as it should."""
    key = _failures_key(table, row)
    raw = _read_failures(cluster, key, column)
    if raw is not None and raw != _NO_FAILURES:
        internals(cluster).store.check_and_set(META_TABLE, key, f"m:{column}", raw, _NO_FAILURES)


def quarantine(cluster: Cluster, record: Quarantined, notify_ts: int) -> None:
    """Record *record* and remove the notify versions at or below *notify_ts* (a newer
    change keeps its notification and gets a fresh chance)."""
    body = asdict(record)
    body.pop("table")
    body.pop("row")
    body.pop("column")
    value = json.dumps(body, sort_keys=True).encode()
    # A fresh timestamp, above any earlier delete of the record: on HBase a delete
    # hides every later put at or below its timestamp.
    ts = internals(cluster).timestamps.get_timestamp()
    internals(cluster).store.mutate_rows(
        META_TABLE,
        [Mutation(_record_key(record.table, record.row), [(f"m:{record.column}", ts, value)])],
    )
    internals(cluster).store.mutate_rows(
        record.table, [Mutation(record.row, deletes=[(f"{NOTIFY}:{record.column}", notify_ts)])]
    )


def quarantined(
    cluster: Cluster,
    table: str | None = None,
    row: bytes | None = None,
    column: str | None = None,
) -> list[Quarantined]:
    """The quarantined notifications, optionally only those of *table*, *row*, *column*."""
    if table is None:
        start, stop = _QUARANTINE, _QUARANTINE[:-1] + b"0"
    elif row is None:
        start = _QUARANTINE + table.encode() + b"/"
        stop = start[:-1] + b"0"
    else:
        start = _record_key(table, row)
        stop = start + b"\0"
    found = []
    for key, cells in internals(cluster).store.scan(META_TABLE, start, stop, [Read("m")]):
        t, _, r = key[len(_QUARANTINE) :].partition(b"/")
        for name, versions in cells.items():
            c = name[2:]
            if (column is not None and c != column) or not versions[0][1]:
                continue
            body = json.loads(versions[0][1])
            found.append(Quarantined(table=t.decode(), row=r, column=c, **body))
    return found


def retry_quarantined(
    cluster: Cluster,
    table: str | None = None,
    row: bytes | None = None,
    column: str | None = None,
) -> list[Quarantined]:
    """Put quarantined notifications (all, or those of *table*, *row*, *column*)
    back in circulation: write their notify cell at a fresh timestamp, then delete
    the record. Returns the notifications put back."""
    records = quarantined(cluster, table, row, column)
    for record in records:
        ts = internals(cluster).timestamps.get_timestamp()
        kind = NOTIFY_WEAK if record.weak else NOTIFY_STRONG
        internals(cluster).store.mutate_rows(
            record.table, [Mutation(record.row, [(f"{NOTIFY}:{record.column}", ts, kind)])]
        )
        # After the notify cell, as a weak notification's (percolator/_notify_index.py).
        write_entries(internals(cluster), [(record.table, record.row, record.column)], ts)
        internals(cluster).store.mutate_rows(
            META_TABLE,
            [Mutation(_record_key(record.table, record.row), deletes=[(f"m:{record.column}", ts)])],
        )
    return records


# --- waiting --------------------------------------------------------------------------


class WaitTimeout(PercolatorError, TimeoutError):
    """Observers were still busy when the wait's deadline passed; ``pending`` and
    ``locks`` hold what was left."""

    def __init__(self, message: str, pending: list[Pending], locks: list[HeldLock]) -> None:
        super().__init__(message)
        self.pending = pending
        self.locks = locks


def _describe(pending: list[Pending], locks: list[HeldLock], limit: int = 10) -> str:
    lines = []
    for p in pending[:limit]:
        kind = "weak" if p.weak and not p.strong else "strong"
        lines.append(f"  notification {p.table}/{format_row(p.row)}/{p.column} ({kind}, "
                     f"{len(p.timestamps)} version(s))")
    if len(pending) > limit:
        lines.append(f"  ... and {len(pending) - limit} more notification(s)")
    for lk in locks[:limit]:
        holder = getattr(lk.state, "start_ts", "?")
        lines.append(f"  lock {lk.table}/{format_row(lk.row)}/{lk.column} "
                     f"({type(lk.state).__name__.lower()} by transaction {holder})")
    if len(locks) > limit:
        lines.append(f"  ... and {len(locks) - limit} more lock(s)")
    return "\n".join(lines)


def wait_until_idle(cluster: Cluster, timeout: float | None, poll: float = 0.05) -> None:
    """Return once no notification is pending and no lock is held in any user table,
    seen in two consecutive passes (work may move between tables during one pass).

    Locks found are resolved as a reader would (rolled forward or back when their
    transaction is decided or its owner dead), so that a change committed by a
    crashed client gets its notify cell even if nobody else reads the cell.

    .. warning:: blocks; *timeout* None waits forever.
    :raises WaitTimeout: after *timeout* seconds, listing what is still pending.
    """
    if timeout is not None and (not isinstance(timeout, int | float) or timeout < 0):
        raise InvalidArgument(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    deadline = None if timeout is None else time.monotonic() + timeout
    clean = 0
    indexed = uses_index(internals(cluster).store)
    while True:
        pending = list(pending_notifications(cluster))
        locks = list(_notifying_locks(cluster) if indexed else held_locks(cluster))
        for lk in locks:
            resolve_lock(internals(cluster), lk.table, lk.row, lk.column, lk.raw)
        if not pending and not locks:
            clean += 1
            if clean >= 2:
                return
            continue
        clean = 0
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(
                f"observers still busy after {timeout}s: {len(pending)} pending "
                f"notification(s), {len(locks)} held lock(s):\n" + _describe(pending, locks),
                pending, locks,
            )
        time.sleep(poll)


def watch_pending_notifications(
    cluster: Any, tables: Iterable[str] | None = None, every: float = 5.0
) -> Callable[[], Iterable[tuple[str, tuple[str, ...], float]]]:
    """Export ``percolator_notifications_pending`` per table of *tables* (every user
    table when None) of *cluster*, counted by a scan of the notify family at scrape time
    but at most every *every* seconds (a scrape in between gets the last count). Returns
    the callback, for :func:`percolator.metrics.remove_gauge_callback`. (Here, not in
    :mod:`percolator.metrics`: metrics records what others report and reads no table.)"""
    state: dict[str, Any] = {"at": float("-inf"), "values": []}
    guard = threading.Lock()

    def count() -> list[tuple[str, tuple[str, ...], float]]:
        with guard:
            if time.monotonic() - state["at"] >= every:
                names = list(tables) if tables is not None else cluster.tables()
                counts = dict.fromkeys(names, 0)
                for p in pending_notifications(cluster, names):
                    counts[p.table] += 1
                state["values"] = [("percolator_notifications_pending", (t,), float(n))
                                   for t, n in counts.items()]
                state["at"] = time.monotonic()
            values: list[tuple[str, tuple[str, ...], float]] = state["values"]
            return values

    metrics.add_gauge_callback(count)
    return count
