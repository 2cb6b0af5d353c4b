"""Workload processes of the nemesis suite, run inside the client nodes of a
:class:`tests.faults._netns.Network`.

Usage::

    python -m tests.faults._workload setup  --config JSON
    python -m tests.faults._workload run    --config JSON --node NAME --kinds bank,append,obs
    python -m tests.faults._workload ts     --config JSON --node NAME --target grpc://H:P ...
    python -m tests.faults._workload final  --config JSON --out FILE

Every operation writes two JSON lines to ``<dir>/<node>-<kind>.jsonl`` (flushed at
once, so a kill -9 loses nothing that happened): ``{"type": "invoke", "id": ...}``
before it starts and ``{"type": "ok" | "fail" | "info", "id": ...}`` when it ends. An
invoke with no completion (the process was killed) counts as ``info``: it may or may
not have committed. ``info`` is also what a :class:`CommitUnknownError`, or an error
the library does not document as definite, gives. Workers stop when the file
``<dir>/stop`` exists.

The observer of the ``obs`` workload (:data:`OBSERVERS`, run by ``python -m
observers``) logs every committed run in table ``obslog`` keyed by the change it saw,
so the checker counts observer commits per change from the store itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any

import percolator
from observers import Observer
from percolator import TransactionBase
from percolator.conformance._append import classify, list_ops

ACCOUNTS = 8
INITIAL = 100
LIST_KEYS = 5
#: Every KEY_EPOCH seconds of wall time the list-append workload moves to LIST_KEYS new
#: keys (shared by all workers: one clock), as Elle's workloads retire keys: lists stay
#: short, so reads (each recorded whole) and values do not grow with the run's length.
KEY_EPOCH = 15.0
OBS_ROWS = 6
#: Pause between two operations of one thread: the machine is shared, the point is
#: interleavings under faults, not load.
THINK = float(os.environ.get("PERCOLATOR_NEMESIS_THINK", "0.02"))

def account(i: int) -> bytes:
    return b"acct%02d" % i


class Copier(Observer):
    """obs/in:v -> obs/out:v, logging each committed run under the change it saw."""

    table, column = "obs", "in:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        value = txn.get(self.table, row, column) or b"-"
        txn.set("obslog", b"/".join((row, value, str(txn.start_ts).encode())), "log:seen", value)
        txn.set(self.table, row, "out:v", value)


OBSERVERS = [Copier]


def connect(config: dict[str, Any]) -> percolator.Cluster:
    return percolator.connect(
        config["store"], oracle=config["oracle"], zookeeper=config["zookeeper"],
        oracle_deadline=config["deadline"], lock_ttl=config["lock_ttl"],
        zookeeper_session_timeout=config["session_timeout"],
    )


class Recorder:
    """One thread's history file (JSON lines, written through at once)."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - lives with the thread

    def write(self, record: dict[str, Any]) -> None:
        record["t"] = time.time()
        self._file.write(json.dumps(record) + "\n")


def run_op(rec: Recorder, op_id: str, kind: str, body: Any, cluster: percolator.Cluster,
           **fields: Any) -> None:
    """Invoke, run *body(txn)* in a transaction, commit, complete."""
    rec.write({"type": "invoke", "id": op_id, "kind": kind, **fields})
    start_ts = commit_ts = None
    try:
        txn = percolator.Transaction(cluster)
        start_ts = txn.start_ts
        result = body(txn)
        txn.commit()
        commit_ts = txn.commit_ts
    except BaseException as e:
        rec.write({"type": classify(e), "id": op_id, "kind": kind, "error": type(e).__name__,
                   "message": str(e)[:300], "start_ts": start_ts})
        if not isinstance(e, Exception):
            raise
        return
    rec.write({"type": "ok", "id": op_id, "kind": kind, "start_ts": start_ts,
               "commit_ts": commit_ts, "result": result})


def read_all(txn: TransactionBase) -> int:
    return sum(int(txn.get("accounts", account(i), "bal:v") or b"0") for i in range(ACCOUNTS))


def transfer(txn: TransactionBase, tid: str, src: int, dst: int, amount: int) -> None:
    a = int(txn.get("accounts", account(src), "bal:v") or b"0")
    b = int(txn.get("accounts", account(dst), "bal:v") or b"0")
    txn.set("accounts", account(src), "bal:v", str(a - amount).encode())
    txn.set("accounts", account(dst), "bal:v", str(b + amount).encode())
    txn.set("transfers", tid.encode(), "t:move", f"{src} {dst} {amount}".encode())


def change(txn: TransactionBase, row: str, value: str) -> None:
    txn.set("obs", row.encode(), "in:v", value.encode())


def _op_ids(node: str, kind: str, stop: Path) -> Iterator[str]:
    """Operation ids ``node-kind-pid-seq``, one per step, until the stop file appears."""
    seq = 0
    while not stop.exists():
        seq += 1
        yield f"{node}-{kind}-{os.getpid()}-{seq}"


def bank(cluster: percolator.Cluster, rec: Recorder, node: str, seed: int, stop: Path) -> None:
    rng = random.Random(seed)
    for op_id in _op_ids(node, "bank", stop):
        if rng.random() < 0.3:
            run_op(rec, op_id, "read", read_all, cluster)
        else:
            src, dst = rng.sample(range(ACCOUNTS), 2)
            amount = rng.randint(1, 20)
            run_op(rec, op_id, "transfer", partial(transfer, tid=op_id, src=src, dst=dst,
                                                   amount=amount),
                   cluster, src=src, dst=dst, amount=amount)
        time.sleep(THINK)


