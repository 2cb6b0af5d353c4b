"""Forks: what a process must not share with a child it forks (SQLite connections,
``flock`` descriptors) is reopened by the child when :data:`generation` changed."""

from __future__ import annotations

import os

__all__ = ["generation", "pid"]

generation = 0
"""How many forks this process is away from the one that imported this module."""

pid = os.getpid()
"""This process's id (``os.getpid()`` is a system call on every call; commits ask)."""


def _after_fork_in_child() -> None:
    global generation, pid
    generation += 1
    pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)
