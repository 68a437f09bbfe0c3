"""Start positions for RL tasks: one source, or a weighted mixture of sources, drawn per step.

`StartPositions` is a fixed set of non-terminal positions loaded from a dataset, a FEN/EPD file, a
PGN file or random playouts; `StartPositionMixture` draws each step's positions from several
sources with weights (say, engine-game positions for general play and positions from the policy's
own won games for conversion). Every draw is seeded by (seed, step, rank), so a resumed run sees
exactly the positions a straight run would have seen and data-parallel ranks never share a draw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import chess
import chess.pgn
import numpy as np

from chessgrpo.board.sources import random_playout_positions, read_fen_file
from chessgrpo.board.validation import parse_board
from chessgrpo.errors import InputError
from chessgrpo.paths import resolve_data_path

LABEL_FILTERS = "win_prob_range, min_best_margin and best_move_check"
"""The start-position filters that read a dataset's labels."""


class StartPositions:
    """A fixed set of non-terminal start positions and a seeded, per-step draw from it."""

    def __init__(self, boards: Sequence[chess.Board], source: str):
        self.boards = [board.copy(stack=False) for board in boards if any(board.generate_legal_moves())]
        self.source = source
        if not self.boards:
            raise InputError(f"start positions {source!r}: no position with a legal move")

    def __len__(self) -> int:
        return len(self.boards)

    @classmethod
    def from_source(
        cls,
        source: str,
        *,
        split: str = "train",
        max_positions: int | None = None,
        seed: int = 0,
        win_prob_range: tuple[float, float] | None = None,
        skip_mover: str | None = None,
        min_best_margin: float | None = None,
        best_move_check: bool | None = None,
    ) -> StartPositions:
        """Load start positions.

        `source`: a dataset directory (its `split`), a .parquet file, a .epd/.fen/.txt file (one
        position per line), a .pgn file (every position of every game's main line), or
        ``random:N`` (N positions from uniformly random playouts of up to 40 plies, seeded).
        At most `max_positions` are kept (a seeded sample).

        `win_prob_range` (datasets only) keeps positions whose labelled best move's win probability
        lies inside [low, high]; `min_best_margin` (datasets only) keeps positions whose labelled
        best move's win probability exceeds the second best's by at least this much ("only moves":
        tactics, where one move is right and the others lose); `best_move_check` (datasets only) keeps
        positions whose labelled best move gives check (True) or does not (False). `skip_mover` (.pgn only) drops the positions where the side to
        move is the player of that name in the game's White/Black headers, e.g. ``random`` to
        keep only the policy's own moves from `chessgrpo eval games` PGN.
        """
        if skip_mover is not None and Path(source).suffix.lower() != ".pgn":
            raise InputError(f"start positions {source!r}: skip_mover needs a .pgn source")
        labelled_only = win_prob_range is not None or min_best_margin is not None or best_move_check is not None
        if source.startswith("random:"):
            if labelled_only:
                raise InputError(
                    f"start positions {source!r}: {LABEL_FILTERS} need a labelled dataset (directory or .parquet)"
                )
            count = source.split(":", 1)[1]
            if not count.isdigit() or int(count) < 1:
                raise InputError(f"start positions {source!r}: expected random:N with N >= 1")
            return cls(random_playout_positions(int(count), seed=seed, max_plies=40), source)
        # A relative path resolves like every data path ($CHESSGRPO_DATA, the current directory, the checkout).
        path = resolve_data_path(source, "start positions")
        suffix = path.suffix.lower()
        if path.is_dir() or suffix == ".parquet":
            boards = _dataset_positions(
                path,
                source,
                split=split if path.is_dir() else None,
                win_prob_range=win_prob_range,
                min_best_margin=min_best_margin,
                best_move_check=best_move_check,
            )
            if not boards:
                raise InputError(
                    f"start positions {source!r}: no position passes win_prob_range {win_prob_range}, min_best_margin "
                    f"{min_best_margin} and best_move_check {best_move_check}"
                )
        elif labelled_only:
            raise InputError(
                f"start positions {source!r}: {LABEL_FILTERS} need a labelled dataset (directory or .parquet)"
            )
        elif suffix in (".epd", ".fen", ".txt"):
            boards = list(read_fen_file(path))
        elif suffix == ".pgn":
            boards = pgn_positions(path, skip_mover=skip_mover)
        else:
            raise InputError(
                f"start positions {source!r}: expected a dataset directory, .parquet, .epd/.fen/.txt, .pgn or random:N"
            )
        if max_positions is not None and len(boards) > max_positions:
            chosen = np.sort(np.random.default_rng(seed).choice(len(boards), max_positions, replace=False))
            boards = [boards[i] for i in chosen]
        return cls(boards, source)

    def draw(self, count: int, *, seed: int, step: int, rank: int = 0, stream: int = 0) -> list[chess.Board]:
        """`count` positions for (`step`, `rank`): without replacement when the set is big enough.

        The same (seed, step, rank, stream) always gives the same positions, so a resumed run
        continues with exactly the positions a straight run would have seen. `stream` separates
        the draws of the sources of a mixture.
        """
        key = [seed, step, rank] if stream == 0 else [seed, step, rank, stream]
        rng = np.random.default_rng(key)
        indices = rng.choice(len(self.boards), count, replace=count > len(self.boards))
        return [self.boards[int(i)].copy() for i in indices]


