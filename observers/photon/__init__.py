"""Photon on Percolator: joining a stream of foreign events (clicks) with the primary
events they reference (queries), exactly once, although both arrive unordered,
duplicated and late, and processes crash (seed 000, Photon, SIGMOD 2013).

Photon needs a Paxos id registry, joiner tokens and an offline verifier because
registering an event and writing its output are separate steps. Here both are one
snapshot-isolation transaction, so exactly-once holds at every commit::

    import time
    from datetime import timedelta
    from observers import Worker, photon

    clicks = photon.JoinPipeline(cluster, "clicks", photon.JsonAdapter(
        foreign_id="click_id", primary_id="query_id", primary_ref="query_id", time="ts"),
        unjoinable_after=3600, retention=timedelta(days=3))
    clicks.create()
    ts = int(time.time() * 1000)                         # milliseconds
    clicks.log_primary(cluster, [{"query_id": "q1", "ts": ts, "text": "shoes"}])
    clicks.log_foreign(cluster, [{"click_id": "c1", "query_id": "q1", "ts": ts}])
    Worker(cluster, clicks.observers(), tasks=clicks.tasks()).start()
    ...
    with percolator.Snapshot(cluster) as snapshot:
        clicks.joined(snapshot, b"c1")                   # the joined output

docs/photon.md has this example in full, run by the test suite.

Events can also be pulled in by feeds that commit their position with what they
ingest: ``photon.LogFeed`` (growing log files) and ``photon.TableFeed`` (another
table's committed changes). An index ``LogFeed`` keeps where each primary sits in
its log, not the event, and the joiner reads it back through a cache (the paper's
EventStore).

``python -m observers.photon run|ingest|status|verify|rejoin`` (see ``--help``).
The design, and where it departs from the seed, is in docs/photon.md.
"""

from observers.photon._adapter import Adapter, BadEvent, JsonAdapter
from observers.photon._events import EventStore, PrimaryUnreadable
from observers.photon._feeds import FeedStatus, LogFeed, TableFeed
from observers.photon._pipeline import (
    PLACEHOLDER,
    IngestResult,
    JoinPipeline,
    State,
    VerifyReport,
    row_key,
)

__all__ = [
    "PLACEHOLDER",
    "Adapter",
    "BadEvent",
    "EventStore",
    "FeedStatus",
    "IngestResult",
    "JoinPipeline",
    "JsonAdapter",
    "LogFeed",
    "PrimaryUnreadable",
    "State",
    "TableFeed",
    "VerifyReport",
    "row_key",
]
