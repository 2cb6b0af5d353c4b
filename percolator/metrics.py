"""Prometheus metrics of this process: transactions, locks, store round trips, observers,
notifications, the timestamp oracle and garbage collection.

The library records into plain in-process counters and fixed-bucket histograms that cost
a lock and an addition (no dependency); ``prometheus_client`` (the optional extra
``metrics``: ``pip install 'percolator-txn[metrics]'``) is imported only to expose them::

    import percolator.metrics
    percolator.metrics.serve(9464)                 # http://127.0.0.1:9464/metrics

    # or, in a process that already exports metrics:
    import prometheus_client
    prometheus_client.REGISTRY.register(percolator.metrics.collector())

``python -m observers --metrics-port N``, ``python -m oracle --metrics-port N`` and
``python -m spark_loader --metrics-port N`` call :func:`serve` for you. Endpoints bind
127.0.0.1 unless told otherwise (``--metrics-host``): metrics name tables and observers.

Labels take bounded sets of values only (transaction kinds, store operations, observer
names, table names, outcomes): never a row key. The names follow Prometheus conventions
(``_total`` counters, ``_seconds`` in base units); :data:`METRICS` lists them all, with
their type, help text and label names (the dashboard and alert rules in ``deploy/`` use
only these).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from percolator._errors import InvalidArgument, PercolatorError

__all__ = [
    "METRICS",
    "READ_SAMPLE",
    "MetricsUnavailable",
    "add_gauge_callback",
    "collector",
    "counter",
    "inc",
    "observe",
    "record_gc_pass",
    "remove_gauge_callback",
    "serve",
    "set_enabled",
    "set_gauge",
]


class MetricsUnavailable(PercolatorError):
    """Exposing metrics needs ``prometheus_client``, which is not installed."""


_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            5.0, 10.0, 30.0)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

READ_SAMPLE = 16
"""One transactional read in this many is timed into ``percolator_read_duration_seconds``
(every read counts in ``percolator_reads_total``): two clock reads and an observation
cost a read more than its other metrics together, and a quantile of the histogram, the
only thing the dashboard computes from it, needs a fair sample, not every read. The
sample is a stride of the exact counter, so it is as fair as the reads are unordered;
its ``_count`` and ``_sum`` are those of the sample (``_sum / _count`` is still the mean)."""

METRICS: dict[str, tuple[Any, ...]] = {
    # transactions (kind: user, observer, bulk: one per bulk load, counted by its driver)
    "percolator_transactions_begun_total": (
        "counter", "Transactions begun.", ("kind",)),
    "percolator_transactions_committed_total": (
        "counter", "Transactions committed (read-only ones included).", ("kind",)),
    "percolator_transactions_conflicted_total": (
        "counter", "Commits refused by a write-write conflict.", ("kind",)),
    "percolator_transactions_failed_total": (
        "counter", "Commits that raised anything but a conflict (outcome may be unknown).",
        ("kind",)),
    "percolator_commit_duration_seconds": (
        "histogram", "Time spent committing a transaction.", ("kind",), _LATENCY),
    "percolator_reads_total": (
        "counter", "Transactional reads that went to the store (get, get_row, get_rows: "
        "one per call).", ()),
    "percolator_read_duration_seconds": (
        "histogram", "Time of one transactional read, lock waits included; sampled: the "
        f"first read of the process and one in {READ_SAMPLE} after it (all reads count in "
        "percolator_reads_total).", (), _LATENCY),
    # locks
    "percolator_locks_met_total": (
        "counter", "Lock cells of other transactions met by reads.", ()),
    "percolator_locks_resolved_total": (
        "counter", "Locks of other transactions cleaned up, by action.", ("action",)),
    "percolator_lock_wait_seconds_total": (
        "counter", "Time reads spent waiting for live lock holders.", ()),
    # store
    "percolator_store_requests_total": (
        "counter", "Store round trips, by operation.", ("operation",)),
    # observers
    "percolator_observer_runs_total": (
        "counter", "Observer transactions, by observer and outcome (committed, conflict, "
        "acked_already, failed, transient, quarantined, absent).", ("observer", "outcome")),
    "percolator_observer_run_duration_seconds": (
        "histogram", "Time of one observer run, retries of conflicts included.",
        ("observer",), _LATENCY),
    "percolator_notification_scan_duration_seconds": (
        "histogram", "Time of one scanner pass over the notify family.", (), _LATENCY),
    "percolator_notifications_pending": (
        "gauge", "Pending notifications (dirty cells) per observed table, counted at "
        "scrape time at most every few seconds.", ("table",)),
    # oracle
    "percolator_oracle_timestamps_served_total": (
        "counter", "Timestamps handed out by this oracle.", ()),
    "percolator_oracle_requests_total": (
        "counter", "GetTimestamps requests answered by this oracle.", ()),
    "percolator_oracle_batch_size": (
        "histogram", "Requests served per allocator batch.", (), _BATCH),
    "percolator_oracle_batches_total": (
        "counter", "Allocator batches served (requests answered together).", ()),
    "percolator_oracle_leader": (
        "gauge", "1 while this oracle serves timestamps (leader), else 0.", ()),
    "percolator_oracle_persisted_ceiling": (
        "gauge", "The durably recorded timestamp ceiling.", ()),
    # garbage collection (recorded by the GC pass)
    "percolator_gc_passes_total": (
        "counter", "Garbage collection passes finished, by outcome (ok, failed).",
        ("outcome",)),
    "percolator_gc_versions_deleted_total": (
        "counter", "Old versions deleted by garbage collection, by table.", ("table",)),
    "percolator_gc_pass_duration_seconds": (
        "histogram", "Time of one garbage collection pass.", (), _LATENCY),
    "percolator_gc_safe_point_timestamp": (
        "gauge", "The GC safe point: versions older than it may be collected.", ()),
    # loader
    "percolator_loader_rows_total": (
        "counter", "Rows made visible by committed bulk loads.", ()),
    "percolator_loader_rejects_total": (
        "counter", "Input records rejected by committed bulk loads.", ()),
}
"""Every metric this library exports: name -> (type, help, label names[, buckets])."""


class _Histogram:
    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0


_lock = threading.Lock()
_values: dict[tuple[str, tuple[str, ...]], float] = {}
# Counters stepped by one are itertools.count objects: next() is one C call, atomic
# under the GIL, so the hot path takes no lock.
_steps: dict[tuple[str, tuple[str, ...]], Iterator[int]] = {}


def _stepper(key: tuple[str, tuple[str, ...]]) -> Iterator[int]:
    with _lock:
        return _steps.setdefault(key, itertools.count(1))


def _stepped(counter: Iterator[int]) -> int:
    return int(repr(counter)[6:-1]) - 1  # "count(N)": N - 1 steps taken
_histograms: dict[tuple[str, tuple[str, ...]], _Histogram] = {}
_callbacks: list[Callable[[], Iterable[tuple[str, tuple[str, ...], float]]]] = []


_enabled = True


def set_enabled(enabled: bool) -> None:
    """Record (the default) or not: with False, :func:`inc`, :func:`observe` and
    :func:`set_gauge` return at once (values already recorded stay)."""
    global _enabled
    _enabled = bool(enabled)


def inc(name: str, *labels: str, amount: float = 1) -> None:
    """Add *amount* to the counter *name* (a key of :data:`METRICS`) with *labels*."""
    if not _enabled:
        return
    key = (name, labels)
    if amount == 1:
        next(_steps.get(key) or _stepper(key))
        return
    with _lock:
        _values[key] = _values.get(key, 0) + amount


def counter(name: str, *labels: str) -> Iterator[int]:
    """The counter *name* (a key of :data:`METRICS`) with *labels* as an object whose
    ``next()`` adds one, for the library's hot paths: they hold it and step it in line
    while recording is on (one C call and no lock, where :func:`inc` is a call of ours
    and a dictionary lookup)::

        _READS = metrics.counter("percolator_store_requests_total", "read_rows")
        ...
        if metrics._enabled:
            next(_READS)
    """
    if name not in METRICS or METRICS[name][0] != "counter":
        raise InvalidArgument(f"{name!r} is not a counter of percolator.metrics.METRICS")
    if len(labels) != len(METRICS[name][2]):
        raise InvalidArgument(f"{name} takes the labels {METRICS[name][2]}, got {labels!r}")
    return _stepper((name, labels))


def set_gauge(name: str, value: float, *labels: str) -> None:
    """Set the gauge *name* with *labels* to *value*."""
    if not _enabled:
        return
    with _lock:
        _values[(name, labels)] = value


def observe(name: str, value: float, *labels: str) -> None:
    """Record *value* in the histogram *name* with *labels*.

    A value is appended to the histogram's queue (atomic under the GIL: no lock) and
    put in its bucket when the queue is drained, at a scrape or every ``_FOLD_AT``
    values: commits and reads observe one each, and a lock and a bisection apiece
    cost them more than the rest of their metrics together."""
    if not _enabled:
        return
    key = (name, labels)
    queue = _pending.get(key)
    if queue is None:
        queue = _queue(key)
    queue.append(value)
    if len(queue) >= _FOLD_AT:
        with _lock:
            _fold(key, queue)


_FOLD_AT = 1024
_pending: dict[tuple[str, tuple[str, ...]], collections.deque[float]] = {}


def _queue(key: tuple[str, tuple[str, ...]]) -> collections.deque[float]:
    if key[0] not in METRICS or METRICS[key[0]][0] != "histogram":
        raise InvalidArgument(f"{key[0]!r} is not a histogram of percolator.metrics.METRICS")
    with _lock:
        return _pending.setdefault(key, collections.deque())


def _fold(key: tuple[str, tuple[str, ...]], queue: collections.deque[float]) -> None:
    """Move the queued values of *key* into its buckets (the caller holds ``_lock``)."""
    h = _histograms.get(key)
    if h is None:
        h = _histograms[key] = _Histogram(METRICS[key[0]][3])
    buckets, counts = h.buckets, h.counts
    total = 0.0
    while True:
        try:
            value = queue.popleft()  # atomic: a value appended meanwhile stays queued
        except IndexError:
            break
        counts[bisect.bisect_left(buckets, value)] += 1
        total += value
    h.sum += total


def add_gauge_callback(
    callback: Callable[[], Iterable[tuple[str, tuple[str, ...], float]]],
) -> None:
    """Call *callback* at every scrape; it yields ``(name, labels, value)`` for gauges
    (or counters kept elsewhere) read at that moment."""
    with _lock:
        _callbacks.append(callback)


def remove_gauge_callback(
    callback: Callable[[], Iterable[tuple[str, tuple[str, ...], float]]],
) -> None:
    """Stop calling *callback* (no error if it was not added)."""
    with _lock:
        if callback in _callbacks:
            _callbacks.remove(callback)


def snapshot() -> tuple[
    dict[tuple[str, tuple[str, ...]], float],
    dict[tuple[str, tuple[str, ...]], tuple[list[int], float]],
]:
    """Copies of the counters/gauges and histograms (counts per bucket, sum), with the
    callbacks' values merged in (a callback that raises is skipped)."""
    with _lock:
        values = dict(_values)
        for key, counter in _steps.items():
            values[key] = values.get(key, 0) + _stepped(counter)
        for key, queue in _pending.items():
            _fold(key, queue)
        hists = {k: (list(h.counts), h.sum) for k, h in _histograms.items()}
        callbacks = list(_callbacks)
    for callback in callbacks:
        try:
            for name, labels, value in callback():
                values[(name, labels)] = value
        except Exception:  # a failing probe must not break the whole scrape
            import logging

            logging.getLogger("percolator.metrics").warning(
                "metrics callback %r failed", callback, exc_info=True)
    return values, hists


