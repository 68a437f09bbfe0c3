"""Memory that does not grow with vocabulary x batch (issue 20): chunked log-probs, micro-batched
learners (GRPO core and SFT), checkpoints without optimizer state, prompt/completion token boundaries.

Every model here is a tiny GPT-2 built locally with an offline byte-level BPE (no downloads).

Cross-cutting: models/lm.py (chunked log-probs), train/learner.py and tasks/sft.py (micro-batches),
train/checkpoint.py (no optimizer state), tasks/lm_rollout.py and models/prompt_bos.py (token
boundaries).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import types

import pytest
import torch
import torch.nn.functional as F

from chessgrpo.models.lm import ChessLM, completion_log_probs, load_lm, prepare_for_rl
from chessgrpo.models.lm_tokenizers import HFTokenizer
from chessgrpo.models.prompt_bos import with_prompt_bos
from chessgrpo.rl import GRPOConfig, KLController, categorical_entropy, optimize
from chessgrpo.rl.invariants import InvariantViolation
from chessgrpo.tasks.lm_rollout import make_forward, sample_completion_groups, to_rollout_batch
from chessgrpo.tasks.sft import tokenize_examples
from chessgrpo.train.checkpoint import load_trainer_state, optimizer_state, restore_optimizer, save_checkpoint
from chessgrpo.train.learner import Learner

P_PROMPT = "P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1 "
P_ANSWER = "M: e7e5 d7d5 g8f6 c7c5 e7e6 E: 0.3 0.25 0.2 0.1 0.0 B: e7e5"
A_PROMPT = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
A_ANSWER = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> ChessLM:
    """A 2-layer GPT-2 with a byte-level BPE trained on chess lines, loaded like a RookWorld-LM directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([P_PROMPT + P_ANSWER, A_PROMPT + A_ANSWER] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    directory = tmp_path_factory.mktemp("tiny_gpt2_memory")
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        n_positions=256,
        vocab_size=len(fast) + 37,  # padded like 50257
        eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id,
    )
    GPT2LMHeadModel(config).save_pretrained(str(directory))
    fast.save_pretrained(str(directory))
    lm = load_lm(directory)
    prepare_for_rl(lm.model)
    return lm


def _groups(lm: ChessLM, temperature: float = 0.8, reference: torch.nn.Module | None = None):
    prompts = [P_PROMPT, A_PROMPT, P_PROMPT[:-9]]
    generators = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    return sample_completion_groups(
        lm, prompts, 3, temperature=temperature, max_new_tokens=12, generator=generators, reference=reference
    )


def _reference_log_probs(model, g, temperature: float):
    """The unchunked formula of before: log_softmax over the whole [N, L, V], gather, categorical_entropy."""
    ids = torch.cat([g.prompt_ids, g.completion_ids], 1)
    attention = torch.cat([g.prompt_mask, g.completion_mask], 1).long()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits[
        :, g.prompt_ids.shape[1] - 1 : -1
    ]
    full = F.log_softmax(logits.float() / temperature, dim=-1)
    logp = full.gather(-1, g.completion_ids.unsqueeze(-1)).squeeze(-1)
    zero = torch.zeros_like(logp)
    return torch.where(g.completion_mask, logp, zero), torch.where(g.completion_mask, categorical_entropy(full), zero)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_log_probs_and_entropy_equal_the_unchunked_formula(tiny_lm, temperature):
    g = _groups(tiny_lm, temperature).generation
    args = (tiny_lm.model, g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask)
    with torch.no_grad():
        expected_logp, expected_entropy = _reference_log_probs(tiny_lm.model, g, temperature)
        for chunk in (0, 1, 2, 4, 100):
            logp, entropy = completion_log_probs(*args, temperature=temperature, with_entropy=True, chunk_rows=chunk)
            torch.testing.assert_close(logp, expected_logp, atol=1e-5, rtol=0)
            torch.testing.assert_close(entropy, expected_entropy, atol=1e-5, rtol=0)
    # With gradients: the same values, and the same gradient of a loss of both (entropy with grad).
    grads = []
    for chunk in (0, 4):
        tiny_lm.model.zero_grad(set_to_none=True)
        logp, entropy = completion_log_probs(*args, temperature=temperature, with_entropy=True, chunk_rows=chunk)
        (logp.sum() + 0.3 * entropy.sum()).backward()
        grads.append([p.grad.clone() for p in tiny_lm.model.parameters()])
    tiny_lm.model.zero_grad(set_to_none=True)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    _, detached = completion_log_probs(*args, temperature=temperature, with_entropy=True, entropy_grad=False)
    assert not detached.requires_grad
    with pytest.raises(ValueError, match="chunk_rows"):
        completion_log_probs(*args, temperature=temperature, chunk_rows=-1)


