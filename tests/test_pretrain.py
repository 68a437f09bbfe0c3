"""Pretraining (`kind: pretrain` on the training spine): targets and losses against hand-computed
numbers, the schedule, learning on a small engine-labelled dataset (both objectives), metrics rows,
the best checkpoint, the loop's freezing and divergence hooks, exact resume across processes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from chessgrpo.board import NUM_ACTIONS, move_to_action, random_playout_positions
from chessgrpo.config import RunConfig, load_config
from chessgrpo.data.schema import write_shard
from chessgrpo.engine import EnginePool
from chessgrpo.models.policy import ModelConfig, load_policy, log_probs
from chessgrpo.tasks.kinds import config_class
from chessgrpo.tasks.kinds.pretrain import PretrainKind, PretrainTrainConfig
from chessgrpo.tasks.supervised import best_move_nll, distill_targets, soft_cross_entropy
from chessgrpo.train.checkpoint import best_checkpoint, latest_checkpoint, list_checkpoints
from chessgrpo.train.dataset import BatchPrefetcher, EpochSampler, load_split
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import MetricsWriter, read_metrics
from chessgrpo.train.schedule import WarmupCosine

TRAIN_KEYS = {
    "step",
    "time",
    "loss/train",
    "train/top1",
    "train/top5",
    "train/perplexity",
    "entropy/mean",
    "entropy/ln_legal",
    "lr",
    "grad_norm",
    "perf/step_s",
    "perf/samples_per_s",
}
EVAL_KEYS = {"eval/loss", "eval/top1", "eval/top5", "eval/nll", "eval/perplexity", "eval/in_multipv"}


def _row(board, line_moves, line_wins, nodes):
    return dict(
        fen=board.fen(),
        source="random_playout",
        best_move=line_moves[0],
        best_action=move_to_action(line_moves[0]),
        moves=line_moves,
        win_probs=line_wins,
        value=line_wins[0],
        legal_moves=None,
        legal_win_probs=None,
        nodes=nodes,
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """80 random-playout positions labelled by real Stockfish (multipv 3): 64 train, 16 test."""
    boards = random_playout_positions(80, seed=7, max_plies=40)
    with EnginePool(processes=1, nodes=200, cache_path=None) as pool:
        analyses = pool.analyse_many(boards, multipv=3)
    rows = [
        _row(b, [line.move for line in a.lines], [line.win_probability for line in a.lines], 200)
        for b, a in zip(boards, analyses)
    ]
    directory = tmp_path_factory.mktemp("labelled")
    write_shard(rows[:64], directory / "train" / "shard-00000.parquet")
    write_shard(rows[64:], directory / "test" / "shard-00000.parquet")
    return directory


def _config(dataset, tmp_path, name="run", **overrides) -> PretrainTrainConfig:
    values = dict(
        data=str(dataset),
        batch_size=64,
        steps=40,
        lr=3e-3,
        warmup_steps=5,
        log_every=1,
        eval_every=20,
        checkpoint_every=20,
        threads=1,
    )
    values.update(overrides)
    return PretrainTrainConfig(run=RunConfig(name=name, out_dir=str(tmp_path)), **values)


def _train(config: PretrainTrainConfig):
    with Trainer(config) as trainer:
        assert isinstance(trainer.kind, PretrainKind)
        return trainer.train(), trainer.kind.summary()


# ------------------------------------------------------------------------------------------------
# Pure math


def test_distill_target_and_loss_by_hand():
    a, b, c = (move_to_action(m) for m in ("e2e4", "d2d4", "g1f3"))
    targets = distill_targets(torch.tensor([[a, b, -1]]), torch.tensor([[0.9, 0.5, 0.0]]), temperature=0.1)
    expected_a = math.exp(9) / (math.exp(9) + math.exp(5))  # softmax([0.9, 0.5] / 0.1) = [0.982, 0.018]
    assert targets[0, a].item() == pytest.approx(expected_a, abs=1e-6) and expected_a == pytest.approx(
        0.98201, abs=1e-5
    )
    assert targets[0, b].item() == pytest.approx(1 - expected_a, abs=1e-6)
    assert targets.sum().item() == pytest.approx(1.0) and int((targets > 0).sum()) == 2  # padding gets nothing

    logits = torch.zeros(1, NUM_ACTIONS)
    logits[0, a], logits[0, b], logits[0, c] = 2.0, 1.0, 0.0
    logits[0, 0] = 50.0  # illegal: must not matter
    mask = torch.zeros(1, NUM_ACTIONS, dtype=torch.bool)
    mask[0, [a, b, c]] = True
    logp = log_probs(logits, mask)
    log_z = math.log(math.exp(2) + math.exp(1) + 1)
    by_hand = -(expected_a * (2 - log_z) + (1 - expected_a) * (1 - log_z))
    loss = soft_cross_entropy(logp, targets)
    assert torch.isfinite(loss).all() and loss.item() == pytest.approx(by_hand, abs=1e-5)  # 0 * -inf counted as 0
    assert best_move_nll(logp, torch.tensor([a])).item() == pytest.approx(log_z - 2, abs=1e-6)
    # T -> 0 turns distillation into behaviour cloning.
    sharp = distill_targets(torch.tensor([[a, b, -1]]), torch.tensor([[0.9, 0.5, 0.0]]), temperature=1e-3)
    assert soft_cross_entropy(logp, sharp).item() == pytest.approx(log_z - 2, abs=1e-5)


def test_warmup_cosine_at_hand_picked_steps():
    schedule = WarmupCosine(base_lr=1.0, warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    expected = {
        0: 0.1,
        4: 0.5,
        9: 1.0,
        10: 1.0,
        35: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)),
        60: 0.55,
        110: 0.1,
        500: 0.1,
    }
    for step, value in expected.items():
        assert schedule.lr(step) == pytest.approx(value, abs=1e-12), step
    assert WarmupCosine(2.0, 0, 100, 0.0).lr(0) == 2.0  # no warmup starts at the peak
    assert WarmupCosine(2.0, 0, 100, 0.0).lr(50) == pytest.approx(1.0)


def test_epoch_sampler_covers_each_epoch_and_resumes_exactly():
    sampler = EpochSampler(10, 4, seed=3)
    drawn = torch.cat([sampler.next_indices() for _ in range(5)])  # 20 = two full epochs
    assert sorted(drawn[:10].tolist()) == list(range(10)) and sorted(drawn[10:].tolist()) == list(range(10))
    assert drawn[:10].tolist() != drawn[10:].tolist()  # a fresh permutation each epoch
    sampler = EpochSampler(10, 4, seed=3)
    sampler.next_indices(), sampler.next_indices(), sampler.next_indices()  # ends inside epoch 1
    resumed = EpochSampler.from_state(sampler.state_dict(), 10, 4, seed=3)
    assert [resumed.next_indices().tolist() for _ in range(3)] == [sampler.next_indices().tolist() for _ in range(3)]
    with pytest.raises(ValueError, match="dataset change"):
        EpochSampler.from_state(sampler.state_dict(), 11, 4, seed=3)


def test_metrics_writer_truncates_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as writer:
        for step in (1, 2, 3, 4):
            writer.log(step, {"loss/train": float(step), "lr": torch.tensor(0.5)})
    with path.open("a") as handle:
        handle.write('{"step": 5, "loss/tr')  # torn last line of a killed process
    with MetricsWriter(path, resume_step=2) as writer:
        writer.log(3, {"loss/train": 30.0})
    rows = read_metrics(path)
    assert [(r["step"], r["loss/train"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert rows[0]["lr"] == 0.5 and isinstance(rows[0]["time"], float)


# ------------------------------------------------------------------------------------------------
# Data


def test_dataset_rejects_a_mislabelled_row(dataset, tmp_path):
    data = load_split(dataset, "train")
    assert data.tokens.shape == (64, 77) and data.tokens.dtype == torch.uint8 and data.actions.shape[1] == 3
    batch = data.batch(torch.arange(4))
    assert batch.legal_mask[torch.arange(4), batch.best_action].all()
    bad = _row(random_playout_positions(1, seed=1)[0], ["e7e5"], [0.5], 1)  # a move for the wrong side
    bad["fen"] = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    write_shard([bad], tmp_path / "bad" / "train" / "shard-00000.parquet")
    with pytest.raises(ValueError, match=r"row 0 .*'e7e5' is not legal"):
        load_split(tmp_path / "bad", "train")


# ------------------------------------------------------------------------------------------------
# Training


def test_registered_as_the_pretrain_kind():
    assert config_class("pretrain") is PretrainTrainConfig
    config = PretrainTrainConfig()
    assert (config.kind, config.run.name, config.steps, config.lr, config.eval_at_start) == (
        "pretrain",
        "pretrain",
        1000,
        1e-3,
        False,
    )
    assert config.best_metric() == ("eval/nll", "min")


@pytest.mark.parametrize("objective", ["bc", "distill"])
def test_learns_on_a_small_dataset(dataset, tmp_path, objective):
    result, summary = _train(_config(dataset, tmp_path, objective=objective, distill_temperature=0.05))
    assert result.finished and result.step == 40 and result.stop_reason is None
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 41))
    first, last = rows[:5], rows[-5:]
    mean = lambda rs, key: sum(r[key] for r in rs) / len(rs)
    assert mean(last, "loss/train") < 0.7 * mean(first, "loss/train")
    assert mean(last, "train/top1") > mean(first, "train/top1") + 0.25
    assert mean(last, "entropy/mean") < mean(first, "entropy/mean")
    for row in rows:
        assert TRAIN_KEYS <= set(row), TRAIN_KEYS - set(row)
        assert row["entropy/mean"] <= row["entropy/ln_legal"] + 1e-4  # entropy never exceeds ln(#legal)
    assert EVAL_KEYS <= set(rows[19]) and EVAL_KEYS <= set(rows[39]) and not EVAL_KEYS & set(rows[20])
    assert {k: result.eval_metrics[k] for k in EVAL_KEYS} == {k: rows[39][k] for k in EVAL_KEYS}
    assert rows[0]["lr"] == pytest.approx(3e-3 / 5) and rows[4]["lr"] == pytest.approx(3e-3)
    for row in rows:  # log_every=1: the throughput is the batch over that step's time
        assert row["perf/samples_per_s"] == pytest.approx(64 / row["perf/step_s"], rel=1e-6)
    # checkpoints/best is the evaluation with the lowest held-out best-move nll.
    best_step = min((19, 39), key=lambda i: rows[i]["eval/nll"]) + 1
    assert result.best_checkpoint is not None and result.best_checkpoint.name == f"step_{best_step:06d}"
    assert f"{objective} on {dataset}, model tiny" in summary[0] and "samples/s" in summary[0]
    assert summary[1].startswith("held-out (16 positions): top-1")
    # The loop optimises the chosen objective: bc's loss is the best-move nll, distill's is not.
    # (Compared on the last row: at initialisation both are close to ln(#legal).)
    nll = math.log(rows[-1]["train/perplexity"])
    if objective == "bc":
        assert rows[-1]["loss/train"] == pytest.approx(nll, rel=1e-5)
    else:
        assert abs(rows[-1]["loss/train"] - nll) > 1e-3


def test_freeze_layers_and_head_lr(dataset, tmp_path):
    """The loop's shared knobs reach the policy: frozen embeddings and first block stay put; the head has its own rate."""
    config = _config(dataset, tmp_path, steps=3, warmup_steps=0, eval_every=0, freeze_layers=1, head_lr=1e-2)
    with Trainer(config) as trainer:
        model = trainer.kind.model
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        trainer.train()
        frozen = {id(p) for p in trainer.kind.frozen_parameters(1)}
        head = {id(p) for p in model.head.parameters()}
        lrs = {g["head"]: g["lr"] for g in trainer.optimizer.param_groups}
    unchanged = {name for name, param in model.named_parameters() if torch.equal(param, before[name])}
    assert {name for name, param in model.named_parameters() if id(param) in frozen} <= unchanged
    assert not any(name.startswith("blocks.1.") for name in unchanged)  # the second block trains
    assert frozen and head and not head & frozen and lrs[True] == pytest.approx(lrs[False] * 1e-2 / 3e-3)


def test_nonfinite_step_is_skipped_and_training_goes_on(dataset, tmp_path):
    config = _config(dataset, tmp_path, steps=5, eval_every=0, checkpoint_every=0)
    config.debug.nonfinite_at_step = 3
    with Trainer(config) as trainer:
        result = trainer.train()
        assert all(torch.isfinite(p).all() for p in trainer.kind.model.parameters())
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert result.finished and [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[2].get("health/nonfinite_skip") == 1.0 and "loss/train" not in rows[2]
    assert all("loss/train" in r for i, r in enumerate(rows) if i != 2)
    assert "nonfinite_skip" in (tmp_path / "run" / "events.jsonl").read_text()


def test_dataset_without_a_test_split_trains_without_evaluation(dataset, tmp_path):
    data = tmp_path / "train_only" / "train"
    data.mkdir(parents=True)
    (data / "shard-00000.parquet").write_bytes((Path(dataset) / "train" / "shard-00000.parquet").read_bytes())
    result, summary = _train(_config(tmp_path / "train_only", tmp_path, steps=4, eval_every=2, eval_at_start=True))
    assert result.finished and result.eval_metrics is None and result.best_checkpoint is None
    assert not any(k.startswith("eval/") for r in read_metrics(tmp_path / "run" / "metrics.jsonl") for k in r)
    assert summary[-1] == "held-out: the dataset has no test split"


@pytest.mark.slow
def test_resume_is_bitwise_exact_across_processes(cli, dataset, tmp_path):
    common = [
        f"data={dataset}",
        f"run.out_dir={tmp_path}",
        "steps=12",
        "batch_size=48",
        "lr=0.003",
        "warmup_steps=3",
        "log_every=2",
        "eval_every=5",
        "checkpoint_every=3",
        "keep_checkpoints=2",
        "threads=1",
        "model.dropout=0.1",
    ]
    # Straight run (in this process, through the real CLI entry point).
    assert cli.main("pretrain", *common, "run.name=straight")[0] == 0
    # The same run in two invocations: stopped at step 7 (between checkpoints and log rows), then resumed.
    first = cli.run("pretrain", *common, "run.name=halves", "stop_at=7")
    assert first.returncode == 0, first.stderr
    assert "continue with: chessgrpo train --resume" in first.stdout
    halves = tmp_path / "halves"
    assert latest_checkpoint(halves).name == "step_000007"
    second = cli.run("pretrain", "--resume", str(halves))
    assert second.returncode == 0, second.stderr
    assert "held-out (16 positions): top-1" in second.stdout

    straight = load_file(str(tmp_path / "straight" / "checkpoints" / "latest" / "model.safetensors"))
    resumed = load_file(str(halves / "checkpoints" / "latest" / "model.safetensors"))
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), f"{name} differs after resume"
    model = load_policy(halves)  # the run directory loads its latest checkpoint
    assert all(torch.equal(t, resumed[n]) for n, t in model.state_dict().items())
    # latest -> newest step; pruned to keep_checkpoints=2 plus checkpoints/best, which the resumed
    # run tracks on from the first invocation (the lowest eval/nll of steps 5, 10 and 12).
    assert os.readlink(halves / "checkpoints" / "latest") == "step_000012"
    rows = read_metrics(halves / "metrics.jsonl")
    evals = {r["step"]: r["eval/nll"] for r in rows if "eval/nll" in r}
    assert sorted(evals) == [5, 10, 12]
    best_step = min(evals, key=evals.get)
    assert best_checkpoint(halves).name == f"step_{best_step:06d}"
    kept = [s for s, _ in list_checkpoints(halves)]
    assert kept[-1] == 12 and best_step in kept and len(kept) <= 3 and set(kept) - {best_step} <= {9, 10, 12}
    # Metrics: appended, no duplicate steps; the rows up to the stop come from the first process.
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)) and steps[-1] == 12 and 7 in steps
    straight_rows = {r["step"]: r for r in read_metrics(tmp_path / "straight" / "metrics.jsonl")}
    assert set(straight_rows) == set(steps) - {7}  # the stop wrote a row of its partial window
    for row in rows:
        keys = ["eval/loss", "eval/nll"] + (
            ["loss/train", "grad_norm", "train/perplexity"] if row["step"] not in (7, 8) else []
        )
        for key in keys:  # window means equal too, except the two windows the stop split
            assert row.get(key) == straight_rows.get(row["step"], {}).get(key), (row["step"], key)

    # A second fresh run into the same directory is refused, not overwritten.
    code, _, err = cli.main("pretrain", *common, "run.name=halves")
    assert code == 2
    assert "--resume" in err
    # Resuming may not change the math.
    code, _, err = cli.main("pretrain", "--resume", str(halves), "lr=0.01")
    assert code == 2
    assert "cannot change lr" in err
    assert (halves / "checkpoints" / "step_000012").is_dir()


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in trainer.kind.model.state_dict().items()}


