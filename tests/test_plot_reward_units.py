"""The reward panel's axis names what the runs were paid: `task.rewards` (weighted) counts, not only `task.reward`."""

from __future__ import annotations

from pathlib import Path

from chessgrpo.track.plots_training import figure_reward
from chessgrpo.track.run_data import RunData


def _run(tmp_path: Path, task: dict) -> RunData:
    rows = [{"step": step, "reward/mean": -0.1 / step, "reward/std": 0.05} for step in range(1, 6)]
    return RunData(path=tmp_path / "run", config={"kind": "move_group", "task": task}, rows=rows, evals=[])


def test_a_run_paid_by_weighted_rewards_is_labelled_by_them(tmp_path: Path) -> None:
    regret_only = figure_reward([_run(tmp_path, {"reward": "win_prob", "rewards": {"regret": 1.0}})])
    assert regret_only is not None and regret_only.panels[0].ylabel.startswith("regret")
    # Two rewards mixed: neither unit alone describes the axis.
    mixed = figure_reward([_run(tmp_path, {"rewards": {"regret": 0.5, "win_prob": 0.5}})])
    assert mixed is not None and mixed.panels[0].ylabel == "reward (win-prob units)"
    plain = figure_reward([_run(tmp_path, {"reward": "win_prob"})])
    assert plain is not None and plain.panels[0].ylabel.startswith("win probability")
