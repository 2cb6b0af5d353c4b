"""Ubiq on Percolator (issue 18), all in one run: records/s of one process against a
batch pass over the same bytes (the same ``process`` and raw store writes), duplicate
work without faults, append-to-commit latency against its own bound, and the freshness
of an incremental update against a full batch re-aggregation; with ``--units N``
(issue 35), the State Server's size after N small units with and without its garbage
collector, and a lease sweep through the pending-units index against a scan of every
unit (what the sweep read before the index).

    python bench/ubiq.py [--records 20000] [--units 100000] [--write]

``--write`` replaces the section ``## Ubiq (bench/ubiq.py)`` of BENCHMARKS.md.
Embedded store (SQLite), one worker process.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import percolator  # noqa: E402
from bench._common import header, publish  # noqa: E402
from observers import Worker, ubiq  # noqa: E402
from percolator.ext import (  # noqa: E402
    FAMILIES,
    Mutation,
    Read,
    internals,
)

SECTION = "## Ubiq (bench/ubiq.py)"
FILES = 10
UNIT_BYTES = 256 << 10
TIMING = {"track": 0.2, "delay": 0.3}
"""The tracker's interval and the max unit delay (seconds), set from the command line."""


class Counts(ubiq.Application):
    """Per-unit partial counts by key; records the bytes it read and how long it took."""

    def __init__(self) -> None:
        self.bytes = 0
        self.seconds: list[float] = []
        self.lock = threading.Lock()

    def process(self, unit: ubiq.WorkUnit, out: ubiq.Output) -> None:
        began = time.perf_counter()
        counts: Counter[str] = Counter()
        for record in unit.records():
            counts[json.loads(record.data)["k"]] += 1
        for key, n in counts.items():
            out.set("partials", f"{key}/{unit.id}".encode(), "c:n", b"%d" % n)
        with self.lock:
            self.bytes += unit.size
            self.seconds.append(time.perf_counter() - began)


def _line(rng: random.Random, i: int) -> bytes:
    return json.dumps({"k": f"k{rng.randrange(100)}", "i": i, "t": time.time(),
                       "pad": "x" * 60}).encode() + b"\n"


