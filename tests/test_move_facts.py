"""Move facts: the rule facts of each legal move, and the policy that reads them."""

from __future__ import annotations

import chess
import numpy as np
import pytest
import torch

from chessgrpo.board import NUM_ACTIONS, SEQUENCE_LENGTH, move_to_action
from chessgrpo.board.move_facts import (
    CHECK,
    CHECKMATE,
    FIFTY_MOVES,
    INSUFFICIENT_MATERIAL,
    STALEMATE,
    move_fact_array,
    move_facts,
)
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, load_policy, save_policy
from chessgrpo.train.dataset import SparseMoveFacts


def _facts(fen: str) -> dict[str, int]:
    board = chess.Board(fen)
    before = board.fen()
    out = {_uci(a): bits for a, bits in move_facts(board)}
    assert board.fen() == before  # the board is left as it was
    return out


def _uci(action: int) -> str:
    from chessgrpo.board import ACTIONS

    return ACTIONS[action]


def test_back_rank_mate_is_check_and_checkmate():
    facts = _facts("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1")
    assert facts == {"a1a8": CHECK | CHECKMATE}


def test_stalemate_and_mate_with_king_and_queen():
    # White: Kf6, Qg1 (not giving check); Black: Kh8. Qg7 mates, Qg6 stalemates, Qh1 / Qh2 check.
    facts = _facts("7k/8/5K2/8/8/8/8/6Q1 w - - 0 1")
    assert facts["g1g7"] == CHECK | CHECKMATE
    assert facts["g1g6"] == STALEMATE
    assert facts["g1h1"] == CHECK and facts["g1h2"] == CHECK
    assert "g1g2" not in facts  # nothing holds: not listed


def test_capture_into_insufficient_material_and_fifty_moves():
    # Kxb2 leaves K v K; any move but a capture at halfmove clock 99 reaches the fifty-move rule.
    facts = _facts("8/8/8/8/8/8/1n6/K6k w - - 0 1")
    assert facts["a1b2"] == INSUFFICIENT_MATERIAL
    facts = _facts("8/8/8/8/8/2k5/8/K5R1 w - - 99 80")
    assert facts["g1g2"] == FIFTY_MOVES
    assert facts["g1g3"] & CHECK and facts["g1g3"] & FIFTY_MOVES


def test_fact_array_matches_sparse_facts_and_black_to_move():
    boards = [chess.Board(), chess.Board("k7/8/1K6/8/8/8/8/7q b - - 0 1")]
    array = move_fact_array(boards)
    assert array.shape == (2, NUM_ACTIONS) and array.dtype == np.uint8
    assert not array[0].any()  # no move of the start position checks or ends the game
    assert array[1, move_to_action(chess.Move.from_uci("h1h6"))] == CHECK
    sparse = SparseMoveFacts.of(boards)
    assert np.array_equal(sparse.dense(np.array([1, 0])), array[[1, 0]].astype(np.int64))


def test_policy_with_move_facts_starts_as_the_same_policy_and_learns_the_fact():
    torch.manual_seed(0)
    plain = ActionPolicy(PolicyConfig())
    torch.manual_seed(0)
    with_facts = ActionPolicy(PolicyConfig(move_facts=True))
    board = chess.Board("7k/8/5K2/8/8/8/8/6Q1 w - - 0 1")
    tokens, legal = with_facts.inputs([board])
    assert tokens.shape == (1, SEQUENCE_LENGTH + NUM_ACTIONS)
    plain_tokens, _ = plain.inputs([board])
    with torch.no_grad():
        assert torch.equal(with_facts(tokens), plain(plain_tokens))  # zero-initialised head
        with pytest.raises(ValueError, match="77 board tokens"):
            with_facts(plain_tokens)
    # One gradient step on "mate" raises the mating move's logit through the fact weights alone.
    mate = move_to_action(chess.Move.from_uci("g1g7"))
    optimizer = torch.optim.SGD(with_facts.move_facts.parameters(), lr=1.0)
    logits = with_facts(tokens).masked_fill(~legal, float("-inf"))
    torch.nn.functional.cross_entropy(logits, torch.tensor([mate])).backward()
    optimizer.step()
    with torch.no_grad():
        after = with_facts(tokens).masked_fill(~legal, float("-inf")).log_softmax(-1)
    assert after[0, mate] > logits.log_softmax(-1)[0, mate] + 0.1


