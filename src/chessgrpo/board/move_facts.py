"""Move facts: what the rules say about the position one legal move leads to, as bits per action.

A policy that reads only the board cannot see, in one forward pass, that a move leaves the
opponent without a legal reply: that takes the opponent's whole move generation. A small
transformer never learns it (docs/results.md, "Design choices": the quickstart policy stalemated
in 43% of its games against a random mover; a mate in one existed in 14.8% of its conversion
positions, and it played one in 0.8% of them). These facts are the legal-move mask's next step: exact, computed by python-chess,
and given to the policy as inputs (`models.policy.ActionPolicy` with ``move_facts``), where
learned, position-dependent weights decide what each fact is worth (a stalemate is bad for the
winning side and good for the losing one).

Bits of an action's fact byte (0 for an illegal move and for a legal move with none of them):
`MOVE_FACTS` (the rules), and for a policy that asks for them (`EXTRA_FACTS`): `EN_PRISE` (bit 5), a
static estimate, not a rule, of whether the moved piece can be taken at a loss (`en_prise_actions`), and
`MATE_IN_TWO` (bit 6), exact: the move is a check after which every reply allows a mate in one
(`mate_in_two_actions`), and `LEAVES_HANGING` (bit 7), a static estimate like en prise but over every
piece of the mover: the opponent can then win material with one capture (`leaves_hanging_actions`); and
from the game's history (`board.repetitions`), `REPETITION` (bit 8), `THREEFOLD` (bit 9) and `ALLOWS_THREEFOLD` (bit 10).

The two exchange facts run on a fast path (`_exchange_facts`) that flags exactly the moves of their plain
python-chess definitions (`en_prise_reference`, `leaves_hanging_reference`; tests/test_move_facts.py). One
quirk of the definition is kept on purpose: the pieces it re-examines after a move are those on a line
through the from-square *within python-chess's slider masks*, which leave out the board's edge squares, so
a piece on the edge that the move uncovers to an enemy slider (a rook on f8 behind a pawn on e7, facing a
bishop on c5) is not counted. About 4% of engine-game positions have such a move (40 of 1,000 data/tiny
positions). Counting them changes what trained policies read, so it waits for a retrained comparison.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import chess
import numpy as np

from chessgrpo.board.actions import ACTIONS, NUM_ACTIONS, move_to_action
from chessgrpo.board.fast_moves import FACT_BITS, available, mate_in_two_fast, move_facts_fast
from chessgrpo.board.repetitions import ALLOWS_THREEFOLD, REPETITION, THREEFOLD, PositionKey, repetition_facts

MOVE_FACTS = ("check", "checkmate", "stalemate", "insufficient_material", "fifty_moves")
"""Bit i of a fact byte is MOVE_FACTS[i]: the move gives check; mates; stalemates; leaves a dead
draw by insufficient material; reaches the fifty-move rule (100 plies without capture or pawn move)."""

CHECK, CHECKMATE, STALEMATE, INSUFFICIENT_MATERIAL, FIFTY_MOVES = (1 << i for i in range(len(MOVE_FACTS)))
# board.fast_moves cannot import these (this module imports it): its copies must stay the same bits.
assert FACT_BITS == (CHECK, CHECKMATE, STALEMATE, INSUFFICIENT_MATERIAL, FIFTY_MOVES), "fast_moves' fact bits differ"

EN_PRISE = 1 << len(MOVE_FACTS)
"""Bit 5: after the move, the opponent can take the moved piece and come out ahead in one exchange
(`en_prise_actions`). Only for policies built with ``en_prise`` (`models.policy.PolicyConfig`)."""
MATE_IN_TWO = 1 << (len(MOVE_FACTS) + 1)
"""Bit 6: the move gives check, the opponent has a reply, and every reply allows a mate in one: a
forced mate in two that starts with a check (`mate_in_two_actions`). Only for policies built with
``mate_in_two`` (`models.policy.PolicyConfig`)."""

LEAVES_HANGING = 1 << (len(MOVE_FACTS) + 2)
"""Bit 7: a move that does not give check, after which the opponent can capture one of the mover's pieces
(any of them, not only the moved one) and gain at least `HANGING_MIN_GAIN` points more than the move
captured, in one exchange (`leaves_hanging_actions`). Only for policies built with ``leaves_hanging``.
It is the last bit of a uint8 fact byte; the history facts above it (`board.repetitions`) are never set in
datasets of FENs (`train.dataset.SparseMoveFacts` keeps uint8), and `move_fact_array` widens to uint16 for them."""

HANGING_MIN_GAIN = 2
"""Material (pawns) a `LEAVES_HANGING` move loses beyond what it took: a minor piece, the exchange or
more. Pawn-sized losses are left out: in engine games they are as often gambits and trades as blunders."""

EXTRA_FACTS = {
    "en_prise": EN_PRISE,
    "mate_in_two": MATE_IN_TWO,
    "leaves_hanging": LEAVES_HANGING,
    "repetition": REPETITION,
    "threefold": THREEFOLD,
    "allows_threefold": ALLOWS_THREEFOLD,
}
"""The optional facts by name, with their bits: a policy reads the rule facts (`MOVE_FACTS`) and those
of these it was built with (`models.policy.PolicyConfig.extra_facts`). `REPETITION` and `THREEFOLD`
and `ALLOWS_THREEFOLD` (`board.repetitions`) come from the game's move stack, not the position: they need the fact
arrays' uint16 (`move_fact_array`)."""

