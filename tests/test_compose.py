"""``docker-compose.yml`` and ``Dockerfile`` at the root: valid for Compose, and
consistent with the project's command lines.

No Docker engine runs here, so the file is checked offline: ``docker-compose config``
(Debian's ``docker-compose`` package) validates it against the Compose schema and
prints it resolved (anchors and defaults applied), which these tests then read.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import percolator
from tests._services import service_missing

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_TLS = ROOT / "docker-compose.tls.yml"
PROJECT_SERVICES = ("oracle1", "oracle2", "configure", "worker")


def docker_compose(*args: str, tls: bool = False) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        service_missing("docker-compose is not installed: apt-get install docker-compose")
    files = ["--file", str(COMPOSE)] + (["--file", str(COMPOSE_TLS)] if tls else [])
    return subprocess.run(
        [exe, *files, "--project-directory", str(ROOT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@cache
def _resolved_text(tls: bool = False) -> str:
    result = docker_compose("config", tls=tls)
    assert result.returncode == 0, result.stderr
    return result.stdout


def resolved(tls: bool = False) -> dict[str, Any]:
    """The compose file (with the TLS override if *tls*) as ``docker-compose config``
    resolves it."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        service_missing("PyYAML is not installed: pip install pyyaml")
    text = _resolved_text(tls)
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def services(tls: bool = False) -> dict[str, Any]:
    found = resolved(tls)["services"]
    assert isinstance(found, dict)
    return found


