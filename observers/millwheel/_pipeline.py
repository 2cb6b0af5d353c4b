"""A MillWheel pipeline on Percolator tables: topology, the key run, injectors, the
low-watermark advancer.

Tables of pipeline ``<p>`` (per computation ``<C>``):

* ``mw.<p>.<C>``, row = key: ``in:<record id>`` one pending input record,
  ``k:wake`` (notify-only, observed by the key run), ``s:<name>`` state, ``t:<tag>``
  armed timers, ``m:late`` late records seen;
* ``mw.<p>.pending``: one row ``<C> NUL be64(ts) be16(len key) key id`` per pending
  record of computation ``<C>``;
* ``mw.<p>.timers``: one row ``<C> NUL be64(time) be16(len key) key tag`` per armed timer
  (one table each per pipeline, not per computation: Bigtable table ids are short);
* ``mw.<p>.meta``: ``wm/<C>`` (``w:in``, ``w:low``), ``inj/<name>`` (``c:pos``,
  ``w:low``), ``sub/<stream>`` (``c:<C>`` per subscribed computation: the topology);
* ``mw.<p>.held``: records for a subscriber the delivering process has no code for,
  row ``<C> NUL be64(ts) be16(len stream) stream id``, ``h:rec`` the record (``h:key``
  the producer's explicit key), until a process that runs ``<C>`` moves them into its
  rows;
* ``mw.<p>.out``: records produced on streams nobody subscribes to (the pipeline's
  output), row ``<stream>/<record id>``.

**One transaction per key run** consumes the key's pending records (deleting each
``in:`` cell is the acknowledgement), updates its state, fires and arms its timers and
writes the records it produces into the subscribers' rows: all of it commits or none
does, so internal edges need no record-id deduplication, and two runs of one key
conflict on the cells they both delete (per-key serialisation, zombie fencing).
Injectors commit their source position with the records they inject.

**The subscriptions are stored** (``sub/<stream>``), and every delivering transaction
reads them in its own snapshot, so the topology can grow while processes run: a
production goes to the subscribers its transaction sees, and a computation added by
:meth:`Pipeline.create` receives exactly the records whose producing transaction
started after the subscription committed (docs/millwheel.md, "Adding a computation").

**The low watermark** of a computation is computed in one transaction, so from one
consistent snapshot: ``w:in = max(old, min over inputs of the producers' w:low)`` and
``w:low = max(old, min(w:in, oldest pending record, oldest armed timer))``. It is a
true lower bound because (i) a record or timer leaves its index in the very
transaction that consumes it, (ii) a record produced while handling an input of time
*t* has a timestamp >= *t*, or it is marked late, and (iii) sources' watermarks are
honest (a record below its source's previous watermark is marked late). docs/millwheel.md
has the induction.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from observers import Observer, Periodic, VerifyReport
from observers._recipes import bind, check_pipeline
from observers.millwheel._model import (
    END_OF_TIME,
    Computation,
    Context,
    KeyExtractor,
    Record,
    Source,
    Timer,
)
from percolator import Cluster, InvalidArgument, Snapshot, TransactionBase, transactional

__all__ = ["MAX_RECORDS_PER_RUN", "Pipeline", "Status"]

log = logging.getLogger(__name__)

MAX_RECORDS_PER_RUN = 500
"""Most pending records of one key a key run handles; the rest wait for the next run,
and a run that stopped there fires no timer (its window may not be complete)."""
INJECT_BATCH = 500
WAKE = "k:wake"
LATE = "m:late"
_TS = struct.Struct(">Q")
_LEN = struct.Struct(">H")
_HEAD = struct.Struct(">QBH")  # timestamp, late flag, length of the stream name


def _index_row(node: _Node, time_ms: int, key: bytes, suffix: bytes) -> bytes:
    return _prefixed_row(node.prefix, time_ms, key, suffix)


def _prefixed_row(prefix: bytes, time_ms: int, key: bytes, suffix: bytes) -> bytes:
    return (prefix + _TS.pack(max(0, min(time_ms, END_OF_TIME))) + _LEN.pack(len(key))
            + key + suffix)


def _parse_index_row(node: _Node, row: bytes) -> tuple[int, bytes, bytes]:
    row = row[len(node.prefix):]
    (n,) = _LEN.unpack(row[8:10])
    return _TS.unpack(row[:8])[0], row[10:10 + n], row[10 + n:]


def _encode_record(stream: str, value: bytes, ts: int, late: bool) -> bytes:
    name = stream.encode()
    return _HEAD.pack(ts, int(late), len(name)) + name + value


def _decode_record(raw: bytes, key: bytes, record_id: str) -> Record:
    ts, late, n = _HEAD.unpack(raw[:_HEAD.size])
    stream = raw[_HEAD.size:_HEAD.size + n].decode()
    return Record(raw[_HEAD.size + n:], ts, key, record_id, stream, bool(late))


@dataclass(frozen=True)
class _Injector:
    name: str
    source: Source
    stream: str


@dataclass(frozen=True)
class _Node:
    computation: Computation
    inputs: dict[str, KeyExtractor]
    table: str
    pending: str
    """The pipeline's pending-record index; this computation's rows start with prefix."""
    timers: str
    prefix: bytes

    def index_range(self, stop_ms: int | None = None) -> tuple[bytes, bytes]:
        """Row range of this computation's index rows (below *stop_ms* when given)."""
        stop = (self.prefix + _TS.pack(stop_ms) if stop_ms is not None
                else self.prefix[:-1] + b"\x01")
        return self.prefix, stop