def test_move_fact_policy_round_trips_and_old_configs_load(tmp_path):
    model = ActionPolicy(PolicyConfig(move_facts=True))
    with torch.no_grad():
        model.move_facts.weights.bias.fill_(0.5)
    save_policy(model, tmp_path / "facts")
    loaded = load_policy(tmp_path / "facts")
    assert loaded.config.move_facts and torch.equal(loaded.move_facts.weights.bias, model.move_facts.weights.bias)
    save_policy(ActionPolicy(PolicyConfig()), tmp_path / "plain")
    config = (tmp_path / "plain" / "model_config.json").read_text().replace(',\n  "move_facts": false', "")
    (tmp_path / "plain" / "model_config.json").write_text(config)
    assert load_policy(tmp_path / "plain").move_facts is None  # a checkpoint from before move facts


# --- the en-prise fact (bit 5): a one-exchange static estimate, for policies built with en_prise ---


def _en_prise(fen: str) -> set[str]:
    from chessgrpo.board.move_facts import en_prise_actions

    return {_uci(action) for action in en_prise_actions(chess.Board(fen))}


def test_en_prise_by_hand():
    # Rxd5 takes a pawn that a pawn guards: the rook (5) is lost for a pawn (1).
    assert "d1d5" in _en_prise("6k1/8/4p3/3p4/8/8/8/3R2K1 w - - 0 1")
    assert "d1d4" not in _en_prise("6k1/8/4p3/3p4/8/8/8/3R2K1 w - - 0 1")  # nothing attacks d4
    # Nxd5 takes a knight where a pawn guards and a pawn defends: a trade (loses 3 - 1 = 2 < 3 won).
    assert "f4d5" not in _en_prise("6k1/8/4p3/3n4/2P2N2/8/8/6K1 w - - 0 1")
    # Rg7+ next to the king: undefended, the king takes it; defended by the bishop, the king cannot.
    assert "g2g7" in _en_prise("6k1/8/8/8/8/8/6R1/6K1 w - - 0 1")
    assert "g2g7" not in _en_prise("6k1/8/8/8/8/8/1B4R1/6K1 w - - 0 1")
    # En passant wins the pawn that is not on the destination square: pawn for pawn, not en prise
    # (counting the empty d6 as nothing captured would call it en prise).
    assert "e5d6" not in _en_prise("4k3/1n6/8/3pP3/8/8/8/4K3 w - d6 0 2")
    # Black to move; a queen stepping next to a defended pawn's attack; kings never count as en prise.
    moves = _en_prise("4k3/8/8/8/8/2P5/8/3QK3 b - - 0 1")
    assert moves == set()  # Black has only king moves
    assert "d8d4" in _en_prise("3qk3/8/8/8/8/2P5/8/4K3 b - - 0 1")  # c3 pawn takes the queen on d4


def test_en_prise_bit_only_when_asked_and_merged_with_rule_facts():
    from chessgrpo.board.move_facts import EN_PRISE

    fen = "6k1/8/8/8/8/8/6R1/6K1 w - - 0 1"  # Rg7+ is check and en prise
    plain = dict(move_facts(chess.Board(fen)))
    assert all(bits < EN_PRISE for bits in plain.values())
    with_prise = dict(move_facts(chess.Board(fen), extra=("en_prise",)))
    g7 = move_to_action(chess.Move.from_uci("g2g7"))
    assert plain[g7] == CHECK and with_prise[g7] == CHECK | EN_PRISE
    array = move_fact_array([chess.Board(fen)], extra=("en_prise",))
    assert array[0, g7] == CHECK | EN_PRISE
    sparse = SparseMoveFacts.of([chess.Board(fen)], ("en_prise",))
    assert np.array_equal(sparse.dense(np.array([0])), array.astype(np.int64))


