"""The word-level chess tokenizer (issue 20): exact round trips, short sequences, standard files."""

from __future__ import annotations

import random
import statistics

import pytest
import torch

from chessgrpo.board import ACTIONS
from chessgrpo.data.rookworld_format import parse_environment_prompt, policy_prompt
from chessgrpo.models.chess_tokenizer import ALPHABET, EOS_TOKEN, TOKENIZER_FILE, ChessTokenizer, chess_vocabulary
from chessgrpo.models.lm import LMModelConfig, build_lm, load_lm, save_lm
from chessgrpo.models.lm_tokenizers import CHAR_TOKENIZER_FILE, CharTokenizer
from helpers import data_file


def _sample_lines() -> list[str]:
    samples = data_file("rookworld_samples.txt")
    return [line.rstrip("\n") for line in samples.read_text().splitlines() if line.startswith(("P: ", "A: "))]


@pytest.fixture(scope="module")
def tokenizer() -> ChessTokenizer:
    return ChessTokenizer()


def _split_policy(line: str) -> tuple[str, str]:
    prompt = policy_prompt(line[3:92].strip())
    return prompt, line[len(prompt) :]


def _split_environment(line: str) -> tuple[str, str]:
    prompt = "+".join(line.split("+")[:3]) + "+"  # A: FEN+move+history+
    parse_environment_prompt(prompt)
    return prompt, line[len(prompt) :]


def test_every_sample_line_round_trips_exactly_and_splits_at_the_prompt(tokenizer):
    lines = _sample_lines()
    assert sum(line.startswith("P: ") for line in lines) >= 10 and sum(line.startswith("A: ") for line in lines) >= 10
    for line in lines:
        ids = tokenizer.encode(line)
        assert tokenizer.decode(ids) == line
        prompt, completion = _split_policy(line) if line.startswith("P: ") else _split_environment(line)
        assert prompt + completion == line
        # Prompt and completion encoded apart give the ids of the whole line: no token crosses the cut.
        assert tokenizer.encode(prompt) + tokenizer.encode(completion) == ids
        assert tokenizer.decode(tokenizer.encode(completion) + [tokenizer.eos_token_id]) == completion + EOS_TOKEN


def test_token_counts_are_short(tokenizer):
    lines = _sample_lines()
    answers = [len(tokenizer.encode(_split_policy(line)[1])) for line in lines if line.startswith("P: ")]
    environment = [len(tokenizer.encode(line)) for line in lines if line.startswith("A: ")]
    assert statistics.mean(answers) <= 24 and max(answers) <= 30  # ~22 tokens for ~120 characters
    assert max(environment) <= 160  # whole A: lines (FEN items are single characters)
    policy = lines[0]
    assert len(tokenizer.encode(policy)) < len(policy) / 2


def test_moves_fen_items_and_numbers_are_single_tokens(tokenizer):
    vocab = set(chess_vocabulary())
    assert all(move in vocab and " " + move in vocab for move in ACTIONS)
    for move in random.Random(0).sample(ACTIONS, 50):
        assert tokenizer.tokens(f"M: {move} {move}") == ["M: ", move, " " + move]
    assert tokenizer.tokens("A: 8/8/8/8/8/8/8/1R1b1b2 b KQkq e3 0 34+") == [
        "A: ",
        *"8/8/8/8/8/8/8/1R1b1b2",
        " b",
        " KQkq",
        " e3",
        " 0",
        " 34",
        "+",
    ]
    assert tokenizer.tokens("E: -3.06 999.85 0.0") == ["E: ", "-3", ".06", " 99", "9", ".85", " 0", ".0"]
    assert tokenizer.tokens("+1.0+0+1") == ["+", "1", ".0", "+", "0", "+", "1"]
    assert tokenizer.tokens(" " * 40 + "B: ") == [" " * 40, "B: "]