@dataclass
class Status:
    """A computation's progress (``python -m observers.millwheel status``); *pending*
    counts its held records too."""

    name: str
    input_watermark: int
    low_watermark: int
    pending: int
    timers: int
    late: int


class Pipeline:
    """Keyed computations connected by streams, fed by injectors (MillWheel, seed 004)::

        from observers import Worker, millwheel as mw

        class Windower(mw.Computation):      # counts per minute (docs/millwheel.md)
            outputs = ("windows",)
            ...

        pairs = [(b"shoes", 1_000), (b"hats", 20_000)]   # (value, event time in ms)
        zeitgeist = mw.Pipeline(cluster, "zeitgeist")
        zeitgeist.injector("queries", mw.IterableSource(pairs), stream="queries")
        zeitgeist.computation(Windower(), inputs={"queries": lambda r: r.value})
        zeitgeist.create()
        Worker(cluster, zeitgeist.observers(), tasks=zeitgeist.tasks()).run()

    Records on a stream that no computation subscribes to are the pipeline's output
    (:meth:`output`). *interval* is how often injectors and the watermark advancer run;
    *inject_batch* how many records an injector commits at most per transaction.
    """

    def __init__(self, cluster: Cluster, name: str, *, interval: float = 0.1,
                 inject_batch: int = INJECT_BATCH) -> None:
        check_pipeline("Pipeline", cluster, name)
        self.cluster = cluster
        self.name = name
        self.interval = interval
        self.inject_batch = inject_batch
        self.meta = f"mw.{name}.meta"
        self.out = f"mw.{name}.out"
        self.pending = f"mw.{name}.pending"
        self.timers = f"mw.{name}.timers"
        self.held = f"mw.{name}.held"
        self.injectors: dict[str, _Injector] = {}
        self.nodes: dict[str, _Node] = {}
        self.subscribers: dict[str, list[_Node]] = {}

    # --- topology ---------------------------------------------------------------------

    def injector(self, name: str, source: Source, *, stream: str) -> None:
        """Feed *stream* from *source*, committing its position with what it injects."""
        _check_name("injector", name)
        _check_name("stream", stream)
        if not isinstance(source, Source):
            raise InvalidArgument(f"source must have read(position, limit), got {source!r:.80}")
        if name in self.injectors:
            raise InvalidArgument(f"injector {name!r} is defined twice")
        self.injectors[name] = _Injector(name, source, stream)

    def computation(self, computation: Computation,
                    inputs: dict[str, Callable[[Record], bytes]]) -> None:
        """Run *computation* on the records of the streams in *inputs*, each keyed by
        its extractor (``record -> key bytes``)."""
        if not isinstance(computation, Computation):
            raise InvalidArgument(f"computation must be a millwheel.Computation, "
                                  f"got {computation!r:.80}")
        name = computation.name
        _check_name("computation", name)
        if name in self.nodes:
            raise InvalidArgument(f"computation {name!r} is added twice")
        if not inputs or not all(callable(f) for f in inputs.values()):
            raise InvalidArgument(f"{name}: inputs must map stream names to key extractors")
        for stream in [*inputs, *computation.outputs]:
            _check_name("stream", stream)
        node = _Node(computation, dict(inputs), f"mw.{self.name}.{name}", self.pending,
                     self.timers, name.encode() + b"\0")
        self.nodes[name] = node
        for stream in inputs:
            self.subscribers.setdefault(stream, []).append(node)

    def _producers(self, stream: str) -> list[str]:
        """Meta rows of what produces *stream* (injectors and computations)."""
        found = [f"inj/{i.name}" for i in self.injectors.values() if i.stream == stream]
        return found + [f"wm/{n}" for n, node in self.nodes.items()
                        if stream in node.computation.outputs]

    def order(self) -> list[str]:
        """The computations in topological order.

        :raises InvalidArgument: the graph has a cycle, or an input nobody produces."""
        upstream: dict[str, set[str]] = {}
        for name, node in self.nodes.items():
            ups = set()
            for stream in node.inputs:
                producers = self._producers(stream)
                if not producers:
                    raise InvalidArgument(f"{name}: nothing produces its input stream {stream!r}")
                ups |= {p[3:] for p in producers if p.startswith("wm/")}
            upstream[name] = ups
        ordered: list[str] = []
        while len(ordered) < len(upstream):
            ready = sorted(n for n, ups in upstream.items()
                           if n not in ordered and ups <= set(ordered))
            if not ready:
                cycle = sorted(set(upstream) - set(ordered))
                raise InvalidArgument(f"the pipeline's graph has a cycle through {cycle}")
            ordered += ready
        return ordered

    def create(self) -> None:
        """Create the tables, register the key runs' columns and store the
        subscriptions of this object's computations (idempotent; never removes one).

        On a running pipeline this is how a computation, or a consumer of an existing
        stream, is added: declare it with :meth:`computation` in the new processes'
        code and call this (``python -m observers.millwheel run`` does). It receives
        every record whose producing transaction starts after the subscription
        commits, and none before (docs/millwheel.md, "Adding a computation").

        :raises InvalidArgument: a cycle, or an input stream nobody produces."""
        self.order()
        for table in (self.meta, self.out, self.pending, self.timers, self.held):
            self.cluster.create_table(table)
        for node in self.nodes.values():
            self.cluster.create_table(node.table)
            self.cluster.observe(node.table, WAKE)
        # Tables first: a delivering transaction that sees the subscription writes there.
        _subscribe(self.cluster, self)

    def add_computation(self, computation: Computation,
                        inputs: dict[str, Callable[[Record], bytes]]) -> None:
        """:meth:`computation` then :meth:`create`: add *computation* to the pipeline,
        running or not, from the change onwards."""
        self.computation(computation, inputs)
        self.create()

    def subscriptions(self, snapshot: Snapshot) -> dict[str, list[str]]:
        """The stored topology: stream -> the computations subscribed to it."""
        found: dict[str, list[str]] = {}
        for row, cells in snapshot.scan(self.meta, b"sub/", b"sub0"):
            found[row[4:].decode()] = sorted(c[2:] for c in cells if c.startswith("c:"))
        return found

    def observers(self) -> list[Observer]:
        """One key-run observer per computation, for a :class:`~observers.Worker`."""
        return [_KeyRunner(self, node) for node in self.nodes.values()]

    def tasks(self) -> list[Periodic]:
        """The injectors and the watermark advancer, as periodic tasks."""
        found = [Periodic(self.cluster, f"mw.{self.name}.inject.{name}",
                          bind(self.inject, name), interval=self.interval)
                 for name in self.injectors]
        # One advancer per computation, named by it: a process of an older topology
        # holding the task would never advance (or adopt records for) a new one.
        found += [Periodic(self.cluster, f"mw.{self.name}.advance.{name}",
                           bind(self._advance_one, name), interval=self.interval)
                  for name in self.order()]
        return found

    # --- injectors and the advancer ---------------------------------------------------

    def inject(self, name: str, limit: int | None = None) -> int:
        """Inject the next records of injector *name*; returns how many."""
        if name not in self.injectors:
            raise InvalidArgument(f"no injector {name!r}")
        return _inject(self.cluster, self, self.injectors[name], limit or self.inject_batch)

    def advance(self) -> dict[str, tuple[int, int]]:
        """Advance every computation's watermarks (in topological order) and wake the
        keys whose timers are due. Returns ``{computation: (w:in, w:low)}``."""
        return {name: self._advance_one(name) for name in self.order()}

    def _advance_one(self, name: str) -> tuple[int, int]:
        return _advance(self.cluster, self, name)

    # --- reading ----------------------------------------------------------------------

    def watermarks(self, snapshot: Snapshot, computation: str) -> tuple[int, int]:
        """``(input watermark, low watermark)`` of *computation*."""
        return _read_marks(snapshot, self, f"wm/{computation}")

    def state(self, snapshot: Snapshot, computation: str, key: bytes) -> dict[str, bytes]:
        """The state cells of *key* of *computation* (names without ``s:``)."""
        node = self.nodes[computation]
        for _, cells in snapshot.scan(node.table, key, key + b"\x00"):
            return {c[2:]: v for c, v in cells.items() if c.startswith("s:")}
        return {}

    def output(self, snapshot: Snapshot, stream: str) -> Iterator[Record]:
        """The records produced on *stream*, which no computation subscribes to."""
        prefix = stream.encode() + b"/"
        for row, cells in snapshot.scan(self.out, prefix, prefix + b"\xff", ["o:rec"]):
            yield _decode_record(cells["o:rec"], b"", row[len(prefix):].decode())

    def status(self) -> list[Status]:
        """Each computation's watermarks, pending records, armed timers and late
        records, in topological order, read at one snapshot
        (``python -m observers.millwheel status``)."""
        found = []
        with Snapshot(self.cluster) as snap:
            for name in self.order():
                node = self.nodes[name]
                w_in, w_low = self.watermarks(snap, name)
                pending = sum(1 for _ in snap.scan(self.pending, *node.index_range(), ["p:x"]))
                pending += sum(1 for _ in snap.scan(self.held, *node.index_range(), ["h:rec"]))
                timers = sum(1 for _ in snap.scan(self.timers, *node.index_range(), ["t:x"]))
                late = sum(int(c[LATE]) for _, c in snap.scan(node.table, None, None, [LATE]))
                found.append(Status(name, w_in, w_low, pending, timers, late))
        return found

    def verify(self) -> VerifyReport:
        """Check over a snapshot that the pending index and the ``in:`` cells, and the
        timer index and the ``t:`` cells, match exactly; a problem per node and index
        that do not."""
        problems = []
        with Snapshot(self.cluster) as snap:
            for name, node in self.nodes.items():
                cells_in, cells_t = set(), set()
                for key, cells in snap.scan(node.table):
                    for column, value in cells.items():
                        if column.startswith("in:"):
                            ts = _TS.unpack(value[:8])[0]
                            cells_in.add(_index_row(node, ts, key, column[3:].encode()))
                        elif column.startswith("t:"):
                            cells_t.add(_index_row(node, _TS.unpack(value)[0], key,
                                                   column[2:].encode()))
                index_in = {r for r, _ in snap.scan(self.pending, *node.index_range(), ["p:x"])}
                index_t = {r for r, _ in snap.scan(self.timers, *node.index_range(), ["t:x"])}
                if cells_in != index_in:
                    problems.append(f"{name}: {len(cells_in ^ index_in)} pending record(s) "
                                    "and index rows disagree")
                if cells_t != index_t:
                    problems.append(f"{name}: {len(cells_t ^ index_t)} timer(s) and index "
                                    "rows disagree")
        return VerifyReport(problems)

    def __repr__(self) -> str:
        return f"<millwheel.Pipeline {self.name} on {self.cluster.url}>"


