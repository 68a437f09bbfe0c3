"""Every config under configs/ loads into its command's config class: no stale or misspelt keys ship.

Cross-cutting: configs/*.yaml against config.py and every command's config class (tasks/kinds/ and
the commands).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from chessgrpo.config import load_config
from chessgrpo.tasks.kinds import config_class as kind_config_class

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# Configs without a `kind` key, by file name: (module, class) of the command that reads them.
COMMAND_CLASSES: dict[str, tuple[str, str]] = {
    "data_tiny.yaml": ("chessgrpo.data.generate", "GenerateConfig"),
    "data.yaml": ("chessgrpo.data.generate", "GenerateConfig"),  # a recipe's data stage (configs/recipes/*/)
    "engine_eval.yaml": ("chessgrpo.config", "EngineEvalConfig"),
    "eval.yaml": ("chessgrpo.eval.standalone", "EvalConfig"),
    "games.yaml": ("chessgrpo.play.match", "GamesConfig"),
    "sweep_tiny.yaml": ("chessgrpo.sweep.config", "SweepConfig"),
}


def config_class(path: Path) -> type:
    """The class a shipped config file is read into (every training config by its `kind`)."""
    data = yaml.safe_load(path.read_text()) or {}
    if "kind" in data:
        return kind_config_class(data["kind"])
    if path.name not in COMMAND_CLASSES:
        raise AssertionError(f"{path.name}: add it to COMMAND_CLASSES in {Path(__file__).name}")
    module, name = COMMAND_CLASSES[path.name]
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("**/*.yaml")), ids=lambda p: str(p.relative_to(CONFIGS)))
def test_shipped_config_loads_into_its_class(path):
    cls = config_class(path)
    config = load_config(cls, path)  # raises ConfigError naming any unknown key or wrong type
    assert type(config) is cls


def test_every_recipe_has_its_three_stages_chained():
    """scripts/recipe.sh runs data, pretrain and grpo from a recipe folder: the pretraining reads the
    data stage's output, and GRPO starts from the pretraining run the script writes."""
    recipes = [p for p in (CONFIGS / "recipes").iterdir() if p.is_dir()]
    assert recipes
    for recipe in recipes:
        stages = {name: yaml.safe_load((recipe / f"{name}.yaml").read_text()) for name in ("data", "pretrain", "grpo")}
        assert stages["pretrain"]["data"] == stages["data"]["out"], recipe
        assert stages["grpo"]["init_checkpoint"] == f"runs/{recipe.name}/pretrain", recipe
        grpo = stages["grpo"]
        # A task mixture evaluates through the one task that holds held-out positions.
        evaluating = (
            [t["config"] for t in grpo["tasks"] if (t["config"].get("eval") or {}).get("positions")]
            if grpo.get("kind") == "mixture"
            else [grpo]
        )
        assert [c["eval"]["positions"] for c in evaluating] == [stages["data"]["out"]], recipe
