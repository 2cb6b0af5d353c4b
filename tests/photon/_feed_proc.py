"""A process that feeds the ``clicks`` pipeline from growing log files and joins
(``python -m tests.photon._feed_proc URL DIRECTORY [QUERIES]``: clicks from
DIRECTORY, and queries from QUERIES through an index feed), for tests to kill."""

from __future__ import annotations

import sys

import percolator
from observers import Worker, photon


def main(url: str, directory: str, queries: str | None = None) -> None:
    with percolator.connect(url) as cluster:
        p = photon.JoinPipeline.open(cluster, "clicks")
        feeds = [photon.LogFeed(p, "clicks", directory, "*.jsonl", foreign=True, batch=25,
                                interval=0.02)]
        if queries is not None:
            feeds.append(photon.LogFeed(p, "queries", queries, "*.jsonl", foreign=False,
                                        index=True, batch=10, interval=0.02))
        Worker(cluster, p.observers(), tasks=[f.task() for f in feeds], threads=2).run()


if __name__ == "__main__":
    main(*sys.argv[1:])
