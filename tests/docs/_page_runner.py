"""Runs pages' examples, as a reader would, in the interpreter of the virtualenv that
has the wheel installed (tests/docs/test_examples.py starts it). It imports nothing of
the checkout: only the standard library, and what the pages import, which must come
from the wheel.

    python _page_runner.py REQUEST.json

REQUEST.json holds the warnings not to take as errors and the pages, run one after
the other (the Spark pages share one process, as they share its JVM), each with its
directory (empty, the current directory of its blocks), its blocks (``where``,
``path``, ``line``, ``lang``, ``code``), and where to write its result: the block that
failed and why, what the page left running, and where each of our modules imported
by then came from.
"""

from __future__ import annotations

import builtins
import gc
import json
import os
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

SHELL_TIMEOUT = 120.0  # seconds; a CLI example takes one or two
OUR_MODULES = ("percolator", "observers", "oracle", "spark_loader", "pyspark_percolator")


class ShellFailed(Exception):
    pass


def _run(block: dict[str, Any], namespace: dict[str, Any], directory: str) -> None:
    if block["lang"] == "python":
        # Padded so that its line numbers are the page's: tracebacks point into it.
        code = "\n" * (block["line"] - 1) + block["code"]
        exec(compile(code, block["path"], "exec"), namespace)
        return
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block["code"]], cwd=directory,
                          capture_output=True, text=True, timeout=SHELL_TIMEOUT)
    if done.returncode:
        raise ShellFailed(f"the shell example exited {done.returncode}\n{block['code']}\n"
                          f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")


def _left_open(namespace: dict[str, Any]) -> list[str]:
    """What the page leaves running: a worker's threads, or a transaction or snapshot
    that holds garbage collection back (the docs close what they open). Garbage in
    reference cycles (a failed run's traceback) is collected first: only what the
    page still holds counts."""
    gc.collect()
    problems = []
    if "observers" in sys.modules:
        from observers import Worker

        for name, value in namespace.items():
            if isinstance(value, Worker) and any(t.is_alive() for t in value._threads):
                problems.append(f"worker {name!r} is still running")
    if "percolator" in sys.modules:
        import percolator
        from percolator._internals import internals

        for name, value in namespace.items():
            if isinstance(value, percolator.Cluster) and not value._closed:
                running = internals(value).safe_point.running()
                if running:
                    problems.append(
                        f"a transaction or snapshot of {name!r} is still open (start_ts "
                        f"{running[0][0]}): it holds garbage collection back")
    return problems


def _close(namespace: dict[str, Any]) -> None:
    if "observers" in sys.modules:
        from observers import Worker

        for value in list(namespace.values()):
            if isinstance(value, Worker):
                value.stop(10)
    if "percolator" in sys.modules:
        import percolator

        for value in list(namespace.values()):
            if isinstance(value, percolator.Cluster):
                value.close()


def _run_page(page: dict[str, Any]) -> None:
    directory = page["directory"]
    os.chdir(directory)
    sys.path[0] = directory  # as ``python`` started in the reader's directory
    namespace: dict[str, Any] = {"__name__": "__example__"}
    result: dict[str, Any] = {"failed": None, "error": "", "left_open": []}
    try:
        for block in page["blocks"]:
            try:
                _run(block, namespace, directory)
            except ShellFailed as e:
                result.update(failed=block["where"], error=str(e))
                break
            except BaseException:  # SystemExit too: a page does not exit
                result.update(failed=block["where"], error=traceback.format_exc())
                break
        else:
            result["left_open"] = _left_open(namespace)
    finally:
        _close(namespace)
        result["modules"] = {name: getattr(sys.modules[name], "__file__", None)
                             for name in OUR_MODULES if name in sys.modules}
        Path(page["result"]).write_text(json.dumps(result))


def main(request_file: str) -> None:
    request = json.loads(Path(request_file).read_text())
    warnings.simplefilter("error")  # as the suite takes them (setup.cfg)
    for category in request["ignore_warnings"]:
        warnings.simplefilter("ignore", getattr(builtins, category))
    for page in request["pages"]:
        _run_page(page)


if __name__ == "__main__":
    main(sys.argv[1])
