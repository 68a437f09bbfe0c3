"""Pretraining throughput through the real input pipeline against the model alone, in one process.

    python bench/pretrain_pipeline.py --data data/tiny --size small --batch 1024 --device cuda --json out.json
    python bench/pretrain_pipeline.py --data data/tiny --size tiny --batch 256 --device cpu --threads 1

One `Trainer` of `configs/pretrain_tiny.yaml` (move facts with the optional facts, value head) with the
model size, batch, device and precision given; every variant runs the same `Trainer.train_step` (the
kind's forward, losses, metrics, the loop's update and CUDA synchronisation), and only where the step's
batch comes from changes:

- ``model_only``: one batch built and put on the device once, reused every step (`PretrainKind.next_batch`
  replaced): the step without the input pipeline;
- ``pipeline_prefetch0``: the real pipeline with ``prefetch_batches: 0``: the sampler's next indices, the
  batch gathered from the dataset in memory and copied to the device inside the step (before issue 53);
- ``pipeline_prefetchK``: ``prefetch_batches: K`` (`--prefetch`): batches built ahead in a background
  thread, pinned, copied asynchronously.

The variants alternate within each of `--repeats` rounds (`--warmup` untimed steps after each switch, then a
window of `--steps` timed steps), so a slow spell of the machine hits all of them; samples/s is the median
over the rounds' windows, and the ratios pipeline / model-only are of those medians, measured in the same
run. Also measured: host milliseconds to build one batch (int64 inputs as the in-step path builds them,
uint8 + pinned as the prefetch thread does) and, on CUDA, to copy one to the device.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from chessgrpo.config import load_config  # noqa: E402 (after the sys.path entry above)
from chessgrpo.tasks.kinds.pretrain import PretrainKind, PretrainTrainConfig  # noqa: E402
from chessgrpo.train.loop import Trainer  # noqa: E402


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine(device: torch.device) -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def build_config(args: argparse.Namespace, out_dir: str) -> PretrainTrainConfig:
    overrides = [
        f"data={args.data}",
        f"model.size={args.size}",
        f"batch_size={args.batch}",
        f"device={args.device}",
        f"bf16={str(args.bf16).lower()}",
        f"compile={str(args.compile).lower()}",
        f"threads={args.threads}",
        f"run.out_dir={out_dir}",
        "run.name=bench",
        "steps=1000000",
        "warmup_steps=10",
        "eval_every=0",
        "checkpoint_every=0",
        "log_every=1000000",
        f"prefetch_batches={args.prefetch}",
    ]
    return load_config(PretrainTrainConfig, ROOT / "configs" / "pretrain_tiny.yaml", overrides)


def host_costs(kind: PretrainKind, device: torch.device, batch: int, count: int = 10) -> dict[str, float]:
    """Median milliseconds to build one batch on the host (both paths) and to copy one to the device."""
    data, generator = kind.train_data, torch.Generator().manual_seed(0)
    draws = [torch.randint(len(data), (batch,), generator=generator) for _ in range(count)]

    def median_ms(fn) -> float:
        fn(draws[0])
        times = []
        for indices in draws:
            tick = time.perf_counter()
            fn(indices)
            times.append(time.perf_counter() - tick)
        return 1000 * statistics.median(times)

    out = {
        "build_int64_ms": median_ms(lambda i: data.batch(i)),
        "build_uint8_ms": median_ms(lambda i: data.batch(i, token_dtype=torch.uint8)),
    }
    if device.type == "cuda":
        out["build_uint8_pinned_ms"] = median_ms(lambda i: data.batch(i, token_dtype=torch.uint8).pin_memory())
        pinned = data.batch(draws[0], token_dtype=torch.uint8).pin_memory()

        def copy(_: torch.Tensor) -> None:
            pinned.to(device)
            synchronize(device)

        out["copy_uint8_to_device_ms"] = median_ms(copy)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every variant, alternated; the result dict that --json writes."""
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    variants = ["model_only", "pipeline_prefetch0", f"pipeline_prefetch{args.prefetch}"]
    windows: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as out_dir, Trainer(build_config(args, out_dir)) as trainer:
        kind = trainer.kind
        assert isinstance(kind, PretrainKind)
        info = {
            **machine(device),
            "size": args.size,
            "batch": args.batch,
            "bf16": args.bf16,
            "compile": args.compile,
            "parameters": kind.model.num_parameters(),
            "positions": len(kind.train_data),
            "data": str(args.data),
            "input_columns": kind.model.input_length,
        }
        real_next_batch, base_config = kind.next_batch, kind.config
        fixed = real_next_batch()  # the model-only batch: on the device, reused

        def use(variant: str) -> None:
            kind.close()  # stops a prefetch thread of the previous variant
            kind.next_batch = (lambda: fixed) if variant == "model_only" else real_next_batch  # type: ignore[method-assign]
            prefetch = int(variant.removeprefix("pipeline_prefetch")) if variant != "model_only" else 0
            kind.config = dataclasses.replace(base_config, prefetch_batches=prefetch)

        for round_ in range(args.repeats):
            for variant in variants:
                use(variant)
                for _ in range(args.warmup):
                    trainer.train_step()
                synchronize(device)
                tick = time.perf_counter()
                for _ in range(args.steps):
                    trainer.train_step()
                synchronize(device)
                windows[variant].append(args.batch * args.steps / (time.perf_counter() - tick))
            print(
                f"round {round_ + 1}/{args.repeats}: " + ", ".join(f"{v} {windows[v][-1]:,.0f}" for v in variants),
                file=sys.stderr,
                flush=True,
            )
        use("model_only")
        costs = host_costs(kind, device, args.batch)
    rows = [
        {
            "variant": v,
            "samples_per_s": statistics.median(windows[v]),
            "windows": windows[v],
            "step_ms": 1000 * args.batch / statistics.median(windows[v]),
        }
        for v in variants
    ]
    model_only = rows[0]["samples_per_s"]
    ratios = {f"{row['variant']}_over_model_only": row["samples_per_s"] / model_only for row in rows[1:]}
    return {
        "meta": info,
        "rows": rows,
        "ratios": ratios,
        "host": costs,
        "prefetch": args.prefetch,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
    }