def _check_name(what: str, name: object) -> None:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-." for c in name):
        raise InvalidArgument(f"{what} name must be letters, digits, '_', '-' or '.', "
                              f"got {name!r}")


def _read_marks(txn: Snapshot, p: Pipeline, row: str) -> tuple[int, int]:
    cells = txn.get_row(p.meta, row.encode(), ["w:in", "w:low"])
    return int(cells.get("w:in", b"0")), int(cells.get("w:low", b"0"))


@transactional
def _subscribe(txn: TransactionBase, p: Pipeline) -> None:
    """Store the subscriptions of *p*'s computations that are not stored yet, and mark
    every stream they read or produce as known (``x:stream``): the commit of this
    transaction is the change of topology."""
    streams = {*p.subscribers, *(i.stream for i in p.injectors.values()),
               *(s for n in p.nodes.values() for s in n.computation.outputs)}
    for stream in sorted(streams):
        row = f"sub/{stream}".encode()
        nodes = p.subscribers.get(stream, [])
        wanted = ["x:stream", *(f"c:{n.computation.name}" for n in nodes)]
        stored = txn.get_row(p.meta, row, wanted)
        for column in wanted:
            if column not in stored:
                txn.set(p.meta, row, column, b"")


def _subscribed(txn: TransactionBase, p: Pipeline, stream: str) -> list[str]:
    """The computations subscribed to *stream*, read in *txn*'s snapshot: this read is
    what puts each production on one side of a change of topology. A stream with no
    row at all belongs to a pipeline created before subscriptions were stored (until
    its next ``create()``): its subscribers are this process's."""
    row = f"sub/{stream}".encode()
    for _, cells in txn.scan(p.meta, row, row + b"\x00"):
        return sorted(c[2:] for c in cells if c.startswith("c:"))
    return [node.computation.name for node in p.subscribers.get(stream, [])]