def test_prefetched_batches_train_bitwise_like_batches_built_in_the_step(dataset, tmp_path):
    """prefetch_batches 2 (a background thread, uint8 inputs) against 0 (built in the step, int64 inputs): the same
    weights after 6 steps, bit for bit, and the same sampler position (batches of 48 from 64 rows cross epochs);
    a run stopped at step 3 and resumed (its prefetch thread had drawn ahead) ends bitwise equal too; a rollback
    (3 poisoned steps in a row) restarts the prefetching from the checkpoint and stays equal."""
    model = ModelConfig(
        move_facts=True, en_prise=True, value_head=True, dropout=0.1
    )  # dropout: the RNG must stay in step
    common = dict(steps=6, batch_size=48, eval_every=0, checkpoint_every=0, model=model)
    finals = {}
    for prefetch in (0, 2):
        with Trainer(
            _config(dataset, tmp_path, name=f"straight{prefetch}", prefetch_batches=prefetch, **common)
        ) as trainer:
            trainer.train()
            finals[prefetch] = (_weights(trainer), trainer.kind.state_dict())
            assert (trainer.kind._prefetcher is not None) == (prefetch > 0)
        assert trainer.kind._prefetcher is None  # closed with the trainer
    (plain, plain_state), (ahead, ahead_state) = finals[0], finals[2]
    assert plain_state == ahead_state and plain_state["sampler"]["epoch"] > 0
    assert all(torch.equal(plain[name], ahead[name]) for name in plain), "prefetching changed the training"

    config = _config(dataset, tmp_path, name="halves", prefetch_batches=2, stop_at=3, **common)
    with Trainer(config) as trainer:
        trainer.train()
        assert trainer.step == 3 and trainer.kind.sampler.state_dict() != trainer.kind._prefetcher._sampler.state_dict()
    with Trainer(dataclasses.replace(config, stop_at=None), resume=True) as trainer:
        assert trainer.step == 3
        trainer.train()
        resumed = _weights(trainer)
    assert all(torch.equal(plain[name], resumed[name]) for name in plain), "a resume with prefetching is not exact"

    rolled = {}
    for prefetch in (0, 2):
        config = _config(
            dataset,
            tmp_path,
            name=f"rollback{prefetch}",
            prefetch_batches=prefetch,
            **{**common, "checkpoint_every": 2},
        )
        config.debug.nonfinite_at_step, config.debug.nonfinite_steps = 4, 3
        with Trainer(config) as trainer:
            trainer.train()
            assert trainer.rollbacks == 1
            rolled[prefetch] = _weights(trainer)
    assert all(torch.equal(rolled[0][name], rolled[2][name]) for name in plain), (
        "a rollback with prefetching is not exact"
    )


