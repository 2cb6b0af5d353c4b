"""Ubiq on Percolator tables: tracking growing files, cutting them into work units,
leasing, processing and committing each unit once, publishing file output, and
splitting off bad records.

Tables of pipeline ``<p>``:

* ``ubiq.<p>.files``, row = file name: ``f:size`` (largest complete size seen at any
  site; **observed by the cutter**), ``f:site.<S>`` (complete size at site S),
  ``f:head`` (sha256 of the first KiB, to tell a replaced file), ``f:since`` (ms when
  the oldest byte not yet in a unit was first reported), ``f:cut`` (bytes below it are
  in units), ``f:grown`` (ms of the last report that changed the row), ``f:refused``
  (why the file is no longer followed: truncated or replaced);
* ``ubiq.<p>.units``, row = ``name NUL be64(begin)``: ``u:range`` (``end``),
  ``u:state`` (``P`` pending, ``C`` committed, ``Q`` quarantined, ``X`` split),
  ``u:lease`` (owner, expiry), ``u:fail`` (failed attempts), ``u:commit`` (the committed
  attempt and its staged files), ``u:ready`` (**observed by the processor**; with a
  *site_eta*, ``u:ready.<S>`` per site, and ``u:home``, ``u:born``),
  ``u:published`` (**``u:commit`` is observed by the dispatcher**);
* ``ubiq.<p>.quarantine``, same rows: ``x:error``;
* ``ubiq.<p>.pending``, same rows: ``p:u``, present exactly while the unit is pending
  (written and deleted in the transactions that change ``u:state``): the lease sweep
  reads it, so a sweep costs O(pending units), not O(every unit ever cut);
* ``ubiq.<p>.packer``, one row ``tails``: ``k:due`` (**observed by the packer**, only
  ever notified, never written): a file's short tail is due to be packed.

The garbage collector forgets a file whose every byte is committed once it has not
grown for *forget_after*: its units and its row go in one transaction. The tracker
never reports a file that old (a file must stop growing before then, as Ubiq's
trackers only follow files at most d days old), so a forgotten file is never seen anew.

Why every tracked byte is committed exactly once (docs/ubiq.md has the long form):

* **One unit per byte.** Two cutters of one file (or a cutter and the packer) both
  write ``f:cut``, so one commits; units are cut at record boundaries from ``f:cut``
  up, and a split replaces a unit by pieces that partition its range, in one
  transaction.
* **One commit per unit.** The commit reads ``u:state == P`` and writes ``C`` (two
  committers conflict on it) and deletes ``u:lease``; a worker that lost its lease (a
  newer lease was committed) conflicts on ``u:lease`` and its output, written in the
  same transaction, never appears.
* **Every unit committed or quarantined.** The processor's notification is written
  with the unit, and the processor's run that acknowledges it writes the unit's lease
  in the same transaction: at every commit a pending unit has a notification or a
  lease, whatever dies when. A lease of a dead owner (the liveness layer) is taken
  over at once, one past its expiry after it; the lease sweep re-notifies both.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from observers import Observer, Periodic, VerifyReport
from observers._logs import HEAD_BYTES, Record, matching_files, read_records, refusal
from observers._logs import complete_size as _complete_size
from observers._logs import head_digest as _head
from observers._recipes import bind, check_pipeline
from percolator import (
    Cluster,
    ConflictError,
    InvalidArgument,
    Snapshot,
    Transaction,
    TransactionBase,
    transactional,
)
from percolator.ext import ack_column, internal_columns, internals, pending_notifications

__all__ = [
    "Application", "BadRecord", "CoverageReport", "LogPipeline", "Output", "Record", "WorkUnit",
]

log = logging.getLogger(__name__)

_BEGIN = struct.Struct(">Q")
MAX_FAILURES = 2
"""Failed attempts of a unit before it is split (a single record: quarantined)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def unit_row(name: str, begin: int) -> bytes:
    return name.encode() + b"\0" + _BEGIN.pack(begin)


def parse_unit_row(row: bytes) -> tuple[str, int]:
    return row[:-9].decode(), _BEGIN.unpack(row[-8:])[0]


class BadRecord(Exception):
    """Raised by an application for a record it refuses: the unit is split so that
    everything else commits and the record's range is quarantined."""


@dataclass
class WorkUnit:
    """A byte range ``[begin, end)`` of one file, read from *site*'s replica, and
    with several small files packed into one unit, the further ranges in *parts*
    (each a ``WorkUnit`` of one range; ``parts[0]`` is this first one)."""

    file: str
    begin: int
    end: int
    path: Path
    site: str
    parts: list[WorkUnit] = field(default_factory=list)

    @property
    def id(self) -> str:
        more = f"+{len(self.parts) - 1}" if len(self.parts) > 1 else ""
        return f"{self.file}@{self.begin}-{self.end}{more}"

    @property
    def size(self) -> int:
        """Bytes in the unit, over all its parts."""
        return sum(part.end - part.begin for part in self.parts) if self.parts else (
            self.end - self.begin)

    def records(self) -> Iterator[Record]:
        """The unit's records, whole (units are cut at newlines), part after part."""
        for part in self.parts or [self]:
            yield from read_records(part.path, part.file, part.begin, part.end,
                                    f" at site {part.site}")


@dataclass
class Output:
    """What an application writes for a unit: table writes, committed with the unit,
    and files, published once the unit commits (never a losing attempt's)."""

    _txn: TransactionBase
    _staging: Path
    files: list[str] = field(default_factory=list)

    def set(self, table: str, row: bytes, column: str, value: bytes) -> None:
        """Write a cell in the unit's commit transaction (the table must exist)."""
        self._txn.set(table, row, column, value)

    def delete(self, table: str, row: bytes, column: str) -> None:
        """Delete a cell in the unit's commit transaction."""
        self._txn.delete(table, row, column)

    def file(self, name: str) -> IO[bytes]:
        """A new staged file *name*, published as ``<sink>/<unit id>.<name>``."""
        if not name or "/" in name or name.startswith("."):
            raise InvalidArgument(f"bad output file name {name!r}")
        self._staging.mkdir(parents=True, exist_ok=True)
        self.files.append(name)
        return open(self._staging / name, "wb")


