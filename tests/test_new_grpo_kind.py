"""The worked example of docs/training.md, "Writing a new GRPO kind", run as it is written, and the contract's edges.

The section's code blocks are written to the files their first lines name (the kind's module, the script that
registers and trains it, its two configs) and the script runs: the kind trains alone and as a task of a mixture
beside a move-group task, with a real tiny policy and real Stockfish at 50 nodes. Then the edges of the contract
(`train.kind.GRPOKind`): a kind without `rollout` cannot be built, a mixture takes any registered kind that follows
the contract (and names the ones it takes otherwise), and the example pipelines its steps through `sampler`.
"""

from __future__ import annotations

import math
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from chessgrpo.config import ConfigError, load_config
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from chessgrpo.tasks import kinds
from chessgrpo.train.kind import GRPOKind, RunContext
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import REPO_ROOT

HEADING = "## Writing a new GRPO kind"
BLOCK = re.compile(r"^```(python|yaml)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def section_blocks(text: str) -> dict[str, str]:
    """The code blocks under HEADING (up to the next ``## ``), by the file name their first line names
    (``# my_kinds.py: ...`` or ``# fen_moves.yaml``)."""
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    blocks: dict[str, str] = {}
    for _, body in BLOCK.findall(text[start : end if end != -1 else len(text)]):
        first = body.splitlines()[0]
        match = re.fullmatch(r"# ([\w.]+\.(?:py|yaml))(?::.*)?", first)
        assert match, f"a code block of {HEADING!r} does not name its file on its first line: {first!r}"
        blocks[match.group(1)] = body
    return blocks


@pytest.fixture
def example(tmp_path, monkeypatch):
    """The section's files in a fresh directory (the current one, on sys.path), a tiny starting policy where its
    configs look for it, and a registry of kinds that forgets the example afterwards."""
    blocks = section_blocks((REPO_ROOT / "docs" / "training.md").read_text())
    assert set(blocks) == {"my_kinds.py", "train_fen_moves.py", "fen_moves.yaml", "fen_moves_mixture.yaml"}
    for name, body in blocks.items():
        (tmp_path / name).write_text(body)
    torch.manual_seed(0)
    save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), tmp_path / "runs" / "pretrain_tiny")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_kinds", raising=False)
    yield tmp_path
    kinds.KINDS.pop("fen_moves", None)  # registered by the script (or the test)
    sys.modules.pop("my_kinds", None)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_the_documented_kind_trains_alone_and_as_a_mixture_task(example, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train_fen_moves.py", "steps=3", "threads=1", "engine.cache=false"])
    runpy.run_path(str(example / "train_fen_moves.py"), run_name="__main__")

    start = _weights(example / "runs" / "pretrain_tiny")
    for run in ("fen_moves", "mixture"):
        rows = read_metrics(example / "runs" / run / "metrics.jsonl")
        assert [row["step"] for row in rows] == [1, 2, 3], run
        for row in rows:
            for key in ("loss/total", "reward/mean", "grad_norm", "kl/exact", "entropy/mean"):
                assert math.isfinite(row[key]), (run, key, row[key])
            assert row["ratio/first_max_abs_dev"] < 1e-4  # the learner's forward recomputes the sampling log-probs
        trained = _weights(example / "runs" / run / "checkpoints" / "latest")
        assert trained.keys() == start.keys()
        assert any(not torch.equal(trained[key], start[key]) for key in start), f"{run}: the weights did not move"

    alone = read_metrics(example / "runs" / "fen_moves" / "metrics.jsonl")
    assert all(0.0 <= row["reward/win_prob"] <= 1.0 and row["reward/win_prob_std"] > 0 for row in alone)
    mixed = read_metrics(example / "runs" / "mixture" / "metrics.jsonl")
    for row in mixed:
        assert row["rollout/task/drills"] + row["rollout/task/one_move"] == pytest.approx(1.0)
    drew = [row for row in mixed if row["rollout/task/drills"] > 0]
    assert drew and all(0.0 <= row["reward/drills/win_prob"] <= 1.0 for row in drew)
    assert any("reward/one_move/win_prob" in row for row in mixed)


def test_the_documented_kind_pipelines_its_steps_and_checks_its_config(example):
    kinds.KINDS["fen_moves"] = "my_kinds:FenMovesKind"
    config_class = kinds.config_class("fen_moves")
    overrides = ["steps=3", "threads=1", "engine.cache=false", "grpo.pipeline=true", "run.name=piped"]
    with Trainer(load_config(config_class, example / "fen_moves.yaml", overrides)) as trainer:
        assert trainer.train().finished
    rows = read_metrics(example / "runs" / "piped" / "metrics.jsonl")
    # Steps after the first learn from a rollout sampled by the snapshot before the previous update.
    assert all(math.isfinite(row["loss/total"]) for row in rows) and "ratio/lag_first_max_abs_dev" in rows[-1]

    with pytest.raises(ConfigError, match=r"config key task\.fens: .*not-a-fen"):
        load_config(config_class, example / "fen_moves.yaml", ["task.fens=[not-a-fen]"])
    with pytest.raises(ConfigError, match=r"tasks\[0\]\.config\.task\.positions_per_step"):
        load_config(
            kinds.config_class("mixture"),
            example / "fen_moves_mixture.yaml",
            ["tasks.drills.config.task.positions_per_step=4"],
        )


def test_a_mixture_takes_any_registered_kind_that_follows_the_contract(example):
    mixture = kinds.config_class("mixture")
    with pytest.raises(
        ConfigError, match=r"tasks\[0\]\.kind must be one of \['move_group', 'rookworld', 'trajectory'\]"
    ):
        load_config(mixture, example / "fen_moves_mixture.yaml")  # fen_moves is not registered yet
    kinds.KINDS["fen_moves"] = "my_kinds:FenMovesKind"
    assert load_config(mixture, example / "fen_moves_mixture.yaml").tasks[0].kind == "fen_moves"
    with pytest.raises(
        ConfigError,
        match=r"tasks\[1\]\.kind must be one of \['fen_moves', 'move_group', 'rookworld', 'trajectory'\].*got 'pretrain'",
    ):
        load_config(mixture, example / "fen_moves_mixture.yaml", ["tasks.one_move.kind=pretrain"])


def test_a_grpo_kind_without_rollout_cannot_be_built(tmp_path):
    class Unfinished(GRPOKind):
        name = "unfinished"
        group_count_name = "task.positions_per_step"

        def group_count(self) -> int:
            return 1

    assert not Unfinished.can_be_task()
    with pytest.raises(TypeError, match="abstract method.*rollout"):
        Unfinished(None, RunContext(tmp_path, torch.device("cpu"), 0))