def test_batch_prefetcher_follows_the_sampler_and_reports_a_failed_batch(dataset):
    """The prefetcher yields the sampler's batches in its order (across epochs) without moving the caller's
    sampler; uint8 inputs are the int64 ones; an error while building comes out of `next`; `close` stops it."""
    data = load_split(dataset, "train", move_facts=True, extra_facts=("en_prise",))
    sampler = EpochSampler(len(data), 24, seed=5)
    sampler.next_indices()  # start mid-epoch
    expected = EpochSampler.from_state(sampler.state_dict(), len(data), 24, seed=5)
    prefetcher = BatchPrefetcher(sampler, lambda indices: data.batch(indices, token_dtype=torch.uint8), depth=3)
    try:
        for _ in range(8):  # 8 x 24 rows: three epochs of 64
            indices, batch = prefetcher.next()
            assert torch.equal(indices, expected.next_indices())
            wide = data.batch(indices)
            assert batch.tokens.dtype == torch.uint8 and wide.tokens.dtype == torch.long
            assert torch.equal(batch.tokens.long(), wide.tokens) and torch.equal(batch.legal_mask, wide.legal_mask)
            assert torch.equal(batch.best_action, wide.best_action) and torch.equal(batch.win_probs, wide.win_probs)
        assert sampler.state_dict()["offset"] == 24  # the caller's sampler did not move
    finally:
        prefetcher.close()
    assert not prefetcher._thread.is_alive()

    def build(indices: torch.Tensor):
        if len(seen) == 2:
            raise ValueError("bad row 3")
        seen.append(indices)
        return indices

    seen: list[torch.Tensor] = []
    failing = BatchPrefetcher(EpochSampler(len(data), 8, seed=0), build, depth=1)
    failing.next(), failing.next()
    with pytest.raises(ValueError, match="bad row 3"):
        failing.next()
    assert not failing._thread.is_alive()


