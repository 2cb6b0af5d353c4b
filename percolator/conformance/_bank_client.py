"""A bank client of the conformance run: random transfers until killed.

Usage: ``python -m percolator.conformance._bank_client --cluster URL [--oracle ...]
--accounts TABLE --transfers TABLE --seed N --log FILE --ready FILE``

It creates the file READY once connected. After ``commit`` returns, the transfer's id
is appended to FILE (unbuffered), so the run knows which transfers were acknowledged.
A transfer whose outcome is unknown (:class:`CommitUnknownError`) or that ran out of
retries is not acknowledged, and the client goes on: those may happen on a real
network, and the checks hold either way.
"""

from __future__ import annotations

import argparse
import os
import random

import percolator
from percolator.conformance._bank import ACCOUNTS, transfer
from percolator.conformance._core import add_connection_arguments, connection_from_arguments


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m percolator.conformance._bank_client")
    add_connection_arguments(parser)
    parser.add_argument("--accounts", required=True)
    parser.add_argument("--transfers", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--ready", required=True, help="created once connected")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    cluster = connection_from_arguments(args).connect()
    open(args.ready, "wb").close()
    move = percolator.transactional(retries=1000)(transfer)
    with open(args.log, "ab", buffering=0) as log:
        seq = 0
        while True:
            src, dst = rng.sample(range(ACCOUNTS), 2)
            tid = b"%d-%d-%d" % (args.seed, os.getpid(), seq)
            seq += 1
            try:
                move(cluster, args.accounts, args.transfers, tid, src, dst, rng.randint(1, 50))
            except (percolator.CommitUnknownError, percolator.ConflictError,
                    percolator.StoreUnavailable, percolator.LockedError):
                continue
            log.write(tid + b"\n")


if __name__ == "__main__":
    main()
