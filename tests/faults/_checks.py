"""Checkers of the nemesis suite: read the histories the workload processes wrote
(``tests/faults/_workload.py``) and the final state of the store, and find anomalies.

* **bank**: every committed read saw the initial total; the final balances are the
  initial ones moved by exactly the transfers recorded in the final state (a transfer
  and its balances commit together); every acknowledged transfer is there, no failed
  one is.
* **list-append**: the Elle-style checker of ``percolator/conformance/_elle.py`` on every
  transaction (committed with what it read; failed and indeterminate with their
  appends) plus the final read of every list; every acknowledged append is in its list.
* **timestamps**: no timestamp is handed out twice (start and commit timestamps of
  every transaction, and those the side client got from each replica); each client
  thread's timestamps go up; real time is respected (a timestamp obtained after
  another was received is larger); an oracle cut off from ZooKeeper serves nothing
  once its lease (half its session timeout) has run out.
* **observers**: every observed row's output matches its input after the heal (no lost
  notification); at most one committed observer transaction per change; none for a
  change that failed.

The :class:`Report` counts operations attempted, acknowledged, failed and
indeterminate (``info``, or no answer: the process was killed), per workload, and the
throughput of acknowledged operations with and without a fault in progress.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from percolator.conformance._elle import Txn, check
from tests.faults._workload import ACCOUNTS, INITIAL

Record = dict[str, Any]


@dataclass
class Op:
    stream: str  # the history file (one thread of one node)
    invoke: Record
    done: Record | None = None

    @property
    def status(self) -> str:
        return self.done["type"] if self.done is not None else "info"

    @property
    def timestamps(self) -> list[int]:
        """The timestamps this operation obtained, in the order it obtained them."""
        if self.done is None:
            return []
        if "ts" in self.done:
            return [self.done["ts"]]
        found = [self.done.get("start_ts"), self.done.get("commit_ts")]
        values = [v for v in found if v is not None]
        # a read-only transaction "commits" at its start timestamp: one timestamp
        return values[:1] if len(values) == 2 and values[0] == values[1] else values


@dataclass
class Report:
    counts: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    anomalies: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, kind: str, detail: str) -> None:
        self.anomalies.setdefault(kind, []).append(detail)

    def summary(self) -> str:
        lines = [f"{'workload':10} {'attempted':>9} {'ok':>7} {'failed':>7} {'indet.':>7}"]
        total: Counter[str] = Counter()
        for kind, c in sorted(self.counts.items()):
            total.update(c)
            lines.append(f"{kind:10} {c['attempted']:9} {c['ok']:7} {c['fail']:7} "
                         f"{c['info']:7}")
        lines.append(f"{'total':10} {total['attempted']:9} {total['ok']:7} {total['fail']:7} "
                     f"{total['info']:7}")
        lines += self.notes
        n = sum(len(v) for v in self.anomalies.values())
        lines.append(f"anomalies: {n}")
        for kind, details in sorted(self.anomalies.items()):
            lines.append(f"  {kind}: {len(details)}")
            lines += [f"    {d}" for d in details[:5]]
        return "\n".join(lines)


def load(directory: Path) -> dict[str, list[Op]]:
    """The operations of every history file, by file stem, in invocation order."""
    streams: dict[str, list[Op]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        ops: dict[str, Op] = {}
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by kill -9
            if record["type"] == "invoke":
                ops[record["id"]] = Op(path.stem, record)
            elif record["id"] in ops:
                ops[record["id"]].done = record
        streams[path.stem] = list(ops.values())
    return streams


def _kind(stream: str) -> str:
    return stream.partition("-")[2].rstrip("0123456789")


def count(streams: dict[str, list[Op]], report: Report) -> None:
    for stream, ops in streams.items():
        c = report.counts[_kind(stream)]
        for op in ops:
            c["attempted"] += 1
            c[op.status] += 1


def check_bank(streams: dict[str, list[Op]], final: dict[str, Any], report: Report) -> None:
    expected = ACCOUNTS * INITIAL
    present = set(final["transfers"])
    balances = [INITIAL] * ACCOUNTS
    seen: set[str] = set()
    for stream, ops in streams.items():
        if _kind(stream) != "bank":
            continue
        for op in ops:
            inv, status = op.invoke, op.status
            if inv["kind"] == "read":
                if status == "ok" and op.done is not None and op.done["result"] != expected:
                    report.add("bank-read-total", f"{inv['id']} read a total of "
                               f"{op.done['result']}, not {expected}")
                continue
            seen.add(inv["id"])
            if inv["id"] in present:
                balances[inv["src"]] -= inv["amount"]
                balances[inv["dst"]] += inv["amount"]
            if status == "ok" and inv["id"] not in present:
                report.add("bank-lost-transfer", f"acknowledged {inv['id']} is not in the "
                           "final state")
            if status == "fail" and inv["id"] in present:
                report.add("bank-failed-transfer-applied", f"{inv['id']} failed "
                           f"({op.done and op.done.get('error')}) but is in the final state")
    for tid in present - seen:
        report.add("bank-unknown-transfer", f"{tid} was never attempted")
    if sum(final["accounts"]) != expected:
        report.add("bank-final-total", f"final total {sum(final['accounts'])}, not {expected}")
    if balances != final["accounts"]:
        report.add("bank-balances", f"final balances {final['accounts']} are not those of "
                   f"the transfers recorded with them {balances}")


def check_append(streams: dict[str, list[Op]], final: dict[str, Any], report: Report) -> None:
    history: list[Txn] = []
    acknowledged: list[tuple[str, str]] = []
    for stream, ops in streams.items():
        if _kind(stream) != "append":
            continue
        for op in ops:
            appends = [tuple(a) for a in op.invoke["appends"]]
            if op.status == "ok" and op.done is not None:
                micro = [tuple(o) for o in op.done["result"]]
                history.append(Txn(micro, "ok"))
                acknowledged += [(k, v) for o, k, v in micro if o == "append"]
            else:
                history.append(Txn(appends, op.status))
    history.append(Txn([("r", key, values) for key, values in final["lists"].items()], "ok"))
    elle = check(history)
    for kind, details in elle.anomalies.items():
        for detail in details:
            report.add(f"elle-{kind}", detail)
    for key, value in acknowledged:
        if value not in final["lists"].get(key, []):
            report.add("append-lost", f"acknowledged append {value} to {key} is missing")
    report.notes.append(f"list-append: {len(history)} transactions, {elle.edges} "
                        "dependency edges checked by percolator/conformance/_elle.py")


def check_timestamps(streams: dict[str, list[Op]], report: Report,
                     isolations: list[tuple[str, float, float]], lease: float) -> None:
    """*isolations*: (the side stream of the isolated replica, from, to) wall times."""
    owner: dict[int, str] = {}
    events: list[tuple[float, int, int, str]] = []  # (time, 0 done / 1 invoke, value, id)
    for stream, ops in streams.items():
        last = 0
        for op in ops:
            values = op.timestamps
            for value in values:
                if value in owner:
                    report.add("timestamp-reissued", f"{value} went to {owner[value]} and "
                               f"{op.invoke['id']}")
                owner[value] = op.invoke["id"]
                if value <= last:
                    report.add("timestamp-backwards", f"{stream}: {value} after {last} "
                               f"({op.invoke['id']})")
                last = max(last, value)
            if values and op.done is not None:
                events.append((op.invoke["t"], 1, min(values), op.invoke["id"]))
                events.append((op.done["t"], 0, max(values), op.invoke["id"]))
    # real time: whatever was received before an operation began is below all it gets
    events.sort()
    received, by = 0, ""
    for _, what, value, op_id in events:
        if what == 0:
            if value > received:
                received, by = value, op_id
        elif value <= received:
            report.add("timestamp-real-time", f"{op_id} got {value} after {by} had "
                       f"received {received}")
    # Served while isolated, past its lease: only an answer whose whole call (from
    # invoke to answer) lies inside that span proves it. A call begun during the
    # isolation may be answered after the heal, by a replica elected again: the
    # client keeps trying until its deadline.
    for stream, start, end in isolations:
        for op in streams.get(stream, []):
            if op.status != "ok" or op.done is None:
                continue
            began, answered = op.invoke["t"], op.done["t"]
            if start + lease + 0.5 < began and answered < end:
                report.add("isolated-leader-served", f"{op.invoke['id']} got a timestamp "
                           f"{began - start:.1f}s into the isolation of its oracle "
                           f"(lease {lease:g}s)")
    report.notes.append(f"timestamps: {len(owner)} distinct timestamps checked")


def check_observers(streams: dict[str, list[Op]], final: dict[str, Any],
                    report: Report) -> None:
    status: dict[str, str] = {}
    for stream, ops in streams.items():
        if _kind(stream) == "obs":
            for op in ops:
                status[op.invoke["id"]] = op.status
    runs: Counter[tuple[str, str]] = Counter()
    for key in final["obslog"]:
        row, value, _start_ts = key.split("/")
        runs[(row, value)] += 1
    for (row, value), n in runs.items():
        if n > 1:
            report.add("observer-twice", f"{n} committed observer transactions for change "
                       f"{value} of {row}")
        if status.get(value) == "fail":
            report.add("observer-saw-failed-change", f"{value} of {row} failed, yet an "
                       "observer processed it")
    for row, value in final["obs_in"].items():
        if final["obs_out"].get(row) != value:
            report.add("lost-notification", f"{row}: input {value!r} but output "
                       f"{final['obs_out'].get(row)!r} after the heal")
    changes = sum(s in ("ok", "info") for s in status.values())
    report.notes.append(f"observers: {sum(runs.values())} committed observer transactions "
                        f"for {len(runs)} distinct changes, of {changes} changes that "
                        "committed or may have (changes collapse)")


def throughput(streams: dict[str, list[Op]], windows: list[tuple[float, float]],
               begin: float, end: float, report: Report) -> None:
    """Acknowledged operations per second, with a fault in progress and without."""
    inside = outside = 0
    for stream, ops in streams.items():
        if _kind(stream) not in ("bank", "append", "obs"):
            continue
        for op in ops:
            if op.status != "ok" or op.done is None or not begin <= op.done["t"] <= end:
                continue
            if any(a <= op.done["t"] <= b for a, b in windows):
                inside += 1
            else:
                outside += 1
    faulty = sum(min(b, end) - max(a, begin) for a, b in windows if b > begin and a < end)
    quiet = (end - begin) - faulty
    report.notes.append(
        f"throughput: {inside / faulty if faulty > 0 else 0:.1f} ops/s during faults "
        f"({faulty:.0f}s), {outside / quiet if quiet > 0 else 0:.1f} ops/s without "
        f"({quiet:.0f}s)")


def longest(streams: dict[str, list[Op]], report: Report) -> None:
    """Note the longest answered operation of each workload (nothing hangs: every
    call has a deadline; an unanswered one belongs to a killed process)."""
    worst: dict[str, tuple[float, str]] = {}
    for stream, ops in streams.items():
        kind = _kind(stream)
        for op in ops:
            if op.done is not None:
                took = op.done["t"] - op.invoke["t"]
                if took > worst.get(kind, (-1.0, ""))[0]:
                    worst[kind] = (took, op.invoke["id"])
    report.notes.append("longest answered operation: " + ", ".join(
        f"{kind} {took:.1f}s" for kind, (took, _) in sorted(worst.items())))


def check_run(directory: Path) -> Report:
    """Every check on a run kept in *directory*: its histories, ``final.json`` (the
    final state) and ``run.json`` (the faults applied, wall times, the oracle lease)."""
    streams = load(directory)
    final = json.loads((directory / "final.json").read_text())
    run = json.loads((directory / "run.json").read_text())
    report = Report()
    count(streams, report)
    side_stream = {"or1": "side-ts0", "or2": "side-ts1"}
    isolations = [(side_stream[a["target"]], a["start"], a["end"]) for a in run["applied"]
                  if a["kind"] == "isolate-leader" and a["target"] in side_stream]
    check_bank(streams, final, report)
    check_append(streams, final, report)
    check_timestamps(streams, report, isolations, run["lease"])
    check_observers(streams, final, report)
    throughput(streams, [(a["start"], a["end"]) for a in run["applied"]], run["from"],
               run["to"], report)
    longest(streams, report)
    return report


if __name__ == "__main__":
    import sys

    print(check_run(Path(sys.argv[1])).summary())
