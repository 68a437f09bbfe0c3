"""An evaluation added as one module and one registry entry runs everywhere evaluations run, with no other edit:
`chessgrpo eval <name>` runs it and writes its result file through the one writer, a training run's held-out
evaluation runs it when its config lists it in ``eval.extra``, `chessgrpo sweep` searches on it (its trials evaluate
it, the objective is its paired change from the run's step files), and the readers (run data, diagnose, `eval compare`) report its metric.

The evaluation is real: the share of random-playout positions where the player's move is a capture, with a Wilson
interval and one record per position; the player is a tiny real policy (a checkpoint, or a training run's policy
in memory) or the random baseline; the training run's rewards come from real Stockfish at 50 nodes.
"""

from __future__ import annotations

import json

import pytest

from chessgrpo.config import ConfigError, load_config
from chessgrpo.eval.registry import EVALUATIONS, register, unregister
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from chessgrpo.tasks.kinds.move_group import MoveGroupTrainConfig
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import TINY_MOVE_GROUP_RUN, importable_module

PLUGIN = '''
"""captures: how often the player's move captures, on random-playout positions (one record per position)."""

from __future__ import annotations

import dataclasses
import random

import chess

from chessgrpo.eval.registry import Evaluation, HeldOutMetric, PairedMetric
from chessgrpo.eval.running import EvalContext, Subject, interval_metrics, policy_player
from chessgrpo.stats import wilson_interval


@dataclasses.dataclass
class CaptureConfig:
    positions: int = 24
    """Positions from seeded random playouts (the same ones at every evaluation of one seed)."""
    seed: int = 0
    output: str | None = None
    """Write the result here (`chessgrpo eval captures ... output=FILE`)."""


def playout_positions(count: int, seed: int) -> list[chess.Board]:
    rng = random.Random(seed)
    boards: list[chess.Board] = []
    while len(boards) < count:
        board = chess.Board()
        for _ in range(rng.randrange(8, 60)):
            moves = list(board.legal_moves)
            if not moves:
                break
            board.push(rng.choice(moves))
        if any(board.legal_moves) and board.fen() not in {b.fen() for b in boards}:
            boards.append(board.copy(stack=False))
    return boards


@dataclasses.dataclass
class CaptureResult:
    config: CaptureConfig
    player: str
    records: list[dict]

    @property
    def capture_rate(self):
        return wilson_interval(int(sum(r["capture"] for r in self.records)), len(self.records))

    def to_json(self) -> dict:
        return {"player": self.player, "capture_rate": self.capture_rate.to_json(), "records": {"player": self.records}}

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        return interval_metrics({"capture_rate": self.capture_rate}, prefix)


def run_captures(config: CaptureConfig, subject: Subject, context: EvalContext) -> CaptureResult:
    boards = context.items.get("captures")
    if boards is None:
        boards = context.items["captures"] = playout_positions(config.positions, config.seed)
    if subject.policy is not None:
        from chessgrpo.play.players import RandomPlayer

        player = RandomPlayer(config.seed)
    else:
        player = policy_player(subject)
    moves = player.choose_moves(boards)
    records = [{"fen": b.fen(), "move": m.uci(), "capture": float(b.is_capture(m))} for b, m in zip(boards, moves)]
    return CaptureResult(config, subject.label, records)


CAPTURES = Evaluation(
    name="captures",
    command="chessgrpo eval captures",
    item_key="fen",
    record_marker="capture",
    records_label="captures",
    paired=(PairedMetric("capture_rate", "capture", True),),
    held_out=(HeldOutMetric("capture_rate", "capture_rate", "capture", True, "fraction of positions"),),
    summary_marker="capture_rate",
    config=CaptureConfig,
    runner=run_captures,
)
'''

TRAINING = [*TINY_MOVE_GROUP_RUN, "eval_every=1"]