def _deliver(txn: TransactionBase, p: Pipeline, stream: str, subscribers: list[str],
             record_id: str, value: bytes, ts: int, late: bool, key: bytes | None) -> None:
    """Write one produced record into the row of every subscriber of *stream* (or the
    pipeline's output table), with its index row and a wake-up of the key; a
    subscriber this process has no code for gets it in the held table."""
    encoded = _encode_record(stream, value, ts, late)
    if not subscribers:
        txn.set(p.out, f"{stream}/{record_id}".encode(), "o:rec", encoded)
        return
    for name in subscribers:
        node = p.nodes.get(name)
        if node is None or stream not in node.inputs:
            _hold(txn, p, name, stream, record_id, ts, encoded, key)
        else:
            _deliver_to(txn, node, _target(node, stream, record_id, value, ts, late, key),
                        record_id, ts, encoded)


def _deliver_to(txn: TransactionBase, node: _Node, target: bytes, record_id: str, ts: int,
                encoded: bytes) -> None:
    txn.set(node.table, target, f"in:{record_id}", encoded)
    txn.set(node.pending, _index_row(node, ts, target, record_id.encode()), "p:x", b"")
    txn.notify(node.table, target, WAKE)


def _hold(txn: TransactionBase, p: Pipeline, name: str, stream: str, record_id: str,
          ts: int, encoded: bytes, key: bytes | None) -> None:
    """Keep a record for computation *name*, whose key extractor this process lacks,
    indexed by time like a pending record (its advancer counts it as one); *key*, the
    producer's explicit key if it gave one."""
    row = _prefixed_row(name.encode() + b"\0", ts, stream.encode(), record_id.encode())
    txn.set(p.held, row, "h:rec", encoded)
    if key is not None:
        txn.set(p.held, row, "h:key", key)


