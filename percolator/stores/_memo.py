"""What backends share: memoising what they derive from a request's Reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from percolator._store import Read

__all__ = ["memo_by_reads"]

T = TypeVar("T")


def memo_by_reads(
    build: Callable[[tuple[Read, ...]], T], size: int = 256
) -> Callable[[Sequence[Read]], T]:
    """Memoise *build* per tuple of Reads.

    A transaction's reads repeat (every ``get`` of a column asks for the same lock,
    write and data Reads), and what a backend derives from them (a filter, a column
    list) costs more to build than a small answer costs to decode. At most *size*
    entries are kept (the memo is emptied when full). Reads that cannot be hashed
    (a list of qualifiers) are built every time. What *build* returns is shared by
    every later call: callers must not change it.
    """
    cache: dict[tuple[Read, ...], T] = {}

    def derived(reads: Sequence[Read]) -> T:
        try:
            key = tuple(reads)
        except TypeError:  # not a sequence: the builder says what is wrong with it
            return build(reads)  # type: ignore[arg-type]
        try:
            hit = cache.get(key)
        except TypeError:  # unhashable
            return build(key)
        if hit is None:
            hit = build(key)
            if len(cache) >= size:
                cache.clear()
            cache[key] = hit
        return hit

    return derived
