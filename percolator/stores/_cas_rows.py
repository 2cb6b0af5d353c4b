"""``check_and_set_many`` for stores whose conditional write covers one row.

Bigtable's ``CheckAndMutateRow`` compares and sets any cells of one row in one atomic
request, but no more than one row. :func:`check_and_set_by_row` builds a batched
compare-and-set (:class:`percolator._store.BatchedCas`) from such a *row* operation:
the items of each row go in one request (all of them win, or nothing changes), several
rows at a time; a row whose request fails is decided again item by item, in order, so
the result is exactly that of the items one after another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from percolator._store import CasItem

__all__ = ["check_and_set_by_row"]

MAX_GROUP_BYTES = 8192
"""Bound on the compared columns and values of one row request (Bigtable refuses a
predicate filter over 20 KiB)."""
MAX_GROUP_ITEMS = 100


def _row_tasks(items: Sequence[CasItem]) -> list[tuple[list[list[int]], bool]]:
    """Per row of *items*: the indexes of its items in requests (in order, within the
    size bounds), and whether they can go together at all. The items of a row that
    names a cell twice, or compares some cells with "absent" and others with a value
    (one request cannot say both), are decided one by one, in order."""
    by_row: dict[bytes, list[int]] = {}
    for i, item in enumerate(items):
        by_row.setdefault(item[0], []).append(i)
    tasks: list[tuple[list[list[int]], bool]] = []
    for indexes in by_row.values():
        if (len({items[i][1] for i in indexes}) < len(indexes)
                or len({items[i][2] is None for i in indexes}) > 1):
            tasks.append(([indexes], False))
            continue
        groups: list[list[int]] = [[]]
        size = 0
        for i in indexes:
            weight = 64 + len(items[i][1]) + len(items[i][2] or b"")
            if groups[-1] and (size + weight > MAX_GROUP_BYTES
                               or len(groups[-1]) >= MAX_GROUP_ITEMS):
                groups.append([])
                size = 0
            groups[-1].append(i)
            size += weight
        tasks.append((groups, True))
    return tasks


def check_and_set_by_row(
    items: Sequence[CasItem],
    set_row: Callable[[Sequence[CasItem]], bool],
    check_and_set: Callable[[CasItem], bool],
    *,
    concurrency: int = 8,
) -> list[bool]:
    """Decide *items* as ``check_and_set`` would one after another, with one call of
    *set_row* per row where it can, up to *concurrency* rows at a time.

    ``set_row(group)`` gets items of one row naming distinct cells and all comparing
    with "absent" or all with a value; it must apply all of them, with their puts in
    order, atomically when every cell holds its expected value, and return whether it
    did. ``check_and_set(item)`` decides one item. Items of different rows do not
    depend on each other, so rows may be decided in any order.
    """
    results = [False] * len(items)

    def decide(task: tuple[list[list[int]], bool]) -> None:
        groups, together = task
        for group in groups:
            if together and len(group) > 1 and set_row([items[i] for i in group]):
                for i in group:
                    results[i] = True
                continue
            for i in group:  # one item, a cell named twice, or some cell differed
                results[i] = check_and_set(items[i])

    tasks = _row_tasks(items)
    if len(tasks) == 1 or concurrency <= 1:
        for task in tasks:
            decide(task)
    else:
        with ThreadPoolExecutor(min(concurrency, len(tasks))) as pool:
            for _ in pool.map(decide, tasks):  # re-raises the first failure
                pass
    return results