FACT_CONFIG_KEYS = ("move_facts", *EXTRA_FACTS)
"""The policy config keys that switch move facts on: the rule facts (`move_facts`), then each optional fact."""

HISTORY_FACTS = ("repetition", "threefold", "allows_threefold")
"""The optional facts read from a game's history (`board.repetitions`): always 0 for a board without one."""


def fact_bit_positions(names: Sequence[str]) -> tuple[int, ...]:
    """The bit index of each named fact (`MOVE_FACTS` or `EXTRA_FACTS`) in a fact byte, in order."""
    positions = {name: i for i, name in enumerate(MOVE_FACTS)} | {
        name: bit.bit_length() - 1 for name, bit in EXTRA_FACTS.items()
    }
    unknown = [name for name in names if name not in positions]
    if unknown:
        raise ValueError(f"unknown move facts {unknown}; known: {list(positions)}")
    return tuple(positions[name] for name in names)


PIECE_VALUES = (0, 1, 3, 3, 5, 9, 0)
"""Material by `chess.PieceType` (index 0: no piece): pawn 1, knight and bishop 3, rook 5, queen 9.
The king is 0 as a moved piece (it never moves into attack) and is never the cheapest capturer of a
defended square (it cannot capture there)."""


def move_facts(
    board: chess.Board,
    fen: str | None = None,
    *,
    extra: Collection[str] = (),
    counts: dict[PositionKey, int] | None = None,
    repetitions: list[tuple[int, int]] | None = None,
) -> list[tuple[int, int]]:
    """(action, fact bits) for each legal move of `board` with at least one fact set, sorted by action.

    Computed by the fast backend (`board.fast_moves`, ~0.09 ms for a middlegame position) when it
    is installed, else by `move_facts_reference`; the two agree move for move (tests/test_fast_moves.py).
    `fen`: the board's FEN, when the caller has it. `extra`: names of `EXTRA_FACTS` to set as well
    (en_prise and leaves_hanging ~0.1 ms more together, ~0.03 ms en_prise alone; mate_in_two ~0.02 ms more with the fast
    backend, ~0.16 ms without, growing with the number of checks). The history facts (`HISTORY_FACTS`) read
    `counts`, the game's `board.repetitions.position_counts` when the caller keeps them, else the move stack;
    `repetitions`: the board's `board.repetitions.repetition_facts`, when the caller computed them already.
    """
    unknown = set(extra) - EXTRA_FACTS.keys()
    if unknown:
        raise ValueError(f"unknown extra move facts {sorted(unknown)}; known: {list(EXTRA_FACTS)}")
    facts = move_facts_fast(board, fen) if available(board) else None
    facts = move_facts_reference(board) if facts is None else facts
    if extra:
        merged = dict(facts)
        if "en_prise" in extra or "leaves_hanging" in extra:
            # One pass over the legal moves for both exchange facts.
            checks = {action for action, bits in facts if bits & CHECK}
            en_prise, hanging = _exchange_facts(
                board, None, checks, en_prise="en_prise" in extra, hanging="leaves_hanging" in extra
            )
            for action in en_prise:
                merged[action] = merged.get(action, 0) | EN_PRISE
            for action in hanging:
                merged[action] = merged.get(action, 0) | LEAVES_HANGING
        if "mate_in_two" in extra:
            checks = {action for action, bits in facts if bits & CHECK and not bits & CHECKMATE}
            for action in mate_in_two_actions(board, checks, fen=fen):
                merged[action] = merged.get(action, 0) | MATE_IN_TWO
        if any(name in HISTORY_FACTS for name in extra):
            keep = sum(EXTRA_FACTS[name] for name in HISTORY_FACTS if name in extra)
            allows = "allows_threefold" in extra
            for action, bits in repetition_facts(board, counts, allows=allows) if repetitions is None else repetitions:
                if bits & keep:
                    merged[action] = merged.get(action, 0) | (bits & keep)
        facts = list(merged.items())
    return sorted(facts)


