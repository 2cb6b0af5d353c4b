"""Observers: code that runs whenever an observed column changes (Percolator §2.4).

::

    from observers import Observer, Worker, wait_for_observers

    class DocumentProcessor(Observer):
        table, column = "documents", "raw:html"

        def process(self, txn, row, column):
            ...                 # read and write through txn; the worker commits

    Worker(cluster, [DocumentProcessor], threads=4).run()

or run workers as processes: ``python -m observers --cluster URL --observers
package.module:OBSERVERS [--threads N] [--gc-interval SECONDS]`` (also
``percolator-worker``), which also collect garbage every ten minutes, one worker of
the cluster at a time (:class:`Periodic`).
"""

from observers._observer import Observer
from observers._periodic import Periodic
from observers._verify import VerifyReport
from observers._worker import CommitHook, Worker, load_observers, wait_for_observers
from percolator.ext import Quarantined, WaitTimeout, ack_column

__all__ = [
    "CommitHook",
    "Observer",
    "Periodic",
    "Quarantined",
    "VerifyReport",
    "WaitTimeout",
    "Worker",
    "ack_column",
    "load_observers",
    "wait_for_observers",
]
