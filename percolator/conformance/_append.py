"""A list-append history, checked for anomalies with the Elle-style checker
(:mod:`percolator.conformance._elle`).

A few threads run transactions of one to three micro-operations on a handful of
keys: read a key's list, or append a unique value to it (each list is a JSON array in
one cell). Every transaction is recorded as committed with what it read, failed (an
error the library documents as "did not commit"), or unknown (it may have committed).
Every few seconds the threads move on to new keys, so lists stay short. At the end a
read of every list joins the history; Elle's checker finds G0, G1a, G1b, G1c,
G-single, G2-nonadjacent, lost updates and incompatible version orders, and every
acknowledged append must be in its list (``lost append``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import percolator
from percolator._cluster import Cluster
from percolator._transaction import Transaction, TransactionBase
from percolator.conformance._core import CheckResult, Target
from percolator.conformance._elle import Txn
from percolator.conformance._elle import check as elle_check

THREADS = 3
LIST_KEYS = 4
KEY_EPOCH = 3.0
"""Seconds between two moves of the workload to new keys."""
COLUMN = "l:v"

#: Errors the library documents as "did not commit" (raised before the commit point).
DEFINITE = (
    percolator.ConflictError,
    percolator.LockedError,
    percolator.OracleUnavailable,
    percolator.CoordinationError,
    percolator.StoreUnavailable,
    percolator.SnapshotTooOldError,
)


def classify(error: BaseException) -> str:
    """``"fail"`` for an error after which the transaction surely did not commit,
    ``"info"`` (may have committed) for any other."""
    if isinstance(error, percolator.CommitUnknownError):
        return "info"
    if isinstance(error, DEFINITE):
        return "fail"
    return "info"


def list_ops(txn: TransactionBase, table: str, plan: list[tuple[bool, str]],
             values: dict[int, str]) -> list[list[Any]]:
    """Run *plan* (``(is_read, key)`` per micro-operation; appends take ``values[i]``)
    in *txn*; return the micro-operations as Elle records them."""
    ops: list[list[Any]] = []
    for i, (is_read, key) in enumerate(plan):
        current = json.loads(txn.get(table, key.encode(), COLUMN) or b"[]")
        if is_read:
            ops.append(["r", key, current])
        else:
            txn.set(table, key.encode(), COLUMN, json.dumps([*current, values[i]]).encode())
            ops.append(["append", key, values[i]])
    return ops


class _Workload:
    def __init__(self, cluster: Cluster, table: str, target: Target) -> None:
        self.cluster, self.table, self.target = cluster, table, target
        self.history: list[Txn] = []
        self.keys: set[str] = set()
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.began = time.monotonic()
        self.seeds = [target.rng.randrange(1 << 30) for _ in range(THREADS)]

    def run(self, n: int) -> None:
        rng = random.Random(self.seeds[n])
        seq = 0
        try:
            while self.target.remaining() > 0 or seq == 0:
                seq += 1
                epoch = int((time.monotonic() - self.began) // KEY_EPOCH)
                plan = [(rng.random() < 0.5, f"k{epoch}-{rng.randrange(LIST_KEYS)}")
                        for _ in range(rng.randint(1, 3))]
                values = {i: f"{n}.{seq}.{i}" for i, (is_read, _) in enumerate(plan)
                          if not is_read}
                appends = [("append", plan[i][1], v) for i, v in values.items()]
                with self.lock:
                    self.keys.update(key for _, key in plan)
                txn = Transaction(self.cluster)
                try:
                    ops = list_ops(txn, self.table, plan, values)
                    txn.commit()
                except Exception as e:
                    txn.rollback()
                    record = Txn(appends, classify(e))
                else:
                    record = Txn([tuple(o) for o in ops], "ok")  # type: ignore[misc]
                with self.lock:
                    self.history.append(record)
        except BaseException as e:  # reported by the check
            self.errors.append(e)


def check(target: Target, result: CheckResult) -> None:
    table = target.table("append")
    work = _Workload(target.cluster, table, target)
    threads = [threading.Thread(target=work.run, args=(n,), name=f"conformance-append-{n}")
               for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if work.errors:
        raise work.errors[0]
    with Transaction(target.cluster) as final:
        lists = {key: json.loads(final.get(table, key.encode(), COLUMN) or b"[]")
                 for key in sorted(work.keys)}
    history = [*work.history, Txn([("r", key, value) for key, value in lists.items()], "ok")]
    for status in ("ok", "fail", "info"):
        result.count(f"transactions {status}", sum(t.status == status for t in work.history))
    report = elle_check(history)
    result.count("dependency edges", report.edges)
    for kind, details in report.anomalies.items():
        for detail in details:
            result.add(kind, detail)
    for txn in work.history:
        if txn.status == "ok":
            for op, key, value in txn.ops:
                if op == "append" and value not in lists.get(key, []):
                    result.add("lost append", f"acknowledged append {value} to {key} is "
                               f"missing from the final list {lists.get(key)}")