@pytest.fixture
def captures(tmp_path, monkeypatch):
    """The plugin module, written and imported as a user's module, its entry registered for one test."""
    (tmp_path / "plugin").mkdir()
    for module in importable_module(tmp_path / "plugin", monkeypatch, "capture_eval", PLUGIN):
        register(module.CAPTURES)
        try:
            yield module.CAPTURES
        finally:
            unregister("captures")


@pytest.fixture
def policy(tmp_path):
    return save_policy(ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2)), tmp_path / "policy")


def _trained_run(tmp_path) -> tuple:
    overrides = [*TRAINING, "eval.extra.captures.positions=16", f"run.out_dir={tmp_path}", "run.name=run"]
    config = load_config(MoveGroupTrainConfig, None, overrides)
    with Trainer(config) as trainer:
        trainer.train()
    run = tmp_path / "run"
    return run, read_metrics(run / "metrics.jsonl")


def test_the_cli_runs_a_registered_evaluation_and_writes_through_the_one_writer(tmp_path, cli, captures, policy):
    (tmp_path / "plugin_out").mkdir()
    out = tmp_path / "plugin_out" / "policy.json"
    code, stdout, _ = cli.main("eval", "captures", "--checkpoint", str(policy), "positions=12", f"output={out}")
    assert code == 0 and "capture_rate" in stdout
    saved = json.loads(out.read_text())
    # The writer's layout: the config it ran with, then the summary and the records.
    assert list(saved)[:2] == ["config", "player"] and saved["config"] == {
        "positions": 12,
        "seed": 0,
        "output": str(out),
    }
    assert saved["player"] == str(policy) and saved["capture_rate"]["n"] == 12 and len(saved["records"]["player"]) == 12

    code, stdout, _ = cli.main("eval", "captures", "--policy", "random", "positions=12", "--json")
    summary = json.loads(stdout)
    assert (
        code == 0 and summary["player"] == "random" and "records" not in summary and summary["capture_rate"]["n"] == 12
    )

    # A config key the evaluation does not have is the user's error: one line, exit 2.
    code, _, err = cli.main("eval", "captures", "--policy", "random", "position=3")
    assert code == 2 and "position" in err


def test_a_training_run_evaluates_it_from_eval_extra_and_the_readers_report_it(tmp_path, cli, captures):
    run, rows = _trained_run(tmp_path)
    evals = [row for row in rows if "eval/capture_rate" in row]
    assert [row["step"] for row in evals] == [0, 1, 2]
    assert all(
        row["eval/capture_rate_low"] <= row["eval/capture_rate"] <= row["eval/capture_rate_high"] for row in evals
    )
    files = captures.step_files(run / "eval")
    assert [path.name for path in files] == [f"step_00000{step}_captures.json" for step in (0, 1, 2)]
    first = json.loads(files[0].read_text())
    assert first["config"]["positions"] == 16 and first["step"] == 0 and first["player"] == f"{run} step 0"
    # The same positions at every evaluation (loaded once), so the steps pair item by item.
    fens = [[record["fen"] for record in json.loads(path.read_text())["records"]["player"]] for path in files]
    assert len(fens[0]) == 16 and fens[0] == fens[1] == fens[2]

    # eval compare recognises the files by their records and prints the entry's paired metric.
    code, out, _ = cli.main("eval", "compare", str(files[0]), str(files[-1]), "--json")
    comparison = json.loads(out)
    assert code == 0 and comparison["kind"] == "captures" and comparison["n"] == 16
    assert list(comparison["metrics"]) == ["capture_rate"]

    # Run data reads its metric rows and step files (n, records); diagnose pairs its change.
    from chessgrpo.track.diagnose import Thresholds
    from chessgrpo.track.diagnose.changes import heldout_change
    from chessgrpo.track.run_data import load_run

    data = load_run(run)
    assert [point.step for point in data.evals] == [0, 1, 2]
    assert all(point.metrics["capture_rate"].n == 16 and len(point.records["captures"]) == 16 for point in data.evals)
    change = heldout_change(data, "capture_rate", data.evals[0], data.evals[-1], Thresholds())
    assert change is not None and change.paired

    # The sweep objective eval/capture_rate (measure: change) gets the paired interval from the step files.
    from chessgrpo.sweep.study import paired_change

    paired = paired_change(run, "eval/capture_rate", 0, 2)
    assert paired is not None and paired[1] == 16
    assert paired[0].value == pytest.approx(evals[-1]["eval/capture_rate"] - evals[0]["eval/capture_rate"])

    # A standalone result in the run's eval/ directory is read back as one, beside its baselines' absence.
    code, _, _ = cli.main("eval", "captures", "--policy", "random", f"output={run / 'eval' / 'captures_random.json'}")
    (standalone,) = load_run(run).standalone
    assert code == 0 and standalone.kind == "captures" and standalone.player["capture_rate"].n == 24


