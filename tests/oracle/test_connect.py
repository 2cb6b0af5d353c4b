"""The client library on the gRPC oracle: ``percolator.connect(..., oracle=...)``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import percolator
from percolator import Transaction
from tests.oracle.conftest import Oracles

pytestmark = pytest.mark.oracle


def test_transactions_take_their_timestamps_from_the_oracle(
    oracles: Oracles, tmp_path: Path
) -> None:
    server = oracles.start("--state-file", os.path.join(tmp_path, "oracle.state"))
    server.wait_serving()
    target = f"grpc://{server.address}"
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db", oracle=target) as cluster:
        cluster.create_table("t")
        with server.status_client() as status:
            served_before = status.status().served
            with Transaction(cluster) as txn:
                txn.set("t", b"r", "c:q", b"v")
            assert status.status().served >= served_before + 2  # start and commit
        reader = Transaction(cluster)
        assert reader.start_ts > (txn.commit_ts or 0) > txn.start_ts
        assert reader.get("t", b"r", "c:q") == b"v"


def test_connect_with_an_unreachable_oracle_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(percolator.OracleUnavailable, match=r"127\.0\.0\.1:9.* 0\.5s"):
        cluster = percolator.connect(f"sqlite:///{tmp_path}/repo.db", oracle="grpc://127.0.0.1:9",
                                     oracle_deadline=0.5)
        try:
            Transaction(cluster)
        finally:
            cluster.close()


def test_connect_with_a_malformed_oracle_target(tmp_path: Path) -> None:
    with pytest.raises(percolator.InvalidArgument, match="oracle"):
        percolator.connect(f"sqlite:///{tmp_path}/repo.db", oracle="http://nowhere")


@pytest.mark.parametrize("deadline", [0, -1.0, "5", True])
def test_connect_with_a_bad_oracle_deadline(tmp_path: Path, deadline: object) -> None:
    with pytest.raises(percolator.InvalidArgument, match="deadline"):
        percolator.connect(f"sqlite:///{tmp_path}/repo.db", oracle="grpc://127.0.0.1:9",
                           oracle_deadline=deadline)  # type: ignore[arg-type]
