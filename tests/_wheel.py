"""The distribution built from this checkout, and a fresh virtualenv with its wheel
installed: what a new user gets from ``pip install percolator-txn``.

The wheel and the sdist are built once per run (setuptools' build backend, in this
interpreter, from a copy of the checkout: no build isolation, no download), and the
virtualenv made once, whatever the number of xdist workers: the first worker that
asks builds them under a file lock in the run's shared temporary directory, the
others find them there (a session fixture alone would build once per worker).

The virtualenv gets the wheel and nothing else from this checkout. The third-party
packages of the extras (kazoo, grpc, pyspark, ...) are this interpreter's: a ``.pth``
file of the virtualenv appends this interpreter's site-packages to ``sys.path``, after
the virtualenv's own (so that the wheel's modules win). A path line in a ``.pth`` does
not process the ``.pth`` files of the directory it names, so the editable install's
line that puts the checkout on ``sys.path`` is not taken:
``tests/test_packaging.py`` checks that each of our modules comes from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUR_MODULES = ("percolator", "observers", "oracle", "spark_loader", "pyspark_percolator")
"""The top-level modules the wheel installs."""
_SKIP = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache")


@dataclass(frozen=True)
class WheelVenv:
    """The built distribution and the virtualenv that has its wheel installed."""

    sdist: Path
    wheel: Path
    prefix: Path  # the virtualenv

    @property
    def python(self) -> Path:
        return self.prefix / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        (found,) = self.prefix.glob("lib/python*/site-packages")
        return found

    def env(self) -> dict[str, str]:
        """The environment of a reader who activated the virtualenv: its ``python`` and
        console scripts first on ``PATH``, and no ``PYTHONPATH`` into the checkout."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env["VIRTUAL_ENV"] = str(self.prefix)
        env["PATH"] = os.pathsep.join([str(self.prefix / "bin"), env.get("PATH", "")])
        return env


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        yield


def _build(folder: Path) -> WheelVenv:
    source = folder / "source" / "percolator-txn"
    shutil.copytree(ROOT, source, ignore=_SKIP)
    out = folder / "dist"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys\nfrom setuptools import build_meta as b\nout = sys.argv[1]\n"
         "b.build_sdist(out)\nb.build_wheel(out)", str(out)],  # build_meta rewrites argv
        cwd=source, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, f"the build failed:\n{done.stdout}\n{done.stderr}"
    shutil.rmtree(source.parent)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    built = WheelVenv(sdist, wheel, folder / "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(built.prefix)],
                   check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(built.python), "install",
                    "-q", "--no-deps", "--no-index", "--disable-pip-version-check",
                    str(wheel)], check=True, timeout=300, env=built.env())
    paths = sysconfig.get_paths()
    theirs = dict.fromkeys([paths["purelib"], paths["platlib"]])  # once each, in order
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        theirs[site.getusersitepackages()] = None  # pip install --user
    (built.site_packages / "zz-test-interpreter-packages.pth").write_text(
        "".join(f"{p}\n" for p in theirs))
    return built


def wheel_venv_of_the_run(basetemp: Path) -> WheelVenv:
    """The run's built distribution and virtualenv, built by the first caller."""
    # The workers' temporary directories share their parent, that of the run.
    shared = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
    folder = shared / "wheel-venv"
    with _locked(shared / "wheel-venv.lock"):
        description = folder / "built.json"
        if description.exists():
            return WheelVenv(**{k: Path(v) for k, v in json.loads(
                description.read_text()).items()})
        if folder.exists():  # a worker died while building: start again
            shutil.rmtree(folder)
        folder.mkdir()
        built = _build(folder)
        description.write_text(json.dumps(
            {"sdist": str(built.sdist), "wheel": str(built.wheel),
             "prefix": str(built.prefix)}))
        return built


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    """The wheel and sdist of this checkout, and a fresh virtualenv with the wheel."""
    return wheel_venv_of_the_run(tmp_path_factory.getbasetemp())
