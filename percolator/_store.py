"""The store contract: everything a storage backend implements (DESIGN.md §4).

A store is a Bigtable-like map ``(table, row, "family:qualifier", timestamp) -> bytes``
sorted by row. The transaction protocol needs nothing beyond the methods of
:class:`Store`; each backend (``percolator/stores/``) implements exactly these.

Conventions every backend follows:

* a *column* is the string ``"family:qualifier"``; the family is everything before
  the first colon, the qualifier (which may contain colons) everything after it;
* timestamps are non-negative integers (backends map them to their own units);
* versions are returned newest first;
* ``read_rows``/``scan`` return only columns that have at least one cell in range,
  and ``read_rows`` omits rows that have none;
* a missing table raises :class:`~percolator.UnknownTableError`; a store that
  cannot be reached raises :class:`~percolator.StoreUnavailable` naming it.

Two latitudes, because HBase's Thrift1 interface cannot do otherwise (the conformance
suite documents both with strict expected failures on HBase):

* a :class:`Mutation` whose changes span several timestamps, or mix deletes and
  puts, may become visible in steps (Thrift1 applies one timestamp per call);
* a put at or below the timestamp of an earlier delete of the same cell may stay
  hidden (HBase delete markers mask older versions until a major compaction).

The protocol never needs the first: its multi-timestamp writes are ordered so that
each step is safe on its own (data before its write record, write record before the
lock is freed). It tolerates the second: it deletes notify versions only at or below
one already processed, and records at or below a timestamp drawn after them, and
writes anew at fresh, larger timestamps, with one exception. A weak notification is
written at its transaction's commit timestamp, drawn before the write, so it may land
below a worker's deletion of a newer notification of its cell (hidden on HBase, kept
elsewhere). That worker's run started after the newer notification, hence after the
weak one's timestamp, and its reads of the notifying transaction's cells waited for
that transaction (whose locks predate its commit timestamp): the run the weak
notification asked for has happened; other stores merely run the observer once more
(``tests/observers/test_weak_notifications.py``).

Optional capabilities. A backend may offer more than the contract where its store does
the same work in fewer round trips, or where it is embedded. Each backend states what
it offers in :attr:`Store.capabilities`, a set of the :class:`Capability` constants
below, and callers ask for one with :func:`offered` (the store, typed as the
capability's protocol, or None) or :func:`declares` (a flag); they fall back to the
contract methods without it, so the protocol never depends on one.
``tests/stores/test_capabilities.py`` checks that every backend, and every test double
that wraps one, declares exactly what it implements.

* :data:`CAS_ANSWER_MAY_BE_REPLAYED` (a flag, HBase): a False from
  :meth:`Store.check_and_set` may answer a retry, below us, of an attempt that applied
  (HBase's Thrift server retries ``checkAndMutate`` without a nonce); lock-cell
  compare-and-sets then read the cell again (``percolator/_cas.py``).
* :data:`INCREMENT` (:class:`Incrementing`): ``increment(table, row, column, amount)
  -> int``, an atomic counter, one round trip (Bigtable ``ReadModifyWriteRow``, HBase
  ``atomicIncrement``). :class:`~percolator._timestamps.StoreTimestamps` draws each
  timestamp with it.
* :data:`SET_UNLESS` (:class:`GuardedSet`): ``set_unless(table, row, column, new,
  guards, puts) -> bool``, a conditional mutation whose condition is "no cell of the
  row matches any :class:`Guard`", one round trip (Bigtable ``CheckAndMutateRow`` with a
  filter predicate; HBase Thrift1's ``checkAndPut`` can only compare one value). The
  two-phase prewrite folds its conflict check into it (``percolator/_commit.py``).
* :data:`CHECK_AND_SET_MANY` (:class:`BatchedCas`): ``check_and_set_many(table, items)
  -> list[bool]``, many compare-and-sets in fewer round trips than one each, for bulk
  writers (``percolator/_bulk.py``): SQLite decides a batch in one write transaction;
  Bigtable sends one ``CheckAndMutateRow`` per row (its cells compared and set
  together, see ``percolator/stores/_cas_rows.py``), several rows at a time. HBase
  Thrift1 cannot: ``checkAndPut`` compares and sets one cell per call and has no batch
  form.
* :data:`DELETE_IF` (:class:`ConditionalDelete`): ``delete_if(table, row, column,
  expected) -> bool``, remove a single-version cell if its value is *expected*, one
  round trip (SQLite, a conditional ``DELETE``; Bigtable ``CheckAndMutateRow`` with a
  ``DeleteFromColumn``). Garbage collection removes the FREE lock cell of a deleted cell
  with it (``percolator/_gc.py``); HBase Thrift1's ``checkAndPut`` can only put, so
  there that lock cell stays (a few bytes).
* :data:`SPLIT_KEYS` (:class:`SplitKeys`): ``split_keys(table) -> list[bytes]``, row
  keys where the store itself would cut the table for parallel reads (Bigtable
  ``SampleRowKeys``, HBase Thrift1 ``getTableRegions``), for parallel readers
  (``spark_loader.read_table``) and the workers' scan starts; without it (SQLite) they
  sample the row keys themselves.
* :data:`NOTIFY_INDEX` (a flag, Bigtable): a family-filtered scan reads every row on
  the server, so notifications are found through an index
  (``percolator/_notify_index.py``).

The embedded store (SQLite, ``percolator/_embedded_mode.py``) offers six more:

* :data:`ATOMICALLY` (:class:`AtomicSteps`): ``atomically()``, a context in which every
  call of the thread is one atomic write step: the one-phase commit
  (``percolator/_commit.py``) and garbage collection (``percolator/_gc.py``) use it.
* :data:`SINGLE_WRITER` (a flag): one writer at a time; workers default to one scanner
  thread and take turns at the store (``observers/_turns.py``).
* :data:`EMBEDDED_FILE` (:class:`EmbeddedFile`): ``path``, the store's file, beside
  which the cluster keeps its sidecar files; ``any_untagged(family, tag)``, the
  lock census's question (``percolator/_lock_census.py``); and ``newest_at(table, row,
  family, qualifier, max_ts)``, one cell's newest version at or below *max_ts*: the
  read a transaction makes while the census says no lock is held (the write record
  alone), without :meth:`Store.read_rows`' objects.
* :data:`VACUUM` (:class:`Vacuuming`): ``vacuum()``, return free space to the file
  system after garbage collection.
* :data:`PUT_ROW` (:class:`RowPut`): ``put_row(table, row, puts)``, one row's puts
  straight on the atomic step's transaction, without ``mutate_rows``' batching.
* :data:`NEWEST_OF_ROW` (:class:`RowNewest`): ``newest_of_row(table, row, fields,
  qualifiers)``, the timestamp or the value (each a *field*: ``(family, "ts")`` or
  ``(family, "value")``) of the newest version of some cells of one row, as one flat
  tuple: the one-phase commit's conflict read (``percolator/_one_phase.py``; one index
  probe per field and cell, where both parts would take two).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast, runtime_checkable

from percolator._errors import InvalidArgument

Cell = tuple[int, bytes]
"""One version of a cell: ``(timestamp, value)``."""

RowCells = dict[str, list[Cell]]
"""A row's cells: column -> versions, newest first."""


