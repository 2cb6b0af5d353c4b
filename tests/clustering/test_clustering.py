"""Three-key clustering: the incremental observers and the batch PySpark job agree
(same partition of the documents), from scratch and after a batch-clustered seed,
with documents arriving while the observers run."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import Worker, wait_for_observers
from observers.examples.clustering import (
    CLUSTER_COLUMN,
    CLUSTERS,
    DOCUMENTS,
    KEYS_COLUMN,
    MEMBERS_COLUMN,
    OBSERVERS,
    batch_cluster,
    create_tables,
    doc_splits,
    new_documents,
    partition,
    read_clusters,
    read_repository,
    seed_repository,
    synthetic_documents,
    union_find,
)

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # pyspark on pandas 3
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

SEED = 200
ARRIVALS = 80


def _arrive(cluster: percolator.Cluster, docs: list[tuple[str, str]]) -> None:
    """Write *docs* in small transactions from two threads, as a crawler would."""

    def writer(part: list[tuple[str, str]]) -> None:
        for i in range(0, len(part), 3):
            with percolator.Transaction(cluster) as txn:
                for doc, keys in part[i:i + 3]:
                    txn.set(DOCUMENTS, doc.encode(), KEYS_COLUMN, keys.encode())

    threads = [threading.Thread(target=writer, args=(docs[j::2],)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _check_incremental(cluster: percolator.Cluster, n: int) -> dict[str, str]:
    """The observers' clusters are those of a union-find over the documents' keys (read
    at one snapshot), and the clusters table agrees; they are returned."""
    docs = {row.decode(): cols[KEYS_COLUMN].decode().split(",")
            for row, cols in percolator.Snapshot(cluster).scan(DOCUMENTS)}
    incremental = read_clusters(cluster)
    reference = union_find(docs)
    assert len(docs) == n
    # Both name a cluster by its smallest document.
    assert incremental == reference
    members = {row.decode(): set(cols[MEMBERS_COLUMN].decode().split(","))
               for row, cols in percolator.Snapshot(cluster).scan(CLUSTERS)}
    assert members == {c: set(g) for g in partition(reference) for c in [min(g)]}
    # The repository has real merges to get right.
    assert max(len(g) for g in partition(reference)) >= 4
    return incremental


def _check_batch_agrees(spark: Any, url: str, n: int, incremental: dict[str, str]) -> None:
    """The batch job, over the repository read with ``read_table``, finds the
    observers' clusters."""
    repo = read_repository(spark, url, doc_splits(n, 2))
    labels, rounds = batch_cluster(repo)
    batch = {r["doc"]: r["cluster"] for r in labels.collect()}
    assert rounds >= 1
    assert partition(batch) == partition(incremental)
    assert batch == incremental


# A Spark batch job, 4 observer threads and a second Spark job: 2-3 minutes alone on
# 2 cores, past 300 s while the suite's other workers share them.
@pytest.mark.timeout(900)
def test_incremental_from_scratch_agrees_with_batch(spark: Any, tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/repo.db"
    seed_repository(spark, url, synthetic_documents(spark, SEED, seed=7, factor=5),
                    clustered=False, load_options={"observe": [KEYS_COLUMN]})
    with percolator.connect(url) as cluster:
        worker = Worker(cluster, OBSERVERS, threads=4)
        worker.start()
        try:
            _arrive(cluster, new_documents(SEED, ARRIVALS, SEED, random.Random(1), factor=5))
            wait_for_observers(cluster, timeout=60)
        finally:
            worker.stop()
        assert worker.stats["committed"] == SEED + ARRIVALS
        incremental = _check_incremental(cluster, SEED + ARRIVALS)
        _check_batch_agrees(spark, url, SEED + ARRIVALS, incremental)


# A Spark batch job (the seed's clustering and load) and 4 observer threads.
@pytest.mark.timeout(900)
def test_batch_seeded_then_incremental_agrees_with_batch(spark: Any, tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/repo.db"
    seed_repository(spark, url, synthetic_documents(spark, SEED, seed=8, factor=5))
    with percolator.connect(url) as cluster:
        assert len(read_clusters(cluster)) == SEED  # the batch job clustered the seed
        worker = Worker(cluster, OBSERVERS, threads=4)
        worker.start()
        try:
            _arrive(cluster, new_documents(SEED, ARRIVALS, SEED, random.Random(2), factor=5))
            wait_for_observers(cluster, timeout=60)
        finally:
            worker.stop()
        assert worker.stats["committed"] == ARRIVALS
        # The batch job's clusters were checked against the observers' by the test
        # above; here the observers go on from the clusters it loaded: theirs must be
        # the reference's (a second batch run, a minute of Spark jobs, adds nothing).
        _check_incremental(cluster, SEED + ARRIVALS)


def test_cluster_ids_are_stored_with_each_document(tmp_path: Path) -> None:
    """No Spark: documents written one by one merge into one cluster."""
    with percolator.connect(f"sqlite:///{tmp_path}/repo.db") as cluster:
        create_tables(cluster)
        worker = Worker(cluster, OBSERVERS, threads=2)
        worker.start()
        try:
            _arrive(cluster, [("d3", "a,x,y"), ("d2", "b,p,q"), ("d1", "c,r,s")])
            wait_for_observers(cluster, timeout=30)
            assert set(read_clusters(cluster).values()) == {"d1", "d2", "d3"}
            _arrive(cluster, [("d4", "a,b,c")])  # links all three
            wait_for_observers(cluster, timeout=30)
        finally:
            worker.stop()
        assert read_clusters(cluster) == {"d1": "d1", "d2": "d1", "d3": "d1", "d4": "d1"}
        with percolator.Transaction(cluster) as txn:
            assert txn.get(CLUSTERS, b"d1", MEMBERS_COLUMN) == b"d1,d2,d3,d4"
            assert txn.get(CLUSTERS, b"d2", MEMBERS_COLUMN) is None
            assert txn.get(DOCUMENTS, b"d4", CLUSTER_COLUMN) == b"d1"
