"""Retry policies: the waits they make and when they give up."""

from __future__ import annotations

import pytest

from percolator import RetryPolicy
from percolator._retry import LOCK_WAIT


def recorded_pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    pauses: list[float] = []
    monkeypatch.setattr("percolator._retry.time.sleep", pauses.append)
    return pauses


def test_waits_grow_by_the_backoff_up_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses = recorded_pauses(monkeypatch)
    attempts = RetryPolicy(max_tries=7, delay=0.01, backoff=3.0, max_jitter=0.0,
                           max_delay=0.5, deadline=None).attempts()
    while attempts.wait():
        pass
    assert pauses == pytest.approx([0.01, 0.03, 0.09, 0.27, 0.5, 0.5])
    assert attempts.tries == 7


def test_a_long_lock_wait_keeps_waiting_past_two_thousand_tries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lock-wait policy has no try limit: its waits must stay capped however many
    tries pass (``backoff ** tries`` overflowed a float at try 1512, ~150 s into a
    wait, and the reader crashed with OverflowError instead of waiting on)."""
    pauses = recorded_pauses(monkeypatch)
    attempts = LOCK_WAIT.with_(deadline=None).attempts()
    for _ in range(3000):
        assert attempts.wait()
    assert max(pauses) <= LOCK_WAIT.max_delay * (1 + LOCK_WAIT.max_jitter)
    assert pauses[-1] >= LOCK_WAIT.max_delay


def test_a_deadline_ends_the_attempts_without_sleeping_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses = recorded_pauses(monkeypatch)
    attempts = RetryPolicy(max_tries=None, delay=10.0, max_delay=10.0, deadline=1.0).attempts()
    assert not attempts.wait()
    assert pauses == []
