"""Cloud Bigtable backend of the store contract (:mod:`percolator._store`).

``open_bigtable_store("bigtable://project/instance")`` talks to Cloud Bigtable, or to
the emulator (``cbtemulator``) when ``BIGTABLE_EMULATOR_HOST`` is set or the URL says
``?emulator=host:port``. It needs the ``bigtable`` extra: ``pip install
'percolator-txn[bigtable]'``.

How the contract maps onto Bigtable
-----------------------------------

* **Timestamps.** Bigtable timestamps are microseconds and, for tables with the
  default granularity, multiples of 1000. A logical timestamp ``ts`` is stored as
  ``ts * 1000`` microseconds and read back as ``micros // 1000``.
* **Columns.** ``"family:qualifier"`` is split at the first colon; the qualifier (which
  may itself contain colons) is stored as its UTF-8 bytes. Column selection uses exact
  ``ColumnRange`` filters (``[q, q]``), so no qualifier ever goes through a regular
  expression and binary or regex-looking qualifiers need no escaping.
* **Reads.** One :meth:`BigtableStore.read_rows` call is one ``ReadRows`` request: a
  ``RowSet`` of the keys and one filter, the *interleave* of one chain per
  :class:`~percolator._store.Read` (columns, then ``TimestampRange`` ``[min_ts*1000,
  (max_ts+1)*1000)``, then ``CellsColumnLimit`` for ``versions``). A transactional get
  (lock latest + write records + data version of one row) is therefore one request,
  and all its cells come from one atomic row read.
* **Compare-and-set.** :meth:`BigtableStore.check_and_set` is one ``CheckAndMutateRow``.
  The predicate is the chain *exact column -> latest version -> value in
  [expected, expected]* (for ``expected=None``: *exact column -> latest version*, and the
  mutation goes in the false branch). The mutation deletes every version of the CAS
  cell and sets the new value **at timestamp 0**, so exactly one version remains whatever
  the family's GC rule (it is read back with timestamp 0, so a ``Read`` of it must keep
  ``min_ts=0``, the default). The caller's ``puts`` go into
  the same branch of the same request, so they are applied atomically with the set and
  only when it succeeds: :attr:`BigtableStore.atomic_row_cas` is True.
* **Optional capabilities** (:mod:`percolator._store`): :meth:`BigtableStore.set_unless`
  is the same ``CheckAndMutateRow`` with the interleave of the guards' filter chains
  (*exact column -> timestamp range -> latest version -> value range*) as predicate and
  the mutations in the false branch; :meth:`BigtableStore.increment` is one
  ``ReadModifyWriteRow`` with an ``increment_amount`` rule.
* **Writes.** :meth:`BigtableStore.mutate_rows` is one ``MutateRows`` request (split
  only beyond 100,000 mutations); mutations of the same row are merged into one entry
  in order. A delete ``(column, max_ts)`` is ``DeleteFromColumn`` over
  ``[0, (max_ts+1)*1000)``.
* **Scans** page through the range with ``ReadRows`` requests of ``batch_size`` rows
  each, with the same filter as reads; Bigtable omits rows with no selected cell.
* **Tables** are created through the table admin API, one ``GcRule`` of
  ``max_num_versions`` per family (0: no GC rule, keep everything). With
  ``?table_prefix=P`` the table ``t`` is the Bigtable table ``P_t`` and
  :meth:`~BigtableStore.list_tables` only lists (and strips) that prefix.

The data calls (``ReadRows``, ``MutateRows``, ``CheckAndMutateRow``,
``ReadModifyWriteRow``, ``SampleRowKeys``) go straight to gRPC with raw protobuf
messages and the routing headers the GAPIC client would send; only the admin calls go
through the GAPIC client, whose layers cost about a third of a data call's client CPU
(a Bigtable client is CPU-bound: BENCHMARKS.md, issue 37).

No call is retried here: a failed RPC raises :class:`~percolator.StoreUnavailable`
(or :class:`~percolator.UnknownTableError` / :class:`~percolator.InvalidArgument`), and
the retry policy of the transaction layer decides. Every RPC has a deadline
(``timeout`` option, seconds).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

from percolator import metrics as _metrics
from percolator._errors import (
    InvalidArgument,
    StoreUnavailable,
    UnknownTableError,
)
from percolator._store import (
    CAS_DELETES,
    CHECK_AND_SET_MANY,
    DELETE_IF,
    INCREMENT,
    NOTIFY_INDEX,
    SET_UNLESS,
    SPLIT_KEYS,
    Capability,
    CasItem,
    Guard,
    Mutation,
    Read,
    RowCells,
    check_increment_amount,
)
from percolator.stores import REQUESTS
from percolator.stores._bigtable_requests import (
    RowMerger,
    block_all,
    chain,
    check_family,
    check_row,
    check_value,
    delete_column,
    delete_mutations,
    family_and_qualifier,
    guard_filter,
    interleave,
    latest_value_is,
    reads_filter,
    replace_mutations,
    row_mutations,
)
from percolator.stores._cas_rows import check_and_set_by_row
from percolator.stores._url import check_scan, parse_store_url

__all__ = ["BigtableStore", "open_bigtable_store"]

log = logging.getLogger(__name__)

_EXTRA_HINT = "pip install 'percolator-txn[bigtable]'"

try:  # optional dependency: only this module imports it
    import grpc
    from google.api_core import exceptions as gexc
    from google.api_core import grpc_helpers
    from google.api_core.gapic_v1 import routing_header
    from google.auth.exceptions import GoogleAuthError
    from google.cloud.bigtable_admin_v2 import BaseBigtableTableAdminClient
    from google.cloud.bigtable_admin_v2.services.bigtable_table_admin.transports import (
        BigtableTableAdminGrpcTransport,
    )
    from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as admin_pb
    from google.cloud.bigtable_admin_v2.types import table as admin_table
    from google.cloud.bigtable_v2.services.bigtable.transports.base import DEFAULT_CLIENT_INFO
    from google.cloud.bigtable_v2.types import bigtable as bt_types
    from google.cloud.bigtable_v2.types import data as data_types
except ImportError as _import_error:  # pragma: no cover - exercised without the extra
    _IMPORT_ERROR: ImportError | None = _import_error
else:
    _IMPORT_ERROR = None
    # the raw protobuf classes of the data requests
    _ReadRowsRequest = bt_types.ReadRowsRequest.pb()
    _MutateRowsRequest = bt_types.MutateRowsRequest.pb()
    _CheckAndMutateRowRequest = bt_types.CheckAndMutateRowRequest.pb()
    _ReadModifyWriteRowRequest = bt_types.ReadModifyWriteRowRequest.pb()

EMULATOR_ENV = "BIGTABLE_EMULATOR_HOST"
DEFAULT_TIMEOUT = 30.0
"""Default deadline of one RPC, in seconds."""

MAX_MUTATIONS_PER_REQUEST = 100_000
"""Bigtable's limit on the mutations of one ``MutateRows`` request."""