def en_prise_reference(board: chess.Board) -> list[int]:
    """`en_prise_actions` written plainly with python-chess's board API: the reference the fast path is tested against.

    Actions of the legal moves after which the opponent can take the moved piece and gain material.

    A one-exchange static estimate (the first capture and, when the square is defended, the
    recapture; no pins, x-rays or longer sequences): a move is en prise when the opponent attacks
    its destination and what the mover loses there, the moved piece's value if the square is
    undefended, else that value minus the cheapest attacker's, exceeds what the move captured
    (`PIECE_VALUES`). Rxd5 where a pawn guards d5 and the rook took a pawn is en prise; Nxd5 that
    took a knight on a square a pawn guards and a piece defends is a trade, not en prise.

    Why it is a move fact: the pretrained quickstart policy played such a move with 23% of its moves
    on held-out engine-game positions where the engine's best move was one in 4.6%, and those moves
    carried more than half of its expected score lost (mean 0.22 against 0.06 for its other moves;
    docs/results.md, "Design choices"): a 2-layer network does not count attackers in one pass.
    """
    us, them = board.turn, not board.turn
    occupied = board.occupied
    mine, theirs = board.occupied_co[us], board.occupied_co[them]
    out: list[int] = []
    for move in board.generate_legal_moves():
        piece = board.piece_type_at(move.from_square)
        if piece == chess.KING or piece is None:
            continue
        to_bb = chess.BB_SQUARES[move.to_square]
        after = (occupied & ~chess.BB_SQUARES[move.from_square]) | to_bb
        their_after = theirs & ~to_bb
        captured = PIECE_VALUES[board.piece_type_at(move.to_square) or 0]
        if board.is_en_passant(move):
            taken = chess.BB_SQUARES[move.to_square + (-8 if us == chess.WHITE else 8)]
            after &= ~taken
            their_after &= ~taken
            captured = PIECE_VALUES[chess.PAWN]
        attackers = board.attackers_mask(them, move.to_square, after) & their_after
        if not attackers:
            continue
        moved = PIECE_VALUES[move.promotion or piece]
        defenders = board.attackers_mask(us, move.to_square, after) & mine & ~chess.BB_SQUARES[move.from_square]
        if defenders:
            cheapest = min(
                PIECE_VALUES[kind] if (kind := board.piece_type_at(square)) != chess.KING else 100
                for square in chess.scan_forward(attackers)
            )
            loss = max(0, moved - cheapest)
        else:
            loss = moved
        if loss > captured:
            out.append(move_to_action(move))
    return out


def _attacks_from(piece_type: chess.PieceType, color: chess.Color, square: chess.Square, occupied: int) -> int:
    """Squares a piece of `piece_type` on `square` attacks with `occupied` as the blockers."""
    if piece_type == chess.PAWN:
        return chess.BB_PAWN_ATTACKS[color][square]
    if piece_type == chess.KNIGHT:
        return chess.BB_KNIGHT_ATTACKS[square]
    if piece_type == chess.KING:
        return chess.BB_KING_ATTACKS[square]
    attacks = 0
    if piece_type in (chess.BISHOP, chess.QUEEN):
        attacks |= chess.BB_DIAG_ATTACKS[square][chess.BB_DIAG_MASKS[square] & occupied]
    if piece_type in (chess.ROOK, chess.QUEEN):
        attacks |= chess.BB_RANK_ATTACKS[square][chess.BB_RANK_MASKS[square] & occupied]
        attacks |= chess.BB_FILE_ATTACKS[square][chess.BB_FILE_MASKS[square] & occupied]
    return attacks