def test_moves_outside_the_action_list_fall_back_to_squares(tokenizer):
    # A: prompts may carry any square pair (illegal moves are part of the environment task).
    text = "A: 8/8/8/8/8/8/8/K1k5 w - - 0 1+d4a2+e2e4 d4a2+"
    assert "d4a2" not in ACTIONS
    assert tokenizer.tokens(text)[-8:] == ["+", "d4", "a2", "+", "e2e4", " d4", "a2", "+"]
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_any_text_over_the_alphabet_round_trips(tokenizer):
    rng = random.Random(20)
    pieces = [*ALPHABET, "P: ", "A: ", " e7e8q", "+", "  ", " -", "1b1b2 ", ".0", "a1a1"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        assert tokenizer.decode(tokenizer.encode(text)) == text, text
    assert tokenizer.decode(tokenizer.encode(" " * 250)) == " " * 250
    assert tokenizer.encode("") == []


def test_unknown_characters_are_rejected_with_the_text(tokenizer):
    for text in ("P: hello; rm -rf /", "P: 8/8/8/8/8/8/8/K6k w - - 0 1\t", "A: <|endoftext|>", "P: é"):
        with pytest.raises(ValueError, match="not in the chess vocabulary") as error:
            tokenizer.encode(text)
        assert repr(text[:20])[1:-1][:10] in str(error.value)


def test_saved_tokenizer_json_loads_with_plain_transformers_and_gives_the_same_ids(tokenizer, tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer.save(tmp_path)
    assert (tmp_path / TOKENIZER_FILE).is_file()
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / TOKENIZER_FILE))
    auto = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert auto.eos_token == EOS_TOKEN and auto.eos_token_id == tokenizer.eos_token_id == 0 and auto.pad_token_id == 0
    assert len(auto) == tokenizer.vocab_size
    for line in _sample_lines():
        ids = tokenizer.encode(line)
        assert fast(line, add_special_tokens=False)["input_ids"] == ids
        assert auto(line, add_special_tokens=False)["input_ids"] == ids
        assert auto.decode(ids) == line
    assert ChessTokenizer.load(tmp_path).encode(_sample_lines()[0]) == tokenizer.encode(_sample_lines()[0])
    with pytest.raises(ValueError, match="no loadable chess tokenizer"):
        ChessTokenizer.load(tmp_path / "missing")


def test_fresh_model_uses_the_chess_tokenizer_saves_and_reloads(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = LMModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=192)
    assert config.tokenizer == "chess"
    lm = build_lm(config, seed=0)
    assert isinstance(lm.tokenizer, ChessTokenizer)
    assert (
        lm.model.config.vocab_size == lm.tokenizer.vocab_size
        and lm.model.config.eos_token_id == lm.tokenizer.eos_token_id
    )
    save_lm(lm, tmp_path / "model")
    assert (tmp_path / "model" / TOKENIZER_FILE).is_file() and not (tmp_path / "model" / CHAR_TOKENIZER_FILE).exists()
    loaded = load_lm(tmp_path / "model")
    assert isinstance(loaded.tokenizer, ChessTokenizer)
    line = _sample_lines()[0]
    assert loaded.tokenizer.encode(line) == lm.tokenizer.encode(line)
    for a, b in zip(lm.model.state_dict().values(), loaded.model.state_dict().values()):
        assert torch.equal(a, b)
    # The same directory with nothing but transformers.
    plain_tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "model"), local_files_only=True)
    plain_model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), local_files_only=True)
    ids = torch.tensor([plain_tokenizer(line, add_special_tokens=False)["input_ids"]])
    lm.model.eval()
    with torch.no_grad():
        assert torch.allclose(plain_model(ids).logits, lm.model(ids).logits)


def test_char_tokenizer_is_still_selectable_and_bad_names_are_rejected(tmp_path):
    lm = build_lm(LMModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=64, tokenizer="char"), seed=0)
    assert isinstance(lm.tokenizer, CharTokenizer)
    save_lm(lm, tmp_path / "char")
    assert isinstance(load_lm(tmp_path / "char").tokenizer, CharTokenizer)
    with pytest.raises(ValueError, match="tokenizer must be one of chess, char"):
        LMModelConfig(tokenizer="bpe")
