"""The chess LM path (models/lm.py): tokenizers, loading, batched generation, the one log-prob function, no dropout in RL.

Tiny GPT-2 models are created locally (no downloads): `GPT2Config(n_layer=2, n_embd=64, ...)`.
"""

from __future__ import annotations

import json

import pytest
import torch

from chessgrpo.models.lm import (
    LMModelConfig,
    build_lm,
    completion_log_probs,
    dropout_probabilities,
    load_lm,
    prepare_for_rl,
    save_lm,
    tempered_log_probs,
)
from chessgrpo.models.lm_generation import generate
from chessgrpo.models.lm_tokenizers import CHAR_TOKENIZER_FILE, CharTokenizer, HFTokenizer
from chessgrpo.rl import GRPOConfig, InvariantViolation, KLController, optimize
from chessgrpo.tasks.lm_rollout import make_forward, sample_completion_groups, to_rollout_batch
from chessgrpo.train.learner import Learner

P_PROMPTS = [
    "P: 8/8/8/8/8/8/8/K6k w - - 0 1",
    "P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
    "P: r5k1/5ppp/8/8/8/8/5PPP/6K1 b - - 0 1",
]
A_PROMPT = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"


def _tiny_char_lm(dropout: float = 0.0, seed: int = 0, tokenizer: str = "char", architecture: str = "gpt2"):
    config = LMModelConfig(
        n_layer=2, n_embd=64, n_head=2, n_positions=384, dropout=dropout, tokenizer=tokenizer, architecture=architecture
    )
    lm = build_lm(config, seed=seed)
    return lm


