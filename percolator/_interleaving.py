"""Deterministic interleavings: actors that run one at a time, switching only at the
calls they make to the store and to the timestamp source.

A protocol race (a committer against a lock resolver, a worker against a committer)
lives between two store calls. :class:`Interleaving` makes each such call a *step*:
it wraps the store and the timestamp source of the clusters it is given, runs each
actor in a thread of its own, and parks every actor before each of its steps until
the test lets it take that step. Exactly one actor runs at a time, so a run is
decided by the order in which the test (or a schedule) lets actors step, and
replaying the same order replays the same run, on every backend. An actor can also
be killed at its current step, as if its process died there: it makes no further
call, and its owner is declared dead.

Calls from threads that are not actors (the test's own thread, threads an actor
starts) pass straight through, so a test may read and write while actors are parked.
So do calls on the meta table (registered tables and observed columns): clients
re-read it on a timer, and a step that comes and goes with the clock would make the
same schedule replay differently. For the same reason the embedded store's lock
census (a host-wide hint that no lock is held, cleared by sweeps on a timer) is off
while an interleaving runs: every read reads the lock family. So is what a read learns
from a commit of its own client whose lock it met
(:class:`~percolator._lock_resolver.CommitsInFlight`), which it would wait for outside
any step: the read asks the lock's primary and polls, a step at a time.

What a step cannot split: an atomic section (the embedded store's one-phase commit,
which holds one SQLite write transaction and its commit timestamp in flight) is one step,
``"atomic"``, taken as it is entered; the calls inside it are not steps, and an actor
cannot be killed inside it, as a process cannot die halfway through an SQLite
transaction. Two-phase commits (``cluster.one_phase_commit = False``, or a cell found
locked) are a step per store call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from percolator._commit import SimulatedCrash
from percolator._encoding import META_TABLE, split_column
from percolator._errors import InvalidArgument, PercolatorError
from percolator._internals import internals
from percolator._lock_resolver import CommitsInFlight

if TYPE_CHECKING:
    from percolator._cluster import Cluster

__all__ = ["Actor", "Interleaving", "InterleavingError", "Step"]

T = TypeVar("T")

_GATED_STORE_CALLS = frozenset({
    "read_rows", "mutate_rows", "check_and_set", "scan", "set_unless",
    "check_and_set_many", "increment", "create_table", "drop_table", "list_tables",
})
_ATOMIC_SECTIONS = frozenset({"atomically", "in_flight"})
"""Context managers around several calls made as one (see the module docstring): an
actor parked inside one would hold the store's write lock, or a commit timestamp in
flight, while another actor runs."""


class InterleavingError(PercolatorError):
    """The interleaving could not be carried out as asked (an actor blocked outside a
    step, finished before the step waited for, or was asked to step when done)."""


@dataclass(frozen=True, slots=True)
class Step:
    """The call an actor is parked before.

    ``op`` is ``"start"`` (before the actor's body runs), ``"timestamp"`` (a draw from
    the timestamp source), ``"atomic"`` (entering an atomic section) or the name of
    the store method (``"read_rows"``, ``"check_and_set"``, ``"mutate_rows"``,
    ``"scan"`` for each row a scan yields...).
    ``columns`` names the cells the call touches, the compared cell of a
    compare-and-set first; ``args`` are the call's arguments as given.
    """

    actor: str
    op: str
    table: str | None = None
    rows: tuple[bytes, ...] = ()
    columns: tuple[str, ...] = ()
    args: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    def matches(
        self,
        op: str | None = None,
        *,
        table: str | None = None,
        row: bytes | None = None,
        column: str | None = None,
        family: str | None = None,
    ) -> bool:
        """Whether this step is *op* (any op when None) on *table*, touching *row*,
        *column* (``"family:qualifier"``) or a column of *family*."""
        return (
            (op is None or self.op == op)
            and (table is None or self.table == table)
            and (row is None or row in self.rows)
            and (column is None or column in self.columns)
            and (family is None or any(split_column(c)[0] == family for c in self.columns))
        )

    def __str__(self) -> str:
        where = "/".join(filter(None, [
            self.table, ",".join(repr(r) for r in self.rows), ",".join(self.columns),
        ]))
        return f"{self.actor}: {self.op}({where})"


def _describe(actor: str, op: str, args: tuple[Any, ...]) -> Step:
    if op in ("start", "timestamp") or not args:
        return Step(actor, op, args=args)
    table = args[0] if isinstance(args[0], str) else None
    rows: tuple[bytes, ...] = ()
    columns: list[str] = []
    if op in ("check_and_set", "set_unless", "increment") and len(args) >= 3:
        rows, columns = (args[1],), [args[2]]
        if len(args) > 5:  # the puts of check_and_set and set_unless
            columns += [c for c, _, _ in args[5]]
    elif op == "read_rows" and len(args) >= 3:
        rows = tuple(args[1])
        for read in args[2]:
            columns += [f"{read.family}:{q}" for q in (read.qualifiers or ("*",))]
    elif op == "scan" and len(args) >= 4:
        for read in args[3]:
            columns += [f"{read.family}:{q}" for q in (read.qualifiers or ("*",))]
    elif op == "mutate_rows" and len(args) >= 2:
        rows = tuple(m.row for m in args[1])
        for m in args[1]:
            columns += [c for c, _, _ in m.puts] + [c for c, _ in m.deletes]
    elif op == "check_and_set_many" and len(args) >= 2:
        rows = tuple(item[0] for item in args[1])
        columns = [item[1] for item in args[1]]
    return Step(actor, op, table, rows, tuple(dict.fromkeys(columns)), args)


class Actor(Generic[T]):
    """One actor of an :class:`Interleaving`: a body run in its own thread, parked
    before each of its steps. Made by :meth:`Interleaving.actor`."""

    def __init__(
        self, world: Interleaving, name: str, body: Callable[[], T], clients: Sequence[Cluster]
    ) -> None:
        self.name = name
        self._world = world
        self._body = body
        self._clients = list(clients)
        self._go = threading.Semaphore(0)
        self._killed = False
        self._atomic = 0  # depth of atomic sections entered: no steps inside
        self.pending: Step | None = None
        """The step it is parked before; None while it runs or once it is done."""
        self.done = False
        self.result: T | None = None
        self.error: BaseException | None = None
        """What the body raised (:class:`SimulatedCrash` if it was killed)."""
        self.steps: list[Step] = []
        """The steps it has taken, in order."""
        self._thread = threading.Thread(target=self._main, name=f"actor-{name}", daemon=True)

    # --- the actor's own thread ----------------------------------------------------

    def _main(self) -> None:
        self._world._by_thread[threading.get_ident()] = self
        try:
            self._gate(Step(self.name, "start"))
            self.result = self._body()
        except BaseException as e:  # recorded for the test: the thread itself must end
            self.error = e
        finally:
            with self._world._changed:
                self.pending = None
                self.done = True
                self._world._changed.notify_all()

    def _gate(self, step: Step) -> None:
        if self._atomic:
            return
        if self._killed:
            raise SimulatedCrash(f"actor {self.name} was killed")
        with self._world._changed:
            self.pending = step
            self._world._changed.notify_all()
        self._go.acquire()
        if self._killed:
            raise SimulatedCrash(f"actor {self.name} killed before {step}")
        self.steps.append(step)
        self._world.trace.append(step)

    # --- control, from the test's thread -------------------------------------------

    @property
    def killed(self) -> bool:
        return self._killed

    def step(self) -> Step | None:
        """Let the actor take its pending step and run to its next one; returns that
        next step, or None when the body has returned or raised."""
        if self.done:
            raise InterleavingError(f"actor {self.name} is done; it has no step to take")
        self._world._await(self, lambda: self.pending is not None or self.done)
        with self._world._changed:
            self.pending = None
        self._go.release()
        self._world._await(self, lambda: self.pending is not None or self.done)
        return self.pending

    def run_until(self, predicate: Callable[[Step], bool]) -> Step:
        """Step until the actor is parked before a step for which *predicate* is true
        (its pending step counts) and return that step.

        :raises InterleavingError: if the body ends first.
        """
        step = self.pending
        while step is None or not predicate(step):
            if self.done:
                raise InterleavingError(
                    f"actor {self.name} finished without reaching the step asked for; "
                    f"its steps: {[str(s) for s in self.steps]}; error: {self.error!r}"
                )
            step = self.step()
        return step

    def finish(self) -> T:
        """Run the body to its end and return its result, or raise what it raised."""
        while not self.done:
            self.step()
        return self.outcome()

    def outcome(self) -> T:
        """The body's result, or what it raised, once done."""
        if not self.done:
            raise InterleavingError(f"actor {self.name} has not finished")
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]

    def kill(self) -> None:
        """Kill the actor at its pending step, as if its process died there: it makes
        no further call, and the owner identity of each of its clients is declared
        dead (their locks may be rolled back at once)."""
        if not self.done:
            self._killed = True
            self._world._await(self, lambda: self.pending is not None or self.done)
            self._go.release()
            self._world._await(self, lambda: self.done)
        for client in self._clients:
            internals(client).coordination.close()

    def __repr__(self) -> str:
        state = "done" if self.done else f"before {self.pending}"
        return f"<Actor {self.name} {state}>"


