"""`chessgrpo sweep`: Optuna studies whose trials are ordinary training runs (tiny pretraining and GRPO runs).

A sweep prints one line per trial, a rerun continues the study without repeating a trial, conditional
keys are searched only when their condition holds, the best config is written and trains, pruned
trials are PRUNED and diverging ones FAILED with their reason, bad sweep keys give one clear error,
the change objective carries its paired interval, --remeasure compares best and default on unseen
items, parallel workers divide the cores, and the report draws the study.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from chessgrpo import cli
from chessgrpo.board import move_to_action, random_playout_positions
from chessgrpo.config import load_config
from chessgrpo.data.schema import write_shard
from chessgrpo.engine import EnginePool
from chessgrpo.engine.pool import available_cores
from chessgrpo.sweep.config import SweepConfig, load_sweep, resolve_sweep
from chessgrpo.sweep.summary import load_study, remeasure, summarize
from chessgrpo.tasks.kinds.pretrain import PretrainTrainConfig
from helpers import NO_LABELLED_LOSSES, data_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """80 random-playout positions labelled by real Stockfish (multipv 3): 64 train, 16 test."""
    boards = random_playout_positions(80, seed=7, max_plies=40)
    with EnginePool(processes=1, nodes=200, cache_path=None) as pool:
        analyses = pool.analyse_many(boards, multipv=3)
    rows = []
    for board, analysis in zip(boards, analyses):
        moves, wins = [line.move for line in analysis.lines], [line.win_probability for line in analysis.lines]
        rows.append(
            dict(
                fen=board.fen(),
                source="random_playout",
                best_move=moves[0],
                best_action=move_to_action(moves[0]),
                moves=moves,
                win_probs=wins,
                value=wins[0],
                legal_moves=None,
                legal_win_probs=None,
                nodes=200,
            )
        )
    directory = tmp_path_factory.mktemp("labelled")
    write_shard(rows[:64], directory / "train" / "shard-00000.parquet")
    write_shard(rows[64:], directory / "test" / "shard-00000.parquet")
    return directory


def pretrain_sweep(dataset: Path, tmp_path: Path, **sections) -> dict:
    """A sweep of 6-step pretraining runs on the tiny dataset (about a second a trial)."""
    sweep = {
        "base": {
            "kind": "pretrain",
            "data": str(dataset),
            "model": {"size": "tiny"},
            "batch_size": 32,
            "steps": 6,
            "eval_every": 3,
            "checkpoint_every": 0,
            "warmup_steps": 0,
            "threads": 1,
            "run": {"out_dir": str(tmp_path / "runs")},
        },
        "space": {
            "lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
            "objective": ["bc", "distill"],
            "distill_temperature": {"type": "float", "low": 0.02, "high": 0.2, "when": {"objective": "distill"}},
        },
        "objective": {"metric": "eval/nll", "direction": "minimize"},
        "budget": {"trials": 3},
        "sampler": {"name": "random", "seed": 0},
        "pruner": {"name": "none"},
        "study_name": "study",
    }
    sweep.update(sections)
    return sweep


def write(tmp_path: Path, sweep: dict, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def trial_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("trial ")]


@pytest.mark.slow
def test_sweep_prints_each_trial_continues_the_study_and_writes_a_trainable_best_config(dataset, tmp_path, capsys):
    path = write(tmp_path, pretrain_sweep(dataset, tmp_path))
    assert cli.main(["sweep", "--config", str(path)]) == 0
    lines = trial_lines(capsys.readouterr().out)
    assert len(lines) == 3 and lines[0].startswith("trial 0 (default): lr=0.001, objective=bc -> ")
    assert all(" -> " in line and "failed" not in line and "pruned" not in line for line in lines), lines

    # A rerun continues the same study: more trials, none repeated.
    assert cli.main(["sweep", "--config", str(path), "sweep.budget.trials=2"]) == 0
    output = capsys.readouterr().out
    assert [line.split(":")[0] for line in trial_lines(output)][:2] == ["trial 3", "trial 4"]
    study = load_study(tmp_path / "runs" / "study")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5
    params = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(set(params)) == 5
    for trial in study.trials:  # the conditional key only where its condition holds
        assert ("distill_temperature" in trial.params) == (trial.params["objective"] == "distill")
        run_dir = Path(trial.user_attrs["run_dir"])
        assert (
            run_dir == tmp_path / "runs" / "study" / f"trial_{trial.number:04d}"
            and (run_dir / "metrics.jsonl").is_file()
        )
        assert trial.user_attrs["metrics"]["eval/nll"] == trial.value

    # A rerun with another base config would mix incomparable trials: refused, naming the keys.
    assert cli.main(["sweep", "--config", str(path), "steps=7"]) == 2
    assert "was run with another base config: steps differ" in capsys.readouterr().err

    # The summary: best trials, importances, best_config.yaml that `chessgrpo train --config` accepts.
    best = tmp_path / "runs" / "study" / "best_config.yaml"
    assert "parameter importances (PED-ANOVA): " in output and best.is_file()
    best.unlink()
    assert cli.main(["sweep", "--summary", str(tmp_path / "runs" / "study")]) == 0
    output = capsys.readouterr().out
    assert "study study: 5 trials (5 complete)" in output and f"best config: {best}" in output
    config = load_config(PretrainTrainConfig, best)
    winner = min(study.trials, key=lambda t: t.value)
    assert config.lr == pytest.approx(winner.params["lr"]) and config.objective == winner.params["objective"]
    assert config.run.name == "study_best" and config.run.out_dir == str(tmp_path / "runs")
    assert cli.main(["train", "--config", str(best)]) == 0
    assert (tmp_path / "runs" / "study_best" / "checkpoints" / "latest").exists()

    # The HTML report of a study: the history and importance figure, default vs best trial.
    assert cli.main(["report", str(tmp_path / "runs" / "study")]) == 0
    report = (tmp_path / "runs" / "study" / "report.html").read_text()
    assert "optimisation history and parameter importances" in report and "trial_0000" in report
    assert (tmp_path / "runs" / "study" / "report" / "study.png").is_file()


def test_pruned_and_diverging_trials_are_recorded_with_their_reason(dataset, tmp_path, capsys):
    # Every nll is above 0: the threshold pruner stops each trial at its first evaluation after step 0.
    pruned = write(
        tmp_path,
        pretrain_sweep(
            dataset, tmp_path, study_name="pruned", budget={"trials": 2}, pruner={"name": "threshold", "upper": 0.0}
        ),
        "pruned.yaml",
    )
    assert cli.main(["sweep", "--config", str(pruned)]) == 0
    lines = trial_lines(capsys.readouterr().out)
    assert len(lines) == 2 and all(" -> pruned at step 3: eval/nll " in line for line in lines), lines
    study = load_study(tmp_path / "runs" / "pruned")
    assert [t.state for t in study.trials] == [TrialState.PRUNED] * 2
    assert all(t.user_attrs["steps"] == 3 and sorted(t.intermediate_values) == [3] for t in study.trials)

    # A learning rate of 1e25 diverges: the spine rolls back, gives up, and the trial is FAILED with the reason.
    diverging = pretrain_sweep(
        dataset,
        tmp_path,
        study_name="diverging",
        enqueue_default=False,
        budget={"trials": 4, "max_failures_in_a_row": 2},
    )
    diverging["space"] = {"lr": [1e25, 1e26]}
    path = write(tmp_path, diverging, "diverging.yaml")
    assert (
        cli.main(["sweep", "--config", str(path), "divergence.max_rollbacks=0", "divergence.max_consecutive_skips=1"])
        == 0
    )
    output = capsys.readouterr().out
    lines = trial_lines(output)
    assert len(lines) == 2 and all(
        "-> failed: TrainingDiverged: training diverged at step" in line for line in lines
    ), lines
    assert "stopped: 2 trials failed in a row" in output
    study = load_study(tmp_path / "runs" / "diverging")
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 2
    for trial in study.trials:
        assert trial.user_attrs["fail_reason"].startswith("TrainingDiverged")
        assert any(event.startswith("diverged: ") for event in trial.user_attrs["health"])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"budgets": {"trials": 2}}, "unknown config key budgets"),
        (
            {"space": {"lrr": {"type": "float", "low": 1e-4, "high": 1e-2}}},
            "space lrr: unknown config key of PretrainTrainConfig",
        ),
        ({"space": {"model.depth": [1, 2]}}, "space model.depth: unknown config key under model"),
        ({"space": {"lr": {"type": "float", "low": 1e-2, "high": 1e-4}}}, "space.lr: need low < high"),
        (
            {"space": {"lr": {"type": "float", "low": -1.0, "high": 1e-2}}},
            "space lr = -1.0: config key lr must be a finite number > 0",
        ),
        (
            {"space": {"lr": {"low": 1e-4, "high": 1e-2}}},
            "space.lr: expected a mapping with type: float | int | categorical",
        ),
        (
            {"space": {"batch_size": {"type": "float", "low": 8, "high": 64}}},
            "space batch_size = 8.0: config key batch_size: expected an integer",
        ),
        (
            {"space": {"lr": {"type": "float", "low": 1e-2, "high": 1e-1}}},
            "space lr: the base config's value 0.001 is outside the space",
        ),
        (
            {"objective": {"metric": "loss/train", "direction": "minimize"}},
            "objective.metric must be a held-out evaluation metric",
        ),
        ({"objective": {"metric": "eval/nll"}}, "objective.direction is required"),
        ({"pruner": {"name": "hyperband"}}, "config key pruner.name: 'hyperband' is not one of"),
        ({"overrides": {"stepz": 3}}, "sweep overrides: stepz: unknown config key"),
        ({"base": "missing.yaml"}, "sweep key base: config file 'missing.yaml' does not exist"),
    ],
)
def test_bad_sweep_keys_give_one_clear_error(dataset, tmp_path, capsys, change, message):
    path = write(tmp_path, pretrain_sweep(dataset, tmp_path, **change))
    assert cli.main(["sweep", "--config", str(path)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and message in error, error
    assert not (tmp_path / "runs").exists()  # nothing ran, nothing was written


def test_shipped_sweep_config_resolves_against_grpo_tiny():
    path = ROOT / "configs" / "sweep_tiny.yaml"
    sweep = load_sweep(path, ["run.out_dir=/tmp/elsewhere", "sweep.budget.trials=2"])
    assert sweep.kind == "move_group" and sweep.study_name == "sweep_tiny" and sweep.config.budget.trials == 2
    # The study's own keys need no prefix (no run config has them); a run key still goes to the runs.
    plain = load_sweep(path, ["run.out_dir=/tmp/elsewhere", "budget.trials=3", "parallel=2"])
    assert (plain.config.budget.trials, plain.config.parallel) == (3, 2) and plain.study_dir == sweep.study_dir
    from chessgrpo.train.config import TrainConfig

    assert not {f.name for f in dataclasses.fields(SweepConfig)} & {f.name for f in dataclasses.fields(TrainConfig)}
    assert (
        sweep.study_dir == Path("/tmp/elsewhere/sweep_tiny")
        and sweep.storage == "sqlite:////tmp/elsewhere/sweep_tiny/study.db"
    )
    assert sweep.default_params == {"lr": 3e-4, "grpo.kl_coef": 0.02, "task.temperature": 1.0, "task.group_size": 8}
    assert (
        sweep.base_config.init_checkpoint == "runs/quickstart/pretrain" and sweep.base_config.eval.max_positions == 300
    )
    for line in path.read_text().splitlines():  # every key is commented, like the other shipped configs
        if line.strip() and not line.lstrip().startswith("#") and not line.rstrip().endswith(":"):
            assert "#" in line, f"undocumented line: {line!r}"
    assert resolve_sweep(load_config(SweepConfig, path), path).study_name == "sweep_tiny"


def test_change_objective_has_a_paired_interval_and_remeasure_uses_unseen_items(dataset, tmp_path, capsys):
    """Two tiny GRPO trials scored by the paired change of puzzle accuracy; then best vs default on unseen items."""
    sweep = {
        "base": str(ROOT / "configs" / "grpo_tiny.yaml"),
        "overrides": {
            "run.out_dir": str(tmp_path / "runs"),
            "init_checkpoint": None,
            "positions": "random:64",
            "position_mixture": [],
            "eval.positions": None,
            "eval.puzzles": str(data_file("lichess_puzzles_dev.csv")),
            "eval.max_puzzles": 16,
            "task.positions_per_step": 4,
            "task.group_size": 4,
            "task.reward_nodes": 30,
            "task.best_move_values": False,
            "grpo.minibatch_size": 8,
            "engine.processes": 1,
            "engine.cache_path": str(tmp_path / "cache.sqlite"),
            "threads": 1,
            "warmup_steps": 0,
            "steps": 2,
            "eval_every": 1,
            "checkpoint_every": 0,
            **{key: yaml.safe_load(value) for key, value in (o.split("=", 1) for o in NO_LABELLED_LOSSES)},
        },
        "space": {"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
        "objective": {"metric": "eval/puzzle_first_move_accuracy", "measure": "change", "direction": "maximize"},
        "budget": {"trials": 2},
        "sampler": {"name": "random", "seed": 3},
        "study_name": "grpo",
    }
    assert cli.main(["sweep", "--config", str(write(tmp_path, sweep))]) == 0
    lines = trial_lines(capsys.readouterr().out)
    assert len(lines) == 2 and all("[" in line for line in lines), lines  # value [paired interval]
    study = load_study(tmp_path / "runs" / "grpo")
    for trial in study.trials:
        assert trial.state == TrialState.COMPLETE and trial.user_attrs["paired_items"] == 16
        low, high = trial.user_attrs["interval"]
        assert low <= trial.value <= high
        assert trial.value == pytest.approx(
            trial.user_attrs["metrics"]["eval/puzzle_first_move_accuracy"] - trial.user_attrs["start_value"]
        )

    summary = summarize(study)
    # Either may win on 16 puzzles: re-measure the non-default trial by number (what --remeasure-trial does).
    other = next(t for t in summary.trials if not t.default)
    with pytest.raises(ValueError, match="chosen trial is the default trial"):
        remeasure(summary, positions=str(dataset), trial=summary.default.number)
    result = remeasure(summary, positions=str(dataset), max_items=20, trial=other.number)
    kinds = [c.kind for c in result.comparisons]
    assert kinds == ["offline", "puzzles"]
    offline, puzzles = result.comparisons
    assert offline.n == 16  # the dataset's test split: given explicitly, so none excluded
    assert puzzles.n == 20 and "16 seen excluded" in result.notes[1]
    seen = {
        r["id"]
        for path in (tmp_path / "runs" / "grpo").glob("trial_*/eval/step_*_puzzles.json")
        for r in json.loads(path.read_text())["records"]["player"]
    }
    remeasured = json.loads(next((tmp_path / "runs" / "grpo" / "remeasure").glob("trial_*_puzzles.json")).read_text())
    assert not seen & {r["id"] for r in remeasured["records"]["player"]}
    assert json.loads(result.path.read_text())["best"] == other.number


@pytest.mark.slow
def test_parallel_workers_divide_the_cores(dataset, tmp_path, capfd):
    path = write(tmp_path, pretrain_sweep(dataset, tmp_path, parallel=2, budget={"trials": 2}, study_name="parallel"))
    assert cli.main(["sweep", "--config", str(path)]) == 0
    assert len(trial_lines(capfd.readouterr().out)) == 2  # printed by the two worker processes
    study = optuna.load_study(study_name="parallel", storage=f"sqlite:///{tmp_path / 'runs' / 'parallel' / 'study.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    share = max(1, available_cores() // 2)
    for trial in study.trials:
        run_config = yaml.safe_load((Path(trial.user_attrs["run_dir"]) / "config.yaml").read_text())
        assert run_config["threads"] == share
        assert trial.user_attrs["config"]["threads"] == 1  # the portable config keeps the base's own value
