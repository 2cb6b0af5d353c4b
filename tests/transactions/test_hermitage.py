"""Isolation anomalies from Martin Kleppmann's Hermitage, on every backend.

The cases live in the package (:mod:`percolator.conformance._hermitage`, which
``python -m percolator.conformance`` runs against a deployment's cluster): snapshot
isolation prevents G0, G1a, G1b, G1c, OTV, PMP, P4 (lost update) and G-single (read
skew), and allows G2-item (write skew): its case checks that both writers commit.
Each case seeds ``x = 10``, ``y = 20`` (rows 1 and 2 of table ``test``) and raises
:class:`~percolator.conformance.Anomaly` at the first step that differs.
"""

from __future__ import annotations

import pytest

from percolator import Cluster
from percolator.conformance._hermitage import CASES, Case, run_case


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hermitage(cluster: Cluster, case: Case) -> None:
    cluster.create_table("test")
    run_case(case, cluster, "test")