def _learn(
    lm: ChessLM, batch, config: GRPOConfig, lr: float = 0.5, reference: torch.nn.Module | None = None
) -> tuple[torch.nn.Module, dict[str, float]]:
    """A copy of lm.model after one `optimize` call with plain SGD (the update is lr x the gradient); with
    `reference`, the forward gives the exact per-token KL (the default KL term)."""
    model = copy.deepcopy(lm.model)
    update = Learner(torch.optim.SGD(model.parameters(), lr=lr), list(model.parameters()), max_grad_norm=0.0).update
    metrics = optimize(
        copy.deepcopy(batch),
        make_forward(model, temperature=0.8, chunk_rows=2, reference=reference),
        update,
        config,
        KLController.from_config(config),
        parameters=list(model.parameters()),
        generator=None,
        shuffle_seed=0,
    )
    return model, metrics


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batched_learner_takes_the_same_step_as_one_batch(tiny_lm, aggregation):
    reference = copy.deepcopy(tiny_lm.model).requires_grad_(False)
    groups = _groups(tiny_lm, reference=reference)
    rewards = torch.tensor([float(i % 3 == 0) + 0.1 * i for i in range(9)])
    batch = to_rollout_batch(groups, rewards)
    # Unequal completion lengths make the token weights matter (a random model never writes EOS):
    # cut row i after 3 + i tokens (causal: the kept log-probs do not depend on what is cut).
    for row in range(batch.num_rows):
        batch.mask[row, 3 + row :] = False
    batch.behaviour_logp = torch.where(batch.mask, batch.behaviour_logp, 0.0)
    batch.ref_logp = torch.where(batch.mask, batch.ref_logp, 0.0)
    base = dict(loss_aggregation=aggregation, kl_coef=0.05, entropy_coef=0.01, minibatch_size=6, num_iterations=2)
    whole, whole_metrics = _learn(tiny_lm, batch, GRPOConfig(**base), reference=reference)
    for micro in (1, 2, 4):
        split, metrics = _learn(tiny_lm, batch, GRPOConfig(**base, micro_batch_size=micro), reference=reference)
        for a, b in zip(whole.parameters(), split.parameters()):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        assert metrics["learn/minibatches"] == whole_metrics["learn/minibatches"] == 4
        assert metrics["ratio/first_max_abs_dev"] < 1e-4
        assert metrics["loss/policy"] == pytest.approx(whole_metrics["loss/policy"], abs=1e-5)
        assert metrics["grad_norm"] == pytest.approx(whole_metrics["grad_norm"], rel=1e-4)


