"""What the stream recipes (photon, millwheel, ubiq) share: their pipelines' checks,
loading user code named on a command line (``package.module:NAME``) and how their
commands end on an error."""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from percolator import Cluster, InvalidArgument, PercolatorError

__all__ = ["bind", "check_pipeline", "load_object", "load_pipeline", "run_command", "seconds"]

T = TypeVar("T")
A = TypeVar("A")


def bind(method: Callable[[A], T], arg: A) -> Callable[[], T]:
    """*method* with its one argument bound (a task of :class:`observers.Periodic`)."""
    return lambda: method(arg)


def run_command(body: Callable[[], int], prefix: str = "error") -> int:
    """Run a command's *body* and return its exit status: a library or OS error
    (a bad url, an unreachable store, a missing file) is one line on stderr and
    status 2, not a traceback."""
    try:
        return body()
    except (PercolatorError, OSError) as e:
        print(f"{prefix}: {e}", file=sys.stderr)
        return 2


def check_pipeline(kind: str, cluster: object, name: object) -> None:
    """*cluster* is a Cluster and *name* a pipeline name (it goes into table names).

    :raises InvalidArgument: naming what is wrong."""
    if not isinstance(cluster, Cluster):
        raise InvalidArgument(f"{kind} needs a percolator.Cluster, got {cluster!r:.80}")
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name):
        raise InvalidArgument(f"pipeline name must be letters, digits, '_' or '-', got {name!r}")


def seconds(name: str, value: object) -> float:
    """*value*, a positive duration (a number of seconds or a :class:`timedelta`), in
    seconds: the one unit of the recipes' durations.

    :raises InvalidArgument: naming *name* when it is anything else."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            or not math.isfinite(value)):
        raise InvalidArgument(
            f"{name} must be a positive number of seconds or a timedelta, got {value!r}")
    return float(value)


def load_pipeline(spec: str, cluster: Cluster, kind: type[T]) -> T:
    """The pipeline that the factory *spec* (``package.module:NAME``, a callable taking
    the cluster, or the pipeline itself) gives.

    :raises InvalidArgument: when it names nothing, or not a *kind*."""
    factory = load_object(spec, "--pipeline")
    pipeline = factory(cluster) if callable(factory) else factory
    if not isinstance(pipeline, kind):
        raise InvalidArgument(f"{spec!r} did not give a {kind.__name__}: {pipeline!r:.80}")
    return pipeline


def load_object(spec: str, flag: str) -> Any:
    """The object *spec* (``package.module:NAME``) names.

    :raises InvalidArgument: naming *flag*, when *spec* is malformed or names nothing.
    """
    if not isinstance(spec, str):
        raise InvalidArgument(f"{flag} must be a str 'package.module:NAME', got {spec!r}")
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise InvalidArgument(f"bad {flag} {spec!r}: expected package.module:NAME")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise InvalidArgument(f"cannot load {flag} {spec!r}: {e}") from None
