"""Scanners spread over a backlog (Percolator §2.4): a scanner whose batch of rows, read
before, lists rows that another scanner served meanwhile is behind that scanner. It
meets it, as on a row whose advisory lock is held, and does not run those rows again
(each run would draw a timestamp and read, to find its notification served: an
"absent" run).

Each race is played with a pass as an actor parked right after its scan read the rows
(``percolator.testing.Interleaving``: at its first run's timestamp draw), while the
test serves two of the next rows as another scanner would: one of the same worker
process, whose served rows the worker remembers; or one of another process (a second
connection: its advisory locks are not this one's, as another process's are not
without ZooKeeper), which the pass learns of from its first run that finds its
notification served. A meeting on the worker's own rows costs nothing, and the
scanner skips a random stretch of its batch; one learnt from an absent run tells that
the batch is stale where the other has been, and the scanner leaves the rest of it.
The family pass: the embedded store and HBase."""

from __future__ import annotations

from typing import ClassVar

import pytest

import percolator
from observers import Observer, Worker
from percolator import Cluster, Transaction, metrics
from percolator.ext import pending_notifications
from percolator.testing import Interleaving
from tests._backends import HBASE, SQLITE

T, COL = "docs", "raw:v"
ROWS = [b"r%d" % i for i in range(5)]


@pytest.fixture
def cluster_tables() -> tuple[str, ...]:
    return (T,)


class Recorder(Observer):
    """Records the rows it ran on."""

    table, column = T, COL
    seen: ClassVar[list[bytes]] = []

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        self.seen.append(row)
        txn.set(T, row, "out:v", txn.get(T, row, column) or b"-")


def _absent_runs() -> float:
    values, _ = metrics.snapshot()
    return sum(v for (name, labels), v in values.items()
               if name == "percolator_observer_runs_total" and labels[-1] == "absent")


def _pending(cluster: Cluster) -> list[bytes]:
    return sorted(p.row for p in pending_notifications(cluster, [T]))


def _backlog(cluster: Cluster, threads: int = 1) -> Worker:
    """The changes of ROWS, and a worker (not started) of *threads* scanner threads
    whose passes start at the first row."""
    Recorder.seen = []
    mine = Worker(cluster, [Recorder()], threads=threads)
    mine.register()
    with Transaction(cluster) as txn:
        for row in ROWS:
            txn.set(T, row, COL, b"v")
    mine._scanner.remember(T, ROWS[0])  # its one row seen: its pass starts there
    return mine


def _drained(cluster: Cluster, worker: Worker) -> None:
    """A later pass serves what the pass left; every change was run once."""
    worker._scanner.scan_pass()
    assert _pending(cluster) == []
    assert sorted(Recorder.seen) == ROWS


@pytest.mark.parametrize("backend", [HBASE])  # the embedded store's passes take turns
def test_a_scanner_behind_another_of_its_process_leaves_its_batch_without_a_run(
    cluster: Cluster,
) -> None:
    """Another scanner thread of the worker serves the second and third rows while the
    pass runs the first: the pass meets it at the second (served lately here) without a
    run, as on a held advisory lock, and skips a random stretch; it runs neither again.

    Catches a pass that serves its stale batch to the end: it runs the two served rows
    again (two absent runs)."""
    mine = _backlog(cluster, threads=2)
    absent = _absent_runs()
    with Interleaving(cluster) as world:
        scan = world.actor("pass", mine._scanner.scan_pass)
        scan.run_until(lambda s: s.matches("timestamp"))  # at the first row's run
        assert mine._scanner.serve_row(T, ROWS[1]) and mine._scanner.serve_row(T, ROWS[2])
        assert scan.finish()
    assert _absent_runs() == absent
    assert mine.stats["meetings"] == 1
    assert sorted(Recorder.seen) == sorted(set(Recorder.seen))  # none run twice
    _drained(cluster, mine)


@pytest.mark.parametrize("backend", [SQLITE, HBASE])
def test_a_scanner_behind_another_process_meets_it_at_its_first_absent_run(
    cluster: Cluster, store_url: str,
) -> None:
    """A worker of another process (a connection of its own) serves the second and
    third rows while the pass runs the first: the pass's run of the second finds its
    notification served (one absent run), and the pass meets the other there and
    leaves the rest of its batch (the fourth and fifth rows too, for a later pass or
    the other worker).

    Catches a pass that does not take an absent run for a meeting: it runs the third
    row too (two absent runs) and serves the rest of its stale batch."""
    mine = _backlog(cluster)
    absent = _absent_runs()
    with percolator.connect(store_url) as elsewhere:
        theirs = Worker(elsewhere, [Recorder()], threads=1)
        with Interleaving(cluster) as world:
            scan = world.actor("pass", mine._scanner.scan_pass)
            scan.run_until(lambda s: s.matches("timestamp"))
            assert (theirs._scanner.serve_row(T, ROWS[1])
                    and theirs._scanner.serve_row(T, ROWS[2]))
            assert scan.finish()
    assert _absent_runs() == absent + 1
    assert mine.stats["meetings"] == 1
    assert _pending(cluster) == ROWS[3:]
    _drained(cluster, mine)
