"""One conformance run: connect, run the chosen checks in tables of the run's prefix,
drop them, and report (text and JSON) with a likely cause for every anomaly."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from random import Random
from typing import Any

from percolator._errors import InvalidArgument
from percolator.conformance import _append, _bank, _hermitage, _si
from percolator.conformance._core import MAX_DETAILS, CheckResult, Connection, Target

CheckFunction = Callable[[Target, CheckResult], None]

CHECKS: dict[str, tuple[CheckFunction, bool]] = {
    "hermitage": (_hermitage.check, False),
    "si": (_si.check, True),
    "bank": (_bank.check, True),
    "append": (_append.check, True),
}
"""Name -> (the check, whether it takes a share of ``duration``: the others run a
fixed set of cases)."""

LOCK_TTL = 5.0
"""Seconds the run's own client honours a lock whose owner's liveness it cannot learn
(a crashed transaction of the ``si`` check when coordination is ZooKeeper's)."""

_VERSIONS = ("the store may not keep every version: an HBase column family needs "
             "VERSIONS => 2147483647 and TTL => FOREVER, a Bigtable one no GC rule by "
             "count or age (the library creates its tables so; tables created by hand "
             "or altered later may not be); or timestamps went backwards (the oracle, "
             "or the HBase servers' clocks for lock cells)")
_CAS = ("conflicting writes both committed: the store does not serialize writes to a "
        "cell (HBase replication with clients writing on both sides, a proxy between "
        "client and Thrift server that replays writes), or two clients got the same "
        "timestamps (two oracles, or --oracle given to some clients only)")
_LOCKS = ("locks of dead clients were not resolved: a client's liveness is unknown "
          "(ZooKeeper unreachable, clients on another host without --zookeeper) or the "
          "servers' clocks disagree with this host's (lock ttl is measured in wall time); "
          "or the store lost the commit record a lock's fate is read from (versions)")
_SPURIOUS = ("a commit failed with no conflicting writer: timestamps out of order "
             "(clock skew between HBase servers and clients, or a misconfigured oracle), "
             "or the store answered a check-and-set wrongly")

HINTS: dict[str, str] = {
    "snapshot read": _VERSIONS, "final state": _VERSIONS, "bank total": _VERSIONS,
    "G1a aborted read": _VERSIONS, "G1b intermediate read": _VERSIONS,
    "G1c circular information flow": _VERSIONS, "OTV observed transaction vanishes": _VERSIONS,
    "PMP predicate many preceders": _VERSIONS, "G-single read skew": _VERSIONS,
    "G1a": _VERSIONS, "G1b": _VERSIONS, "G1c": _VERSIONS, "G-single": _VERSIONS,
    "G2-nonadjacent": _VERSIONS, "incompatible-order": _VERSIONS,
    "lost update": _CAS, "P4 lost update": _CAS, "G0 write cycle": _CAS, "G0": _CAS,
    "PMP write predicate": _CAS, "lost-update": _CAS, "half-applied transfer": _CAS,
    "lost transfer": _CAS + "; or an acknowledged write was lost (store durability)",
    "lost append": _CAS + "; or an acknowledged write was lost (store durability)",
    "lost write": _CAS, "timestamps": _CAS,
    "spurious conflict": _SPURIOUS, "G2-item setup": _VERSIONS,
    "unresolved lock": _LOCKS,
}
"""Anomaly kind -> what in a store's settings most often causes it."""

ERROR_HINT = ("check the url and the store's transport: HBase's Thrift1 server must run "
              "with the url's transport and protocol (transport=framed for "
              "hbase.regionserver.thrift.framed=true, protocol=compact for .compact=true); "
              "timeouts (?timeout=) must exceed the slowest call; a Bigtable app profile "
              "needs single-cluster routing with transactional writes")

_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


@dataclass
class Report:
    """What a run found: one :class:`CheckResult` per check, in the order run."""

    url: str
    prefix: str
    seed: int
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def exit_code(self) -> int:
        """0 all passed, 1 an anomaly (whatever else happened), 2 a check could not run
        to its end."""
        if any(r.anomalies for r in self.results):
            return 1
        return 0 if self.ok else 2

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.url, "prefix": self.prefix, "seed": self.seed,
                "ok": self.ok, "seconds": round(self.seconds, 3),
                "checks": [r.to_json() for r in self.results],
                "hints": {k: HINTS[k] for r in self.results for k in r.anomalies if k in HINTS}}

    def format(self) -> str:
        lines = [f"conformance of {self.url} (tables {self.prefix}_*, seed {self.seed})"]
        for r in self.results:
            verdict = "PASS" if r.ok else ("ERROR" if r.error is not None else "FAIL")
            counts = ", ".join(f"{n} {what}" for what, n in sorted(r.counts.items())
                               if not what.startswith("anomaly "))
            lines.append(f"  {r.name:10} {verdict:5} {r.seconds:6.1f}s  {counts}")
            for kind, details in sorted(r.anomalies.items()):
                lines.append(f"    anomaly {kind}: {r.counts[f'anomaly {kind}']} seen")
                lines += [f"      {d}" for d in details[:3]]
                if kind in HINTS:
                    lines.append(f"      likely cause: {HINTS[kind]}")
            if r.error is not None:
                lines.append(f"    error: {r.error}")
                lines.append(f"      likely cause: {ERROR_HINT}")
        bad = [r.name for r in self.results if not r.ok]
        lines.append(f"{'FAILED: ' + ', '.join(bad) if bad else 'PASSED'} "
                     f"in {self.seconds:.1f}s")
        return "\n".join(lines)