def _write(directory: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    handles = [open(directory / f"log{f}.jsonl", "ab") for f in range(FILES)]  # noqa: SIM115
    for i in range(n):
        handles[i % FILES].write(_line(rng, i))
    for h in handles:
        h.close()


def _pipeline(tmp: Path, name: str, app: Counts, on_commit: Any = None,
              **options: Any) -> tuple[percolator.Cluster, ubiq.LogPipeline]:
    (tmp / name / "a").mkdir(parents=True)
    cluster = percolator.connect(f"sqlite:///{tmp}/{name}.db")
    cluster.create_table("partials")
    options.setdefault("unit_bytes", UNIT_BYTES)
    p = ubiq.LogPipeline(cluster, "bench", app=app, sites={"a": tmp / name / "a"},
                         max_unit_delay=TIMING["delay"], track_interval=TIMING["track"],
                         on_commit=on_commit, **options)
    p.create()
    return cluster, p


def _committed(p: ubiq.LogPipeline) -> tuple[bool, int]:
    report = p.coverage()
    with percolator.Snapshot(p.cluster) as snap:
        rows = list(snap.scan(p.units, None, None, ["u:range", "u:state", "u:unit"]))
    states = {row: c.get("u:state") for row, c in rows}  # a part's state is its unit's
    done = sum(int(c["u:range"]) - ubiq._pipeline.parse_unit_row(row)[1] for row, c in rows
               if states.get(c.get("u:unit", row)) == b"C")
    return bool(report) and not any(report.values()), done


def batch_pass(directory: Path, cluster: percolator.Cluster, app: Counts) -> float:
    """The same process() over the same bytes, cut the same way, its writes sent to the
    store directly (no transactions, no tracking, no leases)."""

    class Raw:
        def __init__(self) -> None:
            self.rows: list[Mutation] = []

        def set(self, table: str, row: bytes, column: str, value: bytes) -> None:
            self.rows.append(Mutation(row, [(f"d:{column}", 1, value)]))

    began = time.perf_counter()
    for path in sorted(directory.glob("*.jsonl")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            end = len(data) if len(data) - at <= UNIT_BYTES else data.index(
                b"\n", at + UNIT_BYTES - 1) + 1
            raw = Raw()
            out = ubiq.Output(raw, directory / ".staging")  # type: ignore[arg-type]
            app.process(ubiq.WorkUnit(path.name, at, end, path, "a"), out)
            internals(cluster).store.mutate_rows("partials", raw.rows)
            at = end
    return time.perf_counter() - began


def throughput(tmp: Path, n: int) -> dict[str, float]:
    app = Counts()
    cluster, p = _pipeline(tmp, "tp", app)
    directory = p.sites["a"]
    _write(directory, n, 1)
    with cluster:
        t0 = time.perf_counter()
        with Worker(cluster, p.observers(), tasks=p.tasks(), threads=2):
            while not _committed(p)[0]:
                time.sleep(0.05)
            seconds = time.perf_counter() - t0
        done = _committed(p)[1]
        batch_app = Counts()
        batch = batch_pass(directory, cluster, batch_app)
    return {"per_s": n / seconds, "seconds": seconds, "batch_per_s": n / batch,
            "batch_s": batch, "duplicate": app.bytes / done,
            "median_unit_s": statistics.median(app.seconds)}


def latency(tmp: Path, seconds: float, rate: float, base: int) -> dict[str, float]:
    """Records appended at *rate*/s for *seconds* to a pipeline holding *base* records
    already committed; for each, append -> the commit of its unit. Then the batch
    re-aggregation of everything, for the freshness comparison."""
    app = Counts()
    committed_at: dict[tuple[str, int], float] = {}  # (file, unit end) -> commit time

    def on_commit(unit: ubiq.WorkUnit) -> None:
        now = time.perf_counter()
        for part in unit.parts or [unit]:  # a unit of several files commits each part
            committed_at[(part.file, part.end)] = now

    cluster, p = _pipeline(tmp, "lat", app, on_commit)
    directory = p.sites["a"]
    _write(directory, base, 2)
    appended: list[tuple[str, int, float]] = []  # file, end offset of the record, time

    with cluster, Worker(cluster, p.observers(), tasks=p.tasks(), threads=2):
        while not _committed(p)[0]:
            time.sleep(0.05)
        rng = random.Random(3)
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            name = f"log{i % FILES}.jsonl"
            with open(directory / name, "ab") as f:
                f.write(_line(rng, base + i))
                offset = f.tell()
            appended.append((name, offset, time.perf_counter()))
            i += 1
            time.sleep(1 / rate)
        while not _committed(p)[0]:
            time.sleep(0.05)
        batch = batch_pass(directory, cluster, Counts())
    delays = []
    ends = {}
    for (name, unit_end), at in committed_at.items():
        ends.setdefault(name, []).append((unit_end, at))
    for name, offset, at in appended:
        when = min(t for e, t in ends[name] if e >= offset)
        delays.append(when - at)
    delays.sort()
    return {"p50_s": delays[len(delays) // 2], "p90_s": delays[int(len(delays) * 0.9)],
            "median_unit_s": statistics.median(app.seconds), "batch_s": batch,
            "appended": len(appended)}


STATE_FILES = 200
STATE_UNIT_BYTES = 1024
FORGET_AFTER = 5.0
STATE_AHEAD = 1000
"""``--units-ahead``: units written to files but not yet committed, at most (plus a
file's; 0: every file written before the worker starts): the lease
sweep reads every pending unit each pass (O(pending), every 0.5 s here), so with every
unit written up front the sweeps took most of the run: at 6,000 units, 142 s of 243
(25 units/s), against 11 s of 58 (106 units/s) 1,000 ahead. The State Server measured
at the end is the same (the same files, units and cells)."""


def state_size(tmp: Path, units: int, forget: bool, ahead: int = 0) -> dict[str, float]:
    """About *units* units of about 1 KiB over STATE_FILES files (written first, then
    processed by one worker), the garbage collector on (forget_after 5 s) or off; then
    the State Server's live rows, and its stored rows once Percolator's own GC has
    removed the versions no reader can see. Also one lease sweep (through the index)
    against one scan of every unit's state and lease (what a sweep read before). The
    files are written as the units commit, at most *ahead* units in advance (0: all
    before the worker starts)."""
    committed = [0]

    def on_commit(unit: ubiq.WorkUnit) -> None:
        committed[0] += 1

    name = "gc" if forget else "nogc"
    cluster, p = _pipeline(tmp, name, Counts(), on_commit, unit_bytes=STATE_UNIT_BYTES,
                           forget_after=FORGET_AFTER if forget else None)
    directory = p.sites["a"]
    rng = random.Random(4)
    per_file = units * (STATE_UNIT_BYTES + 50) // STATE_FILES
    written = [0]  # files written so far

    def write_ahead() -> None:
        """Write the next files, each whole at once (a file never grows again), while
        fewer than *ahead* units are written and not committed."""
        while written[0] < STATE_FILES and (
                not ahead or written[0] * units // STATE_FILES - committed[0] < ahead):
            with open(directory / f"log{written[0]:03d}.jsonl", "wb") as out:
                at, i = 0, 0
                while at < per_file:
                    line = _line(rng, i)
                    out.write(line)
                    at, i = at + len(line), i + 1
            written[0] += 1

    write_ahead()
    tables = [p.files, p.units, p.pending, p.quarantine]
    with cluster:
        began = time.perf_counter()
        with Worker(cluster, p.observers(), tasks=p.tasks(), threads=2):
            seen = -1
            while True:  # done: every unit committed (and with GC, every file forgotten)
                time.sleep(0.5)
                write_ahead()
                if written[0] < STATE_FILES:
                    continue
                if committed[0] == seen:  # a full check (O(units)) only once it is quiet
                    if forget and committed[0] and not _live_rows(cluster, [p.files]):
                        break
                    if not forget and _committed(p)[0]:
                        break
                seen = committed[0]
            seconds = time.perf_counter() - began
        live = _live_rows(cluster, tables)
        cluster.gc(retention=0)  # the deleted cells' versions go: a scan skips no tombstone
        reads = [Read(family, None, versions=None) for family in FAMILIES]
        stored = sum(sum(len(versions) for versions in cells.values())
                     for t in tables
                     for _, cells in internals(cluster).store.scan(t, None, None, reads))
        t0 = time.perf_counter()
        p.sweep_leases()
        sweep = time.perf_counter() - t0
        t0 = time.perf_counter()
        with percolator.Snapshot(cluster) as snap:
            sum(1 for _ in snap.scan(p.units, None, None, ["u:state", "u:lease"]))
        scan = time.perf_counter() - t0
    return {"units": committed[0], "seconds": seconds, "live": live, "stored": stored,
            "sweep_s": sweep, "scan_s": scan}


def _live_rows(cluster: percolator.Cluster, tables: list[str]) -> int:
    with percolator.Snapshot(cluster) as snap:
        return sum(sum(1 for _ in snap.scan(t)) for t in tables)


def small_files(tmp: Path, files: int, records: int, pack: bool) -> dict[str, float]:
    """records/s over *files* small files written before the worker starts, with
    units packing several files (*pack*) or one unit per file."""
    app = Counts()
    name = f"small-{'packed' if pack else 'single'}"
    cluster, p = _pipeline(tmp, name, app, unit_bytes=64 << 10, pack_files=pack)
    rng = random.Random(7)
    for f in range(files):
        with open(p.sites["a"] / f"s{f:05d}.jsonl", "wb") as out:
            out.writelines(_line(rng, f * records + i) for i in range(records))
    with cluster:
        t0 = time.perf_counter()
        with Worker(cluster, p.observers(), tasks=p.tasks(), threads=2):
            while not _committed(p)[0]:
                time.sleep(0.05)
            seconds = time.perf_counter() - t0
        with percolator.Snapshot(cluster) as snap:
            units = sum(1 for _, c in snap.scan(p.units, None, None, ["u:state"])
                        if "u:state" in c)
    return {"per_s": files * records / seconds, "units": units, "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--track-interval", type=float, default=0.2)
    parser.add_argument("--max-unit-delay", type=float, default=0.3)
    parser.add_argument("--units", type=int, default=0,
                        help="also measure the State Server's size after this many units")
    parser.add_argument("--units-ahead", type=int, default=STATE_AHEAD,
                        help="with --units: files are written as units commit, at most "
                        "this many units ahead (0: all before the worker starts)")
    parser.add_argument("--small-files", type=int, default=1000,
                        help="files of --small-records records each, packed vs one per unit")
    parser.add_argument("--small-records", type=int, default=10)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    TIMING.update(track=args.track_interval, delay=args.max_unit_delay)
    with tempfile.TemporaryDirectory(prefix="bench-ubiq-") as tmp:
        sizes = [state_size(Path(tmp), args.units, forget, args.units_ahead)
                 for forget in (False, True)] \
            if args.units else []
        tp = throughput(Path(tmp), args.records)
        packed, single = (small_files(Path(tmp), args.small_files, args.small_records, pack)
                          for pack in (True, False))
        # 1% of the data appended over 4 s: the incremental path's freshness
        lat = latency(Path(tmp), 4.0, args.records / 100 / 4, args.records)
    bound = TIMING["track"] + TIMING["delay"] + lat["median_unit_s"]
    lines = [
        *header(SECTION, f"python bench/ubiq.py --records {args.records} --track-interval "
                f"{args.track_interval} --max-unit-delay {args.max_unit_delay}",
                f"embedded store (SQLite), one worker process (2 scanner threads), {FILES} "
                f"files, units of {UNIT_BYTES >> 10} KiB"), "",
        "| measure | result | target | ratio |", "|---|---|---|---|",
        f"| records/s, the pipeline vs a batch pass over the same bytes (same process(), raw "
        f"store writes) | {tp['per_s']:,.0f} vs {tp['batch_per_s']:,.0f} | >= 0.5x | "
        f"**{tp['per_s'] / tp['batch_per_s']:.2f}x** |",
        f"| duplicate work without faults: bytes processed / bytes committed | "
        f"{tp['duplicate']:.3f} | <= 1.01 | **{tp['duplicate']:.3f}** |",
        f"| append -> commit of its unit, p90 (p50), vs tracker interval + max unit delay + "
        f"median unit time | {lat['p90_s']:.2f} s ({lat['p50_s']:.2f}) vs {bound:.2f} s | "
        f"<= 1.5x | **{lat['p90_s'] / bound:.2f}x** |",
        f"| freshness after a 1% append ({lat['appended']:,} records): median append -> "
        f"commit vs a full batch re-aggregation | {lat['p50_s']:.2f} s vs "
        f"{lat['batch_s']:.2f} s | >= 100x lower | **{lat['batch_s'] / lat['p50_s']:.0f}x** |",
        f"| {args.small_files:,} small files of {args.small_records} records written "
        f"before the worker starts: records/s (units) with units of several files vs one "
        f"unit per file (`pack_files=False`) | {packed['per_s']:,.0f} ({packed['units']:,}) "
        f"vs {single['per_s']:,.0f} ({single['units']:,}) | | "
        f"**{packed['per_s'] / single['per_s']:.2f}x** |",
        "",
    ]
    if sizes:
        off, on = sizes
        lines += [
            f"The State Server after {off['units']:,} units of about "
            f"{STATE_UNIT_BYTES} bytes over {STATE_FILES} files (`--units {args.units} "
            f"--units-ahead {args.units_ahead}`), "
            f"its garbage collector off, then on (forget_after {FORGET_AFTER:.0f} s):", "",
            "| measure | GC off | GC on |", "|---|---|---|",
            f"| units committed (seconds) | {off['units']:,} ({off['seconds']:.0f} s) | "
            f"{on['units']:,} ({on['seconds']:.0f} s) |",
            f"| live rows in files, units, pending, quarantine | {off['live']:,} | "
            f"{on['live']:,} |",
            f"| stored cell versions after `cluster.gc(retention=0)` | {off['stored']:,} | "
            f"{on['stored']:,} |",
            f"| after it: one lease sweep (pending-units index) vs one scan of every "
            f"unit (the sweep before the index) | {off['sweep_s'] * 1000:.1f} ms vs "
            f"{off['scan_s'] * 1000:.0f} ms | {on['sweep_s'] * 1000:.1f} ms vs "
            f"{on['scan_s'] * 1000:.0f} ms |", ""]
    publish(SECTION, lines, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
