"""The store's counter as the timestamp source (a cluster store without an oracle):
concurrent draws of one process share one request to the store, and a draw is never
served by a request sent before it began (docs/timestamps.md: a local block of the
counter would break snapshot isolation across clients)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from percolator import Cluster
from percolator._errors import StoreUnavailable
from percolator._internals import internals
from percolator._store import INCREMENT
from percolator._timestamps import StoreTimestamps
from percolator.stores.sqlite import SqliteStore
from tests._concurrency import run_concurrently


class ParkedRequest:
    """A store whose first ``increment`` (a request for timestamps) stops after the
    store answered it, until :attr:`proceed`; :attr:`requests` counts increments."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.requests = 0
        self.parked = threading.Event()
        self.proceed = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def increment(self, table: str, row: bytes, column: str, amount: int) -> int:
        result: int = self._store.increment(table, row, column, amount)
        self.requests += 1
        if not self.parked.is_set():
            self.parked.set()
            assert self.proceed.wait(10)
        return result


def _wait_for(condition: Any) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the draws never queued"
        time.sleep(0.001)


@pytest.fixture
def parked(cluster: Cluster) -> ParkedRequest:
    if INCREMENT not in internals(cluster).store.capabilities:
        pytest.skip("the store counts with a read and a compare-and-set, not an increment")
    StoreTimestamps(internals(cluster).store).get_timestamp()  # the counter exists: no retry below
    return ParkedRequest(internals(cluster).store)


def test_a_draw_begun_during_a_request_waits_for_the_next_one(
    cluster: Cluster, parked: ParkedRequest
) -> None:
    """A request of this process has been answered but not handed out; meanwhile
    another client draws and returns, and then a second thread of this process begins
    a draw: it must get more than the other client's timestamp (fails with a local
    block: a spare timestamp of the first request would be below it)."""
    mine = StoreTimestamps(parked)  # type: ignore[arg-type]
    theirs = StoreTimestamps(internals(cluster).store)
    got: dict[str, int] = {}
    first = threading.Thread(target=lambda: got.setdefault("first", mine.get_timestamp()))
    first.start()
    assert parked.parked.wait(10)
    got["theirs"] = theirs.get_timestamp()  # returns before the second draw begins
    second = threading.Thread(target=lambda: got.setdefault("second", mine.get_timestamp()))
    second.start()
    _wait_for(lambda: len(mine._draws._pending) == 1)
    parked.proceed.set()
    first.join(10)
    second.join(10)
    assert got["first"] < got["theirs"] < got["second"]
    assert parked.requests == 2


def test_draws_queued_behind_a_request_share_the_next(
    cluster: Cluster, parked: ParkedRequest
) -> None:
    """Three draws queued while a request is out are served by one more request, each
    its own range (fails when every draw sends its own request: four)."""
    mine = StoreTimestamps(parked)  # type: ignore[arg-type]
    got: list[range] = []
    lock = threading.Lock()

    def draw(n: int) -> None:
        taken = mine.get_timestamps(n)
        with lock:
            got.append(taken)

    threads = [threading.Thread(target=draw, args=(1,))]
    threads[0].start()
    assert parked.parked.wait(10)
    threads += [threading.Thread(target=draw, args=(n,)) for n in (1, 2, 3)]
    for thread in threads[1:]:
        thread.start()
    _wait_for(lambda: len(mine._draws._pending) == 3)
    parked.proceed.set()
    for thread in threads:
        thread.join(10)
    assert parked.requests == 2
    taken = sorted(t for r in got for t in r)
    assert len(taken) == 7 and len(set(taken)) == 7
    assert sorted(len(r) for r in got) == [1, 1, 2, 3]


def test_concurrent_draws_of_two_clients_are_unique(cluster: Cluster) -> None:
    """Two clients of four threads each on one counter, with real threads."""
    clients = [StoreTimestamps(internals(cluster).store), StoreTimestamps(internals(cluster).store)]
    got: list[int] = []
    lock = threading.Lock()

    def draw(i: int) -> None:
        mine = [clients[i % 2].get_timestamp() for _ in range(25)]
        assert mine == sorted(mine)  # a thread's draws are in its real-time order
        with lock:
            got.extend(mine)

    run_concurrently(draw, 8)
    assert len(got) == len(set(got)) == 200


def test_a_draw_after_another_clients_draw_returned_is_above_it(cluster: Cluster) -> None:
    """Real-time order across clients of one counter (fails with a local block of the
    counter: the second draw of ``mine`` would come from the block its first took)."""
    store = internals(cluster).store
    mine, theirs = StoreTimestamps(store), StoreTimestamps(store)
    a = mine.get_timestamp()
    b = theirs.get_timestamp()
    assert a < b < mine.get_timestamp()



class _InterruptedRead:
    """The embedded store, whose first read (the counter's, by the first request for
    timestamps) waits for :attr:`go`, and whose second (the next request's) is
    interrupted: a ``KeyboardInterrupt`` raised in the thread that sent that request,
    as Ctrl-C raises it in the main one."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.reads = 0
        self.reading = threading.Event()
        self.go = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_rows(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        if self.reads == 1:
            self.reading.set()
            assert self.go.wait(10)
        elif self.reads == 2:
            raise KeyboardInterrupt
        return self._store.read_rows(*args, **kwargs)


def test_the_draws_served_by_an_interrupted_request_are_told_so(tmp_path: Path) -> None:
    """Two draws queue behind a request, so the next request serves both; it is
    interrupted in the thread that sent it, which gets its interruption. The other
    draw gets a StoreUnavailable saying what interrupted the request (it did not ask
    for the interruption, and must not be left waiting), and the source draws on."""
    store = SqliteStore(str(tmp_path / "db"))
    interrupted = _InterruptedRead(store)
    source = StoreTimestamps(interrupted)  # type: ignore[arg-type]
    told: dict[str, object] = {}

    def draw(name: str) -> None:
        try:
            told[name] = source.get_timestamp()
        except (KeyboardInterrupt, StoreUnavailable) as e:
            told[name] = e

    threads = {name: threading.Thread(target=draw, args=(name,), daemon=True)
               for name in ("first", "sender", "other")}
    try:
        threads["first"].start()
        assert interrupted.reading.wait(10)
        threads["sender"].start()
        _wait_for(lambda: len(source._draws._pending) == 1)
        threads["other"].start()
        _wait_for(lambda: len(source._draws._pending) == 2)
        interrupted.go.set()
        for thread in threads.values():
            thread.join(10)
        assert isinstance(told.get("first"), int)
        assert isinstance(told.get("sender"), KeyboardInterrupt)
        assert isinstance(told.get("other"), StoreUnavailable)
        assert str(told["other"]) == "the timestamp request was interrupted: KeyboardInterrupt()"
        assert source.get_timestamp() > told["first"]  # type: ignore[operator]
    finally:
        interrupted.go.set()
        store.close()
