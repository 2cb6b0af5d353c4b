"""``python -m spark_loader`` / ``percolator-load`` / ``spark-submit -m``-style entry point.

::

    python -m spark_loader [load] --cluster sqlite:///tmp/repo.db --table docs \\
        --input crawl.jsonl --format jsonl --row-key url \\
        --column html=raw:html --column lang=meta:lang --observe raw:html
    python -m spark_loader export --cluster sqlite:///tmp/repo.db --table docs \\
        --format parquet --output /tmp/docs.parquet [--start-ts N] [--column raw:html]

Prints Spark's progress bar while it runs and one summary line at the end. Exit
status of a load: 0 loaded (or loaded before), 1 the load failed (nothing visible),
2 bad arguments; of an export: 0 written, 1 the read failed, 2 bad arguments.

Spark's Python workers run this very interpreter (``PYSPARK_PYTHON`` defaults to
``sys.executable``), so a loader started as ``venv/bin/python -m spark_loader``
without an activated virtualenv finds ``percolator`` in its workers too.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

__all__ = ["main"]


def _column(text: str) -> tuple[str, str]:
    field, sep, column = text.partition("=")
    if not sep or not field or not column:
        raise argparse.ArgumentTypeError(f"expected FIELD=family:qualifier, got {text!r}")
    return field, column


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="percolator-load",
        description="Load files into a Percolator table as one atomic transaction.",
    )
    p.add_argument("--cluster", required=True, metavar="URL",
                   help="store url: sqlite:///abs/path.db, hbase://host:9090, "
                        "bigtable://project/instance")
    p.add_argument("--table", required=True)
    p.add_argument("--input", required=True, metavar="PATH", help="file, directory or glob")
    p.add_argument("--format", required=True, choices=("jsonl", "csv", "parquet"))
    p.add_argument("--row-key", required=True, metavar="FIELD")
    p.add_argument("--column", required=True, action="append", type=_column,
                   metavar="FIELD=family:qualifier", help="repeat for each mapped field")
    p.add_argument("--observe", action="append", default=[], metavar="family:qualifier",
                   help="register this column as observed before loading (repeatable)")
    p.add_argument("--no-create-table", action="store_true",
                   help="fail if the table does not exist instead of creating it")
    p.add_argument("--max-rejects", type=int, default=None, metavar="N",
                   help="fail (loading nothing) when more than N records are rejected")
    p.add_argument("--rejects", metavar="PATH",
                   help="where to write rejects as JSON lines "
                        "(default: ./rejects-<table>-<load id>.jsonl, only if any)")
    p.add_argument("--load-id", help="identity of the load for reruns "
                                     "(default: derived from the input files and mapping)")
    p.add_argument("--partitions", type=int, default=None,
                   help="Spark partitions (default: the default parallelism)")
    p.add_argument("--batch-cells", type=int, default=5000,
                   help="cells per store batch (default 5000)")
    p.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    _add_cluster_arguments(p)
    p.add_argument("--lock-ttl", type=float, default=30.0, help="seconds (default 30)")
    from percolator import metrics

    metrics.add_arguments(p)
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--test-batch-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--test-crash-after-commit", action="store_true", help=argparse.SUPPRESS)
    return p


def _export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="percolator-load export",
        description="Write a Percolator table, read at one snapshot timestamp, to files.",
    )
    p.add_argument("--cluster", required=True, metavar="URL",
                   help="store url: sqlite:///abs/path.db, hbase://host:9090, "
                        "bigtable://project/instance")
    p.add_argument("--table", required=True)
    p.add_argument("--format", required=True, choices=("parquet", "jsonl"),
                   help="parquet keeps values as bytes; jsonl needs UTF-8 text values")
    p.add_argument("--output", required=True, metavar="PATH",
                   help="directory to write (must not exist)")
    p.add_argument("--column", action="append", default=None, metavar="family:qualifier",
                   help="column to export (repeatable; default: every column)")
    p.add_argument("--start-ts", type=int, default=None, metavar="N",
                   help="read at this timestamp (a repeatable read; default: a new one)")
    p.add_argument("--splits", type=int, default=None, metavar="N",
                   help="Spark partitions (default: the store's regions or tablets, "
                        "else twice the default parallelism)")
    p.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    _add_cluster_arguments(p)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """How executors and the driver reach the cluster: oracle, ZooKeeper, and TLS to
    each (the same options as the worker's)."""
    from percolator.ext import add_zookeeper_tls_arguments

    p.add_argument("--oracle", help="timestamp oracle (grpc://host:port, grpcs://... or zk://...)")
    p.add_argument("--zookeeper", help="ZooKeeper coordination host:port/chroot")
    add_zookeeper_tls_arguments(p, "oracle")
    add_zookeeper_tls_arguments(p, "zookeeper")


def _connect_options(args: argparse.Namespace, **options: Any) -> dict[str, Any]:
    """``connect()`` options from :func:`_add_cluster_arguments` (TLS files are checked
    here, on the driver: every executor must find them at the same paths).

    :raises InvalidArgument: for missing or unsafe TLS files.
    """
    from percolator.ext import zookeeper_tls_from_arguments

    if args.oracle:
        options["oracle"] = args.oracle
    if args.zookeeper:
        options["zookeeper"] = args.zookeeper
    for option, prefix in (("oracle_tls", "oracle"), ("zookeeper_tls", "zookeeper")):
        tls = zookeeper_tls_from_arguments(args, prefix)
        if tls is not None:
            options[option] = tls
    return options


def _spark(app: str, master: str | None) -> tuple[Any, bool]:
    """The active SparkSession, or a new one (then ours to stop) whose Python workers
    run this interpreter: Spark starts ``python3`` from PATH otherwise, which in a
    virtualenv that is not activated lacks percolator."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    builder = (builder.config("spark.ui.showConsoleProgress", "true")
               .config("spark.ui.enabled", os.environ.get("PERCOLATOR_SPARK_UI", "false")))
    ours = SparkSession.getActiveSession() is None
    return builder.getOrCreate(), ours


def _export(argv: list[str]) -> int:
    args = _export_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    import percolator
    from spark_loader._export import export_table
    from spark_loader._spark import require_pyspark

    try:
        require_pyspark()
        connect = _connect_options(args)
    except percolator.InvalidArgument as e:
        print(f"percolator-load export: {e}", file=sys.stderr)
        return 2
    spark, ours = _spark(f"percolator-export {args.table}", args.master)
    try:
        result = export_table(spark, args.cluster, args.table, args.format, args.output,
                              columns=args.column, start_ts=args.start_ts, splits=args.splits,
                              connect_options=connect)
    except percolator.InvalidArgument as e:
        print(f"percolator-load export: {e}", file=sys.stderr)
        return 2
    except percolator.PercolatorError as e:
        print(f"percolator-load export: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a Spark job failed: its text carries the executor's error
        from spark_loader._snapshot import ReadError

        text = str(e)
        mark = f"{ReadError.__name__}: "
        reason = text[text.find(mark):].splitlines()[0] if mark in text else text[:2000]
        print(f"percolator-load export: the export failed: {reason}", file=sys.stderr)
        return 1
    finally:
        if ours:
            spark.stop()
    print(result.summary())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["export"]:
        return _export(argv[1:])
    if argv[:1] == ["load"]:
        argv = argv[1:]
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    import percolator
    from spark_loader._job import LoadError, load_files
    from spark_loader._spark import require_pyspark

    try:
        require_pyspark()
    except percolator.InvalidArgument as e:
        print(f"percolator-load: {e}", file=sys.stderr)
        return 2
    from percolator import metrics

    try:
        connect = _connect_options(args, lock_ttl=args.lock_ttl)
        endpoint = metrics.serve_from_arguments(args)  # the driver's, while the load runs
    except percolator.PercolatorError as e:
        print(f"percolator-load: {e}", file=sys.stderr)
        return 2
    columns = dict(args.column)
    spark, ours = _spark(f"percolator-load {args.table}", args.master)
    try:
        rejects = args.rejects
        result = load_files(
            spark, args.input, args.format, args.cluster, args.table, args.row_key, columns,
            load_id=args.load_id, create_table=not args.no_create_table,
            observe=args.observe, max_rejects=args.max_rejects,
            rejects_path=rejects or f"rejects-{args.table}-{{load_id}}.jsonl",
            partitions=args.partitions, batch_cells=args.batch_cells, connect_options=connect,
            test_hooks={"batch_delay": args.test_batch_delay,
                        "crash_after_commit": args.test_crash_after_commit},
        )
    except LoadError as e:
        print(f"percolator-load: {e}", file=sys.stderr)
        if e.result is not None:
            print(e.result.summary(), file=sys.stderr)
        return 1
    except percolator.InvalidArgument as e:
        print(f"percolator-load: {e}", file=sys.stderr)
        return 2
    except percolator.PercolatorError as e:
        print(f"percolator-load: load failed, nothing of it is visible: {e}", file=sys.stderr)
        return 1
    finally:
        if ours:
            spark.stop()
        if endpoint is not None:
            endpoint.shutdown()
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
