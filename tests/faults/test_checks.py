"""The nemesis checkers (tests/faults/_checks.py) find what they claim to: each anomaly
on a hand-made history that contains it, and nothing on a clean one. Without this a
run reporting "anomalies: 0" would prove nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.faults._checks import (
    Report,
    check_append,
    check_bank,
    check_observers,
    check_timestamps,
    count,
    load,
)
from tests.faults._workload import ACCOUNTS, INITIAL, LIST_KEYS, OBS_ROWS


class History:
    """Writes history files the way the workload processes do."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.t = 1000.0

    def op(self, stream: str, op_id: str, status: str | None, invoke: dict[str, Any],
           done: dict[str, Any]) -> None:
        with open(self.directory / f"{stream}.jsonl", "a") as f:
            self.t += 1
            f.write(json.dumps({"type": "invoke", "id": op_id, "t": self.t, **invoke}) + "\n")
            if status is not None:
                self.t += 1
                f.write(json.dumps({"type": status, "id": op_id, "t": self.t, **done}) + "\n")


def final_state(**changes: Any) -> dict[str, Any]:
    state: dict[str, Any] = {
        "accounts": [INITIAL] * ACCOUNTS, "transfers": [],
        "lists": {f"k{i}": [] for i in range(LIST_KEYS)},
        "obs_in": {f"r{i}": "" for i in range(OBS_ROWS)},
        "obs_out": {f"r{i}": "" for i in range(OBS_ROWS)}, "obslog": [],
    }
    state.update(changes)
    return state


def transfer(h: History, op_id: str, status: str | None, src: int = 0, dst: int = 1,
             amount: int = 5, ts: tuple[int, int] = (1, 2)) -> None:
    h.op("c1-bank", op_id, status, {"kind": "transfer", "src": src, "dst": dst,
                                    "amount": amount},
         {"start_ts": ts[0], "commit_ts": ts[1]})


def moved(amount: int = 5) -> list[int]:
    return [INITIAL - amount, INITIAL + amount] + [INITIAL] * (ACCOUNTS - 2)


def run_bank(tmp_path: Path, final: dict[str, Any]) -> set[str]:
    report = Report()
    check_bank(load(tmp_path), final, report)
    return set(report.anomalies)


def test_clean_bank_history(tmp_path: Path) -> None:
    h = History(tmp_path)
    transfer(h, "a", "ok")
    transfer(h, "b", "fail")
    transfer(h, "c", None)  # killed: may or may not have committed; here it did not
    h.op("c1-bank", "r", "ok", {"kind": "read"}, {"result": ACCOUNTS * INITIAL})
    assert run_bank(tmp_path, final_state(accounts=moved(), transfers=["a"])) == set()
    report = Report()
    count(load(tmp_path), report)
    assert dict(report.counts["bank"]) == {"attempted": 4, "ok": 2, "fail": 1, "info": 1}


@pytest.mark.parametrize(("status", "present", "accounts", "expected"), [
    ("ok", [], [INITIAL] * ACCOUNTS, "bank-lost-transfer"),
    ("fail", ["a"], moved(), "bank-failed-transfer-applied"),
    ("ok", ["a"], [INITIAL] * ACCOUNTS, "bank-balances"),
    ("ok", ["a"], [*moved()[:-1], INITIAL + 1], "bank-final-total"),
])
def test_bank_anomalies(tmp_path: Path, status: str, present: list[str],
                        accounts: list[int], expected: str) -> None:
    transfer(History(tmp_path), "a", status)
    assert expected in run_bank(tmp_path, final_state(accounts=accounts, transfers=present))


def test_a_read_of_a_wrong_total(tmp_path: Path) -> None:
    History(tmp_path).op("c1-bank", "r", "ok", {"kind": "read"},
                         {"result": ACCOUNTS * INITIAL - 1})
    assert run_bank(tmp_path, final_state()) == {"bank-read-total"}


def append_op(h: History, op_id: str, status: str | None, ops: list[list[Any]]) -> None:
    h.op("c1-append", op_id, status,
         {"kind": "txn", "appends": [o for o in ops if o[0] == "append"]}, {"result": ops})


