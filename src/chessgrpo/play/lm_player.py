"""The chess language model as a player: one legal move per position from its P: answer.

`LMPlayer.choose(boards)` asks the LM, for each board, the RookWorld policy prompt
``"P: <FEN>"`` (`data.rookworld_format.policy_prompt`) and decodes the completion greedily
(`models.lm_generation.generate_texts`, batched). When the completion parses (`parse_policy_completion`) and
its ``B:`` move is legal, that is the move. Otherwise the board's completion is **re-sampled** at
`LMPlayerConfig.retry_temperature` (a seeded `torch.Generator`) up to `retries` times, and the
first legal ``B:`` is played. When none is, the **fallback** is a uniformly random legal move
(a seeded `random.Random`): the weakest neutral choice, so fallbacks can only make the LM look
weaker than it is, never stronger (a fallback to an engine or to the LM's own M: list would lend
it strength it did not show).

Only ``B:`` is played; ``M:`` and ``E:`` must parse (the answer is read as a whole) but are not
used. The LM sees the FEN only, not the game's history, so it cannot know about repetitions.

**Either answer layout** (`data.rookworld_format.POLICY_LAYOUTS`), told by the first generated marker: an
answer that starts with ``B:`` (a ``data rookworld layout=move_first`` model) stops generating as soon as its
move is complete (`data.rookworld_format.MoveStop`: the player needs the move only, and a move-first model's
M:/E: after it are not read); one that starts with ``M:`` (RookWorld's layout) is generated to its end as before.

Counters (`LMPlayerStats`), as fractions of moves (`rates`):

- ``ill_formed``: the greedy answer did not parse;
- ``illegal``: it parsed, but its ``B:`` was not a legal move (or not one of the allowed moves);
- ``resampled``: a failed greedy answer fixed by a re-sample;
- ``fallback``: no legal ``B:`` after the re-samples: the random move was played.

So ``ill_formed + illegal = resampled + fallback``: every failed greedy answer is either fixed or
replaced.

**A clock** (`choose`'s ``should_stop``, asked before each generation: `uci.lm` asks its UCI
``go``'s deadline) can end the asking early: re-samples it cuts leave the random fallback (counted as
``fallback``), and a move it leaves no time to ask the LM at all is the random move too, counted as
``no_time`` (not in the sum above: no answer failed; `LMPlayerStats.line` shows it when there is one).

`LMMover` plays games (`play.movers.Mover`), `LMPlayer.picker` feeds `eval.endgame.evaluate_endgame`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import chess

from chessgrpo.config import ConfigError
from chessgrpo.data.rookworld_format import MoveStop, PolicyAnswer, parse_policy_completion, policy_prompt

logger = logging.getLogger(__name__)

CHESS_TOKENIZER_NEW_TOKENS = 64
"""Default answer length with the chess word-level tokenizer: a P: answer is ~15-30 tokens."""
TEXT_TOKENIZER_NEW_TOKENS = 176
"""Default with the character tokenizer (a P: answer is up to ~160 characters, padding included) and
with a `transformers` BPE tokenizer (RookWorld-LM's GPT-2; `eval lm` decodes P: answers with the same budget)."""
SEED_STREAM = 0x5EED_1A11
"""Mixed into the seed of the re-sampling seeds' stream, so it differs from the fallback's."""


@dataclasses.dataclass
class LMPlayerConfig:
    """How a chess LM plays (config section ``lm`` of `eval games` and `eval endgame`)."""

    retries: int = 3
    """Re-samples of an ill-formed or illegal answer before the random fallback (0 = none)."""
    retry_temperature: float = 1.0
    """Sampling temperature of the re-samples (no top-k/top-p)."""
    max_new_tokens: int | None = None
    """Longest answer in tokens; null = by the tokenizer: 64 for the chess word-level tokenizer,
    176 for the character and `transformers` (BPE) tokenizers. Clamped to the model's positions."""
    prompt_bos: bool | None = None
    """BOS before every prompt; null = as the run was trained (an SFT run's ``prompt_bos``, a GRPO
    run's ``task.prompt_bos``, read from the run directory's config.yaml), else false."""
    seed: int = 0
    """Seeds the re-samples and the fallback (games reseed per game from the game's seed)."""
    batch_size: int = 64
    """Prompts per generation batch."""

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"config key lm.retries must be an integer >= 0, got {self.retries!r}")
        if not (isinstance(self.retry_temperature, (int, float)) and 0 < self.retry_temperature < float("inf")):
            raise ConfigError(f"config key lm.retry_temperature must be a number > 0, got {self.retry_temperature!r}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(
                f"config key lm.max_new_tokens must be >= 1 or null (by the tokenizer), got {self.max_new_tokens!r}"
            )
        if self.batch_size < 1:
            raise ConfigError(f"config key lm.batch_size must be >= 1, got {self.batch_size!r}")


