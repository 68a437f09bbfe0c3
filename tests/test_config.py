"""Typed configs: files, overrides, unknown keys and wrong types are errors naming the key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from chessgrpo.config import ConfigError, EngineConfig, EngineEvalConfig, load_config, save_config, to_dict

REPO = Path(__file__).resolve().parents[1]


def test_defaults_without_file_or_overrides():
    config = load_config(EngineEvalConfig)
    assert config == EngineEvalConfig()
    assert config.engine.nodes == 10_000 and config.engine.threads == 1


def test_file_then_overrides_with_types(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("engine:\n  nodes: 5000\n  cache: false\nrandom_positions: 7\n")
    config = load_config(
        EngineEvalConfig, path, ["engine.nodes=123", "engine.depth=null", "engine.timeout_s=5", "run.name=123"]
    )
    assert config.engine.nodes == 123
    assert config.engine.cache is False
    assert config.engine.depth is None
    assert config.engine.timeout_s == 5.0 and isinstance(config.engine.timeout_s, float)
    assert config.run.name == "123"  # a string key stays a string even when it looks like a number
    assert config.random_positions == 7


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("engine.nodez=5", "engine.nodez"),
        ("engin.nodes=5", "engin"),
        ("engine.nodes=lots", "engine.nodes"),
        ("engine.nodes=1.5", "engine.nodes"),
        ("engine.cache=3", "engine.cache"),
        ("engine.threads=null", "engine.threads"),
        ("random_positions.x=1", "random_positions"),
        ("nodes", "nodes"),
    ],
)
def test_bad_overrides_name_the_key(override, named):
    with pytest.raises(ConfigError) as raised:
        load_config(EngineEvalConfig, None, [override])
    assert named in str(raised.value)


def test_unknown_key_in_file_names_the_dotted_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("engine:\n  nodes: 5000\n  hash: 64\n")
    with pytest.raises(ConfigError, match=r"engine\.hash"):
        load_config(EngineEvalConfig, path)


def test_wrong_type_in_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("engine: [1, 2]\n")
    with pytest.raises(ConfigError, match="engine"):
        load_config(EngineEvalConfig, path)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(EngineEvalConfig, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: {nodes: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(EngineEvalConfig, bad)


def test_saved_config_loads_back_identically(tmp_path):
    config = load_config(EngineEvalConfig, None, ["engine.nodes=777", "run.seed=3"])
    path = save_config(config, tmp_path / "run" / "config.yaml")
    assert yaml.safe_load(path.read_text())["engine"]["nodes"] == 777
    assert load_config(EngineEvalConfig, path) == config


def test_every_engine_key_is_documented_in_the_shipped_file():
    text = (REPO / "configs" / "engine_eval.yaml").read_text()
    for field in dataclasses.fields(EngineConfig):
        assert f"  {field.name}:" in text, field.name
    assert set(to_dict(EngineConfig())) == {f.name for f in dataclasses.fields(EngineConfig)}


def test_overriding_one_nested_key_keeps_the_parents_defaults_for_the_others():
    config = load_config(EngineEvalConfig, None, ["run.out_dir=/tmp/elsewhere"])
    assert config.run.name == "engine_eval"  # set by EngineEvalConfig's default_factory, not RunConfig's
    assert config.run.out_dir == "/tmp/elsewhere"


def test_scientific_notation_without_a_dot_is_a_number(tmp_path):
    # YAML 1.1 reads 3e-4 as a string; a learning rate written that way must still load as 0.0003.
    from chessgrpo.tasks.kinds.pretrain import PretrainTrainConfig

    assert load_config(PretrainTrainConfig, None, ["lr=3e-4"]).lr == pytest.approx(3e-4)
    path = tmp_path / "c.yaml"
    path.write_text("lr: 2E-3\n")
    assert load_config(PretrainTrainConfig, path).lr == pytest.approx(2e-3)
    with pytest.raises(ConfigError, match="lr"):
        load_config(PretrainTrainConfig, None, ["lr=fast"])


@pytest.mark.parametrize(
    ("path", "key", "rules"),
    [
        ("configs/grpo_tiny.yaml", "engine.nodes=5000", "task.reward_nodes"),
        ("configs/trajectory_stockfish_tiny.yaml", "engine.depth=3", "task.opponent_nodes"),
        ("configs/rookworld_grpo_tiny.yaml", "engine.nodes=5000", "rewards.policy.nodes"),
        ("configs/grpo_mixture_tiny.yaml", "engine.nodes=5000", "each task's own limit keys"),
    ],
)
def test_an_engine_limit_that_a_grpo_kind_ignores_is_an_error_naming_the_key_that_rules(path, key, rules):
    from chessgrpo.tasks.kinds import config_class

    kind = yaml.safe_load(Path(path).read_text())["kind"]
    with pytest.raises(ConfigError, match=rf"{key.split('=')[0]}: has no effect in this kind \(.*{re.escape(rules)}"):
        load_config(config_class(kind), path, [key])


def test_an_unknown_key_names_the_closest_valid_one(tmp_path):
    """A typo in an override or in the file gets "did you mean" the nearest key; nothing near gets no guess."""
    with pytest.raises(ConfigError, match=r"unknown config key engine\.nodez .*did you mean 'nodes'\?"):
        load_config(EngineEvalConfig, None, ["engine.nodez=5"])
    path = tmp_path / "typo.yaml"
    path.write_text("engine:\n  hash_mbb: 4\n")
    with pytest.raises(ConfigError, match=r"engine\.hash_mbb, did you mean 'hash_mb'\?"):
        load_config(EngineEvalConfig, path)
    with pytest.raises(ConfigError) as nothing_near:
        load_config(EngineEvalConfig, None, ["engine.zzzzzz=5"])
    assert "did you mean" not in str(nothing_near.value)


def test_train_help_lists_every_kind():
    import argparse

    from chessgrpo.commands import train
    from chessgrpo.tasks.kinds import KINDS

    commands = argparse.ArgumentParser().add_subparsers()
    train.add_parser(commands)
    helps = {action.dest: action.help for action in commands._choices_actions}
    assert all(kind in helps["train"] for kind in KINDS), helps["train"]