def test_en_prise_policy_reads_the_sixth_fact_and_round_trips(tmp_path):
    from chessgrpo.board.move_facts import EN_PRISE

    with pytest.raises(ValueError, match="needs move_facts"):
        PolicyConfig(en_prise=True)
    torch.manual_seed(0)
    rules_only = ActionPolicy(PolicyConfig(move_facts=True))
    torch.manual_seed(0)
    model = ActionPolicy(PolicyConfig(move_facts=True, en_prise=True))
    assert model.move_facts.weights.out_features == 6 and rules_only.move_facts.weights.out_features == 5
    board = chess.Board("6k1/8/8/8/8/8/6R1/6K1 w - - 0 1")
    tokens, legal = model.inputs([board])
    g7 = move_to_action(chess.Move.from_uci("g2g7"))
    assert tokens[0, SEQUENCE_LENGTH + g7] == CHECK | EN_PRISE
    with torch.no_grad():
        assert torch.equal(model(tokens), rules_only(tokens))  # zero-initialised: same policy at the start
        model.move_facts.weights.bias[5] = -2.0  # the en-prise weight moves only en-prise moves
        rules_only.move_facts.weights.bias.fill_(0.0)
        delta = model(tokens) - rules_only(tokens)
    en_prise = tokens[0, SEQUENCE_LENGTH:] & EN_PRISE > 0
    assert torch.allclose(delta[0, en_prise], torch.tensor(-2.0)) and torch.all(delta[0, ~en_prise] == 0)
    save_policy(model, tmp_path / "prise")
    loaded = load_policy(tmp_path / "prise")
    assert loaded.config.en_prise and torch.equal(loaded.move_facts.weights.bias, model.move_facts.weights.bias)


# --- the mate-in-two fact (bit 6): checks that force mate in two, exact ---


def _flagged(actions_of, fen: str) -> set[str]:
    """The UCI moves a fact function (`mate_in_two_actions`, `leaves_hanging_actions`) flags on `fen`,
    checking that it leaves the board as it was."""
    board = chess.Board(fen)
    before = board.fen()
    found = {_uci(action) for action in actions_of(board)}
    assert board.fen() == before
    return found


def _mates_in_two(fen: str) -> set[str]:
    from chessgrpo.board.move_facts import mate_in_two_actions

    return _flagged(mate_in_two_actions, fen)


def test_mate_in_two_by_hand():
    # The king steps off the a1-h8 diagonal with a discovered check: Kg6+ Kg8 Qa8#, Kf7+ Kh7 Qh1#.
    # Other king steps (Ke5+, Kg5+...) check too, but Kh7 or Kg8 escapes a mate in one after some of them.
    assert _mates_in_two("7k/8/5K2/8/8/8/8/Q7 w - - 0 1") == {"f6g6", "f6f7"}
    # Every check mates at once (back rank): a mate in one is the rule fact, not a mate in two.
    assert _mates_in_two("6k1/5ppp/8/8/8/8/5PPP/RR4K1 w - - 0 1") == set()


def test_mate_in_two_agrees_with_stockfish():
    """Every check of a set of won endgames: flagged exactly when Stockfish, on the position after the
    check, sees the side to move mated in one move (its every reply allows a mate)."""
    import random

    import chess.engine

    from chessgrpo.board.move_facts import mate_in_two_actions
    from chessgrpo.engine.locate import find_stockfish

    rng = random.Random(7)
    boards = []
    while len(boards) < 30:
        board = chess.Board(None)
        squares = rng.sample(chess.SQUARES, 4)
        board.set_piece_at(squares[0], chess.Piece(chess.KING, chess.WHITE))
        board.set_piece_at(squares[1], chess.Piece(chess.KING, chess.BLACK))
        board.set_piece_at(squares[2], chess.Piece(rng.choice([chess.QUEEN, chess.ROOK]), chess.WHITE))
        board.set_piece_at(squares[3], chess.Piece(rng.choice([chess.ROOK, chess.BISHOP]), chess.WHITE))
        board.turn = chess.WHITE
        if board.is_valid() and not board.is_game_over() and any(board.gives_check(m) for m in board.legal_moves):
            boards.append(board)
    flagged_total = 0
    with chess.engine.SimpleEngine.popen_uci(str(find_stockfish())) as engine:
        for board in boards:
            flagged = set(mate_in_two_actions(board))
            flagged_total += len(flagged)
            for move in [m for m in board.legal_moves if board.gives_check(m)]:
                board.push(move)
                if board.is_game_over():
                    engine_says = False  # mate or stalemate in one: not a mate in two
                else:
                    score = engine.analyse(board, chess.engine.Limit(depth=6))["score"].relative
                    engine_says = score.mate() == -1
                board.pop()
                assert (move_to_action(move) in flagged) == engine_says, (board.fen(), move.uci())
    assert flagged_total > 0  # the sample has mates in two to find


