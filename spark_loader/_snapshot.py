"""A read at one snapshot: the driver plans it, the executors read it.

The driver draws one start timestamp (or takes the caller's) and cuts the table into
row-key ranges (:func:`plan_read`, the one preamble of :func:`spark_loader.read_table`
and of ``format("percolator")``'s batch reads); every partition then reads its range
through :class:`percolator.Snapshot` at that same timestamp (:func:`open_snapshot`),
so the DataFrame is one consistent snapshot: exactly the transactions that committed
before the timestamp, whatever commits while the job runs. A partition that meets a
lock resolves it as any reader does (rolls a dead writer back, or forward when its
primary committed), waiting up to the cluster's lock wait for a live one.

Ranges: by default, where the store reports its own cut points (Bigtable
``SampleRowKeys``, HBase ``getTableRegions``) the table is cut there; otherwise (SQLite,
a one-region HBase table), or when a number of partitions is asked for, the driver
samples the row keys with one key scan and cuts at evenly spaced samples.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import percolator
from percolator import InvalidArgument, PercolatorError
from percolator.ext import SPLIT_KEYS, WRITE, Read, check_column, internals, offered
from spark_loader._spark import executor_cluster

__all__ = ["KeyRange", "Range", "ReadError", "ReadPlan", "ReadSpec", "check_columns",
           "check_splits", "check_start_ts", "open_snapshot", "plan_ranges", "plan_read",
           "read_error"]

SAMPLES_PER_RANGE = 64
"""Keys kept per wanted range when the driver samples the row keys itself."""

Range = tuple[bytes | None, bytes | None]


class ReadError(PercolatorError):
    """Reading a table failed in a Spark partition. The message names the table, the
    start timestamp and the row range, then the cause (for example a lock still held
    by a live writer past the lock wait, or a start timestamp below the garbage
    collection safe point: snapshot too old)."""


@dataclass(frozen=True, slots=True)
class ReadSpec:
    """What an executor needs to read at the planned snapshot (plain data: it is
    pickled to every task)."""

    url: str
    connect: tuple[tuple[str, Any], ...]
    table: str
    columns: tuple[str, ...] | None
    start_ts: int


@dataclass(frozen=True, slots=True)
class KeyRange:
    """The rows a read is limited to (what the data source's pushed-down row-key
    filters leave): ``[start, stop)`` and, for ``=`` and ``IN``, the exact keys (None:
    any key in the range). The default is every row."""

    start: bytes | None = None
    stop: bytes | None = None
    keys: frozenset[bytes] | None = None

    def meet(self, other: KeyRange) -> KeyRange:
        start = other.start if self.start is None or (
            other.start is not None and other.start > self.start) else self.start
        stop = other.stop if self.stop is None or (
            other.stop is not None and other.stop < self.stop) else self.stop
        keys = self.keys if other.keys is None else (
            other.keys if self.keys is None else self.keys & other.keys)
        return KeyRange(start, stop, keys)

    def clip(self, bounds: Range) -> Range | None:
        """*bounds* narrowed to this range, None when they do not meet."""
        start = bounds[0] if self.start is None or (
            bounds[0] is not None and bounds[0] > self.start) else self.start
        stop = bounds[1] if self.stop is None or (
            bounds[1] is not None and bounds[1] < self.stop) else self.stop
        if start is not None and stop is not None and start >= stop:
            return None
        return start, stop


def check_columns(columns: object) -> tuple[str, ...] | None:
    if columns is None:
        return None
    if isinstance(columns, str | bytes) or not isinstance(columns, Iterable):
        raise InvalidArgument(
            f"columns must be a list of 'family:qualifier' strings or None, got {columns!r:.80}"
        )
    checked = tuple(check_column(c) for c in columns)
    if not checked:
        raise InvalidArgument("columns is empty: name at least one 'family:qualifier' "
                              "(or pass None for every column)")
    if len(set(checked)) != len(checked):
        raise InvalidArgument(f"columns names a column twice: {list(checked)}")
    return checked


def check_start_ts(start_ts: object, cluster: percolator.Cluster) -> int:
    now = internals(cluster).timestamps.get_timestamp()
    if start_ts is None:
        return now
    if isinstance(start_ts, bool) or not isinstance(start_ts, int) or start_ts <= 0:
        raise InvalidArgument(f"start_ts must be a positive int timestamp or None, "
                              f"got {start_ts!r}")
    if start_ts > now:
        # Transactions may still commit below a timestamp not yet issued: such a read
        # would not be repeatable.
        raise InvalidArgument(f"start_ts {start_ts} is in the future (the oracle is at "
                              f"{now}); pass a timestamp the oracle issued, such as the "
                              "start_ts of an earlier read")
    return start_ts


def check_splits(splits: object) -> int | list[bytes] | None:
    if splits is None:
        return None
    if isinstance(splits, int) and not isinstance(splits, bool):
        if splits < 1:
            raise InvalidArgument(f"splits must be a positive number of partitions, got {splits}")
        return splits
    if isinstance(splits, str | bytes) or not isinstance(splits, Iterable):
        raise InvalidArgument(f"splits must be None, a number of partitions or a list of "
                              f"row keys (bytes), got {splits!r:.80}")
    keys = list(splits)
    bad = [k for k in keys if not isinstance(k, bytes) or not k]
    if bad:
        raise InvalidArgument(f"split keys must be non-empty bytes, got {bad[0]!r:.80}")
    return sorted(set(keys))


def _ranges(keys: Sequence[bytes]) -> list[Range]:
    return list(zip([None, *keys], [*keys, None], strict=True))


def _evenly(keys: Sequence[bytes], parts: int) -> list[bytes]:
    """``parts - 1`` keys spread evenly over the sorted *keys* (fewer if they repeat)."""
    if parts <= 1 or not keys:
        return []
    return sorted({keys[i * len(keys) // parts] for i in range(1, parts)})


def _sample_keys(cluster: percolator.Cluster, table: str, columns: tuple[str, ...] | None,
                 parts: int) -> list[bytes]:
    """A uniform sample of the table's row keys (one key scan on the driver,
    reservoir sampling: memory bounded by ``SAMPLES_PER_RANGE * parts``)."""
    size = SAMPLES_PER_RANGE * parts
    rng = random.Random(0)
    sample: list[bytes] = []
    read = Read(WRITE, columns)  # rows with a committed (or resolved) change
    for seen, (row, _) in enumerate(internals(cluster).store.scan(table, None, None, [read])):
        if seen < size:
            sample.append(row)
        else:
            j = rng.randrange(seen + 1)
            if j < size:
                sample[j] = row
    return sorted(sample)


def plan_ranges(cluster: percolator.Cluster, table: str, splits: int | Sequence[bytes] | None,
                *, default_parts: int, columns: Sequence[str] | None = None) -> list[Range]:
    """The row-key ranges ``[start, stop)`` (None: unbounded) that cover *table*.

    *splits*: a list of row keys cuts there; a number asks for that many ranges of
    about as many rows each (cut at sampled keys); None takes the store's own cut
    points (Bigtable tablets and samples, HBase regions, as Hadoop's input formats
    do), or ``default_parts`` ranges of sampled keys where it reports none.
    """
    checked = check_splits(splits)
    if isinstance(checked, list):
        return _ranges(checked)
    if checked is None:
        splitting = offered(internals(cluster).store, SPLIT_KEYS)
        if splitting is not None:
            store_keys = splitting.split_keys(table)
            if store_keys:
                return _ranges(store_keys)
        checked = default_parts
    if checked <= 1:
        return [(None, None)]
    wanted = tuple(columns) if columns is not None else None
    return _ranges(_evenly(_sample_keys(cluster, table, wanted, checked), checked))

@dataclass(frozen=True, slots=True)
class ReadPlan:
    """A read planned on the driver: the start timestamp every partition reads at, and
    the partitions: row ranges ``[start, stop)``, or (*keys* not None) one partition
    of exactly those keys (none: an empty read)."""

    start_ts: int
    ranges: tuple[Range, ...]
    keys: tuple[bytes, ...] | None = None


def plan_read(cluster: percolator.Cluster, table: str, columns: Sequence[str] | None,
              start_ts: int | None, splits: int | Sequence[bytes] | None, *,
              default_parts: int, within: KeyRange | None = None) -> ReadPlan:
    """Plan a read of *columns* (None: every column) of *table* on the driver: check
    that the table exists, draw the start timestamp (or check *start_ts*: issued, not
    in the future), cut the table into ranges (:func:`plan_ranges`, *splits* and
    *default_parts* as there) narrowed to *within*, and read the first partition's
    first row, so that an error every partition would meet (a snapshot too old for
    garbage collection, a store refusing the read) is raised here, before Spark
    starts tasks.

    .. warning:: blocks while it samples split keys (one key scan).
    :raises UnknownTableError: *table* does not exist.
    :raises InvalidArgument: a malformed *start_ts* or *splits*, or a *start_ts* the
        oracle has not issued yet.
    """
    internals(cluster).require_table(table)
    ts = check_start_ts(start_ts, cluster)
    within = within or KeyRange()
    if within.keys is not None:
        keys = tuple(sorted(k for k in within.keys if within.clip((k, k + b"\x00")) is not None))
        plan = ReadPlan(ts, (), keys)
    else:
        ranges = tuple(c for r in plan_ranges(cluster, table, splits,
                                              default_parts=default_parts, columns=columns)
                       if (c := within.clip(r)) is not None)
        plan = ReadPlan(ts, ranges) if ranges else ReadPlan(ts, (), ())
    wanted = tuple(columns) if columns is not None else None
    probe = percolator.Snapshot(cluster, start_ts=ts)
    if plan.keys is None:
        scan = probe.scan(table, plan.ranges[0][0], plan.ranges[0][1], wanted)
        try:
            next(scan, None)
        finally:
            getattr(scan, "close", lambda: None)()  # an HBase scanner, say
    elif wanted is not None:  # exact keys (the data source's, whose reads name columns)
        probe.get_rows(table, plan.keys[:1], wanted)
    return plan


# --- executors ---------------------------------------------------------------------------


def open_snapshot(spec: ReadSpec, where: str) -> percolator.Snapshot:
    try:
        return percolator.Snapshot(executor_cluster(spec.url, spec.connect), start_ts=spec.start_ts)
    except PercolatorError as e:
        raise read_error(spec, where, e) from e


def read_error(spec: ReadSpec, where: str, e: PercolatorError) -> ReadError:
    return ReadError(f"reading table {spec.table!r} at start_ts {spec.start_ts} ({where}) "
                     f"failed: {type(e).__name__}: {e}")
