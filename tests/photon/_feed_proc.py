"""A process that feeds the ``clicks`` pipeline from growing log files and joins
(``python -m tests.photon._feed_proc URL DIRECTORY``), for tests to kill."""

from __future__ import annotations

import sys

import percolator
from observers import Worker, photon


def main(url: str, directory: str) -> None:
    with percolator.connect(url) as cluster:
        p = photon.JoinPipeline.open(cluster, "clicks")
        feed = photon.LogFeed(p, "clicks", directory, "*.jsonl", foreign=True, batch=25,
                              interval=0.02)
        Worker(cluster, p.observers(), tasks=[feed.task()], threads=2).run()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
