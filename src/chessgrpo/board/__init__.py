"""Board representation: FEN tokenisation, the fixed 1968-move action space, validation, sources.

Both follow DeepMind's searchless_chess conventions so that models and data
from that project stay compatible.
"""

from chessgrpo.board.actions import (
    ACTION_INDEX,
    ACTIONS,
    NUM_ACTIONS,
    action_to_move,
    legal_actions,
    legal_mask,
    legal_masks,
    move_to_action,
)
from chessgrpo.board.encoding import (
    SEQUENCE_LENGTH,
    VOCAB_SIZE,
    VOCABULARY,
    decode_tokens,
    encode_fen,
    encode_fens,
)
from chessgrpo.board.sources import random_playout_positions, read_fen_file
from chessgrpo.board.validation import parse_board, parse_move

__all__ = [
    "ACTIONS",
    "ACTION_INDEX",
    "NUM_ACTIONS",
    "SEQUENCE_LENGTH",
    "VOCABULARY",
    "VOCAB_SIZE",
    "action_to_move",
    "decode_tokens",
    "encode_fen",
    "encode_fens",
    "legal_actions",
    "legal_mask",
    "legal_masks",
    "move_to_action",
    "parse_board",
    "parse_move",
    "random_playout_positions",
    "read_fen_file",
]
