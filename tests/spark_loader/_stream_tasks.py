"""The streaming writer's store half, played as a driver process without Spark's
jobs: for each micro-batch not yet recorded done, two tasks write their rows
(``PercolatorStreamWriter.write_task``, what a task does once it knows its run and
batch), then the commit; a batch is recorded done (one line in DONE, as Spark's
commit log) once the commit returned. The fast twin of the Spark test that kills the
real driver (tests/spark_loader/test_source.py): the test kills this process with
``kill -9`` where ``_PERCOLATOR_TEST_PARK_AFTER_PREWRITE`` parks it.

``python -m tests.spark_loader._stream_tasks URL TABLE DONE RUN BATCHES``
(the micro-batches of ``tests/spark_loader/_stream_batches.py``, five rows per task)
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import Row
from pyspark.sql import types as T

from spark_loader._source import PercolatorDataSource
from tests.spark_loader._stream_batches import ROWS, rows_of

TASKS = 2
SCHEMA = T.StructType([T.StructField("row", T.StringType()), T.StructField("v:n", T.LongType())])


def main(url: str, table: str, done_file: str, run: str, batches: int) -> None:
    done = Path(done_file)
    recorded = set(done.read_text().split()) if done.exists() else set()
    writer = PercolatorDataSource({"url": url, "table": table, "queryId": "twin"}
                                  ).streamWriter(SCHEMA, False)
    for batch in range(batches):
        if str(batch) in recorded:
            continue
        rows = [Row(**{"row": row, "v:n": value}) for row, value in rows_of(batch)]
        share = ROWS // TASKS
        reports = [writer.write_task(run, batch, iter(rows[t * share:(t + 1) * share]))
                   for t in range(TASKS)]
        writer.commit(list(reports), batch)
        with open(done, "a") as f:
            f.write(f"{batch}\n")


if __name__ == "__main__":
    main(*sys.argv[1:5], int(sys.argv[5]))