@dataclass(frozen=True, slots=True)
class Read:
    """What to read of one family.

    ``qualifiers=None`` reads every qualifier of the family. ``max_ts`` and
    ``min_ts`` are both inclusive; ``versions`` is how many versions per column to
    return, newest first (``None``: all in the range). ``skip_tag`` (one byte) leaves
    out the selected versions whose value starts with it; an older version does not
    take a skipped one's place (a remote store filters on the server: a reader of
    lock cells is not sent the FREE ones).
    """

    family: str
    qualifiers: tuple[str, ...] | None = None
    max_ts: int | None = None
    min_ts: int = 0
    versions: int | None = 1
    skip_tag: bytes | None = None


def check_skip_tag(read: Read) -> bytes | None:
    """*read*'s ``skip_tag``, validated: None or a single byte."""
    tag = read.skip_tag
    if tag is not None and (not isinstance(tag, bytes) or len(tag) != 1):
        raise InvalidArgument(f"'skip_tag' must be one byte or None, got {tag!r} in {read!r}")
    return tag


def drop_skipped(cells: RowCells, reads: Sequence[Read]) -> None:
    """Apply the reads' ``skip_tag`` to one row's *cells* read for them, in place (for
    stores that cannot filter values where they select versions)."""
    for read in reads:
        tag = check_skip_tag(read)
        if tag is None:
            continue
        prefix = read.family + ":"
        for name in [n for n in cells if n.startswith(prefix)]:
            if read.qualifiers is not None and name[len(prefix):] not in read.qualifiers:
                continue
            kept = [cell for cell in cells[name] if cell[1][:1] != tag]
            if kept:
                cells[name] = kept
            else:
                del cells[name]