@dataclass
class CoverageReport(VerifyReport):
    """What :meth:`LogPipeline.verify` found: the shared report's :attr:`problems`
    (a line per file whose coverage is wrong) and :attr:`files`, every tracked file
    with what is wrong with it (:meth:`LogPipeline.coverage`)."""

    files: dict[str, list[str]] = field(default_factory=dict)


class Application:
    """What a :class:`LogPipeline` runs on each unit: ``process(unit, out)`` reads
    ``unit.records()`` and writes through *out* only (it may run more than once for a
    unit; only the committed run's output counts). Raise :class:`BadRecord` (or any
    exception) for a record it cannot take: the unit is split around it."""

    def process(self, unit: WorkUnit, out: Output) -> None:
        """Process the records of *unit*, writing through *out*.

        :raises BadRecord: (or any exception) for a record it cannot take."""
        raise NotImplementedError


class LogPipeline:
    """Processes growing log files, in several replicas ("sites"), exactly once, in
    work units (Ubiq, seed 003)::

        from observers import Worker, ubiq

        class CampaignCounts(ubiq.Application):     # docs/ubiq.md has it in full
            def process(self, unit, out):
                ...

        logs = ubiq.LogPipeline(cluster, "adlogs", app=CampaignCounts(),
                                sites={"a": "/logs/a", "b": "/logs/b"}, pattern="*.jsonl",
                                unit_bytes=1 << 20, max_unit_delay=5.0)
        logs.create()
        Worker(cluster, logs.observers(site="a"), tasks=logs.tasks(site="a")).run()

    *unit_bytes*: target unit size; a shorter tail is cut once it has not grown for
    *max_unit_delay* seconds. *local_eta*: how long a lease of a live owner holds.
    *sink*: where file output is published (default: ``<first site>/../<name>.out``).
    *on_commit* is called with each unit this process commits, after its commit (for
    metrics; an exception from it is logged). *forget_after*: seconds after which a
    file that stopped growing is no longer tracked, and once all of it is committed,
    its units and row are garbage-collected (None: files are followed and kept for
    ever); a file must not grow again after that long a pause (it would be tracked
    anew, from its first byte). *site_eta* (Ubiq's data-center ETA): each unit is
    given to one site, among those whose replica holds its bytes, and only that
    site's workers are notified of it; a unit not committed *site_eta* seconds after
    it was cut is handed to every site by the lease sweep (a site down, or in
    partial outage, loses its units to the others). None: every unit goes to every
    site at once. *pack_files*: a file's short tail, once due, is cut with other
    files' short tails into one unit, oldest first (False: a unit never spans files).
    """

    def __init__(self, cluster: Cluster, name: str, *, app: Application,
                 sites: dict[str, str | os.PathLike[str]], pattern: str = "*.jsonl",
                 unit_bytes: int = 1 << 20, max_unit_delay: float = 5.0,
                 local_eta: float = 60.0, track_interval: float = 1.0,
                 sink: str | os.PathLike[str] | None = None,
                 forget_after: float | None = 7 * 86400.0,
                 site_eta: float | None = None, pack_files: bool = True,
                 on_commit: Callable[[WorkUnit], None] | None = None) -> None:
        check_pipeline("LogPipeline", cluster, name)
        if not isinstance(app, Application):
            raise InvalidArgument(f"app must be a ubiq.Application, got {app!r:.80}")
        if not sites or not all(isinstance(s, str) and s.isalnum() for s in sites):
            raise InvalidArgument(f"sites must map alphanumeric names to directories, "
                                  f"got {sites!r:.80}")
        if not isinstance(unit_bytes, int) or unit_bytes <= 0:
            raise InvalidArgument(f"unit_bytes must be a positive int, got {unit_bytes!r}")
        if forget_after is not None and (
                not isinstance(forget_after, int | float) or isinstance(forget_after, bool)
                or forget_after <= 0):
            raise InvalidArgument(f"forget_after must be a positive number of seconds or "
                                  f"None, got {forget_after!r}")
        self.forget_after_ms = None if forget_after is None else int(forget_after * 1000)
        if site_eta is not None and (
                not isinstance(site_eta, int | float) or isinstance(site_eta, bool)
                or site_eta <= 0):
            raise InvalidArgument(f"site_eta must be a positive number of seconds or None, "
                                  f"got {site_eta!r}")
        self.site_eta_ms = None if site_eta is None else int(site_eta * 1000)
        self.pack_files = bool(pack_files)
        self.cluster, self.name, self.app = cluster, name, app
        self.on_commit = on_commit
        self.sites = {s: Path(d) for s, d in sites.items()}
        self.pattern = pattern
        self.unit_bytes = unit_bytes
        self.max_unit_delay_ms = int(max_unit_delay * 1000)
        self.local_eta_ms = int(local_eta * 1000)
        self.track_interval = track_interval
        first = next(iter(self.sites.values()))
        self.sink = Path(sink) if sink is not None else first.parent / f"{name}.out"
        self.staging = self.sink / ".staging"
        prefix = f"ubiq.{name}."
        self.files, self.units, self.quarantine, self.pending, self.packer = (
            prefix + t for t in ("files", "units", "quarantine", "pending", "packer"))

    # --- set-up ---------------------------------------------------------------------

    def create(self) -> None:
        """Create the tables and register the observed columns (idempotent). A
        pipeline made before the pending-units index existed gets it filled in."""
        indexed = self.pending in self.cluster.tables()
        for table in (self.files, self.units, self.quarantine, self.pending, self.packer):
            self.cluster.create_table(table)
        if not indexed:
            with Snapshot(self.cluster) as snap:
                rows = [row for row, cells in snap.scan(self.units, None, None, ["u:state"])
                        if cells.get("u:state") == b"P"]
            for start in range(0, len(rows), 200):
                _index_pending(self.cluster, self, rows[start:start + 200])
        self.cluster.observe(self.files, "f:size")
        self.cluster.observe(self.packer, _PACK_COLUMN)
        for column in self.ready_columns():
            self.cluster.observe(self.units, column)
        self.cluster.observe(self.units, "u:commit")

    def observers(self, site: str | None = None) -> list[Observer]:
        """The cutter, the packer, the processor (reading from *site*: default the
        first) and the dispatcher, for a :class:`~observers.Worker`."""
        site = site or next(iter(self.sites))
        if site not in self.sites:
            raise InvalidArgument(f"unknown site {site!r}; sites: {sorted(self.sites)}")
        return [_Cutter(self), _Packer(self), _Processor(self, site), _Dispatcher(self)]

    def tasks(self, site: str | None = None) -> list[Periodic]:
        """The tracker of *site* (default: every site), the lease sweep and the
        garbage collector (:meth:`collect_garbage`, unless *forget_after* is None)."""
        sites = [site] if site else list(self.sites)
        found = [Periodic(self.cluster, f"ubiq.{self.name}.track.{s}", bind(self.track, s),
                          interval=self.track_interval) for s in sites]
        found.append(Periodic(self.cluster, f"ubiq.{self.name}.leases", self.sweep_leases,
                              interval=max(self.track_interval, 0.5)))
        if self.forget_after_ms is not None:
            found.append(Periodic(self.cluster, f"ubiq.{self.name}.gc", self.collect_garbage,
                                  interval=min(60.0, max(0.5, self.forget_after_ms / 4000))))
        return found

    # --- tracking ---------------------------------------------------------------------

    def track(self, site: str) -> int:
        """One pass of *site*'s tracker: report the growth of every matching file
        (at least once; the transaction ignores what is not growth), refuse files that
        shrank or were replaced, and wake the cutter for tails that stopped growing
        (the packer, once, for short tails to pack). Returns how many files grew."""
        directory = self.sites[site]
        grown, pack = 0, False
        now = _now_ms()
        names = matching_files(directory, self.pattern)
        with Snapshot(self.cluster) as snap:
            known = {row.decode(): cells for row, cells in snap.get_rows(
                self.files, [n.encode() for n in names],
                [f"f:site.{site}", "f:size", "f:cut", "f:since", "f:refused"]).items()}
        for name in names:
            cells = known[name]
            if "f:refused" in cells:
                continue
            path = directory / name
            try:
                seen = int(cells.get(f"f:site.{site}", b"0"))
                actual = path.stat().st_size
                size = _complete_size(path, seen) if actual >= seen else actual
                head = _head(path) if size else b""
                modified = int(path.stat().st_mtime * 1000)
            except FileNotFoundError:
                continue
            cut, total = int(cells.get("f:cut", b"0")), int(cells.get("f:size", b"0"))
            if size != seen or "f:size" not in cells:
                if _report(self.cluster, self, name, site, size, head, now, modified):
                    grown += 1
            elif cut < total and now - int(cells.get("f:since", b"0")) >= self.max_unit_delay_ms:
                if self.pack_files and total - cut < self.unit_bytes:
                    pack = True  # one wake-up of the packer for all of them
                else:
                    _nudge(self.cluster, self, name)  # a tail that stopped growing: cut it
        if pack:
            _nudge_packer(self.cluster, self)
        return grown

    def ready_columns(self, home: str | None = None) -> list[str]:
        """The columns whose notification hands a unit to a site's processors: with
        a *site_eta*, one per site (*home*'s only, when given), else one for all."""
        if self.site_eta_ms is None:
            return ["u:ready"]
        return [f"u:ready.{home}"] if home in self.sites else [
            f"u:ready.{s}" for s in self.sites]

    def sweep_leases(self, now_ms: int | None = None) -> int:
        """Re-notify pending units whose lease expired or whose owner is dead, so that
        a worker takes them over, and pending units with neither a lease nor a
        notification (:meth:`stranded`), to their site's workers; a unit past its
        *site_eta* (not leased by a live owner in time), to every site's. Returns
        how many."""
        now = _now_ms() if now_ms is None else now_ms
        due: list[tuple[bytes, list[str]]] = []
        unleased = []
        for row, cells in self._pending_units():
            late = self.site_eta_ms is not None and (
                now - int(cells.get("u:born", b"0")) >= self.site_eta_ms)
            home = None if late else cells.get("u:home", b"").decode()
            if "u:lease" in cells:
                owner, expires = _lease(cells["u:lease"])
                if expires > now and (
                        internals(self.cluster).coordination.is_alive(owner) is not False):
                    continue  # a live owner's lease in force: the unit is in hand
                due.append((row, self.ready_columns(home)))
            elif late:
                due.append((row, self.ready_columns()))  # its site's time is up
            else:
                unleased.append((row, home))
        stranded = set(self._unnotified([row for row, _ in unleased]))
        due += [(row, self.ready_columns(home)) for row, home in unleased if row in stranded]
        if due:
            _renotify(self.cluster, self, due)
        return len(due)

    def stranded(self) -> list[bytes]:
        """Rows of pending units with neither a lease nor a pending notification:
        nothing would process them but :meth:`sweep_leases`. Units are leased in the
        transaction that acknowledges their notification, so none should be; a
        unit left so by an older version is woken by the next sweep."""
        return self._unnotified([row for row, cells in self._pending_units()
                                 if "u:lease" not in cells])

    def _pending_units(self) -> list[tuple[bytes, dict[str, bytes]]]:
        """Rows and ``u:state``/``u:lease`` cells of the pending units, found through
        the pending-units index (one snapshot: the index and the units agree)."""
        with Snapshot(self.cluster) as snap:
            rows = [row for row, _ in snap.scan(self.pending, None, None, ["p:u"])]
            found = snap.get_rows(self.units, rows, ["u:state", "u:lease", "u:home", "u:born"])
        return [(row, found[row]) for row in rows if found[row].get("u:state") == b"P"]

    def collect_garbage(self, now_ms: int | None = None) -> int:
        """The garbage collector: forget every file that has not grown for
        *forget_after* and whose every byte is committed (no unit pending or
        quarantined, nothing refused), its units and row in one transaction, which
        leaves ``f:forgotten`` on the row; a committed unit's files are published
        first (its committer may have died before it did). Deleting an observed cell
        notifies its observer, whose run on the forgotten row acknowledges it: once
        no notification of a forgotten file's rows is pending, a later pass deletes
        those acknowledgements and ``f:forgotten``. Returns how many files it forgot.

        A pass reads the file rows kept, the pending notifications and the units of
        the files being forgotten: its cost follows the bounded state, not the
        history."""
        if self.forget_after_ms is None:
            return 0
        now = _now_ms() if now_ms is None else now_ms
        # Read first: a forgotten row's notifications, once gone, never come back
        # (nothing writes an observed cell of a forgotten row).
        notified = {(n.table, n.row) for n in pending_notifications(
            self.cluster, [self.files, self.units])}
        with Snapshot(self.cluster) as snap:
            rows = list(snap.scan(self.files, None, None, [
                "f:size", "f:cut", "f:grown", "f:since", "f:refused", "f:forgotten"]))
        forgotten = 0
        for row, cells in rows:
            if "f:forgotten" in cells and "f:size" not in cells:
                _clear_forgotten(self.cluster, self, row, notified)
            elif _forgettable(self, cells, now):
                forgotten += _forget_file(self.cluster, self, row, now)
        return forgotten

    def _acks(self, table: str) -> list[str]:
        """The acknowledgement columns of this pipeline's observers on *table*: a
        processor's of every ready column (:meth:`_every_ready_column`), which covers
        every site's processors (one name, a ready column of their own each)."""
        return sorted({ack_column(o.name, column) for o in self.observers()
                       if o.table == table
                       for column in (self._every_ready_column()
                                      if isinstance(o, _Processor) else [o.column])})

    def _every_ready_column(self) -> list[str]:
        """Every ready column a unit of this pipeline may hold, whatever the site ETA
        was when the unit was made (a pipeline given one, or rid of it, since)."""
        return ["u:ready", *(f"u:ready.{s}" for s in self.sites)]

    def _unnotified(self, rows: list[bytes]) -> list[bytes]:
        """Those of *rows* with no pending ``u:ready`` notification (of any site). Read after the
        snapshot that found them unleased: a unit leased since then may be among them,
        and re-notifying it costs a run that finds the lease and does nothing."""
        if not rows:
            return []
        notified = {n.row for n in pending_notifications(self.cluster, [self.units])
                    if n.column.startswith("u:ready")}
        return [row for row in rows if row not in notified]

    # --- operations ---------------------------------------------------------------------

    def coverage(self) -> dict[str, list[str]]:
        """Per file, what is wrong with its coverage: committed and quarantined ranges
        must partition ``[0, f:size)`` exactly (with units still pending or leased
        reported as such). Empty lists: all is well."""
        with Snapshot(self.cluster) as snap:
            files = {row.decode(): cells for row, cells in snap.scan(
                self.files, None, None, ["f:size", "f:cut", "f:refused"])}
            rows = list(snap.scan(self.units, None, None, ["u:range", "u:state", "u:unit"]))
        states = {row: cells["u:state"] for row, cells in rows if "u:state" in cells}
        ranges: dict[str, list[tuple[int, int, bytes, bytes]]] = {}
        for row, cells in rows:
            name, begin = parse_unit_row(row)
            unit = cells.get("u:unit", row)  # a further part of a unit of several files
            ranges.setdefault(name, []).append(
                (begin, int(cells["u:range"]), _unit_state(states, unit, row), unit))
        stranded = set(self.stranded())
        report: dict[str, list[str]] = {}
        for name, cells in files.items():
            problems = []
            size, cut = int(cells.get("f:size", b"0")), int(cells.get("f:cut", b"0"))
            done = sorted((b, e) for b, e, s, _ in ranges.get(name, []) if s in (b"C", b"Q"))
            waiting = [unit for _, _, s, unit in ranges.get(name, []) if s == b"P"]
            lost = sum(1 for unit in waiting if unit in stranded)
            at = 0
            for begin, end in done:
                if begin != at:
                    problems.append(f"{'gap' if begin > at else 'overlap'} at {min(at, begin)}")
                at = max(at, end)
            if waiting:
                problems.append(f"{len(waiting)} unit(s) pending" + (
                    f", {lost} with neither a lease nor a notification" if lost else ""))
            elif at != size or cut != size:
                problems.append(f"covered up to {at}, cut at {cut}, tracked {size}")
            report[name] = problems
        return report

    def verify(self) -> CoverageReport:
        """:meth:`coverage` as the recipes' report: a problem per file not exactly
        covered."""
        files = self.coverage()
        return CoverageReport(
            [f"{name}: " + "; ".join(found) for name, found in sorted(files.items()) if found],
            files,
        )

    def quarantined(self) -> list[tuple[str, int, int, str]]:
        """``(file, begin, end, error)`` of every quarantined range."""
        found = []
        with Snapshot(self.cluster) as snap:
            for row, cells in snap.scan(self.quarantine, None, None, ["x:end", "x:error"]):
                name, begin = parse_unit_row(row)
                found.append((name, begin, int(cells["x:end"]), cells["x:error"].decode()))
        return found

    def retry_range(self, name: str, begin: int) -> None:
        """Put the quarantined range of *name* starting at *begin* back to work."""
        _retry(self.cluster, self, unit_row(name, begin))

    def __repr__(self) -> str:
        return f"<ubiq.LogPipeline {self.name} on {self.cluster.url}>"


