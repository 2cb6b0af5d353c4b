"""What is particular to the embedded SQLite store: its file format."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import percolator
from percolator.stores import open_store


def test_a_file_of_an_older_format_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = open_store(f"sqlite://{path}")
    store.create_table("t", {"l": 1, "d": 0})
    store.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 1")  # as written by percolator 0.1 before format 2
    db.close()
    with pytest.raises(percolator.StoreUnavailable, match=r"older percolator.*new file"):
        open_store(f"sqlite://{path}")


def test_a_new_file_gets_the_current_format(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    open_store(f"sqlite://{path}").close()
    open_store(f"sqlite://{path}").close()  # and reopens
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    db.close()