def test_mate_in_two_bit_and_policy_with_both_extra_facts(tmp_path):
    from chessgrpo.board.move_facts import EN_PRISE, MATE_IN_TWO

    fen = "7k/8/5K2/8/8/8/8/Q7 w - - 0 1"
    g6 = move_to_action(chess.Move.from_uci("f6g6"))
    assert dict(move_facts(chess.Board(fen), extra=("mate_in_two",)))[g6] == CHECK | MATE_IN_TWO
    assert dict(move_facts(chess.Board(fen)))[g6] == CHECK
    with pytest.raises(ValueError, match="unknown extra move facts"):
        move_facts(chess.Board(fen), extra=("mate_in_three",))
    with pytest.raises(ValueError, match="needs move_facts"):
        PolicyConfig(mate_in_two=True)
    # Mate in two without en prise: the head reads bits 0-4 and 6 (bit 5 stays unread).
    model = ActionPolicy(PolicyConfig(move_facts=True, mate_in_two=True))
    assert model.config.fact_names[-1] == "mate_in_two" and model.move_facts.weights.out_features == 6
    tokens, _ = model.inputs([chess.Board(fen)])
    assert tokens[0, SEQUENCE_LENGTH + g6] == CHECK | MATE_IN_TWO
    with torch.no_grad():
        model.move_facts.weights.bias[5] = 3.0
        spoofed = tokens.clone()
        spoofed[0, SEQUENCE_LENGTH + g6] = CHECK | EN_PRISE  # an en-prise bit this policy does not read
        delta = model(tokens) - model(spoofed)
    assert torch.isclose(delta[0, g6], torch.tensor(3.0)) and torch.count_nonzero(delta) == 1
    both = ActionPolicy(PolicyConfig(move_facts=True, en_prise=True, mate_in_two=True))
    assert both.config.fact_names[-2:] == ("en_prise", "mate_in_two") and both.move_facts.weights.out_features == 7
    save_policy(both, tmp_path / "both")
    loaded = load_policy(tmp_path / "both")
    assert loaded.config.extra_facts == ("en_prise", "mate_in_two")


# --- the leaves-hanging fact (bit 7): any of the mover's pieces can be won by one capture ---


def _hanging(fen: str) -> set[str]:
    from chessgrpo.board.move_facts import leaves_hanging_actions

    return _flagged(leaves_hanging_actions, fen)


def test_leaves_hanging_by_hand():
    # The white knight on d4 is attacked by the e5 pawn: every move that does not save it leaves it
    # hanging, defending it with a pawn does not help (knight 3 for pawn 1), retreats to safe squares do.
    flagged = _hanging("rnbqkbnr/pppp1ppp/8/4p3/3N4/8/PPPPPPPP/RNBQKB1R w KQkq - 0 2")
    assert {"a2a3", "e2e3", "c2c3", "d4c6", "d4e6"} <= flagged
    assert not {"d4b3", "d4f3", "d4f5", "d4b5"} & flagged
    # Rook d1 attacked by the rook on d4 and undefended: king moves leave it, stepping along the first
    # rank saves it, taking the attacker is not flagged (nothing of White's is attacked after it).
    flagged = _hanging("6k1/8/8/8/3r4/8/8/3R2K1 w - - 0 1")
    assert {"g1f1", "g1h2", "d1d2"} <= flagged and not {"d1a1", "d1e1", "d1d4"} & flagged
    # A defender walks away. The knight on f3 is attacked by the queen on h5 and defended by the bishop on e2 (queen 9 > knight 3,
    # so the queen will not take a defended knight); moving the bishop off e2's diagonal leaves it hanging.
    flagged = _hanging("4k3/8/8/7q/8/5N2/4B3/4K3 w - - 0 1")
    assert "e2a6" in flagged and "e2d1" not in flagged  # d1 still guards f3
    # Checks are never flagged (the opponent must answer them), even when they leave a piece hanging.
    assert "e2b5" not in _hanging("4k3/8/8/7q/8/5N2/4B3/4K3 w - - 0 1")
    # A move that takes more than it leaves: Bxh5 (wins the queen) is not flagged.
    assert "e2h5" not in flagged


