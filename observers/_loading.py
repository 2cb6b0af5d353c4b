"""Loading user code named on a command line: ``package.module:NAME``."""

from __future__ import annotations

import importlib
from typing import Any

from percolator import InvalidArgument

__all__ = ["load_object"]


def load_object(spec: str, flag: str) -> Any:
    """The object *spec* (``package.module:NAME``) names.

    :raises InvalidArgument: naming *flag*, when *spec* is malformed or names nothing.
    """
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise InvalidArgument(f"bad {flag} {spec!r}: expected package.module:NAME")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise InvalidArgument(f"cannot load {flag} {spec!r}: {e}") from None