def _adopt(txn: TransactionBase, p: Pipeline, node: _Node, limit: int) -> int | None:
    """Move the oldest *limit* held records of *node* into its rows, as pending
    records. Returns the time of the oldest held record left (None: none or newer
    than those moved), which the watermark must not pass: one on a stream this
    process's version of the computation does not read stays for a process that has
    the newer code."""
    for moved, (row, cells) in enumerate(
            txn.scan(p.held, *node.index_range(), ["h:rec", "h:key"])):
        ts, stream, record_id = _parse_index_row(node, row)
        if stream.decode() not in node.inputs:
            return ts
        if moved == limit:
            break
        record = _decode_record(cells["h:rec"], b"", record_id.decode())
        target = _target(node, stream.decode(), record.id, record.value, ts, record.late,
                         cells.get("h:key"))
        _deliver_to(txn, node, target, record.id, ts, cells["h:rec"])
        txn.delete(p.held, row, "h:rec")
        if "h:key" in cells:
            txn.delete(p.held, row, "h:key")
    return None


def _target(node: _Node, stream: str, record_id: str, value: bytes, ts: int, late: bool,
            key: bytes | None) -> bytes:
    """The key of *node* a record on *stream* goes to: *key* if the producer gave one,
    else the node's extractor's."""
    target = key if key is not None else node.inputs[stream](
        Record(value, ts, b"", record_id, stream, late))
    if not isinstance(target, bytes) or not target:
        raise InvalidArgument(f"{node.computation.name}: the key extractor of {stream!r} "
                              f"must return non-empty bytes, got {target!r:.80}")
    return target