def leaves_hanging_reference(board: chess.Board, checks: Collection[int] | None = None) -> list[int]:
    """`leaves_hanging_actions` written plainly with python-chess's board API: the reference the fast path is tested against.

    Actions of the legal moves after which the opponent can win material with one capture.

    The same one-exchange static estimate as `en_prise_actions` (the capture and, when the square is
    defended, the recapture: the mover loses the piece's value, or that value minus the cheapest
    attacker's; no pins, x-rays or longer sequences), but over every piece of the mover after the move,
    not only the moved one: a defender that walks away, a line it opens, a threat it ignores. A move is
    flagged when the largest such loss exceeds what the move captured by `HANGING_MIN_GAIN` or more.
    Checks are never flagged (the opponent must answer the check first), nor is castling.
    `checks`: the actions of the board's checking moves when the caller knows them (from its
    `move_facts`); otherwise each move is tested.

    Why it is a move fact: in the recipe's pretrained 3 x 96 policy's games against Stockfish at Skill
    Level 0, 107 of its 576 moves that lost more than 0.2 of expected score left a piece hanging this
    way, against 9 that put the moved piece en prise; with the fact, 9 (docs/results.md, "Design choices";
    `scripts/blunder_causes.py`).
    """
    us, them = board.turn, not board.turn
    occupied, kings = board.occupied, board.kings
    mine, theirs = board.occupied_co[us], board.occupied_co[them]
    attacked_before = 0  # the mover's pieces the opponent attacks now: every move must keep them in mind
    for square in chess.scan_forward(mine & ~kings):
        if board.attackers_mask(them, square, occupied):
            attacked_before |= chess.BB_SQUARES[square]
    out: list[int] = []
    for move in board.generate_legal_moves():
        action = move_to_action(move)
        if (action in checks) if checks is not None else board.gives_check(move):
            continue
        if board.is_castling(move):
            continue
        from_square, to_square = move.from_square, move.to_square
        piece = board.piece_type_at(from_square)
        moved = move.promotion or piece
        from_bb, to_bb = chess.BB_SQUARES[from_square], chess.BB_SQUARES[to_square]
        after = (occupied & ~from_bb) | to_bb
        their_after = theirs & ~to_bb
        captured = PIECE_VALUES[board.piece_type_at(to_square) or 0]
        if board.is_en_passant(move):
            taken = chess.BB_SQUARES[to_square + (-8 if us == chess.WHITE else 8)]
            after &= ~taken
            their_after &= ~taken
            captured = PIECE_VALUES[chess.PAWN]
        mine_after = (mine & ~from_bb) | to_bb
        kings_after = (kings & mine & ~from_bb) | (to_bb if piece == chess.KING else 0)
        # A piece can only come under attack if it was attacked, sits on a line the move opens, or moved.
        lines = chess.BB_RANK_MASKS[from_square] | chess.BB_FILE_MASKS[from_square] | chess.BB_DIAG_MASKS[from_square]
        candidates = (attacked_before | lines | to_bb) & mine_after & ~kings_after
        moved_attacks = _attacks_from(moved, us, to_square, after)  # the moved piece defends from its new square
        worst = 0
        for square in chess.scan_forward(candidates):
            value = PIECE_VALUES[moved] if square == to_square else PIECE_VALUES[board.piece_type_at(square) or 0]
            if value <= worst:
                continue
            attackers = board.attackers_mask(them, square, after) & their_after
            if not attackers:
                continue
            defended = bool(board.attackers_mask(us, square, after) & mine_after & ~from_bb)
            defended = defended or (square != to_square and bool(moved_attacks & chess.BB_SQUARES[square]))
            if defended:
                cheapest = min(
                    PIECE_VALUES[kind] if (kind := board.piece_type_at(attacker)) != chess.KING else 100
                    for attacker in chess.scan_forward(attackers)
                )
                worst = max(worst, value - cheapest)
            else:
                worst = value
        if worst - captured >= HANGING_MIN_GAIN:
            out.append(action)
    return out


def en_prise_actions(board: chess.Board, moves: Sequence[chess.Move] | None = None) -> list[int]:
    """Actions of the legal moves after which the opponent can take the moved piece and gain material
    (the definition: `en_prise_reference`; the same actions, ~4x faster). `moves`: the board's legal
    moves when the caller has listed them."""
    return _exchange_facts(board, moves, None, en_prise=True, hanging=False)[0]


