"""Trajectory groups: G games from the same start position, each up to T own plies against an opponent.

A step of the trajectory task:

1. B start positions (fresh each step: seeded by seed, step and rank); each is played G times.
2. `play_trajectories` runs all B * G games in lockstep, one half-move at a time. The learner's
   plies are sampled from `models.policy.log_probs` at the rollout temperature (no top-k/top-p),
   one batched forward per half-move over the distinct positions to move; the behaviour
   log-prob, exact entropy and (with a reference) the reference log-prob and exact KL of every
   own ply are recorded. The opponent answers each own ply:

   - ``self``: the current policy, sampled the same way. Both colours' plies are training data:
     a game gives two rows, the start mover's plies and the other side's plies, each rewarded
     from its own point of view. Rows form groups by (start position, colour): the G rows of the
     start mover share a start position and so a baseline; the G rows of the other colour share
     the start position one ply earlier (they are compared with each other, never with the other
     colour's rows, whose rewards are the negation of theirs). A self-play game runs 2T + 1
     half-moves, so the second mover's T-th ply also gets an answer; that last move is sampled
     but not trained on (it is outside the start mover's T plies).
   - ``reference``: the frozen start policy, sampled at the rollout temperature (or `opponent_temperature`).
   - ``stockfish``: the engine pool's best move at `opponent_nodes` nodes (deterministic).
   - ``tablebase``: the perfect player (`engine.tablebase.Tablebase.tablebase_move`); as the
     weak side it is the perfect defender (the loss that takes longest, or a draw if any).

3. Every own ply t is rewarded over its window (the own move and the opponent's reply), from the
   mover's point of view, with P_t the position before the own move and P_t+1 the position after
   the reply (or where the game ended):

   - ``engine``: r_t = v(P_t+1) - v(P_t), v the mover's win probability (expected score) from the
     engine pool at `reward_nodes`; finished games are valued exactly by the rules (mate 1 or 0;
     stalemate, insufficient material, 50 moves and threefold repetition 0.5) with the game's
     move stack, never by the engine;
   - ``tablebase``: the exact endgame reward of `tasks.endgame_rewards.step_reward` (mate = 1, losing the
     win = -1, shaping * DTZ progress), optionally in regret form (`regret`: minus the best reward
     the position allowed, so that plies from different positions share a scale).

   A game that ends inside the horizon ends the row: the mask is False from the next own ply on.
4. Advantages (`supervision`), all computed by `rl.optimize` with L = T and the mask (the batch names
   the estimator, `RolloutBatch.supervision`):

   - ``outcome``: one reward per row, the sum of its step rewards (for ``engine`` the final value
     minus the start value; for ``tablebase`` mate/lost-win plus the shaped progress), turned
     into one advantage per row by `rl.group_advantages` and broadcast over the row's valid plies;
   - ``process``: the step rewards [N, T] go to `rl.process_advantages` (DeepSeekMath process
     supervision: normalised over all valid steps of the group, advantage = sum of the
     normalised rewards from that ply on);
   - ``step``: the same normalised step reward, without the sum over later plies
     (`rl.stepwise_advantages`). Against a deterministic opponent (the tablebase, Stockfish at a node
     limit) with tablebase rewards, r_t is a potential difference of the exact value (DTZ) plus
     the exact outcome change, i.e. the move's exact advantage under the oracle's value: the
     reward-to-go only adds the noise of the later moves (their own advantages). Each ply is
     credited with what it did and nothing else; the group still centres the rewards.
   - ``critic`` (needs ``regret``): A_t = r_t / (std of all valid step rewards of the batch + eps),
     not centred (`rl.critic_advantages`). A regret reward is already relative to the exact value
     of the position before the ply (0 for a DTZ-optimal move), so the tablebase is a perfect
     per-position baseline, and the group mean is a worse one: once most plies are waiting moves
     the group mean sits at the waiting move's regret and their advantage vanishes, the policy stops
     exploring and loops (measured: docs/results.md, "Design choices"). This is REINFORCE with the
     exact value as baseline; the batch std only sets the step size. Measured so far, it did not
     lift the mate rate either (0.000 within 66 steps from a random network).

The learner's forward (`make_forward`) recomputes the log-probs of every valid ply of a minibatch
with one model call over the distinct positions among them (the first ply of a group is the same
position G times).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import chess
import torch

from chessgrpo.board import ACTIONS
from chessgrpo.board.move_facts import HISTORY_FACTS, move_facts
from chessgrpo.board.repetitions import position_key, record, repetition_facts
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.engine.tablebase_values import game_over
from chessgrpo.models.policy import ActionPolicy
from chessgrpo.models.sampling import Generators, log_probs, multinomial_by_group
from chessgrpo.rl import SUPERVISIONS, categorical_entropy, exact_kl
from chessgrpo.tasks.engine_values import EngineValues
from chessgrpo.tasks.reward_registry import one_reward_weights

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool

OPPONENTS = ("self", "reference", "stockfish", "tablebase")


@dataclasses.dataclass
class TrajectoryConfig:
    """What a trajectory group is and how it is rewarded (the `task:` section of a trajectory config)."""

    group_size: int = 8
    """G: games played from each start position (G rows per group; self-play: G per colour)."""
    positions_per_step: int = 16
    """B: start positions per training step."""
    horizon: int = 8
    """T: own plies per row at most (L = T in the learner); a game ending earlier is masked from there."""
    temperature: float = 1.0
    """Rollout temperature of the learner's plies. The learner uses the same one (docs/architecture.md, invariant 1)."""
    opponent: str = "tablebase"
    """self | reference | stockfish | tablebase (module docstring)."""
    opponent_temperature: float | None = None
    """The ``reference`` opponent's sampling temperature; null = `temperature`. Lower plays closer to the
    start policy's argmax moves, the way it plays in evaluation games (`eval games` is argmax)."""
    opponent_nodes: int = 100
    """Stockfish node limit of the ``stockfish`` opponent's best move (a weak setting at ~100)."""
    reward: str = "tablebase"
    """The one reward of the run (weight 1), a name of `tasks.trajectory_rewards.TRAJECTORY_REWARDS`: engine (change
    of the mover's win probability) | tablebase (exact endgame reward). Checked by the kind's config."""
    rewards: dict[str, float] | None = None
    """Several rewards with weights, {name: weight} (names of `TRAJECTORY_REWARDS`): every own ply's reward is their
    weighted sum, each logged as reward/<name>. null = `reward` alone. With it set, `reward` keeps its default or
    names one of these."""
    reward_nodes: int = 1000
    """Stockfish node limit for ``engine`` rewards."""
    shaping: float = 0.1
    """``tablebase`` rewards: weight of the DTZ progress term (per own move of progress); 0 = mate/lost-win only."""
    regret: bool = False
    """``tablebase`` rewards: subtract the best reward the position before the ply allows against the
    perfect defender (`tasks.endgame_rewards.best_step_reward`): 0 for a DTZ-optimal move, < 0 otherwise."""
    overlap_rewards: bool = False
    """``engine`` rewards: hand each position to the engine pool the moment the rollout reaches it, so the
    engine values it while the policy plays on (`EngineValues`; identical rewards). Off by default: it only
    pays with cores to spare beside the pool's processes; on 2 cores, where the pool has one process per
    core, the two compete and a step got slower (docs/benchmarks.md, "GRPO steps: `bench/rollout_throughput.py`";
    docs/results.md, "Design choices"). A pipelined step (``grpo.pipeline``) always overlaps its rewards."""
    supervision: str = "process"
    """outcome (one advantage per row) | process (per-ply step rewards, reward-to-go, DeepSeekMath) |
    step (per-ply step rewards normalised as in process, without the sum) | critic (regret rewards
    scaled, not centred: the tablebase is the baseline). Module docstring."""
    sibling_moves: int = 0
    """K > 0 (tablebase rewards with regret, critic supervision, the perfect defender): at every own ply K more
    moves are drawn from the same distribution and valued exactly (`tasks.trajectory_rewards.move_regret`, one probe
    each, no reply played); the learner gets the played move's regret minus their mean: a one-move group at every
    position the policy visits, centred at that position. 0 = off."""

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (a group of one has no baseline), got {self.group_size}")
        if self.positions_per_step < 1:
            raise ValueError(f"positions_per_step must be >= 1, got {self.positions_per_step}")
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1 own ply, got {self.horizon}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        for name, value, allowed in (
            ("opponent", self.opponent, OPPONENTS),
            ("supervision", self.supervision, SUPERVISIONS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
        if not (math.isfinite(self.shaping) and self.shaping >= 0):
            raise ValueError(f"shaping must be a finite number >= 0 (0 = mate/lost-win only), got {self.shaping}")
        if self.opponent_nodes < 1 or self.reward_nodes < 1:
            raise ValueError(
                f"opponent_nodes and reward_nodes must be >= 1, got {self.opponent_nodes}, {self.reward_nodes}"
            )
        if self.opponent_temperature is not None and not (
            self.opponent_temperature > 0 and math.isfinite(self.opponent_temperature)
        ):
            raise ValueError(
                f"opponent_temperature must be > 0 (or null: the rollout temperature), got {self.opponent_temperature}"
            )
        if self.opponent_temperature is not None and self.opponent != "reference":
            raise ValueError(f"opponent_temperature is the reference opponent's; opponent is {self.opponent!r}")
        if not (self.shaping >= 0 and math.isfinite(self.shaping)):
            raise ValueError(f"shaping must be a finite number >= 0, got {self.shaping}")
        if self.sibling_moves < 0:
            raise ValueError(f"sibling_moves must be >= 0, got {self.sibling_moves}")
        self.weights  # noqa: B018 -- raises when rewards and reward disagree or a weight is not a finite number
        if self.sibling_moves and not (
            self.only_tablebase and self.regret and self.supervision == "critic" and self.opponent == "tablebase"
        ):
            raise ValueError(
                "sibling_moves needs reward: tablebase (alone, weight 1), regret: true, supervision: critic and opponent: tablebase"
            )

    @property
    def self_play(self) -> bool:
        return self.opponent == "self"

    @property
    def weights(self) -> dict[str, float]:
        """The run's rewards, {name: weight}: `rewards`, else {`reward`: 1} (names checked by the kind's config)."""
        return one_reward_weights(self.reward, self.rewards, "tablebase")

    @property
    def only_tablebase(self) -> bool:
        """Whether the learner's reward is the exact tablebase reward alone, at weight 1 (what critic supervision
        and sibling baselines are relative to)."""
        return self.weights == {"tablebase": 1.0}


# ------------------------------------------------------------------------------------------------
# Opponents


class Opponent(Protocol):
    """Answers the learner's plies: one move per board."""

    def moves(self, boards: list[chess.Board], groups: Sequence[int] | None = None) -> list[chess.Move]:
        """One move per board; `groups` (the start-position index of each board) lets a sampling
        opponent draw from that group's generator."""
        ...


class PolicyOpponent:
    """A policy sampled at `temperature` (the frozen reference; eval mode, no grad)."""

    def __init__(self, model: ActionPolicy, temperature: float, generator: Generators = None):
        self.model, self.temperature, self.generator = model, temperature, generator

    @torch.no_grad()
    def moves(self, boards: list[chess.Board], groups: Sequence[int] | None = None) -> list[chess.Move]:
        """One sampled move per board; with per-group generators `groups` names each board's group."""
        if self.model.training:
            raise RuntimeError("the policy opponent must be in eval mode (no dropout)")
        if reads_history(self.model):  # the boards' move stacks are part of the input: no merging by FEN
            unique, inverse = boards, torch.arange(len(boards))
        else:
            unique, _, inverse = _distinct(boards, [board.fen() for board in boards])
        tokens, legal = self.model.inputs(unique)
        logp_full = log_probs(self.model(tokens), legal, self.temperature)
        groups = range(len(boards)) if groups is None else groups
        actions = multinomial_by_group(logp_full[inverse].exp(), 1, groups, self.generator).squeeze(1)
        return [chess.Move.from_uci(ACTIONS[a]) for a in actions.tolist()]


class StockfishOpponent:
    """Stockfish's best move at a node limit (reproducible: the pool clears its hash before each search)."""

    def __init__(self, pool: EnginePool, nodes: int):
        self.pool, self.nodes = pool, nodes

    def moves(self, boards: list[chess.Board], groups: Sequence[int] | None = None) -> list[chess.Move]:
        out = []
        for board, evaluation in zip(boards, self.pool.evaluate(boards, nodes=self.nodes)):
            if evaluation.best_move is None:
                raise RuntimeError(f"the engine returned no move for {board.fen()!r}")
            out.append(chess.Move.from_uci(evaluation.best_move))
        return out


class TablebaseOpponent:
    """The perfect player: the perfect defender for the weak side."""

    def __init__(self, oracle: Tablebase):
        self.oracle = oracle

    def moves(self, boards: list[chess.Board], groups: Sequence[int] | None = None) -> list[chess.Move]:
        return [self.oracle.tablebase_move(board) for board in boards]


# ------------------------------------------------------------------------------------------------
# Playing


@dataclasses.dataclass
class Point:
    """A position of a row: before an own ply (mover to move), or where the row ended."""

    board: chess.Board
    """The position (no move stack)."""
    terminal: str | None
    """`engine.tablebase_values.game_over` reason, judged with the game's move stack; None while the game goes on."""
    fen: str = ""
    """The board's FEN, when the rollout computed it already ("" = not known)."""

    def key(self) -> str:
        """The board's FEN (computed once)."""
        if not self.fen:
            self.fen = self.board.fen()
        return self.fen


@dataclasses.dataclass
class _Row:
    start: int
    colour: chess.Color
    group: int
    positions: list[int] = dataclasses.field(default_factory=list)
    actions: list[int] = dataclasses.field(default_factory=list)
    logp: list[float] = dataclasses.field(default_factory=list)
    entropy: list[float] = dataclasses.field(default_factory=list)
    ln_legal: list[float] = dataclasses.field(default_factory=list)
    ref_logp: list[float] = dataclasses.field(default_factory=list)
    kl: list[float] = dataclasses.field(default_factory=list)
    points: list[Point] = dataclasses.field(default_factory=list)
    siblings: list[list[int]] = dataclasses.field(default_factory=list)
    closed: bool = False


@dataclasses.dataclass
class Trajectories:
    """N rows of up to T own plies, what the policy thought at each, and the positions they passed."""

    starts: list[chess.Board]
    """The B start positions."""
    group_ids: torch.Tensor
    """[N] long: start index (opponent games) or 2 * start + (0 start mover | 1 other colour) (self-play)."""
    row_start: torch.Tensor
    """[N] long: the row's start position index."""
    row_colour: list[chess.Color]
    """The colour whose plies the row holds."""
    actions: torch.Tensor
    """[N, T] long action ids (0 where masked)."""
    behaviour_logp: torch.Tensor
    """[N, T] float32 log-probs of the sampled actions at sampling time (0 where masked)."""
    mask: torch.Tensor
    """[N, T] bool: True at plies that were played."""
    position: torch.Tensor
    """[N, T] long: index of each ply's position into tokens/legal (0 where masked)."""
    tokens: torch.Tensor
    """[U, 77] the distinct positions of all plies."""
    legal: torch.Tensor
    """[U, 1968] their legal-move masks."""
    entropy: torch.Tensor
    """[N, T] exact entropy of the policy at each ply (rollout temperature)."""
    ln_legal: torch.Tensor
    """[N, T] ln(number of legal moves) at each ply."""
    points: list[list[Point]]
    """Per row: the position before each own ply, then the final one (plies + 1 points)."""
    ref_logp: torch.Tensor | None = None
    """[N, T] reference log-probs of the sampled actions (rollout temperature)."""
    siblings: list[list[list[int]]] | None = None
    """`TrajectoryConfig.sibling_moves`: per row, per own ply, the K other actions drawn at that position."""
    exact_kl: torch.Tensor | None = None
    """[N, T] exact KL(policy || reference) at each ply."""
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    """Wall-clock of the rollout's parts: ``policy_s`` (encoding, forwards, sampling, pushing the learner's
    moves), ``opponent_s`` (waiting for the opponent's moves)."""

    @property
    def num_rows(self) -> int:
        return int(self.actions.shape[0])

    @property
    def lengths(self) -> torch.Tensor:
        """[N] own plies per row."""
        return self.mask.sum(dim=1)

    def outcomes(self) -> list[str]:
        """Per row: "mate" (the row's mover mated), "mated", "draw:<reason>" or "horizon"."""
        out = []
        for colour, points in zip(self.row_colour, self.points):
            last = points[-1]
            if last.terminal is None:
                out.append("horizon")
            elif last.terminal == "checkmate":
                out.append("mated" if last.board.turn == colour else "mate")
            else:
                out.append(f"draw:{last.terminal}")
        return out


def _distinct(boards: Sequence[chess.Board], keys: Sequence[str]) -> tuple[list[chess.Board], list[int], torch.Tensor]:
    """(copies of the distinct boards by key, the index of each one's first board, inverse [len(boards)] index
    into them). A key is a board's FEN, with its repetition facts when the policy reads them (`input_keys`).

    Copies without the move stack, so that pushing a move on one of `boards` cannot change what another row sees.
    """
    index: dict[str, int] = {}
    unique: list[chess.Board] = []
    first: list[int] = []
    inverse = []
    for i, (board, key) in enumerate(zip(boards, keys)):
        if key not in index:
            index[key] = len(unique)
            unique.append(board.copy(stack=False))
            first.append(i)
        inverse.append(index[key])
    return unique, first, torch.tensor(inverse, dtype=torch.long)


def reads_history(model: ActionPolicy) -> bool:
    """Whether the policy's input depends on the game's history (`board.move_facts.HISTORY_FACTS`), not the FEN alone."""
    return any(name in HISTORY_FACTS for name in model.config.extra_facts)


def input_keys(fens: Sequence[str], repetitions: Sequence[list[tuple[int, int]]] | None) -> list[str]:
    """What makes two positions the same input to the policy: the FEN, and with the history facts the moves that
    repeat a position of the game (`board.repetitions.repetition_facts`), since those change the input too."""
    if repetitions is None:
        return list(fens)
    return [fen if not facts else f"{fen}|{facts}" for fen, facts in zip(fens, repetitions)]


@torch.no_grad()
def play_trajectories(
    model: ActionPolicy,
    starts: Sequence[chess.Board],
    config: TrajectoryConfig,
    *,
    opponent: Opponent | None,
    generator: Generators = None,
    reference: ActionPolicy | None = None,
    bf16: bool = False,
    prefetch: EngineValues | None = None,
) -> Trajectories:
    """Play `config.group_size` games from each start, in lockstep; `opponent` None means self-play.

    `reference` (optional) adds reference log-probs and the exact KL at every own ply. `prefetch`
    (engine rewards): every unfinished position that becomes a row's point is handed to it the
    moment it is reached, so the engine values it while the rollout goes on (`EngineValues`).
    """
    if model.training or (reference is not None and reference.training):
        raise RuntimeError("play_trajectories needs models in eval mode (no dropout in RL forwards)")
    if (opponent is None) != config.self_play:
        raise ValueError(f"opponent {config.opponent!r} needs {'no' if config.self_play else 'an'} Opponent object")
    horizon, group_size = config.horizon, config.group_size
    boards: list[chess.Board] = []
    game_rows: list[dict[chess.Color, _Row]] = []
    rows: list[_Row] = []
    for b, start in enumerate(starts):
        if game_over(start) is not None:
            raise ValueError(f"start position {start.fen()!r} is already decided")
        for _ in range(group_size):
            boards.append(start.copy(stack=False))
            colours = (start.turn, not start.turn) if config.self_play else (start.turn,)
            mapping = {}
            for k, colour in enumerate(colours):
                group = 2 * b + k if config.self_play else b
                mapping[colour] = _Row(start=b, colour=colour, group=group)
            game_rows.append(mapping)
    # Rows in a fixed order: game by game, start mover first.
    for mapping in game_rows:
        rows.extend(mapping.values())
    over: list[str | None] = [None] * len(boards)
    # Each board's FEN, computed once per position reached: it keys the distinct positions, encodes
    # the policy's input, names the point and keys its engine value.
    fens: list[str | None] = [None] * len(boards)

    def fen_of(g: int) -> str:
        fen = fens[g]
        if fen is None:
            fen = fens[g] = boards[g].fen()
        return fen

    # With a policy that reads the history facts: each game's `board.repetitions.position_counts`, kept as it goes.
    counts = [{position_key(board): 1} for board in boards] if reads_history(model) else None
    allows = "allows_threefold" in model.config.extra_facts

    def push(g: int, move: chess.Move) -> None:
        board = boards[g]
        zeroing = counts is not None and board.is_zeroing(move)
        board.push(move)
        fens[g] = None
        if counts is not None:
            counts[g] = record(counts[g], board, zeroing)

    if prefetch is not None:
        prefetch.add(starts)  # every row's first point
    timings = {"policy_s": 0.0, "opponent_s": 0.0}

    table: dict[str, int] = {}
    tokens_list: list[torch.Tensor] = []
    legal_list: list[torch.Tensor] = []
    device = model.device
    half_moves = 2 * horizon + (1 if config.self_play else 0)
    for _ in range(half_moves):
        active = [g for g in range(len(boards)) if over[g] is None]
        if not active:
            break
        learner = [g for g in active if boards[g].turn in game_rows[g]]
        others = [g for g in active if boards[g].turn not in game_rows[g]]
        if learner:
            tick = time.perf_counter()
            learner_fens = [fen_of(g) for g in learner]
            repetitions = (
                [repetition_facts(boards[g], counts[g], allows=allows) for g in learner] if counts is not None else None
            )
            unique, first, inverse = _distinct([boards[g] for g in learner], input_keys(learner_fens, repetitions))
            keys = [learner_fens[i] for i in first]  # the distinct positions' FENs
            facts = None
            if repetitions is not None:  # the history facts, from each game's counts (the copies have no move stack)
                extra = model.config.extra_facts
                facts = [
                    move_facts(unique[u], keys[u], extra=extra, repetitions=repetitions[i]) for u, i in enumerate(first)
                ]
            tokens, legal = model.inputs(unique, facts=facts, fens=keys)
            input_key = input_keys(keys, None if repetitions is None else [repetitions[i] for i in first])
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(tokens)
            logp_full = log_probs(logits, legal, config.temperature)
            inverse = inverse.to(device)
            # Game g belongs to start g // group_size: with per-start generators a group's games do
            # not depend on the other groups (data-parallel ranks play the same games).
            starts_of = [g // group_size for g in learner]
            if config.sibling_moves:
                drawn = multinomial_by_group(
                    logp_full[inverse].exp(), 1 + config.sibling_moves, starts_of, generator, replacement=True
                )
                actions, siblings_list = drawn[:, 0], drawn[:, 1:].tolist()
            else:
                actions = multinomial_by_group(logp_full[inverse].exp(), 1, starts_of, generator).squeeze(1)
            entropy = categorical_entropy(logp_full)
            ln_legal = legal.sum(dim=-1).float().log()
            chosen_logp = logp_full[inverse].gather(1, actions.unsqueeze(1)).squeeze(1)
            ref_chosen = kl = None
            if reference is not None:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    ref_full = log_probs(reference(tokens), legal, config.temperature)
                ref_chosen = ref_full[inverse].gather(1, actions.unsqueeze(1)).squeeze(1).tolist()
                kl = exact_kl(logp_full, ref_full).tolist()
            actions_list, logp_list = actions.tolist(), chosen_logp.tolist()
            entropy_list, ln_list, inverse_list = entropy.tolist(), ln_legal.tolist(), inverse.tolist()
            for j, g in enumerate(learner):
                board = boards[g]
                row = game_rows[g][board.turn]
                if not row.closed and len(row.actions) == horizon:
                    row.points.append(Point(board.copy(stack=False), None, fen_of(g)))
                    row.closed = True
                if not row.closed:
                    u = inverse_list[j]
                    if input_key[u] not in table:
                        table[input_key[u]] = len(table)
                        tokens_list.append(tokens[u])
                        legal_list.append(legal[u])
                    row.points.append(Point(board.copy(stack=False), None, keys[u]))
                    row.positions.append(table[input_key[u]])
                    row.actions.append(actions_list[j])
                    row.logp.append(logp_list[j])
                    row.entropy.append(entropy_list[u])
                    row.ln_legal.append(ln_list[u])
                    if config.sibling_moves:
                        row.siblings.append(siblings_list[j])
                    if ref_chosen is not None and kl is not None:
                        row.ref_logp.append(ref_chosen[j])
                        row.kl.append(kl[u])
                push(g, chess.Move.from_uci(ACTIONS[actions_list[j]]))
            timings["policy_s"] += time.perf_counter() - tick
        if others:
            assert opponent is not None
            tick = time.perf_counter()
            replies = opponent.moves([boards[g] for g in others], [g // group_size for g in others])
            timings["opponent_s"] += time.perf_counter() - tick
            for g, move in zip(others, replies):
                if not boards[g].is_legal(move):
                    raise RuntimeError(f"opponent played illegal move {move.uci()} in {boards[g].fen()!r}")
                push(g, move)
        for g in active:
            over[g] = game_over(boards[g])
        if prefetch is not None:
            # The positions just reached where a row moves next (or ends at its horizon): its next point.
            reached = [
                g
                for g in active
                if over[g] is None and boards[g].turn in game_rows[g] and not game_rows[g][boards[g].turn].closed
            ]
            prefetch.add([boards[g] for g in reached], [fen_of(g) for g in reached])
    for g, mapping in enumerate(game_rows):
        for row in mapping.values():
            if not row.closed:
                row.points.append(Point(boards[g].copy(stack=False), over[g], fen_of(g)))
                row.closed = True

    n = len(rows)

    def pad(values: list[list], dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(n, horizon, dtype=dtype)
        for i, row_values in enumerate(values):
            if row_values:
                out[i, : len(row_values)] = torch.tensor(row_values, dtype=dtype)
        return out.to(device)

    empty = [i for i, row in enumerate(rows) if not row.actions]
    if empty:  # only a self-play row whose opponent... cannot happen: every row's mover moves before the game can end
        raise RuntimeError(f"rows {empty[:5]} have no ply (a start position ended before its mover moved)")
    mask = torch.zeros(n, horizon, dtype=torch.bool)
    for i, row in enumerate(rows):
        mask[i, : len(row.actions)] = True
    with_reference = reference is not None
    return Trajectories(
        starts=[board.copy(stack=False) for board in starts],
        group_ids=torch.tensor([row.group for row in rows], dtype=torch.long, device=device),
        row_start=torch.tensor([row.start for row in rows], dtype=torch.long, device=device),
        row_colour=[row.colour for row in rows],
        actions=pad([row.actions for row in rows], torch.long),
        behaviour_logp=pad([row.logp for row in rows], torch.float32),
        mask=mask.to(device),
        position=pad([row.positions for row in rows], torch.long),
        tokens=torch.stack(tokens_list),
        legal=torch.stack(legal_list),
        entropy=pad([row.entropy for row in rows], torch.float32),
        ln_legal=pad([row.ln_legal for row in rows], torch.float32),
        points=[row.points for row in rows],
        siblings=[row.siblings for row in rows] if config.sibling_moves else None,
        ref_logp=pad([row.ref_logp for row in rows], torch.float32) if with_reference else None,
        exact_kl=pad([row.kl for row in rows], torch.float32) if with_reference else None,
        timings=timings,
    )
