"""Checked by mypy, never run (tests/typing/test_typing.py): each line that ends with
``# E: <code>`` must have exactly that mypy error, and no other line any."""

from __future__ import annotations

import percolator
from observers import Observer
from percolator import Cluster, Snapshot, Transaction, TransactionBase


@percolator.transactional
def transfer(txn: Transaction, src: bytes, dst: bytes, amount: int) -> int:
    return amount


@percolator.transactional(retries=3)
def read_balance(txn: TransactionBase, account: bytes) -> bytes | None:
    return txn.get("accounts", account, "bal:v")


def callers(cluster: Cluster, txn: Transaction, snap: Snapshot) -> None:
    moved: int = transfer(cluster, b"a", b"b", 1)
    moved = transfer(txn, b"a", b"b", 1)
    balance: bytes | None = read_balance(cluster, b"a")
    balance = read_balance(txn, b"a")
    transfer("sqlite:///x.db", b"a", b"b", 1)  # E: arg-type
    transfer(snap, b"a", b"b", 1)  # E: arg-type
    transfer(cluster, "a", b"b", 1)  # E: arg-type
    transfer(cluster, b"a", b"b")  # E: call-arg
    text: str = transfer(cluster, b"a", b"b", 1)  # E: assignment
    read_balance(cluster, b"a", b"extra")  # E: call-arg
    del moved, balance, text


class PerInstance(Observer):
    """The recipes bind what an observer watches per instance."""

    def __init__(self, table: str) -> None:
        self.table, self.column = table, "raw:html"
        self.name = f"per-instance.{table}"

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        pass


class PerClass(Observer):
    table, column = "documents", "raw:html"
