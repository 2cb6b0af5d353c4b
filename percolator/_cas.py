"""Compare-and-set of a lock cell, with an answer that may be a replay or may be lost.

Every compare-and-set the protocol makes on a lock cell writes a value that only its
caller writes from that expected value: a LOCKED value carries the start timestamp
and wall time of its transaction, COMMITTED its commit timestamp, and the FREE or
ROLLED_BACK tokens of a transaction are written only to record its own, decided,
outcome. So "the cell now holds the value I asked for" means "my compare-and-set
applied" (or someone finished the same decision for me), whatever the store
answered. Two answers need that check:

* **False from a store that may replay an applied call** (a store that declares
  ``CAS_ANSWER_MAY_BE_REPLAYED``: HBase, whose Thrift server retries ``checkAndMutate``
  inside its own client without a nonce; when the first attempt applied and its response was lost,
  the retry sees the new value and answers False);
* **an error** (:class:`~percolator.StoreUnavailable`: a dropped connection, a
  timeout): the call may or may not have applied, on any store.

In both cases the cell is read again: holding the new value, the compare-and-set
succeeded. After an error a cell that does not hold it proves nothing (the call may
still be on its way), so the error is raised as it was; at the commit point the
caller turns it into :class:`~percolator.CommitUnknownError`, never a conflict.

This is not for cells whose new value another caller may also write from the same
expected value (the timestamp ceiling, the failure counter): there a matching value
does not prove that it was ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from percolator._encoding import split_column
from percolator._errors import StoreUnavailable
from percolator._store import CAS_ANSWER_MAY_BE_REPLAYED, CasDeletes, Read, Store, declares

__all__ = ["holds", "lock_cas"]


def holds(store: Store, table: str, row: bytes, column: str, value: bytes) -> bool:
    """Whether the newest version of the cell is *value*."""
    family, qualifier = split_column(column)
    versions = store.read_rows(table, [row], [Read(family, (qualifier,))]).get(row, {})
    cell = versions.get(column)
    return cell is not None and len(cell) > 0 and cell[0][1] == value


def lock_cas(
    store: Store,
    table: str,
    row: bytes,
    column: str,
    expected: bytes | None,
    new: bytes,
    puts: Sequence[tuple[str, int, bytes]] = (),
    deletes: Sequence[tuple[str, int]] = (),
) -> bool:
    """:meth:`Store.check_and_set` of a lock cell whose *new* value is its caller's own
    (see the module docstring): True when the cell holds *new* afterwards, even if the
    store answered False (a replay) or failed (a lost answer). *deletes* go with the
    puts, on a store that can (:class:`~percolator._store.CasDeletes`) only.

    :raises StoreUnavailable: the store failed and the cell, read again, does not hold
        *new*, or cannot be read: whether the compare-and-set applied is unknown.
    """
    try:
        if (cast(CasDeletes, store).check_and_set(
                table, row, column, expected, new, puts, deletes=deletes)
                if deletes else store.check_and_set(table, row, column, expected, new, puts)):
            return True
    except StoreUnavailable as error:
        try:
            if holds(store, table, row, column, new):
                return True
        except StoreUnavailable:
            pass
        raise error
    if not declares(store, CAS_ANSWER_MAY_BE_REPLAYED):
        return False
    return holds(store, table, row, column, new)
