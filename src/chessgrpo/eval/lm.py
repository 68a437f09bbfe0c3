"""Evaluation of a chess language model on the RookWorld tasks, with intervals.

Completions are decoded greedily by default (temperature 0) from held-out prompts and scored by
the training rewards (`data.rookworld_grading.score_completions`), so "reward" means the same number
in training and evaluation.

- **P: task**: format rate (parses), legal-move rate (mean share of distinct legal moves in M;
  malformed = 0), best-move accuracy (B = the engine's best move), top-5 hit rate (B is among
  the engine's top moves), top-5 overlap of M, evaluation error (mean |E - engine| in pawns over
  the matched moves of well-formed answers, both clipped to +/-eval_clip) and the mean reward.
- **A: task**: format rate, exact next-FEN accuracy, reward accuracy, flag accuracy (both flags
  right), exact next-state accuracy (FEN, reward and flags all right) and the mean reward.
- **Puzzles** via the P: prompt: the first move is B: of the completion; correct when it is the
  solution's first move or mates (as `eval.puzzles`).

P: answers in either layout (RookWorld's M: E: B:, or ``move_first``) are read by the one parser
(`data.rookworld_format.parse_policy_completion`); ``stop_after_move`` grades a move-first model on its move alone.

Proportions carry Wilson intervals, means percentile-bootstrap intervals (`stats`). Every
per-prompt record is kept, so two evaluations of the same prompts compare with paired bootstrap
intervals (`compare_lm_results`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import chess
import numpy as np

from chessgrpo.config import ConfigError, EngineConfig
from chessgrpo.data.rookworld_format import (
    Malformed,
    MoveStop,
    PolicyAnswer,
    environment_step,
    parse_environment_prompt,
    parse_policy_completion,
    policy_prompt,
    policy_prompt_fen,
)
from chessgrpo.data.rookworld_grading import RookWorldRewardConfig, policy_truths_for, score_completions
from chessgrpo.errors import InputError
from chessgrpo.eval.running import EvalContext, Subject
from chessgrpo.models.lm_generation import generate_texts
from chessgrpo.stats import Interval, bootstrap_interval, paired_bootstrap_difference, wilson_interval

POLICY_PROPORTIONS = (
    "p_format_rate",
    "p_best_accuracy",
    "p_best_accuracy_well_formed",
    "p_top5_hit_rate",
    "p_best_legal_rate",
)
POLICY_MEANS = ("p_legal_rate", "p_top5_overlap", "p_eval_error", "p_reward")
ENVIRONMENT_PROPORTIONS = (
    "a_format_rate",
    "a_fen_accuracy",
    "a_reward_accuracy",
    "a_flag_accuracy",
    "a_exact_state_accuracy",
)
ENVIRONMENT_MEANS = ("a_reward",)
PUZZLE_PROPORTIONS = ("puzzle_format_rate", "puzzle_first_move_accuracy")


@dataclasses.dataclass
class LMEvalConfig:
    """`chessgrpo eval lm`: RookWorld task metrics of a chess LM on held-out data, with intervals."""

    data: str = "data/rookworld_tiny"
    """`chessgrpo data rookworld` directory; its `split` is evaluated."""
    split: str = "test"
    policy_prompts: int = 500
    """Held-out P: positions (the first N of the split)."""
    environment_prompts: int = 200
    """Held-out A: prompts (the first N of the split)."""
    puzzles: str | None = None
    """Lichess puzzle CSV solved through the P: prompt; null = skip."""
    max_puzzles: int = 200
    rewards: RookWorldRewardConfig = dataclasses.field(default_factory=RookWorldRewardConfig)
    """Reward weights and the engine node limit (rewards.policy.nodes) used to score answers."""
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    temperature: float = 0.0
    """0 = greedy decoding."""
    max_new_tokens: int = 176
    batch_size: int = 64
    prompt_bos: bool = False
    """Put the tokenizer's BOS (GPT-2: ``<|endoftext|>``) before every prompt, as the upstream RookWorld
    data did before every sample: set it for a downloaded RookWorld-LM-124M, or for a model trained
    with SFT ``prompt_bos`` / GRPO ``task.prompt_bos``, so it is evaluated in the layout it learned."""
    stop_after_move: bool = False
    """Stop each P: answer (and puzzle answer) once its move-first ``B: <move>`` is complete
    (`data.rookworld_format.MoveStop`): a model of ``data rookworld layout=move_first`` is then graded on its move
    alone, as GRPO's ``task.stop_after_move`` trains it; false grades whatever it writes after the move too.
    Answers in the rookworld layout (M: first) are never cut. Either layout is parsed (`parse_policy_completion`)."""
    endgame_positions: int = 0
    """With `endgame_material`: grade the P: task on this many held-out won positions of that material instead of
    the split's P: positions: the set a GRPO run's ``eval.endgame_positions`` holds out for the same data, material,
    colours and seed (`data.fresh_endgames`), so any checkpoint (a GRPO arm's, a control arm's, the SFT start) is
    measured on the same positions, paired. Needs ``rewards.policy.truth=tablebase``. 0 = the split's positions."""
    endgame_material: str | None = None
    """The material of `endgame_positions` (e.g. KQvK): a GRPO run's ``task.fresh_endgames``."""
    endgame_colours: str = "white"
    """The strong side's colour in the `endgame_positions` set: a GRPO run's ``task.fresh_endgame_colours``."""
    endgame_seed: int = 0
    """The seed of the `endgame_positions` set: a GRPO run's ``eval.endgame_seed``."""
    seed: int = 0
    confidence: float = 0.95
    resamples: int = 2000
    device: str = "cpu"
    threads: int = 0
    output: str | None = None
    """Write the full result (metrics and per-prompt records) as JSON here (input of --compare)."""

    def __post_init__(self) -> None:
        if self.endgame_positions < 0:
            raise ConfigError(f"config key endgame_positions must be >= 0, got {self.endgame_positions}")
        if self.endgame_positions and not self.endgame_material:
            raise ConfigError("config key endgame_positions needs endgame_material (e.g. KQvK): the material held out")
        if self.endgame_positions and self.rewards.policy.truth != "tablebase":
            raise ConfigError(
                "config key endgame_positions grades DTZ-optimal moves: set rewards.policy.truth=tablebase"
            )


