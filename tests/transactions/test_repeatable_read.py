"""Across processes, a snapshot never changes under a reader: a start timestamp drawn
while an embedded one-phase commit is in flight is below it (the commit's gap) or is
handed out only once that commit is visible (docs/timestamps.md), so no reader reads
at a timestamp above a commit it cannot see yet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import percolator

ROOT = Path(__file__).resolve().parents[2]


def test_reads_repeat_while_other_processes_commit(store_url: str) -> None:
    _reads_repeat(store_url)


def test_reads_repeat_when_start_timestamps_wait_for_embedded_commits(tmp_path: Path) -> None:
    """A gap of one start timestamp below each one-phase commit: most start timestamps
    drawn during a commit are above it and wait for it."""
    _reads_repeat(f"sqlite://{tmp_path}/db", "1")


def _reads_repeat(store_url: str, *gap: str) -> None:
    with percolator.connect(store_url) as cluster:
        cluster.create_table("t")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.transactions._rr_worker", store_url, role, "4", *gap],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for role in ("writer", "writer", "reader", "reader")
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    with percolator.connect(store_url) as cluster:
        values = {r: v["c:n"] for r, v in percolator.Transaction(cluster).scan("t")}
    assert len(set(values.values())) == 1 and int(next(iter(values.values()))) > 0