def test_sparse_move_facts_dense_equals_a_row_by_row_fill(dataset):
    """The vectorised `SparseMoveFacts.dense` against the plain per-row fill, for repeated, empty and single rows."""
    import numpy as np

    facts = load_split(dataset, "train", move_facts=True, extra_facts=("en_prise",)).facts
    rng = np.random.default_rng(0)
    for rows in (np.array([], dtype=np.int64), np.array([3]), rng.integers(0, 64, 200)):
        expected = np.zeros((len(rows), NUM_ACTIONS), dtype=np.int64)
        for i, row in enumerate(rows):
            start, stop = facts.offsets[row], facts.offsets[row + 1]
            expected[i, facts.actions[start:stop]] = facts.bits[start:stop]
        assert np.array_equal(facts.dense(rows), expected) and facts.dense(rows).dtype == np.int64
        assert np.array_equal(facts.dense(rows, dtype=np.uint8), expected.astype(np.uint8))
    assert facts.dense(np.arange(64)).any()


def test_missing_dataset_is_a_clear_error(cli, tmp_path):
    code, _, err = cli.main("pretrain", f"data={tmp_path / 'nope'}", f"run.out_dir={tmp_path}", "steps=1")
    assert code == 2
    assert "nope" in err and "chessgrpo data generate" in err
    # Nothing written for a run that could not start (taking the lock may leave the empty directory).
    run_dir = tmp_path / "pretrain"
    assert not run_dir.exists() or not any(run_dir.iterdir())


