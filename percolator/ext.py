"""What code that extends percolator builds on: the store contract, a cluster's parts
below its public face, the column layout, the observer transaction and its
notifications, the commit's entry points, what the timestamp oracle and the bulk
loader need. ``observers``, ``oracle``, ``spark_loader`` and the benchmarks import
these names from here, never from percolator's private modules
(``tests/test_imports.py`` fails on a private import across packages).

An application does not need this module: :mod:`percolator` is its surface. A new
store backend implements :class:`Store` (and declares the optional capabilities it
offers); a new worker or recipe runs :class:`ObserverRun` transactions and commits
them with :func:`commit_transaction` or :func:`commit_group`; a reader below the
transactions resolves the locks it meets with :func:`resolve_lock`.

Groups (each name's docstring is its contract):

* the store contract: :class:`Store`, :class:`Read`, :class:`Mutation`,
  :class:`Guard`, :data:`Cell`, :data:`RowCells`; the optional capabilities
  (:class:`Capability`, :data:`CAPABILITIES`, one constant and one protocol each) and
  :func:`offered`/:func:`declares` to ask for one;
* a cluster's parts: :func:`internals` gives the :class:`Internals` of a
  :class:`~percolator.Cluster` (its store, timestamps, coordination, counters);
* the column layout: the families (:data:`DATA`, :data:`LOCK`, :data:`WRITE`,
  :data:`NOTIFY`, :data:`FAMILIES`), the lock and write-record codecs, the name checks;
* timestamps and coordination: :class:`TimestampSource`, :class:`StoreTimestamps`,
  :class:`HostTimestamps`, :class:`NextStart`, :class:`Coordination`,
  :class:`ZooKeeperCoordination`;
* observers: :class:`ObserverRun` (the observer transaction), :class:`Settlement`,
  the notification, acknowledgement, failure and quarantine helpers, the notification
  index (:func:`scan_index`, :func:`settle`, :func:`write_entries`, ...), and what the
  recipes keep (:func:`committed_puts`, :func:`last_task_run`);
* commits: :func:`commit_transaction`, :func:`commit_group`,
  :func:`commits_in_one_phase`, :class:`TwoPhaseCommit` (phase by phase, for
  harnesses), :class:`CrashPoint`;
* the oracle: :class:`BatchedDraws`, :func:`pause_point`, :func:`make_client`,
  :func:`start_client` and the TLS helpers (:func:`check_tls`, :func:`diagnose`, ...);
* the bulk loader: :class:`BulkLoad`, :class:`LoadTxn`, :func:`prewrite_rows`,
  :func:`finish_rows`, :func:`begin_or_join`, :func:`refresh_primary`,
  :class:`AlreadyLoaded`, and :func:`resolve_lock`.

These names follow the library, not semantic versioning of their own: a change to
one is in CHANGELOG.md. Like :mod:`percolator`, the module loads each name at its
first use (PEP 562), so that the oracle server, which takes its TLS and ZooKeeper
helpers from here, does not load the transaction library.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from percolator._batching import BatchedDraws
    from percolator._bulk import (
        AlreadyLoaded,
        BulkLoad,
        LoadTxn,
        begin_or_join,
        finish_rows,
        prewrite_rows,
        refresh_primary,
    )
    from percolator._commit import (
        CrashPoint,
        SimulatedCrash,
        commit_group,
        commit_transaction,
        commits_in_one_phase,
    )
    from percolator._coordination import Coordination
    from percolator._encoding import (
        DATA,
        FAMILIES,
        FREE_TAG,
        LOCK,
        NOTIFY,
        WRITE,
        Committed,
        Lock,
        WriteKind,
        check_column,
        check_row,
        check_table,
        decode_lock,
        decode_write,
        encode_write,
        inline_value,
    )
    from percolator._internals import Internals, internals
    from percolator._lock_resolver import resolve_lock
    from percolator._notifications import (
        NOTIFY_WEAK,
        Quarantined,
        WaitTimeout,
        ack_column,
        clear_failures,
        format_row,
        pending_notifications,
        quarantine,
        quarantined,
        record_failure,
        wait_until_idle,
        watch_pending_notifications,
    )
    from percolator._notify_index import (
        migrate,
        scan_index,
        settle,
        settle_rows,
        uses_index,
        write_entries,
    )
    from percolator._observer_hooks import ObserverRun, Settlement, internal_columns
    from percolator._pause import pause_point
    from percolator._recipe_tables import committed_puts, last_task_run, record_task_run
    from percolator._store import (
        ATOMICALLY,
        CAPABILITIES,
        CAS_ANSWER_MAY_BE_REPLAYED,
        CAS_DELETES,
        CHECK_AND_SET_MANY,
        DELETE_IF,
        EMBEDDED_FILE,
        INCREMENT,
        NEWEST_OF_ROW,
        NOTIFY_INDEX,
        PUT_ROW,
        SET_UNLESS,
        SINGLE_WRITER,
        SPLIT_KEYS,
        VACUUM,
        AtomicSteps,
        BatchedCas,
        Capability,
        CasDeletes,
        Cell,
        ConditionalDelete,
        EmbeddedFile,
        Guard,
        GuardedSet,
        Incrementing,
        Mutation,
        Read,
        RowCells,
        RowNewest,
        RowPut,
        SplitKeys,
        Store,
        Vacuuming,
        declares,
        offered,
    )
    from percolator._timestamps import HostTimestamps, NextStart, StoreTimestamps, TimestampSource
    from percolator._tls import (
        HTTP2_PREFACE,
        add_zookeeper_tls_arguments,
        check_tls,
        describe_server,
        diagnose,
        validity_problem,
        zookeeper_tls_from_arguments,
    )
    from percolator._two_phase import TwoPhaseCommit
    from percolator._zk_client import make_client, start_client
    from percolator._zookeeper import ZooKeeperCoordination

_SOURCES: dict[str, str] = {
    "Store": "_store",
    "Cell": "_store",
    "RowCells": "_store",
    "Read": "_store",
    "Mutation": "_store",
    "Guard": "_store",
    "Capability": "_store",
    "CAPABILITIES": "_store",
    "CAS_ANSWER_MAY_BE_REPLAYED": "_store",
    "INCREMENT": "_store",
    "SET_UNLESS": "_store",
    "CHECK_AND_SET_MANY": "_store",
    "DELETE_IF": "_store",
    "CAS_DELETES": "_store",
    "SPLIT_KEYS": "_store",
    "NOTIFY_INDEX": "_store",
    "ATOMICALLY": "_store",
    "SINGLE_WRITER": "_store",
    "EMBEDDED_FILE": "_store",
    "VACUUM": "_store",
    "PUT_ROW": "_store",
    "NEWEST_OF_ROW": "_store",
    "Incrementing": "_store",
    "GuardedSet": "_store",
    "CasDeletes": "_store",
    "BatchedCas": "_store",
    "ConditionalDelete": "_store",
    "SplitKeys": "_store",
    "AtomicSteps": "_store",
    "EmbeddedFile": "_store",
    "Vacuuming": "_store",
    "RowPut": "_store",
    "RowNewest": "_store",
    "declares": "_store",
    "offered": "_store",
    "Internals": "_internals",
    "internals": "_internals",
    "DATA": "_encoding",
    "LOCK": "_encoding",
    "NOTIFY": "_encoding",
    "WRITE": "_encoding",
    "FAMILIES": "_encoding",
    "FREE_TAG": "_encoding",
    "Lock": "_encoding",
    "Committed": "_encoding",
    "WriteKind": "_encoding",
    "check_table": "_encoding",
    "check_row": "_encoding",
    "check_column": "_encoding",
    "encode_write": "_encoding",
    "decode_write": "_encoding",
    "decode_lock": "_encoding",
    "inline_value": "_encoding",
    "TimestampSource": "_timestamps",
    "StoreTimestamps": "_timestamps",
    "HostTimestamps": "_timestamps",
    "NextStart": "_timestamps",
    "Coordination": "_coordination",
    "ZooKeeperCoordination": "_zookeeper",
    "ObserverRun": "_observer_hooks",
    "Settlement": "_observer_hooks",
    "internal_columns": "_observer_hooks",
    "NOTIFY_WEAK": "_notifications",
    "Quarantined": "_notifications",
    "WaitTimeout": "_notifications",
    "ack_column": "_notifications",
    "clear_failures": "_notifications",
    "format_row": "_notifications",
    "pending_notifications": "_notifications",
    "quarantine": "_notifications",
    "quarantined": "_notifications",
    "record_failure": "_notifications",
    "wait_until_idle": "_notifications",
    "watch_pending_notifications": "_notifications",
    "migrate": "_notify_index",
    "scan_index": "_notify_index",
    "settle": "_notify_index",
    "settle_rows": "_notify_index",
    "uses_index": "_notify_index",
    "write_entries": "_notify_index",
    "CrashPoint": "_commit",
    "SimulatedCrash": "_commit",
    "commit_group": "_commit",
    "commit_transaction": "_commit",
    "commits_in_one_phase": "_commit",
    "TwoPhaseCommit": "_two_phase",
    "committed_puts": "_recipe_tables",
    "last_task_run": "_recipe_tables",
    "record_task_run": "_recipe_tables",
    "BatchedDraws": "_batching",
    "pause_point": "_pause",
    "make_client": "_zk_client",
    "start_client": "_zk_client",
    "HTTP2_PREFACE": "_tls",
    "add_zookeeper_tls_arguments": "_tls",
    "check_tls": "_tls",
    "describe_server": "_tls",
    "diagnose": "_tls",
    "validity_problem": "_tls",
    "zookeeper_tls_from_arguments": "_tls",
    "AlreadyLoaded": "_bulk",
    "BulkLoad": "_bulk",
    "LoadTxn": "_bulk",
    "begin_or_join": "_bulk",
    "finish_rows": "_bulk",
    "prewrite_rows": "_bulk",
    "refresh_primary": "_bulk",
    "resolve_lock": "_lock_resolver",
}
"""Name -> the private module of percolator that defines it (loaded at first use)."""


def __getattr__(name: str) -> _typing.Any:
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"percolator.{module}"), name)
    globals()[name] = value  # later lookups do not come here again
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SOURCES})


__all__ = [
    "ATOMICALLY",
    "CAPABILITIES",
    "CAS_ANSWER_MAY_BE_REPLAYED",
    "CAS_DELETES",
    "CHECK_AND_SET_MANY",
    "DATA",
    "DELETE_IF",
    "EMBEDDED_FILE",
    "FAMILIES",
    "FREE_TAG",
    "HTTP2_PREFACE",
    "INCREMENT",
    "LOCK",
    "NEWEST_OF_ROW",
    "NOTIFY",
    "NOTIFY_INDEX",
    "NOTIFY_WEAK",
    "PUT_ROW",
    "SET_UNLESS",
    "SINGLE_WRITER",
    "SPLIT_KEYS",
    "VACUUM",
    "WRITE",
    "AlreadyLoaded",
    "AtomicSteps",
    "BatchedCas",
    "BatchedDraws",
    "BulkLoad",
    "Capability",
    "CasDeletes",
    "Cell",
    "Committed",
    "ConditionalDelete",
    "Coordination",
    "CrashPoint",
    "EmbeddedFile",
    "Guard",
    "GuardedSet",
    "HostTimestamps",
    "Incrementing",
    "Internals",
    "LoadTxn",
    "Lock",
    "Mutation",
    "NextStart",
    "ObserverRun",
    "Quarantined",
    "Read",
    "RowCells",
    "RowNewest",
    "RowPut",
    "Settlement",
    "SimulatedCrash",
    "SplitKeys",
    "Store",
    "StoreTimestamps",
    "TimestampSource",
    "TwoPhaseCommit",
    "Vacuuming",
    "WaitTimeout",
    "WriteKind",
    "ZooKeeperCoordination",
    "ack_column",
    "add_zookeeper_tls_arguments",
    "begin_or_join",
    "check_column",
    "check_row",
    "check_table",
    "check_tls",
    "clear_failures",
    "commit_group",
    "commit_transaction",
    "commits_in_one_phase",
    "committed_puts",
    "declares",
    "decode_lock",
    "decode_write",
    "describe_server",
    "diagnose",
    "encode_write",
    "finish_rows",
    "format_row",
    "inline_value",
    "internal_columns",
    "internals",
    "last_task_run",
    "make_client",
    "migrate",
    "offered",
    "pause_point",
    "pending_notifications",
    "prewrite_rows",
    "quarantine",
    "quarantined",
    "record_failure",
    "record_task_run",
    "refresh_primary",
    "resolve_lock",
    "scan_index",
    "settle",
    "settle_rows",
    "start_client",
    "uses_index",
    "validity_problem",
    "wait_until_idle",
    "watch_pending_notifications",
    "write_entries",
    "zookeeper_tls_from_arguments",
]
