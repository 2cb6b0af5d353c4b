"""The Bigtable emulator (``cbtemulator``) for the suite.

``bigtable_emulator`` (session scope) starts the emulator binary on a free loopback
port, waits until it accepts connections and yields ``"127.0.0.1:PORT"``; it is killed
at the end of the session (and at interpreter exit, whatever happens).
``bigtable_store_url(hostport, name)`` gives a store URL isolated from every other
test (its own table prefix). A missing binary or a missing ``google-cloud-bigtable``
fails in CI and skips elsewhere.
"""

from __future__ import annotations

import atexit
import os
import re
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest

from tests._services import free_port, service_missing, stop_process

CBTEMULATOR = os.environ.get(
    "PERCOLATOR_CBTEMULATOR", "/usr/lib/google-cloud-sdk/platform/bigtable-emulator/cbtemulator"
)
STARTUP_SECONDS = 30.0


def start_emulator(
    host: str = "127.0.0.1", netns: str | None = None, port: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``cbtemulator`` on *host* (default loopback) and *port* (default a free
    one); return the process and ``host:port``. With *netns* it runs inside that Linux
    network namespace (the fault suite's ``tests/faults/_netns.py``), and is probed from
    inside it.

    The caller must kill the process (an atexit hook does so as a last resort).
    """
    if not os.access(CBTEMULATOR, os.X_OK):
        service_missing(
            f"the Bigtable emulator {CBTEMULATOR} is missing: install the Google Cloud SDK "
            "component 'bigtable' (gcloud components install bigtable, or the Debian package "
            "google-cloud-cli-bigtable-emulator), or set PERCOLATOR_CBTEMULATOR"
        )
    try:
        import google.cloud.bigtable_v2  # noqa: F401
    except ImportError:
        service_missing(
            "google-cloud-bigtable is not installed: pip install 'percolator-txn[bigtable]'"
        )
    port = port or free_port()
    inside = ["setpriv", "--pdeathsig", "KILL", "ip", "netns", "exec", netns] if netns else []
    with tempfile.TemporaryFile() as log:  # the emulator's output, quoted if it dies
        proc = subprocess.Popen(
            [*inside, CBTEMULATOR, "-host", host, "-port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        atexit.register(stop_process, proc)
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if proc.poll() is not None:
                log.seek(0)
                output = log.read().decode(errors="replace")
                pytest.fail(f"cbtemulator exited with {proc.returncode} at startup: {output}")
            if _listening(host, port, netns):
                break
            if time.monotonic() > deadline:
                stop_process(proc)
                pytest.fail(f"cbtemulator did not listen on {host}:{port} in time")
            time.sleep(0.05)
    return proc, f"{host}:{port}"


def _listening(host: str, port: int, netns: str | None) -> bool:
    if netns is not None:
        from tests.faults._netns import can_connect

        return can_connect(netns, host, port)
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def bigtable_emulator() -> Iterator[str]:
    """``host:port`` of a Bigtable emulator running for the whole session."""
    proc, hostport = start_emulator()
    try:
        yield hostport
    finally:
        stop_process(proc)


def bigtable_store_url(hostport: str, unique_name: str) -> str:
    """A ``bigtable://`` URL on the emulator at *hostport* whose tables no other
    test sees: the table prefix is derived from *unique_name* plus a random suffix."""
    slug = re.sub(r"[^a-zA-Z0-9]+", "_", unique_name).strip("_")[:16] or "t"
    prefix = f"{slug}_{uuid.uuid4().hex[:8]}"
    return f"bigtable://test-project/test-instance?emulator={hostport}&table_prefix={prefix}"