def test_append_checks(tmp_path: Path) -> None:
    h = History(tmp_path)
    append_op(h, "a", "ok", [["append", "k0", "x1"]])
    append_op(h, "b", "fail", [["append", "k0", "x2"]])
    report = Report()
    check_append(load(tmp_path), final_state(lists={"k0": ["x1"]}), report)
    assert report.anomalies == {}
    # the failed append visible in the final read: an aborted read (G1a); the
    # acknowledged one missing: a lost append
    report = Report()
    check_append(load(tmp_path), final_state(lists={"k0": ["x2"]}), report)
    assert {"elle-G1a", "append-lost"} <= set(report.anomalies)


def ts_op(h: History, stream: str, op_id: str, value: int) -> None:
    h.op(stream, op_id, "ok", {}, {"ts": value})


@pytest.mark.parametrize(("values", "expected"), [
    ({"side-ts0": [1, 2], "side-ts1": [3, 4]}, set()),
    ({"side-ts0": [1, 2], "side-ts1": [2, 5]}, {"timestamp-reissued", "timestamp-real-time"}),
    ({"side-ts0": [5, 4]}, {"timestamp-backwards", "timestamp-real-time"}),
    # in real time: side-ts0's ops all end before side-ts1's begin
    ({"side-ts0": [10, 11], "side-ts1": [7]}, {"timestamp-real-time"}),
])
def test_timestamp_checks(tmp_path: Path, values: dict[str, list[int]],
                          expected: set[str]) -> None:
    h = History(tmp_path)
    for stream, series in values.items():
        for i, value in enumerate(series):
            ts_op(h, stream, f"{stream}-{i}", value)
    report = Report()
    check_timestamps(load(tmp_path), report, [], 1.0)
    assert set(report.anomalies) == expected


def test_an_isolated_leader_serving_after_its_lease(tmp_path: Path) -> None:
    h = History(tmp_path)
    for i in range(6):
        ts_op(h, "side-ts0", f"t{i}", i + 1)  # invoked at 1001, 1003, ... 1011
    report = Report()
    check_timestamps(load(tmp_path), report, [("side-ts0", 1000.0, 1020.0)], 1.0)
    assert len(report.anomalies["isolated-leader-served"]) == 6 - 1  # all but the first
    # a call begun during the isolation but answered after the heal (a replica elected
    # again) proves nothing
    report = Report()
    check_timestamps(load(tmp_path), report, [("side-ts0", 1000.0, 1011.5)], 1.0)
    assert len(report.anomalies["isolated-leader-served"]) == 6 - 2
    report = Report()
    check_timestamps(load(tmp_path), report, [("side-ts1", 1000.0, 1020.0)], 1.0)
    assert report.anomalies == {}


def test_observer_checks(tmp_path: Path) -> None:
    h = History(tmp_path)
    h.op("c1-obs", "v1", "ok", {"kind": "change", "row": "r0"}, {})
    h.op("c1-obs", "v2", "fail", {"kind": "change", "row": "r1"}, {})
    clean = final_state(obs_in={"r0": "v1"}, obs_out={"r0": "v1"}, obslog=["r0/v1/7"])
    report = Report()
    check_observers(load(tmp_path), clean, report)
    assert report.anomalies == {}
    bad = final_state(obs_in={"r0": "v1", "r1": "v2"}, obs_out={"r0": "", "r1": "v2"},
                      obslog=["r0/v1/7", "r0/v1/9", "r1/v2/8"])
    report = Report()
    check_observers(load(tmp_path), bad, report)
    assert set(report.anomalies) == {"observer-twice", "observer-saw-failed-change",
                                     "lost-notification"}


def test_a_schedule_is_replayed_from_its_seed() -> None:
    """The same seed gives the same faults (PERCOLATOR_NEMESIS_SEED replays a run);
    every pause outlasts the session timeouts and the lock TTL."""
    from tests.faults._cluster import Settings
    from tests.faults._nemesis import OBSERVER_SESSION, schedule

    settings = Settings()
    first = schedule(42, 600.0, settings)
    assert first == schedule(42, 600.0, settings) != schedule(43, 600.0, settings)
    assert {f.kind for f in first} == {"partition", "isolate-leader", "pause", "kill"}
    longest = max(settings.client_session, settings.lock_ttl, settings.oracle_session)
    for fault in first:
        if fault.kind == "pause":
            floor = OBSERVER_SESSION if fault.target.startswith("observer:") else longest
            assert fault.duration > floor, fault
    ends = [f.at + f.duration for f in first]
    assert all(end < nxt.at for end, nxt in zip(ends, first[1:], strict=False))