def test_micro_batches_through_the_training_spines_learner(tiny_lm):
    """`train.learner.Learner.update(loss, step=False)` accumulates; the step equals the unsplit one."""
    batch = to_rollout_batch(_groups(tiny_lm), torch.arange(9, dtype=torch.float32) % 4)
    models = []
    for micro in (0, 2):
        model = copy.deepcopy(tiny_lm.model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        learner = Learner(optimizer, list(model.parameters()), max_grad_norm=0.0)
        config = GRPOConfig(micro_batch_size=micro)
        optimize(
            copy.deepcopy(batch),
            make_forward(model, temperature=0.8),
            learner.update,
            config,
            KLController.from_config(config),
            generator=None,
            shuffle_seed=0,
        )
        models.append(model)
        assert all(p.grad is None for p in model.parameters())
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_first_minibatch_ratio_is_checked_on_every_micro_batch(tiny_lm):
    batch = to_rollout_batch(_groups(tiny_lm), torch.arange(9, dtype=torch.float32) % 4)
    # Rows are shuffled into minibatches: corrupt every row but one, so whichever micro-batch
    # comes last in the first minibatch holds a bad one.
    bad = copy.deepcopy(batch)
    bad.behaviour_logp = torch.where(bad.mask, bad.behaviour_logp - 0.01, bad.behaviour_logp)
    bad.behaviour_logp[0] = batch.behaviour_logp[0]
    for micro in (0, 1, 4):
        with pytest.raises(InvariantViolation, match="ratio"):
            _learn(tiny_lm, bad, GRPOConfig(micro_batch_size=micro, minibatch_size=6))
    _, metrics = _learn(tiny_lm, batch, GRPOConfig(micro_batch_size=2, minibatch_size=6))
    assert metrics["ratio/first_max_abs_dev"] < 1e-4


@pytest.mark.parametrize("prompt_weight", [0.0, 0.5])
def test_sft_micro_batches_accumulate_the_whole_batch_gradient(tiny_lm, prompt_weight):
    """`SFTKind._learn` with micro-batches: the gradient of the batch's token mean, and its loss
    (with prompt tokens scored too: the weighted token mean)."""
    from chessgrpo.tasks.kinds.sft import SFTKind
    from chessgrpo.tasks.sft import loss_tokens
    from chessgrpo.train.distributed import Parallel

    examples = [
        types.SimpleNamespace(prompt=p, completion=c, task=t, line=p + c)
        for p, c, t in [
            (P_PROMPT, P_ANSWER, "policy"),
            (A_PROMPT, A_ANSWER, "environment"),
            (P_PROMPT, P_ANSWER[:20], "policy"),
        ]
        * 2
    ]
    data = tokenize_examples(tiny_lm, examples)
    results = []
    for micro in (0, 1, 4):
        model = copy.deepcopy(tiny_lm.model)
        grads: list[list[torch.Tensor]] = []

        def update(loss, step=True, model=model, grads=grads):
            loss.backward()
            if step:
                grads.append([p.grad.clone() for p in model.parameters()])
                model.zero_grad(set_to_none=True)
            return 0.0

        stub = types.SimpleNamespace(
            config=types.SimpleNamespace(micro_batch_size=micro, prompt_loss_weight=prompt_weight),
            lm=ChessLM(model, tiny_lm.tokenizer),
            learner_model=model,
            context=types.SimpleNamespace(parallel=Parallel(), autocast=contextlib.nullcontext),
            train_data=data,
        )
        tokens = sum(loss_tokens(p, c, prompt_weight) for p, c in zip(data.prompts, data.completions))
        loss, _ = SFTKind._learn(
            stub, data.prompts, data.completions, len(data), tokens, types.SimpleNamespace(update=update)
        )
        assert len(grads) == 1
        results.append((loss, grads[0]))
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-5)
        for a, b in zip(results[0][1], grads):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_sft_loss_scores_prompt_tokens_at_their_weight(tiny_lm):
    """`sft_loss(prompt_weight=w)` = (completion NLL + w x prompt NLL) / (completion tokens + w x prompt
    tokens), by hand from one unpadded forward per line; w = 0 is the completion-only loss."""
    from chessgrpo.tasks.sft import loss_tokens, sft_loss

    examples = [
        types.SimpleNamespace(prompt=p, completion=c, task="policy", line=p + c)
        for p, c in [(P_PROMPT, P_ANSWER), (A_PROMPT[:30], A_ANSWER[:11])]
    ]
    data = tokenize_examples(tiny_lm, examples)
    sums = {"prompt": 0.0, "completion": 0.0}
    counts = {"prompt": 0, "completion": 0}
    with torch.no_grad():
        for prompt, completion in zip(data.prompts, data.completions):
            ids = torch.tensor([prompt + completion])
            logp = F.log_softmax(tiny_lm.model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            token_logp = logp.gather(1, ids[0, 1:, None])[:, 0]
            sums["prompt"] -= float(token_logp[: len(prompt) - 1].sum())
            sums["completion"] -= float(token_logp[len(prompt) - 1 :].sum())
            counts["prompt"] += len(prompt) - 1
            counts["completion"] += len(completion)
        for weight in (0.0, 0.3, 1.0):
            loss, total = sft_loss(tiny_lm, data.prompts, data.completions, prompt_weight=weight)
            expected_total = counts["completion"] + weight * counts["prompt"]
            assert total == pytest.approx(expected_total)
            assert total == pytest.approx(
                sum(loss_tokens(p, c, weight) for p, c in zip(data.prompts, data.completions))
            )
            assert float(loss) == pytest.approx(
                (sums["completion"] + weight * sums["prompt"]) / expected_total, rel=1e-5
            )
    with pytest.raises(ValueError, match="prompt_weight"):
        sft_loss(tiny_lm, data.prompts, data.completions, prompt_weight=-1.0)


def test_checkpoint_without_optimizer_state_is_smaller_and_resumes_with_fresh_optimizer(tiny_lm, tmp_path, caplog):
    model = copy.deepcopy(tiny_lm.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    assert optimizer.state

    def save(run: str, with_optimizer: bool):
        return save_checkpoint(
            tmp_path / run,
            1,
            save_model=lambda d: model.save_pretrained(str(d)),
            trainer_state={"step": 1, **optimizer_state(optimizer, with_optimizer)},
            keep=1,
        )

    full, slim = save("full", True), save("slim", False)
    size = lambda d: (d / "trainer_state.pt").stat().st_size  # noqa: E731
    assert size(slim) * 10 < size(full)
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert restore_optimizer(fresh, load_trainer_state(full), full) and fresh.state
    with caplog.at_level(logging.WARNING, logger="chessgrpo.train.checkpoint"):
        assert not restore_optimizer(fresh, load_trainer_state(slim), slim)
    assert not fresh.state  # started fresh, and said so
    assert "holds no optimizer state" in caplog.text and "checkpoint_optimizer: false" in caplog.text


def test_prompt_split_inside_a_bpe_token_keeps_the_generated_token_boundary(tiny_lm):
    tokenizer = tiny_lm.tokenizer
    assert isinstance(tokenizer, HFTokenizer)
    # Cut the line inside what its joint encoding makes one token: the separate encodings differ.
    line = P_PROMPT + P_ANSWER
    cut = next(
        i
        for i in range(len(P_PROMPT), len(line))
        if tokenizer.encode(line[:i]) + tokenizer.encode(line[i:]) != tokenizer.encode(line)
    )
    prompt, completion = line[:cut], line[cut:]
    # SFT trains exactly the split that sampling sees: the prompt's own ids, then the completion's.
    data = tokenize_examples(
        tiny_lm, [types.SimpleNamespace(prompt=prompt, completion=completion, task="policy", line=line)]
    )
    assert data.prompts[0] == tokenizer.encode(prompt)
    assert data.completions[0] == tokenizer.encode(completion) + [tokenizer.eos_token_id]
    # GRPO takes log-probs of the generated ids themselves, never of the decoded text re-encoded.
    groups = sample_completion_groups(
        tiny_lm, [prompt], 2, temperature=1.0, max_new_tokens=10, generator=torch.Generator().manual_seed(0)
    )
    batch = to_rollout_batch(groups, torch.tensor([0.0, 1.0]))
    g = groups.generation
    assert torch.equal(batch.actions, g.completion_ids) and torch.equal(batch.mask, g.completion_mask)
    assert g.prompt_ids[0][g.prompt_mask[0]].tolist() == tokenizer.encode(prompt)
    with torch.no_grad():
        logp, _ = completion_log_probs(
            tiny_lm.model, g.prompt_ids, g.prompt_mask, batch.actions, batch.mask, temperature=1.0
        )
    torch.testing.assert_close(logp, batch.behaviour_logp, atol=1e-6, rtol=0)
    assert tokenizer.decode(g.prompt_ids[0][g.prompt_mask[0]].tolist() + g.completion_tokens(0)).startswith(prompt)


def test_prompt_bos_prefixes_prompts_only(tiny_lm):
    tokenizer = tiny_lm.tokenizer
    bos = tokenizer.tokenizer.bos_token_id
    prefixed = with_prompt_bos(tiny_lm, True)
    assert with_prompt_bos(tiny_lm, False) is tiny_lm
    assert prefixed.tokenizer.encode(P_PROMPT) == [bos, *tokenizer.encode(P_PROMPT)]
    assert prefixed.tokenizer.decode([5, 6]) == tokenizer.decode([5, 6]) and prefixed.model is tiny_lm.model
    data = tokenize_examples(
        tiny_lm, [types.SimpleNamespace(prompt=P_PROMPT, completion=P_ANSWER, task="policy", line="")], prompt_bos=True
    )
    assert data.prompts[0] == [bos, *tokenizer.encode(P_PROMPT)] and data.completions[0][0] != bos
    groups = sample_completion_groups(prefixed, [P_PROMPT], 2, temperature=1.0, max_new_tokens=4)
    assert groups.generation.prompt_ids[0, 0].item() == bos


@pytest.mark.slow
def test_micro_batches_on_two_processes_are_the_one_process_experiment(tmp_path):
    """DDP reduces in every backward: with micro-batches (uneven: 3 + 1 rows per rank) two processes
    still run the one-process experiment without them."""
    from test_distributed import assert_same_experiment, move_group_args, run_single, run_torchrun

    run_single(*move_group_args(tmp_path, "one"))
    run_torchrun(*move_group_args(tmp_path, "two", "grpo.micro_batch_size=3"))
    assert_same_experiment(tmp_path / "one", tmp_path / "two", rollout_metric="reward/mean")