def append(cluster: percolator.Cluster, rec: Recorder, node: str, seed: int, stop: Path) -> None:
    rng = random.Random(seed)
    for op_id in _op_ids(node, "append", stop):
        epoch = int(time.time() // KEY_EPOCH)
        plan = [(rng.random() < 0.5, f"k{epoch}-{rng.randrange(LIST_KEYS)}")
                for _ in range(rng.randint(1, 3))]
        # the appended values are decided before the invoke record, so an unanswered
        # operation's appends are known to the checker
        values = {i: f"{op_id}.{i}" for i, (is_read, _) in enumerate(plan) if not is_read}
        run_op(rec, op_id, "txn", partial(list_ops, table="lists", plan=plan, values=values),
               cluster, appends=[["append", plan[i][1], v] for i, v in values.items()])
        time.sleep(THINK)


def obs(cluster: percolator.Cluster, rec: Recorder, node: str, seed: int, stop: Path) -> None:
    rng = random.Random(seed)
    for op_id in _op_ids(node, "obs", stop):
        row = f"r{rng.randrange(OBS_ROWS)}"
        run_op(rec, op_id, "change", partial(change, row=row, value=op_id), cluster, row=row)
        time.sleep(THINK * 5)


KINDS = {"bank": bank, "append": append, "obs": obs}


def setup(config: dict[str, Any]) -> None:
    with connect(config) as cluster:
        for table in ("accounts", "transfers", "lists", "obs", "obslog", "held"):
            cluster.create_table(table)
        cluster.observe("obs", "in:v")
        with percolator.Transaction(cluster) as txn:
            for i in range(ACCOUNTS):
                txn.set("accounts", account(i), "bal:v", str(INITIAL).encode())


def run(config: dict[str, Any], node: str, kinds: list[str], seed: int) -> None:
    directory = Path(config["dir"])
    stop = directory / "stop"
    cluster = connect(config)
    threads = []
    for k, kind in enumerate(kinds):
        rec = Recorder(directory / f"{node}-{kind}.jsonl")
        threads.append(threading.Thread(
            target=KINDS[kind], args=(cluster, rec, node, seed * 100 + k, stop),
            name=kind, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Exits without closing: a clean close is not what the test is about, and a close
    # that waits for an unreachable ZooKeeper would only delay the stop.
    os._exit(0)


def ts(config: dict[str, Any], node: str, targets: list[str]) -> None:
    """Record the timestamps each of *targets* (a client per target) hands out, in order."""
    from oracle import OracleClient

    directory = Path(config["dir"])
    stop = directory / "stop"

    def record(index: int, target: str) -> None:
        rec = Recorder(directory / f"{node}-ts{index}.jsonl")
        client = OracleClient(target, deadline=config["deadline"])
        for op_id in _op_ids(node, f"ts{index}", stop):
            rec.write({"type": "invoke", "id": op_id, "target": target})
            try:
                value = client.get_timestamp()
            except Exception as e:
                rec.write({"type": "fail", "id": op_id, "error": type(e).__name__,
                           "message": str(e)[:200]})
                time.sleep(0.2)
                continue
            rec.write({"type": "ok", "id": op_id, "ts": value})
            time.sleep(THINK)

    threads = [threading.Thread(target=record, args=(i, t), daemon=True)
               for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os._exit(0)


def final(config: dict[str, Any], out: str) -> None:
    """Read every table at one snapshot; write it as JSON to *out*."""
    with connect(config) as cluster, percolator.Transaction(cluster) as txn:
        state = {
            "start_ts": txn.start_ts,
            "accounts": [int(txn.get("accounts", account(i), "bal:v") or b"0")
                         for i in range(ACCOUNTS)],
            "transfers": [row.decode() for row, _ in txn.scan("transfers", columns=["t:move"])],
            "lists": {row.decode(): json.loads(cells["l:v"])
                      for row, cells in txn.scan("lists", columns=["l:v"])},
            "obs_in": {f"r{i}": (txn.get("obs", f"r{i}".encode(), "in:v") or b"").decode()
                       for i in range(OBS_ROWS)},
            "obs_out": {f"r{i}": (txn.get("obs", f"r{i}".encode(), "out:v") or b"").decode()
                        for i in range(OBS_ROWS)},
            "obslog": [row.decode() for row, _ in txn.scan("obslog", columns=["log:seen"])],
        }
    Path(out).write_text(json.dumps(state))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.faults._workload")
    p.add_argument("command", choices=["setup", "run", "ts", "final"])
    p.add_argument("--config", required=True, help="JSON: store, oracle, zookeeper, dir...")
    p.add_argument("--node", default="client")
    p.add_argument("--kinds", default="bank,append,obs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", action="append", default=[])
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    config = json.loads(args.config)
    if args.command == "setup":
        setup(config)
    elif args.command == "run":
        run(config, args.node, args.kinds.split(","), args.seed)
    elif args.command == "ts":
        ts(config, args.node, args.target)
    else:
        final(config, args.out)


if __name__ == "__main__":
    main()