@dataclasses.dataclass
class LMPlayerStats:
    """How the LM's moves were made (module docstring); counts, added up over games with ``+``."""

    moves: int = 0
    ill_formed: int = 0
    illegal: int = 0
    resampled: int = 0
    fallback: int = 0
    no_time: int = 0
    """Moves the clock left no time to ask the LM for (UCI under a clock): random moves without an answer."""

    RATES = ("ill_formed", "illegal", "resampled", "fallback")

    def __add__(self, other: LMPlayerStats) -> LMPlayerStats:
        return LMPlayerStats(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def __sub__(self, other: LMPlayerStats) -> LMPlayerStats:
        return LMPlayerStats(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def counts(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_counts(cls, counts: dict[str, Any]) -> LMPlayerStats:
        """The stats of `counts` (`counts()`, e.g. read back from a JSON file); unknown keys are an error."""
        return cls(**{key: int(value) for key, value in counts.items()})

    def rates(self) -> dict[str, float]:
        """ill_formed, illegal, resampled and fallback as fractions of moves (all 0.0 before any move)."""
        return {name: getattr(self, name) / self.moves if self.moves else 0.0 for name in self.RATES}

    def line(self) -> str:
        """One line for people: "LM moves 412: ill-formed 3.2%, illegal 1.0%, fixed by re-sampling 3.9%, fallback 0.2%",
        then ", no time for an answer 1.5%" when a clock left moves unasked (`no_time`)."""
        rates = self.rates()
        line = (
            f"LM moves {self.moves}: ill-formed {100 * rates['ill_formed']:.1f}%, illegal {100 * rates['illegal']:.1f}%, "
            f"fixed by re-sampling {100 * rates['resampled']:.1f}%, fallback {100 * rates['fallback']:.1f}%"
        )
        if self.no_time:  # only under a UCI clock: the other outputs keep their line
            line += f", no time for an answer {100 * self.no_time / self.moves:.1f}%"
        return line

    def to_json(self) -> dict[str, Any]:
        """{"counts": ..., "rates": ..., "line": ...}: what the JSON outputs carry under "lm_player"."""
        return {"counts": self.counts(), "rates": self.rates(), "line": self.line()}


def default_max_new_tokens(tokenizer: Any) -> int:
    """The answer budget for `tokenizer`: `CHESS_TOKENIZER_NEW_TOKENS` for the chess word-level
    tokenizer, else `TEXT_TOKENIZER_NEW_TOKENS`."""
    return (
        CHESS_TOKENIZER_NEW_TOKENS if getattr(tokenizer, "kind", "") == "chess-wordlevel" else TEXT_TOKENIZER_NEW_TOKENS
    )


def run_directory(path: str | os.PathLike, model_directory: Path | None = None) -> Path | None:
    """The run directory `path` belongs to: itself when it holds checkpoints/, else the run of the
    checkpoint ``RUN/checkpoints/step_NNNNNN`` that `model_directory` (or `path`) is; None outside a run."""
    path = Path(path).resolve()
    if (path / "checkpoints").is_dir():
        return path
    for candidate in (model_directory, path):
        if candidate is not None:
            parent = Path(candidate).resolve().parent
            if parent.name == "checkpoints":
                return parent.parent
    return None


def run_prompt_bos(path: str | os.PathLike, model_directory: Path | None = None) -> bool:
    """Whether the run at `path` put BOS before its prompts: ``prompt_bos`` of an SFT run, ``task.prompt_bos``
    of a GRPO run, ``tasks[*].config.task.prompt_bos`` of a mixture; False outside a run or when the run's
    config.yaml says nothing. `ValueError` naming the file when it is unreadable or its tasks disagree."""
    run = run_directory(path, model_directory)
    if run is None or not (run / "config.yaml").is_file():
        return False
    import yaml

    config_path = run / "config.yaml"
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as error:
        problem = " ".join(str(error).split())[:200]
        raise ValueError(f"{config_path}: cannot read the run's prompt_bos ({problem}); set lm.prompt_bos") from None
    if not isinstance(config, dict):
        return False
    sections = [config, config.get("task")]
    for task in config.get("tasks") or []:
        inner = task.get("config") if isinstance(task, dict) else None
        sections.append(inner.get("task") if isinstance(inner, dict) else None)
    found = {
        bool(section["prompt_bos"]) for section in sections if isinstance(section, dict) and "prompt_bos" in section
    }
    if len(found) > 1:
        raise ValueError(f"{config_path}: the run's tasks disagree on prompt_bos; set lm.prompt_bos=true or false")
    return found.pop() if found else False


def _legal_best(text: str, allowed: set[chess.Move]) -> tuple[str, PolicyAnswer | None, chess.Move | None]:
    """("ok", answer, move) for an answer whose B: is allowed, ("illegal", answer, None) for one that
    parses with another B:, ("ill_formed", None, None) for one that does not parse."""
    answer = parse_policy_completion(text)
    if not isinstance(answer, PolicyAnswer):
        return "ill_formed", None, None
    move = chess.Move.from_uci(answer.best)  # the parser checked its syntax
    return ("ok", answer, move) if move in allowed else ("illegal", answer, None)


class LMPlayer:
    """A chess LM choosing moves (module docstring): greedy B:, re-samples, then a random legal move."""

    def __init__(self, lm: Any, config: LMPlayerConfig | None = None, *, prompt_bos: bool | None = None):
        """`lm` is a `models.lm.ChessLM`; `prompt_bos` (None: ``config.prompt_bos``, else False) puts BOS before prompts."""
        from chessgrpo.models.prompt_bos import with_prompt_bos

        self.config = config or LMPlayerConfig()
        self.prompt_bos = bool(self.config.prompt_bos if prompt_bos is None else prompt_bos)
        lm.model.eval()  # greedy decoding and sampling both need eval mode (no dropout)
        self.lm = with_prompt_bos(lm, self.prompt_bos)
        self.max_new_tokens = self.config.max_new_tokens or default_max_new_tokens(lm.tokenizer)
        self.stats = LMPlayerStats()
        self.last_outcomes: list[str] = []
        """How each move of the last `choose` was made: "greedy", "resampled", "fallback" or "no_time"."""
        self.last_stopped = False
        """Whether the last `choose`'s ``should_stop`` ended its asking early (its fallbacks lacked time, not answers)."""
        self.last_answers: list[PolicyAnswer | None] = []
        """The answer each move of the last `choose` was read from (None for a fallback)."""
        self.reseed(self.config.seed)

    @classmethod
    def from_path(
        cls, path: str | os.PathLike, *, device: str = "cpu", config: LMPlayerConfig | None = None
    ) -> LMPlayer:
        """Load the LM at `path` (`models.lm.load_lm`: a save_pretrained directory, an SFT/GRPO run or
        checkpoint); `prompt_bos` null reads the run's (`run_prompt_bos`)."""
        from chessgrpo.models.lm import load_lm, resolve_lm_directory

        config = config or LMPlayerConfig()
        directory = resolve_lm_directory(path)
        prompt_bos = config.prompt_bos if config.prompt_bos is not None else run_prompt_bos(path, directory)
        return cls(load_lm(directory, device=device), config, prompt_bos=prompt_bos)

    # ------------------------------------------------------------------------------------------

    def reseed(self, seed: int) -> None:
        """Restart the fallback's and the re-samples' random streams from `seed`."""
        self._fallback_rng = random.Random(seed)
        self._seed_rng = random.Random(seed ^ SEED_STREAM)

    def rates(self) -> dict[str, float]:
        """`LMPlayerStats.rates` of every move chosen so far."""
        return self.stats.rates()

    def stats_line(self) -> str:
        """`LMPlayerStats.line` of every move chosen so far."""
        return self.stats.line()

    def answer_seconds(self, board: chess.Board | None = None) -> float:
        """How long one answer takes: a greedy P: completion of `board` (default the initial position), timed. A
        clock's first guess of one generation (`uci.lm`); not counted, and the random streams stay as they were."""
        state = self._seed_rng.getstate()
        started = time.perf_counter()
        self._generate([policy_prompt((board or chess.Board()).fen(), self.lm.policy_prompt)], 0.0)
        seconds = time.perf_counter() - started
        self._seed_rng.setstate(state)  # a measurement must not shift the re-samples' seeds
        return seconds

    def picker(self) -> Callable[[list[chess.Board]], list[chess.Move]]:
        """A `eval.endgame.MovePicker`: `choose` over a batch of boards."""
        return lambda boards: self.choose(boards)

    # ------------------------------------------------------------------------------------------

    def _generate(self, prompts: list[str], temperature: float) -> list[str]:
        from chessgrpo.models.lm_generation import generate_texts

        budget = self.max_new_tokens
        limit = self.lm.max_positions
        if limit is not None:  # a prompt near the model's length leaves less room for the answer
            longest = max(len(self.lm.tokenizer.encode(prompt)) for prompt in prompts)
            budget = min(budget, limit - longest)
            if budget < 1:
                logger.warning(
                    "prompts of %d tokens leave no room to answer in the model's %d positions", longest, limit
                )
                return [""] * len(prompts)
        seed = self._seed_rng.getrandbits(63)  # drawn for greedy calls too: the stream stays in step
        return generate_texts(
            self.lm,
            prompts,
            max_new_tokens=budget,
            batch_size=self.config.batch_size,
            temperature=temperature,
            seed=seed,
            new_stop=lambda: MoveStop(self.lm.tokenizer.decode),  # a move-first answer ends at its move
        )

    def choose(
        self,
        boards: Sequence[chess.Board],
        allowed: Sequence[Sequence[chess.Move]] | None = None,
        *,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[chess.Move]:
        """One move per board (module docstring). `allowed` restricts each board's moves (UCI
        ``searchmoves``); default: every legal move. Boards need at least one (allowed) move.

        `should_stop` (a clock) is asked before each generation, the greedy one included; True ends the
        asking: boards without a legal answer yet get the random fallback ("fallback" after a failed
        greedy answer, "no_time" when there was no time to ask at all). `last_stopped` says it did."""
        legal = (
            [set(moves) for moves in allowed] if allowed is not None else [set(board.legal_moves) for board in boards]
        )
        if len(legal) != len(boards):
            raise ValueError(f"allowed has {len(legal)} move lists for {len(boards)} boards")
        for board, moves in zip(boards, legal):
            if not moves:
                raise ValueError(f"position {board.fen()!r} has no legal (allowed) move; the LM cannot move there")
        prompts = [policy_prompt(board.fen(), self.lm.policy_prompt) for board in boards]
        chosen: list[chess.Move | None] = [None] * len(boards)
        answers: list[PolicyAnswer | None] = [None] * len(boards)
        outcomes = ["greedy"] * len(boards)
        pending: list[int] = []
        stopped = bool(boards) and should_stop is not None and should_stop()
        for i, text in enumerate(self._generate(prompts, 0.0) if boards and not stopped else []):
            verdict, answer, move = _legal_best(text, legal[i])
            if move is not None:
                chosen[i], answers[i] = move, answer
                continue
            pending.append(i)
            if verdict == "ill_formed":
                self.stats.ill_formed += 1
            else:
                self.stats.illegal += 1
        for _ in range(self.config.retries):
            if not pending or stopped:
                break
            if should_stop is not None and should_stop():
                stopped = True
                break
            texts = self._generate([prompts[i] for i in pending], self.config.retry_temperature)
            still = []
            for i, text in zip(pending, texts):
                _, answer, move = _legal_best(text, legal[i])
                if move is None:
                    still.append(i)
                else:
                    chosen[i], answers[i], outcomes[i] = move, answer, "resampled"
                    self.stats.resampled += 1
            pending = still
        unasked = [
            i for i in range(len(boards)) if chosen[i] is None and i not in pending
        ]  # the clock stopped the greedy
        for i in pending + unasked:
            # Sorted, so the draw depends on the seed only, not on python-chess's generation order.
            chosen[i] = self._fallback_rng.choice(sorted(legal[i], key=chess.Move.uci))
            outcomes[i] = "fallback" if i in pending else "no_time"
        self.stats.fallback += len(pending)
        self.stats.no_time += len(unasked)
        self.stats.moves += len(boards)
        self.last_outcomes, self.last_answers, self.last_stopped = outcomes, answers, stopped
        return chosen  # type: ignore[return-value]


class LMMover:
    """An `LMPlayer` as a game player (`play.movers.Mover`): reseeded per game from the game's seed,
    so a game does not depend on which worker plays it; `game_stats` counts the current game's moves."""

    def __init__(self, player: LMPlayer):
        self.player = player
        self._game_start = LMPlayerStats()

    @classmethod
    def from_path(
        cls, path: str | os.PathLike, *, device: str = "cpu", config: LMPlayerConfig | None = None
    ) -> LMMover:
        return cls(LMPlayer.from_path(path, device=device, config=config))

    def new_game(self, game_id: object, seed: int) -> None:
        self.player.reseed(seed)
        self._game_start = dataclasses.replace(self.player.stats)

    def move(self, board: chess.Board) -> chess.Move:
        return self.player.choose([board])[0]

    def game_stats(self) -> dict[str, int]:
        """The counts of the moves since `new_game` (`LMPlayerStats.counts`)."""
        return (self.player.stats - self._game_start).counts()

    def close(self) -> None:
        pass