def leaves_hanging_actions(
    board: chess.Board, checks: Collection[int] | None = None, moves: Sequence[chess.Move] | None = None
) -> list[int]:
    """Actions of the legal moves after which the opponent can win material with one capture (the
    definition: `leaves_hanging_reference`; the same actions, ~3x faster). `checks`: the actions of the
    board's checking moves when the caller knows them; `moves`: its legal moves, likewise."""
    return _exchange_facts(board, moves, checks, en_prise=False, hanging=True)[1]


_KING_ATTACKS, _KNIGHT_ATTACKS, _PAWN_ATTACKS = chess.BB_KING_ATTACKS, chess.BB_KNIGHT_ATTACKS, chess.BB_PAWN_ATTACKS
_RANK_ATTACKS, _FILE_ATTACKS, _DIAG_ATTACKS = chess.BB_RANK_ATTACKS, chess.BB_FILE_ATTACKS, chess.BB_DIAG_ATTACKS
_RANK_MASKS, _FILE_MASKS, _DIAG_MASKS = chess.BB_RANK_MASKS, chess.BB_FILE_MASKS, chess.BB_DIAG_MASKS
_SQUARES = chess.BB_SQUARES


def _action_table() -> list[int]:
    """Action index by (from * 64 + to) * 7 + promotion piece type (0: none), -1 where no action exists."""
    table = [-1] * (64 * 64 * 7)
    for action in range(NUM_ACTIONS):
        move = chess.Move.from_uci(ACTIONS[action])
        table[(move.from_square * 64 + move.to_square) * 7 + (move.promotion or 0)] = action
    return table


_ACTION_OF_MOVE = _action_table()
# What a piece is worth as the cheapest capturer of a defended square: the king counts as 100 (it cannot recapture into a defence).
_CAPTURER_VALUES = (0, 1, 3, 3, 5, 9, 100)