class _GatedStore:
    """A store whose calls from an actor's thread are steps of that actor."""

    def __init__(self, store: Any, world: Interleaving) -> None:
        self._store = store
        self._world = world

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if name in _ATOMIC_SECTIONS:
            return self._world._atomic_section(value)
        if name not in _GATED_STORE_CALLS:
            return value
        world = self._world

        def gated(*args: Any, **kwargs: Any) -> Any:
            actor = world._current()
            if actor is not None and args and args[0] == META_TABLE:
                actor = None
            if actor is not None:
                actor._gate(_describe(actor.name, name, args))
            result = value(*args, **kwargs)
            if name == "scan" and actor is not None:
                return world._gated_rows(actor, result, args)
            return result

        return gated


class _GatedTimestamps:
    """A timestamp source whose draws from an actor's thread are steps of that actor."""

    def __init__(self, source: Any, world: Interleaving) -> None:
        self._source = source
        self._world = world

    def get_timestamp(self) -> int:
        self._world._gate_here("timestamp")
        return int(self._source.get_timestamp())

    def get_timestamps(self, n: int) -> range:
        self._world._gate_here("timestamp")
        return self._source.get_timestamps(n)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._source, name)
        if name in _ATOMIC_SECTIONS:
            return self._world._atomic_section(value)
        return value


