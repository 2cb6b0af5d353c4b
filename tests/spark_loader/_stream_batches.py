"""The exactly-once tests of ``writeStream.format("percolator")``: their micro-batches,
the kill of a driver parked at a named point, and what the table must hold afterwards.
Shared by the local Spark test and its fast twin (tests/spark_loader/test_source.py)
and by the Spark-cluster test (tests/hbase/test_hbase_multi_server.py).

Micro-batch *b* holds rows ``k<b>-0`` .. ``k<b>-9`` with ``v:n`` = 100 b + i; on disk
it is one JSON-lines file, ``f<b>.json``, whose modification time orders the batches
(the file source reads one file per trigger, oldest first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import percolator
from percolator._bulk import LOADS_TABLE
from percolator._internals import internals
from percolator._store import Read

ROWS = 10
PARK_ENV = "_PERCOLATOR_TEST_PARK_AFTER_PREWRITE"
"""spark_loader/_stream_write.py's parking directory (tests only)."""


def rows_of(batch: int) -> list[tuple[str, int]]:
    """(row, ``v:n``) of micro-batch *batch*."""
    return [(f"k{batch}-{i}", batch * 100 + i) for i in range(ROWS)]


def write_batch_files(source: Path, batches: int) -> None:
    """Micro-batches 0 .. *batches* - 1 as files in *source*, oldest first."""
    source.mkdir(parents=True, exist_ok=True)
    for batch in range(batches):
        path = source / f"f{batch}.json"
        path.write_text("".join(json.dumps({"row": row, "v:n": value}) + "\n"
                                for row, value in rows_of(batch)))
        os.utime(path, (batch + 1, batch + 1))


def kill_when_parked(start: Callable[[dict[str, str]], subprocess.Popen[bytes]], park: Path,
                     point: str, timeout: float, output: Path | None = None) -> None:
    """Start a driver (``start(env)``, in a session of its own: its JVM and Python
    workers share its process group) whose writer parks at *point* (``prewritten-N``:
    a task of batch N after its prewrite; ``committed-N``: the commit of batch N after
    its commit point), wait until it is parked there, and ``kill -9`` its process
    group. A driver that exits first fails the test with its output (its pipe, or
    the file *output*)."""
    park.mkdir(exist_ok=True)
    (park / f"park-{point}").touch()
    driver = start({PARK_ENV: str(park)})
    try:
        deadline = time.monotonic() + timeout
        while not (park / point).exists():
            if driver.poll() is not None:
                out = (driver.communicate()[0] or b"").decode(errors="replace")
                if output is not None:
                    out += output.read_text(errors="replace")
                raise AssertionError(f"the driver exited ({driver.returncode}) before "
                                     f"{point}:\n{out[-3000:]}")
            if time.monotonic() > deadline:
                last = output.read_text(errors="replace")[-3000:] if output else ""
                raise AssertionError(f"the driver did not reach {point} in {timeout:.0f} s"
                                     + (f"; its last output:\n{last}" if last else ""))
            time.sleep(0.05)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    (park / f"park-{point}").unlink()


def assert_every_row_once(url: str, table: str, batches: int) -> None:
    """Every row of micro-batches 0 .. *batches* - 1 is in *table* with its value, every
    cell has exactly one write record (no batch committed twice), and each batch is
    one load committed once."""
    with percolator.connect(url) as cluster:
        snap = percolator.Snapshot(cluster)
        got = {r: v["v:n"] for r, v in snap.scan(table, None, None, ["v:n"])}
        assert got == {row.encode(): str(value).encode()
                       for b in range(batches) for row, value in rows_of(b)}
        store = internals(cluster).store
        writes = store.scan(table, None, None, [Read("w", versions=None)])
        assert all(len(versions) == 1 for _, cells in writes for versions in cells.values())
        loads = {r: cells for r, cells in store.scan(
            LOADS_TABLE, None, None, [Read("w", versions=None)]) if r.startswith(b"stream-")}
        assert len(loads) == batches  # one committed load per batch, none twice:
        assert all(len([ts for ts, record in versions if record[:1] != b"R"]) == 1
                   for cells in loads.values() for versions in cells.values())