def _position_tag(position: bytes) -> str:
    """The part of injected record ids that names the position they were read from:
    the position itself, or a digest of a long one (a log source's position names
    every file it follows, and record ids go into column and row keys)."""
    if len(position) <= 16:
        return position.hex()
    return "h" + hashlib.sha256(position).hexdigest()[:32]


@transactional
def _inject(txn: TransactionBase, p: Pipeline, injector: _Injector, limit: int) -> int:
    row = f"inj/{injector.name}".encode()
    cells = txn.get_row(p.meta, row, ["c:pos", "w:low"])
    position = cells.get("c:pos")
    old_mark = int(cells.get("w:low", b"0"))
    records, after, mark = injector.source.read(position, limit)
    if not records and mark <= old_mark and after == position:
        return 0
    tag = _position_tag(position or b"")
    subscribers = _subscribed(txn, p, injector.stream) if records else []
    for n, record in enumerate(records):
        _deliver(txn, p, injector.stream, subscribers, f"{injector.name}/{tag}/{n}",
                 record.value, record.timestamp, record.timestamp < old_mark, None)
    txn.set(p.meta, row, "c:pos", after)
    txn.set(p.meta, row, "w:low", b"%d" % max(old_mark, mark))
    return len(records)


@transactional
def _advance(txn: TransactionBase, p: Pipeline, name: str) -> tuple[int, int]:
    node = p.nodes[name]
    upstream = min(_read_marks(txn, p, producer)[1]
                   for stream in node.inputs for producer in p._producers(stream))
    old_in, old_low = _read_marks(txn, p, f"wm/{name}")
    w_in = max(old_in, upstream)
    oldest = w_in
    # Held records are pending ones whose keys were not known: moved into the rows
    # (oldest first) before the scan below, which reads this transaction's writes, so
    # the oldest held record counts as pending (the ones left held are newer, or
    # their time is returned).
    left = _adopt(txn, p, node, p.inject_batch)
    if left is not None:
        oldest = min(oldest, left)
    for table, column in ((node.pending, "p:x"), (node.timers, "t:x")):
        for row, _ in txn.scan(table, *node.index_range(), [column]):  # the first: the oldest
            oldest = min(oldest, _parse_index_row(node, row)[0])
            break
    w_low = max(old_low, oldest)
    if (w_in, w_low) != (old_in, old_low):
        txn.set(p.meta, f"wm/{name}".encode(), "w:in", b"%d" % w_in)
        txn.set(p.meta, f"wm/{name}".encode(), "w:low", b"%d" % w_low)
    # Every due timer, not only those newly due: a key run that armed one below the
    # new w:in may have committed after this snapshot's predecessor looked. Up to and
    # including w:in: a timer at the end of time (a flush when the input ends) is due
    # once the input is all read.
    start, stop = node.index_range(min(w_in, END_OF_TIME) + 1)
    for row, _ in txn.scan(node.timers, start, stop, ["t:x"]):
        txn.notify(node.table, _parse_index_row(node, row)[1], WAKE)
    return w_in, w_low


