"""The public test harness keeps its promises."""

from __future__ import annotations

import threading

import pytest

import percolator
from percolator._internals import internals
from percolator.testing import (
    Interleaving,
    InterleavingError,
    PausePoint,
    client_of,
    kill_client,
    temporary_cluster,
)


def test_closing_a_client_declares_it_dead_and_leaves_the_cluster_open() -> None:
    with temporary_cluster() as cluster:
        cluster.create_table("t")
        client = client_of(cluster)
        owner = internals(client).coordination.current_owner()
        mine = internals(cluster).coordination.current_owner()
        assert owner != mine and internals(cluster).coordination.is_alive(owner)
        assert internals(client).stats is not internals(cluster).stats
        assert internals(client).store is internals(cluster).store
        client.close()
        assert internals(cluster).coordination.is_alive(owner) is False
        assert internals(cluster).coordination.is_alive(mine)  # only the client died
        with percolator.Transaction(cluster) as txn:  # the shared store is still open
            txn.set("t", b"r", "c:q", b"v")
        assert percolator.Transaction(cluster).get("t", b"r", "c:q") == b"v"


def test_kill_client_declares_it_dead_and_its_locks_are_resolved() -> None:
    with temporary_cluster() as cluster:
        cluster.create_table("t")
        with Interleaving(cluster) as world:
            client = client_of(cluster)  # made inside: its store calls are the world's
            client.one_phase_commit = False
            txn = percolator.Transaction(client)
            txn.set("t", b"r", "c:q", b"v")
            t1 = world.actor("T1", txn.commit, clients=[client])
            t1.run_until(lambda step: step.matches("timestamp"))  # locked, not committed
            kill_client(client)
            with percolator.Snapshot(cluster) as snap:  # meets the dead owner's lock
                assert snap.get("t", b"r", "c:q") is None
            with pytest.raises(percolator.CoordinationError):
                t1.finish()
        mine = internals(cluster).coordination.current_owner()
        assert internals(cluster).coordination.is_alive(mine)  # only the client died


# --- Interleaving and PausePoint ---------------------------------------------------------


def _bank(cluster: percolator.Cluster) -> None:
    cluster.create_table("t")
    with percolator.Transaction(cluster) as txn:
        txn.set("t", b"a", "c:v", b"0")
        txn.set("t", b"b", "c:v", b"0")


def test_actors_take_one_step_at_a_time_and_the_test_thread_runs_freely() -> None:
    with temporary_cluster() as cluster:
        _bank(cluster)
        with Interleaving(cluster) as world:
            reader = world.actor("R", lambda: percolator.Snapshot(cluster).get("t", b"a", "c:v"))
            assert reader.pending is not None and reader.pending.op == "start"
            assert reader.step() is not None and reader.pending.op == "timestamp"
            with percolator.Transaction(cluster) as txn:  # not an actor: not parked
                txn.set("t", b"a", "c:v", b"1")
            assert reader.finish() == b"1"  # its start timestamp was drawn after
            assert [s.op for s in reader.steps] == ["start", "timestamp", "read_rows"]
            assert world.trace == reader.steps


def test_run_follows_a_schedule_then_runs_every_actor_to_its_end() -> None:
    with temporary_cluster() as cluster:
        _bank(cluster)
        with Interleaving(cluster) as world:
            def read(row: bytes) -> bytes | None:
                return percolator.Snapshot(cluster).get("t", row, "c:v")

            a = world.actor("A", lambda: read(b"a"))
            b = world.actor("B", lambda: read(b"b"))
            trace = world.run([1, 1, 0])
            assert [s.actor for s in trace] == ["B", "B", "A", "A", "A", "B"]
            assert a.outcome() == b.outcome() == b"0"


def test_run_until_a_step_that_never_comes_says_what_the_actor_did() -> None:
    with temporary_cluster() as cluster:
        _bank(cluster)
        with Interleaving(cluster) as world:
            reader = world.actor("R", lambda: percolator.Snapshot(cluster).get("t", b"a", "c:v"))
            with pytest.raises(InterleavingError, match="finished without reaching"):
                reader.run_until(lambda s: s.matches("check_and_set"))
            with pytest.raises(InterleavingError, match="is done"):
                reader.step()


def test_an_actor_blocked_outside_a_step_is_reported_not_waited_for() -> None:
    with temporary_cluster() as cluster:
        gate = threading.Event()
        with Interleaving(cluster, timeout=0.5) as world:
            stuck = world.actor("stuck", lambda: gate.wait(60))
            with pytest.raises(InterleavingError, match="blocked outside the store"):
                stuck.step()
        gate.set()


def test_actors_are_made_inside_the_block_only() -> None:
    with temporary_cluster() as cluster:
        world = Interleaving(cluster)
        with pytest.raises(InterleavingError, match="inside the `with Interleaving"):
            world.actor("A", lambda: None)
        with pytest.raises(percolator.InvalidArgument):
            Interleaving()


def test_a_scan_is_a_step_per_row_and_the_store_is_restored_after() -> None:
    with temporary_cluster() as cluster:
        _bank(cluster)
        store = internals(cluster).store
        with Interleaving(cluster) as world:
            scanner = world.actor(
                "S", lambda: list(percolator.Snapshot(cluster).scan("t", columns=["c:v"]))
            )
            assert len(scanner.finish()) == 2
            assert [s.op for s in scanner.steps].count("scan") == 3  # the call, then a row each
        assert internals(cluster).store is store


def test_a_pause_point_parks_the_first_arrivals_until_released() -> None:
    from percolator._pause import pause_point

    passed: list[str] = []

    def arrive(name: str) -> None:
        pause_point("test.point")
        passed.append(name)

    with PausePoint("test.point") as point:
        first = threading.Thread(target=arrive, args=("first",))
        first.start()
        assert point.reached()
        arrive("second")  # past the limit: not parked
        assert passed == ["second"]
        point.release()
        first.join()
    assert passed == ["second", "first"]
    arrive("unarmed")
    assert passed[-1] == "unarmed"