class Interleaving:
    """Run actors one store call at a time, in an order the test chooses::

        with Interleaving(cluster) as world:
            client = client_of(cluster)                 # made after: shares the gates
            txn = percolator.Transaction(client)
            txn.set("bank", b"alice", "bal:v", b"40")
            committer = world.actor("T1", txn.commit, clients=[client])
            committer.run_until(lambda s: s.matches("check_and_set", column="_l:bal"))
            ...                                          # the test's own calls run now
            committer.finish()

    The store and timestamp source of each cluster given are wrapped for the life
    of the ``with`` block (clients made with :func:`client_of` inside it share the
    wrappers). On exit, actors still running are killed and the originals are put
    back. *timeout* (seconds) bounds how long an actor may run between two steps:
    one that blocks outside a step (on something a parked actor holds) raises
    :class:`InterleavingError` instead of hanging the test.
    """

    def __init__(self, *clusters: Cluster, timeout: float = 30.0) -> None:
        if not clusters:
            raise InvalidArgument("Interleaving needs at least one cluster")
        self._clusters = clusters
        self.timeout = timeout
        self.actors: list[Actor[Any]] = []
        self.trace: list[Step] = []
        """Every step taken, by every actor, in order."""
        self._by_thread: dict[int, Actor[Any]] = {}
        self._changed = threading.Condition()
        self._saved: list[tuple[Cluster, Any, Any, Any, CommitsInFlight]] = []

    def __enter__(self) -> Interleaving:
        for cluster in self._clusters:
            parts = internals(cluster)
            self._saved.append((cluster, parts.store, parts.timestamps, parts.lock_census,
                                parts.in_flight))
            parts.lock_census = None
            parts.in_flight = CommitsInFlight(watched=False)
            parts.store = _GatedStore(parts.store, self)  # type: ignore[assignment]
            parts.timestamps = _GatedTimestamps(parts.timestamps, self)  # type: ignore[assignment]
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            for actor in self.actors:
                if not actor.done:
                    try:
                        actor.kill()
                    except InterleavingError:
                        pass  # blocked outside a step: its daemon thread is abandoned
        finally:
            for cluster, store, timestamps, census, in_flight in self._saved:
                parts = internals(cluster)
                parts.store, parts.timestamps, parts.lock_census = store, timestamps, census
                parts.in_flight = in_flight
                if census is not None:
                    with census.taking():  # locks were taken unannounced: sweep anew
                        pass
            self._saved.clear()

    # --- actors ------------------------------------------------------------------------

    def actor(
        self, name: str, body: Callable[[], T], *, clients: Sequence[Cluster] = ()
    ) -> Actor[T]:
        """A new actor running *body*, parked before its first step (``"start"``).
        *clients* are the clusters it acts as: :meth:`Actor.kill` declares their
        owners dead."""
        if not self._saved:
            raise InterleavingError("make actors inside the `with Interleaving(...)` block")
        actor = Actor(self, name, body, clients)
        self.actors.append(actor)
        actor._thread.start()
        self._await(actor, lambda: actor.pending is not None or actor.done)
        return actor

    def runnable(self) -> list[Actor[Any]]:
        """The actors not yet done, in the order they were made."""
        return [a for a in self.actors if not a.done]

    def run(self, schedule: Sequence[int] = ()) -> list[Step]:
        """Run every actor to its end: the n-th step goes to ``runnable()[schedule[n] %
        len(runnable())]``, and once *schedule* is spent each actor runs to its end in
        turn. Returns the trace. Schedules drawn by hypothesis shrink to a short one."""
        choices = iter(schedule)
        for choice in choices:
            ready = self.runnable()
            if not ready:
                break
            ready[choice % len(ready)].step()
        for actor in self.runnable():
            while not actor.done:
                actor.step()
        return self.trace

    # --- plumbing -------------------------------------------------------------------

    def _current(self) -> Actor[Any] | None:
        return self._by_thread.get(threading.get_ident())

    def _gate_here(self, op: str) -> None:
        actor = self._current()
        if actor is not None:
            actor._gate(Step(actor.name, op))

    def _atomic_section(
        self, enter: Callable[..., AbstractContextManager[Any]]
    ) -> Callable[..., AbstractContextManager[Any]]:
        """*enter* (a context manager factory) as one step: taken on entry, with the
        calls inside it made at once."""

        @contextmanager
        def section(*args: Any, **kwargs: Any) -> Iterator[Any]:
            actor = self._current()
            if actor is None:
                with enter(*args, **kwargs) as value:
                    yield value
                return
            actor._gate(Step(actor.name, "atomic", args=args))
            actor._atomic += 1
            try:
                with enter(*args, **kwargs) as value:
                    yield value
            finally:
                actor._atomic -= 1

        return section

    def _gated_rows(
        self, actor: Actor[Any], rows: Iterator[Any], args: tuple[Any, ...]
    ) -> Iterator[Any]:
        """A scan's rows, each one a step (a remote store pages a scan: writes may land
        between two rows)."""
        for item in rows:
            yield item
            if self._current() is actor:
                actor._gate(Step(actor.name, "scan", args[0], (item[0],), args=args))

    def _await(self, actor: Actor[Any], condition: Callable[[], bool]) -> None:
        with self._changed:
            if not self._changed.wait_for(condition, timeout=self.timeout):
                raise InterleavingError(
                    f"actor {actor.name} neither reached a step nor finished within "
                    f"{self.timeout}s: it is blocked outside the store and timestamp calls, "
                    "probably on something that a parked actor holds"
                )
