"""A Spark standalone cluster from the pyspark distribution: a master and N workers,
each its own JVM started by pyspark's ``bin/spark-class`` (the pip package has no
``sbin/start-*.sh``), on free loopback ports, web UIs on free ports too. Executors
then run in JVMs of their own under the workers, each with Python workers of the
Python that ``PYSPARK_PYTHON`` names (this one), with this checkout on their
``PYTHONPATH``. Every JVM dies with the process that started it
(``PR_SET_PDEATHSIG``, kept across spark-class's ``exec``).

:meth:`SparkStandalone.start_in_background` starts it beside something else (the
multi-server HBase's start: most of either is waiting on a JVM)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests._hbase_local import _free_port, _spawned, jvm_options, kill, tail

ROOT = Path(__file__).resolve().parents[1]
START_SECONDS = 300.0


class SparkStartError(RuntimeError):
    """The master or a worker did not start; the message quotes its log."""


class SparkStandalone:
    def __init__(self, workers: int = 2, directory: Path | None = None) -> None:
        self._own_dir = directory is None
        self.dir = directory or Path(tempfile.mkdtemp(prefix="percolator-spark-"))
        self.workers = workers
        self.port = _free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._starter: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._start_ended = threading.Event()
        self._stopped = threading.Event()
        self._timeout = START_SECONDS

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        import pyspark

        return {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent),
                "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                            os.environ.get("PYTHONPATH")])),
                # executors of 512 MB fit the workers (768 MB): an application that
                # sets no spark.executor.memory would ask for 1 GB and never run
                "SPARK_EXECUTOR_MEMORY": "512m",
                "SPARK_DAEMON_JAVA_OPTS": " ".join(jvm_options()),
                # the JVM of bin/spark-class that builds each command line (the master's,
                # a worker's, a driver's): it lives a second, C1 is all it needs
                "SPARK_LAUNCHER_OPTS": " ".join(jvm_options()),
                "SPARK_WORKER_DIR": str(self.dir / "work")}

    def _start(self, name: str, *args: str) -> Path:
        import pyspark

        if self._stopped.is_set():
            raise SparkStartError("stopped while starting")
        spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        log = self.dir / f"{name}.log"
        argv, options = _spawned([str(spark_class), *args])
        with open(log, "ab") as out:
            self.procs.append(subprocess.Popen(
                argv, env=self.env(), cwd=self.dir,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, **options))
        return log

    def _wait(self, log: Path, line: str, deadline: float) -> None:
        proc = self.procs[-1]
        while line not in (log.read_text(errors="replace") if log.exists() else ""):
            if self._stopped.is_set():
                raise SparkStartError("stopped while starting")
            if proc.poll() is not None or time.monotonic() > deadline:
                state = "exited" if proc.poll() is not None else "did not start in time"
                raise SparkStartError(f"{log.stem} {state}; last lines of {log}:\n{tail(log)}")
            time.sleep(0.2)

    def start(self, timeout: float = START_SECONDS) -> SparkStandalone:
        deadline = time.monotonic() + timeout
        self.dir.mkdir(parents=True, exist_ok=True)
        log = self._start("master", "org.apache.spark.deploy.master.Master", "--host",
                          "127.0.0.1", "--port", str(self.port), "--webui-port",
                          str(_free_port()))
        self._wait(log, "I have been elected leader", deadline)
        for i in range(self.workers):
            log = self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker",
                              self.master_url, "--host", "127.0.0.1", "--webui-port",
                              str(_free_port()), "--cores", "1", "--memory", "768m",
                              "--work-dir", str(self.dir / f"work{i}"))
            self._wait(log, "Successfully registered with master", deadline)
        return self

    def start_in_background(self, timeout: float = START_SECONDS) -> None:
        """:meth:`start` in a thread; :meth:`wait_started` waits for it. The thread
        lives until :meth:`stop`: the JVMs' ``PR_SET_PDEATHSIG`` fires when the
        *thread* that started them ends, not only its process."""

        def run() -> None:
            try:
                self.start(timeout)
            except BaseException as e:  # raised again by wait_started
                self._start_error = e
            finally:
                self._start_ended.set()
            self._stopped.wait()

        self._timeout = timeout
        self._starter = threading.Thread(target=run, name="spark-standalone", daemon=True)
        self._starter.start()

    def wait_started(self) -> SparkStandalone:
        """The cluster, once :meth:`start_in_background` has started it (started here
        and now if that was not called).

        :raises SparkStartError: as :meth:`start`."""
        if self._starter is None:
            return self.start()
        if not self._start_ended.wait(self._timeout + 60):
            raise SparkStartError(f"the master and workers did not start in "
                                  f"{self._timeout:.0f} s (logs in {self.dir})")
        if self._start_error is not None:
            raise self._start_error
        return self

    def stop(self) -> None:
        self._stopped.set()  # a start in the background ends (its JVMs with its thread)
        for proc in reversed(self.procs):
            kill(proc)
        self.procs.clear()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
