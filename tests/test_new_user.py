"""What a new user meets in the first hour (issue 50): urls taken as meant, missing
extras named, an unreachable ZooKeeper said once, error messages in the user's words,
and the ``percolator`` command's target given as its first argument."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite::memory:"])
def test_an_in_memory_sqlite_url_is_refused_and_creates_nothing(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir("/"))
    with pytest.raises(percolator.InvalidArgument, match="in-memory database is refused"):
        percolator.connect(url)
    assert set(os.listdir("/")) == before  # no /:memory: and its side files
    assert list(tmp_path.iterdir()) == []


def test_a_relative_sqlite_url_is_a_file_of_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with percolator.connect("sqlite:repo.db") as cluster:
        cluster.create_table("t")
        assert cluster.url == f"sqlite://{tmp_path}/repo.db"
    assert (tmp_path / "repo.db").is_file()


def test_four_slashes_name_the_same_absolute_path(tmp_path: Path) -> None:
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:  # 4 slashes
        assert cluster.url == f"sqlite://{tmp_path}/repo.db"
    with pytest.raises(percolator.StoreUnavailable) as missing:
        percolator.connect(f"sqlite:///{tmp_path}/no/such/dir/x.db")
    assert f"directory '{tmp_path}/no/such/dir' does not exist" in str(missing.value)
    assert "//" not in str(missing.value).replace("sqlite://", "")


def test_a_closed_snapshot_is_called_a_snapshot(tmp_path: Path) -> None:
    with percolator.connect(f"sqlite://{tmp_path}/repo.db") as cluster:
        cluster.create_table("t")
        snapshot = percolator.Snapshot(cluster)
        snapshot.close()
        with pytest.raises(percolator.TransactionClosedError) as closed:
            snapshot.get("t", b"r", "f:q")
        assert str(closed.value).startswith(f"snapshot {snapshot.start_ts} is already closed")
        txn = percolator.Transaction(cluster)
        txn.rollback()
        with pytest.raises(percolator.TransactionClosedError, match=r"^transaction "):
            txn.get("t", b"r", "f:q")


@pytest.mark.parametrize("command", [["status"], ["wait", "--timeout", "5"], ["retry"],
                                     ["gc", "--dry-run"]])
def test_the_repository_may_be_the_first_argument(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite://{tmp_path}/repo.db"
    percolator.connect(url).close()
    assert main([command[0], url, *command[1:]]) == 0
    assert main([command[0], "--cluster", url, *command[1:]]) == 0
    with pytest.raises(SystemExit) as neither:
        main(command)
    assert neither.value.code == 2
    assert f"percolator {command[0]} URL" in capsys.readouterr().err


def test_retry_with_the_repository_first_still_takes_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite://{tmp_path}/repo.db"
    percolator.connect(url).close()
    assert main(["retry", url, "documents"]) == 0
    assert "0 notification(s) put back" in capsys.readouterr().out


def _without(modules: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run *code* in a fresh interpreter where importing any of *modules* fails, as
    it does where their extra is not installed."""
    blocker = (f"import sys\nfor m in {modules.split(',')!r}:\n    sys.modules[m] = None\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, "-c", blocker + code], capture_output=True,
                          text=True, env=env, timeout=60, cwd=ROOT)


def test_missing_extras_are_named_not_tracebacks(tmp_path: Path) -> None:
    oracle_cli = _without("grpc", "import runpy, sys\nsys.argv = ['oracle', '--help']\n"
                                  "runpy.run_module('oracle', run_name='__main__')")
    assert oracle_cli.returncode == 2
    assert "pip install 'percolator-txn[oracle]'" in oracle_cli.stderr
    assert "Traceback" not in oracle_cli.stderr
    for modules, call, extra, error in [
        ("kazoo", "percolator.connect('zk://127.0.0.1:1/app')", "zookeeper", "CoordinationError"),
        ("grpc", f"percolator.connect('sqlite://{tmp_path}/r.db', oracle='grpc://127.0.0.1:1')",
         "oracle", "OracleUnavailable"),
        ("happybase", "percolator.connect('hbase://127.0.0.1:1')", "hbase", "InvalidArgument"),
    ]:
        done = _without(modules, "import percolator\ntry:\n    " + call +
                        "\nexcept percolator.PercolatorError as e:\n"
                        "    print(type(e).__name__, e)\n")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(error), done.stdout
        assert f"pip install 'percolator-txn[{extra}]'" in done.stdout


