"""Opening the embedded store while another process holds the new file locked (two
workers starting on a fresh store at once): the switch to WAL waits for the lock, up to
busy_timeout, instead of failing with "database is locked"."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from percolator import StoreUnavailable
from percolator.stores.sqlite import SqliteStore


def test_the_switch_to_wal_waits_for_a_lock_on_a_new_file(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE x (a)")  # a new file, still in rollback-journal mode,
    other.execute("BEGIN IMMEDIATE")  # written by another opener for a moment: SQLite
    threading.Timer(0.3, other.rollback).start()  # refuses the switch without waiting
    store = SqliteStore(path, busy_timeout=10)
    try:
        assert store._db().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()
        other.close()


def test_a_lock_held_past_busy_timeout_is_a_clear_error(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreUnavailable, match="cannot open sqlite store"):
            SqliteStore(path, busy_timeout=0.2)
    finally:
        other.close()
