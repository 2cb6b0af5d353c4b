"""The one shape of what a recipe's ``verify()`` finds."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["VerifyReport"]


@dataclass
class VerifyReport:
    """What a recipe's ``verify()`` found: :attr:`problems`, one line each, empty when
    every invariant holds; the report is true (and :attr:`ok`) when there is none, so
    ``if not pipeline.verify():`` reads as "if verification failed". Recipes add what
    they counted on the way (``photon.VerifyReport``, ``ubiq.CoverageReport``)."""

    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No invariant is broken."""
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok
