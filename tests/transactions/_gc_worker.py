"""Garbage collection for the crash tests: passes back to back until killed.

Usage: python -m tests.transactions._gc_worker URL RETENTION LOG

After each pass, appends ``versions_removed`` to LOG, so the test knows that passes
ran and removed something.
"""

from __future__ import annotations

import sys

import percolator


def main() -> None:
    url, retention, log_path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    cluster = percolator.connect(url)
    with open(log_path, "ab", buffering=0) as log:
        while True:
            summary = cluster.gc(retention=retention)
            log.write(b"%d\n" % summary.versions_removed)


if __name__ == "__main__":
    main()