@dataclass(frozen=True, slots=True)
class Mutation:
    """Changes to one row, applied atomically.

    ``puts`` are ``(column, timestamp, value)``; ``deletes`` are ``(column, max_ts)``
    and remove every version of the column at or below ``max_ts``. Deletes are
    applied before puts.
    """

    row: bytes
    puts: Sequence[tuple[str, int, bytes]] = ()
    deletes: Sequence[tuple[str, int]] = ()


P = TypeVar("P")


@dataclass(frozen=True, slots=True, eq=False)
class Capability(Generic[P]):
    """An optional capability of a store (see the module docstring): *name*, and the
    *members* (methods or attributes) that a store declaring it has. A flag has none.
    The type parameter is the protocol :func:`offered` types the store as. Each is one
    of the constants below, compared by identity (a set lookup per commit stays cheap)."""

    name: str
    members: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<capability {self.name}>"



@runtime_checkable
class Store(Protocol):
    """The store contract (DESIGN.md §4)."""

    url: str
    """Where the store lives, for messages (no secrets)."""

    capabilities: frozenset[Capability[Any]]
    """The optional capabilities this store offers (see the module docstring)."""

    atomic_row_cas: bool
    """True if :meth:`check_and_set` applies its ``puts`` in the same atomic step as
    the compare-and-set (and only when it succeeds). False means the caller's puts
    are written first, unconditionally, and then the cell is compared and set."""

    def create_table(self, table: str, families: Mapping[str, int]) -> None:
        """Create *table* with *families* (name -> max versions kept, 0 = all). Idempotent."""
        ...

    def drop_table(self, table: str) -> None:
        """Delete *table* and all its cells. Dropping a missing table is not an error."""
        ...

    def list_tables(self) -> list[str]:
        """Names of the existing tables, sorted."""
        ...

    def read_rows(
        self, table: str, rows: Sequence[bytes], reads: Sequence[Read]
    ) -> dict[bytes, RowCells]:
        """Read *reads* of every row in *rows*, in as few round trips as possible."""
        ...

    def mutate_rows(self, table: str, mutations: Sequence[Mutation]) -> None:
        """Apply *mutations*, each atomically within its row, batched."""
        ...

    def check_and_set(
        self,
        table: str,
        row: bytes,
        column: str,
        expected: bytes | None,
        new: bytes,
        puts: Sequence[tuple[str, int, bytes]] = (),
    ) -> bool:
        """Compare-and-set of one cell whose family keeps a single version.

        If the latest value of ``(row, column)`` equals *expected* (``None``: the cell
        has no value), write *new* as its value and return True; otherwise change
        nothing and return False. *puts* are other cells of the same row
        ``(column, ts, value)``: see :attr:`atomic_row_cas`.
        """
        ...

    def scan(
        self,
        table: str,
        start: bytes | None,
        stop: bytes | None,
        reads: Sequence[Read],
        *,
        batch_size: int = 1000,
    ) -> Iterator[tuple[bytes, RowCells]]:
        """Rows in ``[start, stop)`` in row order with their cells selected by *reads*.

        Rows with no selected cell are not yielded, so a scan over a sparse family
        costs in proportion to its cells, not to the table.
        """
        ...

    def close(self) -> None:
        """Release connections. The store is unusable afterwards."""
        ...


