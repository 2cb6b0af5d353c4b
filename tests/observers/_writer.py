"""A writer process of the stress tests: ``python -m tests.observers._writer URL NAME N
ROWS SEED`` commits N changes to docs/raw:v, each its own transaction, to rows drawn
from ROWS; every value is unique (``NAME-i``)."""

from __future__ import annotations

import random
import sys

import percolator


@percolator.transactional
def change(txn: percolator.TransactionBase, row: bytes, value: bytes) -> None:
    txn.set("docs", row, "raw:v", value)


def main(url: str, name: str, n: int, rows: int, seed: int) -> None:
    rng = random.Random(seed)
    with percolator.connect(url) as cluster:
        for i in range(n):
            change(cluster, b"doc%03d" % rng.randrange(rows), f"{name}-{i}".encode())


if __name__ == "__main__":
    url, name, n, rows, seed = sys.argv[1:]
    main(url, name, int(n), int(rows), int(seed))
