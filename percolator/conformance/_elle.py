"""An Elle-style checker for list-append histories (Kingsbury and Alvaro, VLDB 2020),
for snapshot isolation.

A transaction is a list of micro-operations: ``("append", key, value)`` (values are
unique per key) or ``("r", key, [values...])`` (the list as read). Each transaction of
the history ended ``"ok"`` (committed), ``"fail"`` (known not to have committed) or
``"info"`` (unknown: it may have committed).

Because every append is unique and a read returns the whole list, the version order of
each key is recovered from the reads: every read must be a prefix of the longest one.
From it come the dependencies between committed transactions:

* **ww**: T1 appended the element right before T2's element of the same key;
* **wr**: T2 read a list whose last element T1 appended;
* **rw**: T1 read a list of a key and T2 appended the element right after its end (an
  anti-dependency: T2 overwrote what T1 saw).

Anomalies reported (SI forbids all of them):

* ``incompatible-order``: two reads of one key that are not prefixes of each other;
* ``G1a`` (aborted read): a read saw an element of a failed transaction;
* ``G1b`` (intermediate read): a read ended at an element that its transaction
  followed with another append to the same key;
* ``lost-update``: two committed transactions read the same version of a key and both
  appended to it;
* ``G0``: a cycle of ww edges; ``G1c``: a cycle of ww and wr edges;
* ``G-single``: a cycle with exactly one rw edge;
* ``G2-nonadjacent``: a cycle with several rw edges, no two of them adjacent. SI allows
  only cycles in which some two rw edges are adjacent (write skew, Fekete et al.).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

Op = tuple[str, Any, Any]


@dataclass
class Txn:
    ops: Sequence[Op]
    status: str  # "ok", "fail" or "info"
    id: int = -1


@dataclass
class Report:
    anomalies: dict[str, list[str]] = field(default_factory=dict)
    edges: int = 0

    def add(self, kind: str, detail: str) -> None:
        self.anomalies.setdefault(kind, []).append(detail)

    @property
    def ok(self) -> bool:
        return not self.anomalies


def check(history: Sequence[Txn]) -> Report:
    report = Report()
    for i, txn in enumerate(history):
        txn.id = i
    writer: dict[tuple[Any, Any], Txn] = {}  # (key, value) -> the transaction appending it
    for txn in history:
        for op, key, value in txn.ops:
            if op == "append":
                writer[(key, value)] = txn
    # version order per key: the longest read; every read must be a prefix of it
    longest: dict[Any, list[Any]] = {}
    for txn in history:
        if txn.status != "ok":
            continue
        for op, key, value in txn.ops:
            if op == "r" and len(value) > len(longest.get(key, [])):
                longest[key] = list(value)
    for txn in history:
        if txn.status != "ok":
            continue
        for op, key, value in txn.ops:
            if op == "r" and list(value) != longest.get(key, [])[: len(value)]:
                report.add("incompatible-order", f"T{txn.id} read {key}={value}, "
                           f"not a prefix of {longest.get(key)}")
    committed = [t for t in history if t.status == "ok"]
    # G1a, G1b
    for txn in committed:
        for op, key, value in txn.ops:
            if op != "r" or not value:
                continue
            for element in value:
                w = writer.get((key, element))
                if w is not None and w.status == "fail":
                    report.add("G1a", f"T{txn.id} read {key}:{element} of failed T{w.id}")
            last = value[-1]
            w = writer.get((key, last))
            if w is not None and w is not txn:
                mine = [v for o, k, v in w.ops if o == "append" and k == key]
                if mine and mine[-1] != last:
                    report.add("G1b", f"T{txn.id} read {key} ending at {last}, an "
                               f"intermediate append of T{w.id}")
    # dependency graph over committed transactions (and info ones whose effects show)
    edges: dict[int, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))

    def edge(a: Txn, b: Txn, kind: str) -> None:
        if a is not b:
            edges[a.id][b.id].add(kind)

    for key, order in longest.items():
        for before, after in pairwise(order):
            a, b = writer.get((key, before)), writer.get((key, after))
            if a is not None and b is not None:
                edge(a, b, "ww")
    read_versions: dict[tuple[Any, int], list[Txn]] = defaultdict(list)
    for txn in committed:
        appended = {k for o, k, _ in txn.ops if o == "append"}
        for op, key, value in txn.ops:
            if op != "r":
                continue
            # a read after the transaction's own append reflects that append
            own = [v for v in value if writer.get((key, v)) is txn]
            seen = value[: len(value) - len(own)] if own else value
            if seen:
                w = writer.get((key, seen[-1]))
                if w is not None:
                    edge(w, txn, "wr")
            at = len(seen)
            order = longest.get(key, [])
            if at < len(order):
                nxt = writer.get((key, order[at]))
                if nxt is not None and nxt.status != "fail":
                    edge(txn, nxt, "rw")
            if key in appended and txn not in read_versions[(key, at)]:
                read_versions[(key, at)].append(txn)
    for (key, at), readers in read_versions.items():
        if len(readers) > 1:
            report.add("lost-update", f"T{', T'.join(str(t.id) for t in readers)} all read "
                       f"{key} at version {at} and appended to it")
    report.edges = sum(len(v) for v in edges.values())
    _cycles(edges, report)
    return report


def _reach(edges: dict[int, dict[int, set[str]]], start: int, goal: int,
           allowed: set[str]) -> bool:
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        for nxt, kinds in edges.get(node, {}).items():
            if kinds & allowed and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _components(edges: dict[int, dict[int, set[str]]]) -> dict[int, int]:
    """The strongly connected component of every node (Tarjan's algorithm, iterative:
    a long history is far deeper than Python's recursion limit)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    component: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    nodes = set(edges) | {b for targets in edges.values() for b in targets}
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(edges.get(root, {})))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, {}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = node
                    if member == node:
                        break
    return component


