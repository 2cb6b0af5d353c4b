"""A bank client for the crash tests: random transfers until killed.

Usage: python -m tests.transactions._bank_worker URL ACCOUNTS SEED COMMITTED_LOG [outages]
[two-phase]

Each transfer (``percolator.conformance._bank.transfer``, as the conformance run's
clients make) moves an amount between two accounts and records itself in the
``transfers`` table in the same transaction; after ``commit`` returns, its id is
appended to COMMITTED_LOG, so the test knows which transfers were acknowledged.
With ``outages`` (the store is being killed and restarted), a transfer that fails with
StoreUnavailable or CommitUnknownError (it may or may not have committed) is not
acknowledged, and the client goes on with the next one after a short pause. With
``two-phase``, every transfer commits in two phases, also on the embedded store (whose
one-phase commits leave no lock between drawing the commit timestamp and the write
records: the window a change-feed reader must not skip).
"""

from __future__ import annotations

import os
import random
import sys
import time

import percolator
from percolator.conformance._bank import transfer


def main() -> None:
    url, accounts, seed, log_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    flags = set(sys.argv[5:])
    outages = "outages" in flags
    rng = random.Random(seed)
    cluster = percolator.connect(url, lock_ttl=30)
    cluster.one_phase_commit = "two-phase" not in flags

    move = percolator.transactional(retries=1000)(transfer)
    with open(log_path, "ab", buffering=0) as log:
        seq = 0
        while True:
            src, dst = rng.sample(range(accounts), 2)
            tid = b"%d-%d-%d" % (seed, os.getpid(), seq)
            try:
                move(cluster, "accounts", "transfers", tid, src, dst, rng.randint(1, 50))
            except (percolator.StoreUnavailable, percolator.CommitUnknownError):
                if not outages:
                    raise
                time.sleep(0.2)
            else:
                log.write(tid + b"\n")
            seq += 1


if __name__ == "__main__":
    main()
