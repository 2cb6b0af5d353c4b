"""``percolator backup`` / ``percolator restore`` of the embedded store (issue 50).

Bank clients in processes of their own make transfers while backups are taken. Each
restored store is one consistent point of the original's history: the bank's total
holds in it, its balances are exactly those moved by the transfers recorded in it,
every transfer acknowledged before its backup began is there, and no lock is left
(the locks of transactions in flight were resolved by the restore, one of them parked
between its prewrite and its commit point here, deterministically). A restored store
hands out timestamps above every timestamp in the backup.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import percolator
from percolator.__main__ import main
from percolator._notifications import held_locks
from percolator.conformance._bank import ACCOUNTS, check_final, open_accounts
from percolator.testing import Interleaving, client_of

ROOT = Path(__file__).resolve().parents[2]


def _acknowledged(log: Path) -> set[bytes]:
    return set(log.read_bytes().split()) if log.exists() else set()


def _wait_for_more(log: Path, than: int, workers: list[subprocess.Popen[bytes]]) -> None:
    """Until the clients acknowledged more than *than* transfers (they run on)."""
    deadline = time.monotonic() + 120
    while len(_acknowledged(log)) <= than:
        for w in workers:
            if w.poll() is not None:
                error = w.stderr.read().decode()  # type: ignore[union-attr]
                raise AssertionError(f"a bank client died:\n{error}")
        assert time.monotonic() < deadline, "the bank clients acknowledged nothing"
        time.sleep(0.05)


def _largest_timestamp(path: Path) -> int:
    """The largest timestamp of any version of any cell in the file."""
    db = sqlite3.connect(path)
    try:
        tables = [name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")
            if "ts" in {c[1] for c in db.execute(f'PRAGMA table_info("{name}")')}]
        return max(db.execute(f'SELECT coalesce(max(ts), 0) FROM "{t}"').fetchone()[0]
                   for t in tables)
    finally:
        db.close()


def test_backups_taken_while_clients_write_restore_consistent_stores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite://{tmp_path}/bank.db"
    cluster = percolator.connect(url)
    cluster.create_table("accounts")
    cluster.create_table("transfers")
    cluster.create_table("parked")
    open_accounts(cluster, "accounts")
    log = tmp_path / "acknowledged.log"
    workers = [subprocess.Popen(
        [sys.executable, "-m", "tests.transactions._bank_worker", url, str(ACCOUNTS),
         str(seed), str(log)], cwd=ROOT, stderr=subprocess.PIPE) for seed in (1, 2)]
    backups: list[tuple[Path, set[bytes]]] = []
    try:
        for i in range(3):
            _wait_for_more(log, len(_acknowledged(log)), workers)
            before = _acknowledged(log)  # acknowledged before the backup began
            path = tmp_path / f"backup-{i}.db"
            if i == 2:  # a two-phase transfer parked with its locks written, not committed
                with Interleaving(cluster) as world:
                    client = client_of(cluster)
                    client.one_phase_commit = False
                    txn = percolator.Transaction(client)
                    txn.set("parked", b"a", "v:v", b"in flight")
                    txn.set("parked", b"b", "v:v", b"in flight")
                    parked = world.actor("parked", txn.commit, clients=[client])
                    parked.run_until(lambda step: step.matches("timestamp"))
                    assert main(["backup", url, str(path)]) == 0
                    parked.kill()
            else:
                assert main(["backup", url, str(path)]) == 0
            backups.append((path, before))
    finally:
        for w in workers:
            w.kill()
            w.wait()
    cluster.close()

    for i, (path, before) in enumerate(backups):
        restored = f"sqlite://{tmp_path}/restored-{i}.db"
        largest = _largest_timestamp(path)
        assert main(["restore", str(path), restored]) == 0
        with percolator.connect(restored) as copy:
            with percolator.Transaction(copy) as txn:
                assert txn.start_ts > largest  # timestamps never go back
            assert check_final(copy, "accounts", "transfers", before) == []
            with percolator.Snapshot(copy) as snapshot:
                assert list(snapshot.scan("parked")) == []  # rolled back in its copy
            assert not list(held_locks(copy))
    assert "2 lock(s) of transactions in flight resolved" in capsys.readouterr().out


def test_backup_and_restore_refuse_what_they_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite://{tmp_path}/repo.db"
    percolator.connect(url).close()
    (tmp_path / "taken.db").write_bytes(b"")
    assert main(["backup", url, str(tmp_path / "taken.db")]) == 2
    assert "already exists: backup and restore never overwrite" in capsys.readouterr().err
    assert main(["backup", f"sqlite://{tmp_path}/none.db", str(tmp_path / "b.db")]) == 2
    assert "no store at" in capsys.readouterr().err
    assert main(["backup", "hbase://127.0.0.1:9090", str(tmp_path / "b.db")]) == 2
    assert "is not an embedded store" in capsys.readouterr().err
    assert main(["backup", url, str(tmp_path / "b.db")]) == 0
    assert main(["restore", str(tmp_path / "b.db"), url]) == 2  # the original's own file
    assert "already exists" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


def test_the_side_files_docs_call_deletable_are_made_again(tmp_path: Path) -> None:
    """docs/embedded.md: with no process running, every side file but SQLite's own may
    be deleted; the next process makes them again, its timestamps above every one the
    file holds, and the data is all there."""
    url = f"sqlite://{tmp_path}/repo.db"
    with percolator.connect(url) as cluster:
        cluster.create_table("t")
        with percolator.Transaction(cluster) as txn:
            txn.set("t", b"r", "f:q", b"v")
    deletable = ["-ts", "-census", "-locks", "-write.lock", "-writers"]
    docs = (ROOT / "docs" / "embedded.md").read_text()
    for suffix in deletable:
        assert f"`repo.db{suffix}`" in docs
        (tmp_path / f"repo.db{suffix}").unlink()
    largest = _largest_timestamp(tmp_path / "repo.db")
    with percolator.connect(url) as cluster, percolator.Transaction(cluster) as txn:
        assert txn.start_ts > largest
        assert txn.get("t", b"r", "f:q") == b"v"
    assert {f"repo.db{s}" for s in deletable} <= {p.name for p in tmp_path.iterdir()}