def option_help(module: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def options_of(command: list[str]) -> list[str]:
    return [arg for arg in command if arg.startswith("--")]


def value_of(command: list[str], option: str) -> str:
    return command[command.index(option) + 1]


def test_compose_file_is_valid() -> None:
    result = docker_compose("config", "-q")
    assert result.returncode == 0, result.stderr


def test_the_services_exist() -> None:
    assert set(services()) >= {"zookeeper", "hbase", *PROJECT_SERVICES}


def test_project_services_are_built_from_the_dockerfile() -> None:
    assert (ROOT / "Dockerfile").is_file()
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", dockerfile, re.M)
    assert "'.[all]'" in dockerfile or '".[all]"' in dockerfile
    for name in PROJECT_SERVICES:
        build = services()[name]["build"]
        assert Path(build["context"]) == ROOT, name
        assert build.get("dockerfile", "Dockerfile") == "Dockerfile", name


def test_zookeeper_and_hbase_images() -> None:
    zookeeper, hbase = services()["zookeeper"], services()["hbase"]
    assert zookeeper["image"].split(":")[0] == "zookeeper"
    assert {p["target"] for p in hbase["ports"]} >= {9090, 9091}  # Thrift1, Thrift2
    assert {p["target"] for p in zookeeper["ports"]} >= {2181}
    assert "healthcheck" in zookeeper and "healthcheck" in hbase


def test_hbase_is_the_version_the_tests_run_started_by_their_launcher() -> None:
    """The compose HBase is built from the suite's pom and started by its launcher
    (tests/_hbase_local.py) on the ports the compose file publishes."""
    import xml.etree.ElementTree as ET

    hbase = services()["hbase"]
    assert Path(hbase["build"]["context"]) == ROOT
    dockerfile_path = ROOT / hbase["build"]["dockerfile"]
    dockerfile = dockerfile_path.read_text()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom = ET.parse(ROOT / "deploy" / "hbase" / "pom.xml").getroot()
    version = pom.find("m:properties/m:hbase.version", ns).text  # type: ignore[union-attr]
    assert hbase["image"] == f"percolator-hbase:{version}"
    assert "COPY deploy/hbase/pom.xml deploy/hbase/pom.xml" in dockerfile
    assert "COPY tests/_hbase_local.py tests/_hbase_local.py" in dockerfile
    assert "!tests/_hbase_local.py" in (ROOT / ".dockerignore").read_text().splitlines()
    cmd = ast.literal_eval(re.search(r"^CMD (\[.*?\])$", dockerfile, re.M | re.S)[1]
                           .replace("\\\n", ""))  # type: ignore[index]
    assert cmd[:3] == ["python", "-m", "tests._hbase_local"]
    launcher = set(re.findall(r"--[a-z][-a-z0-9]*", option_help("tests._hbase_local")))
    assert set(options_of(cmd)) <= launcher
    assert value_of(cmd, "--bind") == "0.0.0.0"
    assert value_of(cmd, "--thrift-port") == "9090" and value_of(cmd, "--thrift2-port") == "9091"
    assert "--thrift2" in cmd
    published = {p["target"] for p in hbase["ports"]}
    assert {9090, 9091} <= published


def test_hbase_runs_the_launchers_multi_server_topology() -> None:
    """A master, two region servers and the Thrift servers, each a container started
    by the launcher's --role with deploy/hbase/cluster-site.xml (copied into the image):
    the settings scripts/hbase --region-servers N uses. They share one root volume and
    the zookeeper service, whose session limit admits HBase's session timeout."""
    from tests._hbase_local import read_site

    found = services()
    roles: dict[str, list[str]] = {}
    launcher = set(re.findall(r"--[a-z][-a-z0-9]*", option_help("tests._hbase_local")))
    for name in ("hbase-master", "hbase-rs1", "hbase-rs2", "hbase"):
        service = found[name]
        cmd = service["command"]
        assert cmd[:3] == ["python", "-m", "tests._hbase_local"], name
        assert set(options_of(cmd)) <= launcher, name
        assert value_of(cmd, "--zookeeper") == "zookeeper:2181", name
        assert value_of(cmd, "--hostname") == service["hostname"], name
        targets = [v["target"] if isinstance(v, dict) else v.split(":")[1]
                   for v in service["volumes"]]  # long or short syntax, by version
        assert targets == [value_of(cmd, "--dir")], name
        roles.setdefault(value_of(cmd, "--role"), []).append(name)
    assert roles == {"master": ["hbase-master"], "regionserver": ["hbase-rs1", "hbase-rs2"],
                     "thrift": ["hbase"]}
    dockerfile = (ROOT / "deploy" / "hbase" / "Dockerfile").read_text()
    assert "COPY deploy/hbase/cluster-site.xml deploy/hbase/cluster-site.xml" in dockerfile
    session_ms = int(read_site()["zookeeper.session.timeout"])
    extra = found["zookeeper"]["environment"]["ZOO_CFG_EXTRA"]
    assert int(re.search(r"maxSessionTimeout=(\d+)", extra)[1]) >= session_ms  # type: ignore[index]


def test_oracle_replicas_match_the_oracle_cli() -> None:
    known = set(re.findall(r"--[a-z][-a-z]*", option_help("oracle")))
    zookeepers = set()
    for name in ("oracle1", "oracle2"):
        command = services()[name]["command"]
        assert command[:3] == ["python", "-m", "oracle"], name
        assert set(options_of(command)) <= known, name
        host, port = value_of(command, "--listen").rsplit(":", 1)
        assert host == "0.0.0.0"
        assert value_of(command, "--advertise") == f"{name}:{port}"
        zookeepers.add(value_of(command, "--zookeeper"))
        assert services()[name]["depends_on"]["zookeeper"]["condition"] == "service_healthy"
        assert str(port) in " ".join(services()[name]["healthcheck"]["test"])
    assert zookeepers == {"zookeeper:2181/percolator"}  # both replicas elect in one place


def test_worker_matches_the_observers_cli() -> None:
    known = set(re.findall(r"--[a-z][-a-z]*", option_help("observers")))
    worker = services()["worker"]
    command = worker["command"]
    assert command[:3] == ["python", "-m", "observers"]
    assert set(options_of(command)) <= known
    assert value_of(command, "--cluster") == "zk://zookeeper:2181/percolator"
    module, _, name = value_of(command, "--observers").partition(":")
    from observers._worker import load_observers

    assert load_observers(f"{module}:{name}")
    assert worker["depends_on"]["configure"]["condition"] == "service_completed_successfully"


def test_configure_publishes_what_the_others_use() -> None:
    configure = services()["configure"]
    command = configure["command"]
    assert command[:2] == ["python", "-c"]
    script = command[2]
    tree = ast.parse(script)  # valid Python
    calls = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert {"publish_config", "connect", "create_table"} <= calls
    assert {"store", "oracle"} <= set(inspect.signature(percolator.publish_config).parameters)
    assert '"zookeeper:2181/percolator"' in script
    assert "hbase://hbase:9091?api=thrift2" in script  # the Thrift2 data path
    # the demo's observers write these tables: they exist before the worker starts
    for table in ("documents", "clusters", "links"):
        assert f'"{table}"' in script
    assert configure["restart"] == "no"
    assert set(configure["depends_on"]) >= {"zookeeper", "hbase", "oracle1", "oracle2"}


def test_dockerignore_keeps_the_image_small() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", "tests", "bench"} <= set(ignored)


# -- the opt-in TLS override (docker-compose.tls.yml, docs/tls.md) ------------------------

TLS_FILES = {"/tls/ca.pem", "/tls/oracle.pem", "/tls/oracle.key", "/tls/client.pem",
             "/tls/client.key"}


def test_tls_override_is_valid() -> None:
    result = docker_compose("config", "-q", tls=True)
    assert result.returncode == 0, result.stderr


def test_tls_override_names_the_files_the_certificate_script_writes(tmp_path: Path) -> None:
    from tests._tls import _require_cryptography

    _require_cryptography()
    script = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "tls_certs.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert script.returncode == 0, script.stderr
    written = {f"/tls/{name}" for name in os.listdir(tmp_path)}
    text = (ROOT / "docker-compose.tls.yml").read_text()
    named = set(re.findall(r"/tls/[-a-z.]+", text))
    assert named and named <= written
    assert named >= TLS_FILES


def test_tls_oracles_and_worker_use_tls_everywhere() -> None:
    tls_services = services(tls=True)
    oracle_options = set(re.findall(r"--[a-z][-a-z]*", option_help("oracle")))
    worker_options = set(re.findall(r"--[a-z][-a-z]*", option_help("observers")))
    for name in ("oracle1", "oracle2"):
        command = tls_services[name]["command"]
        assert set(options_of(command)) <= oracle_options, name
        assert value_of(command, "--zookeeper") == "zookeeper:2281/percolator"
        assert value_of(command, "--tls-client-ca") == "/tls/ca.pem"  # mutual TLS
        for option in ("--tls-cert", "--tls-key", "--zookeeper-tls-ca", "--zookeeper-tls-cert",
                       "--zookeeper-tls-key"):
            assert value_of(command, option).startswith("/tls/"), (name, option)
    worker = tls_services["worker"]["command"]
    assert set(options_of(worker)) <= worker_options
    assert value_of(worker, "--cluster") == "zk://zookeeper:2281/percolator"
    assert value_of(worker, "--zookeeper-tls-cert") == "/tls/client.pem"
    extra = tls_services["zookeeper"]["environment"]["ZOO_CFG_EXTRA"].split()
    assert "secureClientPort=2281" in extra and "ssl.clientAuth=need" in extra
    for name in ("oracle1", "oracle2", "configure", "worker", "zookeeper"):
        assert any(v.endswith(":/tls:ro") for v in map(str, tls_services[name]["volumes"]))


def test_tls_configure_publishes_the_oracle_tls_paths() -> None:
    script = services(tls=True)["configure"]["command"][2]
    tree = ast.parse(script)
    keywords = {
        kw.arg
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for kw in node.keywords
    }
    assert {"oracle_tls", "zookeeper_tls"} <= keywords
    assert {"oracle_tls", "zookeeper_tls"} <= set(
        inspect.signature(percolator.publish_config).parameters
    )
    assert "zookeeper_tls" in inspect.signature(percolator.connect).parameters
    assert '"zookeeper:2281/percolator"' in script
