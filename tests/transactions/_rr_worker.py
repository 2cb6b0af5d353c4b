"""Writer or reader for the repeatable-read test.

Usage: python -m tests.transactions._rr_worker URL writer|reader SECONDS [GAP]
A writer increments counters c0..c3 in one transaction, as fast as it can. A reader
reads the counters twice in one transaction and exits 1 if the two reads differ.
GAP sets the embedded store's gap of start timestamps below each one-phase commit
(``HostTimestamps.GAP``): a small one makes start timestamps wait for commits often.
"""

from __future__ import annotations

import sys
import time

import percolator
from percolator._timestamps import HostTimestamps

ROWS = [b"c%d" % i for i in range(4)]


def main() -> int:
    url, role, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if sys.argv[4:]:
        HostTimestamps.GAP = int(sys.argv[4])
    cluster = percolator.connect(url)
    end = time.monotonic() + seconds
    checks = 0
    while time.monotonic() < end:
        if role == "writer":
            try:
                with percolator.Transaction(cluster) as txn:
                    for row in ROWS:
                        txn.set("t", row, "c:n", b"%d" % (int(txn.get("t", row, "c:n") or 0) + 1))
            except percolator.ConflictError:
                pass
        else:
            txn = percolator.Transaction(cluster)
            first = [txn.get("t", row, "c:n") for row in ROWS]
            second = [txn.get("t", row, "c:n") for row in ROWS]
            if first != second or len(set(first)) > 1:
                print(f"non-repeatable read at {txn.start_ts}: {first} then {second}")
                return 1
            checks += 1
    print(f"{role} done, {checks} checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
