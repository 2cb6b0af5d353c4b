"""The slides' Zeitgeist example (windowed counts per query, then dips), shared by the
tests and ``python -m observers.millwheel`` runs in worker processes."""

from __future__ import annotations

import json
import os
import random
from collections import Counter

import percolator
from observers import millwheel as mw

WINDOW_MS = 1000
BASE_MS = 1_700_000_000_000


def make_input(seed: int, n: int, disorder_ms: int = 300, queries: int = 8
               ) -> list[tuple[bytes, int]]:
    """*n* (query, timestamp) records, timestamps rising with jitter of *disorder_ms*,
    Zipf-ish keys."""
    rng = random.Random(seed)
    names = [b"q%d" % i for i in range(queries)]
    weights = [1 / (i + 1) for i in range(queries)]
    return [(rng.choices(names, weights)[0], BASE_MS + 7 * i + rng.randrange(disorder_ms))
            for i in range(n)]


def batch_windows(records: list[tuple[bytes, int]]) -> dict[tuple[str, int], int]:
    """The batch group-by the pipeline must equal: (query, window start) -> count."""
    counts: Counter[tuple[str, int]] = Counter()
    for query, ts in records:
        counts[(query.decode(), ts - ts % WINDOW_MS)] += 1
    return dict(counts)


def batch_dips(windows: dict[tuple[str, int], int]) -> set[tuple[str, int]]:
    found = set()
    for (q, start), n in windows.items():
        before = windows.get((q, start - WINDOW_MS))
        if before is not None and 2 * n < before:
            found.add((q, start))
    return found


class Windower(mw.Computation):
    outputs = ("windows",)

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        start = record.timestamp - record.timestamp % WINDOW_MS
        name = f"w{start}"
        ctx.state.set(name, b"%d" % (int(ctx.state.get(name) or b"0") + 1))
        ctx.set_timer(name, start + WINDOW_MS)

    def process_timer(self, ctx: mw.Context, timer: mw.Timer) -> None:
        n = int(ctx.state.get(timer.tag) or b"0")
        ctx.state.delete(timer.tag)
        start = timer.time - WINDOW_MS
        ctx.produce("windows", json.dumps({"q": ctx.key.decode(), "start": start, "n": n})
                    .encode(), timer.time)


class DipDetector(mw.Computation):
    outputs = ("dips",)

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        window = json.loads(record.value)
        seen = ctx.state.get_json("windows", {})
        if str(window["start"]) in seen:
            ctx.state.set_json("twice", ctx.state.get_json("twice", 0) + 1)
        seen[str(window["start"])] = window["n"]
        ctx.state.set_json("windows", seen)
        before = seen.get(str(window["start"] - WINDOW_MS))
        if before is not None and 2 * window["n"] < before:
            ctx.produce("dips", record.value, record.timestamp)


def build(cluster: percolator.Cluster, records: list[tuple[bytes, int]],
          interval: float = 0.05, inject_batch: int = 500) -> mw.Pipeline:
    pipeline = mw.Pipeline(cluster, "zeitgeist", interval=interval, inject_batch=inject_batch)
    pipeline.injector("queries", mw.IterableSource(records), stream="queries")
    pipeline.computation(Windower(), inputs={"queries": lambda r: r.value})
    pipeline.computation(DipDetector(),
                         inputs={"windows": lambda r: json.loads(r.value)["q"].encode()})
    return pipeline


def make(cluster: percolator.Cluster) -> mw.Pipeline:
    """The pipeline of the worker processes: input from MW_SEED and MW_RECORDS."""
    records = make_input(int(os.environ.get("MW_SEED", "1")),
                         int(os.environ.get("MW_RECORDS", "400")))
    return build(cluster, records, inject_batch=int(os.environ.get("MW_BATCH", "500")))


def results(pipeline: mw.Pipeline) -> tuple[dict[tuple[str, int], int], int]:
    """(query, window start) -> count as DipDetector received them, and how many
    windows it received twice."""
    found: dict[tuple[str, int], int] = {}
    twice = 0
    with percolator.Snapshot(pipeline.cluster) as snap:
        for key, cells in snap.scan(pipeline.nodes["DipDetector"].table):
            for start, n in json.loads(cells.get("s:windows", b"{}")).items():
                found[(key.decode(), int(start))] = n
            twice += int(cells.get("s:twice", b"0"))
    return found, twice




