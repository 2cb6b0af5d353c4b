"""Certify a cluster: the conformance checks that matter to a deployment, run against
any store url from one command.

::

    python -m percolator.conformance --cluster "hbase://thrift.example:9091?api=thrift2" \\
        [--oracle zk://zk1:2181/percolator --zookeeper zk1:2181/percolator] \\
        [--checks hermitage,si,bank,append] [--duration 30] [--seed N] \\
        [--prefix conformance_x] [--keep] [--json report.json]

(or ``percolator conformance ...``). The checks run in tables of their own (named
``<prefix>_...``, dropped at the end unless ``--keep``) and exit 0 when the cluster
gave snapshot isolation throughout, 1 when a check found an anomaly, 2 when the run
could not be made (unreachable cluster, bad arguments, a check stopped by an error).

* ``hermitage``: Hermitage's isolation anomalies (:mod:`._hermitage`);
* ``si``: random interleaved transactions, some crashing mid-commit, against a
  reference model of snapshot isolation (:mod:`._si`);
* ``bank``: transfers by client processes killed with SIGKILL and restarted
  (:mod:`._bank`);
* ``append``: a list-append history checked by an Elle-style checker (:mod:`._append`).

See docs/running-on-a-cluster.md ("Certifying a cluster") for what each anomaly
says about a store's settings.
"""

from percolator.conformance._core import Anomaly, CheckResult, Connection
from percolator.conformance._runner import CHECKS, HINTS, Report, run

__all__ = ["CHECKS", "HINTS", "Anomaly", "CheckResult", "Connection", "Report", "run"]
