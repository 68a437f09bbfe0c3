"""Lichess puzzles: parsing, Lichess scoring (any mate counts), rating buckets, the CLI."""

from __future__ import annotations

import csv
import json
import logging
import subprocess
import sys
from pathlib import Path

import chess
import pytest
from helpers import shared_file

from chessgrpo.eval.players import RandomPlayer
from chessgrpo.eval.puzzles import parse_puzzle, rating_bucket, read_puzzles, solve_puzzles

HEADER = "PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,GameUrl,OpeningTags"
# Black's setup move c7c6, then White mates with Ra8# -- or with Rb8#, which Lichess accepts too.
TWO_MATES = "2MATE,6k1/2p2ppp/8/8/8/8/5PPP/RR4K1 b - - 0 1,c7c6 a1a8,900,75,90,100,mate mateIn1,,"
# From the shared CSV: a mate in 2 whose final move f7g7# has an alternative d4g7#.
ALT_MATE_ID = "G0tiu"


class OraclePlayer:
    """Plays the solution of every puzzle it was built from (a test double of a player)."""

    def __init__(self, puzzles, *, deviate: dict[str, dict[int, str]] | None = None):
        self.name = "oracle"
        self.answers: dict[str, chess.Move] = {}
        for puzzle in puzzles:
            board = puzzle.board.copy()
            for ply, move in enumerate(puzzle.solution):
                if ply % 2 == 0:
                    override = (deviate or {}).get(puzzle.id, {}).get(ply)
                    self.answers[board.epd()] = chess.Move.from_uci(override) if override else move
                board.push(move)
        self.calls: list[int] = []

    def choose_moves(self, boards):
        self.calls.append(len(boards))
        return [self.answers[board.epd()] for board in boards]


