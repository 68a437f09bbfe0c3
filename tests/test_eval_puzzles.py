"""Lichess puzzles: parsing, Lichess scoring (any mate counts), rating buckets, the CLI."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import chess
import pytest

from chessgrpo.eval.puzzles import parse_puzzle, rating_bucket, read_puzzles, solve_puzzles
from chessgrpo.play.players import RandomPlayer
from helpers import data_file

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
    with data_file("lichess_puzzles_dev.csv").open(newline="") as handle:
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
    puzzles = read_puzzles(data_file("lichess_puzzles_dev.csv"), max_puzzles=40, seed=0).puzzles
    assert len(puzzles) == 40 and max(len(p.solution) for p in puzzles) >= 3
    oracle = OraclePlayer(puzzles)
    result = solve_puzzles(oracle, puzzles)
    assert (result.solve_rate.value, result.first_move_accuracy.value, result.solve_rate.n) == (1.0, 1.0, 40)
    assert result.solve_rate.low > 0.9
    # One call per solver turn across all puzzles, shrinking as short puzzles finish.
    assert oracle.calls[0] == 40 and oracle.calls == sorted(oracle.calls, reverse=True)
    assert len(oracle.calls) == max((len(p.solution) + 1) // 2 for p in puzzles)
    assert sum(b["solve_rate"].n for b in result.by_rating.values()) == 40
    # Every puzzle is check-first or quiet-first, by its solution's first move.
    check_first = sum(p.board.gives_check(p.solution[0]) for p in puzzles)
    assert 0 < check_first < 40 and result.by_solution["check first"]["solve_rate"].n == check_first
    assert result.by_solution["quiet first"]["solve_rate"].n == 40 - check_first
    assert result.played_check_rate.value == pytest.approx(check_first / 40)  # the oracle plays the solutions


def test_random_player_rarely_solves():
    puzzles = read_puzzles(data_file("lichess_puzzles_dev.csv")).puzzles
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
    # Ra8# gives check, Rb7 does not: the record says which, and the split groups it as check-first.
    assert (quiet.records[0].solution_check, quiet.records[0].played_check) == (True, False)
    assert list(quiet.by_solution) == ["check first"] and quiet.played_check_rate.value == 0.0
    assert (other_mate.records[0].played_check, other_mate.played_check_rate.value) == (True, 1.0)

    shared = [p for p in read_puzzles(data_file("lichess_puzzles_dev.csv")).puzzles if p.id == ALT_MATE_ID]
    assert len(shared) == 1 and shared[0].solution[-1].uci() == "f7g7"
    alternative = solve_puzzles(OraclePlayer(shared, deviate={ALT_MATE_ID: {2: "d4g7"}}), shared)
    assert alternative.solve_rate.value == 1.0 and alternative.records[0].played[-1] == "d4g7"


def test_a_wrong_later_move_fails_the_line_but_not_the_first_move():
    puzzles = [p for p in read_puzzles(data_file("lichess_puzzles_dev.csv")).puzzles if len(p.solution) >= 3][:5]
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
        "<1000",
        "<1000",
        "1000-1399",
        "1000-1399",
        "1400-1799",
        "1400-1799",
        "1800-2199",
        "1800-2199",
        ">=2200",
        ">=2200",
    ]
    rows = shared_rows(3)
    csv_rows = [TWO_MATES] + [f"{r['PuzzleId']},{r['FEN']},{r['Moves']},2300,1,1,1,{r['Themes']},," for r in rows]
    puzzles = read_puzzles(write_csv(tmp_path / "buckets.csv", csv_rows)).puzzles
    result = solve_puzzles(OraclePlayer(puzzles), puzzles)
    assert {bucket: m["solve_rate"].n for bucket, m in result.by_rating.items()} == {"<1000": 1, ">=2200": 3}
    assert result.to_json()["by_rating"][">=2200"]["solve_rate"] == {
        "value": 1.0,
        "low": pytest.approx(0.4385, abs=1e-3),
        "high": 1.0,
        "n": 3,
    }


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


@pytest.mark.slow
def test_cli_puzzles_json_with_baseline(cli, tmp_path):
    csv_path = data_file("lichess_puzzles_dev.csv")
    result = cli.run(
        "eval",
        "puzzles",
        "--policy",
        "random",
        "--puzzles",
        str(csv_path),
        "--max-puzzles",
        "60",
        "--json",
        "engine.processes=2",
        "engine.cache=false",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["player"] == "random" and set(report["baselines"]) == {"stockfish"}
    for metrics in (report, report["baselines"]["stockfish"]):
        for key in ("first_move_accuracy", "solve_rate"):
            assert set(metrics[key]) == {"value", "low", "high", "n"} and metrics[key]["n"] == 60
        assert sum(bucket["solve_rate"]["n"] for bucket in metrics["by_rating"].values()) == 60
    assert report["baselines"]["stockfish"]["solve_rate"]["low"] > report["solve_rate"]["high"]
    assert report["puzzles"] == {"source": str(csv_path), "n": 60, "skipped": 0}


@pytest.mark.slow
def test_cli_puzzles_table_without_engine(cli, tmp_path):
    path = write_csv(tmp_path / "two.csv", [TWO_MATES, "BADFEN,not a fen,e2e4 e7e5,1500,1,1,1,,,"])
    result = cli.run(
        "eval", "puzzles", "--policy", "random", "--puzzles", str(path), "baselines=false", "engine.path=/nonexistent"
    )
    assert result.returncode == 0, result.stderr
    assert "puzzles: 1 from" in result.stdout and "(1 malformed rows skipped)" in result.stdout
    assert "solve rate by rating" in result.stdout and "<1000" in result.stdout
    assert "skipped 1 malformed puzzle rows" in result.stderr


def value_head_checkpoint(directory: Path, value_head: bool = True) -> Path:
    import torch

    from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy

    torch.manual_seed(0)
    return save_policy(ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=value_head)), directory)


@pytest.mark.slow
def test_cli_puzzles_with_search_nodes(cli, tmp_path):
    from helpers import SYZYGY_DIR

    checkpoint = value_head_checkpoint(tmp_path / "vh")
    result = cli.run(
        "eval",
        "puzzles",
        "--checkpoint",
        str(checkpoint),
        "--puzzles",
        str(data_file("lichess_puzzles_dev.csv")),
        "--max-puzzles",
        "5",
        "--search-nodes",
        "16",
        "--json",
        "baselines=false",
        f"engine.syzygy_path={SYZYGY_DIR}",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["player"] == f"{checkpoint} (puct 16 nodes)" and report["solve_rate"]["n"] == 5
    assert report["search"]["nodes"] == 16 and report["search"]["algorithm"] == "puct"


@pytest.mark.slow
def test_cli_puzzles_search_without_a_value_head_is_one_clear_error(cli, tmp_path):
    checkpoint = value_head_checkpoint(tmp_path / "plain", value_head=False)
    path = write_csv(tmp_path / "one.csv", [TWO_MATES])
    result = cli.run(
        "eval",
        "puzzles",
        "--checkpoint",
        str(checkpoint),
        "--puzzles",
        str(path),
        "--search-nodes",
        "8",
        "baselines=false",
    )
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"chessgrpo: checkpoint {checkpoint}: search needs a policy with a value head"), line


# ------------------------------------------------------------------------------------------------
# Compressed files (the Lichess database is published as lichess_db_puzzle.csv.zst)


def shared_slice(tmp_path: Path, count: int) -> Path:
    """The header and the first `count` rows of the shared CSV, as a plain file."""
    lines = data_file("lichess_puzzles_dev.csv").read_bytes().splitlines(keepends=True)
    path = tmp_path / "slice.csv"
    path.write_bytes(b"".join(lines[: count + 1]))
    return path


def compressed(path: Path, name: str, codec: str) -> Path:
    import gzip

    import pyarrow as pa

    out = path.with_name(name)
    if codec == "gzip":
        out.write_bytes(gzip.compress(path.read_bytes()))
    else:
        with pa.CompressedOutputStream(str(out), "zstd") as stream:
            stream.write(path.read_bytes())
    return out


def test_zstd_and_gzip_puzzle_files_read_like_the_plain_csv(tmp_path):
    plain = shared_slice(tmp_path, 80)
    files = {
        "zst": compressed(plain, "slice.csv.zst", "zstd"),
        "gz": compressed(plain, "slice.csv.gz", "gzip"),
        "misnamed": compressed(plain, "zstd-named-like-plain.csv", "zstd"),  # detected by its bytes, not its name
    }
    assert files["zst"].read_bytes()[:4] == b"\x28\xb5\x2f\xfd"
    expected = read_puzzles(plain, max_puzzles=30, seed=1).puzzles
    assert len(expected) == 30
    for name, path in files.items():
        got = read_puzzles(path, max_puzzles=30, seed=1).puzzles
        assert [(p.id, p.board.fen(), p.solution, p.themes) for p in got] == [
            (p.id, p.board.fen(), p.solution, p.themes) for p in expected
        ], name


def test_a_truncated_compressed_file_is_one_error_naming_it(cli, tmp_path):
    plain = shared_slice(tmp_path, 200)
    for codec, name in (("zstd", "cut.csv.zst"), ("gzip", "cut.csv.gz")):
        whole = compressed(plain, name, codec)
        whole.write_bytes(whole.read_bytes()[: len(whole.read_bytes()) // 2])
        with pytest.raises(ValueError) as caught:
            read_puzzles(whole)
        message = str(caught.value)
        assert message.startswith(f"{whole}: truncated or corrupt {codec} file") and "\n" not in message, message
    code, out, err = cli.main("eval", "puzzles", "--policy", "random", "--puzzles", str(whole), "baselines=false")
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith(f"chessgrpo: {whole}: truncated or corrupt gzip file"), line


def test_cli_puzzles_from_zst_gives_the_plain_csv_results(cli, tmp_path):
    plain = shared_slice(tmp_path, 60)
    zst = compressed(plain, "slice.csv.zst", "zstd")
    reports = {}
    for path in (plain, zst):
        code, out, err = cli.main(
            "eval",
            "puzzles",
            "--policy",
            "random",
            "--puzzles",
            str(path),
            "--max-puzzles",
            "40",
            "--json",
            "baselines=false",
            f"output={path}.json",
        )
        assert code == 0, err
        reports[path] = json.loads(out)
        assert reports[path].pop("puzzles") == {"source": str(path), "n": 40, "skipped": 0}
    assert reports[plain] == reports[zst]
    records = [json.loads(Path(f"{path}.json").read_text())["records"] for path in (plain, zst)]
    assert records[0] == records[1] and len(records[0]["player"]) == 40


def test_sampling_a_large_file_keeps_row_numbers_and_parses_the_sample_again(tmp_path, monkeypatch):
    import chessgrpo.eval.puzzles as puzzles_module

    rows = shared_slice(tmp_path, 120).read_text().splitlines()
    rows.insert(10, "BADFEN,not a fen,e2e4 e7e5,1500,1,1,1,,,")  # shifts file rows against valid puzzles
    path = tmp_path / "with_bad_row.zst.csv"
    path.write_text("\n".join(rows) + "\n")
    path = compressed(path, "with_bad_row.csv.zst", "zstd")
    in_memory = read_puzzles(path, max_puzzles=25, seed=7)
    monkeypatch.setattr(puzzles_module, "KEEP_PARSED", 10)
    two_pass = read_puzzles(path, max_puzzles=25, seed=7)
    assert [p.id for p in two_pass.puzzles] == [p.id for p in in_memory.puzzles] and len(two_pass.puzzles) == 25
    assert [p.board.fen() for p in two_pass.puzzles] == [p.board.fen() for p in in_memory.puzzles]
    assert two_pass.skipped == in_memory.skipped and [s.puzzle_id for s in two_pass.skipped] == ["BADFEN"]


# ------------------------------------------------------------------------------------------------
# By theme and by rating band


def test_rating_bands_from_edges():
    from chessgrpo.eval.puzzles import DEFAULT_RATING_EDGES, RATING_BUCKETS, rating_bands

    assert rating_bands(DEFAULT_RATING_EDGES) == RATING_BUCKETS
    assert [name for name, _, _ in rating_bands([1200, 1800])] == ["<1200", "1200-1799", ">=1800"]
    for bad in ([], [1800, 1200], [1000, 1000]):
        with pytest.raises(ValueError, match="rating_bands"):
            rating_bands(bad)


def test_by_theme_and_by_rating_band_counts_and_intervals():
    from chessgrpo.eval.puzzles import rating_bands

    puzzles = read_puzzles(data_file("lichess_puzzles_dev.csv")).puzzles
    # Every third puzzle's first move is wrong, so the rates are neither 0 nor 1.
    deviate = {}
    for puzzle in puzzles[::3]:
        wrong = next(m for m in puzzle.board.legal_moves if m != puzzle.solution[0] and not _mates(puzzle.board, m))
        deviate[puzzle.id] = {0: wrong.uci()}
    bands = rating_bands([1200, 1800])
    result = solve_puzzles(OraclePlayer(puzzles, deviate=deviate), puzzles, rating_bands=bands, min_theme_puzzles=25)

    # Rating bands: every puzzle in exactly one, counts sum to the total and match an independent count.
    assert sum(m["solve_rate"].n for m in result.by_rating.values()) == len(puzzles) == 500
    expected_bands = {
        "<1200": [p for p in puzzles if p.rating < 1200],
        "1200-1799": [p for p in puzzles if 1200 <= p.rating < 1800],
        ">=1800": [p for p in puzzles if p.rating >= 1800],
    }
    assert list(result.by_rating) == [name for name, group in expected_bands.items() if group]
    # Themes: exactly the themes carried by >= 25 puzzles, most frequent first.
    counts: dict[str, int] = {}
    for puzzle in puzzles:
        for theme in set(puzzle.themes):
            counts[theme] = counts.get(theme, 0) + 1
    assert set(result.by_theme) == {theme for theme, n in counts.items() if n >= 25} and len(result.by_theme) >= 5
    assert [result.by_theme[t]["solve_rate"].n for t in result.by_theme] == sorted(
        (counts[t] for t in result.by_theme), reverse=True
    )
    expected_themes = {theme: [p for p in puzzles if theme in p.themes] for theme in result.by_theme}

    for groups, table in ((expected_bands, result.by_rating), (expected_themes, result.by_theme)):
        for name, metrics in table.items():
            group = groups[name]
            wrong_first = sum(p.id in deviate for p in group)
            first = metrics["first_move_accuracy"]
            assert first.n == metrics["solve_rate"].n == len(group)
            assert first.value == pytest.approx((len(group) - wrong_first) / len(group))
            assert metrics["solve_rate"].value == pytest.approx(
                (len(group) - wrong_first) / len(group)
            )  # the oracle solves the rest
            for interval in metrics.values():
                assert interval.low <= interval.value <= interval.high and interval.high - interval.low > 0
    assert 0.6 < result.first_move_accuracy.value < 0.7  # unchanged totals: 1 in 3 missed
    payload = result.to_json()
    assert set(payload["by_theme"]) == set(result.by_theme) and payload["min_theme_puzzles"] == 25
    assert set(payload["by_rating"]) == set(result.by_rating)


def test_cli_puzzles_prints_and_writes_the_theme_and_band_table(cli, tmp_path, capsys):
    path = write_csv(tmp_path / "two.csv", [TWO_MATES, TWO_MATES.replace("2MATE", "3MATE").replace(",900,", ",1600,")])
    args = [
        "eval",
        "puzzles",
        "--policy",
        "random",
        "--puzzles",
        str(path),
        "baselines=false",
        "engine.path=/nonexistent",
    ]
    code, out, err = cli.main(*args, "--min-theme-puzzles", "2", "--rating-bands", "1000,1500")
    assert code == 0, err
    assert "solve rate by rating" in out and "by rating band and by theme (themes of >= 2 puzzles)" in out
    table = out.split("by rating band and by theme")[1]
    for group in ("rating <1000", "rating >=1500", "theme mate ", "theme mateIn1"):
        assert group in table, (group, out)
    assert "1000-1499" not in table  # an empty band is left out
    code, out, err = cli.main(*args, "--json", f"output={tmp_path / 'out.json'}")  # default: themes of >= 20 puzzles
    report = json.loads(out)
    assert code == 0 and report["by_theme"] == {} and report["min_theme_puzzles"] == 20
    assert list(report["by_rating"]) == ["<1000", "1400-1799"]
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["config"]["rating_bands"] == [1000, 1400, 1800, 2200]
    assert saved["records"]["player"][0]["themes"] == ["mate", "mateIn1"]
    with pytest.raises(SystemExit):
        cli.main(*args, "--rating-bands", "1500,1000")
    assert "expected increasing integers" in capsys.readouterr().err
    code, _, err = cli.main(*args, "rating_bands=[2000,1000]")
    assert code == 2 and "rating_bands must be one or more strictly increasing integers" in err