PRETRAIN_CONFIGS = (
    "pretrain_tiny",
    "endgame_kqk_pretrain",
    "endgame_krk_pretrain",
    "endgame_kbbk_pretrain",
    "endgame_kbnk_pretrain",
)


@pytest.mark.parametrize("name", PRETRAIN_CONFIGS)
def test_shipped_config_loads_and_documents_every_key(name):
    path = Path(__file__).resolve().parents[1] / "configs" / f"{name}.yaml"
    config = load_config(PretrainTrainConfig, path)
    assert config.kind == "pretrain" and config.run.name == name and config.model.size == "tiny"
    text = path.read_text()
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and not line.rstrip().endswith(":"):
            assert "#" in line, f"undocumented key line: {line!r}"
    for field in dataclasses.fields(PretrainTrainConfig):
        if field.name != "debug":  # test hooks (train/config.py DebugConfig) are not shipped
            assert f"\n{field.name}:" in text, field.name
    assert "src/chessgrpo/tasks/kinds/pretrain.py (PretrainTrainConfig)" in text


def test_model_description_names_the_replaced_fields():
    """The run summary must not call a 4 x 128 policy "tiny" without saying what was replaced."""
    assert ModelConfig().describe() == "tiny"
    described = ModelConfig(n_layers=4, d_model=128).describe()
    assert described == "tiny, n_layers=4, d_model=128"
    assert ModelConfig(n_layers=4, d_model=128).policy_config().d_model == 128


@pytest.mark.slow
def test_value_head_learns_the_labelled_values_and_eval_value_reports_it(cli, dataset, tmp_path):
    """With model.value_head the loss adds the value cross-entropy; the held-out value error falls
    below the constant baseline's, and `chessgrpo eval value` reports it with intervals."""
    config = _config(dataset, tmp_path, steps=60, eval_every=60, model=ModelConfig(value_head=True), eval_at_start=True)
    result, summary = _train(config)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    start = next(r for r in rows if r["step"] == 0)
    assert {"loss/value", "loss/moves", "train/value_mae"} <= set(rows[-1])
    assert result.eval_metrics["eval/value_mae"] < 0.8 * start["eval/value_mae"]
    assert "value MAE" in summary[1]
    completed = cli.run("eval", "value", "--checkpoint", str(tmp_path / "run"), "--data", str(dataset), "--json")
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["n"] == 16 and report["mae"]["value"] == pytest.approx(
        result.eval_metrics["eval/value_mae"], abs=1e-4
    )
    assert report["mae_gain"]["value"] == pytest.approx(report["baseline_mae"]["value"] - report["mae"]["value"])
    assert sum(row["n"] for row in report["calibration"]) == 16


