from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# Fixture modules of the real services; each helper module owns one service.
pytest_plugins: list[str] = [
    "tests._backends",
    "tests._bigtable",
    "tests._zookeeper",
    "tests._hbase",
    "tests._spark",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

settings.register_profile(
    "ci",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run soak tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --run-slow (or its bench/ script)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
