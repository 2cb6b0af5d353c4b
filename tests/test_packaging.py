"""The distribution as a package index shows it and a new user installs it (issue 50):
the LICENSE ships in the wheel and the sdist, the metadata names the project's pages,
README.md's links work on the index page (absolute, each naming a file of this
repository), the sdist carries the whole test tree, and the fresh virtualenv with the
wheel installed, in which every page of docs/ runs (tests/docs/test_examples.py),
imports our modules from the wheel, not from this checkout.

The wheel, the sdist and the virtualenv are built once per run (tests/_wheel.py)."""

from __future__ import annotations

import configparser
import email
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from pathlib import Path

import pytest

from tests._wheel import OUR_MODULES, WheelVenv

ROOT = Path(__file__).resolve().parents[1]


def _repository() -> str:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config["metadata"]["url"].rstrip("/")


@pytest.fixture
def dist(wheel_venv: WheelVenv) -> dict[str, Path]:
    return {"sdist": wheel_venv.sdist, "wheel": wheel_venv.wheel}


def _wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(z.read(name))


def test_the_license_ships_in_the_wheel_and_the_sdist(dist: dict[str, Path]) -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0" in license_text
    with zipfile.ZipFile(dist["wheel"]) as z:
        licenses = [n for n in z.namelist() if ".dist-info/" in n and n.endswith("LICENSE")]
        assert licenses and z.read(licenses[0]).decode() == license_text
    with tarfile.open(dist["sdist"]) as t:
        top = t.getnames()[0].split("/")[0]
        member = t.extractfile(f"{top}/LICENSE")
        assert member is not None and member.read().decode() == license_text
    metadata = _wheel_metadata(dist["wheel"])
    assert metadata["License"] == "Apache-2.0" or "Apache" in (metadata["License-Expression"]
                                                                or metadata["License"] or "")


def test_the_sdist_carries_the_whole_test_tree(dist: dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as t:
        top = t.getnames()[0].split("/")[0]
        shipped = {n[len(top) + 1:] for n in t.getnames()}
    tests = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
             if "__pycache__" not in p.parts}
    assert "tests/conftest.py" in shipped
    assert tests <= shipped, sorted(tests - shipped)[:10]
    assert "LICENSE" in shipped and "docs/index.md" in shipped


def test_the_metadata_names_the_project_pages(dist: dict[str, Path]) -> None:
    metadata = _wheel_metadata(dist["wheel"])
    repository = _repository()
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    assert metadata["Home-page"] == repository or urls.get("Homepage") == repository
    assert {"Documentation", "Source", "Changelog", "Issues"} <= set(urls)
    for label, url in urls.items():
        _check_repository_link(url, repository, f"Project-URL {label}")


def _check_repository_link(url: str, repository: str, where: str) -> None:
    """*url* is absolute, and one under the repository names a file or folder of it."""
    assert url.startswith("https://"), f"{where}: {url} is not absolute"
    if not url.startswith(repository):
        return
    rest = url[len(repository):].split("#")[0]
    if rest in ("", "/issues"):
        return
    match = re.fullmatch(r"/(?:blob|tree)/main/(.+)", rest)
    assert match, f"{where}: {url} is not a file of the repository"
    assert (ROOT / match[1]).exists(), f"{where}: {url} names {match[1]}, which is missing"


_GITHUB = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+(?:/(?:blob|tree)/main/[^)\s\"'>#]+)?")


def test_the_repository_url_is_one_setting() -> None:
    """setup.cfg's ``url`` is the repository's address, the one place to change it:
    the project URLs derive from it, mkdocs.yml's ``repo_url`` is it, and each link
    of the docs to a file of this repository is under it (a placeholder today: the
    project's public address replaces it there and in the places this names)."""
    repository = _repository()
    raw = configparser.RawConfigParser()
    raw.read(ROOT / "setup.cfg")
    assert raw["metadata"]["url"] == repository
    assert "github.com" not in raw["metadata"]["project_urls"], \
        "setup.cfg: write the project URLs as %(url)s/..., derived from url"
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^repo_url: (\S+)$", mkdocs, re.M)[1] == repository  # type: ignore[index]
    assert re.search(r"^repo_name: (\S+)$", mkdocs, re.M)[1] == repository.rsplit(  # type: ignore[index]
        "/", 1)[1]
    elsewhere = []
    for page in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
                 *sorted((ROOT / "docs").rglob("*.md"))]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for link in _GITHUB.findall(line):
                names_ours = "/main/" in link and (ROOT / link.split("/main/", 1)[1]).exists()
                if names_ours and not link.startswith(repository + "/"):
                    elsewhere.append(f"{page.relative_to(ROOT)}:{number}: {link}")
    assert not elsewhere, (f"links to files of this repository not under setup.cfg's url "
                           f"{repository}: " + ", ".join(elsewhere))


def test_twine_passes_both(dist: dict[str, Path]) -> None:
    """What the package index checks on upload: metadata, and the long description
    renders (twine comes with the test extra: missing, this fails in CI)."""
    try:
        import twine  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("twine is not installed: pip install -e '.[test]'")
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                           str(dist["sdist"]), str(dist["wheel"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_long_description_links_work_on_an_index_page(dist: dict[str, Path]) -> None:
    metadata = _wheel_metadata(dist["wheel"])
    assert metadata["Description-Content-Type"] == "text/markdown"
    description = metadata.get_payload()
    assert isinstance(description, str) and description.startswith("# Percolator for Python")
    links = re.findall(r"\]\(([^)\s]+)\)", description)
    assert links
    for link in links:
        if not link.startswith("#"):
            _check_repository_link(link, _repository(), "README.md")


def test_the_fresh_virtualenv_imports_our_modules_from_the_wheel(
    wheel_venv: WheelVenv, tmp_path: Path
) -> None:
    """Where the docs pages run (tests/docs/test_examples.py): each of our modules, and
    the ``percolator`` command, is the wheel's, though the third-party packages of the
    extras come from this interpreter and this checkout is installed in it (editable,
    a ``.pth`` line that the virtualenv does not take)."""
    done = subprocess.run(
        [str(wheel_venv.python), "-c",
         "import importlib, json, sys\n"
         "print(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))",
         *OUR_MODULES],
        cwd=tmp_path, env=wheel_venv.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert set(found) == set(OUR_MODULES)
    for module, file in found.items():
        assert Path(file).is_relative_to(wheel_venv.site_packages), (module, file)
    command = shutil.which("percolator", path=wheel_venv.env()["PATH"])
    assert command is not None and Path(command).parent == wheel_venv.prefix / "bin"
