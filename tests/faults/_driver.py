"""One-shot client programs of the targeted fault tests (``test_must_hold.py``), run
inside a client node of a :class:`tests.faults._cluster.FaultCluster`.

Usage::

    python -m tests.faults._driver hold --config JSON --out FILE --hold pause|wait
    python -m tests.faults._driver read --config JSON --out FILE
    python -m tests.faults._driver call --config JSON --out FILE --call begin|get|commit

``hold`` writes two cells (``held/<prefix>a`` primary, ``held/<prefix>b`` secondary) and stops right
before the commit point, after the prewrite: it writes ``<out>.held`` (its start
timestamp and ZooKeeper session) and then either SIGSTOPs itself (``pause``: a GC
pause; the test sends SIGCONT) or waits for the file ``<out>.go`` (``wait``: the test
cuts the network first). Then it carries on with the commit and writes the outcome:
``{"outcome": "committed", "commit_ts": N}`` or the error's class and message. The
wrapper is test code around the library's own ``commit_point``; nothing of the
library is changed.

``read`` reads both cells in one transaction (resolving any lock it meets) and writes
what it saw. ``call`` makes one client call and writes its outcome and how long it took.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import percolator
from percolator import _commit
from percolator._internals import internals
from tests.faults._workload import connect


def write(path: str, record: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(record))
    tmp.rename(path)


def hold(config: dict[str, Any], out: str, mode: str, value: str, prefix: str) -> None:
    cluster = connect(config)
    original = _commit.TwoPhaseCommit.commit_point

    def held_commit_point(self: _commit.TwoPhaseCommit, commit_ts: int) -> None:
        zk = getattr(internals(cluster).coordination, "_zk", None)
        write(out + ".held", {"start_ts": self.start_ts, "commit_ts": commit_ts,
                              "owner": self.owner,
                              "session": zk.client_id[0] if zk is not None and
                              zk.client_id else None})
        if mode == "pause":
            os.kill(os.getpid(), signal.SIGSTOP)  # every thread stops here, as in a GC pause
        else:
            while not os.path.exists(out + ".go"):
                time.sleep(0.05)
        original(self, commit_ts)

    _commit.TwoPhaseCommit.commit_point = held_commit_point  # type: ignore[method-assign]
    txn = percolator.Transaction(cluster)
    txn.set("held", f"{prefix}a".encode(), "c:v", value.encode())
    txn.set("held", f"{prefix}b".encode(), "c:v", value.encode())
    began = time.monotonic()
    try:
        txn.commit()
        result: dict[str, Any] = {"outcome": "committed", "commit_ts": txn.commit_ts}
    except Exception as e:
        result = {"outcome": type(e).__name__, "message": str(e)[:500]}
    result["start_ts"] = txn.start_ts
    result["elapsed"] = time.monotonic() - began
    write(out, result)
    os._exit(0)


def read(config: dict[str, Any], out: str, prefix: str) -> None:
    with connect(config) as cluster, percolator.Transaction(cluster) as txn:
        seen = {row: (txn.get("held", f"{prefix}{row}".encode(), "c:v") or b"").decode()
                for row in ("a", "b")}
        write(out, {"start_ts": txn.start_ts, **seen})


def call(config: dict[str, Any], out: str, which: str, go: str) -> None:
    """Connect, signal readiness (``<out>.ready``), wait for *go*, make one call."""
    cluster = connect(config)
    txn = percolator.Transaction(cluster) if which != "begin" else None
    if txn is not None and which == "commit":
        txn.set("held", b"c", "c:v", b"x")
    write(out + ".ready", {})
    while not os.path.exists(go):
        time.sleep(0.05)
    began = time.monotonic()
    try:
        if which == "begin":
            percolator.Transaction(cluster)
        elif which == "get":
            assert txn is not None
            txn.get("held", b"c", "c:v")
        else:
            assert txn is not None
            txn.commit()
        outcome = "returned"
    except Exception as e:
        outcome = type(e).__name__
    write(out, {"outcome": outcome, "elapsed": time.monotonic() - began})
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.faults._driver")
    p.add_argument("command", choices=["hold", "read", "call"])
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--hold", default="wait", choices=["pause", "wait"])
    p.add_argument("--value", default="v1")
    p.add_argument("--call", default="get", choices=["begin", "get", "commit"])
    p.add_argument("--go", default="")
    p.add_argument("--prefix", default="", help="row keys are PREFIXa and PREFIXb")
    args = p.parse_args(argv)
    config = json.loads(args.config)
    if args.command == "hold":
        hold(config, args.out, args.hold, args.value, args.prefix)
    elif args.command == "read":
        read(config, args.out, args.prefix)
    else:
        call(config, args.out, args.call, args.go)


if __name__ == "__main__":
    main()
