"""`chessgrpo uci`: driven by python-chess's engine client and through a raw pipe."""

from __future__ import annotations

import subprocess
import sys

import chess
import chess.engine
import pytest
import torch

from chessgrpo.eval.uci_engine import parse_position
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy

STARTUP_TIMEOUT_S = 60.0  # torch import on a busy 2-core machine


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    return save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), tmp_path_factory.mktemp("uci") / "ckpt")


def command(checkpoint, *extra: str) -> list[str]:
    return [sys.executable, "-m", "chessgrpo.cli", "uci", "--checkpoint", str(checkpoint), *extra]


def test_python_chess_plays_legal_moves(checkpoint):
    engine = chess.engine.SimpleEngine.popen_uci(command(checkpoint), timeout=STARTUP_TIMEOUT_S)
    try:
        assert engine.id["name"] == "chessgrpo ckpt" and engine.id["author"] == "chessgrpo"
        assert engine.options["Temperature"].default == "0" and engine.options["Device"].default == "cpu"
        board = chess.Board()
        result = engine.play(board, chess.engine.Limit(time=0.1))
        assert result.move in board.legal_moves
        # A position given as FEN + moves (python-chess sends "position fen ... moves ...").
        board = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
        for move in ["f1c4", "g8f6", "d2d3"]:
            board.push_uci(move)
        for limit in (chess.engine.Limit(depth=3), chess.engine.Limit(nodes=100), chess.engine.Limit(white_clock=10, black_clock=10)):
            result = engine.play(board, limit)
            assert result.move in board.legal_moves
        engine.configure({"Temperature": "1.5"})
        for _ in range(3):
            assert engine.play(board, chess.engine.Limit(time=0.1)).move in board.legal_moves
        # A whole short game against itself stays legal.
        board = chess.Board()
        for _ in range(12):
            move = engine.play(board, chess.engine.Limit(time=0.01)).move
            assert move in board.legal_moves
            board.push(move)
    finally:
        engine.quit()


def test_raw_pipe_survives_malformed_commands(checkpoint):
    script = "\n".join(
        [
            "uci",
            "isready",
            "position startpos moves e2e4 e7e5",
            "position fen 8/8/8/8 w - - 0 1",  # bad FEN: keeps 1. e4 e5
            "position startpos moves e2e4 e2e4",  # illegal move: keeps 1. e4 e5
            "position fen rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 garbage",
            "position banana",
            "go wtime 1000 btime 1000",
            "setoption name Temperature value -3",
            "setoption name Device value not-a-device",
            "setoption name Nonsense value 1",
            "setoption",
            "frobnicate the engine",
            "\x00\x01\xff garbage",
            "go movetime 10",
            "stop",
            "position fen 7k/6Q1/6K1/8/8/8/8/8 b - - 0 1",  # Black is checkmated
            "go infinite",
            "isready",
            "quit",
        ]
    )
    completed = subprocess.run(command(checkpoint), input=script + "\n", capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines.count("readyok") == 2 and "uciok" in lines
    assert "option name Temperature type string default 0" in lines
    bestmoves = [line.split()[1] for line in lines if line.startswith("bestmove")]
    assert len(bestmoves) == 3
    after_e4_e5 = chess.Board()
    for move in ["e2e4", "e7e5"]:
        after_e4_e5.push_uci(move)
    assert chess.Move.from_uci(bestmoves[0]) in after_e4_e5.legal_moves
    assert chess.Move.from_uci(bestmoves[1]) in after_e4_e5.legal_moves
    assert bestmoves[2] == "0000"
    errors = [line for line in lines if line.startswith("info string error")]
    assert len(errors) >= 6  # two bad FENs, an illegal move, a bad setup, two bad option values, ...
    assert any("unknown command ignored: frobnicate" in line for line in lines)
    assert sum(line.startswith("info depth") for line in lines) == 2


def test_parse_position():
    assert parse_position(["startpos"]).fen() == chess.STARTING_FEN
    board = parse_position("fen 4k3/8/8/8/8/8/4P3/4K3 w - - 0 1 moves e2e4 e8d7".split())
    assert board.fen() == "8/3k4/8/8/4P3/8/8/4K3 w - - 1 2" and len(board.move_stack) == 2
    for bad in ([], ["startpos", "extra"], ["fen"], "startpos moves e7e5".split(), "startpos moves zz".split()):
        with pytest.raises(ValueError):
            parse_position(bad)


def test_a_bad_checkpoint_fails_at_startup(tmp_path):
    completed = subprocess.run(command(tmp_path / "nothing"), input="uci\n", capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2 and "no checkpoint" in completed.stderr and completed.stdout == ""