def test_leaves_hanging_agrees_with_playing_the_captures_out():
    """Against a slow reference that pushes every capture the opponent then has and looks for a legal
    recapture, on positions from random games. They differ only where pins make a capture or recapture
    illegal (the static estimate ignores pins), which is rare."""
    import random

    from chessgrpo.board.move_facts import HANGING_MIN_GAIN, PIECE_VALUES, en_prise_actions, leaves_hanging_actions

    def by_pushes(board: chess.Board) -> set[int]:
        out = set()
        for move in list(board.legal_moves):
            if board.gives_check(move) or board.is_castling(move):
                continue
            captured = (
                PIECE_VALUES[chess.PAWN]
                if board.is_en_passant(move)
                else PIECE_VALUES[board.piece_type_at(move.to_square) or 0]
            )
            board.push(move)
            worst = 0
            for reply in list(board.legal_moves):
                if board.is_capture(reply) and not board.is_en_passant(reply):
                    victim = PIECE_VALUES[board.piece_type_at(reply.to_square)]
                    attacker = PIECE_VALUES[board.piece_type_at(reply.from_square)]
                    board.push(reply)
                    recapture = any(
                        True for _ in board.generate_legal_captures(to_mask=chess.BB_SQUARES[reply.to_square])
                    )
                    board.pop()
                    worst = max(worst, victim - attacker if recapture else victim)
            board.pop()
            if worst - captured >= HANGING_MIN_GAIN:
                out.add(move_to_action(move))
        return out

    rng = random.Random(0)
    agree = total = flagged = 0
    for _ in range(40):
        board = chess.Board()
        for _ in range(rng.randrange(6, 90)):
            if board.is_game_over():
                break
            board.push(rng.choice(list(board.legal_moves)))
        if board.is_game_over():
            continue
        fast, slow = set(leaves_hanging_actions(board)), by_pushes(board)
        for move in board.legal_moves:
            action = move_to_action(move)
            total += 1
            agree += (action in fast) == (action in slow)
            flagged += action in fast
        # The moved piece is one of the mover's pieces: an en-prise move that loses 2 or more beyond
        # its capture leaves something hanging (checks and castling aside).
        for action in en_prise_actions(board):
            move = next(m for m in board.legal_moves if move_to_action(m) == action)
            if not board.gives_check(move) and action not in fast:
                taken = PIECE_VALUES[board.piece_type_at(move.to_square) or 0]
                assert (
                    PIECE_VALUES[move.promotion or board.piece_type_at(move.from_square)] - taken < HANGING_MIN_GAIN + 1
                ), (board.fen(), move.uci())
    assert total > 1000 and 0.1 < flagged / total < 0.9
    assert agree / total >= 0.98, agree / total


