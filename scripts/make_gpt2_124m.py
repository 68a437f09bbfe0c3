"""Write a GPT-2 124M-shaped model (random init) with an offline byte-level BPE to a local directory.

    .venv/bin/python scripts/make_gpt2_124m.py --out runs/gpt2_124m

The result is laid out like a downloaded RookWorld-LM-124M (``save_pretrained`` weights + a
`transformers` tokenizer), so ``model.path`` / ``init_checkpoint`` load it with no network. It is
for measuring memory and speed (docs/lm_124m.md), not for playing: the weights are random.

- model: ``GPT2Config()`` defaults (12 layers, 768 wide, 12 heads, 1024 positions, 50257 tokens);
- tokenizer: a byte-level BPE trained on data/rookworld_samples.txt (a few thousand
  tokens, ``<|endoftext|>`` as BOS/EOS/pad). The model's vocabulary stays 50257 (like GPT-2's), so
  the LM head and every log-softmax have the real 124M cost; ids past the tokenizer are never sampled
  by a trained model and decode to nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def train_bpe(samples: list[str], vocab_size: int):
    """A byte-level BPE (`PreTrainedTokenizerFast`) trained on `samples`, EOS ``<|endoftext|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(samples, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


def make_gpt2_124m(
    out: Path, samples_path: Path, *, vocab_size: int = 2000, seed: int = 0, shape: dict | None = None
) -> Path:
    """Write the model and tokenizer to `out`; returns it. `shape`: GPT2Config fields to change (n_layer, n_embd,
    n_head, n_positions) for a smaller stand-in (scripts/gpu_check.sh --dry-run); None = the 124M defaults."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    samples = [line for line in samples_path.read_text().splitlines() if line and not line.startswith("#")]
    fast = train_bpe(samples, vocab_size)
    config = GPT2Config(
        eos_token_id=fast.eos_token_id, bos_token_id=fast.eos_token_id, **(shape or {})
    )  # 124M defaults
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    fast.save_pretrained(str(out))
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {params / 1e6:.1f}M parameters, model vocab {config.vocab_size}, tokenizer {len(fast)} tokens")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/gpt2_124m"))
    parser.add_argument("--samples", type=Path, default=Path("data/rookworld_samples.txt"))
    parser.add_argument("--bpe-vocab", type=int, default=2000, help="BPE merges target (the model keeps 50257)")
    parser.add_argument("--seed", type=int, default=0)
    # A smaller model of the same family and vocabulary (tests and CPU dry runs); the defaults are GPT-2 124M's.
    for name in ("n_layer", "n_embd", "n_head", "n_positions"):
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=None, help=f"GPT2Config {name} (default: 124M's)"
        )
    args = parser.parse_args()
    shape = {
        name: getattr(args, name)
        for name in ("n_layer", "n_embd", "n_head", "n_positions")
        if getattr(args, name) is not None
    }
    make_gpt2_124m(args.out, args.samples, vocab_size=args.bpe_vocab, seed=args.seed, shape=shape)


if __name__ == "__main__":
    main()