_TABLE_ID = re.compile(r"[_a-zA-Z0-9][-_.a-zA-Z0-9]*")
_INSTANCE = re.compile(r"[a-z][-a-z0-9]*")
_PROJECT = re.compile(r"[a-z0-9][-a-z0-9.:]*")
_MAX_TABLE_ID = 50

_DATA_SCOPES = ("https://www.googleapis.com/auth/bigtable.data",)
_ADMIN_SCOPES = ("https://www.googleapis.com/auth/bigtable.admin.table",)
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]
_DATA_SERVICE = "/google.bigtable.v2.Bigtable/"


def _require_dependency() -> None:
    if _IMPORT_ERROR is not None:
        raise InvalidArgument(
            f"the bigtable store needs google-cloud-bigtable: {_EXTRA_HINT} ({_IMPORT_ERROR})"
        )


# ---------------------------------------------------------------------------
# Arguments


class BigtableStore:
    """The store contract over Cloud Bigtable (or its emulator).

    Build it with :func:`open_bigtable_store`. *project* and *instance* name the
    Bigtable instance; *emulator* is ``host:port`` of an emulator or None for the
    cloud; *table_prefix* namespaces the tables; *timeout* is the deadline of one
    RPC in seconds; *app_profile_id* selects a Bigtable app profile; *credentials*
    are google-auth credentials (cloud only; default: application default
    credentials); *interceptors* are gRPC client interceptors wrapped around the
    channels (tracing, counting RPCs in tests). The store is thread-safe.
    """

    atomic_row_cas = True
    capabilities: frozenset[Capability[Any]] = frozenset({
        CHECK_AND_SET_MANY, DELETE_IF, INCREMENT, SET_UNLESS, SPLIT_KEYS,
        # A family-filtered scan reads every row on the server (Bigtable has no locality
        # groups to ask for): notifications are found through percolator/_notify_index.py.
        NOTIFY_INDEX,
        # check_and_set also deletes versions of other cells of the row (deletes=) in
        # its atomic step: a commit point deletes the notification its observer run
        # served (percolator/_commit.py).
        CAS_DELETES,
    })

    def __init__(
        self,
        *,
        url: str,
        project: str,
        instance: str,
        emulator: str | None = None,
        table_prefix: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        app_profile_id: str = "",
        credentials: Any = None,
        interceptors: Sequence[Any] = (),
    ) -> None:
        _require_dependency()
        self.url = url
        self.project = project
        self.instance = instance
        self.emulator = emulator
        self.table_prefix = table_prefix
        self.timeout = timeout
        self.app_profile_id = app_profile_id
        self._closed = False
        self._lock = threading.Lock()
        self._instance_path = f"projects/{project}/instances/{instance}"
        if emulator is not None:
            channel = grpc.insecure_channel(emulator, options=_CHANNEL_OPTIONS)
            # No credentials at all on the insecure channel: what the client library
            # does with AnonymousCredentials when BIGTABLE_EMULATOR_HOST is set.
            self._channels: list[Any] = [channel]
            data_channel = admin_channel = grpc.intercept_channel(channel, *interceptors)
        else:
            try:
                data_raw, admin_raw = self._cloud_channels(credentials)
            except GoogleAuthError as e:
                raise StoreUnavailable(
                    f"Bigtable store {url} ({self._where()}): no credentials for Cloud Bigtable "
                    f"({e}); set up Application Default Credentials (gcloud auth "
                    "application-default login, or GOOGLE_APPLICATION_CREDENTIALS), pass "
                    f"credentials=..., or point at an emulator with {EMULATOR_ENV} or "
                    "?emulator=host:port"
                ) from e
            self._channels = [data_raw, admin_raw]
            data_channel = grpc.intercept_channel(data_raw, *interceptors)
            admin_channel = grpc.intercept_channel(admin_raw, *interceptors)
        # The data calls go straight to gRPC multicallables with raw protobuf messages:
        # the GAPIC client's layers (proto-plus wrapping, retry and metadata plumbing) cost
        # 100-200 us of client CPU per call, and that CPU is what bounds a Bigtable client
        # (BENCHMARKS.md, issue 37). They are made once, on the intercepted channel.
        self._read_rows_rpc = _stream(data_channel, "ReadRows", bt_types.ReadRowsRequest,
                                      bt_types.ReadRowsResponse)
        self._mutate_rows_rpc = _stream(data_channel, "MutateRows", bt_types.MutateRowsRequest,
                                        bt_types.MutateRowsResponse)
        self._sample_row_keys_rpc = _stream(data_channel, "SampleRowKeys",
                                            bt_types.SampleRowKeysRequest,
                                            bt_types.SampleRowKeysResponse)
        self._check_and_mutate_rpc = _unary(data_channel, "CheckAndMutateRow",
                                            bt_types.CheckAndMutateRowRequest,
                                            bt_types.CheckAndMutateRowResponse)
        self._read_modify_write_rpc = _unary(data_channel, "ReadModifyWriteRow",
                                             bt_types.ReadModifyWriteRowRequest,
                                             bt_types.ReadModifyWriteRowResponse)
        # table -> (table path, metadata of its data calls), filled on first use
        self._targets: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
        # The transport gets a ready channel, so it never looks for credentials itself.
        self._admin = BaseBigtableTableAdminClient(
            transport=BigtableTableAdminGrpcTransport(channel=admin_channel)
        )
        log.debug("opened Bigtable store %s (%s)", url, self._where())

    @staticmethod
    def _cloud_channels(credentials: Any) -> tuple[Any, Any]:
        """Authenticated TLS channels to the Cloud Bigtable data and admin endpoints."""
        data_raw = grpc_helpers.create_channel(
            "bigtable.googleapis.com:443",
            credentials=credentials,
            scopes=_DATA_SCOPES,
            options=_CHANNEL_OPTIONS,
        )
        admin_raw = grpc_helpers.create_channel(
            "bigtableadmin.googleapis.com:443",
            credentials=credentials,
            scopes=_ADMIN_SCOPES,
            options=_CHANNEL_OPTIONS,
        )
        return data_raw, admin_raw

    # -- naming and errors ------------------------------------------------

    def _where(self) -> str:
        target = f"emulator {self.emulator}" if self.emulator else "Cloud Bigtable"
        return f"project {self.project!r}, instance {self.instance!r}, {target}"

    def _table_id(self, table: str) -> str:
        if not isinstance(table, str):
            raise InvalidArgument(f"table name must be a str, got {table!r}")
        table_id = f"{self.table_prefix}_{table}" if self.table_prefix else table
        if not _TABLE_ID.fullmatch(table_id) or len(table_id) > _MAX_TABLE_ID:
            raise InvalidArgument(
                f"table name {table!r} (Bigtable table id {table_id!r}) must match "
                f"[_a-zA-Z0-9][-_.a-zA-Z0-9]* and have at most {_MAX_TABLE_ID} characters"
            )
        return table_id

    def _table_path(self, table: str) -> str:
        return f"{self._instance_path}/tables/{self._table_id(table)}"

    def _target(self, table: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        """The path of *table* and the metadata of a data call on it: the routing header
        the GAPIC client sends (``x-goog-request-params``, which Cloud Bigtable routes by)
        and its client-info header, built once per table."""
        target = self._targets.get(table) if type(table) is str else None
        if target is None:
            path = self._table_path(table)
            target = (path, (
                routing_header.to_grpc_metadata(  # type: ignore[no-untyped-call]
                    {"table_name": path, "app_profile_id": self.app_profile_id}
                ),
                DEFAULT_CLIENT_INFO.to_grpc_metadata(),
            ))
            self._targets[table] = target
        return target

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable(f"Bigtable store {self.url} is closed")

    def _fail(self, error: Exception, action: str, table: str | None = None) -> NoReturn:
        """Map a google.api_core / gRPC error of *action* on *table* to ours."""
        error = _api_error(error)
        message = getattr(error, "message", None) or str(error)
        family_error = _is_family_error(message)
        if isinstance(error, gexc.NotFound) and table is not None and not family_error:
            raise UnknownTableError(table) from error
        if family_error or isinstance(
            error, gexc.InvalidArgument | gexc.FailedPrecondition | gexc.OutOfRange
        ):
            raise InvalidArgument(
                f"Bigtable store {self.url} rejected {action}: {message}"
            ) from error
        hint = (
            f"is the emulator running at {self.emulator}?"
            if self.emulator
            else "check the network, the instance and the credentials"
        )
        if isinstance(error, gexc.DeadlineExceeded):
            what = f"no answer within {self.timeout:g}s"
        elif isinstance(error, gexc.ServiceUnavailable):
            what = "unreachable"
        else:
            what = type(error).__name__
        log.warning("Bigtable %s failed on %s: %s: %s", action, self.url, what, message)
        raise StoreUnavailable(
            f"Bigtable store {self.url} ({self._where()}): {action} failed, {what}: "
            f"{message}; {hint}"
        ) from error

    # -- admin ------------------------------------------------------------

    def create_table(self, table: str, families: Mapping[str, int]) -> None:
        """Create *table* with the column *families* (name -> versions kept, 0 = all).

        Idempotent: if the table exists, families it lacks are added; existing
        families are left as they are.

        :raises InvalidArgument: bad table or family names.
        :raises StoreUnavailable: Bigtable could not be reached.
        """
        if _metrics._enabled:
            next(REQUESTS.create_table)
        self._check_open()
        table_id = self._table_id(table)
        specs: dict[str, Any] = {}
        for name, versions in families.items():
            check_family(name)
            if isinstance(versions, bool) or not isinstance(versions, int) or versions < 0:
                raise InvalidArgument(
                    f"max versions of family {name!r} must be an integer >= 0, got {versions!r}"
                )
            rule = admin_table.GcRule(max_num_versions=versions) if versions else None
            specs[name] = admin_table.ColumnFamily(gc_rule=rule)
        try:
            self._admin.create_table(
                parent=self._instance_path,
                table_id=table_id,
                table=admin_table.Table(column_families=specs),
                retry=None,
                timeout=self.timeout,
            )
            log.info("created Bigtable table %s in %s", table_id, self.url)
            return
        except gexc.AlreadyExists:
            pass
        except gexc.GoogleAPICallError as e:
            self._fail(e, f"CreateTable {table_id!r}")
        try:
            existing = self._admin.get_table(
                request=admin_pb.GetTableRequest(
                    name=self._table_path(table), view=admin_table.Table.View.SCHEMA_VIEW
                ),
                retry=None,
                timeout=self.timeout,
            )
            missing = [name for name in specs if name not in existing.column_families]
            if missing:
                mods = [
                    admin_pb.ModifyColumnFamiliesRequest.Modification(id=name, create=specs[name])
                    for name in missing
                ]
                self._admin.modify_column_families(
                    name=self._table_path(table),
                    modifications=mods,
                    retry=None,
                    timeout=self.timeout,
                )
                log.info("added families %s to Bigtable table %s", missing, table_id)
        except gexc.GoogleAPICallError as e:
            self._fail(e, f"CreateTable {table_id!r} (adding families)", table)

    def drop_table(self, table: str) -> None:
        """Delete *table* and all its cells; a missing table is not an error.

        :raises StoreUnavailable: Bigtable could not be reached.
        """
        if _metrics._enabled:
            next(REQUESTS.drop_table)
        self._check_open()
        try:
            self._admin.delete_table(name=self._table_path(table), retry=None, timeout=self.timeout)
            log.info("dropped Bigtable table %s in %s", table, self.url)
        except gexc.NotFound:
            pass
        except gexc.GoogleAPICallError as e:
            self._fail(e, f"DeleteTable {table!r}")

    def list_tables(self) -> list[str]:
        """Names of the existing tables (without the table prefix), sorted.

        :raises StoreUnavailable: Bigtable could not be reached.
        """
        if _metrics._enabled:
            next(REQUESTS.list_tables)
        self._check_open()
        prefix = f"{self.table_prefix}_" if self.table_prefix else ""
        names = []
        try:
            pager = self._admin.list_tables(
                request=admin_pb.ListTablesRequest(
                    parent=self._instance_path, view=admin_table.Table.View.NAME_ONLY
                ),
                retry=None,
                timeout=self.timeout,
            )
            for t in pager:
                table_id = t.name.rsplit("/", 1)[-1]
                if table_id.startswith(prefix):
                    names.append(table_id[len(prefix) :])
        except gexc.GoogleAPICallError as e:
            self._fail(e, "ListTables")
        return sorted(names)

    # -- data -------------------------------------------------------------

    def _read(
        self, table: str, request: Any, metadata: Any, action: str
    ) -> Iterator[tuple[bytes, RowCells]]:
        merger = RowMerger()
        try:
            for response in self._read_rows_rpc(
                request, timeout=self.timeout, metadata=metadata
            ):
                yield from merger.feed(response)
        except grpc.RpcError as e:  # also raised mid-stream
            self._fail(e, action, table)

    def read_rows(
        self, table: str, rows: Sequence[bytes], reads: Sequence[Read]
    ) -> dict[bytes, RowCells]:
        """Read *reads* of every row in *rows* with one ``ReadRows`` request.

        Returns row -> column -> versions (newest first); rows and columns with no
        selected cell are left out. An empty *rows* makes no request.

        :raises UnknownTableError: *table* does not exist.
        :raises StoreUnavailable: Bigtable could not be reached.
        """
        if _metrics._enabled:
            next(REQUESTS.read_rows)
        self._check_open()
        if isinstance(rows, bytes):
            raise InvalidArgument(f"rows must be a sequence of row keys, got {rows!r}")
        keys = sorted({check_row(r) for r in rows})
        row_filter = reads_filter(reads)
        if not keys:
            return {}
        path, metadata = self._target(table)
        request = _ReadRowsRequest(
            table_name=path, app_profile_id=self.app_profile_id, filter=row_filter
        )
        request.rows.row_keys.extend(keys)
        return dict(self._read(table, request, metadata, f"ReadRows on {table!r}"))

    def scan(
        self,
        table: str,
        start: bytes | None,
        stop: bytes | None,
        reads: Sequence[Read],
        *,
        batch_size: int = 1000,
    ) -> Iterator[tuple[bytes, RowCells]]:
        """Rows in ``[start, stop)`` (None: unbounded) with their cells selected by *reads*.

        Pages through the range, one ``ReadRows`` request of at most *batch_size* rows
        per page, so memory stays bounded and no stream outlives its deadline. Rows
        with no selected cell are not yielded (Bigtable skips them server-side).

        :raises UnknownTableError: *table* does not exist.
        :raises StoreUnavailable: Bigtable could not be reached.
        """
        if _metrics._enabled:
            next(REQUESTS.scan)
        self._check_open()
        check_scan(start, stop, batch_size)
        row_filter = reads_filter(reads)
        self._target(table)  # a bad table name fails here, not on the first next()
        return self._scan(table, start or None, stop or None, row_filter, batch_size)

    def _scan(
        self,
        table: str,
        start: bytes | None,
        stop: bytes | None,
        row_filter: Any,
        batch_size: int,
    ) -> Iterator[tuple[bytes, RowCells]]:
        table_path, metadata = self._target(table)
        resume: bytes | None = start
        first = True
        while True:
            if resume is not None and stop is not None and resume >= stop:
                return
            request = _ReadRowsRequest(
                table_name=table_path,
                app_profile_id=self.app_profile_id,
                filter=row_filter,
                rows_limit=batch_size,
            )
            rng = request.rows.row_ranges.add()
            if resume is not None:
                if first:
                    rng.start_key_closed = resume
                else:
                    rng.start_key_open = resume
            if stop is not None:
                rng.end_key_open = stop
            first = False
            page = list(self._read(table, request, metadata, f"ReadRows (scan) on {table!r}"))
            self._check_open()
            yield from page
            if len(page) < batch_size:
                return
            resume = page[-1][0]

    def split_keys(self, table: str) -> list[bytes]:
        """Row keys that cut *table* into pieces of about equal size (``SampleRowKeys``,
        Bigtable's own tablet boundaries and samples), sorted, without the empty key that
        ends the answer (optional capability, see :class:`percolator._store.SplitKeys`)."""
        self._check_open()
        path, metadata = self._target(table)
        request = bt_types.SampleRowKeysRequest.pb()(
            table_name=path, app_profile_id=self.app_profile_id
        )
        try:
            answers = list(
                self._sample_row_keys_rpc(request, timeout=self.timeout, metadata=metadata)
            )
        except grpc.RpcError as e:
            self._fail(e, "SampleRowKeys", table)
        return sorted({bytes(a.row_key) for a in answers if a.row_key})

    def mutate_rows(self, table: str, mutations: Sequence[Mutation]) -> None:
        """Apply *mutations* with one ``MutateRows`` request, each atomic within its row.

        Mutations of the same row are merged, in order, into one entry (so they stay
        atomic and ordered). Only beyond 100,000 cell mutations is the batch split.

        :raises UnknownTableError: *table* does not exist.
        :raises InvalidArgument: an unknown family or bad argument.
        :raises StoreUnavailable: Bigtable could not be reached or failed some rows
            (the message lists them; rows not listed were applied).
        """
        if _metrics._enabled:
            next(REQUESTS.mutate_rows)
        self._check_open()
        target = self._target(table)
        entries: dict[bytes, list[Any]] = {}
        for m in mutations:
            if not isinstance(m, Mutation):
                raise InvalidArgument(f"mutations must be percolator Mutation objects, got {m!r}")
            muts = row_mutations(m)
            if muts:
                entries.setdefault(check_row(m.row), []).extend(muts)
        batch: list[tuple[bytes, list[Any]]] = []
        count = 0
        for row, muts in entries.items():
            if batch and count + len(muts) > MAX_MUTATIONS_PER_REQUEST:
                self._mutate_batch(table, target, batch)
                batch, count = [], 0
            batch.append((row, muts))
            count += len(muts)
        if batch:
            self._mutate_batch(table, target, batch)

    def _mutate_batch(
        self,
        table: str,
        target: tuple[str, tuple[tuple[str, str], ...]],
        batch: list[tuple[bytes, list[Any]]],
    ) -> None:
        table_path, metadata = target
        request = _MutateRowsRequest(table_name=table_path, app_profile_id=self.app_profile_id)
        for row, muts in batch:
            entry = request.entries.add()
            entry.row_key = row
            entry.mutations.extend(muts)
        failed: list[tuple[bytes, int, str]] = []
        seen = 0
        try:
            for response in self._mutate_rows_rpc(
                request, timeout=self.timeout, metadata=metadata
            ):
                for status in response.entries:
                    seen += 1
                    if status.status.code != 0:
                        failed.append(
                            (batch[status.index][0], status.status.code, status.status.message)
                        )
        except grpc.RpcError as e:  # also raised mid-stream
            self._fail(e, f"MutateRows on {table!r} ({len(batch)} rows)", table)
        if not failed and seen >= len(batch):
            return
        if not failed:
            raise StoreUnavailable(
                f"Bigtable store {self.url} ({self._where()}): MutateRows on {table!r} "
                f"reported {seen} of {len(batch)} rows; the others may not be applied"
            )
        codes = {code for _, code, _ in failed}
        if any(_is_family_error(message) for _, _, message in failed):
            codes = {3}
        detail = "; ".join(
            f"row {row!r}: {_code_name(code)} {message}" for row, code, message in failed[:5]
        )
        more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
        if codes <= {3, 9}:  # INVALID_ARGUMENT, FAILED_PRECONDITION: our mistake
            raise InvalidArgument(
                f"Bigtable store {self.url} rejected mutations of {len(failed)} rows of "
                f"{table!r}: {detail}{more}"
            )
        if codes == {5}:  # NOT_FOUND: the table went away
            raise UnknownTableError(table)
        raise StoreUnavailable(
            f"Bigtable store {self.url} ({self._where()}): MutateRows on {table!r} failed "
            f"for {len(failed)} of {len(batch)} rows: {detail}{more}; the other rows were "
            "applied, retry the failed ones"
        )

    def check_and_set(
        self,
        table: str,
        row: bytes,
        column: str,
        expected: bytes | None,
        new: bytes,
        puts: Sequence[tuple[str, int, bytes]] = (),
        *,
        deletes: Sequence[tuple[str, int]] = (),
    ) -> bool:
        """Compare-and-set of ``(row, column)`` in one ``CheckAndMutateRow`` request.

        If the latest value of the cell equals *expected* (``None``: the cell has no
        value), replace every version of it by *new* at timestamp 0, apply *puts*
        (``(column, ts, value)`` of the same row) and *deletes* (``(column, max_ts)``:
        the versions at or below *max_ts*, as in :class:`~percolator._store.Mutation`)
        in the same atomic step, and return True; otherwise change nothing and return
        False (:attr:`cas_deletes`).

        :raises UnknownTableError: *table* does not exist.
        :raises StoreUnavailable: Bigtable could not be reached; the CAS may or may
            not have been applied.
        """
        if _metrics._enabled:
            next(REQUESTS.check_and_set)
        self._check_open()
        family, qualifier = family_and_qualifier(column)
        if expected is not None:
            check_value(expected, column)
        return self._set_if(
            table, row, column, new, puts, latest_value_is(family, qualifier, expected),
            expected is not None, deletes,
        )

    def delete_if(self, table: str, row: bytes, column: str, expected: bytes) -> bool:
        """Remove every version of ``(row, column)`` if its latest value is *expected*,
        in one ``CheckAndMutateRow`` request (:class:`percolator._store.ConditionalDelete`).

        :raises UnknownTableError: *table* does not exist.
        :raises StoreUnavailable: Bigtable could not be reached; the delete may or may
            not have been applied.
        """
        self._check_open()
        check_row(row)
        family, qualifier = family_and_qualifier(column)
        check_value(expected, column)
        return self._check_and_mutate(
            table, row, latest_value_is(family, qualifier, expected),
            [delete_column(family, qualifier, None)], True, f"{column!r}",
        )

    def set_unless(
        self,
        table: str,
        row: bytes,
        column: str,
        new: bytes,
        guards: Sequence[Guard],
        puts: Sequence[tuple[str, int, bytes]] = (),
    ) -> bool:
        """Unless a cell of *row* matches one of *guards*, set ``(row, column)`` to *new*
        (every version replaced, at timestamp 0) and apply *puts*, in one
        ``CheckAndMutateRow`` request whose predicate is the interleave of the guards'
        filter chains (column, timestamp range, newest version, value range); return
        whether it did (:class:`percolator._store.GuardedSet`).

        :raises UnknownTableError: *table* does not exist.
        :raises StoreUnavailable: Bigtable could not be reached; the mutation may or
            may not have been applied.
        """
        if _metrics._enabled:
            next(REQUESTS.set_unless)
        self._check_open()
        if isinstance(guards, Guard):
            guards = (guards,)
        predicate = interleave([guard_filter(g) for g in guards]) if guards else block_all()
        return self._set_if(table, row, column, new, puts, predicate, False)

    def _set_if(
        self,
        table: str,
        row: bytes,
        column: str,
        new: bytes,
        puts: Sequence[tuple[str, int, bytes]],
        predicate: Any,
        when_matched: bool,
        deletes: Sequence[tuple[str, int]] = (),
    ) -> bool:
        """Set *column* to *new* and apply *puts* and *deletes* if *predicate* outputs
        cells of *row* (*when_matched*) or outputs none (not *when_matched*): one
        ``CheckAndMutateRow``."""
        check_row(row)
        family, qualifier = family_and_qualifier(column)
        check_value(new, column)
        return self._check_and_mutate(
            table, row, predicate,
            replace_mutations(family, qualifier, new, puts) + delete_mutations(deletes),
            when_matched, f"{column!r}",
        )

    def _check_and_mutate(
        self,
        table: str,
        row: bytes,
        predicate: Any,
        mutations: list[Any],
        when_matched: bool,
        what: str,
    ) -> bool:
        """Apply *mutations* to *row* if *predicate* outputs cells of it (*when_matched*)
        or outputs none (not *when_matched*), in one ``CheckAndMutateRow``; returns
        whether they were applied. *what* names the cells for an error message."""
        path, metadata = self._target(table)
        branch = "true_mutations" if when_matched else "false_mutations"
        request = _CheckAndMutateRowRequest(
            table_name=path,
            app_profile_id=self.app_profile_id,
            row_key=row,
            predicate_filter=predicate,
            **{branch: mutations},
        )
        try:
            response = self._check_and_mutate_rpc(
                request, timeout=self.timeout, metadata=metadata
            )
        except grpc.RpcError as e:
            self._fail(e, f"CheckAndMutateRow on {table!r} row {row!r} {what}", table)
        return bool(response.predicate_matched) == when_matched

    def increment(self, table: str, row: bytes, column: str, amount: int) -> int:
        """Add *amount* to the 64-bit big-endian counter ``(row, column)`` (absent: 0) and
        return the new value, with one ``ReadModifyWriteRow`` request
        (:class:`percolator._store.Incrementing`). Bigtable writes the sum at its own
        clock's timestamp.

        :raises InvalidArgument: the cell does not hold 8 bytes, or *amount* is not a
            64-bit integer.
        :raises UnknownTableError: *table* does not exist.
        :raises StoreUnavailable: Bigtable could not be reached; the increment may or
            may not have been applied.
        """
        if _metrics._enabled:
            next(REQUESTS.increment)
        self._check_open()
        check_row(row)
        family, qualifier = family_and_qualifier(column)
        check_increment_amount(amount)
        path, metadata = self._target(table)
        request = _ReadModifyWriteRowRequest(
            table_name=path, app_profile_id=self.app_profile_id, row_key=row
        )
        rule = request.rules.add()
        rule.family_name = family
        rule.column_qualifier = qualifier
        rule.increment_amount = amount
        try:
            response = self._read_modify_write_rpc(
                request, timeout=self.timeout, metadata=metadata
            )
        except grpc.RpcError as rpc_error:
            e = _api_error(rpc_error)
            if "64-bit" in (getattr(e, "message", None) or str(e)):  # the emulator's Unknown
                raise InvalidArgument(
                    f"Bigtable store {self.url}: {column!r} of row {row!r} in {table!r} is "
                    f"not a 64-bit counter: {e}"
                ) from e
            self._fail(e, f"ReadModifyWriteRow on {table!r} row {row!r} {column!r}", table)
        for fam in response.row.families:
            for col in fam.columns:
                if fam.name == family and col.qualifier == qualifier and col.cells:
                    return int.from_bytes(col.cells[0].value, "big", signed=True)
        raise StoreUnavailable(
            f"Bigtable store {self.url}: ReadModifyWriteRow on {table!r} row {row!r} "
            f"{column!r} returned no cell"
        )

    def close(self) -> None:
        """Close the gRPC channels. The store is unusable afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for channel in self._channels:
            channel.close()
        log.debug("closed Bigtable store %s", self.url)

    def __enter__(self) -> BigtableStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BigtableStore({self.url!r})"

    def check_and_set_many(self, table: str, items: Sequence[CasItem]) -> list[bool]:
        """Many :meth:`check_and_set` calls (:class:`percolator._store.BatchedCas`): the
        items of one row go in one ``CheckAndMutateRow`` (:meth:`_check_and_set_row`),
        eight rows at a time; a row whose request fails (some cell differed) or that
        names a cell twice is decided item by item. The result is that of the items
        one after another, in order (``percolator/stores/_cas_rows.py``).

        :raises UnknownTableError: *table* does not exist.
        :raises StoreUnavailable: Bigtable could not be reached; some items may have
            been applied.
        """
        if _metrics._enabled:
            next(REQUESTS.check_and_set_many)
        self._check_open()
        return check_and_set_by_row(
            items,
            lambda group: self._check_and_set_row(table, group),
            lambda item: self.check_and_set(table, *item),
        )

    def _check_and_set_row(self, table: str, items: Sequence[CasItem]) -> bool:
        """Compare-and-set several cells of one row in one ``CheckAndMutateRow``: if
        every cell holds its expected value (all expected None: every cell absent), set
        each as :meth:`check_and_set` does and apply every item's puts, atomically, and
        return True; otherwise change nothing and return False.

        The predicate of values is the interleave of one chain per cell (*exact column
        -> latest version -> value in [expected, expected]*), each yielding at most one
        cell, then ``CellsPerRowOffset(n - 1)``: it outputs a cell only if all *n*
        matched. For absent cells it is the interleave of the columns, and the
        mutations go in the false branch, as in :meth:`check_and_set`.
        """
        row = items[0][0]
        absent = items[0][2] is None
        branches: list[Any] = []
        mutations: list[Any] = []
        for _, column, expected, new, puts in items:
            family, qualifier = family_and_qualifier(column)
            check_value(new, column)
            if expected is not None:
                check_value(expected, column)
            branches.append(latest_value_is(family, qualifier, expected))
            mutations += replace_mutations(family, qualifier, new, puts)
        predicate = interleave(branches)
        if not absent and len(items) > 1:
            offset = data_types.RowFilter.pb()()
            offset.cells_per_row_offset_filter = len(items) - 1
            predicate = chain([predicate, offset])
        return self._check_and_mutate(
            table, check_row(row), predicate, mutations, not absent, f"({len(items)} cells)"
        )


def _api_error(error: Exception) -> Exception:
    """A raw data call's gRPC error as the google.api_core exception the GAPIC client
    raises (what :meth:`BigtableStore._fail` maps); any other error as it is."""
    if not isinstance(error, grpc.RpcError):
        return error
    converted: Exception = gexc.from_grpc_error(error)  # type: ignore[no-untyped-call]
    converted.__cause__ = error
    return converted


def _unary(channel: Any, method: str, request: Any, response: Any) -> Any:
    """A unary-unary multicallable of the Bigtable data service on *channel*, taking
    and returning the raw protobuf messages of the proto-plus types *request* and
    *response*."""
    return channel.unary_unary(
        _DATA_SERVICE + method,
        request_serializer=request.pb().SerializeToString,
        response_deserializer=response.pb().FromString,
    )


def _stream(channel: Any, method: str, request: Any, response: Any) -> Any:
    """A unary-stream multicallable, as :func:`_unary`."""
    return channel.unary_stream(
        _DATA_SERVICE + method,
        request_serializer=request.pb().SerializeToString,
        response_deserializer=response.pb().FromString,
    )


def _is_family_error(message: str) -> bool:
    """Whether Bigtable's *message* is about an unknown column family (a caller's
    mistake: NOT_FOUND in Cloud Bigtable, INTERNAL in the emulator)."""
    return "family" in message.lower()


def _code_name(code: int) -> str:
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return str(status.name)
    return str(code)


# ---------------------------------------------------------------------------
# Opening


_OPTIONS = {"emulator", "table_prefix", "timeout", "app_profile_id", "credentials", "interceptors"}


def open_bigtable_store(url: str, **options: Any) -> BigtableStore:
    """Open the Bigtable store at *url*: ``bigtable://project/instance``.

    The URL query may hold ``emulator=host:port`` (otherwise ``BIGTABLE_EMULATOR_HOST``
    is honoured; without either, Cloud Bigtable with application default credentials),
    ``table_prefix=P`` (tables are named ``P_table``), ``timeout=seconds`` (deadline of
    one RPC, default 30) and ``app_profile_id=ID``. *options* may give the same
    keys, plus ``credentials`` (google-auth credentials) and ``interceptors`` (gRPC client
    interceptors); *options* win over the URL's query. Nothing is sent until the
    first call.

    :raises InvalidArgument: a malformed URL or unknown option, or the extra is missing
        (``pip install 'percolator-txn[bigtable]'``).
    """
    _require_dependency()
    parsed = parse_store_url(
        url, "bigtable", options, known=_OPTIONS, keyword_only=("credentials", "interceptors")
    )
    parts = parsed.parts
    project = parts.netloc
    instance = parts.path.strip("/")
    if (
        not project
        or not _PROJECT.fullmatch(project)
        or not instance
        or not _INSTANCE.fullmatch(instance)
    ):
        raise InvalidArgument(
            f"bigtable url {url!r} must be bigtable://project/instance with a lower-case project "
            "id and an instance id matching [a-z][-a-z0-9]*"
        )
    settings = parsed.options
    emulator = settings.get("emulator") or os.environ.get(EMULATOR_ENV) or None
    if emulator is not None and (not isinstance(emulator, str) or ":" not in emulator):
        raise InvalidArgument(f"emulator must be 'host:port', got {emulator!r} (url {url!r})")
    prefix = settings.get("table_prefix", "") or ""
    if not isinstance(prefix, str) or (prefix and not _TABLE_ID.fullmatch(prefix)):
        raise InvalidArgument(
            f"table_prefix must match [_a-zA-Z0-9][-_.a-zA-Z0-9]*, got {prefix!r} (url {url!r})"
        )
    timeout = parsed.seconds("timeout", DEFAULT_TIMEOUT)
    app_profile_id = settings.get("app_profile_id", "") or ""
    interceptors = settings.get("interceptors", ())
    # The options in effect (the keywords over the query), so that the url reopens
    # this store.
    clean_query = "&".join(
        f"{k}={v}" for k, v in settings.items() if k not in ("credentials", "interceptors")
    )
    shown = f"bigtable://{project}/{instance}" + (f"?{clean_query}" if clean_query else "")
    return BigtableStore(
        url=shown,
        project=project,
        instance=instance,
        emulator=emulator,
        table_prefix=prefix,
        timeout=timeout,
        app_profile_id=str(app_profile_id),
        credentials=settings.get("credentials"),
        interceptors=tuple(interceptors),
    )