# ---- optional capabilities (see the module docstring) -------------------------------


@runtime_checkable
class Incrementing(Protocol):
    """A store with an atomic counter (optional capability)."""

    def increment(self, table: str, row: bytes, column: str, amount: int) -> int:
        """Add *amount* to the counter ``(row, column)`` and return the new value, atomically.

        The counter is the latest version of the cell, read as a 64-bit big-endian
        signed integer (an absent cell counts as 0); the sum is written the same way
        as the cell's new latest value, at a timestamp of the backend's choosing (its
        clock), so only the value is portable. Mixes with :meth:`Store.check_and_set`
        on the same cell: each sees the other's writes. A cell that does not hold
        exactly 8 bytes raises :class:`~percolator.InvalidArgument`; *amount* must
        keep the counter within a signed 64-bit integer.
        """
        ...


def check_increment_amount(amount: object) -> int:
    """Validate the *amount* of :meth:`Incrementing.increment` (what backends share)."""
    if isinstance(amount, bool) or not isinstance(amount, int) or not (
        -(2**63) <= amount < 2**63
    ):
        raise InvalidArgument(f"'amount' must be a 64-bit integer, got {amount!r}")
    return amount


@dataclass(frozen=True, slots=True)
class Guard:
    """A test on the versions of one column of a row, for :meth:`GuardedSet.set_unless`.

    It matches when a version of *column* with a timestamp in ``[min_ts, max_ts]``
    (both inclusive; ``max_ts=None``: unbounded) has a value in ``[value_from,
    value_to)`` (``value_to=None``: unbounded; bytes compare lexicographically). With
    ``latest`` only the newest version inside the timestamp range is tested.
    """

    column: str
    min_ts: int = 0
    max_ts: int | None = None
    latest: bool = False
    value_from: bytes = b""
    value_to: bytes | None = None


@runtime_checkable
class GuardedSet(Protocol):
    """A store with a multi-cell condition on a row mutation (optional capability)."""

    def set_unless(
        self,
        table: str,
        row: bytes,
        column: str,
        new: bytes,
        guards: Sequence[Guard],
        puts: Sequence[tuple[str, int, bytes]] = (),
    ) -> bool:
        """Unless some cell of *row* matches one of *guards*, set ``(row, column)``
        to *new* as :meth:`Store.check_and_set` does and apply *puts*, all in one atomic
        step, and return True; otherwise change nothing and return False."""
        ...


class CasDeletes(Protocol):
    """A store whose :meth:`Store.check_and_set` also deletes cell versions of the row
    in its atomic step (optional capability :data:`CAS_DELETES`; Bigtable)."""

    def check_and_set(
        self,
        table: str,
        row: bytes,
        column: str,
        expected: bytes | None,
        new: bytes,
        puts: Sequence[tuple[str, int, bytes]] = (),
        *,
        deletes: Sequence[tuple[str, int]] = (),
    ) -> bool:
        """:meth:`Store.check_and_set`, also deleting, when it sets, the versions at or
        below ``max_ts`` of each ``(column, max_ts)`` of *deletes* (other cells of
        *row*, as :class:`Mutation` deletes)."""
        ...


CasItem = tuple[bytes, str, bytes | None, bytes, Sequence[tuple[str, int, bytes]]]
"""One compare-and-set of a :meth:`BatchedCas.check_and_set_many` batch:
``(row, column, expected, new, puts)``, the arguments of :meth:`Store.check_and_set`."""


