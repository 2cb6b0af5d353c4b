"""A Ubiq application for the tests and worker processes: per-unit partial counts of
JSONL records by key (and a counts file per unit), a roll-up observer, a writer that
appends to growing files and a copier that replicates them to a lagging site."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import percolator
from observers import Observer, ubiq
from observers.ubiq import _pipeline

PARTIALS, TOTALS, ATTEMPTS = "app.partials", "app.totals", "app.attempts"


class Counts(ubiq.Application):
    """Counts records per key ``k``; a record without one is refused (BadRecord)."""

    def __init__(self, files: bool = False, slow: float = 0.0) -> None:
        self.files, self.slow = files, slow

    def process(self, unit: ubiq.WorkUnit, out: ubiq.Output) -> None:
        counts: Counter[str] = Counter()
        for record in unit.records():
            try:
                counts[json.loads(record.data)["k"]] += 1
            except (ValueError, KeyError) as e:
                raise ubiq.BadRecord(f"bad record at {record.offset}: {e}") from None
        if self.slow:
            time.sleep(self.slow)
        for key, n in counts.items():  # a partial aggregate per unit: no hot cell
            out.set(PARTIALS, f"{key}/{unit.id}".encode(), "c:n", b"%d" % n)
        out.set(ATTEMPTS, unit.id.encode(), "a:owner", str(os.getpid()).encode())
        if self.files:
            with out.file("counts.json") as f:
                f.write(json.dumps(dict(sorted(counts.items()))).encode())


class RollUp(Observer):
    """Adds each committed partial into its key's total, once (the observer's ack)."""

    table, column = PARTIALS, "c:n"

    def process(self, txn: percolator.TransactionBase, row: bytes, column: str) -> None:
        key = row.split(b"/", 1)[0]
        n = int(txn.get(PARTIALS, row, column) or b"0")
        txn.set(TOTALS, key, "t:n", b"%d" % (int(txn.get(TOTALS, key, "t:n") or b"0") + n))


def pipeline(cluster: percolator.Cluster, root: Path, **options: object) -> ubiq.LogPipeline:
    for table in (PARTIALS, TOTALS, ATTEMPTS):
        cluster.create_table(table)
    cluster.observe(PARTIALS, "c:n")  # before any unit commits a partial
    options.setdefault("unit_bytes", 2048)
    options.setdefault("max_unit_delay", 0.3)
    options.setdefault("track_interval", 0.1)
    options.setdefault("local_eta", 30.0)
    app = options.pop("app", Counts())
    return ubiq.LogPipeline(cluster, "logs", app=app,  # type: ignore[arg-type]
                            sites={"a": root / "a", "b": root / "b"}, pattern="*.jsonl",
                            sink=root / "sink", **options)  # type: ignore[arg-type]


def cut(p: ubiq.LogPipeline, name: str) -> int:
    """What a worker's cutter of *name*, then its packer, do (each in a transaction of
    its own, as they run): the units they made."""
    with percolator.Transaction(p.cluster) as txn:
        made = _pipeline.cut_file(txn, p, name, _pipeline._now_ms())
    with percolator.Transaction(p.cluster) as txn:
        return made + _pipeline.pack_tails(txn, p, _pipeline._now_ms())


def make(cluster: percolator.Cluster) -> ubiq.LogPipeline:
    """The pipeline of worker processes: UBIQ_ROOT, UBIQ_SLOW, UBIQ_ETA, UBIQ_FILES,
    UBIQ_SITE_ETA (with it, units of 512 bytes cut at once)."""
    app = Counts(files=bool(os.environ.get("UBIQ_FILES")),
                 slow=float(os.environ.get("UBIQ_SLOW", "0")))
    site_eta = os.environ.get("UBIQ_SITE_ETA")
    extra: dict[str, object] = {} if site_eta is None else {
        "site_eta": float(site_eta), "unit_bytes": 512, "max_unit_delay": 0}
    return pipeline(cluster, Path(os.environ["UBIQ_ROOT"]), app=app,
                    local_eta=float(os.environ.get("UBIQ_ETA", "30")), **extra)


def partial_totals(cluster: percolator.Cluster) -> Counter[str]:
    totals: Counter[str] = Counter()
    with percolator.Snapshot(cluster) as snap:
        for row, cells in snap.scan(PARTIALS, None, None, ["c:n"]):
            totals[row.split(b"/", 1)[0].decode()] += int(cells["c:n"])
    return totals


def batch_counts(directory: Path) -> Counter[str]:
    """The reference: a batch count over the final files."""
    counts: Counter[str] = Counter()
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_bytes().split(b"\n")[:-1]:
            try:
                counts[json.loads(line)["k"]] += 1
            except (ValueError, KeyError):
                pass
    return counts


class Writer(threading.Thread):
    """Appends records to *files* files at site a, sometimes half a record at a time
    (the other half later); a copier thread replicates to site b with a lag."""

    def __init__(self, root: Path, files: int, records: int, seed: int,
                 corrupt: int = 0) -> None:
        super().__init__(daemon=True)
        self.root, self.files, self.records = root, files, records
        self.rng = random.Random(seed)
        self.corrupt = corrupt
        self.done = threading.Event()
        (root / "a").mkdir(parents=True, exist_ok=True)
        (root / "b").mkdir(parents=True, exist_ok=True)

    def run(self) -> None:
        held: dict[int, bytes] = {}
        corrupt_at = set(self.rng.sample(range(self.records), self.corrupt))
        for i in range(self.records):
            f = self.rng.randrange(self.files)
            line = (b"{not json\n" if i in corrupt_at else
                    json.dumps({"k": f"k{self.rng.randrange(7)}", "i": i}).encode() + b"\n")
            with open(self.root / "a" / f"log{f:02d}.jsonl", "ab") as out:
                if f in held:
                    out.write(held.pop(f))
                if self.rng.random() < 0.1:  # half now, half with the next write
                    half = len(line) // 2
                    out.write(line[:half])
                    held[f] = line[half:]
                else:
                    out.write(line)
            if i % 20 == 0:
                time.sleep(0.005)
                self.copy()
        for f, rest in held.items():
            with open(self.root / "a" / f"log{f:02d}.jsonl", "ab") as out:
                out.write(rest)
        self.copy()
        self.done.set()

    def copy(self) -> None:
        """Site b: a copy of site a, a file at a time (so lagging, and mid-record)."""
        for path in (self.root / "a").glob("*.jsonl"):
            target = self.root / "b" / path.name
            tmp = target.with_suffix(".tmp")
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