@dataclasses.dataclass
class LMEvalResult:
    """Metrics with intervals and per-prompt records."""

    metrics: dict[str, Interval]
    records: dict[str, list[dict[str, Any]]]
    """"policy", "environment", "puzzles" -> one dict per prompt (prompt, completion, scores)."""

    def flat(self, prefix: str = "eval/") -> dict[str, float]:
        """{prefix+name, prefix+name_low, prefix+name_high: float} for metrics with items."""
        out = {}
        for name, interval in self.metrics.items():
            if interval.n == 0 or math.isnan(interval.value):
                continue
            out.update(
                {
                    f"{prefix}{name}": interval.value,
                    f"{prefix}{name}_low": interval.low,
                    f"{prefix}{name}_high": interval.high,
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {"metrics": {k: v.to_json() for k, v in self.metrics.items()}, "records": self.records}


def _mean(values: Sequence[float], confidence: float, resamples: int, seed: int) -> Interval:
    return bootstrap_interval(
        np.asarray(values, dtype=np.float64), confidence=confidence, resamples=resamples, seed=seed
    )


def _rate(flags: Sequence[bool], confidence: float) -> Interval:
    return wilson_interval(int(sum(bool(f) for f in flags)), len(flags), confidence)


def distinct_count(moves: Sequence[str]) -> float:
    """How many different B: moves a set of answers holds (a policy collapsed onto a favourite holds few)."""
    return float(len(set(moves)))


def top_share(moves: Sequence[str]) -> float:
    """The share of the most frequent B: move among the answers (NaN without answers)."""
    if not moves:
        return math.nan
    from collections import Counter

    return Counter(moves).most_common(1)[0][1] / len(moves)


def bootstrap_statistic(
    items: Sequence[Any], statistic: Callable[[Sequence[Any]], float], confidence: float, resamples: int, seed: int
) -> Interval:
    """`statistic` of `items` with a percentile-bootstrap interval (items resampled with replacement)."""
    if not items:
        return Interval(math.nan, math.nan, math.nan, 0)
    rng = np.random.default_rng(seed)
    samples = [statistic([items[i] for i in rng.integers(0, len(items), len(items))]) for _ in range(resamples)]
    alpha = (1 - confidence) / 2
    return Interval(
        statistic(items), float(np.quantile(samples, alpha)), float(np.quantile(samples, 1 - alpha)), len(items)
    )


def policy_metrics(
    rows: Sequence[dict[str, Any]], *, confidence: float, resamples: int, seed: int
) -> dict[str, Interval]:
    """P: task metrics with intervals from per-prompt records (`malformed`, `best`, `top5_hit`, `legal`, `top5`, `total`,
    and `eval_error` where the answer had one): Wilson intervals for rates, bootstrap for means."""
    metrics: dict[str, Interval] = {}
    metrics["p_format_rate"] = _rate([r["malformed"] is None for r in rows], confidence)
    metrics["p_best_accuracy"] = _rate([r["best"] == 1.0 for r in rows], confidence)
    # A malformed answer scores no best move, so p_best_accuracy rises with the format alone; this
    # rate among well-formed answers says whether the chess improved too (NaN when none is).
    metrics["p_best_accuracy_well_formed"] = _rate(
        [r["best"] == 1.0 for r in rows if r["malformed"] is None], confidence
    )
    metrics["p_top5_hit_rate"] = _rate([r["top5_hit"] == 1.0 for r in rows], confidence)
    if rows and "best_legal" in rows[0]:  # records from before these keys have neither
        metrics["p_best_legal_rate"] = _rate([r["best_legal"] == 1.0 for r in rows], confidence)
        moves = [r["best_move"] for r in rows if r["best_move"] is not None]
        # A count of distinct values has no percentile-bootstrap interval (resampling with replacement drops
        # values, so every resample counts fewer): the count alone here, the paired ratio of two evaluations
        # (`compare_lm_results`: p_distinct_best_ratio) carries the interval.
        count = distinct_count(moves)
        metrics["p_distinct_best"] = Interval(count, count, count, len(moves))
        metrics["p_top_best_share"] = bootstrap_statistic(moves, top_share, confidence, resamples, seed)
    metrics["p_legal_rate"] = _mean([r["legal"] for r in rows], confidence, resamples, seed)
    metrics["p_top5_overlap"] = _mean([r["top5"] for r in rows], confidence, resamples, seed)
    metrics["p_eval_error"] = _mean([r["eval_error"] for r in rows if "eval_error" in r], confidence, resamples, seed)
    metrics["p_reward"] = _mean([r["total"] for r in rows], confidence, resamples, seed)
    return metrics


def evaluate_lm(
    lm: Any,
    *,
    policy_fens: Sequence[str] = (),
    environment_prompts: Sequence[str] = (),
    puzzles: Sequence[Any] = (),
    pool: Any = None,
    rewards: RookWorldRewardConfig | None = None,
    batch_size: int = 64,
    policy_max_new_tokens: int = 176,
    environment_max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    confidence: float = 0.95,
    resamples: int = 2000,
    progress: Callable[[int], None] | None = None,
    stop_after_move: bool = False,
) -> LMEvalResult:
    """Evaluate `lm` on P: positions, A: prompts and puzzles (see the module docstring); `stop_after_move` ends
    P: answers after a move-first move (`LMEvalConfig.stop_after_move`)."""
    rewards = rewards or RookWorldRewardConfig()
    metrics: dict[str, Interval] = {}
    records: dict[str, list[dict[str, Any]]] = {"policy": [], "environment": [], "puzzles": []}
    common = {"batch_size": batch_size, "temperature": temperature, "seed": seed, "progress": progress}
    policy_stop = {"new_stop": (lambda: MoveStop(lm.tokenizer.decode)) if stop_after_move else None}

    if policy_fens:
        # Written the way the model was taught (its policy_prompt: the FEN, or the FEN and its legal moves).
        prompts = [policy_prompt(fen, lm.policy_prompt) for fen in policy_fens]
        texts = generate_texts(lm, prompts, max_new_tokens=policy_max_new_tokens, **common, **policy_stop)
        scored = score_completions(pool, prompts, texts, rewards)
        truths = policy_truths_for(pool, [policy_prompt_fen(p) for p in prompts], rewards.policy)
        for prompt, text, reward, truth in zip(prompts, texts, scored, truths):
            answer = reward.answer if isinstance(reward.answer, PolicyAnswer) else None
            records["policy"].append(
                {
                    "prompt": prompt,
                    "completion": text,
                    "total": reward.total,
                    "malformed": reward.malformed,
                    **reward.components,
                    "top5_hit": float(answer is not None and answer.best in truth.moves),
                    "engine_best": truth.best,
                    "best_move": answer.best if answer is not None else None,
                    "best_legal": float(answer is not None and answer.best in truth.legal),
                }
            )
        metrics.update(policy_metrics(records["policy"], confidence=confidence, resamples=resamples, seed=seed))

    if environment_prompts:
        texts = generate_texts(lm, list(environment_prompts), max_new_tokens=environment_max_new_tokens, **common)
        scored = score_completions(None, list(environment_prompts), texts, rewards)
        for prompt, text, reward in zip(environment_prompts, texts, scored):
            c = reward.components
            records["environment"].append(
                {
                    "prompt": prompt,
                    "completion": text,
                    "total": reward.total,
                    "malformed": reward.malformed,
                    **c,
                    "exact_state": float(c["fen_exact"] == c["reward"] == c["terminated"] == c["truncated"] == 1.0),
                }
            )
        rows = records["environment"]
        metrics["a_format_rate"] = _rate([r["malformed"] is None for r in rows], confidence)
        metrics["a_fen_accuracy"] = _rate([r["fen_exact"] == 1.0 for r in rows], confidence)
        metrics["a_reward_accuracy"] = _rate([r["reward"] == 1.0 for r in rows], confidence)
        metrics["a_flag_accuracy"] = _rate([r["terminated"] == 1.0 and r["truncated"] == 1.0 for r in rows], confidence)
        metrics["a_exact_state_accuracy"] = _rate([r["exact_state"] == 1.0 for r in rows], confidence)
        metrics["a_reward"] = _mean([r["total"] for r in rows], confidence, resamples, seed)

    if puzzles:
        prompts = [policy_prompt(p.board.fen(), lm.policy_prompt) for p in puzzles]
        texts = generate_texts(lm, prompts, max_new_tokens=policy_max_new_tokens, **common, **policy_stop)
        for puzzle, prompt, text in zip(puzzles, prompts, texts):
            answer = parse_policy_completion(text)
            correct = False
            if not isinstance(answer, Malformed):
                try:
                    move = chess.Move.from_uci(answer.best)
                except ValueError:
                    move = None
                if move is not None and puzzle.board.is_legal(move):
                    board = puzzle.board.copy(stack=False)
                    board.push(move)
                    correct = move == puzzle.solution[0] or board.is_checkmate()
            records["puzzles"].append(
                {
                    "id": puzzle.id,
                    "rating": puzzle.rating,
                    "prompt": prompt,
                    "completion": text,
                    "well_formed": not isinstance(answer, Malformed),
                    "first_move_correct": bool(correct),
                }
            )
        rows = records["puzzles"]
        metrics["puzzle_format_rate"] = _rate([r["well_formed"] for r in rows], confidence)
        metrics["puzzle_first_move_accuracy"] = _rate([r["first_move_correct"] for r in rows], confidence)
    return LMEvalResult(metrics, records)


# ------------------------------------------------------------------------------------------------
# Comparison


def compare_lm_results(
    a: dict[str, Any], b: dict[str, Any], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> dict[str, Interval]:
    """Paired B - A differences over the prompts both evaluations hold (records of `LMEvalResult.to_json`); P:
    records pair by their position (`policy_prompt_fen`), so models prompted in different styles pair too.

    P: reward, best-move accuracy (B: earns full credit, as the metric counts it), the mean best-move credit (graded
    modes: partial credit too), top-5 hit, legal rate, format rate, the ratio of distinct greedy B: moves, and best-move accuracy and reward
    over the prompts well-formed in both (``*_well_formed``: the chess, not the format); A: reward, exact state.
    """
    out: dict[str, Interval] = {}
    specs = {
        "policy": {
            "p_reward": "total",
            "p_best_accuracy": "best_is_right",
            "p_best_credit": "best",
            "p_top5_hit_rate": "top5_hit",
            "p_legal_rate": "legal",
            "p_format_rate": None,
        },
        "environment": {"a_reward": "total", "a_exact_state_accuracy": "exact_state", "a_format_rate": None},
    }
    for task, names in specs.items():
        first = {_pairing_key(r): r for r in a.get("records", {}).get(task, [])}
        second = {_pairing_key(r): r for r in b.get("records", {}).get(task, [])}
        shared = [p for p in first if p in second]
        if not shared:
            continue
        for metric, key in names.items():

            def value(record: dict[str, Any], key: str | None = key) -> float:
                if key is None:
                    return float(record["malformed"] is None)
                if (
                    key == "best_is_right"
                ):  # as the metric p_best_accuracy counts it: full credit (graded) or exact match
                    return float(record["best"] == 1.0)
                return float(record[key])

            out[metric] = paired_bootstrap_difference(
                [value(second[p]) for p in shared],
                [value(first[p]) for p in shared],
                confidence=confidence,
                resamples=resamples,
                seed=seed,
            )
        if task == "policy":
            # The chess alone: over the prompts answered well-formed in both, so a format gain cannot show here.
            both = [p for p in shared if first[p]["malformed"] is None and second[p]["malformed"] is None]
            if shared and "best_move" in first[shared[0]] and "best_move" in second[shared[0]]:
                out["p_distinct_best_ratio"] = _paired_distinct_ratio(
                    [first[p]["best_move"] for p in shared],
                    [second[p]["best_move"] for p in shared],
                    confidence,
                    resamples,
                    seed,
                )
            if both:
                for metric, value_of in (
                    ("p_best_accuracy_well_formed", lambda r: float(r["best"] == 1.0)),
                    ("p_reward_well_formed", lambda r: float(r["total"])),
                ):
                    out[metric] = paired_bootstrap_difference(
                        [value_of(second[p]) for p in both],
                        [value_of(first[p]) for p in both],
                        confidence=confidence,
                        resamples=resamples,
                        seed=seed,
                    )
    return out


def _pairing_key(record: dict[str, Any]) -> str:
    """What pairs a record across two evaluations: a P: prompt's position (either prompt style), else the prompt."""
    prompt = str(record["prompt"])
    return policy_prompt_fen(prompt) if prompt.lstrip().startswith("P:") else prompt


def _paired_distinct_ratio(
    a: Sequence[str | None], b: Sequence[str | None], confidence: float, resamples: int, seed: int
) -> Interval:
    """distinct B: moves of `b` / distinct of `a` over the same prompts (ill-formed answers left out), with a
    paired bootstrap over prompts: below 1 when a policy collapses onto fewer moves."""

    def ratio(indices: Sequence[int]) -> float:
        first = {a[i] for i in indices if a[i] is not None}
        second = {b[i] for i in indices if b[i] is not None}
        return len(second) / len(first) if first else math.nan

    n = len(a)
    rng = np.random.default_rng(seed)
    samples = np.array([ratio(rng.integers(0, n, n).tolist()) for _ in range(resamples)])
    samples = samples[~np.isnan(samples)]
    alpha = (1 - confidence) / 2
    if not len(samples):
        return Interval(math.nan, math.nan, math.nan, n)
    # The basic (reverse-percentile) bootstrap: resampling with replacement drops moves from both sets unequally,
    # so the percentile interval sits off-centre (on the issue-51 run it excluded its own point estimate).
    value = ratio(range(n))
    low, high = float(np.quantile(samples, alpha)), float(np.quantile(samples, 1 - alpha))
    return Interval(value, 2 * value - high, 2 * value - low, n)


@dataclasses.dataclass
class LMEvalItems:
    """The held-out prompts of an LM evaluation: the first N P: positions and A: prompts of the split, and puzzles."""

    policy_fens: list[str]
    environment_prompts: list[str]
    puzzles: list[Any]


def load_lm_items(config: LMEvalConfig) -> LMEvalItems:
    """The held-out items `config` names: the first `policy_prompts` P: positions (or the `endgame_positions` set)
    and `environment_prompts` A: prompts of its data's `split`, and `max_puzzles` puzzles (seeded) of `puzzles`."""
    from chessgrpo.data.rookworld import read_rookworld

    examples = read_rookworld(config.data, config.split)
    fens = [e.fen for e in examples if e.task == "policy"][: config.policy_prompts]
    if config.endgame_positions:
        from chessgrpo.data.fresh_endgames import fresh_endgame_starts, held_out_endgame_fens
        from chessgrpo.data.rookworld_grading import shared_tablebase

        assert config.endgame_material is not None  # checked by the config
        tablebase = shared_tablebase(config.rewards.policy.syzygy_path)
        starts = fresh_endgame_starts(config.data, config.endgame_material, tablebase, colours=config.endgame_colours)
        fens = held_out_endgame_fens(starts, config.endgame_positions, seed=config.endgame_seed)
    prompts = [e.prompt for e in examples if e.task == "environment"][: config.environment_prompts]
    puzzles: list[Any] = []
    if config.puzzles:
        from chessgrpo.eval.puzzles import read_puzzles

        puzzles = list(read_puzzles(config.puzzles, config.max_puzzles, config.seed).puzzles)
    return LMEvalItems(fens, prompts, puzzles)


@dataclasses.dataclass
class LMEvalRun:
    """One LM evaluation: the config, the model's source, its items and its result."""

    config: LMEvalConfig
    result: LMEvalResult
    items: LMEvalItems
    source: str
    """Where the model came from (`ChessLM.source`)."""
    checkpoint: str | None = None
    """The checkpoint evaluated (a command's ``--checkpoint``); None for a model in memory."""

    def to_json(self) -> dict[str, Any]:
        """The result file's payload: the checkpoint (a command's), the metrics and the per-prompt records."""
        return {**({"checkpoint": self.checkpoint} if self.checkpoint is not None else {}), **self.result.to_json()}

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        return self.result.flat(prefix)


def run_lm(config: LMEvalConfig, subject: Subject, context: EvalContext) -> LMEvalRun:
    """The registry's runner of ``lm``: a chess LM checkpoint (loaded for RL decoding, BOS before prompts with
    `config.prompt_bos`) or a model in memory (a training run's, used as it is) answers the held-out prompts.

    The items are ``context.items["lm"]`` (`LMEvalItems`) when given, else `load_lm_items` once, kept there. The
    P: answers are graded through ``context.pool`` when lent, else a pool started for an engine truth."""
    import torch

    from chessgrpo.engine import EnginePool

    if config.threads:
        torch.set_num_threads(config.threads)
    if subject.checkpoint is not None:
        from chessgrpo.models.lm import load_lm, prepare_for_rl
        from chessgrpo.models.prompt_bos import with_prompt_bos

        lm = load_lm(subject.checkpoint, device=config.device)
        prepare_for_rl(lm.model)
        lm = with_prompt_bos(lm, config.prompt_bos)  # prompts only: completions are decoded as generated
    elif subject.model is not None:
        lm = subject.model
    else:
        raise InputError(f"eval lm evaluates a chess LM checkpoint, not the baseline {subject.policy!r}")
    items = context.items.get("lm")
    if items is None:
        items = context.items["lm"] = load_lm_items(config)
    with contextlib.ExitStack() as stack:
        pool = context.pool
        engine_truth = config.rewards.policy.truth == "engine"  # a tablebase truth needs no engine
        if pool is None and items.policy_fens and engine_truth:
            pool = stack.enter_context(EnginePool.from_config(config.engine))
        total = len(items.policy_fens) + len(items.environment_prompts) + len(items.puzzles)
        with context.progress(total, "eval lm") as bar:
            result = evaluate_lm(
                lm,
                policy_fens=items.policy_fens,
                environment_prompts=items.environment_prompts,
                puzzles=items.puzzles,
                pool=pool,
                rewards=config.rewards,
                batch_size=config.batch_size,
                policy_max_new_tokens=config.max_new_tokens,
                environment_max_new_tokens=config.max_new_tokens,
                temperature=config.temperature,
                seed=config.seed,
                confidence=config.confidence,
                resamples=config.resamples,
                progress=bar.update,
                stop_after_move=config.stop_after_move,
            )
    checkpoint = str(subject.checkpoint) if subject.checkpoint is not None else None
    return LMEvalRun(config, result, items, str(getattr(lm, "source", subject.label)), checkpoint)


def environment_truth(prompt: str):
    """The truth of an A: prompt (for callers that show it next to a completion)."""
    query = parse_environment_prompt(prompt)
    return environment_step(query.fen, query.move)