def record_gc_pass(
    seconds: float, *, ok: bool, deleted: dict[str, int] | None = None,
    safe_point: int | None = None,
) -> None:
    """What a garbage collection pass calls once at its end: its duration in *seconds*,
    whether it finished (*ok*), the versions it *deleted* per table, and the *safe_point*
    timestamp it collected below."""
    inc("percolator_gc_passes_total", "ok" if ok else "failed")
    observe("percolator_gc_pass_duration_seconds", seconds)
    for table, n in (deleted or {}).items():
        inc("percolator_gc_versions_deleted_total", table, amount=n)
    if safe_point is not None:
        set_gauge("percolator_gc_safe_point_timestamp", safe_point)


def _require_client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable(
            "exposing metrics needs prometheus_client: pip install 'percolator-txn[metrics]'"
        ) from None
    return prometheus_client


def collector() -> Any:
    """A ``prometheus_client`` collector of every metric of :data:`METRICS` (register it
    with a ``CollectorRegistry``).

    :raises MetricsUnavailable: when ``prometheus_client`` is not installed.
    """
    _require_client()
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    class _Collector:
        def describe(self) -> Iterator[Any]:
            return iter(())  # no describe: the registry collects lazily

        def collect(self) -> Iterator[Any]:
            values, hists = snapshot()
            for name, (kind, text, label_names, *rest) in METRICS.items():
                if kind == "histogram":
                    h = HistogramMetricFamily(name, text, labels=label_names)
                    for (n, labels), (counts, total) in hists.items():
                        if n != name:
                            continue
                        cumulative, acc = [], 0
                        for bound, count in zip((*rest[0], float("inf")), counts, strict=True):
                            acc += count
                            cumulative.append((_bound(bound), acc))
                        h.add_metric(list(labels), cumulative, total)
                    yield h
                    continue
                family: Any
                if kind == "counter":
                    family = CounterMetricFamily(name.removesuffix("_total"), text,
                                                 labels=label_names)
                else:
                    family = GaugeMetricFamily(name, text, labels=label_names)
                for (n, labels), value in values.items():
                    if n == name:
                        family.add_metric(list(labels), value)
                yield family

    return _Collector()


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def serve(port: int, host: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` over HTTP on *host*:*port* (port 0 picks a free one) from a
    daemon thread; returns the server, whose ``server_port`` is the bound port and whose
    ``shutdown()`` stops it.

    :raises MetricsUnavailable: when ``prometheus_client`` is not installed.
    :raises InvalidArgument: when the address cannot be bound.
    """
    client = _require_client()
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidArgument(f"metrics port must be an int in 0..65535, got {port!r}")
    registry = client.CollectorRegistry(auto_describe=False)
    registry.register(collector())
    try:
        server, _thread = client.start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise InvalidArgument(f"cannot serve metrics on {host}:{port}: {e}") from None
    return server


def add_arguments(parser: Any) -> None:
    """``--metrics-port`` and ``--metrics-host`` for a command line."""
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on http://HOST:PORT/metrics "
                             "(needs the 'metrics' extra; default: no endpoint)")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                        help="address the metrics endpoint binds (default 127.0.0.1; "
                             "0.0.0.0 for a Prometheus on another host)")


def serve_from_arguments(args: Any) -> Any:
    """Start the endpoint asked for by :func:`add_arguments`'s options, if any; returns
    the server or None."""
    if args.metrics_port is None:
        return None
    return serve(args.metrics_port, args.metrics_host)