def _dataset_positions(
    path: Path,
    source: str,
    *,
    split: str | None,
    win_prob_range: tuple[float, float] | None,
    min_best_margin: float | None = None,
    best_move_check: bool | None = None,
) -> list[chess.Board]:
    from chessgrpo.data.schema import read_positions  # lazy: pyarrow only for datasets

    table = read_positions(path, split=split, columns=["fen", "win_probs", "best_move"])
    boards = []
    rows = zip(
        table.column("fen").to_pylist(), table.column("win_probs").to_pylist(), table.column("best_move").to_pylist()
    )
    for row, (fen, win_probs, best_move) in enumerate(rows):
        if win_prob_range is not None and win_probs and not win_prob_range[0] <= win_probs[0] <= win_prob_range[1]:
            continue
        if min_best_margin is not None and not (
            len(win_probs or []) >= 2 and win_probs[0] - win_probs[1] >= min_best_margin
        ):
            continue  # one labelled move (or none) says nothing about the margin
        try:
            board = parse_board(fen)
        except ValueError as error:
            raise InputError(f"start positions {source!r} row {row}: {error}") from None
        if best_move_check is not None and not (
            best_move and board.gives_check(chess.Move.from_uci(best_move)) == best_move_check
        ):
            continue
        boards.append(board)
    return boards


def pgn_positions(path: Path, *, skip_mover: str | None = None) -> list[chess.Board]:
    """Every non-final position of every game's main line; without those where `skip_mover` is to move."""
    boards: list[chess.Board] = []
    games = 0
    with path.open(encoding="utf-8", errors="replace") as handle:
        while (game := chess.pgn.read_game(handle)) is not None:
            if game.errors:
                raise InputError(f"{path}: game {games + 1} does not parse: {game.errors[0]}")
            games += 1
            skip_colour = None
            if skip_mover is not None:
                if game.headers.get("White") == skip_mover:
                    skip_colour = chess.WHITE
                elif game.headers.get("Black") == skip_mover:
                    skip_colour = chess.BLACK
            board = game.board()
            for move in game.mainline_moves():
                board.push(move)
                if board.turn != skip_colour and not board.is_game_over(claim_draw=False):
                    boards.append(board.copy(stack=False))
    return boards


@dataclasses.dataclass
class PositionSource:
    """One source of a start-position mixture (an item of a config's `position_mixture:` list)."""

    positions: str
    """A dataset directory, .parquet, .epd/.fen/.txt, .pgn or random:N (as `StartPositions.from_source`)."""
    weight: float = 1.0
    """Relative share of each step's positions drawn from this source (normalised over the mixture)."""
    name: str | None = None
    """Label in the metrics (rollout/source/<name>); null = the file or directory name."""
    split: str = "train"
    """Split of a dataset directory."""
    max_positions: int | None = None
    """Keep at most this many positions (a seeded sample); null = all."""
    win_prob_range: tuple[float, float] | None = None
    """Datasets only: keep positions whose labelled best move's win probability is in [low, high]."""
    min_best_margin: float | None = None
    """Datasets only: keep positions whose best labelled move's win probability beats the second
    best's by at least this (e.g. 0.2: "only moves", tactics); needs multipv >= 2 labels."""
    skip_mover: str | None = None
    """.pgn only: drop positions where this player (a White/Black header value, e.g. random) is to move."""
    best_move_check: bool | None = None
    """Datasets only: keep positions whose labelled best move gives check (true) or does not (false)
    (e.g. where checking is right, beside positions that teach GRPO most checks are not)."""
    max_defender_pieces: int | None = None
    """Keep only positions where the side not to move has at most this many pieces, king included
    (e.g. 2: a lone king or king and one piece: the conversion phase, where stalemates happen)."""

    def __post_init__(self) -> None:
        if self.max_defender_pieces is not None and self.max_defender_pieces < 1:
            raise ValueError(
                f"position source {self.positions!r}: max_defender_pieces must be >= 1 (the king), got {self.max_defender_pieces}"
            )
        if not (self.weight >= 0 and np.isfinite(self.weight)):
            raise ValueError(
                f"position source {self.positions!r}: weight must be a finite number >= 0, got {self.weight}"
            )
        if self.win_prob_range is not None and not 0.0 <= self.win_prob_range[0] <= self.win_prob_range[1] <= 1.0:
            raise ValueError(f"position source {self.positions!r}: win_prob_range must be [low, high] within [0, 1]")
        if self.min_best_margin is not None and not 0.0 < self.min_best_margin <= 1.0:
            raise ValueError(
                f"position source {self.positions!r}: min_best_margin must be in (0, 1], got {self.min_best_margin}"
            )

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if ":" in self.positions and not Path(self.positions).exists():  # random:N, policy_games:N
            return self.positions.replace(":", "_")
        return Path(self.positions).stem


