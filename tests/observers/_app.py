"""Observers run by the tests' worker processes (``--observers tests.observers._app:OBSERVERS``).

Every committed run leaves its own record in the ``log`` table, keyed by the change it
saw, so the tests count commits per change from the observers' own writes.
"""

from __future__ import annotations

import os
import time

from observers import Observer
from percolator import TransactionBase

SLEEP = float(os.environ.get("OBSERVERS_TEST_SLEEP", "0"))


def log(txn: TransactionBase, kind: str, row: bytes, value: bytes) -> None:
    key = b"/".join((kind.encode(), row, value, str(txn.start_ts).encode()))
    txn.set("log", key, "log:seen", value)


class Indexer(Observer):
    """docs/raw:v -> docs/out:seen (observed by Stage2)."""

    table, column = "docs", "raw:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        value = txn.get(self.table, row, column) or b"<deleted>"
        if SLEEP:
            time.sleep(SLEEP)
        log(txn, "idx", row, value)
        txn.set(self.table, row, "out:seen", value)


class Stage2(Observer):
    """The second stage of the chain: docs/out:seen -> docs/out:final."""

    table, column = "docs", "out:seen"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        value = txn.get(self.table, row, column) or b"<deleted>"
        log(txn, "s2", row, value)
        txn.set(self.table, row, "out:final", value)


class Pinger(Observer):
    """Runs on weak notifications of docs/ping:p (a column nobody writes)."""

    table, column = "docs", "ping:p"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        log(txn, "ping", row, txn.get(self.table, row, "raw:v") or b"-")


class Flaky(Observer):
    """Fails while flaky/config/cfg:fail is b"1"."""

    table, column = "flaky", "in:x"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        if txn.get(self.table, b"config", "cfg:fail") == b"1":
            raise RuntimeError(f"configured to fail on {row!r}")
        log(txn, "flaky", row, txn.get(self.table, row, column) or b"-")


class Hangs(Observer):
    """Never returns, as an observer stuck on a dead service would; touches the file
    named by OBSERVERS_TEST_HANG_MARK first, so that a test knows it is stuck."""

    table, column = "docs", "hang:x"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, "out:hung", b"never committed")
        with open(os.environ["OBSERVERS_TEST_HANG_MARK"], "w"):
            pass
        time.sleep(3600)


OBSERVERS = [Indexer, Stage2, Pinger]
HANGING = [Hangs]
ALL = [Indexer, Stage2, Pinger, Flaky]


class Copier(Observer):
    """docs/raw:v -> docs/out:seen, nothing else: the stress tests' observer."""

    table, column = "docs", "raw:v"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        txn.set(self.table, row, "out:seen", txn.get(self.table, row, column) or b"<deleted>")


COPIER = [Copier]