def table(result: dict[str, Any]) -> str:
    meta = result["meta"]
    where = meta.get("gpu", f"cpu, {meta['torch_threads']} threads")
    head = (
        f"{meta['size']} ({meta['parameters'] / 1e6:.2f}M parameters), batch {meta['batch']}, "
        f"{'bf16' if meta['bf16'] else 'fp32'}, {where}, torch {meta['torch']}"
    )
    lines = [head, "| variant | samples/s (median) | ms/step | / model-only |", "|---|---|---|---|"]
    model_only = result["rows"][0]["samples_per_s"]
    for row in result["rows"]:
        lines.append(
            f"| {row['variant']} | {row['samples_per_s']:,.0f} | {row['step_ms']:.1f} | {row['samples_per_s'] / model_only:.2f} |"
        )
    lines.append("host: " + ", ".join(f"{k} {v:.2f}" for k, v in result["host"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", default="data/tiny", help="dataset directory (train split; `chessgrpo data generate`)"
    )
    parser.add_argument("--size", default="small", help="model size (tiny, small, medium)")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=None, help="bf16 autocast (default: on CUDA)"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = one per core)")
    parser.add_argument("--prefetch", type=int, default=2, help="prefetch_batches of the prefetching variant")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per window")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after each switch of variant")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the variants alternate within each")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    if args.prefetch < 1:
        parser.error(f"--prefetch must be >= 1 (the prefetch0 variant always runs), got {args.prefetch}")
    if args.bf16 is None:
        args.bf16 = args.device.startswith("cuda")
    result = run(args)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
