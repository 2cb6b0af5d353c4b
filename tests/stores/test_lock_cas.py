"""``lock_cas`` (``percolator/_cas.py``): a lock-cell compare-and-set whose answer was
a replay or was lost, settled by reading the cell again, on every backend.

Each backend's real store is used; only the answer of one ``check_and_set`` call is
changed, as a store that retries below us (a replayed False) or a lost connection (an
error after, or before, the call applied) would change it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from percolator._cas import lock_cas
from percolator._errors import StoreUnavailable
from percolator._store import (
    CAS_ANSWER_MAY_BE_REPLAYED,
    CAS_DELETES,
    Mutation,
    Read,
    Store,
    declares,
)
from percolator.stores import open_store
from tests._backends import drop_tables

CELL = ("t", b"r", "l:c")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    s.create_table("t", {"l": 1})
    yield s
    drop_tables(s)
    s.close()


def _value(store: Store) -> bytes | None:
    cells = store.read_rows("t", [b"r"], [Read("l", ("c",))]).get(b"r", {}).get("l:c")
    return cells[0][1] if cells else None


def _answer(store: Store, answer: str) -> None:
    """Make *store*'s next check_and_set apply (or not) and answer as *answer* says."""
    real = store.check_and_set

    def check_and_set(*args: object, **kwargs: object) -> bool:
        store.check_and_set = real  # type: ignore[method-assign]
        if answer == "lost before applying":
            raise StoreUnavailable("connection lost before the call was sent")
        applied = real(*args, **kwargs)  # type: ignore[arg-type]
        if answer == "lost after applying":
            raise StoreUnavailable("connection lost before the answer came back")
        assert answer == "replayed" and applied
        return False  # the retry of an applied attempt sees the new value

    store.check_and_set = check_and_set  # type: ignore[method-assign]


def test_an_answer_lost_after_the_call_applied_is_a_success(store: Store) -> None:
    _answer(store, "lost after applying")
    assert lock_cas(store, *CELL, None, b"mine")
    assert _value(store) == b"mine"


def test_an_answer_lost_before_the_call_applied_is_still_an_error(store: Store) -> None:
    _answer(store, "lost before applying")
    with pytest.raises(StoreUnavailable, match="before the call was sent"):
        lock_cas(store, *CELL, None, b"mine")
    assert _value(store) is None


def test_a_replayed_false_is_a_success_where_the_store_may_replay(store: Store) -> None:
    _answer(store, "replayed")
    assert lock_cas(store, *CELL, None, b"mine") is declares(store, CAS_ANSWER_MAY_BE_REPLAYED)
    assert _value(store) == b"mine"


def test_a_false_is_read_again_wherever_the_store_declares_it_may_replay(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read again after a False, on every backend (the embedded store and
    Bigtable here declaring HBase's ``CAS_ANSWER_MAY_BE_REPLAYED``): the cell holding
    our new value, a replay of our applied call, is a success; holding another's, a
    genuine False, stays False."""
    monkeypatch.setattr(store, "capabilities", store.capabilities | {CAS_ANSWER_MAY_BE_REPLAYED})
    _answer(store, "replayed")
    assert lock_cas(store, *CELL, None, b"mine")
    assert not lock_cas(store, *CELL, None, b"theirs")
    assert _value(store) == b"mine"


def test_a_genuine_false_stays_false(store: Store) -> None:
    assert lock_cas(store, *CELL, None, b"theirs")
    assert not lock_cas(store, *CELL, None, b"mine")
    assert _value(store) == b"theirs"


def test_deletes_go_with_the_compare_and_set_where_the_store_can(store: Store) -> None:
    """*deletes* (``CAS_DELETES``: Bigtable, where an observer run's commit point deletes
    the notification it served, ``percolator/_two_phase.py``) go in the same
    compare-and-set as the lock and its puts: from any other value nothing of it is
    written; from the expected value the lock cell holds the new one, the puts are
    written and the versions at or below a delete's timestamp are gone, a newer one is
    kept."""
    if not declares(store, CAS_DELETES):
        pytest.skip(f"{type(store).__name__} deletes nothing in a compare-and-set "
                    "(CAS_DELETES: Bigtable only)")
    store.create_table("u", {"l": 1, "w": 0, "n": 0})
    store.mutate_rows("u", [Mutation(b"r", [("n:c", 5, b"1"), ("n:c", 9, b"w")])])
    assert lock_cas(store, "u", b"r", "l:c", None, b"held")
    puts, deletes = [("w:c", 7, b"record")], [("n:c", 5)]

    def cells() -> dict[str, list[tuple[int, bytes]]]:
        reads = [Read("l", ("c",)), Read("w", ("c",)), Read("n", ("c",), versions=None)]
        return store.read_rows("u", [b"r"], reads).get(b"r", {})

    assert not lock_cas(store, "u", b"r", "l:c", b"other", b"free", puts, deletes)
    found = cells()
    assert [v for _, v in found["l:c"]] == [b"held"] and "w:c" not in found
    assert found["n:c"] == [(9, b"w"), (5, b"1")]
    assert lock_cas(store, "u", b"r", "l:c", b"held", b"free", puts, deletes)
    found = cells()
    assert [v for _, v in found["l:c"]] == [b"free"]
    assert found["w:c"] == [(7, b"record")] and found["n:c"] == [(9, b"w")]
