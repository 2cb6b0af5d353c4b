"""A single oracle with its ceiling in a local file: order, durability, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import pytest

import oracle
from oracle import MAX_COUNT, OracleClient, OracleStatus
from oracle._proto import timestamp_oracle_pb2 as pb
from oracle._proto import timestamp_oracle_pb2_grpc as pb_grpc
from percolator._errors import InvalidArgument, OracleUnavailable
from tests._concurrency import run_concurrently
from tests._services import free_port
from tests.oracle.conftest import ROOT, Oracles, check_history, read_history

pytestmark = pytest.mark.oracle


def test_exports_sorted_and_complete() -> None:
    assert oracle.__all__ == sorted(oracle.__all__)
    for name in oracle.__all__:
        assert hasattr(oracle, name), name
    public = {n for n in vars(oracle) if not n.startswith("_") and n != "annotations"}
    assert public <= set(oracle.__all__)


def test_uniqueness_and_strict_order_4_processes_x_8_threads(
    oracles: Oracles, tmp_path: object
) -> None:
    server = oracles.start("--state-file", os.path.join(str(tmp_path), "ceiling"))
    server.wait_serving()
    outs = [os.path.join(str(tmp_path), f"w{i}.txt") for i in range(4)]
    workers = [
        oracles.worker(f"grpc://{server.address}", out, threads=8, count=250) for out in outs
    ]
    for w in workers:
        assert w.wait(120) == 0
    calls = read_history(outs)
    assert len(calls) == 4 * 8 * 250
    check_history(calls)
    with server.status_client() as c:
        st = c.status()
    assert st.leader and st.mode == "file"
    assert st.served == len(calls)
    assert st.persisted_ceiling >= max(c[3] for c in calls)
    # Batching happened: fewer allocations than calls are possible, never more.
    assert st.allocations <= st.requests <= len(calls)


def test_restart_and_kill9_during_load_reissue_nothing(oracles: Oracles, tmp_path: object) -> None:
    state = os.path.join(str(tmp_path), "ceiling")
    args = ("--state-file", state, "--block-size", "500")
    server = oracles.start(*args)
    server.wait_serving()
    stop = os.path.join(str(tmp_path), "stop")
    outs = [os.path.join(str(tmp_path), f"w{i}.txt") for i in range(2)]
    target = f"grpc://{server.address}"
    workers = [oracles.worker(target, out, threads=4, stop=stop) for out in outs]
    time.sleep(1.0)
    server.terminate()  # graceful restart
    server = oracles.start(*args, port=server.port)
    server.wait_serving()
    time.sleep(1.0)
    server.kill()  # crash
    with open(state) as f:
        ceiling_at_crash = int(f.read())
    server = oracles.start(*args, port=server.port)
    server.wait_serving()
    with server.status_client() as c:
        first_after = c.get_timestamp()
    assert first_after > ceiling_at_crash
    time.sleep(1.0)
    server.kill()
    server = oracles.start(*args, port=server.port)
    server.wait_serving()
    time.sleep(0.5)
    open(stop, "w").close()
    for w in workers:
        assert w.wait(60) == 0
    calls = read_history(outs)
    check_history(calls)
    # Load went on across the restarts: timestamps from at least three server lives.
    assert max(c[3] for c in calls) > ceiling_at_crash


def test_concurrent_callers_share_rpcs(oracles: Oracles, tmp_path: object) -> None:
    """16 threads calling get_timestamp() in a loop: each RPC carries (nearly) all of them.

    Counted by the server (timestamps served against GetTimestamps calls), not timed. One
    RPC is out at a time, and it counts as out until its block has been handed to all its
    callers, so a caller served by one RPC that calls again joins the next one. (When the
    caller that had sent an RPC went on to send the next one for itself while the others
    were still being woken, RPCs alternated between 16 callers and 1: 8.5 per RPC.)

    Thread 0 reads the counters at its 30th and 70th call, so that threads released late
    by the start barrier, and the last calls of those, do not count.
    """
    server = oracles.start("--state-file", os.path.join(str(tmp_path), "ceiling"))
    server.wait_serving()
    threads, calls = 16, 100
    stamps: list[list[int]] = [[] for _ in range(threads)]
    marks: list[OracleStatus] = []
    with OracleClient(f"grpc://{server.address}") as client, server.status_client() as status:
        client.get_timestamp()  # connect first
        before = status.status()

        def run(i: int) -> None:
            for k in range(calls):
                if i == 0 and k in (30, 70):
                    marks.append(status.status())
                stamps[i].append(client.get_timestamp())

        run_concurrently(run, threads)  # fails if any thread raised
        after = status.status()
    drawn = [ts for mine in stamps for ts in mine]
    assert len(set(drawn)) == len(drawn) == threads * calls
    for mine in stamps:
        assert mine == sorted(mine)
    assert after.served - before.served == threads * calls
    served = marks[1].served - marks[0].served
    rpcs = marks[1].requests - marks[0].requests
    assert served / rpcs >= 12, f"{served} timestamps in {rpcs} RPCs"


def test_get_timestamps_returns_a_consecutive_fresh_block(
    oracles: Oracles, tmp_path: object
) -> None:
    server = oracles.start("--state-file", os.path.join(str(tmp_path), "ceiling"))
    server.wait_serving()
    with OracleClient(f"grpc://{server.address}") as c:
        a = c.get_timestamp()
        block = c.get_timestamps(1000)
        b = c.get_timestamp()
        big = c.get_timestamps(MAX_COUNT)
        assert isinstance(block, range) and len(block) == 1000 and block.step == 1
        assert a < block.start and block[-1] < b < big.start
        assert len(big) == MAX_COUNT


@pytest.mark.parametrize("count", [0, -1, -(2**70), MAX_COUNT + 1, 10**30, 1.5, "3", None, True])
def test_bad_counts_are_rejected_at_the_door(count: object) -> None:
    # Checked before any RPC: the target need not exist.
    with OracleClient(f"grpc://127.0.0.1:{free_port()}", deadline=0.2) as c:
        with pytest.raises(InvalidArgument) as info:
            c.get_timestamps(count)  # type: ignore[arg-type]
        assert repr(count) in str(info.value)


def test_server_rejects_bad_counts(oracles: Oracles, tmp_path: object) -> None:
    server = oracles.start("--state-file", os.path.join(str(tmp_path), "ceiling"))
    server.wait_serving()
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.TimestampOracleStub(channel)
        for count in (0, MAX_COUNT + 1, 2**64 - 1):
            with pytest.raises(grpc.RpcError) as info:
                stub.GetTimestamps(pb.GetTimestampsRequest(count=count), timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert str(count) in info.value.details()
        ok = stub.GetTimestamps(pb.GetTimestampsRequest(count=3), timeout=5)
        assert ok.count == 3 and ok.first >= 1


@pytest.mark.parametrize(
    "target",
    [
        "",
        "127.0.0.1:7070",
        "http://127.0.0.1:7070",
        "grpc://",
        "grpc://127.0.0.1",
        "grpc://127.0.0.1:notaport",
        "grpc://127.0.0.1:99999",
        "grpc://127.0.0.1:0",
        "grpc://host:1/path",
        "zk://",
        "zk:///chroot",
        "zk://127.0.0.1:2181/bad chroot",
        "zk://127.0.0.1:2181//double",
        "zk://127.0.0.1",
    ],
)
def test_malformed_targets_are_rejected(target: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        OracleClient(target)
    assert repr(target) in str(info.value)


@pytest.mark.parametrize("deadline", [0, -1.0, "10", None])
def test_bad_deadline_is_rejected(deadline: object) -> None:
    with pytest.raises(InvalidArgument, match="deadline"):
        OracleClient("grpc://127.0.0.1:7070", deadline=deadline)  # type: ignore[arg-type]


def test_unreachable_grpc_target_raises_oracle_unavailable_naming_it() -> None:
    target = f"grpc://127.0.0.1:{free_port()}"
    with OracleClient(target, deadline=0.5) as c:
        with pytest.raises(OracleUnavailable) as info:
            c.get_timestamp()
        assert target in str(info.value)
        with pytest.raises(OracleUnavailable):
            c.status()


def test_unreachable_zookeeper_target_raises_oracle_unavailable_naming_it() -> None:
    target = f"zk://127.0.0.1:{free_port()}/nowhere"
    with OracleClient(target, deadline=0.5) as c:
        with pytest.raises(OracleUnavailable) as info:
            c.get_timestamp()
        assert target in str(info.value)


def test_closed_client_raises() -> None:
    c = OracleClient(f"grpc://127.0.0.1:{free_port()}")
    c.close()
    with pytest.raises(OracleUnavailable, match="closed"):
        c.get_timestamp()


def test_second_server_on_the_same_state_file_refuses(oracles: Oracles, tmp_path: object) -> None:
    state = os.path.join(str(tmp_path), "ceiling")
    first = oracles.start("--state-file", state)
    first.wait_serving()
    second = oracles.start("--state-file", state)
    assert second.process.wait(30) == 2
    assert "in use" in second.log()


def test_help_explains_every_option() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "oracle", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for option in (
        "--listen",
        "--state-file",
        "--zookeeper",
        "--advertise",
        "--block-size",
        "--session-timeout",
        "--max-workers",
        "--log-level",
    ):
        assert option in out


def test_bad_server_arguments_exit_with_status_2(tmp_path: object) -> None:
    from oracle.__main__ import main

    state = os.path.join(str(tmp_path), "ceiling")
    assert main(["--listen", "nonsense", "--state-file", state]) == 2
    assert main(["--listen", "127.0.0.1:0", "--state-file", "/nonexistent/dir/x"]) == 2
    with pytest.raises(SystemExit):
        main(["--listen", "127.0.0.1:0"])  # neither --state-file nor --zookeeper