def _lease(raw: bytes) -> tuple[str, int]:
    value = json.loads(raw)
    return str(value["owner"]), int(value["expires"])


def _unit_state(states: dict[bytes, bytes], unit: bytes, row: bytes) -> bytes:
    """The state of *unit*, the unit of the part in *row*: a part whose unit row is
    gone belongs to a file the garbage collector forgot, which it does only once
    the unit has committed."""
    return states.get(unit, b"C" if unit != row else b"?")


def _pending_for(cells: dict[str, bytes], owner: str) -> bool:
    """Whether the unit (its ``u:state`` and ``u:lease`` cells) is pending and leased
    to *owner*."""
    return cells.get("u:state") == b"P" and "u:lease" in cells and (
        _lease(cells["u:lease"])[0] == owner)


# --- transactions ---------------------------------------------------------------------


@transactional
def _report(txn: TransactionBase, p: LogPipeline, name: str, site: str, size: int,
            head: bytes, now: int, modified: int) -> bool:
    row = name.encode()
    cells = txn.get_row(p.files, row,
                        [f"f:site.{site}", "f:size", "f:head", "f:since", "f:refused"])
    if "f:refused" in cells:
        return False
    # The clock is read after this transaction's snapshot: a collector that forgot the
    # file committed before it, having seen it quiet for forget_after then, so the
    # file (modified no later than it last grew) is at least that old now.
    if "f:size" not in cells and p.forget_after_ms is not None and (
            _now_ms() - modified >= p.forget_after_ms):
        return False  # too old to follow (or forgotten): never tracked anew
    seen = int(cells.get(f"f:site.{site}", b"0"))
    why = refusal(seen, size, cells.get("f:head"), head)
    if why:
        why = f"site {site}: {why}"
        log.error("ubiq %s: refusing %s: %s", p.name, name, why)
        txn.set(p.files, row, "f:refused", why.encode())
        return False
    if size <= seen and "f:size" in cells:
        return False
    txn.set(p.files, row, f"f:site.{site}", b"%d" % size)
    txn.set(p.files, row, "f:grown", b"%d" % max(now, modified))  # never before its mtime
    if size >= HEAD_BYTES or "f:head" not in cells:
        txn.set(p.files, row, "f:head", head)
    if size > int(cells.get("f:size", b"0")) or "f:size" not in cells:
        txn.set(p.files, row, "f:size", b"%d" % size)
        if "f:since" not in cells:  # the first byte not yet in a unit: its wait starts
            txn.set(p.files, row, "f:since", b"%d" % now)
    return True