def _exchange_facts(
    board: chess.Board,
    moves: Sequence[chess.Move] | None,
    checks: Collection[int] | None,
    *,
    en_prise: bool,
    hanging: bool,
) -> tuple[list[int], list[int]]:
    """(en-prise actions, leaves-hanging actions) of `board`, exactly `en_prise_reference` and
    `leaves_hanging_reference` (tests/test_move_facts.py compares them on thousands of positions).

    The same arithmetic on the same bitboards, with what the references ask python-chess again and
    again computed once per position: the piece on each square, the legal moves, and python-chess's
    `attackers_mask` inlined over its own attack tables.
    """
    us, them = board.turn, not board.turn
    occupied, kings, pawns, knights = board.occupied, board.kings, board.pawns, board.knights
    queens_rooks, queens_bishops = board.queens | board.rooks, board.queens | board.bishops
    mine, theirs = board.occupied_co[us], board.occupied_co[them]
    our_pawn_attacks, their_pawn_attacks = _PAWN_ATTACKS[us], _PAWN_ATTACKS[them]
    kind = [0] * 64
    for piece_type, bb in (
        (1, pawns),
        (2, knights),
        (3, board.bishops),
        (4, board.rooks),
        (5, board.queens),
        (6, kings),
    ):
        for square in chess.scan_forward(bb):
            kind[square] = piece_type
    values = PIECE_VALUES
    ep_square = board.ep_square
    pawn_step = -8 if us == chess.WHITE else 8

    def attackers(square: int, occ: int) -> int:
        """python-chess's `attackers_mask` of both colours, before masking by colour."""
        return (
            (_KING_ATTACKS[square] & kings)
            | (_KNIGHT_ATTACKS[square] & knights)
            | (
                (_RANK_ATTACKS[square][_RANK_MASKS[square] & occ] | _FILE_ATTACKS[square][_FILE_MASKS[square] & occ])
                & queens_rooks
            )
            | (_DIAG_ATTACKS[square][_DIAG_MASKS[square] & occ] & queens_bishops)
        )

    def their_attackers(square: int, occ: int) -> int:
        return (attackers(square, occ) | (our_pawn_attacks[square] & pawns)) & theirs

    def our_attackers(square: int, occ: int) -> int:
        return (attackers(square, occ) | (their_pawn_attacks[square] & pawns)) & mine

    def cheapest(attacking: int) -> int:
        return min(_CAPTURER_VALUES[kind[square]] for square in chess.scan_forward(attacking))

    attacked_before = 0
    # uncovered[b]: the mover's pieces that exactly one piece, on b, shields from one of the opponent's
    # sliders. After a move from b (not en passant), a piece the opponent did not attack is attacked
    # only if it is one of these or the moved piece: no other ray opens, and pawns, knights and kings
    # do not move. So the reference's other candidates are never attacked, and are not tested here.
    uncovered: dict[int, int] = {}
    if hanging:
        their_rooks, their_bishops = queens_rooks & theirs, queens_bishops & theirs
        for square in chess.scan_forward(mine & ~kings):
            bb = _SQUARES[square]
            if their_attackers(square, occupied):
                attacked_before |= bb
                continue
            for line_attacks, masks, sliders in (
                (_RANK_ATTACKS[square], _RANK_MASKS[square], their_rooks),
                (_FILE_ATTACKS[square], _FILE_MASKS[square], their_rooks),
                (_DIAG_ATTACKS[square], _DIAG_MASKS[square], their_bishops),
            ):
                if not line_attacks[0] & sliders:  # no slider on this line at all (attacks on an empty board)
                    continue
                seen = line_attacks[masks & occupied]
                shields = seen & occupied
                for slider in chess.scan_forward(line_attacks[masks & occupied & ~shields] & ~seen & sliders):
                    shield = (chess.between(square, slider) & shields).bit_length() - 1
                    uncovered[shield] = uncovered.get(shield, 0) | bb
    en_prise_out: list[int] = []
    hanging_out: list[int] = []
    for move in board.generate_legal_moves() if moves is None else moves:
        from_square, to_square, promotion = move.from_square, move.to_square, move.promotion
        piece = kind[from_square]
        from_bb, to_bb = _SQUARES[from_square], _SQUARES[to_square]
        after = (occupied & ~from_bb) | to_bb
        their_after = theirs & ~to_bb
        captured = values[kind[to_square]]
        captured_en_passant = (
            to_square == ep_square
            and piece == chess.PAWN
            and not occupied & to_bb
            and abs(to_square - from_square) in (7, 9)
        )
        if captured_en_passant:
            taken = _SQUARES[to_square + pawn_step]
            after &= ~taken
            their_after &= ~taken
            captured = 1
        moved = promotion or piece
        action = _ACTION_OF_MOVE[(from_square * 64 + to_square) * 7 + (promotion or 0)]
        # What the opponent wins by taking the moved piece (both facts need it; a king is never taken).
        moved_loss = 0
        if piece != chess.KING:
            attacking = their_attackers(to_square, after) & their_after
            if attacking:
                moved_loss = (
                    values[moved] - cheapest(attacking) if our_attackers(to_square, after) & ~from_bb else values[moved]
                )
                if en_prise and max(0, moved_loss) > captured:
                    en_prise_out.append(action)
        if not hanging:
            continue
        if (action in checks) if checks is not None else board.gives_check(move):
            continue
        if piece == chess.KING and (abs((from_square & 7) - (to_square & 7)) > 1 or board.rooks & mine & to_bb):
            continue  # castling (python-chess's `is_castling`)
        mine_after = (mine & ~from_bb) | to_bb
        kings_after = (kings & mine & ~from_bb) | (to_bb if piece == chess.KING else 0)
        # A piece can only come under attack if it was attacked, is uncovered by the move, or moved. The
        # reference tests the pieces on a line through the from-square, within python-chess's slider masks,
        # which leave out the board's edge squares: so does this (the same actions; module docstring).
        # The largest loss over the candidates does not depend on their order: the moved piece's first.
        lines = _RANK_MASKS[from_square] | _FILE_MASKS[from_square] | _DIAG_MASKS[from_square]
        opened = lines if captured_en_passant else uncovered.get(from_square, 0) & lines
        others = (attacked_before | opened) & mine_after & ~kings_after & ~to_bb
        worst = max(0, moved_loss)
        if others:
            moved_attacks = _attacks_from(moved, us, to_square, after)  # the moved piece defends from its new square
            for square in chess.scan_forward(others):
                value = values[kind[square]]
                if value <= worst:
                    continue
                attacking = their_attackers(square, after) & their_after
                if not attacking:
                    continue
                if our_attackers(square, after) & mine_after & ~from_bb or moved_attacks & _SQUARES[square]:
                    worst = max(worst, value - cheapest(attacking))
                else:
                    worst = value
        if worst - captured >= HANGING_MIN_GAIN:
            hanging_out.append(action)
    return en_prise_out, hanging_out