def test_leaves_hanging_bit_and_policy_reading_eight_facts(tmp_path):
    from chessgrpo.board.move_facts import LEAVES_HANGING

    fen = "rnbqkbnr/pppp1ppp/8/4p3/3N4/8/PPPPPPPP/RNBQKB1R w KQkq - 0 2"
    a3 = move_to_action(chess.Move.from_uci("a2a3"))
    assert dict(move_facts(chess.Board(fen), extra=("leaves_hanging",)))[a3] == LEAVES_HANGING == 128
    assert a3 not in dict(move_facts(chess.Board(fen)))
    with pytest.raises(ValueError, match="needs move_facts"):
        PolicyConfig(leaves_hanging=True)
    model = ActionPolicy(PolicyConfig(move_facts=True, en_prise=True, mate_in_two=True, leaves_hanging=True))
    assert model.config.fact_names[-1] == "leaves_hanging" and model.move_facts.weights.out_features == 8
    tokens, _ = model.inputs([chess.Board(fen)])
    assert tokens[0, SEQUENCE_LENGTH + a3] == LEAVES_HANGING
    sparse = SparseMoveFacts.of([chess.Board(fen)], model.config.extra_facts)  # uint8 storage keeps bit 7
    assert sparse.dense(np.array([0]))[0, a3] == LEAVES_HANGING
    with torch.no_grad():
        before = model(tokens)
        model.move_facts.weights.bias[7] = -2.0  # the new weight moves only the flagged moves
        delta = model(tokens) - before
    hanging = tokens[0, SEQUENCE_LENGTH:] & LEAVES_HANGING > 0
    assert torch.allclose(delta[0, hanging], torch.tensor(-2.0)) and torch.all(delta[0, ~hanging] == 0)
    save_policy(model, tmp_path / "hanging")
    assert load_policy(tmp_path / "hanging").config.extra_facts == ("en_prise", "mate_in_two", "leaves_hanging")


@pytest.mark.slow
def test_exchange_facts_equal_their_references_move_for_move():
    """The fast en-prise and leaves-hanging paths (one pass, inlined attack tables, only the pieces a move
    can uncover) flag exactly the moves of the plain python-chess references, on 1,500 positions of
    random games (every kind of move: captures, en passant, castling, promotions, checks, pins) and on
    positions where an edge piece is uncovered (the reference's line masks leave the edges out)."""
    import random

    from chessgrpo.board.move_facts import (
        CHECK,
        EN_PRISE,
        LEAVES_HANGING,
        en_prise_actions,
        en_prise_reference,
        leaves_hanging_actions,
        leaves_hanging_reference,
        move_facts,
        move_facts_reference,
    )

    rng = random.Random(7)
    boards = [
        chess.Board(
            "2r2rk1/p2bppb1/q1n3pn/1pBpP2p/P4P2/2PP1N1P/1PQNB1P1/R3K2R b - - 2 17"
        ),  # e7e6 uncovers f8 (an edge)
        chess.Board(
            "2b1k3/1p1p2p1/2n5/p1pBP3/2P1Q1nq/2N1P3/PP6/RNB2K1q w - - 0 22"
        ),  # the king uncovers c1 to a queen on h1
        chess.Board("rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3"),  # en passant
        chess.Board("4k3/8/8/1n1pP3/8/8/8/1B2K2Q w - d6 0 1"),  # en passant opens the b1-h7 diagonal
        chess.Board("4k3/8/2n5/r2pP2K/8/8/8/8 w - d6 0 1"),  # en passant that would expose the king: illegal
    ]
    while len(boards) < 1500:
        board = chess.Board()
        for _ in range(rng.randrange(4, 120)):
            if board.is_game_over():
                break
            moves = list(board.legal_moves)
            sharp = [m for m in moves if board.is_capture(m) or m.promotion]
            board.push(rng.choice(sharp) if sharp and rng.random() < 0.2 else rng.choice(moves))
        if not board.is_game_over():
            boards.append(board.copy(stack=False))
    flagged = en_passant = 0
    for board in boards:
        assert sorted(en_prise_actions(board)) == sorted(en_prise_reference(board)), board.fen()
        expected = sorted(leaves_hanging_reference(board))
        assert sorted(leaves_hanging_actions(board)) == expected, board.fen()
        facts = move_facts(board, extra=("en_prise", "leaves_hanging"))
        checks = {action for action, bits in move_facts_reference(board) if bits & CHECK}
        assert sorted(leaves_hanging_actions(board, checks)) == expected, board.fen()
        assert sorted(a for a, bits in facts if bits & LEAVES_HANGING) == expected, board.fen()
        assert sorted(a for a, bits in facts if bits & EN_PRISE) == sorted(en_prise_reference(board)), board.fen()
        flagged += len(expected)
        en_passant += any(board.is_en_passant(m) for m in board.legal_moves)
    assert flagged > 5000 and en_passant >= 4, (flagged, en_passant)  # legal en passant: 2 above, the rest random
