"""Every backend, and every test double that wraps one, declares exactly the optional
capabilities it implements (``percolator/_store.py``: callers trust the declaration
through ``offered``/``declares`` and never look for the methods themselves)."""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator._interleaving import Interleaving
from percolator._internals import internals
from percolator._store import (
    ATOMICALLY,
    CAPABILITIES,
    CAS_ANSWER_MAY_BE_REPLAYED,
    CAS_DELETES,
    CHECK_AND_SET_MANY,
    DELETE_IF,
    EMBEDDED_FILE,
    INCREMENT,
    NEWEST_OF_ROW,
    NOTIFY_INDEX,
    PUT_ROW,
    SET_UNLESS,
    SINGLE_WRITER,
    SPLIT_KEYS,
    VACUUM,
    Capability,
    Store,
)
from percolator.stores import open_store
from tests._backends import WITH_THRIFT1, drop_tables

EXPECTED: dict[str, frozenset[Capability[Any]]] = {
    "sqlite": frozenset({ATOMICALLY, CHECK_AND_SET_MANY, DELETE_IF, EMBEDDED_FILE,
                         NEWEST_OF_ROW, PUT_ROW, SINGLE_WRITER, VACUUM}),
    "hbase": frozenset({CAS_ANSWER_MAY_BE_REPLAYED, CAS_DELETES, DELETE_IF, INCREMENT,
                        SPLIT_KEYS}),
    "hbase-thrift1": frozenset({CAS_ANSWER_MAY_BE_REPLAYED, INCREMENT, SPLIT_KEYS}),
    "bigtable": frozenset({CAS_DELETES, CHECK_AND_SET_MANY, DELETE_IF, INCREMENT,
                           NOTIFY_INDEX, SET_UNLESS, SPLIT_KEYS}),
}

FLAGS = {c.name for c in CAPABILITIES if not c.members}
"""Capabilities with no member to look for: only the declaration says."""


def implemented(store: object) -> frozenset[Capability[Any]]:
    """The capabilities with members that *store* has, all of them."""
    return frozenset(c for c in CAPABILITIES
                     if c.members and all(hasattr(store, m) for m in c.members))


def check_declarations(store: Any) -> None:
    declared = frozenset(store.capabilities)
    assert declared <= set(CAPABILITIES), declared - set(CAPABILITIES)
    assert {c for c in declared if c.members} == implemented(store), type(store).__name__
    # A flag is declared, never an attribute of its own that a caller could probe.
    assert not [name for name in FLAGS if hasattr(store, name)], type(store).__name__


@pytest.mark.parametrize("backend", WITH_THRIFT1)
def test_every_backend_declares_what_it_implements(store_url: str, backend: str) -> None:
    store = open_store(store_url)
    try:
        assert isinstance(store, Store)
        assert store.capabilities == EXPECTED[backend]
        check_declarations(store)
    finally:
        store.close()


# --- the test doubles of tests/, each over every backend ---------------------------------