def mate_in_two_actions(
    board: chess.Board, checks: Collection[int] | None = None, *, fen: str | None = None
) -> list[int]:
    """Actions of the checks that force mate in two: the opponent has a legal reply, and after each
    one the mover has a mate in one. Exact (the rules, no estimate); quiet first moves are not
    searched (that would cost every legal move's every reply), and the board is left as it was.
    `checks`: the actions of the board's non-mating checks when the caller knows them (from its
    `move_facts`), which saves a check test per legal move; `fen`: the board's FEN, likewise.

    Why it is a move fact: a mate in two is a tree of one check, every reply and a mate test per
    reply, which a small network does not compute in one pass. The pretrained quickstart policy found
    the first move in 24 of the 82 such positions among the 500 development puzzles.

    Computed by the fast backend (`board.fast_moves.mate_in_two_fast`) when it is installed, else by
    `mate_in_two_reference`; the two agree (tests/test_fast_moves.py).
    """
    if available(board):
        fast = mate_in_two_fast(board, fen, None if checks is None else set(checks))
        if fast is not None:
            return sorted(fast)
    return mate_in_two_reference(board, checks)


def mate_in_two_reference(board: chess.Board, checks: Collection[int] | None = None) -> list[int]:
    """`mate_in_two_actions` by python-chess alone (the reference the fast path is checked against)."""
    out: list[int] = []
    for move in list(board.generate_legal_moves()):
        if (move_to_action(move) not in checks) if checks is not None else not board.gives_check(move):
            continue
        board.push(move)
        try:
            replies = list(board.generate_legal_moves())
            forced = bool(replies)  # no reply: the check mates or stalemates (rule facts already)
            for reply in replies:
                board.push(reply)
                try:
                    forced = has_mate(move_facts(board))
                finally:
                    board.pop()
                if not forced:
                    break
        finally:
            board.pop()
        if forced:
            out.append(move_to_action(move))
    return out


def move_facts_reference(board: chess.Board) -> list[tuple[int, int]]:
    """python-chess's move facts, the reference: one push, one check test and the first legal
    reply per move (`any` stops at the first), ~0.55 ms for a middlegame position. The board is
    left as it was. Unsorted (legal-move order).
    """
    out: list[tuple[int, int]] = []
    for move in list(board.legal_moves):
        material_changes = board.is_capture(move) or move.promotion is not None
        board.push(move)
        try:
            bits = 0
            check = board.is_check()
            if not any(board.generate_legal_moves()):
                bits = CHECK | CHECKMATE if check else STALEMATE
            else:
                if check:
                    bits |= CHECK
                if material_changes and board.is_insufficient_material():
                    bits |= INSUFFICIENT_MATERIAL
                if board.halfmove_clock >= 100:
                    bits |= FIFTY_MOVES
        finally:
            board.pop()
        if bits:
            out.append((move_to_action(move), bits))
    return out


def move_fact_array(
    boards: Sequence[chess.Board],
    facts: Sequence[list[tuple[int, int]]] | None = None,
    fens: Sequence[str] | None = None,
    *,
    extra: Collection[str] = (),
) -> np.ndarray:
    """uint8 [B, 1968]: the fact bits of every action of every board (0 where nothing holds); uint16 when
    `extra` names a history fact (`HISTORY_FACTS`, above bit 7).

    `facts`: each board's `move_facts`, when the caller has them already (search computes them
    once per leaf for its mate-in-one test and the network's input; computed with the same
    `extra`); `fens`: the boards' FENs, likewise. `extra`: names of `EXTRA_FACTS` to set as well.
    """
    if facts is not None and len(facts) != len(boards):
        raise ValueError(f"{len(facts)} fact lists for {len(boards)} boards")
    wide = any(name in HISTORY_FACTS for name in extra)
    out = np.zeros((len(boards), NUM_ACTIONS), dtype=np.uint16 if wide else np.uint8)
    for row, board in enumerate(boards):
        known = facts[row] if facts is not None else move_facts(board, None if fens is None else fens[row], extra=extra)
        for action, bits in known:
            out[row, action] = bits
    return out


def has_mate(facts: Sequence[tuple[int, int]]) -> bool:
    """Whether a position's `move_facts` include a checkmating move (a mate in one)."""
    return any(bits & CHECKMATE for _, bits in facts)
