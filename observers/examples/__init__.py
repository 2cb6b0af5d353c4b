"""Example observer applications built on :mod:`observers` (see each module)."""