def _forgettable(p: LogPipeline, cells: dict[str, bytes], now: int) -> bool:
    """Whether a file row (its ``f:`` cells) is cut to its end, refused nothing, and
    has not grown for forget_after."""
    return (p.forget_after_ms is not None and "f:refused" not in cells
            and "f:since" not in cells and "f:grown" in cells
            and cells.get("f:cut") == cells.get("f:size")
            and now - int(cells["f:grown"]) >= p.forget_after_ms)


_FILE_COLUMNS = ("f:size", "f:head", "f:since", "f:cut", "f:grown", "f:refused")
_UNIT_COLUMNS = ("u:range", "u:state", "u:lease", "u:fail", "u:commit", "u:home", "u:born",
                 "u:parts", "u:unit")


@transactional
def _forget_file(txn: TransactionBase, p: LogPipeline, row: bytes, now: int) -> bool:
    """Delete the file in *row* and all its units if it is still forgettable and
    every unit is committed, their ranges partitioning the file: the check and the
    deletion in one transaction, so a tracker's report or a unit's state change
    conflicts with it."""
    cells = txn.get_row(p.files, row, ["f:size", "f:cut", "f:grown", "f:since", "f:refused"])
    if not _forgettable(p, cells, now):
        return False
    ready = p._every_ready_column()
    units = _units_of(txn, p, row.decode(),
                      ["u:range", "u:state", "u:unit", "u:commit", *ready])
    at = 0
    for unit, unit_cells in units:
        state = unit_cells.get("u:state")
        if "u:unit" in unit_cells:  # a part of a unit that spans files: its unit's state
            owner = unit_cells["u:unit"]
            found = txn.get(p.units, owner, "u:state")
            state = _unit_state({} if found is None else {owner: found}, owner, unit)
        if state != b"C" or parse_unit_row(unit)[1] != at:
            return False  # pending, quarantined or not a partition: an operator's case
        at = int(unit_cells["u:range"])
    if at != int(cells["f:size"]):
        return False
    for unit, unit_cells in units:
        if "u:commit" in unit_cells:
            committed = json.loads(unit_cells["u:commit"])
            publish(p, unit, committed["attempt"], committed["files"])
        # Only the observed cells there: deleting one notifies its site's processors.
        for column in (*_UNIT_COLUMNS, *(c for c in ready if c in unit_cells)):
            txn.delete(p.units, unit, column)
    for column in (*_FILE_COLUMNS, *(f"f:site.{s}" for s in p.sites)):
        txn.delete(p.files, row, column)
    txn.set(p.files, row, "f:forgotten", b"%d" % now)
    return True