def test_eval_value_refuses_a_checkpoint_without_value_head(cli, dataset, tmp_path):
    _train(_config(dataset, tmp_path, steps=2, eval_every=0, checkpoint_every=0))
    completed = cli.run("eval", "value", "--checkpoint", str(tmp_path / "run"), "--data", str(dataset))
    assert completed.returncode != 0 and "no value head" in completed.stderr and completed.stderr.count("\n") == 1


@pytest.mark.slow
def test_search_labels_train_a_policy_expert_iteration(cli, dataset, tmp_path):
    """`data search-label` writes the search's moves and values in the dataset schema (test split
    copied from the source), and `kind: pretrain` continues the policy on them."""
    _train(
        _config(
            dataset,
            tmp_path,
            name="start",
            steps=4,
            eval_every=0,
            checkpoint_every=0,
            model=ModelConfig(value_head=True),
        )
    )
    out = tmp_path / "searched"
    completed = cli.run(
        "data",
        "search-label",
        "--checkpoint",
        str(tmp_path / "start"),
        "--source",
        str(dataset),
        "--out",
        str(out),
        "--nodes",
        "8",
        "--max-positions",
        "12",
        "--workers",
        "1",
    )
    assert completed.returncode == 0, completed.stderr
    assert "wrote 12 search-labelled positions" in completed.stdout
    train = load_split(out, "train")
    assert len(train) == 12 and len(load_split(out, "test")) == 16  # the source's engine-labelled test split
    from chessgrpo.data.schema import read_positions

    table = read_positions(out, "train", ["source", "nodes", "moves", "win_probs", "value"])
    assert set(table.column("source").to_pylist()) == {"search"} and set(table.column("nodes").to_pylist()) == {8}
    for wins, value in zip(table.column("win_probs").to_pylist(), table.column("value").to_pylist()):
        assert 0.0 <= value <= 1.0 and value == pytest.approx(wins[0])
    again = cli.run(
        "data",
        "search-label",
        "--checkpoint",
        str(tmp_path / "start"),
        "--source",
        str(dataset),
        "--out",
        str(out),
        "--nodes",
        "8",
    )
    assert again.returncode != 0 and "already has shards" in again.stderr  # nothing overwritten
    result, _ = _train(
        _config(out, tmp_path, name="expert", steps=4, eval_every=4, init_checkpoint=str(tmp_path / "start"))
    )
    assert result.finished and "eval/value_mae" in result.eval_metrics


def test_en_prise_fact_loads_with_the_data_and_trains(dataset, tmp_path):
    """model.en_prise: the split carries bit 5 exactly where `en_prise_actions` says, a policy
    without it never sees the bit, and pretraining saves a policy that reads it."""
    import chess

    from chessgrpo.board.move_facts import EN_PRISE, en_prise_actions
    from chessgrpo.data.schema import read_positions

    with_bit = load_split(dataset, "train", move_facts=True, extra_facts=("en_prise",))
    rules_only = load_split(dataset, "train", move_facts=True)
    assert not (rules_only.facts.bits & EN_PRISE).any()
    fens = read_positions(dataset, "train", ("fen",)).column("fen").to_pylist()
    marked = 0
    for row, fen in enumerate(fens):
        start, stop = with_bit.facts.offsets[row], with_bit.facts.offsets[row + 1]
        found = {
            int(a) for a, b in zip(with_bit.facts.actions[start:stop], with_bit.facts.bits[start:stop]) if b & EN_PRISE
        }
        assert found == set(en_prise_actions(chess.Board(fen))), fen
        marked += len(found)
    assert marked > 64  # random playouts hang pieces all the time
    result, _ = _train(
        _config(
            dataset,
            tmp_path,
            steps=10,
            eval_every=10,
            checkpoint_every=10,
            model=ModelConfig(move_facts=True, en_prise=True),
        )
    )
    assert result.finished
    policy = load_policy(tmp_path / "run")
    assert policy.config.en_prise and policy.move_facts.weights.out_features == 6
    assert policy.move_facts.weights.weight.abs().sum() > 0  # the facts' weights trained
