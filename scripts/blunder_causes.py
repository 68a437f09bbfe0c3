"""What a policy loses its games to: its big losses in an `eval games` PGN, by cause.

Every move of the policy (the side with a ``WhiteSource``/``BlackSource`` header, as `chessgrpo eval games`
writes them) in the games against one anchor is valued by Stockfish before and after; a move that loses
more than `--drop` of the mover's expected score is put in the first class that holds, looking at the
position after it:

- allows mate: the engine sees the mover mated;
- en prise: the moved piece can be taken at a loss (`board.move_facts.en_prise_actions`);
- leaves hanging: another piece can be won by one capture (`board.move_facts.leaves_hanging_actions`);
- a piece can be taken at a gain of a pawn or more: any capture of the opponent that wins material in one
  exchange (a looser test than the fact: pawn-sized gains, checking moves);
- deeper tactic: none of these (forks, pins, discovered attacks, quiet threats).

    .venv/bin/python scripts/blunder_causes.py runs/cpu_hour/eval/pretrain_games.pgn --anchor sf-skill:0

The table is what docs/lab/recipe.md ("A move fact for pieces left hanging") quotes.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import chess  # noqa: E402
import chess.engine  # noqa: E402
import chess.pgn  # noqa: E402

from chessgrpo.board.actions import move_to_action  # noqa: E402
from chessgrpo.board.move_facts import PIECE_VALUES, en_prise_actions, leaves_hanging_actions  # noqa: E402
from chessgrpo.engine.locate import find_stockfish  # noqa: E402

CLASSES = ("allows mate", "en prise", "leaves hanging", "a piece can be taken at a gain", "deeper tactic")


def capture_gains(board: chess.Board) -> bool:
    """Whether the side to move has a capture that wins material in one exchange (pawn-sized gains too)."""
    for move in board.generate_legal_captures():
        victim = PIECE_VALUES[board.piece_type_at(move.to_square) or chess.PAWN]
        attacker = board.piece_type_at(move.from_square)
        cost = 100 if attacker == chess.KING else PIECE_VALUES[attacker or 0]
        board.push(move)
        defended = any(True for _ in board.generate_legal_captures(to_mask=chess.BB_SQUARES[move.to_square]))
        board.pop()
        if victim - (cost if defended else 0) > 0:
            return True
    return False


def classify(games: Path, anchor: str, nodes: int, drop: float) -> tuple[int, collections.Counter, dict[str, float]]:
    """(policy moves, big losses per class, expected score lost per class) over the games against `anchor`."""
    counts: collections.Counter = collections.Counter()
    lost: dict[str, float] = collections.defaultdict(float)
    moves = 0
    with open(games) as pgn, chess.engine.SimpleEngine.popen_uci(str(find_stockfish())) as engine:
        limit = chess.engine.Limit(nodes=nodes)
        while (game := chess.pgn.read_game(pgn)) is not None:
            if game.headers.get("Anchor") != anchor:
                continue
            ours = chess.WHITE if "WhiteSource" in game.headers else chess.BLACK
            board = game.board()
            for move in game.mainline_moves():
                if board.turn != ours or board.is_game_over():
                    board.push(move)
                    continue
                moves += 1
                before = engine.analyse(board, limit)["score"].pov(ours).wdl().expectation()
                action = move_to_action(move)
                en_prise = action in en_prise_actions(board)
                hanging = action in leaves_hanging_actions(board)
                board.push(move)
                score = engine.analyse(board, limit)["score"].pov(ours)
                loss = before - score.wdl().expectation()
                if loss > drop:
                    if score.is_mate() and score.mate() < 0:
                        kind = CLASSES[0]
                    elif en_prise:
                        kind = CLASSES[1]
                    elif hanging:
                        kind = CLASSES[2]
                    elif capture_gains(board):
                        kind = CLASSES[3]
                    else:
                        kind = CLASSES[4]
                    counts[kind] += 1
                    lost[kind] += loss
    return moves, counts, lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pgn", type=Path, help="PGN written by `chessgrpo eval games`")
    parser.add_argument(
        "--anchor", required=True, help="the games against this anchor (its Anchor header), e.g. sf-skill:0"
    )
    parser.add_argument("--nodes", type=int, default=5000, help="Stockfish nodes per valuation (default 5000)")
    parser.add_argument(
        "--drop", type=float, default=0.2, help="a big loss: more expected score than this (default 0.2)"
    )
    args = parser.parse_args()
    if not args.pgn.is_file():
        parser.error(f"{args.pgn} is not a file")
    moves, counts, lost = classify(args.pgn, args.anchor, args.nodes, args.drop)
    if not moves:
        parser.error(f"no games against {args.anchor!r} with a policy side in {args.pgn}")
    print(
        f"{moves} policy moves against {args.anchor}; {sum(counts.values())} lost more than {args.drop} of expected score"
    )
    print(f"{'after the move':34s} {'moves':>6s} {'per move':>9s} {'score lost':>11s}")
    for kind in CLASSES:
        print(f"{kind:34s} {counts[kind]:6d} {counts[kind] / moves:9.3f} {lost[kind]:11.1f}")


if __name__ == "__main__":
    main()
