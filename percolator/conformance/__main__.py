"""``python -m percolator.conformance --cluster URL ...``: see :mod:`percolator.conformance`."""

from __future__ import annotations

import argparse
import json
import sys

from percolator._errors import PercolatorError, StoreUnavailable
from percolator.conformance._core import add_connection_arguments, connection_from_arguments
from percolator.conformance._runner import CHECKS, ERROR_HINT, parse_checks, run


def main(argv: list[str] | None = None, prog: str = "python -m percolator.conformance") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="Certify a cluster: run snapshot-isolation conformance checks "
        "against it, in tables of their own. Exit 0: passed; 1: an anomaly; 2: the run "
        "could not be made.")
    add_connection_arguments(parser)
    parser.add_argument("--checks", default=",".join(CHECKS),
                        help=f"comma-separated, from {','.join(CHECKS)} (default: all)")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="seconds shared by the si, bank and append checks (default 30)")
    parser.add_argument("--seed", type=int, help="repeat a run's random choices")
    parser.add_argument("--prefix", help="table name prefix (default conformance_<random>); "
                        "no table with it may exist")
    parser.add_argument("--keep", action="store_true", help="keep the tables (to inspect)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    args = parser.parse_args(argv)
    try:
        checks = parse_checks(args.checks)
        connection = connection_from_arguments(args)
        report = run(connection, checks=checks, duration=args.duration, seed=args.seed,
                     prefix=args.prefix, keep=args.keep,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    except PercolatorError as e:
        print(f"conformance: cannot run against {args.cluster}: {type(e).__name__}: {e}",
              file=sys.stderr)
        if isinstance(e, StoreUnavailable):
            print(f"  likely cause: {ERROR_HINT}", file=sys.stderr)
        return 2
    print(report.format())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