def test_an_unreachable_zookeeper_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """Against a port where nothing listens, kazoo's 'Connection dropped' of each try
    goes to DEBUG; the start ends in one CoordinationError."""
    pytest.importorskip("kazoo")
    from percolator._zk_client import make_client, start_client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    hosts = f"127.0.0.1:{port}"
    client = make_client(hosts, session_timeout=10.0)
    caplog.set_level(logging.DEBUG, logger="kazoo")
    with pytest.raises(percolator.CoordinationError, match="cannot reach ZooKeeper"):
        start_client(client, hosts, 2.0, None)
    dropped = [r for r in caplog.records if "Connection dropped" in r.getMessage()]
    assert dropped, "kazoo tried no connection"  # it did try, and said so at DEBUG
    assert [r for r in caplog.records if r.levelno >= logging.WARNING
            and r.name.startswith("kazoo")] == []
    assert client.logger.starting is False  # a later drop is a warning again


def _template(text: str, directory: Path | None = None) -> str:
    """*text* with what differs from run to run made alike: the directory, owner ids,
    numbers, and the wording of a missing module."""
    if directory is not None:
        text = text.replace(f"{directory}/", "/var/lib/app/").replace(str(directory),
                                                                      "/var/lib/app")
    text = re.sub(r"\((No module named [^)]*|import of [\w.]+ halted; None in sys.modules)\)",
                  "(MISSING)", text)
    text = re.sub(r"\(owner [^)]*\)", "(owner OWNER)", text)
    return re.sub(r"\d+(\.\d+)?", "N", text)


def _troubleshooting_shows(message: str, directory: Path | None = None) -> None:
    page = _template((ROOT / "docs" / "troubleshooting.md").read_text())
    for line in message.strip().splitlines():
        assert _template(line, directory) in page, f"docs/troubleshooting.md lacks: {line}"


def test_troubleshooting_shows_the_messages_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/troubleshooting.md quotes each error as the library prints it: each is made
    here, for real, and its text (up to numbers, paths and ids) must be on the page."""
    from percolator.testing import Interleaving, client_of

    def printed(call: Any) -> str:
        try:
            call()
        except percolator.PercolatorError as e:
            return f"{type(e).__module__}.{type(e).__name__}: {e}"
        raise AssertionError("no error")

    monkeypatch.chdir(tmp_path)
    _troubleshooting_shows(printed(lambda: percolator.connect(
        f"sqlite://{tmp_path}/missing/repo.db")), tmp_path / "missing")
    _troubleshooting_shows(printed(lambda: percolator.connect("sqlite:///:memory:")))
    assert main(["status", f"sqlite://{tmp_path}/repo.db"]) == 2
    _troubleshooting_shows(capsys.readouterr().err, tmp_path)
    for modules, call in [("kazoo", "percolator.connect('zk://127.0.0.1:1/app')"),
                          ("happybase", "percolator.connect('hbase://127.0.0.1:9090')"),
                          ("grpc", "percolator.connect('sqlite:r.db', oracle='grpc://127.0.0.1:7070')")]:
        done = _without(modules, "import percolator\ntry:\n    " + call +
                        "\nexcept percolator.PercolatorError as e:\n"
                        "    print(f'percolator.{type(e).__name__}: {e}')\n")
        _troubleshooting_shows(done.stdout)
    oracle_cli = _without("grpc", "import runpy, sys\nsys.argv = ['oracle']\n"
                                  "runpy.run_module('oracle', run_name='__main__')")
    _troubleshooting_shows(oracle_cli.stderr)

    with percolator.connect("sqlite:repo.db", lock_wait=0.5) as cluster:
        cluster.create_table("accounts")
        with Interleaving(cluster) as world:
            client = client_of(cluster)
            client.one_phase_commit = False
            txn = percolator.Transaction(client)
            txn.set("accounts", b"alice", "bal:v", b"40")
            holder = world.actor("holder", txn.commit, clients=[client])
            holder.run_until(lambda step: step.matches("timestamp"))  # locked, alive
            _troubleshooting_shows(printed(lambda: percolator.Snapshot(cluster).get(
                "accounts", b"alice", "bal:v")))
            holder.finish()
        old = percolator.Snapshot(cluster)
        with percolator.Transaction(cluster) as later:
            later.set("accounts", b"bob", "bal:v", b"1")
        # older than the pass's max_txn_age, or it still holds the safe point back: the
        # commit above can take less than that 1 ms
        time.sleep(0.05)
        cluster.gc(retention=0, max_txn_age=0.001)
        _troubleshooting_shows(printed(lambda: old.get("accounts", b"bob", "bal:v")))
        old.close()
