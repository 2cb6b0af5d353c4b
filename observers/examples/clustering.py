"""Clustering documents by three keys, incrementally and in batch (Percolator §3.1).

A document belongs to the cluster of every document that shares one of its three
clustering keys (connected components of the document-key graph); a cluster's id is
its smallest document id. Two implementations produce the same partition:

* **Incremental**: :class:`ThreeKeyClusterer` observes ``documents/doc:keys``. For a
  new document it reads the key index (``keys/<key>:idx:docs``, the documents
  having that key), adds itself, looks up its neighbours' clusters and merges them
  (relabelling the members of the clusters that lose). Every transaction writes the
  index cell of each key it reads and the member cell (``clusters/<id>:c:docs``) of
  each cluster it reads or joins, so two transactions whose results depend on each
  other always write a common cell and snapshot isolation makes one of them retry:
  merges stay correct under concurrency.
* **Batch**: :func:`batch_cluster`, a PySpark job of DataFrame joins (min-label
  propagation with pointer jumping) over the whole repository, read from the store
  by :func:`read_repository` (``spark_loader.read_table``: one snapshot, row ranges),
  plus newly arrived documents.

:func:`seed_repository` loads a synthetic repository with the Spark loader,
already clustered by the batch job (documents, key index, clusters), so the
incremental side starts from where a batch pipeline left off.

Documents are immutable here: a document whose keys change after it was clustered
is not re-clustered (removing an edge may split a cluster, which needs more than
a lookup).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import percolator
from observers._observer import Observer
from percolator import TransactionBase

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "CLUSTERS",
    "CLUSTER_COLUMN",
    "DOCUMENTS",
    "INDEX_COLUMN",
    "KEYS",
    "KEYS_COLUMN",
    "KEY_SPACE_FACTOR",
    "MEMBERS_COLUMN",
    "OBSERVERS",
    "ThreeKeyClusterer",
    "batch_cluster",
    "create_tables",
    "doc_id",
    "doc_splits",
    "new_documents",
    "partition",
    "read_clusters",
    "read_repository",
    "seed_repository",
    "synthetic_documents",
    "union_find",
]

DOCUMENTS, KEYS_COLUMN, CLUSTER_COLUMN = "documents", "doc:keys", "cluster:id"
KEYS, INDEX_COLUMN = "keys", "idx:docs"
CLUSTERS, MEMBERS_COLUMN = "clusters", "c:docs"

KEY_SPACE_FACTOR = 8
"""Keys are drawn uniformly from ``KEY_SPACE_FACTOR * n`` keys for *n* documents.

