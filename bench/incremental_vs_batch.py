"""Incremental against batch: the paper's Figure 7 on this machine (issue 7).

    python bench/incremental_vs_batch.py [--size 100000] [--rates 1,10,100,300,1000]
                                         [--duration 30] [--threads 2] [--no-write]

1. Seeds a repository of ``--size`` documents with three random clustering keys each
   (:mod:`observers.examples.clustering`), clustered by the batch job and loaded with the
   Spark loader (documents, key index, clusters) into an embedded SQLite store.
2. **Batch**: the PySpark job reads the whole repository from the store
   (``spark_loader.read_table``: four row ranges at one snapshot timestamp), adds the
   new documents and computes connected components. A base run (repository only)
   gives the interval during which documents accumulate; for each rate a second run
   clusters the repository plus the documents that arrived (uniformly, at that rate)
   during the base run. A document arriving at ``t`` in the base run is clustered when
   the next run ends: delay ``T_base - t + T_rate``, so median ``T_base/2 + T_rate`` and p95
   ``0.95 T_base + T_rate`` (both run times measured; the arrival times are the model).
3. **Incremental**: with Spark stopped, one in-process worker (``--threads`` scanner
   threads) runs :class:`ThreeKeyClusterer`; a writer thread commits new documents at the
   rate; each document's delay is from its write commit to its clustering commit.

Rates are percent of the repository arriving per hour. Results replace the section
``## Incremental vs batch, Figure 7 (bench/incremental_vs_batch.py)`` of BENCHMARKS.md and
the plot ``bench/figure7.png``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import percolator  # noqa: E402
from bench._common import cpu_model, write_section  # noqa: E402
from observers import Observer, Worker, wait_for_observers  # noqa: E402
from observers.examples.clustering import (  # noqa: E402
    DOCUMENTS,
    KEYS_COLUMN,
    OBSERVERS,
    batch_cluster,
    doc_splits,
    new_documents,
    partition,
    read_clusters,
    read_repository,
    seed_repository,
    synthetic_documents,
)

SECTION = "## Incremental vs batch, Figure 7 (bench/incremental_vs_batch.py)"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


@dataclass
class Inc:
    rate: float
    per_second: float
    written: int = 0
    delays: list[float] = field(default_factory=list)
    censored: int = 0
    backlog_at_end: int = 0
    throughput: float = 0.0
    keeps_up: bool = True
    note: str = ""


@dataclass
class Batch:
    rate: float
    new_docs: int
    run: float
    base: float
    how: str = "measured"

    @property
    def median(self) -> float:
        return self.base / 2 + self.run

    @property
    def p95(self) -> float:
        return 0.95 * self.base + self.run


def spark_session(size: int) -> Any:
    """Spark local[2]; memory and shuffle partitions grow with the repository."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    big = size > 200_000
    from pyspark.sql import SparkSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = (SparkSession.builder.master("local[2]").appName("incremental-vs-batch")
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", "16" if big else "4")
                   .config("spark.default.parallelism", "2")
                   .config("spark.driver.memory", "8g" if big else "2g")
                   .config("spark.python.worker.reuse", "true")
                   .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def batch_run(spark: Any, url: str, n: int, new: list[tuple[str, str]]) -> tuple[float, int, int]:
    """One batch run: (seconds, rounds, clusters)."""
    t0 = time.perf_counter()
    docs = read_repository(spark, url, doc_splits(n, 4))
    if new:
        docs = docs.union(spark.createDataFrame(new, "doc string, keys string"))
    labels, rounds = batch_cluster(docs)
    clusters = labels.select("cluster").distinct().count()
    return time.perf_counter() - t0, rounds, clusters


def incremental(cluster: percolator.Cluster, n: int, next_id: int, rate: float,
                duration: float, commits: dict[bytes, float], worker: Worker,
                out: Any) -> tuple[Inc, int]:
    per_second = rate / 100 * n / 3600
    span = max(duration, 12 / per_second)
    count = max(1, round(per_second * span))
    docs = new_documents(next_id, count, n, random.Random(next_id))
    written: dict[bytes, float] = {}
    committed0 = worker.stats["committed"]
    t0 = time.perf_counter()
    i = 0
    while i < count:
        due = min(count, int((time.perf_counter() - t0) * per_second) + 1)
        if due <= i:
            time.sleep(max(0.0, t0 + i / per_second - time.perf_counter()))
            continue
        batch = docs[i:due]
        with percolator.Transaction(cluster) as txn:
            for doc, keys in batch:
                txn.set(DOCUMENTS, doc.encode(), KEYS_COLUMN, keys.encode())
        now = time.perf_counter()
        for doc, _ in batch:
            written[doc.encode()] = now
        i = due
    end = time.perf_counter()
    window = end - t0
    res = Inc(rate, per_second, written=count)
    res.backlog_at_end = sum(1 for d in written if d not in commits)
    res.throughput = (worker.stats["committed"] - committed0) / window
    deadline = end + max(20.0, duration)
    while time.perf_counter() < deadline and any(d not in commits for d in written):
        time.sleep(0.05)
    stop = time.perf_counter()
    for d, w in written.items():
        if d in commits:
            res.delays.append(commits[d] - w)
        else:
            res.censored += 1
            res.delays.append(stop - w)  # a lower bound
    res.keeps_up = res.censored == 0 and res.backlog_at_end <= max(5.0, 2 * per_second)
    if not res.keeps_up:
        res.note = (f"backlog {res.backlog_at_end} of {count} at the end of the arrivals, "
                    f"{res.censored} still unclustered {stop - end:.0f}s later")
    out(f"  incremental {rate:g}%/h ({per_second:.2f} docs/s, {count} docs in {window:.0f}s): "
        f"median {statistics.median(res.delays):.3f}s p95 {pct(res.delays, 0.95):.3f}s "
        f"throughput {res.throughput:.1f}/s backlog {res.backlog_at_end} "
        f"censored {res.censored}")
    return res, next_id + count


def plot(path: Path, n: int, inc: list[Inc], bat: list[Batch], saturation: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    xs = [b.rate for b in bat]
    ax.errorbar(xs, [b.median for b in bat],
                yerr=[[b.median - b.run for b in bat], [b.base + b.run - b.median for b in bat]],
                fmt="-o", color="tab:blue", capsize=3, label="batch (PySpark), min/median/max")
    ok = [r for r in inc if r.keeps_up]
    if ok:
        med = [statistics.median(r.delays) for r in ok]
        ax.errorbar([r.rate for r in ok], med,
                    yerr=[[m - pct(r.delays, 0.05) for m, r in zip(med, ok, strict=True)],
                          [pct(r.delays, 0.95) - m for m, r in zip(med, ok, strict=True)]],
                    fmt="--s", color="tab:red", capsize=3,
                    label="incremental (observers), p5/median/p95")
    if saturation:
        ax.axvline(saturation, color="tab:red", linestyle=":",
                   label=f"incremental saturates (~{saturation:.0f}%/h)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arrival rate (% of repository per hour)")
    ax.set_ylabel("clustering delay (s)")
    ax.set_title(f"Figure 7 on 2 cores: {n:,} documents, 3 keys each")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=100_000, help="repository size (100000)")
    parser.add_argument("--rates", default="1,10,100,1000,3000",
                        help="arrival rates, %% of the repository per hour "
                             "(1,10,100,1000,3000)")
    parser.add_argument("--duration", type=float, default=20.0,
                        help="seconds of arrivals per rate, incremental side (20)")
    parser.add_argument("--measure-above", type=float, default=1.0,
                        help="run the batch job again for a rate only when the new documents "
                             "exceed this fraction of the repository; below, the next run is "
                             "taken to last as long as the base run (1.0: never)")
    parser.add_argument("--threads", type=int, default=2, help="observer scanner threads (2)")
    parser.add_argument("--no-write", action="store_true",
                        help="print only; leave BENCHMARKS.md and bench/figure7.png alone")
    args = parser.parse_args(argv)
    rates = sorted(float(r) for r in args.rates.split(","))
    n = args.size
    lines: list[str] = []

    def out(line: str) -> None:
        print(line, flush=True)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="percolator-fig7-") as tmp:
        url = f"sqlite:///{tmp}/repo.db"
        spark = spark_session(args.size)
        try:
            out(f"seeding {n:,} documents ...")
            seed = seed_repository(spark, url, synthetic_documents(spark, n))
            out("  " + ", ".join(f"{k} {v:.1f}s" for k, v in seed.items()))
            base, rounds, clusters = batch_run(spark, url, n, [])
            out(f"  batch base run: {base:.1f}s, {rounds} rounds, {clusters:,} clusters "
                f"({n / clusters:.2f} documents per cluster)")
            bat: list[Batch] = []
            rng = random.Random(1)
            for rate in rates:
                count = round(rate / 100 * n / 3600 * base)
                if count < args.measure_above * n:
                    run, how = base, "= base run"
                else:
                    run, _, _ = batch_run(spark, url, n, new_documents(10 * n, count, n, rng))
                    how = "measured"
                bat.append(Batch(rate, count, run, base, how))
                out(f"  batch {rate:g}%/h: {count} new docs, run {run:.1f}s ({how}), "
                    f"median delay {bat[-1].median:.1f}s p95 {bat[-1].p95:.1f}s")
        finally:
            spark.stop()
        commits: dict[bytes, float] = {}

        def on_commit(observer: Observer, table: str, row: bytes, column: str,
                      change_ts: int, commit_ts: int) -> None:
            commits[row] = time.perf_counter()

        inc: list[Inc] = []
        with percolator.connect(url) as cluster:
            worker = Worker(cluster, OBSERVERS, threads=args.threads, on_commit=on_commit)
            worker.start()
            try:
                next_id = n
                for rate in rates:
                    if inc and not inc[-1].keeps_up:
                        inc.append(Inc(rate, rate / 100 * n / 3600, keeps_up=False,
                                       note="not run: a lower rate already saturated"))
                        continue
                    res, next_id = incremental(cluster, n, next_id, rate, args.duration,
                                               commits, worker, out)
                    inc.append(res)
                    if res.keeps_up:
                        wait_for_observers(cluster, timeout=120)
            finally:
                worker.stop()
            stats = dict(worker.stats)
            labels = read_clusters(cluster)
        sizes = sorted(len(g) for g in partition(labels))
    elapsed = time.perf_counter() - started

    saturated = [r for r in inc if not r.keeps_up and r.written]
    capacity = max((r.throughput for r in saturated), default=0.0)
    kept = max((r.rate for r in inc if r.keeps_up), default=0.0)
    saturation = max(capacity * 3600 / n * 100, kept) if saturated else None
    command = "python bench/incremental_vs_batch.py " + " ".join(argv or sys.argv[1:])
    lines += [
        SECTION, "",
        f"- Machine: nproc={os.cpu_count()}, CPU \"{cpu_model()}\" (shared with other agents), "
        f"Python {platform.python_version()}, embedded SQLite store, Spark `local[2]`.",
        f"- Date: {datetime.date.today().isoformat()}. Command: `{command.strip()}` "
        f"(whole run {elapsed / 60:.1f} min).",
        f"- Repository: {n:,} documents, 3 keys each drawn uniformly from {8 * n:,} keys; "
        f"{len(sizes):,} clusters after the run, {len(labels) / len(sizes):.2f} documents per "
        f"cluster, largest {sizes[-1]}, {sum(s for s in sizes if s > 1) / len(labels):.0%} of "
        "documents in a non-singleton cluster. Seed (batch-clustered, loaded with the Spark "
        "loader): " + ", ".join(f"{k} {v:.0f}s" for k, v in seed.items()) + ".",
        f"- Batch: base run (scan of the repository from the store + connected components, "
        f"{rounds} rounds) {base:.1f}s. Incremental: one worker process, {args.threads} scanner "
        f"threads; {stats.get('committed', 0)} observer commits, "
        f"{stats.get('conflicts', 0)} conflicts.",
        "",
        "| arrival rate (%/h) | docs/s | new docs per batch | next batch run (s) | "
        "batch median (s) | batch p95 (s) | incremental median (s) | incremental p95 (s) | "
        "median ratio | incremental keeps up |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for b, r in zip(bat, inc, strict=True):
        if r.delays:
            m, p = statistics.median(r.delays), pct(r.delays, 0.95)
            mark = ">" if r.censored else ""
            cells = f"{mark}{m:.3f} | {mark}{p:.3f} | {b.median / m:,.0f}x"
        else:
            cells = "- | - | -"
        keeps = "yes" if r.keeps_up else f"**no**: {r.note}"
        lines.append(f"| {b.rate:g} | {r.per_second:.2f} | {b.new_docs:,} | {b.run:.1f} "
                     f"({b.how}) | {b.median:.1f} | {b.p95:.1f} | "
                     f"{cells} | {keeps} |")
    lines.append("")
    if saturation:
        lines.append(f"Incremental stops keeping up between {kept:g}%/h (kept up) and "
                     f"{saturated[0].rate:g}%/h (did not) here ({capacity:.0f} documents/s "
                     "clustered at saturation, one worker process "
                     "on 2 shared cores); the paper's 240 machines saturated at 40%/h.")
    else:
        lines.append("Incremental kept up at every rate measured.")
    lines += [
        "",
        "Batch delays: the base run is measured; the next run (repository + the documents that "
        "arrived during the base run) is measured when those are at least "
        f"{args.measure_above:.0%} of the repository, else taken equal to the base run "
        "(\"= base run\"). A document's arrival time within the base run is modelled as "
        "uniform, so its delay is the rest of the base run plus the next run. Incremental "
        "delays are measured per document (write commit to clustering commit).",
        "",
        "![Figure 7 on this machine](bench/figure7.png)",
        "",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    if not args.no_write:
        plot(ROOT / "bench" / "figure7.png", n, inc, bat, saturation)
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