class StartPositionMixture:
    """Start positions drawn from several sources with weights, per step.

    Each of the `count` slots of a draw picks its source with probability weight / sum(weights)
    (a seeded multinomial), then each source draws its share from its own seeded stream.
    """

    def __init__(self, sources: Sequence[StartPositions], weights: Sequence[float], labels: Sequence[str]):
        if not sources or not (len(sources) == len(weights) == len(labels)):
            raise ValueError(
                "a start-position mixture needs one weight and one label per source (and at least one source)"
            )
        total = float(sum(weights))
        if not total > 0:
            raise ValueError(f"a start-position mixture needs a positive total weight, got weights {list(weights)}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"start-position sources need distinct names, got {list(labels)}")
        self.sources = list(sources)
        self.probabilities = np.asarray(weights, dtype=np.float64) / total
        self.labels = list(labels)
        self.last_sources: list[int] = []
        """The source index of each position of the latest draw."""

    @classmethod
    def from_config(
        cls,
        items: Sequence[PositionSource],
        *,
        seed: int = 0,
        load: Callable[[PositionSource], StartPositions | None] | None = None,
    ) -> StartPositionMixture:
        """The mixture of config items; `load` may build a source this module does not know
        (e.g. ``policy_games:N``, which needs a policy) and returns None for the others."""
        sources = []
        for item in items:
            loaded = load(item) if load is not None else None
            if loaded is None:
                loaded = StartPositions.from_source(
                    item.positions,
                    split=item.split,
                    max_positions=item.max_positions,
                    seed=seed,
                    win_prob_range=item.win_prob_range,
                    skip_mover=item.skip_mover,
                    min_best_margin=item.min_best_margin,
                    best_move_check=item.best_move_check,
                )
            if item.max_defender_pieces is not None:
                kept = [
                    b for b in loaded.boards if chess.popcount(b.occupied_co[not b.turn]) <= item.max_defender_pieces
                ]
                if not kept:
                    raise InputError(
                        f"start positions {item.positions!r}: none with at most {item.max_defender_pieces} defender pieces"
                    )
                loaded = StartPositions(kept, loaded.source)
            sources.append(loaded)
        return cls(sources, [item.weight for item in items], [item.label for item in items])

    def __len__(self) -> int:
        return sum(len(source) for source in self.sources)

    @property
    def source(self) -> str:
        return " + ".join(f"{p:.2f} x {label}" for p, label in zip(self.probabilities, self.labels))

    def draw(self, count: int, *, seed: int, step: int, rank: int = 0) -> list[chess.Board]:
        """`count` positions for (`step`, `rank`), each from a source picked by weight; order is the slots' order."""
        rng = np.random.default_rng([seed, step, rank, 0])
        slots = rng.choice(len(self.sources), size=count, p=self.probabilities)
        boards: list[chess.Board | None] = [None] * count
        for index, source in enumerate(self.sources):
            where = np.flatnonzero(slots == index)
            if len(where):
                for slot, board in zip(
                    where, source.draw(len(where), seed=seed, step=step, rank=rank, stream=index + 1)
                ):
                    boards[int(slot)] = board
        self.last_sources = [int(s) for s in slots]
        return boards  # type: ignore[return-value]

    def source_fractions(self) -> dict[str, float]:
        """Share of the latest draw from each source, by label."""
        total = max(len(self.last_sources), 1)
        return {label: self.last_sources.count(i) / total for i, label in enumerate(self.labels)}