@runtime_checkable
class BatchedCas(Protocol):
    """A store that decides many compare-and-sets in fewer round trips than one each
    (optional capability, for bulk writers: ``percolator/_bulk.py``)."""

    def check_and_set_many(self, table: str, items: Sequence[CasItem]) -> list[bool]:
        """Decide *items* as :meth:`Store.check_and_set` would one after another, in
        order, and return one bool per item. The puts of an item are applied only when
        its compare-and-set succeeds, atomically with it, and must not name a cell
        that the batch compares. A failure may leave some items applied and others
        not, as the same calls one by one would."""
        ...


@runtime_checkable
class ConditionalDelete(Protocol):
    """A store that removes a cell only if it holds a given value (optional capability)."""

    def delete_if(self, table: str, row: bytes, column: str, expected: bytes) -> bool:
        """If the latest value of ``(row, column)``, a cell whose family keeps a single
        version, equals *expected*, remove the cell and return True; otherwise change
        nothing and return False."""
        ...


@runtime_checkable
class SplitKeys(Protocol):
    """A store that reports where to cut a table for parallel reads (optional capability)."""

    def split_keys(self, table: str) -> list[bytes]:
        """Sorted row keys that cut *table* into ranges of about equal size, from the
        store's own layout (regions, tablets, samples); empty when it has one range.
        Only a hint: any keys split a scan correctly."""
        ...


@runtime_checkable
class AtomicSteps(Protocol):
    """A store whose calls can be grouped into one atomic write step (the embedded store)."""

    def atomically(self) -> AbstractContextManager[None]:
        """Make every call of this thread inside the block one atomic write step: all of
        it or none of it, with no other writer in between."""
        ...


@runtime_checkable
class EmbeddedFile(Protocol):
    """A store in one local file (the embedded store), with the lock census's question
    and the read it allows."""

    path: str
    """The store's file; the cluster's sidecar files sit beside it."""

    def any_untagged(self, family: str, tag: bytes) -> bool:
        """Whether a cell of *family*, in any table that has it, holds a value that does
        not start with the one-byte *tag*."""
        ...

    def newest_at(self, table: str, row: bytes, family: str, qualifier: str,
                  max_ts: int) -> tuple[int, bytes] | None:
        """The newest version at or below *max_ts* of one cell, as ``(timestamp,
        value)``, or None: ``read_rows(table, [row], [Read(family, (qualifier,),
        max_ts=max_ts)])``'s one cell."""
        ...


@runtime_checkable
class Vacuuming(Protocol):
    """A store that can give free space back to the file system."""

    def vacuum(self) -> None:
        """Return the space of deleted cells to the file system (blocks writers)."""
        ...


@runtime_checkable
class RowPut(Protocol):
    """A store with a cheaper :meth:`Store.mutate_rows` of one row's puts (the embedded
    store: straight on an atomic step's transaction)."""

    def put_row(self, table: str, row: bytes, puts: Sequence[tuple[str, int, bytes]]) -> None:
        """Write *puts* to *row* as ``mutate_rows(table, [Mutation(row, puts)])`` does."""
        ...


@runtime_checkable
class RowNewest(Protocol):
    """A store that reads the newest version of some cells of one row without building
    :meth:`Store.read_rows`' objects (the embedded store: one prepared statement)."""

    def newest_of_row(self, table: str, row: bytes, fields: tuple[tuple[str, str], ...],
                      qualifiers: tuple[str, ...]) -> tuple[Any, ...]:
        """For each of *fields* (``(family, "ts")`` or ``(family, "value")``), for each
        of *qualifiers*, that part of the newest version of ``family:qualifier`` (None
        where there is none), as one flat tuple."""
        ...


