"""Takes locks and stays alive without committing (a slow but live owner).

Usage: python -m tests.transactions._lock_holder URL TTL_SECONDS
Prewrites a two-cell transaction (rows a and b of table t), prints "locked", then
sleeps until killed.
"""

from __future__ import annotations

import sys
import time

import percolator
from percolator._commit import CrashPoint, SimulatedCrash, commit_transaction


def main() -> None:
    cluster = percolator.connect(sys.argv[1], lock_ttl=float(sys.argv[2]))
    txn = percolator.Transaction(cluster)
    txn.set("t", b"a", "c:q", b"new")
    txn.set("t", b"b", "c:q", b"new")
    try:
        commit_transaction(txn, CrashPoint("prewrite", 1))
    except SimulatedCrash:
        pass
    print("locked", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
