"""Forks: what a process must not share with a child it forks (SQLite connections,
``flock`` descriptors) is reopened by the child when :data:`generation` changed."""

from __future__ import annotations

import os

__all__ = ["generation"]

generation = 0
"""How many forks this process is away from the one that imported this module."""


def _after_fork_in_child() -> None:
    global generation
    generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)
