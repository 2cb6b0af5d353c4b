"""Group commits: on the embedded store a scanner thread commits up to
:data:`GROUP_MAX` observer runs of one pass together (one SQLite write transaction,
``commit_group``), then accounts for each as a single run would."""

from __future__ import annotations

import logging

from observers._runs import Group, ObserverRuns, Outcome, Run
from percolator import PercolatorError, is_retryable
from percolator.ext import commit_group, commits_in_one_phase, format_row, internals
from percolator.metrics import inc as _inc

__all__ = ["GROUP_MAX", "GroupCommits"]

log = logging.getLogger("observers")

GROUP_MAX = 32
"""Observer transactions a scanner thread commits together on the embedded store
(one SQLite write transaction for up to this many; see ``commit_group``)."""


class GroupCommits(ObserverRuns):
    """The group commits of a :class:`~observers.Worker`."""

    def _commits_in_groups(self) -> bool:
        """Whether observer commits can share a store write (the embedded store's
        one-phase commits)."""
        return GROUP_MAX > 1 and commits_in_one_phase(self.cluster)

    def _flush(self, group: Group) -> None:
        """Commit the group's observer transactions together (``commit_group``: one
        SQLite write transaction), then account for each as a single run would, and
        let go of the rows' advisory locks."""
        runs, keys = group.runs, group.keys
        group.runs, group.keys = [], []
        try:
            if not runs:
                return
            outcomes = commit_group([run.txn for run in runs])
            for run, outcome in zip(runs, outcomes, strict=True):
                self._account(run, outcome)
        finally:
            for key in keys:
                internals(self.cluster).coordination.release_advisory_lock(key)

    def _account(self, run: Run, outcome: int | PercolatorError) -> None:
        name = run.observer.name
        if isinstance(outcome, PercolatorError):
            # The notification stays: a later pass runs the observer again.
            if is_retryable(outcome):
                self._count("conflicts")
                _inc("percolator_observer_runs_total", name, Outcome.CONFLICT)
            else:
                log.warning("%s on %s/%s/%s: %s; will retry", name, run.table,
                            format_row(run.row), run.column, outcome)
                _inc("percolator_observer_runs_total", name, Outcome.TRANSIENT)
            return
        self._count(Outcome.COMMITTED)
        _inc("percolator_observer_runs_total", name, Outcome.COMMITTED)
        settlement = run.txn.settlement
        if settlement is not None and not settlement.done:  # committed in two phases
            self._delete_notification(run.table, run.row, run.column, settlement.newest)
        self._committed(run.observer, run.table, run.row, run.column, run.change, outcome)
