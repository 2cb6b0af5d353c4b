"""The launcher of the suite's real HBase (``tests/_hbase_local.py``): each way it can
fail to start says what failed, before any JVM runs. (That it starts, answers and
leaves nothing running is checked by every hbase test and by test_hbase_real_faults.py.)"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from tests._hbase_local import HBaseStartError, LocalHBase, classpath, java

pytestmark = pytest.mark.hbase


def test_a_missing_java_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(HBaseStartError, match=f"JAVA_HOME={tmp_path} has no bin/java"):
        java()


def test_a_pom_maven_cannot_resolve_quotes_maven(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if shutil.which("mvn") is None:
        pytest.skip("mvn is not installed")
    monkeypatch.setattr("tests._hbase_local.CACHE", tmp_path / "cache")
    pom = tmp_path / "pom.xml"
    pom.write_text("<project><modelVersion>4.0.0</modelVersion><groupId>x</groupId>"
                   "<artifactId>y</artifactId><version>1</version><packaging>pom</packaging>"
                   "<dependencies><dependency><groupId>percolator.nosuch</groupId>"
                   "<artifactId>nosuch</artifactId><version>0.0.0</version></dependency>"
                   "</dependencies></project>")
    with pytest.raises(HBaseStartError, match=r"mvn could not resolve HBase from .*pom.xml") as e:
        classpath(pom)
    assert "nosuch" in str(e.value)  # Maven's own words follow


def test_a_taken_port_is_named(tmp_path: Path) -> None:
    hbase = LocalHBase(tmp_path)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", hbase.zk_port))
            s.listen()
            with pytest.raises(HBaseStartError, match=f"port {hbase.zk_port} .* is taken"):
                hbase.start()
        assert hbase.hbase is None  # no JVM was started
    finally:
        hbase.stop()


def test_a_process_attached_to_the_shared_hbase_knows_its_jvms(local_hbase: LocalHBase) -> None:
    """Another test process (an xdist worker) attaches to the session's HBase from its
    description, and still knows the JVMs' pids (bench/peers.py measures their CPU):
    the peers smoke test failed on every worker but the one that had started HBase."""
    described = {"dir": str(local_hbase.dir), "thrift_args": local_hbase.thrift_args,
                 "ports": [local_hbase.zk_port, local_hbase.master_port,
                           local_hbase.regionserver_port, local_hbase.thrift_port],
                 "pids": list(local_hbase.jvm_pids)}
    attached = LocalHBase.attached(described)
    assert attached.hbase is None and attached.thrift is None  # not its JVMs to stop
    assert attached.jvm_pids == local_hbase.jvm_pids
    for pid in attached.jvm_pids:
        assert Path(f"/proc/{pid}").exists()
    with pytest.raises(RuntimeError, match="neither started nor attached"):
        _ = LocalHBase(local_hbase.dir / "elsewhere").jvm_pids


def test_scripts_hbase_runs_without_a_virtualenv() -> None:
    """Outside any virtualenv (only /usr/bin:/bin on PATH, which has ``python3`` but
    no ``python``) scripts/hbase still starts the launcher."""
    import subprocess

    if not shutil.which("python3", path="/usr/bin:/bin"):
        pytest.skip("no python3 in /usr/bin:/bin")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [str(root / "scripts" / "hbase"), "--help"], env={"PATH": "/usr/bin:/bin",
                                                       "HOME": str(Path.home())},
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--region-servers" in result.stdout


def test_admin_without_a_cluster_directory_says_what_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests._hbase_local import main

    with pytest.raises(SystemExit):
        main(["--admin", "servers", "--dir", str(tmp_path)])
    assert "--admin needs the --dir of a running" in capsys.readouterr().err


def test_the_suites_jvms_take_its_jvm_options(
    local_hbase: LocalHBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite's HBase JVMs run with ``PERCOLATOR_JVM_OPTS`` (C1 only, by
    tests/conftest.py's default: half their CPU), and the variable unset adds
    nothing, as for ``scripts/hbase`` and bench/."""
    from tests._hbase_local import JVM_OPTIONS_ENV, jvm_options

    options = jvm_options()
    assert options, f"{JVM_OPTIONS_ENV} is empty in the test session"
    for pid in local_hbase.jvm_pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert set(options) <= set(argv), (pid, argv[:6])
    monkeypatch.delenv(JVM_OPTIONS_ENV)
    assert jvm_options() == []
    monkeypatch.setenv(JVM_OPTIONS_ENV, " -XX:TieredStopAtLevel=1  -Xss1m ")
    assert jvm_options() == ["-XX:TieredStopAtLevel=1", "-Xss1m"]


def test_the_session_hbase_keeps_zookeeper_sessions_for_two_minutes(
    local_hbase: LocalHBase,
) -> None:
    """The ZooKeeper in the session's HBase grants sessions of 2 minutes (its master's
    own expired after 30 s at load 40-60, and the master aborted): a client asking for
    them is given them, not the 40 s ZooKeeper caps sessions at by default."""
    from kazoo.client import KazooClient

    from tests._hbase_local import LOCAL_SESSION

    zk = KazooClient(hosts=f"127.0.0.1:{local_hbase.zk_port}", timeout=120.0)
    zk.start(timeout=60)
    try:
        assert zk._session_timeout >= 120_000  # as negotiated with the server, in ms
    finally:
        zk.stop()
        zk.close()
    # Its master and region server ask for 2 minutes too: a standalone HBase takes their
    # session from this property (HBase's default 10 s), not zookeeper.session.timeout.
    site = (local_hbase.dir / "conf" / "hbase-site.xml").read_text()
    assert f"<name>{LOCAL_SESSION}</name><value>120000</value>" in site


def test_a_process_the_launcher_starts_dies_with_its_starter_even_by_kill_9() -> None:
    """What the launcher starts (each JVM) runs in a session of its own and gets SIGKILL
    when its starter dies, even by kill -9; and where ``setpriv`` exists no Python code
    runs between fork and exec (a ``preexec_fn`` there aborted a child forked from a
    worker whose gRPC threads ran: the multi-server master "exited with -6")."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests._hbase_local import _spawned

    _argv, options = _spawned(["sleep", "300"])
    assert ("preexec_fn" in options) is (shutil.which("setpriv") is None)
    root = Path(__file__).resolve().parents[2]
    starter = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "from tests._hbase_local import _spawned\n"
         "argv, options = _spawned(['sleep', '300'])\n"
         "print(subprocess.Popen(argv, **options).pid, flush=True)\n"
         "time.sleep(300)\n"],
        cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        child = int(starter.stdout.readline())
        assert os.getsid(child) == child
        # Popen returns once setpriv runs, which sets the death signal and then runs the
        # command: a starter killed in between leaves an orphan (seen once, on a loaded
        # machine), so the kill waits until the command runs. A JVM takes seconds to
        # start; a starter dying in setpriv's first milliseconds is not what this asks.
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child}/comm").read_text().strip() != "sleep":
            assert time.monotonic() < deadline, "the command never ran"
            time.sleep(0.01)
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=30)

        def gone() -> bool:
            try:
                with open(f"/proc/{child}/stat") as stat:
                    return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
            except FileNotFoundError:
                return True

        deadline = time.monotonic() + 30
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(), f"pid {child} outlived its starter's kill -9"
    finally:
        starter.kill()
        starter.wait()
