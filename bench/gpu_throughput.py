"""GPU figures of the two model families: action-policy training throughput (with MFU) and LM generation.

Two measurements, each a median of `--repeats` timed windows after warm-up, every setting in one
process so the ratios are measured in the same run:

``policy``: supervised training steps (forward, cross-entropy to a target move, backward, AdamW)
of the action policy at each named size and batch, fp32 vs bf16 autocast, eager vs
``torch.compile``. Positions/s, and model FLOP utilisation: FLOPs of one step counted by
``torch.utils.flop_counter.FlopCounterMode`` (the real matmuls and attention of this model, not
a 6N rule of thumb) over the step time, against the card's dense peak (`--peak-tflops`, default
by device name: H100 SXM 989 bf16 / 494.5 tf32).

``lm``: batched sampling with a KV cache (`models.lm_generation.generate`, the RL sampler) from a
GPT-2 124M-shaped model (12 x 768, 50257-token vocabulary, random init, a byte-level BPE trained
offline on the shared RookWorld samples so prompts are real P: / A: prompts), in completions/s at
each batch size, fp32 and bf16. Completions are cut at `--new-tokens` (random weights never stop
on their own), so completions/s is for answers of exactly that length.

    python bench/gpu_throughput.py policy --json out.json
    python bench/gpu_throughput.py lm --batches 1,16,64,256 --json out.json

Runs on CPU too (small settings), which is how its code is checked without a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from chessgrpo.board.actions import NUM_ACTIONS  # noqa: E402
from chessgrpo.board.encoding import SEQUENCE_LENGTH  # noqa: E402
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, log_probs  # noqa: E402

# Dense peak TFLOP/s (no sparsity) by a substring of the device name: (bf16, tf32/fp32-matmul).
PEAKS = {"H100": (989.0, 494.5), "H200": (989.0, 494.5), "A100": (312.0, 156.0), "L4": (121.0, 60.0)}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_tflops(device: torch.device, bf16: bool, given: float | None) -> float | None:
    if given:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, (bf, tf) in PEAKS.items():
        if key in name:
            return bf if bf16 else tf
    return None


def random_policy_batch(
    batch: int, move_facts: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs with the token layout's value ranges, a legal mask with ~35 legal moves, a legal target."""
    generator = torch.Generator().manual_seed(0)
    board = torch.randint(0, 31, (batch, SEQUENCE_LENGTH), generator=generator, dtype=torch.uint8)
    inputs = board
    if move_facts:
        inputs = torch.cat(
            [board, torch.randint(0, 2, (batch, NUM_ACTIONS), generator=generator, dtype=torch.uint8)], dim=1
        )
    legal = torch.rand(batch, NUM_ACTIONS, generator=generator) < 35 / NUM_ACTIONS
    legal[:, 0] = True
    target = torch.multinomial(legal.float(), 1, generator=generator).squeeze(1)
    return inputs.to(device), legal.to(device), target.to(device)


