"""bench/regress.py, the performance guard: its verdict on given figures, and one run of
it with tiny sizes (a smoke test: it runs and reports; no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.regress import COSTS, RATES, compare  # noqa: E402


def figures(scale: float, cpu: float) -> dict[str, float]:
    return {**{name: 1000.0 * scale for name in RATES}, **{name: cpu for name in COSTS}}


def test_a_figure_slower_than_the_base_past_the_tolerance_fails() -> None:
    base = [figures(1.0, 100.0)] * 3
    _, failed = compare(base, [figures(0.95, 100.0)] * 3, 0.10)
    assert failed == []
    _, failed = compare(base, [figures(0.85, 100.0)] * 3, 0.10)
    assert sorted(f.split(":")[0] for f in failed) == sorted(RATES)


def test_cpu_per_notification_is_better_when_lower() -> None:
    base = [figures(1.0, 100.0)] * 3
    lines, failed = compare(base, [figures(1.0, 80.0)] * 3, 0.10)
    assert failed == []
    assert "| CPU per notification | 100.0 us | 80.0 us | 1.25 |" in lines
    _, failed = compare(base, [figures(1.0, 125.0)] * 3, 0.10)
    assert failed == [f"{name}: 0.80" for name in COSTS]


def test_the_ratio_is_the_median_of_the_rounds() -> None:
    base = [figures(1.0, 100.0)] * 3
    new = [figures(0.5, 100.0), figures(1.0, 100.0), figures(1.0, 100.0)]
    _, failed = compare(base, new, 0.10)  # one bad round of three is noise
    assert failed == []


def test_it_runs_against_a_base_commit_with_tiny_sizes() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "regress.py"), "--base", "HEAD", "--rounds", "1",
         "--ops", "4", "--notifications", "2", "--tolerance", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    for name in (*RATES, *COSTS):
        assert f"| {name} |" in run.stdout
    assert "no figure slower than the base" in run.stdout
    tree = run.stderr.split(" checked out in ", 1)[1].split()[0]
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True,
                               text=True).stdout
    assert tree not in worktrees and not Path(tree).exists()  # the base's checkout is gone


def test_a_base_that_is_no_commit_is_refused() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "regress.py"), "--base", "no-such-commit-x"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "'no-such-commit-x' is not a commit" in run.stderr