@pytest.fixture(scope="module")
def bpe_model_dir(tmp_path_factory):
    """A tiny GPT-2 with a byte-level BPE tokenizer, saved like a downloaded RookWorld-LM directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([*P_PROMPTS, A_PROMPT, "M: e2e4 d2d4 E: 0.3 0.25 B: e2e4"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    directory = tmp_path_factory.mktemp("tiny_gpt2_bpe")
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=2,
        n_positions=256,
        vocab_size=len(fast),
        eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
    )
    GPT2LMHeadModel(config).save_pretrained(str(directory))
    fast.save_pretrained(str(directory))
    return directory


def test_char_tokenizer_round_trip_and_rejects_unknown_characters(tmp_path):
    tokenizer = CharTokenizer()
    text = P_PROMPTS[1] + "  M: e7e5 g8f6  E: -0.3 1000.0  B: e7e5\n" + A_PROMPT + "+0.001+0+0"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode([tokenizer.eos_token_id]) == "\n"
    with pytest.raises(ValueError, match="not in the chess vocabulary"):
        tokenizer.encode("P: hello; rm -rf /")
    tokenizer.save(tmp_path)
    assert CharTokenizer.load(tmp_path).vocab == tokenizer.vocab
    (tmp_path / CHAR_TOKENIZER_FILE).write_text(json.dumps({"type": "other"}))
    with pytest.raises(ValueError, match="not a chess character tokenizer"):
        CharTokenizer.load(tmp_path)


def test_tiny_gpt2_saved_with_save_pretrained_loads_like_rookworld_lm_and_generates(bpe_model_dir):
    lm = load_lm(bpe_model_dir)
    assert isinstance(lm.tokenizer, HFTokenizer)
    assert lm.tokenizer.eos_token_id == lm.tokenizer.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert max(dropout_probabilities(lm.model)) == pytest.approx(0.1)  # as configured: SFT may use it
    prepare_for_rl(lm.model)
    assert set(dropout_probabilities(lm.model)) == {0.0} and not lm.model.training
    prompts = [lm.tokenizer.encode(p) for p in P_PROMPTS]
    generation = generate(
        lm.model,
        prompts,
        eos_token_id=lm.tokenizer.eos_token_id,
        max_new_tokens=12,
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
    )
    assert generation.completion_ids.shape[0] == 3 and generation.completion_mask[:, 0].all()
    assert all(isinstance(text, str) for text in generation.texts(lm.tokenizer))
    # The same directory through the path a checkpoint takes: save_lm writes a loadable directory.
    save_lm(lm, bpe_model_dir.parent / "resaved")
    again = load_lm(bpe_model_dir.parent / "resaved")
    assert isinstance(again.tokenizer, HFTokenizer)


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_fresh_char_model_saves_and_loads_through_the_same_path(tmp_path, architecture):
    lm = _tiny_char_lm(architecture=architecture)
    save_lm(lm, tmp_path / "model")
    assert (tmp_path / "model" / "config.json").is_file() and (tmp_path / "model" / CHAR_TOKENIZER_FILE).is_file()
    loaded = load_lm(tmp_path / "model")
    assert isinstance(loaded.tokenizer, CharTokenizer)
    assert type(loaded.model) is type(lm.model)
    for a, b in zip(lm.model.state_dict().values(), loaded.model.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(FileNotFoundError, match="no language model"):
        load_lm(tmp_path / "missing")


@pytest.mark.parametrize("kind", ["char", "chess", "bpe", "chess-llama"])
def test_left_padded_batched_greedy_generation_equals_unbatched(kind, bpe_model_dir):
    if kind == "bpe":
        lm = load_lm(bpe_model_dir)
    else:
        tokenizer, _, architecture = kind.partition("-")
        lm = _tiny_char_lm(seed=3, tokenizer=tokenizer, architecture=architecture or "gpt2")
    prepare_for_rl(lm.model)
    prompts = [lm.tokenizer.encode(p) for p in [*P_PROMPTS, A_PROMPT]]
    assert len({len(p) for p in prompts}) > 1  # different lengths: real left padding
    eos = lm.tokenizer.eos_token_id
    batched = generate(lm.model, prompts, eos_token_id=eos, max_new_tokens=40, temperature=0.0)
    for row, prompt in enumerate(prompts):
        alone = generate(lm.model, [prompt], eos_token_id=eos, max_new_tokens=40, temperature=0.0)
        assert batched.completion_tokens(row) == alone.completion_tokens(0)


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_completion_log_probs_is_the_sampling_distribution_and_independent_of_padding(architecture):
    lm = _tiny_char_lm(seed=1, architecture=architecture)
    prepare_for_rl(lm.model)
    tokenizer = lm.tokenizer
    prompts = [tokenizer.encode(p) for p in P_PROMPTS]
    temperature = 1.3
    generation = generate(
        lm.model,
        prompts,
        eos_token_id=tokenizer.eos_token_id,
        max_new_tokens=30,
        temperature=temperature,
        generator=torch.Generator().manual_seed(0),
    )
    with torch.no_grad():
        batched, entropy = completion_log_probs(
            lm.model,
            generation.prompt_ids,
            generation.prompt_mask,
            generation.completion_ids,
            generation.completion_mask,
            temperature=temperature,
            with_entropy=True,
        )
        for row, prompt in enumerate(prompts):
            completion = generation.completion_tokens(row)
            ids = torch.tensor([prompt + completion])
            logits = lm.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]  # unpadded, default positions
            expected = (
                tempered_log_probs(logits, temperature).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)
            )
            assert torch.allclose(batched[row, : len(completion)], expected, atol=1e-5)
            assert (batched[row, len(completion) :] == 0).all()
    valid = generation.completion_mask
    assert (entropy[valid] > 0).all() and (
        entropy[valid] <= torch.log(torch.tensor(float(tokenizer.vocab_size))) + 1e-5
    ).all()


def test_generation_stops_at_eos_and_masks_what_follows():
    lm = _tiny_char_lm(seed=2)
    prepare_for_rl(lm.model)
    eos = lm.tokenizer.eos_token_id
    with torch.no_grad():  # make EOS the only likely token after the first step
        lm.model.lm_head.weight[eos] *= 0
        lm.model.transformer.wte.weight[eos] += 0  # tied weights: the same tensor
    generation = generate(
        lm.model,
        [lm.tokenizer.encode(p) for p in P_PROMPTS],
        eos_token_id=eos,
        max_new_tokens=8,
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
    )
    for row in range(3):
        tokens = generation.completion_tokens(row)
        if generation.finished[row]:
            assert tokens[-1] == eos and eos not in tokens[:-1]
            assert not generation.completion_mask[row, len(tokens) :].any()
        else:
            assert len(tokens) == 8


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_rl_turns_configured_dropout_off_so_the_first_ratio_is_one(tmp_path, architecture):
    lm = _tiny_char_lm(dropout=0.5, seed=4, architecture=architecture)
    save_lm(lm, tmp_path / "sft")
    loaded = load_lm(tmp_path / "sft")
    assert max(dropout_probabilities(loaded.model)) == 0.5
    loaded.model.train()  # whatever state the model arrives in, RL must turn dropout off
    prepare_for_rl(loaded.model)
    reference = load_lm(tmp_path / "sft").model
    prepare_for_rl(reference).requires_grad_(False)
    groups = sample_completion_groups(
        loaded,
        [P_PROMPTS[0], A_PROMPT],
        4,
        temperature=1.0,
        max_new_tokens=24,
        generator=torch.Generator().manual_seed(0),
        reference=reference,
    )
    rewards = torch.arange(8, dtype=torch.float32) % 3
    config = GRPOConfig(kl_coef=0.05, num_iterations=2, minibatch_size=4)
    optimizer = torch.optim.AdamW(loaded.model.parameters(), lr=1e-3)

    def fresh_batch():
        return to_rollout_batch(groups, rewards)

    update = Learner(optimizer, list(loaded.model.parameters()), max_grad_norm=1.0).update
    metrics = optimize(
        fresh_batch(),
        make_forward(loaded.model, temperature=1.0, reference=reference),
        update,
        config,
        KLController.from_config(config),
        parameters=list(loaded.model.parameters()),
        generator=torch.Generator().manual_seed(0),
    )
    assert metrics["ratio/first_max_abs_dev"] < 1e-4
    assert metrics["kl/min"] >= 0.0

    # The negative control: the same learner with dropout left on trips the invariant at once.
    noisy = load_lm(tmp_path / "sft")
    prepare_for_rl(noisy.model)
    groups = sample_completion_groups(
        noisy,
        [P_PROMPTS[0], A_PROMPT],
        4,
        temperature=1.0,
        max_new_tokens=24,
        generator=torch.Generator().manual_seed(0),
    )
    for module in noisy.model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5
        if hasattr(module, "attention_dropout"):  # Llama's functional attention dropout
            module.attention_dropout = 0.5
    learn = make_forward(noisy.model, temperature=1.0)

    def with_dropout(minibatch):
        noisy.model.train()
        try:
            noisy.model.training = False  # pass make_forward's eval-mode guard; submodules stay in train mode
            return learn(minibatch)
        finally:
            noisy.model.eval()

    update = Learner(
        torch.optim.AdamW(noisy.model.parameters(), lr=1e-3), list(noisy.model.parameters()), max_grad_norm=1.0
    ).update
    with pytest.raises(InvariantViolation, match="ratio"):
        optimize(
            to_rollout_batch(groups, rewards),
            with_dropout,
            update,
            GRPOConfig(),
            KLController(),
            parameters=list(noisy.model.parameters()),
            generator=None,
        )
