"""Endgame start positions: uniform random placements of a material signature such as ``KQvK``.

A position is drawn by rejection sampling: the pieces go on distinct squares chosen uniformly at
random (pawns only on ranks 2-7), the strong side (the pieces left of the ``v``) is to move, and
the placement is kept when it is legal (python-chess's `Board.is_valid`: kings not adjacent, the
side not to move not in check, ...), not terminal (the side to move has a legal move) and
accepted by the caller's predicate. Rejection sampling from a uniform proposal is uniform over
the accepted set, so with the predicate "the tablebase says the side to move wins" the draw is
uniform over the legal, non-terminal, won positions of the signature.

`EndgameStarts` is the stream of start positions of one endgame run: a held-out evaluation set
and fresh per-step training draws that never contain a held-out position.

This module knows no engine and no tablebase: the predicate (`accept`, `EndgameStarts`'s
`is_won` and `plies`) comes from the caller (`engine.tablebase.Tablebase.is_won`, a cached WDL
probe). Draws are seeded and reproducible.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Collection, Iterable

import chess

from chessgrpo.errors import InputError

COLOURS = ("white", "black", "both")
"""Which colour the strong side has: always White, always Black, or either with probability 1/2."""

CURRICULUM = ("KQvK", "KRvK", "KBBvK", "KBNvK")
"""The endgame curriculum, easiest first (optimal mate needs at most 10, 16, 19 and 33 moves)."""

_PIECES = {"K": chess.KING, "Q": chess.QUEEN, "R": chess.ROOK, "B": chess.BISHOP, "N": chess.KNIGHT, "P": chess.PAWN}
_PAWN_SQUARES = [square for square in chess.SQUARES if 1 <= chess.square_rank(square) <= 6]


@dataclasses.dataclass(frozen=True)
class Material:
    """A material signature: the strong side's and the weak side's pieces, kings included."""

    strong: tuple[chess.PieceType, ...]
    weak: tuple[chess.PieceType, ...]
    name: str

    @classmethod
    def parse(cls, name: str) -> Material:
        """``"KQvK"`` -> Material((KING, QUEEN), (KING,)). Each side has exactly one king, listed first."""
        if not isinstance(name, str) or name.count("v") != 1:
            raise InputError(f"endgame material {name!r}: expected a signature like 'KQvK' (pieces, 'v', pieces)")
        sides = name.split("v")
        parsed = []
        for side in sides:
            if not side or side[0] != "K" or side.count("K") != 1 or any(c not in _PIECES for c in side):
                raise InputError(
                    f"endgame material {name!r}: each side must be 'K' followed by pieces from Q, R, B, N, P; got {side!r}"
                )
            parsed.append(tuple(_PIECES[c] for c in side))
        if len(parsed[0]) + len(parsed[1]) > 7:
            raise InputError(f"endgame material {name!r}: at most 7 pieces fit any Syzygy table")
        return cls(strong=parsed[0], weak=parsed[1], name=name)

    @property
    def pieces(self) -> int:
        return len(self.strong) + len(self.weak)


def random_placement(material: Material, rng: random.Random, strong_colour: chess.Color) -> chess.Board | None:
    """One uniformly random placement with the strong side to move, or None when it is not legal/non-terminal.

    The halfmove clock is 0 and there are no castling rights or en-passant square.
    """
    board = chess.Board(None)
    taken: set[int] = set()
    for colour, pieces in ((strong_colour, material.strong), (not strong_colour, material.weak)):
        for piece in pieces:
            candidates = _PAWN_SQUARES if piece == chess.PAWN else chess.SQUARES
            square = rng.choice(candidates)
            if square in taken:
                return None  # reject, rather than re-draw, to keep the proposal uniform over placements
            taken.add(square)
            board.set_piece_at(square, chess.Piece(piece, colour))
    board.turn = strong_colour
    if not board.is_valid() or not any(board.generate_legal_moves()):
        return None
    return board


def endgame_positions(
    material: str | Material,
    count: int,
    *,
    seed: int | list[int],
    colours: str = "white",
    accept: Callable[[chess.Board], bool] | None = None,
    exclude: Collection[str] = (),
    distinct: bool = False,
    max_attempts: int | None = None,
) -> list[chess.Board]:
    """`count` start positions of `material`, uniform over the legal, non-terminal positions `accept` keeps.

    Args:
        material: a signature such as "KQvK" (strong side first; the strong side is to move).
        count: positions to return.
        seed: seeds `random.Random` (an int, or a list of ints such as [seed, step, rank]).
        colours: the strong side's colour: "white", "black" or "both" (each with probability 1/2).
        accept: a predicate on the board (e.g. "the tablebase says the side to move wins"); None keeps all.
        exclude: EPD strings (`board.epd()`) never to return, e.g. a held-out evaluation set.
        distinct: no position twice (uniform without replacement); else draws are independent.
        max_attempts: give up with RuntimeError after this many placements (default 2000 * count + 10000).
    """
    if colours not in COLOURS:
        raise ValueError(f"colours must be one of {list(COLOURS)}, got {colours!r}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    material = Material.parse(material) if isinstance(material, str) else material
    rng = random.Random(_seed_value(seed))
    limit = max_attempts if max_attempts is not None else 2000 * count + 10000
    seen: set[str] = set()
    boards: list[chess.Board] = []
    attempts = 0
    while len(boards) < count:
        attempts += 1
        if attempts > limit:
            raise RuntimeError(
                f"found only {len(boards)} of {count} {material.name} positions in {limit} placements "
                "(is the predicate ever true? are there enough distinct positions?)"
            )
        colour = chess.WHITE if colours == "white" else chess.BLACK if colours == "black" else rng.random() < 0.5
        board = random_placement(material, rng, colour)
        if board is None:
            continue
        key = board.epd()
        if key in exclude or (distinct and key in seen):
            continue
        if accept is not None and not accept(board):
            continue
        seen.add(key)
        boards.append(board)
    return boards


class EndgameStarts:
    """Won start positions of one material signature: a held-out set and fresh per-step draws.

    `is_won` says the side to move wins (e.g. `Tablebase.is_won`); `plies` gives a won position's
    distance to the end in plies (e.g. `Tablebase.probe_dtz`), needed only for `draw(max_plies=...)`;
    `tables` names the tables the caller has (e.g. `Tablebase.names`): the material must be one.
    Training draws never contain a held-out position, nor any rotation or mirror image of one
    (`board_symmetries`: the same position to the game, so a policy that learned the image learned the
    held-out start): "fresh held-out" is exact, not probable.
    """

    def __init__(
        self,
        material: str,
        is_won: Callable[[chess.Board], bool],
        *,
        tables: Collection[str],
        plies: Callable[[chess.Board], int] | None = None,
        colours: str = "white",
    ):
        self.material = Material.parse(material)
        if colours not in COLOURS:
            raise InputError(f"endgame colours must be one of {list(COLOURS)}, got {colours!r}")
        name = self.material.name
        if name not in tables:
            raise InputError(f"no Syzygy table {name} among {', '.join(tables)}")
        self.is_won = is_won
        self.plies = plies
        self.colours = colours
        self.held_out: set[str] = set()
        self.excluded: set[str] = set()
        """EPDs of `exclude`d positions and all their images: never held out, never drawn (e.g. an SFT data set's)."""
        self._never: set[str] = set()  # held_out | excluded, kept up to date rather than joined per draw

    def exclude(self, boards: Iterable[chess.Board]) -> None:
        """Never hold out nor draw any of `boards` or their rotations and mirror images (call before `hold_out`)."""
        for board in boards:
            images = symmetric_epds(board)
            self.excluded.update(images)
            self._never.update(images)

    @property
    def source(self) -> str:
        return f"endgame:{self.material.name}"

    def hold_out(self, count: int, *, seed: int, max_plies: int | None = None) -> list[chess.Board]:
        """`count` distinct won positions, excluded with all their rotations and mirror images from every later
        `draw`; only those at most `max_plies` from mate or conversion (`plies`) when it is given."""
        boards = endgame_positions(
            self.material,
            count,
            seed=[seed, 1_000_000_007 % (1 << 30)],
            colours=self.colours,
            accept=self._accept(max_plies),
            exclude=self.excluded,
            distinct=True,
        )
        for board in boards:
            images = symmetric_epds(board)
            self.held_out.update(images)
            self._never.update(images)
        return boards

    def draw(
        self, count: int, *, seed: int, step: int, rank: int = 0, max_plies: int | None = None
    ) -> list[chess.Board]:
        """`count` won positions for (seed, step, rank): reproducible, uniform, never held out nor `exclude`d.

        `max_plies` keeps only positions whose distance (`plies`) is at most that many plies (a
        reverse curriculum: near-mate positions first); uniform among those.
        """
        return endgame_positions(
            self.material,
            count,
            seed=[seed, step, rank],
            colours=self.colours,
            accept=self._accept(max_plies),
            exclude=self._never,
        )

    def _accept(self, max_plies: int | None) -> Callable[[chess.Board], bool]:
        """Won, and at most `max_plies` from mate or conversion when it is given."""
        if max_plies is None:
            return self.is_won
        plies = self.plies
        if plies is None:
            raise ValueError("EndgameStarts: a max_plies limit needs the plies callable")

        def accept(board: chess.Board) -> bool:
            return self.is_won(board) and plies(board) <= max_plies

        return accept


def _seed_value(seed: int | list[int]) -> int:
    """A single integer seed from an int or a list of non-negative ints (mixed, order-sensitive)."""
    if isinstance(seed, int):
        return seed
    value = 0
    for part in seed:
        if not isinstance(part, int) or part < 0:
            raise ValueError(f"seed parts must be non-negative integers, got {seed!r}")
        value = (value * 1_000_003 + part) % (1 << 62)
    return value


SquareMap = Callable[[chess.Square], chess.Square]

_DIHEDRAL: tuple[SquareMap, ...] = (
    lambda s: s,
    lambda s: s ^ 7,  # mirror files (a <-> h)
    lambda s: s ^ 56,  # mirror ranks (1 <-> 8)
    lambda s: s ^ 63,  # rotate 180 degrees
    lambda s: chess.square(chess.square_rank(s), chess.square_file(s)),  # transpose (a1-h8 diagonal)
    lambda s: chess.square(7 - chess.square_rank(s), chess.square_file(s)),  # rotate 90 degrees
    lambda s: chess.square(chess.square_rank(s), 7 - chess.square_file(s)),  # rotate 270 degrees
    lambda s: chess.square(7 - chess.square_rank(s), 7 - chess.square_file(s)),  # anti-transpose (a8-h1)
)


def board_symmetries(board: chess.Board) -> tuple[SquareMap, ...]:
    """The square maps that turn `board` into an equivalent position (same value, same distance to mate).

    Without pawns and castling rights the game is symmetric under the 8 rotations and reflections of
    the board; with pawns (or castling rights) only the mirror a <-> h is (and not even that with
    castling rights). The side to move and the colours never change.
    """
    if board.castling_rights:
        return _DIHEDRAL[:1]
    if board.pawns:
        return _DIHEDRAL[:2]
    return _DIHEDRAL


def transform_board(board: chess.Board, square_map: SquareMap) -> chess.Board:
    """`board` with every piece (and the en-passant square) moved by `square_map`; clocks and turn kept."""
    result = chess.Board(None)
    for square, piece in board.piece_map().items():
        result.set_piece_at(square_map(square), piece)
    result.turn = board.turn
    result.ep_square = None if board.ep_square is None else square_map(board.ep_square)
    result.halfmove_clock = board.halfmove_clock
    result.fullmove_number = board.fullmove_number
    return result


def transform_move(move: chess.Move, square_map: SquareMap) -> chess.Move:
    """`move` under the same square map as `transform_board` (promotion piece kept)."""
    return chess.Move(square_map(move.from_square), square_map(move.to_square), promotion=move.promotion)


def symmetric_epds(board: chess.Board) -> set[str]:
    """EPD strings of every position equivalent to `board` under `board_symmetries` (itself included)."""
    return {transform_board(board, square_map).epd() for square_map in board_symmetries(board)}
