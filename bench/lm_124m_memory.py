"""Peak memory and time of the GRPO learner phase of configs/rookworld_124m.yaml at full completion length.

    OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python bench/lm_124m_memory.py --model runs/gpt2_124m

A rollout of `--rows` rows (prompt `--prompt-tokens`, completion `--new-tokens`, random ids: the cost
does not depend on them) is scored as the sampler does (behaviour log-probs in row chunks, no
gradient), then one `rl.optimize` minibatch with micro-batches and AdamW runs on it: the learner's
peak with the shipped shape, without waiting for a random model to generate the completions.
Prints seconds per phase and the peak RSS (ru_maxrss) after each.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch


def rss_gb() -> float:
    """Peak resident set size of this process so far, GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def main() -> None:
    from chessgrpo.models.lm import completion_log_probs, load_lm, prepare_for_rl
    from chessgrpo.rl import GRPOConfig, KLController, RolloutBatch, optimize
    from chessgrpo.tasks.lm_rollout import make_forward
    from chessgrpo.train.learner import Learner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/gpt2_124m")
    parser.add_argument("--rows", type=int, default=64, help="rows of the minibatch")
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--chunk-rows", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    lm = load_lm(args.model)
    model = prepare_for_rl(lm.model)
    vocab = lm.tokenizer.vocab_size
    prompt_ids = torch.randint(0, vocab, (args.rows, args.prompt_tokens))
    completion_ids = torch.randint(0, vocab, (args.rows, args.new_tokens))
    prompt_mask = torch.ones_like(prompt_ids, dtype=torch.bool)
    completion_mask = torch.ones_like(completion_ids, dtype=torch.bool)
    print(f"loaded: peak RSS {rss_gb():.2f} GB", flush=True)

    tick = time.perf_counter()
    with torch.no_grad():
        behaviour, _ = completion_log_probs(
            model,
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            temperature=0.5,
            with_entropy=True,
            chunk_rows=args.chunk_rows,
        )
    print(
        f"behaviour log-probs + entropy ({args.rows} rows, chunks of {args.chunk_rows}): {time.perf_counter() - tick:.1f} s, "
        f"peak RSS {rss_gb():.2f} GB",
        flush=True,
    )

    batch = RolloutBatch(
        inputs={"prompt_ids": prompt_ids, "prompt_mask": prompt_mask},
        actions=completion_ids,
        behaviour_logp=behaviour,
        mask=completion_mask,
        rewards=torch.arange(args.rows, dtype=torch.float32) % 3,
        group_ids=torch.arange(args.rows) // 8,
        ref_logp=behaviour.clone(),
    )
    config = GRPOConfig(micro_batch_size=args.micro_batch_size, kl_coef=0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-6)
    tick = time.perf_counter()
    update = Learner(optimizer, list(model.parameters()), max_grad_norm=1.0).update
    metrics = optimize(
        batch,
        make_forward(model, temperature=0.5, chunk_rows=args.chunk_rows, entropy_grad=False),
        update,
        config,
        KLController.from_config(config),
        parameters=list(model.parameters()),
        generator=None,
    )
    print(
        f"learner minibatch ({args.rows} rows, micro-batches of {args.micro_batch_size}, AdamW step): "
        f"{time.perf_counter() - tick:.1f} s, peak RSS {rss_gb():.2f} GB, first ratio dev {metrics['ratio/first_max_abs_dev']:.2e}",
        flush=True,
    )


if __name__ == "__main__":
    main()