With three keys per document the key graph has a giant component once the key space
falls below about ``6 n``; at ``8 n`` clusters average about 2 documents (the
largest has tens of documents at 10^5, about a hundred at 10^6) and two thirds of
the documents are in a non-singleton cluster. The paper's 3.3 documents per cluster
is not reachable by connected components of uniform keys without a giant component.
"""


def doc_id(i: int) -> str:
    """The row key of document number *i* (sortable: ``d000000042``)."""
    return f"d{i:09d}"


def key_name(k: int) -> str:
    return f"k{k:010d}"


def doc_splits(n: int, parts: int) -> list[bytes]:
    """Row keys that split documents ``0..n-1`` into *parts* ranges of equal size."""
    return [doc_id(n * i // parts).encode() for i in range(1, parts)]


def _split(value: bytes | None) -> list[str]:
    return value.decode().split(",") if value else []


def _join(items: Iterable[str]) -> bytes:
    return ",".join(sorted(items)).encode()


# --- incremental ------------------------------------------------------------------


class ThreeKeyClusterer(Observer):
    """Clusters a newly written document against the key index (see the module)."""

    table, column = DOCUMENTS, KEYS_COLUMN

    def process(self, txn: TransactionBase, row: bytes, column: str) -> None:
        current = txn.get_row(DOCUMENTS, row, [KEYS_COLUMN, CLUSTER_COLUMN])
        keys = _split(current.get(KEYS_COLUMN))
        if not keys or CLUSTER_COLUMN in current:
            return  # deleted, or already clustered (documents are immutable)
        me = row.decode()
        neighbours: set[str] = set()
        for key in dict.fromkeys(keys):
            members = set(_split(txn.get(KEYS, key.encode(), INDEX_COLUMN)))
            neighbours |= members
            members.add(me)
            txn.set(KEYS, key.encode(), INDEX_COLUMN, _join(members))
        neighbours.discard(me)
        found = {txn.get(DOCUMENTS, n.encode(), CLUSTER_COLUMN) for n in neighbours}
        cluster_ids = {c.decode() for c in found if c is not None}
        target = min(cluster_ids | {me})
        members = {me}
        for cid in cluster_ids:
            old = set(_split(txn.get(CLUSTERS, cid.encode(), MEMBERS_COLUMN)))
            members |= old
            if cid != target:
                txn.delete(CLUSTERS, cid.encode(), MEMBERS_COLUMN)
                for member in old:
                    txn.set(DOCUMENTS, member.encode(), CLUSTER_COLUMN, target.encode())
        txn.set(CLUSTERS, target.encode(), MEMBERS_COLUMN, _join(members))
        txn.set(DOCUMENTS, row, CLUSTER_COLUMN, target.encode())


OBSERVERS = [ThreeKeyClusterer]


def create_tables(cluster: percolator.Cluster) -> None:
    """Create the documents, key index and clusters tables if missing."""
    for table in (DOCUMENTS, KEYS, CLUSTERS):
        cluster.create_table(table)


def read_clusters(cluster: percolator.Cluster) -> dict[str, str]:
    """Document -> cluster id, as the incremental side has it now."""
    snap = percolator.Snapshot(cluster)
    return {row.decode(): cols[CLUSTER_COLUMN].decode()
            for row, cols in snap.scan(DOCUMENTS, columns=[CLUSTER_COLUMN])}


# --- reference and synthetic data ---------------------------------------------------


def union_find(docs: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Document -> smallest document id of its connected component (in memory)."""
    parent: dict[str, str] = {d: d for d in docs}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[str, str] = {}
    for d, keys in docs.items():
        for k in keys:
            other = first.setdefault(k, d)
            a, b = find(d), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {d: find(d) for d in docs}


def partition(labels: Mapping[str, str]) -> set[frozenset[str]]:
    """The clusters of a document -> label map, as a set of document sets."""
    groups: dict[str, set[str]] = {}
    for d, label in labels.items():
        groups.setdefault(label, set()).add(d)
    return {frozenset(g) for g in groups.values()}


def new_documents(start: int, count: int, n: int, rng: random.Random,
                  factor: int = KEY_SPACE_FACTOR) -> list[tuple[str, str]]:
    """*count* documents numbered from *start*, keys drawn like those of a repository
    of *n* documents: ``[(doc id, "key,key,key")]``."""
    space = factor * n
    return [(doc_id(i), ",".join(key_name(rng.randrange(space)) for _ in range(3)))
            for i in range(start, start + count)]


def synthetic_documents(spark: SparkSession, n: int, seed: int = 2010,
                        factor: int = KEY_SPACE_FACTOR) -> DataFrame:
    """Documents ``0..n-1`` as a DataFrame ``(doc, keys)``, generated inside Spark
    (three keys per document, hashed uniformly into ``factor * n`` keys)."""
    from pyspark.sql import functions as F

    space = factor * n
    keys = [F.format_string("k%010d", F.pmod(F.xxhash64(F.lit(seed), F.col("id"), F.lit(j)),
                                             F.lit(space)))
            for j in range(3)]
    return spark.range(n).select(F.format_string("d%09d", F.col("id")).alias("doc"),
                                 F.concat_ws(",", *keys).alias("keys"))


# --- batch --------------------------------------------------------------------------


def read_repository(spark: SparkSession, url: str, splits: Sequence[bytes]) -> DataFrame:
    """The repository's documents ``(doc, keys)``, read with ``spark_loader.read_table``
    at one start timestamp, cut into ``len(splits) + 1`` row ranges."""
    from pyspark.sql import functions as F

    from spark_loader import read_table

    docs = read_table(spark, url, DOCUMENTS, [KEYS_COLUMN], splits=list(splits))
    return docs.select(F.col("row").cast("string").alias("doc"),
                       F.col(f"`{KEYS_COLUMN}`").cast("string").alias("keys"))


