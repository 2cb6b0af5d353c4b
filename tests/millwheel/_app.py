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


