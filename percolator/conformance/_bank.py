"""The bank under kill -9: client processes make random transfers, and are killed
with SIGKILL at random moments and restarted, while this process reads.

Each transfer moves an amount between two accounts and records itself in the
transfers table in the same transaction; a client appends the transfer's id to its
log only after ``commit`` returned. Checked:

* every read transaction (one between two kills, and at the end) sees the initial
  total (``bank total``);
* the final balances are the initial ones moved by exactly the recorded transfers
  (``half-applied transfer``), and every acknowledged transfer is recorded
  (``lost transfer``);
* once a reader has met them, the killed clients left no lock (``unresolved lock``).

The clients are ``python -m percolator.conformance._bank_client``, connected as this
run is (same url, oracle, ZooKeeper and TLS flags).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import percolator
from percolator._cluster import Cluster
from percolator._errors import LockedError
from percolator._transaction import Transaction, TransactionBase
from percolator.conformance._core import Anomaly, CheckResult, Target, unresolved_locks

ACCOUNTS = 8
INITIAL = 1000
CLIENTS = 3
MIN_KILLS = 4
FINAL_READ_ATTEMPTS = 3
BALANCE = "bal:v"
MOVE = "t:move"


def account(i: int) -> bytes:
    return b"acct%03d" % i


def transfer(txn: TransactionBase, accounts: str, transfers: str, tid: bytes, src: int,
             dst: int, amount: int) -> None:
    """Move *amount* from account *src* to *dst*, recording it as *tid*."""
    a = int(txn.get(accounts, account(src), BALANCE) or b"0")
    b = int(txn.get(accounts, account(dst), BALANCE) or b"0")
    txn.set(accounts, account(src), BALANCE, str(a - amount).encode())
    txn.set(accounts, account(dst), BALANCE, str(b + amount).encode())
    txn.set(transfers, tid, MOVE, b"%d %d %d" % (src, dst, amount))


def open_accounts(cluster: Cluster, accounts: str) -> None:
    with Transaction(cluster) as txn:
        for i in range(ACCOUNTS):
            txn.set(accounts, account(i), BALANCE, str(INITIAL).encode())


def read_total(cluster: Cluster, accounts: str) -> None:
    """:raises Anomaly: if one snapshot does not hold the initial total."""
    with Transaction(cluster) as txn:
        balances = {row: int(v[BALANCE]) for row, v in txn.scan(accounts)}
        if sum(balances.values()) != ACCOUNTS * INITIAL:
            raise Anomaly("bank total", f"transaction {txn.start_ts} read a total of "
                          f"{sum(balances.values())}, not {ACCOUNTS * INITIAL}: {balances}")


def check_final(cluster: Cluster, accounts: str, transfers: str, acknowledged: set[bytes]
                ) -> list[Anomaly]:
    """The bank's invariants once every client is dead: reading resolves the locks
    they left."""
    found = []
    # With ZooKeeper a killed client's locks are honoured until its session expires:
    # a read may wait longer than its lock_wait for them.
    for attempt in range(FINAL_READ_ATTEMPTS):
        try:
            with Transaction(cluster) as final:
                balances = {row: int(v[BALANCE]) for row, v in final.scan(accounts)}
                moves = {row: v[MOVE] for row, v in final.scan(transfers)}
            break
        except LockedError:
            if attempt == FINAL_READ_ATTEMPTS - 1:
                raise
    if sum(balances.values()) != ACCOUNTS * INITIAL:
        found.append(Anomaly("bank total", f"the final total is {sum(balances.values())}, "
                             f"not {ACCOUNTS * INITIAL}"))
    expected = {account(i): INITIAL for i in range(ACCOUNTS)}
    for move in moves.values():
        src, dst, n = (int(x) for x in move.split())
        expected[account(src)] -= n
        expected[account(dst)] += n
    wrong = {row: (balances.get(row), want) for row, want in expected.items()
             if balances.get(row) != want}
    if wrong:
        found.append(Anomaly("half-applied transfer", f"balances differ from the initial "
                             f"ones moved by the {len(moves)} recorded transfers "
                             f"(account: (balance, expected)): {wrong}"))
    lost = sorted(acknowledged - set(moves))
    if lost:
        found.append(Anomaly("lost transfer", f"{len(lost)} transfer(s) acknowledged to a "
                             f"client are not recorded: {lost[:5]}"))
    left = unresolved_locks(cluster, [accounts, transfers])
    if left:
        found.append(Anomaly("unresolved lock", f"{len(left)} lock(s) left by killed clients "
                             f"after a full read: {left[:3]}"))
    return found


def _client_env() -> dict[str, str]:
    """The environment of a client: the same percolator as this process imports."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(percolator.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def check(target: Target, result: CheckResult) -> None:
    accounts, transfers = target.table("bank_acct"), target.table("bank_log")
    open_accounts(target.cluster, accounts)
    rng = target.rng
    with tempfile.TemporaryDirectory(prefix="percolator-conformance-") as tmp:
        log = Path(tmp) / "acknowledged"
        seeds = iter(range(rng.randrange(1 << 30), 1 << 31))

        stderr_of: dict[int, Path] = {}  # pid -> the client's stderr

        def start() -> subprocess.Popen[bytes]:
            seed = next(seeds)
            path = Path(tmp) / f"client-{seed}"
            # stderr to a file, not a pipe nobody drains: quoted if the client dies
            with open(path.with_suffix(".err"), "wb") as err:
                client = subprocess.Popen(
                    [sys.executable, "-m", "percolator.conformance._bank_client",
                     *target.connection.argv(), "--accounts", accounts, "--transfers",
                     transfers, "--seed", str(seed), "--log", str(log),
                     "--ready", str(path.with_suffix(".ready"))],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    env=_client_env())
            stderr_of[client.pid] = path
            return client

        clients = [start() for _ in range(CLIENTS)]
        ready: list[float | None] = [None] * CLIENTS  # when each client had connected
        lives = [rng.uniform(0.3, 1.5) for _ in range(CLIENTS)]
        kills = 0
        # A slow cluster (or host: a client takes seconds to start, tens on a loaded
        # one) gets more time for its first acknowledged transfer and its kills: until
        # its kills are done, the check goes on while clients keep connecting, and gives
        # up once none has for *stall* seconds.
        share = max(target.remaining(), 0.0)
        stall = max(3 * share, share + 30.0)
        progress = time.monotonic()
        try:
            while time.monotonic() < progress + stall and (
                    target.remaining() > 0 or kills < MIN_KILLS or not _acknowledged(log)):
                time.sleep(rng.uniform(0.05, 0.25))
                for i, client in enumerate(clients):
                    if client.poll() is not None:
                        err = stderr_of[client.pid].with_suffix(".err").read_text(
                            errors="replace")
                        raise RuntimeError(f"a bank client died on its own (exit "
                                           f"{client.returncode}):\n{err[-2000:]}")
                    if ready[i] is None and stderr_of[client.pid].with_suffix(".ready").exists():
                        ready[i] = now = time.monotonic()
                        if kills < MIN_KILLS:  # past them, connections are no progress
                            progress = now
                # Kill a client a random 0.3-1.5 s after it connected (starting Python
                # takes seconds on a loaded host): the kill lands amid its transfers.
                due = [i for i, since in enumerate(ready)
                       if since is not None and time.monotonic() - since >= lives[i]]
                if due:
                    victim = rng.choice(due)
                    os.kill(clients[victim].pid, signal.SIGKILL)
                    clients[victim].wait()
                    kills += 1
                    clients[victim], ready[victim] = start(), None
                    lives[victim] = rng.uniform(0.3, 1.5)
                try:
                    read_total(target.cluster, accounts)
                    result.count("totals read")
                except Anomaly as seen:
                    result.add(seen.kind, seen.detail)
                except LockedError:
                    # a killed client's lock, honoured until ZooKeeper sees it dead
                    result.count("reads that met a dead client's live lock")
        finally:
            for c in clients:
                c.kill()
                c.wait()
        acknowledged = set(log.read_bytes().split()) if log.exists() else set()
    result.count("clients killed", kills)
    result.count("transfers acknowledged", len(acknowledged))
    if kills < MIN_KILLS:
        raise RuntimeError(f"only {kills} client(s) killed (of {MIN_KILLS}): no client "
                           f"connected in the last {stall:.0f}s, so clients start too "
                           "slowly here (try a longer --duration)")
    for anomaly in check_final(target.cluster, accounts, transfers, acknowledged):
        result.add(anomaly.kind, anomaly.detail)
    if not acknowledged:
        raise RuntimeError(f"no transfer was acknowledged in {kills} client lives; "
                           + _probe(target.cluster, accounts, transfers))


def _probe(cluster: Cluster, accounts: str, transfers: str) -> str:
    """What one transfer made by this process says: the reason clients got nowhere."""
    began = time.monotonic()
    try:
        percolator.transactional(retries=3)(transfer)(cluster, accounts, transfers, b"probe",
                                                      0, 1, 1)
    except Exception as e:
        return (f"a transfer made by the checking process failed after "
                f"{time.monotonic() - began:.1f}s: {type(e).__name__}: {e}")
    return (f"a transfer made by the checking process took {time.monotonic() - began:.1f}s: "
            "is the cluster this slow? (try a longer --duration)")


def _acknowledged(log: Path) -> bool:
    return log.exists() and log.stat().st_size > 0