def _units_of(txn: TransactionBase, p: LogPipeline, name: str, columns: list[str]
              ) -> list[tuple[bytes, dict[str, bytes]]]:
    prefix = unit_row(name, 0)[:-8]
    return list(txn.scan(p.units, prefix, prefix[:-1] + b"\x01", columns))


@transactional
def _clear_forgotten(txn: TransactionBase, p: LogPipeline, row: bytes,
                     notified: set[tuple[str, bytes]]) -> bool:
    """Delete the acknowledgements left on the forgotten file in *row* and its
    units, and its ``f:forgotten``, unless a notification of one of them (in
    *notified*) is pending: its observer's run is still to acknowledge it."""
    internal_columns(txn, True)  # the acknowledgements
    file_acks, unit_acks = p._acks(p.files), p._acks(p.units)
    units = _units_of(txn, p, row.decode(), ["u:state", *unit_acks])
    if (p.files, row) in notified or any((p.units, unit) in notified for unit, _ in units):
        return False
    for unit, cells in units:
        if "u:state" in cells:
            return False  # cut anew: not a forgotten file's (never, while tracked)
        for ack in cells:
            txn.delete(p.units, unit, ack)
    for ack in file_acks:
        txn.delete(p.files, row, ack)
    txn.delete(p.files, row, "f:forgotten")
    return True


@transactional
def _index_pending(txn: TransactionBase, p: LogPipeline, rows: list[bytes]) -> None:
    """Fill the pending-units index for those of *rows* still pending (a unit that
    changes state meanwhile conflicts on its index cell)."""
    for row, cells in txn.get_rows(p.units, rows, ["u:state"]).items():
        if cells.get("u:state") == b"P":
            txn.set(p.pending, row, "p:u", b"1")


@transactional
def _nudge(txn: TransactionBase, p: LogPipeline, name: str) -> None:
    txn.notify(p.files, name.encode(), "f:size")


_PACK_ROW, _PACK_COLUMN = b"tails", "k:due"
"""The packer's row (in ``ubiq.<p>.packer``) and observed column."""


@transactional
def _nudge_packer(txn: TransactionBase, p: LogPipeline) -> None:
    txn.notify(p.packer, _PACK_ROW, _PACK_COLUMN)