class Relay(mw.Computation):
    """Forwards each record to the Tally, keyed by the value's last digit."""

    outputs = ("relayed",)

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        ctx.produce("relayed", record.value, record.timestamp)


class WeakRelay(Relay):
    name = "Relay"
    productions = "weak"


class Tally(mw.Computation):
    """Counts how many times each value reached it (state ``n/<value>``)."""

    def process_record(self, ctx: mw.Context, record: mw.Record) -> None:
        name = "n/" + record.value.decode()
        ctx.state.set(name, b"%d" % (int(ctx.state.get(name) or b"0") + 1))


def relay_input(n: int) -> list[tuple[bytes, int]]:
    return [(b"v%05d" % i, BASE_MS + 5 * i) for i in range(n)]


def build_relay(cluster: percolator.Cluster, records: list[tuple[bytes, int]], weak: bool,
                inject_batch: int = 500, tally: type[mw.Computation] = Tally,
                source: mw.Source | None = None) -> mw.Pipeline:
    """source (default: *records*) -> Relay (weak or strong productions) -> Tally
    (strong)."""
    pipeline = mw.Pipeline(cluster, "relay", interval=0.05, inject_batch=inject_batch)
    pipeline.injector("values", source or mw.IterableSource(records), stream="values")
    pipeline.computation(WeakRelay() if weak else Relay(),
                         inputs={"values": lambda r: r.value[-1:]})
    pipeline.computation(tally(), inputs={"relayed": lambda r: r.value[-2:-1]})
    return pipeline


def tallies(pipeline: mw.Pipeline, computation: str = "Tally") -> dict[bytes, int]:
    """value -> how many times it reached the Tally (or another Tally class)."""
    found: dict[bytes, int] = {}
    with percolator.Snapshot(pipeline.cluster) as snap:
        for _, cells in snap.scan(pipeline.nodes[computation].table):
            for column, n in cells.items():
                if column.startswith("s:n/"):
                    found[column[4:].encode()] = int(n)
    return found


def log_bytes_injected(pipeline: mw.Pipeline, injector: str = "values") -> int:
    """How many bytes of its files the LogSource of *injector* has injected (committed
    positions)."""
    with percolator.Snapshot(pipeline.cluster) as snap:
        raw = snap.get(pipeline.meta, b"inj/" + injector.encode(), "c:pos")
    files = json.loads(raw)["s"]["f"] if raw else {}
    return sum(offset for offset, _ in files.values())


def make_log_relay(cluster: percolator.Cluster) -> mw.Pipeline:
    """The relay pipeline fed by a LogSource tailing MW_LOG_DIR (``*.log``); strong, or
    weak productions with MW_WEAK=1."""
    return build_relay(cluster, [], os.environ.get("MW_WEAK") == "1",
                       inject_batch=int(os.environ.get("MW_BATCH", "50")),
                       source=mw.LogSource(os.environ["MW_LOG_DIR"]))


class Second(Tally):
    """A second consumer of the values, added while the pipeline runs."""

    name = "Second"


def build_fanout(cluster: percolator.Cluster, source: mw.Source, second: bool,
                 inject_batch: int = 500) -> mw.Pipeline:
    """source -> Tally, and with *second* (the new topology) source -> Second too, keyed
    differently."""
    pipeline = mw.Pipeline(cluster, "fanout", interval=0.05, inject_batch=inject_batch)
    pipeline.injector("values", source, stream="values")
    pipeline.computation(Tally(), inputs={"values": lambda r: r.value[-1:]})
    if second:
        pipeline.computation(Second(), inputs={"values": lambda r: r.value[-2:-1]})
    return pipeline


def make_fanout(cluster: percolator.Cluster) -> mw.Pipeline:
    """The fan-out pipeline fed by a LogSource tailing MW_LOG_DIR; MW_SECOND=1 for the
    new topology (a process started with it adds Second by its ``create()``)."""
    return build_fanout(cluster, mw.LogSource(os.environ["MW_LOG_DIR"]),
                        os.environ.get("MW_SECOND") == "1",
                        inject_batch=int(os.environ.get("MW_BATCH", "20")))
