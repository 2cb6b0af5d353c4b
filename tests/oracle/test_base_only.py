"""The oracle server depends on percolator's shared base (errors, TLS settings, the
ZooKeeper client factory, metrics), not on the transaction library."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import percolator

SHARED_BASE = {
    "percolator",
    "percolator._batching",
    "percolator._errors",
    "percolator._forks",
    "percolator._pause",
    "percolator._tls",
    "percolator._zk_client",
    "percolator.ext",  # loads each name from its module at first use
    "percolator.metrics",
}


@pytest.mark.parametrize("module", ["oracle", "oracle._server", "oracle.__main__"])
def test_the_oracle_loads_only_the_shared_base(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "import json; print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] == 'percolator')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    loaded = set(json.loads(out.stdout))
    assert "percolator._commit" not in loaded
    assert loaded <= SHARED_BASE, sorted(loaded - SHARED_BASE)


@pytest.mark.parametrize("target", ["http://127.0.0.1:1", "127.0.0.1:1", 7])
def test_a_target_of_no_registered_scheme_is_refused(tmp_path: object, target: object) -> None:
    with pytest.raises(percolator.InvalidArgument, match="oracle target"):
        percolator.connect(f"sqlite:///{tmp_path}/repo.db", oracle=target)  # type: ignore[arg-type]