def _record_boundary(p: LogPipeline, name: str, at: int, limit: int) -> int:
    """The offset after the first newline at or after *at* (at most *limit*)."""
    for directory in p.sites.values():
        path = directory / name
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
            if path.stat().st_size < limit:
                continue
            f.seek(at)
            pos = at
            while pos < limit:
                chunk = f.read(min(65536, limit - pos))
                found = chunk.find(b"\n")
                if found >= 0:
                    return pos + found + 1
                pos += len(chunk)
            return limit
    return limit


Part = tuple[str, int, int]
"""A unit's range of one file: ``(file, begin, end)``."""


def _cut_columns(p: LogPipeline) -> list[str]:
    return ["f:size", "f:cut", "f:since", "f:refused", *(f"f:site.{s}" for s in p.sites)]


def cut_file(txn: TransactionBase, p: LogPipeline, name: str, now: int) -> int:
    """The cutter's body: cut ``[f:cut, f:size)`` of *name* into units at record
    boundaries. A short tail due to be cut is cut alone, or, with *pack_files*, left
    to the packer (:func:`pack_tails`), which this wakes. Returns how many units it
    made."""
    row = name.encode()
    cells = txn.get_row(p.files, row, _cut_columns(p))
    size, cut = int(cells.get("f:size", b"0")), int(cells.get("f:cut", b"0"))
    if "f:refused" in cells or cut >= size:
        return 0
    # A tail shorter than a unit waits for more bytes, but no byte waits longer than
    # max_unit_delay from when it was first reported (Ubiq's bundling bound).
    quiet = now - int(cells.get("f:since", b"0")) >= p.max_unit_delay_ms
    made = 0
    while cut < size:
        if size - cut < p.unit_bytes and not quiet:
            break  # a young tail waits to grow into a unit (or for max_unit_delay)
        if size - cut < p.unit_bytes and p.pack_files:
            # Packed from one place: every file's cutter packing all the tails it
            # sees would conflict with every other (they pack the same oldest ones)
            # and each retry would read every file row again.
            _nudge_packer(txn, p)
            break
        end = size if size - cut <= p.unit_bytes else _record_boundary(
            p, name, cut + p.unit_bytes - 1, size)
        holding = [s for s in p.sites if int(cells.get(f"f:site.{s}", b"0")) >= end]
        _new_unit(txn, p, [(name, cut, end)], _home(name, cut, holding or list(p.sites)), now)
        cut, made = end, made + 1
    if made:
        txn.set(p.files, row, "f:cut", b"%d" % cut)
        if cut >= size:
            txn.delete(p.files, row, "f:since")
    return made


def pack_tails(txn: TransactionBase, p: LogPipeline, now: int) -> int:
    """The packer's body: cut the files' short tails (shorter than a unit) into units
    of several files, as Ubiq's work-unit creator does, so that many small files make
    few units: the tails, oldest first (by ``f:since``, when their oldest uncut byte
    was reported), are packed whole into units of up to *unit_bytes*, and the units up
    to the one holding the newest tail due (``max_unit_delay`` old) are cut; younger
    tails in that last unit go with it. Each cut file's ``f:cut`` is written: a cutter
    of that file conflicts with this. Reads every file row once (the garbage
    collector bounds them). Returns how many units it made."""
    waiting = []
    for row, found in txn.scan(p.files, None, None, _cut_columns(p)):
        size, at = int(found.get("f:size", b"0")), int(found.get("f:cut", b"0"))
        if "f:refused" not in found and 0 < size - at < p.unit_bytes:
            waiting.append((int(found.get("f:since", b"0")), row.decode(), at, size, found))
    waiting.sort(key=lambda w: w[:2])
    due = sum(1 for since, *_ in waiting if now - since >= p.max_unit_delay_ms)
    groups: list[list[tuple[str, int, int, dict[str, bytes]]]] = []
    room = 0
    for i, (_, file, cut, size, cells) in enumerate(waiting):
        if size - cut > room:
            if i >= due:
                break  # this unit would hold no tail that is due: it waits
            groups.append([])
            room = p.unit_bytes
        groups[-1].append((file, cut, size, cells))
        room -= size - cut
    for group in groups:
        holding = [s for s in p.sites if all(
            int(cells.get(f"f:site.{s}", b"0")) >= end for _, _, end, cells in group)]
        first, begin = group[0][:2]
        _new_unit(txn, p, [(file, cut, end) for file, cut, end, _ in group],
                  _home(first, begin, holding or list(p.sites)), now)
        for file, _, end, _ in group:
            txn.set(p.files, file.encode(), "f:cut", b"%d" % end)
            txn.delete(p.files, file.encode(), "f:since")
    return len(groups)


def _parts(row: bytes, cells: dict[str, bytes]) -> list[Part]:
    """The ranges of the unit in *row* (its ``u:range`` and ``u:parts`` cells): a unit
    without ``u:parts`` (every unit cut before units could span files) has one."""
    if "u:parts" in cells:
        return [(str(f), int(b), int(e)) for f, b, e in json.loads(cells["u:parts"])]
    name, begin = parse_unit_row(row)
    return [(name, begin, int(cells["u:range"]))]


def _home(name: str, begin: int, sites: list[str]) -> str:
    """The site a unit is given to: spread over *sites* (those holding its bytes)."""
    return sites[zlib.crc32(unit_row(name, begin)) % len(sites)]


def _new_unit(txn: TransactionBase, p: LogPipeline, parts: list[Part], home: str,
              born: int) -> None:
    """A pending unit of *parts*, given to *home* (cut at *born*, ms): its workers
    are notified. Its row is its first part's; each further part has a row of its
    own too (``u:range``, and ``u:unit``, the unit's row), so that a file's rows
    still partition it (coverage, garbage collection)."""
    name, begin, end = parts[0]
    row = unit_row(name, begin)
    txn.set(p.units, row, "u:range", b"%d" % end)
    if len(parts) > 1:
        txn.set(p.units, row, "u:parts", json.dumps(parts).encode())
        for other, other_begin, other_end in parts[1:]:
            part_row = unit_row(other, other_begin)
            txn.set(p.units, part_row, "u:range", b"%d" % other_end)
            txn.set(p.units, part_row, "u:unit", row)
    txn.set(p.units, row, "u:state", b"P")
    txn.set(p.pending, row, "p:u", b"1")
    if p.site_eta_ms is not None:
        txn.set(p.units, row, "u:home", home.encode())
        txn.set(p.units, row, "u:born", b"%d" % born)
    for column in p.ready_columns(home):
        txn.set(p.units, row, column, b"1")


