"""The namespace harness itself (tests/faults/_netns.py): nodes reach each other over
the bridge, a partition cuts a node off and a heal brings it back, SIGSTOP really
stops a process, and nothing is left behind, even after a failure inside the block."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests._concurrency import ROOT
from tests.faults._netns import Network, require_netns, wait_until

LISTENER = (
    "import socket, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', 7000)); s.listen(16)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.close()\n"
)


@pytest.fixture
def _needs_netns() -> None:
    require_netns()


needs_netns = pytest.mark.usefixtures("_needs_netns")


def process_state(pid: int) -> str:
    # field 3 of /proc/PID/stat, after the parenthesised command name
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


@needs_netns
def test_partition_heal_pause_and_cleanup(tmp_path: Path) -> None:
    with Network(tmp_path) as net:
        net.add_bridge("main")
        a, b = net.add_node("a"), net.add_node("b")
        assert a.ip != b.ip and a.ip.startswith("10.231.0.")
        server = a.spawn([sys.executable, "-c", LISTENER], name="listener")
        wait_until(lambda: b.can_connect(a.ip, 7000), 30, "the listener")
        # addresses exist only inside the namespaces
        assert a.can_connect("127.0.0.1", 7000)
        assert not b.can_connect("127.0.0.1", 7000)

        net.partition("a")
        assert not b.can_connect(a.ip, 7000, timeout=1.0)
        net.heal()
        wait_until(lambda: b.can_connect(a.ip, 7000), 30, "the healed link")

        server.pause()
        wait_until(lambda: process_state(server.pid) == "T", 10, "SIGSTOP")
        server.resume()
        wait_until(lambda: process_state(server.pid) != "T", 10, "SIGCONT")

        old = server.pid
        server.restart()
        assert server.pid != old and server.starts == 2
        wait_until(lambda: b.can_connect(a.ip, 7000), 30, "the restarted listener")
        pid = server.pid
    assert net.leftovers() == []
    assert not Path(f"/proc/{pid}").exists() or process_state(pid) == "Z"


@needs_netns
def test_cleanup_after_a_failure(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), Network(tmp_path) as net:
        net.add_bridge("main")
        node = net.add_node("a")
        proc = node.spawn(["sleep", "600"], name="sleeper")
        proc.pause()
        net.partition("a")
        raise RuntimeError("boom")
    assert net.leftovers() == []
    assert proc.process is not None and proc.process.poll() is not None


@needs_netns
def test_two_bridges_split_a_node_from_one_side_only(tmp_path: Path) -> None:
    with Network(tmp_path) as net:
        net.add_bridge("main")
        net.add_bridge("side")
        a = net.add_node("a")
        b = net.add_node("b", ["main"])
        c = net.add_node("c", ["side"])
        a.spawn([sys.executable, "-c", LISTENER], name="listener")
        wait_until(lambda: b.can_connect(a.addresses["main"], 7000), 30, "the listener")
        assert c.can_connect(a.addresses["side"], 7000)
        net.partition("a", ["main"])
        assert not b.can_connect(a.addresses["main"], 7000)
        assert c.can_connect(a.addresses["side"], 7000)
    assert net.leftovers() == []


@needs_netns
def test_a_killed_creator_s_network_is_swept(tmp_path: Path) -> None:
    """A test process killed with SIGKILL runs no clean-up: the next network deletes
    what it left (its children died with it)."""
    script = (
        "import os, signal, sys\n"
        "from tests.faults._netns import Network\n"
        f"net = Network({str(tmp_path)!r})\n"
        "net.add_bridge('main'); net.add_node('a')\n"
        "print(net.suffix, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    suffix = done.stdout.strip()
    assert suffix, done.stderr
    assert suffix in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                    text=True).stdout
    with Network(tmp_path / "next") as net:
        assert suffix not in " ".join(net.leftovers())
        listing = subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                                 text=True).stdout
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert suffix not in listing and suffix not in netns


@pytest.mark.parametrize("ci", ["", "true"])
def test_without_root_the_suite_skips_or_fails_in_ci(monkeypatch: pytest.MonkeyPatch,
                                                      ci: str) -> None:
    from tests.faults import _netns

    monkeypatch.setattr(_netns, "_probed", [])
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="need root"):
        require_netns()