def test_a_sweep_searches_on_it_through_the_trials_eval_extra(tmp_path, cli, captures):
    """`chessgrpo sweep` with the plugin's metric as its objective: each trial's run evaluates it (eval.extra) at
    steps 0 and 2, and the objective is its paired change, as for a built-in evaluation."""
    import yaml
    from optuna.trial import TrialState

    from chessgrpo.sweep.summary import load_study

    # The training runs' overrides as typed YAML values (null, 4, 1e-3, false).
    base = {key: yaml.safe_load(value) for key, value in (override.split("=", 1) for override in TRAINING)}
    sweep = {
        "base": {"kind": "move_group", "run": {"out_dir": str(tmp_path / "runs")}},
        "overrides": {**base, "eval_every": 2, "eval_at_start": True, "eval.extra": {"captures": {"positions": 16}}},
        "space": {"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
        "objective": {"metric": "eval/capture_rate", "measure": "change", "direction": "maximize"},
        "budget": {"trials": 2},
        "sampler": {"name": "random", "seed": 0},
        "pruner": {"name": "none"},
        "study_name": "captures",
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    code, _, err = cli.main("sweep", "--config", str(path))
    assert code == 0, err
    study = load_study(tmp_path / "runs" / "captures")
    assert [trial.state for trial in study.trials] == [TrialState.COMPLETE] * 2
    for trial in study.trials:
        run = tmp_path / "runs" / "captures" / f"trial_{trial.number:04d}"
        first, last = (json.loads(path.read_text()) for path in captures.step_files(run / "eval"))
        # The objective is the paired change of the plugin's metric between the trial's steps 0 and 2.
        change = last["capture_rate"]["value"] - first["capture_rate"]["value"]
        assert (first["step"], last["step"]) == (0, 2) and trial.value == pytest.approx(change)


def test_eval_extra_names_registered_evaluations_only(captures):
    base = TRAINING
    with pytest.raises(ConfigError, match="eval.extra: 'nope' is not a registered evaluation .*captures\\)"):
        load_config(MoveGroupTrainConfig, None, [*base, "eval.extra=[nope]"])
    with pytest.raises(ConfigError, match="eval.extra: 'games' is not a registered evaluation a training run can run"):
        load_config(MoveGroupTrainConfig, None, [*base, "eval.extra=[games]"])
    with pytest.raises(ConfigError, match="eval.extra.captures.depth"):
        load_config(MoveGroupTrainConfig, None, [*base, "eval.extra.captures.depth=3"])
    config = load_config(MoveGroupTrainConfig, None, [*base, "eval.extra=[captures]"])
    assert config.eval.extra == ["captures"]


def test_the_built_in_evaluations_run_through_the_registry():
    runnable = [e.name for e in EVALUATIONS.values() if e.runnable]
    assert runnable == ["offline", "puzzles", "endgame", "lm", "games", "epd", "value"]
    assert EVALUATIONS["endgame"].config_class().__name__ == "EndgameEvalConfig"