def shared_rows(count: int) -> list[dict]:
    with shared_file("lichess_puzzles_dev.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))[:count]


def write_csv(path: Path, rows: list[str]) -> Path:
    path.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return path


def test_puzzle_position_is_after_the_setup_move():
    puzzle = parse_puzzle(
        {"PuzzleId": "2MATE", "FEN": "6k1/2p2ppp/8/8/8/8/5PPP/RR4K1 b - - 0 1", "Moves": "c7c6 a1a8", "Rating": "900"}
    )
    assert puzzle.board.turn == chess.WHITE and puzzle.board.piece_at(chess.C6) == chess.Piece.from_symbol("p")
    assert puzzle.solution == (chess.Move.from_uci("a1a8"),) and puzzle.rating == 900


def test_oracle_solves_every_shared_puzzle_in_batches():
    puzzles = read_puzzles(shared_file("lichess_puzzles_dev.csv"), max_puzzles=40, seed=0).puzzles
    assert len(puzzles) == 40 and max(len(p.solution) for p in puzzles) >= 3
    oracle = OraclePlayer(puzzles)
    result = solve_puzzles(oracle, puzzles)
    assert (result.solve_rate.value, result.first_move_accuracy.value, result.solve_rate.n) == (1.0, 1.0, 40)
    assert result.solve_rate.low > 0.9
    # One call per solver turn across all puzzles, shrinking as short puzzles finish.
    assert oracle.calls[0] == 40 and oracle.calls == sorted(oracle.calls, reverse=True)
    assert len(oracle.calls) == max((len(p.solution) + 1) // 2 for p in puzzles)
    assert sum(b["solve_rate"].n for b in result.by_rating.values()) == 40


def test_random_player_rarely_solves():
    puzzles = read_puzzles(shared_file("lichess_puzzles_dev.csv")).puzzles
    assert len(puzzles) == 500
    result = solve_puzzles(RandomPlayer(0), puzzles)
    assert result.solve_rate.value <= 0.02 and result.first_move_accuracy.value <= 0.08
    assert result.solve_rate.low == 0.0 or result.solve_rate.value > 0
    assert result.first_move_accuracy.high < 0.1


def test_any_mating_move_counts(tmp_path):
    [puzzle] = read_puzzles(write_csv(tmp_path / "mate.csv", [TWO_MATES])).puzzles
    assert solve_puzzles(OraclePlayer([puzzle]), [puzzle]).solve_rate.value == 1.0
    other_mate = solve_puzzles(OraclePlayer([puzzle], deviate={"2MATE": {0: "b1b8"}}), [puzzle])
    assert (other_mate.first_move_accuracy.value, other_mate.solve_rate.value) == (1.0, 1.0)
    quiet = solve_puzzles(OraclePlayer([puzzle], deviate={"2MATE": {0: "b1b7"}}), [puzzle])
    assert (quiet.first_move_accuracy.value, quiet.solve_rate.value) == (0.0, 0.0)
    assert quiet.records[0].played == ("b1b7",)

    shared = [p for p in read_puzzles(shared_file("lichess_puzzles_dev.csv")).puzzles if p.id == ALT_MATE_ID]
    assert len(shared) == 1 and shared[0].solution[-1].uci() == "f7g7"
    alternative = solve_puzzles(OraclePlayer(shared, deviate={ALT_MATE_ID: {2: "d4g7"}}), shared)
    assert alternative.solve_rate.value == 1.0 and alternative.records[0].played[-1] == "d4g7"


def test_a_wrong_later_move_fails_the_line_but_not_the_first_move():
    puzzles = [p for p in read_puzzles(shared_file("lichess_puzzles_dev.csv")).puzzles if len(p.solution) >= 3][:5]
    deviate = {}
    for puzzle in puzzles:
        board = puzzle.board.copy()
        board.push(puzzle.solution[0])
        board.push(puzzle.solution[1])
        wrong = next(m for m in board.legal_moves if m != puzzle.solution[2] and not _mates(board, m))
        deviate[puzzle.id] = {2: wrong.uci()}
    result = solve_puzzles(OraclePlayer(puzzles, deviate=deviate), puzzles)
    assert result.first_move_accuracy.value == 1.0 and result.solve_rate.value == 0.0
    assert all(len(record.played) == 2 for record in result.records)


def _mates(board: chess.Board, move: chess.Move) -> bool:
    board.push(move)
    mate = board.is_checkmate()
    board.pop()
    return mate


def test_rating_buckets(tmp_path):
    assert [rating_bucket(r) for r in (400, 999, 1000, 1399, 1400, 1799, 1800, 2199, 2200, 3000)] == [
        "<1000", "<1000", "1000-1399", "1000-1399", "1400-1799", "1400-1799", "1800-2199", "1800-2199", ">=2200", ">=2200",
    ]  # fmt: skip
    rows = shared_rows(3)
    csv_rows = [TWO_MATES] + [f"{r['PuzzleId']},{r['FEN']},{r['Moves']},2300,1,1,1,{r['Themes']},," for r in rows]
    puzzles = read_puzzles(write_csv(tmp_path / "buckets.csv", csv_rows)).puzzles
    result = solve_puzzles(OraclePlayer(puzzles), puzzles)
    assert {bucket: m["solve_rate"].n for bucket, m in result.by_rating.items()} == {"<1000": 1, ">=2200": 3}
    assert result.to_json()["by_rating"][">=2200"]["solve_rate"] == {"value": 1.0, "low": pytest.approx(0.4385, abs=1e-3), "high": 1.0, "n": 3}


def test_malformed_rows_are_skipped_and_counted_or_raise_when_strict(tmp_path, caplog):
    path = write_csv(
        tmp_path / "mixed.csv",
        [
            TWO_MATES,
            "BADFEN,not a fen,e2e4 e7e5,1500,1,1,1,,,",
            "LONG,6k1/2p2ppp/8/8/8/8/5PPP/RR4K1 b - - 0 1,c7c6 a1a7 g8h8 a7a8,1500,1,1,1,,,",  # valid: Ra7 Kh8 Ra8#
            "BADMOVE,6k1/2p2ppp/8/8/8/8/5PPP/RR4K1 b - - 0 1,c7c6 e1e8,1500,1,1,1,,,",
            "ODD,6k1/2p2ppp/8/8/8/8/5PPP/RR4K1 b - - 0 1,c7c6 a1a8 g8h8,1500,1,1,1,,,",
            "RATING,6k1/2p2ppp/8/8/8/8/5PPP/RR4K1 b - - 0 1,c7c6 a1a8,high,1,1,1,,,",
            'INJECT,"6k1/2p2ppp/8/8/8/8/5PPP/RR4K1 b - - 0 1\nquit",c7c6 a1a8,1500,1,1,1,,,',  # a UCI command smuggled in
        ],
    )
    with caplog.at_level(logging.WARNING, logger="chessgrpo.eval.puzzles"):
        puzzle_set = read_puzzles(path)
    assert [p.id for p in puzzle_set.puzzles] == ["2MATE", "LONG"]
    assert [s.puzzle_id for s in puzzle_set.skipped] == ["BADFEN", "BADMOVE", "ODD", "RATING", "INJECT"]
    assert "skipped 5 malformed puzzle rows" in caplog.text
    assert "illegal move 'e1e8'" in puzzle_set.skipped[1].reason and puzzle_set.skipped[1].line == 5
    with pytest.raises(ValueError, match=r"mixed.csv:3: puzzle BADFEN"):
        read_puzzles(path, strict=True)
    with pytest.raises(ValueError, match="lacks columns"):
        read_puzzles(_write(tmp_path / "wrong.csv", "a,b\n1,2\n"))
    with pytest.raises(ValueError, match="no valid puzzle"):
        read_puzzles(write_csv(tmp_path / "bad.csv", ["BADFEN,not a fen,e2e4 e7e5,1500,1,1,1,,,"]))
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        read_puzzles(tmp_path / "missing.csv")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def chessgrpo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chessgrpo.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_puzzles_json_with_baseline(tmp_path):
    csv_path = shared_file("lichess_puzzles_dev.csv")
    result = chessgrpo(
        "eval", "puzzles", "--policy", "random", "--puzzles", str(csv_path), "--max-puzzles", "60", "--json",
        "engine.processes=2", "engine.cache=false",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["player"] == "random" and set(report["baselines"]) == {"stockfish"}
    for metrics in (report, report["baselines"]["stockfish"]):
        for key in ("first_move_accuracy", "solve_rate"):
            assert set(metrics[key]) == {"value", "low", "high", "n"} and metrics[key]["n"] == 60
        assert sum(bucket["solve_rate"]["n"] for bucket in metrics["by_rating"].values()) == 60
    assert report["baselines"]["stockfish"]["solve_rate"]["low"] > report["solve_rate"]["high"]
    assert report["puzzles"] == {"source": str(csv_path), "n": 60, "skipped": 0}


def test_cli_puzzles_table_without_engine(tmp_path):
    path = write_csv(tmp_path / "two.csv", [TWO_MATES, "BADFEN,not a fen,e2e4 e7e5,1500,1,1,1,,,"])
    result = chessgrpo("eval", "puzzles", "--policy", "random", "--puzzles", str(path), "baselines=false", "engine.path=/nonexistent")
    assert result.returncode == 0, result.stderr
    assert "puzzles: 1 from" in result.stdout and "(1 malformed rows skipped)" in result.stdout
    assert "solve rate by rating" in result.stdout and "<1000" in result.stdout
    assert "skipped 1 malformed puzzle rows" in result.stderr


def value_head_checkpoint(directory: Path, value_head: bool = True) -> Path:
    import torch

    from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy

    torch.manual_seed(0)
    return save_policy(ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=value_head)), directory)


def test_cli_puzzles_with_search_nodes(tmp_path):
    from helpers import SYZYGY_DIR

    checkpoint = value_head_checkpoint(tmp_path / "vh")
    result = chessgrpo(
        "eval", "puzzles", "--checkpoint", str(checkpoint), "--puzzles", str(shared_file("lichess_puzzles_dev.csv")),
        "--max-puzzles", "5", "--search-nodes", "16", "--json", "baselines=false", f"engine.syzygy_path={SYZYGY_DIR}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["player"] == f"{checkpoint} (puct 16 nodes)" and report["solve_rate"]["n"] == 5
    assert report["search"]["nodes"] == 16 and report["search"]["algorithm"] == "puct"


def test_cli_puzzles_search_without_a_value_head_is_one_clear_error(tmp_path):
    checkpoint = value_head_checkpoint(tmp_path / "plain", value_head=False)
    path = write_csv(tmp_path / "one.csv", [TWO_MATES])
    result = chessgrpo("eval", "puzzles", "--checkpoint", str(checkpoint), "--puzzles", str(path), "--search-nodes", "8", "baselines=false")
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"chessgrpo: checkpoint {checkpoint}: search needs a policy with a value head"), line
