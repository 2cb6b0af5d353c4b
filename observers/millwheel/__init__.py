"""MillWheel on Percolator: keyed stream computations with per-key state, timers and
low watermarks, delivered exactly once (seed 004, the MillWheel slides).

One snapshot-isolation transaction per key run consumes the key's input records,
updates its state, fires and arms its timers and produces downstream records, so
internal edges need no record-id deduplication; injectors commit their source
position with what they inject::

    from observers import Worker, millwheel as mw

    class Counter(mw.Computation):
        outputs = ("counts",)

        def process_record(self, ctx, record):
            n = ctx.state.get_json("n", 0) + 1
            ctx.state.set_json("n", n)
            ctx.produce("counts", b"%d" % n, record.timestamp)

    pairs = [(b"shoes", 1_000), (b"hats", 2_000)]        # (value, event time in ms)
    pipeline = mw.Pipeline(cluster, "clicks")
    pipeline.injector("source", mw.IterableSource(pairs), stream="clicks")
    pipeline.computation(Counter(), inputs={"clicks": lambda r: r.value})
    pipeline.create()
    Worker(cluster, pipeline.observers(), tasks=pipeline.tasks()).run()

``python -m observers.millwheel run|status|verify --cluster URL --pipeline
package.module:FACTORY``; the design and the watermark argument: docs/millwheel.md.
"""

from observers.millwheel._model import (
    END_OF_TIME,
    Computation,
    Context,
    IterableSource,
    Record,
    Source,
    State,
    Timer,
)
from observers.millwheel._pipeline import MAX_RECORDS_PER_RUN, Pipeline, Status

__all__ = [
    "END_OF_TIME",
    "MAX_RECORDS_PER_RUN",
    "Computation",
    "Context",
    "IterableSource",
    "Pipeline",
    "Record",
    "Source",
    "State",
    "Status",
    "Timer",
]