def _lease_unit(txn: TransactionBase, p: LogPipeline, row: bytes, owner: str, now: int,
                *, renew: bool) -> list[Part] | None:
    """Lease the unit in *row* for *owner* in *txn*: its parts when taken, None
    when it is not pending, or leased by a live owner whose lease has not expired
    (*renew*: *owner*'s own lease is taken again)."""
    cells = txn.get_row(p.units, row, ["u:range", "u:parts", "u:state", "u:lease"])
    if cells.get("u:state") != b"P":
        return None
    if "u:lease" in cells:
        holder, expires = _lease(cells["u:lease"])
        if (holder != owner or not renew) and expires > now and \
                internals(p.cluster).coordination.is_alive(holder) is not False:
            return None
    txn.set(p.units, row, "u:lease", json.dumps(
        {"owner": owner, "expires": now + p.local_eta_ms}).encode())
    return _parts(row, cells)


@transactional
def _take_lease(txn: TransactionBase, p: LogPipeline, row: bytes, owner: str,
                now: int) -> list[Part] | None:
    """:func:`_lease_unit` in a transaction of its own, renewing *owner*'s lease."""
    return _lease_unit(txn, p, row, owner, now, renew=True)


@transactional
def _renotify(txn: TransactionBase, p: LogPipeline, due: list[tuple[bytes, list[str]]]) -> None:
    """Notify each unit's *columns* (its site's workers, or every site's), if it is
    still pending: the sweep found *due* in an earlier snapshot (a pass reads every
    pending unit, seconds with many), and a unit committed since, its file forgotten
    and cleared, would get a processor run whose acknowledgement nothing deletes."""
    pending = txn.get_rows(p.units, [row for row, _ in due], ["u:state"])
    for row, columns in due:
        if pending[row].get("u:state") == b"P":
            for column in columns:
                txn.notify(p.units, row, column)


def _notify_home(txn: TransactionBase, p: LogPipeline, row: bytes) -> None:
    home = txn.get(p.units, row, "u:home") if p.site_eta_ms is not None else None
    for column in p.ready_columns(home.decode() if home else None):
        txn.notify(p.units, row, column)


