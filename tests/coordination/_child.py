"""A client process for the coordination tests (run as ``python -m tests.coordination._child``).

Modes (first argument):

* ``lock STORE_URL ZOOKEEPER|- TTL``: connect (ZooKeeper coordination unless ``-``), begin
  a transaction writing ``t/r1`` and ``t/r2``, stop it after prewrite (both cells
  locked, as a committer dies mid-commit), print ``LOCKED <owner>`` and then block on
  stdin until the parent kills it (``kill -9``) or closes stdin.
* ``hold STORE_URL ZOOKEEPER``: begin a two-phase commit writing ``t/r1`` and ``t/r2``,
  stop it after the prewrite, just before its commit point, print ``HELD <owner>``,
  wait for a line on stdin, then go on and print ``OUTCOME committed`` or
  ``OUTCOME <error type>: <message>``.
* ``watch ZK_URL``: connect with ``zk://`` and print ``OBSERVED <sorted list>`` every time
  the registry of observed columns changes; exits when stdin closes.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import percolator
from percolator._commit import CrashPoint, SimulatedCrash, commit_transaction
from percolator._internals import internals


def lock(store: str, zookeeper: str, ttl: float) -> None:
    options = {} if zookeeper == "-" else {
        "zookeeper": zookeeper, "zookeeper_session_timeout": 2.0,
    }
    cluster = percolator.connect(store, lock_ttl=ttl, **options)
    txn = percolator.Transaction(cluster)
    txn.set("t", b"r1", "c:v", b"new")
    txn.set("t", b"r2", "c:v", b"new")
    try:
        commit_transaction(txn, CrashPoint("prewrite", 1))
    except SimulatedCrash:
        pass
    print("LOCKED", internals(cluster).coordination.current_owner(), flush=True)
    sys.stdin.read()  # the parent kills us (or lets us go by closing stdin)


def hold(store: str, zookeeper: str) -> None:
    from percolator import _commit

    cluster = percolator.connect(store, zookeeper=zookeeper, zookeeper_session_timeout=2.0)
    cluster.one_phase_commit = False
    commit_point = _commit.TwoPhaseCommit.commit_point

    def held(self: _commit.TwoPhaseCommit, commit_ts: int) -> None:
        print("HELD", self.owner, flush=True)
        sys.stdin.readline()
        commit_point(self, commit_ts)

    _commit.TwoPhaseCommit.commit_point = held  # type: ignore[method-assign]
    txn = percolator.Transaction(cluster)
    txn.set("t", b"r1", "c:v", b"new")
    txn.set("t", b"r2", "c:v", b"new")
    try:
        txn.commit()
        print("OUTCOME committed", flush=True)
    except percolator.PercolatorError as e:
        print(f"OUTCOME {type(e).__name__}: {e}", flush=True)
    cluster.close()


def watch(url: str) -> None:
    cluster = percolator.connect(url, zookeeper_session_timeout=2.0)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    seen = None
    while not done.is_set():
        observed = sorted(cluster.observed_columns())  # in memory: no ZooKeeper round trip
        if observed != seen:
            seen = observed
            print("OBSERVED", json.dumps(observed), flush=True)
        time.sleep(0.01)
    cluster.close()


if __name__ == "__main__":
    if sys.argv[1] == "lock":
        lock(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif sys.argv[1] == "hold":
        hold(sys.argv[2], sys.argv[3])
    else:
        watch(sys.argv[2])
