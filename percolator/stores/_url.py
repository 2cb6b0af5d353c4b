"""The one reading of store URLs and of the arguments every backend checks alike.

Every backend opens ``scheme://...?key=value&...`` through :func:`parse_store_url`, so
that the same option means the same everywhere: keyword options given to
:func:`~percolator.stores.open_store` override the URL's query (a program's explicit
word beats a URL taken from configuration), a key may appear once in the query, an
unknown key is refused, and every duration is in seconds (as everywhere else in the
API).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

from percolator._errors import InvalidArgument

__all__ = ["StoreUrl", "check_scan", "parse_store_url", "positive_int"]

MAX_SECONDS = 86_400.0
"""The longest store timeout taken (a day)."""


def positive_int(name: str, value: object, where: str = "") -> int:
    """*value* as an int >= 1; a bool, a float or anything else is refused with
    :class:`InvalidArgument` naming *name*."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name!r} must be a positive integer, got {value!r}{where}")
    return value


def check_scan(start: object, stop: object, batch_size: object) -> None:
    """The argument checks of :meth:`~percolator._store.Store.scan` that every backend
    makes at the call (not at the first ``next()``), alike."""
    for bound in (start, stop):
        if bound is not None and not isinstance(bound, bytes):
            raise InvalidArgument(f"scan bounds must be bytes or None, got {bound!r}")
    positive_int("batch_size", batch_size)


@dataclass(frozen=True)
class StoreUrl:
    """A store URL split, with its options: the query's, overridden by the keywords."""

    url: str
    parts: SplitResult
    query: tuple[tuple[str, str], ...]
    """The query as written (what a backend may show again in its ``url``)."""
    options: Mapping[str, Any]

    def _where(self) -> str:
        return f" (url {self.url!r})"

    def text(self, key: str, default: str) -> str:
        """Option *key* as text (*default* when absent)."""
        value = self.options.get(key, default)
        if not isinstance(value, str):
            raise InvalidArgument(f"{key!r} must be a str, got {value!r}{self._where()}")
        return value

    def integer(self, key: str, default: int) -> int:
        """Option *key* as a positive int (*default* when absent)."""
        value = self.options.get(key, default)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)  # as a url carries it
        return positive_int(key, value, self._where())

    def seconds(self, key: str, default: float) -> float:
        """Option *key* as a positive, finite number of seconds (*default* when absent),
        at most a day: more is a value in milliseconds, the unit HBase's ``timeout``
        had before 0.1.0 (``?timeout=120000``), which would otherwise wait 33 hours."""
        value = self.options.get(key, default)
        number = math.nan
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if not (number > 0 and math.isfinite(number)):
            raise InvalidArgument(
                f"{key!r} must be a positive number of seconds, got {value!r}{self._where()}"
            )
        if number > MAX_SECONDS:
            raise InvalidArgument(
                f"{key!r} is {value!r} seconds, more than a day{self._where()}: store "
                f"timeouts are in seconds (was this milliseconds? {number / 1000:g} s)"
            )
        return number


def parse_store_url(
    url: object,
    scheme: str,
    options: Mapping[str, Any],
    *,
    known: Collection[str],
    keyword_only: Collection[str] = (),
) -> StoreUrl:
    """Split *url* of *scheme* and merge its query with *options* (the keywords win).

    *known* are the option names the backend takes, *keyword_only* those of them that
    only a keyword can give (objects, not text). Anything else is refused with
    :class:`InvalidArgument`, as are a malformed query and a key given twice in it.
    """
    if not isinstance(url, str):
        raise InvalidArgument(f"store url must be a str, got {type(url).__name__}: {url!r}")
    parts = urlsplit(url)
    if parts.scheme != scheme:
        raise InvalidArgument(f"not a {scheme}:// url: {url!r}")
    try:
        query = tuple(
            parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        )
    except ValueError:
        raise InvalidArgument(f"malformed query string in store url {url!r}") from None
    in_url = set(known) - set(keyword_only)
    seen: set[str] = set()
    for key, _ in query:
        if key not in in_url:
            raise InvalidArgument(
                f"unknown query option {key!r} in store url {url!r}; known: {sorted(in_url)}"
            )
        if key in seen:
            raise InvalidArgument(f"query option {key!r} given twice in store url {url!r}")
        seen.add(key)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidArgument(
            f"unknown {scheme} store option(s) {unknown} for {url!r}; known: {sorted(known)}"
        )
    return StoreUrl(url=url, parts=parts, query=query, options={**dict(query), **options})
