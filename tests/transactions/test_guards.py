"""The guards of a two-phase prewrite on a store with ``set_unless`` (Bigtable):
``_not_starting_with`` must match exactly the values whose first byte is not its tag,
on the column and timestamps asked. Checked here against :class:`Guard`'s documented
meaning, without a store; tests/bigtable runs them on the emulator."""

from __future__ import annotations

import pytest

from percolator._commit_checks import _ROLLBACK_TAG, _not_starting_with
from percolator._encoding import FREE_TAG
from percolator._store import Guard


def _value_in_range(guard: Guard, value: bytes) -> bool:
    """Guard's value test: ``value_from <= value < value_to`` (None: unbounded)."""
    return guard.value_from <= value and (guard.value_to is None or value < guard.value_to)


@pytest.mark.parametrize("tag", [FREE_TAG, _ROLLBACK_TAG, b"\x00", b"\xfe"])
def test_the_guards_match_every_value_not_starting_with_the_tag(tag: bytes) -> None:
    below, above = bytes([max(tag[0] - 1, 0)]), bytes([tag[0] + 1])
    values = [b"", tag, tag + b"\x00", tag + b"\xff" * 3, below, below + b"\xff",
              above, above + b"\x00", b"\xff\xff"]
    guards = _not_starting_with(tag, "l:c")
    for value in values:
        matched = any(_value_in_range(g, value) for g in guards)
        assert matched is not value.startswith(tag), value


def test_the_guards_test_the_column_and_timestamps_asked() -> None:
    for guard in _not_starting_with(FREE_TAG, "l:c", min_ts=7, latest=True):
        assert (guard.column, guard.min_ts, guard.max_ts, guard.latest) == ("l:c", 7, None, True)
    for guard in _not_starting_with(FREE_TAG, "w:c"):  # by default: every version
        assert (guard.column, guard.min_ts, guard.max_ts, guard.latest) == ("w:c", 0, None, False)