def parse_checks(text: str) -> list[str]:
    """``"hermitage,si"`` -> the names, in the order given.

    :raises InvalidArgument: for an empty list or an unknown name.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if not names or unknown:
        raise InvalidArgument(f"--checks {text!r}: expected a comma-separated list of "
                              f"{', '.join(CHECKS)}" + (f" (unknown: {unknown})" if unknown
                                                         else ""))
    return names


def default_prefix() -> str:
    return f"conformance_{secrets.token_hex(3)}"


def run(connection: Connection, *, checks: Sequence[str] = tuple(CHECKS),
        duration: float = 30.0, seed: int | None = None, prefix: str | None = None,
        keep: bool = False, progress: Callable[[str], None] | None = None) -> Report:
    """Run *checks* against the cluster of *connection* in tables ``<prefix>_*``.

    *duration* (seconds) is shared among the checks that run for a time (``si``,
    ``bank``, ``append``); ``hermitage`` runs its fixed cases. *seed* makes the random
    choices repeatable (default: a fresh one, reported). The tables are dropped at the
    end unless *keep*. *progress* is called with a line as each check starts.

    :raises InvalidArgument: for a bad argument, or a *prefix* whose tables exist.
    :raises PercolatorError: (e.g. :class:`StoreUnavailable`) when the cluster cannot be
        reached; a check that fails later reports its error in the :class:`Report`.
    """
    for name in checks:
        if name not in CHECKS:
            raise InvalidArgument(f"unknown check {name!r}: expected one of {', '.join(CHECKS)}")
    if isinstance(duration, bool) or not isinstance(duration, int | float) or duration <= 0:
        raise InvalidArgument(f"duration must be a positive number of seconds, got {duration!r}")
    prefix = default_prefix() if prefix is None else prefix
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise InvalidArgument(f"bad prefix {prefix!r}: use up to 100 letters, digits, '_', "
                              "'.' or '-', starting with a letter or digit")
    seed = secrets.randbits(32) if seed is None else seed
    report = Report(connection.url, prefix, seed)
    began = time.monotonic()
    cluster = connection.connect(lock_ttl=LOCK_TTL)
    try:
        mine = [t for t in cluster.tables() if t.startswith(prefix + "_")]
        if mine:
            raise InvalidArgument(f"tables with prefix {prefix!r} already exist ({mine[:5]}): "
                                  "a run drops its tables at the end, so it needs a prefix "
                                  "of its own (--prefix)")
        timed = [n for n in checks if CHECKS[n][1]]
        share = duration / max(len(timed), 1)
        target = Target(connection, cluster, prefix, Random(seed), time.monotonic())
        try:
            for name in checks:
                if progress is not None:
                    progress(f"running {name}...")
                function, takes_time = CHECKS[name]
                result = CheckResult(name)
                target.rng = Random(f"{seed}/{name}")
                target.deadline = time.monotonic() + (share if takes_time else 0.0)
                started = time.monotonic()
                try:
                    function(target, result)
                except Exception as e:  # reported; the run goes on
                    result.error = f"{type(e).__name__}: {e}"
                result.seconds = time.monotonic() - started
                report.results.append(result)
        finally:
            if not keep:
                for table in [t for t in cluster.tables() if t.startswith(prefix + "_")]:
                    cluster.drop_table(table)
    finally:
        cluster.close()
    report.seconds = time.monotonic() - began
    return report


__all__ = ["CHECKS", "HINTS", "MAX_DETAILS", "Report", "parse_checks", "run"]
