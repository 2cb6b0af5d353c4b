"""The observer contract: a class naming the column it watches and a ``process``."""

from __future__ import annotations

from percolator import InvalidArgument, TransactionBase
from percolator.ext import check_column, check_table

__all__ = ["Observer"]


class Observer:
    """Code that runs after a committed change to one column (Percolator §2.4)::

        import hashlib

        class DocumentProcessor(Observer):
            table, column = "documents", "raw:html"

            def process(self, txn, row, column):
                html = txn.get(self.table, row, column)
                digest = hashlib.sha256(html).hexdigest().encode()
                txn.set("documents", row, "parsed:hash", digest)

    A subclass sets :attr:`table` and :attr:`column` (what it observes) and
    implements :meth:`process`. :attr:`name` (default: the class name) identifies
    the observer's acknowledgements in the store: keep it stable across releases.
    Register observers with a :class:`~observers.Worker`; a worker instantiates
    classes with no arguments and uses instances as they are.

    One instance serves all the scanner threads of its worker, so :meth:`process` may
    run in several threads at once (for different rows): keep per-run data in local
    variables, and anything shared on the instance thread-safe. Workers in other
    processes and hosts run their own instances; the acknowledgements, in the store,
    keep their runs of one change to a single commit.
    """

    # Plain attributes, not ClassVar: a subclass usually sets them in its body, but
    # the recipes bind them per instance (one class, one observer per pipeline).
    table: str
    column: str
    name: str = ""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = cls.__name__

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        """Handle a change of (*row*, *column*) of :attr:`table`.

        *txn* is a transaction started after the change committed: it reads a
        consistent snapshot and buffers writes; the worker commits it together
        with the acknowledgement, so its writes land if and only if this run is
        the one acknowledged. Several changes may collapse into one call.

        .. warning:: ``process`` may run more than once for a change (after a
           conflict, a crash or a failure) and only the last run's writes commit:
           touch the store only through *txn* and keep other side effects
           idempotent.
        """
        raise NotImplementedError(f"{type(self).__name__}.process is not implemented")

    @classmethod
    def check(cls) -> None:
        """Validate the class attributes.

        :raises InvalidArgument: when :attr:`table` or :attr:`column` is missing or bad.
        """
        check_observer(cls)

    def __repr__(self) -> str:
        table, column = getattr(self, "table", "?"), getattr(self, "column", "?")
        return f"<observer {self.name} on {table}/{column}>"


def check_observer(observer: Observer | type[Observer]) -> None:
    """Validate what *observer* (a class, or an instance whose table, column and
    name were bound at run time, as the stream recipes do) watches.

    :raises InvalidArgument: when :attr:`table` or :attr:`column` is missing or bad.
    """
    label = observer.__name__ if isinstance(observer, type) else repr(observer)
    for attr in ("table", "column"):
        if not isinstance(getattr(observer, attr, None), str):
            raise InvalidArgument(f"observer {label} must set {attr!r} to a str")
    check_table(observer.table)
    check_column(observer.column)
    name = observer.name
    if not isinstance(name, str) or not name or "@" in name or not name.isprintable():
        raise InvalidArgument(
            f"bad observer name {name!r}: a non-empty str, no '@' or control characters"
        )