CAS_ANSWER_MAY_BE_REPLAYED: Capability[None] = Capability("cas_answer_may_be_replayed")
"""A flag (HBase): a False from :meth:`Store.check_and_set` may answer a replayed attempt
that applied; lock-cell compare-and-sets then read the cell again (``percolator/_cas.py``)."""
INCREMENT: Capability[Incrementing] = Capability("increment", ("increment",))
""":class:`Incrementing`: an atomic counter in one round trip (timestamps from the store)."""
SET_UNLESS: Capability[GuardedSet] = Capability("set_unless", ("set_unless",))
""":class:`GuardedSet`: a conditional mutation guarded by "no cell matches a
:class:`Guard`", in one round trip (the two-phase prewrite's check and lock in one)."""
CHECK_AND_SET_MANY: Capability[BatchedCas] = Capability(
    "check_and_set_many", ("check_and_set_many",))
""":class:`BatchedCas`: many independent compare-and-sets of one table in one
request (bulk loads)."""
DELETE_IF: Capability[ConditionalDelete] = Capability("delete_if", ("delete_if",))
""":class:`ConditionalDelete`: remove a single-version cell if its value is the one
expected, in one round trip (garbage collection's last FREE lock of a deleted cell)."""
CAS_DELETES: Capability[CasDeletes] = Capability("cas_deletes")
""":class:`CasDeletes`: a compare-and-set that also deletes versions of other cells of
its row (an observer run's notification is deleted by its commit point)."""
SPLIT_KEYS: Capability[SplitKeys] = Capability("split_keys", ("split_keys",))
""":class:`SplitKeys`: the row keys where the store would cut a table for parallel
reads (parallel readers and the workers' scan starts)."""
NOTIFY_INDEX: Capability[None] = Capability("notify_index")
"""A flag (Bigtable): notifications are found through the notification index
(``percolator/_notify_index.py``), not by a family-filtered scan of every row."""
ATOMICALLY: Capability[AtomicSteps] = Capability("atomically", ("atomically",))
""":class:`AtomicSteps`: several store calls as one atomic step (the embedded store's
one-phase commit)."""
SINGLE_WRITER: Capability[None] = Capability("single_writer")
"""A flag (embedded store): one writer at a time; workers default to one scanner
thread and take turns at the store."""
EMBEDDED_FILE: Capability[EmbeddedFile] = Capability(
    "embedded_file", ("path", "any_untagged", "newest_at"))
""":class:`EmbeddedFile`: the store's file (beside which the cluster keeps its
sidecar files), the lock census's question, and one cell's newest version at or below
a timestamp without :meth:`Store.read_rows`' objects."""
VACUUM: Capability[Vacuuming] = Capability("vacuum", ("vacuum",))
""":class:`Vacuuming`: return free space to the file system after garbage
collection."""
PUT_ROW: Capability[RowPut] = Capability("put_row", ("put_row",))
""":class:`RowPut`: one row's puts straight on the atomic step's transaction, without
:meth:`Store.mutate_rows`' batching."""
NEWEST_OF_ROW: Capability[RowNewest] = Capability("newest_of_row", ("newest_of_row",))
""":class:`RowNewest`: the newest version's timestamp or value of some cells of one
row, as one flat tuple (the one-phase commit's conflict read)."""

CAPABILITIES: tuple[Capability[Any], ...] = (
    CAS_ANSWER_MAY_BE_REPLAYED, INCREMENT, SET_UNLESS, CHECK_AND_SET_MANY, DELETE_IF,
    CAS_DELETES, SPLIT_KEYS, NOTIFY_INDEX, ATOMICALLY, SINGLE_WRITER, EMBEDDED_FILE, VACUUM,
    PUT_ROW, NEWEST_OF_ROW,
)
"""Every optional capability."""


def declares(store: Store, capability: Capability[Any]) -> bool:
    """Whether *store* declares *capability*."""
    return capability in store.capabilities


def offered(store: Store, capability: Capability[P]) -> P | None:
    """*store* as *capability*'s protocol if it declares it, else None (declaring means
    implementing: ``tests/stores/test_capabilities.py``)."""
    return cast(P, store) if capability in store.capabilities else None
