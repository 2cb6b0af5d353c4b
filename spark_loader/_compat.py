"""Keyword renames kept working for a release, with a warning."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from percolator import InvalidArgument

__all__ = ["renamed_keyword"]

P = ParamSpec("P")
R = TypeVar("R")


def renamed_keyword(old: str, new: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Accept keyword *old* as *new* with a :class:`DeprecationWarning`."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if old in kwargs:
                if new in kwargs:
                    raise InvalidArgument(
                        f"{func.__name__}() got both {new!r} and its old name {old!r}"
                    )
                warnings.warn(
                    f"{func.__name__}({old}=...) is deprecated; call it {new}=...",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return call

    return decorate