def _cycles(edges: dict[int, dict[int, set[str]]], report: Report) -> None:
    # Every cycle lies inside one strongly connected component: searching only the
    # edges inside components finds the same cycles, and keeps a long history (tens
    # of thousands of transactions, mostly ordered) from costing a search of the whole
    # graph per edge.
    component = _components(edges)
    edges = {a: inner for a, targets in edges.items()
             if (inner := {b: kinds for b, kinds in targets.items()
                           if component[a] == component[b]})}
    for a, targets in list(edges.items()):
        for b, kinds in targets.items():
            if "ww" in kinds and _reach(edges, b, a, {"ww"}):
                report.add("G0", f"a ww cycle through T{a} -> T{b}")
            if ("wr" in kinds and _reach(edges, b, a, {"ww", "wr"})) or (
                    "ww" in kinds and _wr_on_path(edges, b, a)):
                report.add("G1c", f"a ww/wr cycle through T{a} -> T{b}")
            if "rw" in kinds:
                if _reach(edges, b, a, {"ww", "wr"}):
                    report.add("G-single", f"a cycle with one rw edge T{a} -> T{b}")
                elif _nonadjacent(edges, b, a):
                    report.add("G2-nonadjacent", f"a cycle through rw T{a} -> T{b} with no "
                               "two rw edges adjacent")


def _wr_on_path(edges: dict[int, dict[int, set[str]]], start: int, goal: int) -> bool:
    """Whether some ww/wr path from *start* to *goal* uses a wr edge."""
    seen, todo = {(start, False)}, [(start, False)]
    while todo:
        node, used = todo.pop()
        if node == goal and used:
            return True
        for nxt, kinds in edges.get(node, {}).items():
            for kind in kinds & {"ww", "wr"}:
                state = (nxt, used or kind == "wr")
                if state not in seen:
                    seen.add(state)
                    todo.append(state)
    return False


def _nonadjacent(edges: dict[int, dict[int, set[str]]], start: int, goal: int) -> bool:
    """A path from *start* (entered by an rw edge) back to *goal* (which leaves by that
    rw edge) with no two consecutive rw edges, the last one not rw either."""
    seen, todo = {(start, True)}, [(start, True)]
    while todo:
        node, last_rw = todo.pop()
        if node == goal and not last_rw:
            return True
        for nxt, kinds in edges.get(node, {}).items():
            for kind in kinds:
                rw = kind == "rw"
                if rw and last_rw:
                    continue
                state = (nxt, rw)
                if state not in seen:
                    seen.add(state)
                    todo.append(state)
    return False
