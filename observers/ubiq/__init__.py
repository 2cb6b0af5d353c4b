"""Ubiq on Percolator: exactly-once processing of growing log files, in work units
(seed 003). A tracker follows files that keep growing in one or more replica
directories ("sites"); a cutter cuts every tracked byte into exactly one unit, at
record boundaries; workers lease units, run the application and commit each unit
once, its table output in the same transaction; file output is published only from
the committed attempt; a record the application refuses is split off and quarantined::

    import collections, json
    from observers import Worker, ubiq

    class CampaignCounts(ubiq.Application):
        def process(self, unit, out):
            counts = collections.Counter(json.loads(r.data)["campaign"] for r in unit.records())
            for campaign, n in counts.items():      # a partial aggregate per unit: no hot cell
                out.set("partials", f"{campaign}/{unit.id}".encode(), "c:n", b"%d" % n)

    logs = ubiq.LogPipeline(cluster, "adlogs", app=CampaignCounts(),
                            sites={"a": "/logs/a", "b": "/logs/b"}, pattern="*.jsonl",
                            unit_bytes=1 << 20, max_unit_delay=5.0)
    logs.create()
    Worker(cluster, logs.observers(site="a"), tasks=logs.tasks(site="a")).run()

``python -m observers.ubiq track|run|status|verify|retry-range``; the design and why it
is exactly-once: docs/ubiq.md.
"""

from observers.ubiq._pipeline import (
    Application,
    BadRecord,
    CoverageReport,
    LogPipeline,
    Output,
    Record,
    WorkUnit,
)

__all__ = [
    "Application",
    "BadRecord",
    "CoverageReport",
    "LogPipeline",
    "Output",
    "Record",
    "WorkUnit",
]