@transactional
def _fail(txn: TransactionBase, p: LogPipeline, row: bytes, owner: str, error: str) -> None:
    """Count a failed attempt; past MAX_FAILURES, split the unit (or quarantine a
    single record)."""
    cells = txn.get_row(p.units, row, ["u:range", "u:parts", "u:state", "u:lease", "u:fail",
                                       "u:home", "u:born"])
    if not _pending_for(cells, owner):
        return
    failures = int(cells.get("u:fail", b"0")) + 1
    txn.delete(p.units, row, "u:lease")
    if failures < MAX_FAILURES:
        txn.set(p.units, row, "u:fail", b"%d" % failures)
        _notify_home(txn, p, row)
        return
    name, begin = parse_unit_row(row)
    home = cells.get("u:home", b"").decode() or _home(name, begin, list(p.sites))
    born = int(cells.get("u:born", b"%d" % _now_ms()))
    parts = _parts(row, cells)
    if len(parts) > 1:
        # Packed files are split between files first: two units of half the parts
        # each (the second's first part row becomes its unit row), then a one-file
        # unit splits by bytes as below.
        first, second = parts[:len(parts) // 2], parts[len(parts) // 2:]
        if len(first) == 1:
            txn.delete(p.units, row, "u:parts")
        txn.delete(p.units, unit_row(*second[0][:2]), "u:unit")
        _new_unit(txn, p, first, home, born)
        _new_unit(txn, p, second, home, born)
        txn.delete(p.units, row, "u:fail")
        return
    end = int(cells["u:range"])
    middle = _record_boundary(p, name, begin + (end - begin) // 2, end)
    if middle >= end:  # one record: nothing left to split off
        middle = _record_boundary(p, name, begin, end)
    if middle >= end:
        txn.set(p.units, row, "u:state", b"Q")
        txn.delete(p.pending, row, "p:u")
        txn.set(p.quarantine, row, "x:end", b"%d" % end)
        txn.set(p.quarantine, row, "x:error", error.encode()[:2000])
        log.error("ubiq %s: quarantined %s [%d, %d): %s", p.name, name, begin, end, error)
        return
    # Two pieces that partition the unit, in this one transaction: the first keeps the
    # row (it starts where the unit did), the second is a new unit.
    # The pieces stay with the unit's site and keep its age (its site's time runs on).
    _new_unit(txn, p, [(name, begin, middle)], home, born)
    _new_unit(txn, p, [(name, middle, end)], home, born)
    txn.delete(p.units, row, "u:fail")


@transactional
def _retry(txn: TransactionBase, p: LogPipeline, row: bytes) -> None:
    if txn.get(p.units, row, "u:state") != b"Q":
        raise InvalidArgument(f"no quarantined range at {parse_unit_row(row)}")
    txn.delete(p.quarantine, row, "x:end")
    txn.delete(p.quarantine, row, "x:error")
    txn.set(p.units, row, "u:state", b"P")
    txn.set(p.pending, row, "p:u", b"1")
    txn.delete(p.units, row, "u:fail")
    _notify_home(txn, p, row)


def process_unit(p: LogPipeline, site: str, row: bytes, owner: str) -> bool:
    """Lease, process and commit the unit in *row*; returns whether this call
    committed it. Its output (table writes and published files) exists if and only if
    the commit does."""
    taken = _take_lease(p.cluster, p, row, owner, _now_ms())
    if taken is None:
        return False
    pieces = [WorkUnit(name, begin, end, *_replica(p, site, name, end))
              for name, begin, end in taken]
    first = pieces[0]
    unit = WorkUnit(first.file, first.begin, first.end, first.path, first.site,
                    pieces if len(pieces) > 1 else [])
    attempt = uuid.uuid4().hex[:12]
    staging = p.staging / row.hex() / attempt
    txn = Transaction(p.cluster)
    out = Output(txn, staging)
    try:
        p.app.process(unit, out)
    except Exception as e:  # the app's failure: count it, split after MAX_FAILURES
        txn.rollback()
        _discard(staging)
        _fail(p.cluster, p, row, owner, f"{type(e).__name__}: {e}")
        return False
    try:
        if not finish_unit(txn, p, row, owner, attempt, out.files):
            txn.rollback()
            _discard(staging)
            return False
        txn.commit()
    except ConflictError:  # a newer lease, or another committer: this attempt lost
        _discard(staging)
        return False
    publish(p, row, attempt, out.files)
    if p.on_commit is not None:
        try:
            p.on_commit(unit)
        except Exception:
            log.exception("ubiq %s: on_commit failed", p.name)
    return True


def finish_unit(txn: TransactionBase, p: LogPipeline, row: bytes, owner: str, attempt: str,
                files: list[str]) -> bool:
    """Mark the unit committed in *txn*, which holds the application's output, if it is
    still pending and leased by *owner*; False (write nothing) if not."""
    cells = txn.get_row(p.units, row, ["u:state", "u:lease"])
    if not _pending_for(cells, owner):
        return False
    txn.set(p.units, row, "u:state", b"C")
    txn.delete(p.pending, row, "p:u")
    txn.delete(p.units, row, "u:lease")
    txn.delete(p.units, row, "u:fail")
    txn.set(p.units, row, "u:commit", json.dumps(
        {"attempt": attempt, "files": files, "owner": owner}).encode())
    return True


def _replica(p: LogPipeline, site: str, name: str, end: int) -> tuple[Path, str]:
    """The copy of *name* to read up to *end*: the worker's own site's, unless that
    replica lags behind (then the first site that has the bytes). A lagging replica
    must not make a unit fail: failures split units and quarantine records."""
    for candidate in (site, *(s for s in p.sites if s != site)):
        path = p.sites[candidate] / name
        with contextlib.suppress(OSError):
            if path.stat().st_size >= end:
                return path, candidate
    return p.sites[site] / name, site  # none has the bytes: reading fails and is counted


def _discard(staging: Path) -> None:
    if staging.exists():
        for item in staging.iterdir():
            item.unlink()
        staging.rmdir()


def publish(p: LogPipeline, row: bytes, attempt: str, files: list[str]) -> None:
    """Publish the committed attempt's staged files under their final names (atomic
    renames; a file already published is left alone)."""
    staging = p.staging / row.hex() / attempt
    name, begin = parse_unit_row(row)
    for file in files:
        final = p.sink / f"{name}@{begin}.{file}"
        staged = staging / file
        if not final.exists() and staged.exists():
            os.replace(staged, final)
    with contextlib.suppress(OSError):
        _discard(staging)
        staging.parent.rmdir()


class _Cutter(Observer):
    def __init__(self, p: LogPipeline) -> None:
        self.pipeline = p
        self.table, self.column = p.files, "f:size"
        self.name = f"ubiq.{p.name}.cutter"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        cut_file(txn, self.pipeline, row.decode(), _now_ms())


class _Packer(Observer):
    """Packs the due short tails of every file (:func:`pack_tails`), woken by the
    cutters and the trackers: one notified row, so one run at a time in the cluster
    (the scanners' advisory lock) and many wake-ups make one run."""

    def __init__(self, p: LogPipeline) -> None:
        self.pipeline = p
        self.table, self.column = p.packer, _PACK_COLUMN
        self.name = f"ubiq.{p.name}.packer"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        pack_tails(txn, self.pipeline, _now_ms())


class _Processor(Observer):
    """Leases each ready unit and hands it to a processing thread: the scanner's
    advisory lock on the row must not outlive the notification, or a live but stuck
    process would keep every other worker off the unit; the lease (with its expiry)
    is what guards the unit while it is processed.

    The lease is written in this run's transaction, which is also the one that
    acknowledges the notification: were it taken later (by the thread), a process
    dying, or a lease transaction failing, between the two would leave a pending
    unit with neither, which nothing wakes again. The thread then takes the lease
    anew in a transaction of its own (the acknowledgement may still be committing):
    it conflicts with this run's commit, and whichever loses sees the other's lease,
    the same owner's."""

    def __init__(self, p: LogPipeline, site: str, parallel: int = 2) -> None:
        self.pipeline, self.site = p, site
        self.table, self.column = p.units, p.ready_columns(site)[0]
        self.name = f"ubiq.{p.name}.processor"
        self._slots = threading.BoundedSemaphore(parallel)

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        self._slots.acquire()  # back-pressure: at most *parallel* units in flight
        try:
            owner = internals(self.pipeline.cluster).coordination.current_owner()
            # Not renewing our own live lease: a thread of this process holds the unit
            # (this is a rerun after a conflict with its lease, or a stray wake-up).
            taken = _lease_unit(txn, self.pipeline, row, owner, _now_ms(), renew=False)
        except BaseException:
            self._slots.release()
            raise
        if taken is None:  # committed, quarantined or split, or leased by a live owner
            self._slots.release()
            return
        self._start(row, owner)

    def _start(self, row: bytes, owner: str) -> None:
        threading.Thread(target=self._run, args=(row, owner), daemon=True,
                         name=f"ubiq-unit-{row[:40]!r}").start()

    def _run(self, row: bytes, owner: str) -> None:
        try:
            process_unit(self.pipeline, self.site, row, owner)
        except Exception:  # its lease expires and the sweep hands the unit on
            log.exception("ubiq %s: processing %r failed", self.pipeline.name, row)
        finally:
            self._slots.release()


class _Dispatcher(Observer):
    """Publishes a committed unit's files if its committer died before it did."""

    def __init__(self, p: LogPipeline) -> None:
        self.pipeline = p
        self.table, self.column = p.units, "u:commit"
        self.name = f"ubiq.{p.name}.dispatcher"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        raw = txn.get(self.pipeline.units, row, "u:commit")
        if raw is not None:
            committed = json.loads(raw)
            publish(self.pipeline, row, committed["attempt"], committed["files"])