def _doubles() -> dict[str, Callable[[Store], Any]]:
    """How to wrap a store in each double, by ``module:class``."""
    from tests._concurrency import ParkedAfterCommit
    from tests.gc.test_gc import ParkingStore
    from tests.gc.test_gc_embedded import _TwoParkings
    from tests.gc.test_safe_point import _RacingPasses
    from tests.observers.test_failures import NoReads
    from tests.observers.test_notify_index import CountingIndexWrites
    from tests.observers.test_settle import NotifyWrites, WritesFail
    from tests.observers.test_settle_cluster import NotifyDeletes
    from tests.observers.test_trickle import CountingStore
    from tests.transactions.test_group_commit import CountingSteps
    from tests.transactions.test_inline_values import _CommitAfterFirstRead
    from tests.transactions.test_lock_census import _FamiliesRead
    from tests.transactions.test_lock_resolution import (
        AnswerLostAfterOthersMove,
        CommitPointAnswerLost,
        ParkedCommitter,
        RowCasNotAtomic,
        SlowStore,
    )
    from tests.transactions.test_one_phase import _SecondRowFails
    from tests.transactions.test_prefetch import CountingReads
    from tests.transactions.test_prewrite import _CommitPointFails, _Counted
    from tests.transactions.test_single_row import Counting
    from tests.transactions.test_store_timestamps import ParkedRequest, _InterruptedRead
    from tests.transactions.test_timestamps import _Counted as CountedTimestamps
    from tests.transactions.test_timestamps import _SlowCommitStore
    from tests.ubiq.test_bookkeeping import _RowsRead

    return {
        "_concurrency:ParkedAfterCommit": lambda s: ParkedAfterCommit(
            s, threading.current_thread()),
        "gc.test_gc:ParkingStore": ParkingStore,
        "gc.test_gc_embedded:_TwoParkings": _TwoParkings,
        "gc.test_safe_point:_RacingPasses": _RacingPasses,
        "observers.test_failures:NoReads": NoReads,
        "observers.test_notify_index:CountingIndexWrites": CountingIndexWrites,
        "observers.test_settle:NotifyWrites": NotifyWrites,
        "observers.test_settle:WritesFail": WritesFail,
        "observers.test_settle_cluster:NotifyDeletes": NotifyDeletes,
        "observers.test_trickle:CountingStore": CountingStore,
        "transactions.test_group_commit:CountingSteps": CountingSteps,
        "transactions.test_inline_values:_CommitAfterFirstRead": lambda s: (
            _CommitAfterFirstRead(s, None)),
        "transactions.test_lock_census:_FamiliesRead": _FamiliesRead,
        "transactions.test_lock_resolution:AnswerLostAfterOthersMove": lambda s: (
            AnswerLostAfterOthersMove(s, lambda: None)),
        "transactions.test_lock_resolution:CommitPointAnswerLost": lambda s: (
            CommitPointAnswerLost(s, b"r")),
        "transactions.test_lock_resolution:ParkedCommitter": lambda s: ParkedCommitter(
            s, b"r", 1),
        "transactions.test_lock_resolution:RowCasNotAtomic": RowCasNotAtomic,
        "transactions.test_lock_resolution:SlowStore": lambda s: SlowStore(s, 0.0),
        "transactions.test_one_phase:_SecondRowFails": _SecondRowFails,
        "transactions.test_prefetch:CountingReads": CountingReads,
        "transactions.test_prewrite:_CommitPointFails": lambda s: _CommitPointFails(s, True),
        "transactions.test_prewrite:_Counted": _Counted,
        "transactions.test_single_row:Counting": Counting,
        "transactions.test_store_timestamps:ParkedRequest": ParkedRequest,
        "transactions.test_store_timestamps:_InterruptedRead": _InterruptedRead,
        "transactions.test_timestamps:_Counted": CountedTimestamps,
        "transactions.test_timestamps:_Counted-without-increment": lambda s: (
            CountedTimestamps(s, increment=False)),
        "transactions.test_timestamps:_SlowCommitStore": _SlowCommitStore,
        "ubiq.test_bookkeeping:_RowsRead": _RowsRead,
    }


def _wrapping_classes() -> set[str]:
    """Classes under tests/ that forward unknown attributes to a store they are given
    (``__getattr__`` and a ``store`` parameter): the doubles a test may put in a
    cluster's place."""
    found: set[str] = set()
    root = Path(__file__).resolve().parents[1]
    for path in root.rglob("*.py"):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            methods = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
            init = methods.get("__init__")
            if "__getattr__" in methods and init is not None and "store" in [
                    a.arg for a in init.args.args]:
                found.add(f"{module}:{node.name}")
    return found


def test_every_store_double_of_the_tests_is_checked() -> None:
    """A new double must join the list of :func:`_doubles` (checked by the next test)."""
    assert _wrapping_classes() == {name.split("-")[0] for name in _doubles()}


EMBEDDED_ONLY = {"_concurrency:ParkedAfterCommit", "transactions.test_group_commit:CountingSteps",
                 "transactions.test_one_phase:_SecondRowFails",
                 "transactions.test_timestamps:_SlowCommitStore"}
"""Doubles with an ``atomically`` or a ``put_row`` of their own, which tests put only over
the embedded store (elsewhere they would implement a capability the store does not
declare)."""
INCREMENTING_ONLY = {"transactions.test_store_timestamps:ParkedRequest"}
"""Doubles with an ``increment`` of their own, which tests put only over a store that
declares ``INCREMENT``."""


@pytest.mark.parametrize("name", sorted(_doubles()))
def test_every_store_double_declares_what_it_implements(
        name: str, backend: str, store_url: str) -> None:
    if backend != "sqlite" and name in EMBEDDED_ONLY:
        pytest.skip("wraps the embedded store only")
    store = open_store(store_url)
    try:
        if name in INCREMENTING_ONLY and INCREMENT not in store.capabilities:
            pytest.skip("wraps a store that increments only")
        check_declarations(_doubles()[name](store))
    finally:
        store.close()


@contextmanager
def _gated(tmp_path: Path) -> Iterator[percolator.Cluster]:
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster, Interleaving(cluster):
        yield cluster
        drop_tables(cluster)


def test_the_interleaving_harness_store_declares_what_it_implements(tmp_path: Path) -> None:
    with _gated(tmp_path) as cluster:
        assert type(internals(cluster).store).__name__ == "_GatedStore"
        assert internals(cluster).store.capabilities == EXPECTED["sqlite"]
        check_declarations(internals(cluster).store)