class _KeyRun:
    """One run of a computation for one key, inside the worker's transaction."""

    def __init__(self, txn: TransactionBase, p: Pipeline, node: _Node, key: bytes,
                 read_row: bool = True) -> None:
        self.txn, self.p, self.node, self.key = txn, p, node, key
        self._marks: tuple[int, int] | None = None
        self.cells: dict[str, bytes] = {}
        if read_row:  # a hand-off run needs none of the row: its records come with it
            for _, cells in txn.scan(node.table, key, key + b"\x00"):
                self.cells = cells
        self.current_time = 0
        self.produced = 0
        self.weak = node.computation.productions == "weak"
        self.outbox: dict[tuple[str, bytes], list[Record]] = {}
        """Weak productions not yet handed: (subscriber, its key) -> records."""
        self.subscribers: dict[str, list[str]] = {}
        """Stream -> subscribers, read once per run (in its snapshot)."""

    @property
    def input_watermark(self) -> int:
        """``w:in`` at this run's snapshot, read when first needed (timers, or a
        handler asking): a run of records alone needs no watermark."""
        if self._marks is None:
            self._marks = _read_marks(self.txn, self.p, f"wm/{self.node.computation.name}")
        return self._marks[0]

    def state_get(self, name: str) -> bytes | None:
        return self.txn.get(self.node.table, self.key, f"s:{name}")

    def state_set(self, name: str, value: bytes | None) -> None:
        if value is None:
            self.txn.delete(self.node.table, self.key, f"s:{name}")
        else:
            self.txn.set(self.node.table, self.key, f"s:{name}", value)

    def _timer_index(self, time_ms: int, tag: str) -> bytes:
        return _index_row(self.node, time_ms, self.key, tag.encode())

    def set_timer(self, tag: str, time_ms: int) -> None:
        if not isinstance(tag, str) or not tag or not isinstance(time_ms, int):
            raise InvalidArgument(f"set_timer needs a non-empty str tag and int ms, "
                                  f"got {tag!r}, {time_ms!r}")
        if not 0 <= time_ms <= END_OF_TIME:
            # beyond the end of time a timer could never fire, and every advance after
            # the input ends would wake its key for nothing
            raise InvalidArgument(f"set_timer's time must be from 0 to END_OF_TIME "
                                  f"({END_OF_TIME}: fires once the input ends), got {time_ms}")
        self.delete_timer(tag)
        self.txn.set(self.node.table, self.key, f"t:{tag}", _TS.pack(time_ms))
        self.txn.set(self.node.timers, self._timer_index(time_ms, tag), "t:x", b"")
        if time_ms <= self.input_watermark:
            self.txn.notify(self.node.table, self.key, WAKE)  # fires in the next run

    def delete_timer(self, tag: str) -> None:
        raw = self.txn.get(self.node.table, self.key, f"t:{tag}")
        if raw is not None:
            self.txn.delete(self.node.table, self.key, f"t:{tag}")
            self.txn.delete(self.node.timers,
                            self._timer_index(_TS.unpack(raw)[0], tag), "t:x")

    def produce(self, stream: str, value: bytes, ts: int, key: bytes | None) -> None:
        if stream not in self.node.computation.outputs:
            raise InvalidArgument(f"{self.node.computation.name} produces {stream!r}, which "
                                  f"is not among its outputs {list(self.node.computation.outputs)}")
        if not isinstance(value, bytes) or not isinstance(ts, int):
            raise InvalidArgument(f"produce needs bytes and an int timestamp, got "
                                  f"{type(value).__name__}, {ts!r}")
        record_id = f"{self.node.computation.name}/{self.txn.start_ts}/{self.produced}"
        self.produced += 1
        late = ts < self.current_time
        if stream not in self.subscribers:
            self.subscribers[stream] = _subscribed(self.txn, self.p, stream)
        names = self.subscribers[stream]
        known = [self.p.nodes[n] for n in names
                 if n in self.p.nodes and stream in self.p.nodes[n].inputs]
        if not self.weak or not names or len(known) < len(names):
            # Strong, or a subscriber without code here: a hand-off needs its key
            # extractor, so the whole production is checkpointed (held for it).
            _deliver(self.txn, self.p, stream, names, record_id, value, ts, late, key)
            return
        for node in known:
            target = _target(node, stream, record_id, value, ts, late, key)
            self.outbox.setdefault((node.computation.name, target), []).append(
                Record(value, ts, target, record_id, stream, late))

    def hand_off(self) -> None:
        """Send the weak productions: one transaction per subscriber key, each
        committed (with whatever it hands on in turn) before this returns, so before
        this run's own commit acknowledges the inputs they came from. A failure
        propagates: this run then commits nothing and its inputs are handled again
        (at least once: what was handed already is handed twice)."""
        for (name, key), records in self.outbox.items():
            _handed_run(self.p.cluster, self.p, self.p.nodes[name], key, records)
        self.outbox = {}

    def run(self) -> None:
        comp, table, txn = self.node.computation, self.node.table, self.txn
        ctx = Context(self)
        pending = sorted(
            (_decode_record(raw, self.key, column[3:])
             for column, raw in self.cells.items() if column.startswith("in:")),
            key=lambda r: (r.timestamp, r.id))
        truncated = len(pending) > MAX_RECORDS_PER_RUN
        if truncated:
            pending = pending[:MAX_RECORDS_PER_RUN]
            txn.notify(table, self.key, WAKE)  # the rest, and the timers, in the next run
        self.handle(ctx, pending, consume=True)
        due = sorted((Timer(column[2:], _TS.unpack(raw)[0]) for column, raw in self.cells.items()
                      if column.startswith("t:")), key=lambda t: (t.time, t.tag))
        for timer in due if not truncated else ():
            # Every pending record of this key below the timer was handled above: a
            # record not yet pending that is not late is at or above w:in.
            if timer.time > self.input_watermark:
                break
            current = txn.get(table, self.key, f"t:{timer.tag}")
            if current is None or _TS.unpack(current)[0] != timer.time:
                continue  # deleted or re-armed by a handler of this run
            txn.delete(table, self.key, f"t:{timer.tag}")
            txn.delete(self.node.timers, self._timer_index(timer.time, timer.tag), "t:x")
            self.current_time = timer.time
            comp.process_timer(ctx, timer)

    def handle(self, ctx: Context, records: list[Record], consume: bool) -> None:
        """Handle *records* in order; with *consume*, they are pending records of the
        key, deleted with their index rows (the acknowledgement)."""
        comp, table, txn = self.node.computation, self.node.table, self.txn
        late = 0
        for record in records:
            # Lateness is decided where a record is made: below its producer's input,
            # or below its source's previous watermark (module docstring, rules ii, iii).
            if record.late:
                late += 1
            self.current_time = record.timestamp
            if not (record.late and comp.late_policy == "drop"):
                comp.process_record(ctx, record)
            if consume:
                txn.delete(table, self.key, f"in:{record.id}")
                txn.delete(self.node.pending,
                           _index_row(self.node, record.timestamp, self.key,
                                      record.id.encode()), "p:x")
        if late:
            seen = self.cells[LATE] if LATE in self.cells else txn.get(table, self.key, LATE)
            txn.set(table, self.key, LATE, b"%d" % (int(seen or b"0") + late))


@transactional
def _handed_run(txn: TransactionBase, p: Pipeline, node: _Node, key: bytes,
                records: list[Record]) -> None:
    """A run of *node* for *key* on records handed over by a weak producer, not read
    from the store: no ``in:`` cell, no index row, no notification. The producer's
    inputs stay pending until this commits, which holds every watermark below these
    records as their ``in:`` cells would (docs/millwheel.md)."""
    run = _KeyRun(txn, p, node, key, read_row=False)
    run.handle(Context(run), sorted(records, key=lambda r: (r.timestamp, r.id)),
               consume=False)
    run.hand_off()


class _KeyRunner(Observer):
    """The key-run observer of one computation (bound at run time)."""

    def __init__(self, p: Pipeline, node: _Node) -> None:
        self.pipeline, self.node = p, node
        self.table, self.column = node.table, WAKE
        self.name = f"mw.{p.name}.{node.computation.name}"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        run = _KeyRun(txn, self.pipeline, self.node, row)
        run.run()
        run.hand_off()  # before the worker commits this run: at least once, never lost
