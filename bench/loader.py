"""Bulk loader throughput vs raw batched store writes, on the embedded store.

    python bench/loader.py                  # 1,000,000 cells (200,000 rows x 5 columns)
    python bench/loader.py --cells 100000   # a quick run

Both sides write the same cells in the same run, each into its own fresh SQLite
file: *raw* is ``store.mutate_rows`` of plain data cells (no Percolator layout, no
locks, no write records), 1,000 rows per batch, from records already in memory;
*loader* is ``spark_loader.load_files`` of the same records from a JSON-lines file
on ``local[2]`` (parse, shuffle by row key, prewrite, commit, release), timed from
the start of the load to its end (the SparkSession is started before). Prints
both rates and their ratio (target: loader >= 0.5x raw).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import percolator  # noqa: E402
from bench._common import cpu_model  # noqa: E402
from percolator.ext import (  # noqa: E402
    FAMILIES,
    Mutation,
)

COLUMNS = 5


def make_records(rows: int) -> list[dict[str, str]]:
    return [
        {"key": f"row{i:09d}", **{f"f{c}": f"value-{i}-{c}-{'x' * 16}" for c in range(COLUMNS)}}
        for i in range(rows)
    ]


def raw_write(path: str, records: list[dict[str, str]], batch_rows: int = 1000) -> float:
    store = percolator.stores.open_store(f"sqlite://{path}")
    try:
        store.create_table("bench", FAMILIES)
        mutations = [
            Mutation(r["key"].encode(),
                     [(f"d:c:f{c}", 1, r[f"f{c}"].encode()) for c in range(COLUMNS)])
            for r in records
        ]
        began = time.perf_counter()
        for i in range(0, len(mutations), batch_rows):
            store.mutate_rows("bench", mutations[i : i + batch_rows])
        return time.perf_counter() - began
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=None)
    p.add_argument("--batch-cells", type=int, default=5000)
    args = p.parse_args(argv)
    rows = max(1, args.cells // COLUMNS)
    cells = rows * COLUMNS
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from spark_loader import load_files

    with tempfile.TemporaryDirectory(prefix="percolator-bench-loader-") as tmp:
        records = make_records(rows)
        source = os.path.join(tmp, "input.jsonl")
        with open(source, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        raw_seconds = raw_write(os.path.join(tmp, "raw.db"), records)
        del records
        raw_rate = cells / raw_seconds
        print(f"raw mutate_rows: {cells:,} cells in {raw_seconds:.2f}s = {raw_rate:,.0f} cells/s",
              flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spark = (SparkSession.builder.master("local[2]").appName("bench-loader")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "true")
                     .config("spark.driver.memory", "2g")
                     .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            result = load_files(
                spark, source, "jsonl", f"sqlite://{tmp}/loader.db", "bench", "key",
                {f"f{c}": f"c:f{c}" for c in range(COLUMNS)},
                partitions=args.partitions, batch_cells=args.batch_cells,
            )
        finally:
            spark.stop()
        assert result.cells == cells, result
        print(result.summary())
        ratio = result.cells_per_second / raw_rate
        print(f"machine: nproc={os.cpu_count()} cpu={cpu_model()!r} "
              f"python={platform.python_version()}")
        print(f"loader: {result.cells_per_second:,.0f} cells/s; raw: {raw_rate:,.0f} cells/s; "
              f"ratio {ratio:.2f}x (target >= 0.5x: {'met' if ratio >= 0.5 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
