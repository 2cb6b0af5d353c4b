"""The ``percolator`` command as a new user meets it."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

import percolator
from percolator.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["status"], ["wait", "--timeout", "1"], ["retry"]])
def test_commands_never_create_a_missing_store(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "new.db"
    assert main([*command, "--cluster", f"sqlite://{path}"]) == 2
    assert f"no store at {path}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # not the database, nor its side files


def test_status_of_an_existing_store_still_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    with percolator.connect(url) as cluster:
        cluster.create_table("docs")
    assert main(["status", "--cluster", url]) == 0
    assert "tables (1): docs" in capsys.readouterr().out


def test_the_distribution_name_is_not_the_unrelated_percolator() -> None:
    # 'percolator' on the package index is an interactive shell filter (0.2.3).
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    name = config["metadata"]["name"]
    assert name == "percolator-txn"
    installs = re.findall(r"pip install '([a-z_-]+)", (ROOT / "README.md").read_text())
    assert installs and set(installs) == {name}
    extras = config["options.extras_require"]
    assert "prometheus_client" in extras["metrics"] and "prometheus_client" in extras["all"]


def test_every_console_script_is_installed_and_answers_help() -> None:
    """Each entry point of setup.cfg is on PATH once the package is installed (the
    test command installs it) and starts: ``--help`` prints its usage and exits 0."""
    import shutil
    import subprocess
    import sysconfig

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    scripts = [line.split("=")[0].strip()
               for line in config["options.entry_points"]["console_scripts"].splitlines()
               if line.strip()]
    assert {"percolator-photon", "percolator-millwheel", "percolator-ubiq"} <= set(scripts)
    for script in scripts:
        # where pip put this interpreter's scripts (on PATH or not), else PATH
        installed = Path(sysconfig.get_path("scripts")) / script
        path = str(installed) if installed.exists() else shutil.which(script)
        assert path is not None, f"{script} is not installed: pip install -e ."
        done = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), (script, done.stderr)