def policy_step_fn(model: ActionPolicy, optimizer: torch.optim.Optimizer, bf16: bool, device: torch.device):
    def step(inputs: torch.Tensor, legal: torch.Tensor, target: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(inputs)
        loss = F.nll_loss(log_probs(logits, legal), target)  # log-probs in fp32, as in training
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def count_step_flops(size: str, batch: int, move_facts: bool, device: torch.device) -> int:
    """FLOPs of one training step (forward + backward), counted on a fresh model in fp32 eager."""
    from torch.utils.flop_counter import FlopCounterMode

    model = ActionPolicy(PolicyConfig(**{**PolicyConfig.from_size(size).__dict__, "move_facts": move_facts})).to(device)
    inputs, legal, target = random_policy_batch(batch, move_facts, device)
    counter = FlopCounterMode(display=False)
    with counter:
        loss = F.nll_loss(log_probs(model(inputs), legal), target)
        loss.backward()
    return int(counter.get_total_flops())


def time_policy(
    size: str,
    batch: int,
    bf16: bool,
    compiled: bool,
    move_facts: bool,
    device: torch.device,
    steps: int,
    warmup: int,
    repeats: int,
) -> dict:
    torch.manual_seed(0)
    model = ActionPolicy(PolicyConfig(**{**PolicyConfig.from_size(size).__dict__, "move_facts": move_facts})).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    if compiled:
        model.compile()
    step = policy_step_fn(model, optimizer, bf16, device)
    inputs, legal, target = random_policy_batch(batch, move_facts, device)
    tick = time.perf_counter()
    for _ in range(warmup):
        step(inputs, legal, target)
    synchronize(device)
    warm_s = time.perf_counter() - tick
    windows = []
    for _ in range(repeats):
        synchronize(device)
        tick = time.perf_counter()
        for _ in range(steps):
            step(inputs, legal, target)
        synchronize(device)
        windows.append((time.perf_counter() - tick) / steps)
    step_s = statistics.median(windows)
    peak_mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {
        "size": size,
        "batch": batch,
        "bf16": bf16,
        "compile": compiled,
        "move_facts": move_facts,
        "parameters": model.num_parameters(),
        "step_ms": 1000 * step_s,
        "positions_per_s": batch / step_s,
        "warmup_s": warm_s,
        "peak_mem_gib": peak_mem,
    }


def run_policy(args: argparse.Namespace, device: torch.device) -> list[dict]:
    rows = []
    flops: dict[tuple[str, int], int] = {}
    for size in args.sizes.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            try:
                flops[(size, batch)] = count_step_flops(size, batch, args.move_facts, device)
            except torch.OutOfMemoryError:
                print(f"{size} batch {batch}: out of memory (counting FLOPs in fp32), skipped", flush=True)
                torch.cuda.empty_cache()
                continue
            for bf16 in [False, True] if args.precisions == "both" else [args.precisions == "bf16"]:
                for compiled in [False, True] if args.compile == "both" else [args.compile == "on"]:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats(device)
                    try:
                        row = time_policy(
                            size, batch, bf16, compiled, args.move_facts, device, args.steps, args.warmup, args.repeats
                        )
                    except torch.OutOfMemoryError:
                        print(f"{size} batch {batch}: out of memory, skipped", flush=True)
                        torch.cuda.empty_cache()
                        continue
                    row["step_gflop"] = flops[(size, batch)] / 1e9
                    achieved = flops[(size, batch)] / (row["step_ms"] / 1000) / 1e12
                    row["achieved_tflops"] = achieved
                    peak = peak_tflops(device, bf16, args.peak_tflops)
                    row["mfu"] = achieved / peak if peak else None
                    rows.append(row)
                    mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
                    print(
                        f"{size:>6} batch {batch:>5} {'bf16' if bf16 else 'fp32'} {'compiled' if compiled else 'eager   '}: "
                        f"{row['positions_per_s']:>10,.0f} positions/s  {row['step_ms']:7.2f} ms/step  "
                        f"{achieved:6.1f} TFLOP/s  MFU {mfu}  ({row['parameters'] / 1e6:.2f}M params)",
                        flush=True,
                    )
    return rows


# ------------------------------------------------------------------------------------------------
# LM generation


def gpt2_124m_with_offline_bpe(device: torch.device, n_layer: int, n_embd: int, n_head: int):
    """A GPT-2 124M-shaped model (random init) and a byte-level BPE trained on the shared samples."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from chessgrpo.paths import resolve_data_path

    samples = Path(resolve_data_path("data/rookworld_samples.txt")).read_text().splitlines()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(samples, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    config = GPT2Config(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_positions=1024,
        vocab_size=50257,
        eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).to(device).eval()
    prompts = []  # the task prompts as RL samples them: a P: line up to M:, an A: line up to its third '+'
    for line in samples:
        if line.startswith("P: ") and "M:" in line:
            prompts.append(fast.encode(line[: line.index("M:")]))
        elif line.startswith("A: ") and line.count("+") >= 3:
            prompts.append(fast.encode("+".join(line.split("+")[:3]) + "+"))
    return model, fast, prompts


def run_lm(args: argparse.Namespace, device: torch.device) -> list[dict]:
    from chessgrpo.models.lm_generation import generate

    model, tokenizer, prompts = gpt2_124m_with_offline_bpe(device, args.n_layer, args.n_embd, args.n_head)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"GPT-2 shape {args.n_layer} x {args.n_embd}, {parameters / 1e6:.1f}M parameters, {len(prompts)} prompts "
        f"(median {statistics.median(len(p) for p in prompts)} tokens)",
        flush=True,
    )
    rows = []
    for bf16 in [False, True] if args.precisions == "both" else [args.precisions == "bf16"]:
        dtype = torch.bfloat16 if bf16 else torch.float32
        model.to(dtype)
        for batch in [int(b) for b in args.batches.split(",")]:
            batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]
            generator = torch.Generator(device=device).manual_seed(0)

            def once(
                batch_prompts: list[str] = batch_prompts, generator: torch.Generator = generator, batch: int = batch
            ) -> float:
                synchronize(device)
                tick = time.perf_counter()
                out = generate(
                    model,
                    batch_prompts,
                    eos_token_id=-1,
                    max_new_tokens=args.new_tokens,
                    temperature=1.0,
                    generator=generator,
                    pad_token_id=tokenizer.eos_token_id,
                )
                synchronize(device)
                assert out.completion_ids.shape == (batch, args.new_tokens)
                return time.perf_counter() - tick

            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for _ in range(args.warmup):
                once()
            seconds = statistics.median(once() for _ in range(args.repeats))
            row = {
                "batch": batch,
                "bf16": bf16,
                "new_tokens": args.new_tokens,
                "seconds": seconds,
                "completions_per_s": batch / seconds,
                "tokens_per_s": batch * args.new_tokens / seconds,
                "parameters": parameters,
                "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            }
            rows.append(row)
            print(
                f"{'bf16' if bf16 else 'fp32'} batch {batch:>4}: {row['completions_per_s']:8.1f} completions/s "
                f"({row['tokens_per_s']:9.0f} tokens/s, {seconds:.2f} s per batch of {args.new_tokens}-token answers)",
                flush=True,
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    policy = sub.add_parser("policy", help="action-policy training throughput and MFU")
    policy.add_argument("--sizes", default="tiny,small,medium")
    policy.add_argument("--batches", default="256,1024,4096")
    policy.add_argument("--precisions", choices=["fp32", "bf16", "both"], default="both")
    policy.add_argument("--compile", choices=["off", "on", "both"], default="both")
    policy.add_argument(
        "--move-facts", action="store_true", help="inputs with the 1968 move-fact bytes (the recipe's policies)"
    )
    policy.add_argument(
        "--peak-tflops", type=float, help="the card's dense peak for the chosen precision (default: by name)"
    )
    policy.add_argument("--steps", type=int, default=20)
    policy.add_argument("--warmup", type=int, default=5)
    lm = sub.add_parser("lm", help="LM generation throughput (GPT-2 124M shape)")
    lm.add_argument("--batches", default="1,16,64,256")
    lm.add_argument("--precisions", choices=["fp32", "bf16", "both"], default="both")
    lm.add_argument("--new-tokens", type=int, default=64)
    lm.add_argument("--n-layer", type=int, default=12)
    lm.add_argument("--n-embd", type=int, default=768)
    lm.add_argument("--n-head", type=int, default=12)
    lm.add_argument("--warmup", type=int, default=1)
    for p in (policy, lm):
        p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
        p.add_argument("--repeats", type=int, default=3)
        p.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 rows use TF32 tensor cores, as a GPU user would
        torch.backends.cudnn.allow_tf32 = True
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}", flush=True)
    else:
        print(f"device: cpu ({torch.get_num_threads()} threads), torch {torch.__version__}", flush=True)
    rows = run_policy(args, device) if args.what == "policy" else run_lm(args, device)
    if args.json:
        meta = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