def batch_cluster(docs: DataFrame, max_rounds: int = 100) -> tuple[DataFrame, int]:
    """Cluster *docs* ``(doc, keys)``: a DataFrame ``(doc, cluster)`` (materialized,
    cluster = smallest document id of the component) and the number of rounds.

    Each round takes, per key, the smallest label of its documents, gives each
    document the smallest label of its keys, then jumps each label to its own label
    (labels only decrease and always name a document of the same component); it
    stops when a round changes nothing.

    .. warning:: blocks while the Spark jobs run.
    """
    from pyspark.sql import functions as F

    pairs = (docs.select("doc", F.explode(F.array_distinct(F.split("keys", ","))).alias("key"))
             .localCheckpoint())
    labels = docs.select("doc", F.col("doc").alias("label")).localCheckpoint()
    for rounds in range(1, max_rounds + 1):
        key_min = pairs.join(labels, "doc").groupBy("key").agg(F.min("label").alias("kl"))
        step = pairs.join(key_min, "key").groupBy("doc").agg(F.min("kl").alias("label"))
        for _ in range(2):  # pointer jumping: a label takes its own label's label
            step = (step.alias("a").join(step.alias("b"), F.col("a.label") == F.col("b.doc"))
                    .select(F.col("a.doc").alias("doc"),
                            F.least(F.col("a.label"), F.col("b.label")).alias("label")))
        step = (step.join(labels.withColumnRenamed("label", "old"), "doc")
                .withColumn("changed", F.col("label") != F.col("old"))
                .drop("old").localCheckpoint())
        changed = step.where("changed").limit(1).count()
        labels = step.drop("changed")
        if not changed:
            return labels.withColumnRenamed("label", "cluster"), rounds
    raise percolator.PercolatorError(f"batch clustering did not converge in {max_rounds} rounds")


def seed_repository(spark: SparkSession, url: str, docs: DataFrame,
                    clustered: bool = True, load_options: Mapping[str, Any] | None = None
                    ) -> dict[str, float]:
    """Load *docs* ``(doc, keys)`` into ``documents`` with the Spark loader. With
    *clustered*, first cluster them with :func:`batch_cluster` and also load each
    document's cluster id, the key index and the clusters, so that the incremental
    observers continue from there. Returns seconds per step."""
    import time

    from pyspark.sql import functions as F

    from spark_loader import load_dataframe

    options = dict(load_options or {})
    times: dict[str, float] = {}
    with percolator.connect(url) as cluster:
        create_tables(cluster)
    if not clustered:
        t0 = time.perf_counter()
        load_dataframe(docs, url, DOCUMENTS, "doc", {"keys": KEYS_COLUMN}, **options)
        times["load documents"] = time.perf_counter() - t0
        return times
    docs = docs.localCheckpoint()
    t0 = time.perf_counter()
    labels, _ = batch_cluster(docs)
    times["cluster"] = time.perf_counter() - t0
    steps: list[tuple[str, DataFrame, str, dict[str, str]]] = [
        ("documents", docs.join(labels, "doc"), DOCUMENTS,
         {"keys": KEYS_COLUMN, "cluster": CLUSTER_COLUMN}),
        ("key index",
         docs.select("doc", F.explode(F.array_distinct(F.split("keys", ","))).alias("key"))
         .groupBy("key").agg(F.concat_ws(",", F.sort_array(F.collect_list("doc"))).alias("docs")),
         KEYS, {"docs": INDEX_COLUMN}),
        ("clusters",
         labels.groupBy("cluster").agg(
             F.concat_ws(",", F.sort_array(F.collect_list("doc"))).alias("docs")),
         CLUSTERS, {"docs": MEMBERS_COLUMN}),
    ]
    for name, frame, table, columns in steps:
        t0 = time.perf_counter()
        row_key = next(c for c in frame.columns if c not in columns)
        load_dataframe(frame, url, table, row_key, columns, **options)
        times[f"load {name}"] = time.perf_counter() - t0
    return times
