"""Offline move metrics against real Stockfish: ESL, top-1, blunders, position loading, the CLI."""

from __future__ import annotations

import json

import chess
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chessgrpo.board import ACTIONS
from chessgrpo.data.schema import write_shard
from chessgrpo.engine import EnginePool
from chessgrpo.eval import (
    BLUNDER_THRESHOLD,
    LabelledPosition,
    evaluate_offline,
    load_eval_positions,
    move_values,
    score_moves,
)
from chessgrpo.play.players import RandomPlayer, StockfishPlayer

NODES = 500
# White's rook takes the hanging queen (Rxd5); any other move lets Black take the rook (Qxd1+).
WHITE_TAKES_QUEEN = "k7/8/8/3q4/8/8/8/K2R4 w - - 0 1"
# The same for Black to move: Rxd4, else White plays Qxd8+.
BLACK_TAKES_QUEEN = "k2r4/8/8/8/3Q4/8/8/K7 b - - 0 1"
# Both back ranks are weak: the side to move mates with Rxa8# / Rxa1#; a quiet move gets mated or loses the rook.
WHITE_MATES = "r5k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"
BLACK_MATES = "r5k1/5ppp/8/8/8/8/5PPP/R5K1 b - - 0 1"
ITALIAN = "r1bqk1nr/pppp1ppp/2n5/2b1p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4"
QUIET = [
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
    ITALIAN,
    "r1bq1rk1/pp2bppp/2n1pn2/3p4/2PP4/2N1PN2/PP3PPP/R2QKB1R w KQ - 0 8",
    "8/5pk1/6p1/8/3R4/6P1/5PKP/2r5 b - - 0 40",
]
TACTICAL = [WHITE_TAKES_QUEEN, BLACK_TAKES_QUEEN, WHITE_MATES, BLACK_MATES]


@pytest.fixture(scope="module")
def pool():
    with EnginePool(processes=2, nodes=NODES) as engine_pool:
        yield engine_pool


def labelled(pool, fen: str) -> LabelledPosition:
    board = chess.Board(fen)
    return LabelledPosition(board, chess.Move.from_uci(pool.analyse(board, multipv=1, nodes=NODES).best.move))


def all_moves_records(pool, fen: str):
    position = labelled(pool, fen)
    moves = list(position.board.legal_moves)
    records = score_moves(pool, [position] * len(moves), moves, nodes=NODES)
    return position, {record.chosen: record for record in records}


@pytest.mark.parametrize(
    "fen, best, blunder",
    [
        (WHITE_TAKES_QUEEN, "d1d5", "a1b1"),
        (BLACK_TAKES_QUEEN, "d8d4", "a8b8"),  # Black to move: values from Black's point of view
        (WHITE_MATES, "a1a8", "h2h3"),  # missing mate in 1 with a quiet move
        (BLACK_MATES, "a8a1", "h7h6"),
    ],
)
def test_best_move_has_zero_esl_and_a_blunder_more_than_the_threshold(pool, fen, best, blunder):
    position, records = all_moves_records(pool, fen)
    assert position.best_move.uci() == best
    top = records[best]
    assert (top.esl, top.top1, top.blunder, top.v_best) == (0.0, True, False, 1.0)
    bad = records[blunder]
    assert bad.esl > 0.9 and bad.esl > BLUNDER_THRESHOLD and bad.blunder and not bad.top1
    assert bad.v_best == 1.0 and bad.v_chosen == pytest.approx(1.0 - bad.esl)
    assert all(record.esl >= 0.0 for record in records.values())
    assert sum(record.top1 for record in records.values()) == 1
    # Check flags: the chosen move's own, the label's on every record of the position.
    board = chess.Board(fen)
    assert all(r.chosen_check == board.gives_check(chess.Move.from_uci(r.chosen)) for r in records.values())
    assert sum(r.chosen_check for r in records.values()) == sum(board.gives_check(m) for m in board.legal_moves)
    assert {r.best_check for r in records.values()} == {board.gives_check(position.best_move)}
    # En-prise flags: the same estimate the policy's move fact reads, per chosen move and for the label.
    from chessgrpo.board.move_facts import en_prise_actions

    en_prise = {ACTIONS[a] for a in en_prise_actions(board)}
    assert {r.chosen for r in records.values() if r.chosen_en_prise} == en_prise
    assert {r.best_en_prise for r in records.values()} == {best in en_prise}


def test_esl_is_never_negative_and_the_label_is_near_the_top(pool):
    for fen in QUIET:
        position, records = all_moves_records(pool, fen)
        assert all(0.0 <= r.esl <= 1.0 and r.esl == max(r.v_best, r.v_chosen) - r.v_chosen for r in records.values())
        assert records[position.best_move.uci()].esl == 0.0
        # Search noise may put another move above the label, but only by a little.
        assert max(r.v_chosen for r in records.values()) - records[position.best_move.uci()].v_chosen < 0.1
    _, opening = all_moves_records(pool, ITALIAN)
    assert opening["c4f7"].blunder  # Bxf7+?? gives a bishop for a pawn
    assert not opening["e1g1"].blunder  # castling is fine


def test_move_values_are_for_the_mover_and_exact_at_mate(pool):
    white, black = chess.Board(WHITE_MATES), chess.Board(BLACK_MATES)
    mate_white, mate_black = move_values(
        pool, [white, black], [chess.Move.from_uci("a1a8"), chess.Move.from_uci("a8a1")]
    )
    assert (mate_white, mate_black) == (1.0, 1.0)
    with pytest.raises(ValueError, match="illegal move"):
        move_values(pool, [white], [chess.Move.from_uci("a8a1")])


def test_stockfish_baseline_beats_random_on_a_fen_file(pool, tmp_path):
    path = tmp_path / "positions.fen"
    path.write_text("# tactical and quiet positions\n" + "\n".join(TACTICAL + QUIET) + "\n")
    positions = load_eval_positions(path, pool=pool, nodes=NODES)
    assert len(positions) == 8 and [p.fen for p in positions[:4]] == [chess.Board(f).fen() for f in TACTICAL]
    stockfish = evaluate_offline(StockfishPlayer(pool, 50), positions, pool, nodes=NODES, batch_size=3)
    random_result = evaluate_offline(RandomPlayer(0), positions, pool, nodes=NODES, batch_size=3)
    assert stockfish.esl.value < random_result.esl.value - 0.2
    assert stockfish.top1.value > random_result.top1.value
    assert stockfish.blunder_rate.value < random_result.blunder_rate.value
    assert len(stockfish.records) == 8 and stockfish.esl.n == 8
    assert stockfish.top1.value == pytest.approx(sum(r.top1 for r in stockfish.records) / 8)
    assert random_result.esl.low <= random_result.esl.value <= random_result.esl.high
    # Same seed, same moves.
    again = evaluate_offline(RandomPlayer(0), positions, pool, nodes=NODES)
    assert [r.chosen for r in again.records] == [r.chosen for r in random_result.records]


def test_positions_from_epd_pgn_parquet_and_dataset(pool, tmp_path):
    epd = tmp_path / "suite.epd"
    epd.write_text(
        f'{" ".join(WHITE_TAKES_QUEEN.split()[:4])} bm Rxd5; id "q";\n{" ".join(BLACK_TAKES_QUEEN.split()[:4])} bm Rxd4;\n'
    )
    assert [p.best_move.uci() for p in load_eval_positions(epd, pool=pool, nodes=NODES)] == ["d1d5", "d8d4"]

    pgn = tmp_path / "games.pgn"
    pgn.write_text(
        '[Event "a"]\n\n1. e4 e5 2. Nf3 Nc6 3. Bc4 Bc5 4. O-O Nf6 *\n\n'
        '[Event "b"]\n\n1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 *\n\n'
        '[Event "c"]\n\n1. f3 e5 2. g4 Qh4# 0-1\n'
    )
    every = load_eval_positions(pgn, pool=pool, nodes=NODES)
    fens = [p.fen for p in every]
    assert len(fens) == len(set(fens)) == 1 + 8 + 2 + 3  # start once, shared opening once, mate dropped
    assert all(p.board.is_legal(p.best_move) for p in every)
    sample = load_eval_positions(pgn, max_positions=5, seed=1, pool=pool, nodes=NODES)
    assert [p.fen for p in sample] == [
        p.fen for p in load_eval_positions(pgn, max_positions=5, seed=1, pool=pool, nodes=NODES)
    ]
    assert len(sample) == 5 and {p.fen for p in sample} < set(fens)
    assert [p.fen for p in sample] != [p.fen for p in load_eval_positions(pgn, max_positions=5, seed=2, pool=pool)]

    parquet = tmp_path / "labelled.parquet"
    pq.write_table(pa.table({"fen": [WHITE_TAKES_QUEEN, ITALIAN], "best_move": ["d1d5", None]}), parquet)
    from_parquet = load_eval_positions(parquet, pool=pool, nodes=NODES)
    assert from_parquet[0].best_move.uci() == "d1d5" and from_parquet[1].board.is_legal(from_parquet[1].best_move)

    dataset = tmp_path / "dataset"
    write_shard([{"fen": WHITE_TAKES_QUEEN, "best_move": "d1d5"}], dataset / "train" / "shard-00000.parquet")
    write_shard([{"fen": BLACK_TAKES_QUEEN, "best_move": "d8d4"}], dataset / "test" / "shard-00000.parquet")
    [test_position] = load_eval_positions(dataset)  # labelled: no pool needed; test split only
    assert (test_position.fen, test_position.best_move.uci()) == (chess.Board(BLACK_TAKES_QUEEN).fen(), "d8d4")


def test_bad_position_files_give_one_clear_error(tmp_path):
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="garbage.parquet"):
        load_eval_positions(garbage)
    bad_fen = tmp_path / "bad.fen"
    bad_fen.write_text(f"{ITALIAN}\nnot a fen\n")
    with pytest.raises(ValueError, match=r"bad.fen:2"):
        load_eval_positions(bad_fen)
    not_pgn = tmp_path / "junk.pgn"
    not_pgn.write_text("this is not a game\n")
    with pytest.raises(ValueError, match="junk.pgn"):
        load_eval_positions(not_pgn)
    illegal = tmp_path / "illegal.parquet"
    pq.write_table(pa.table({"fen": [ITALIAN], "best_move": ["e1e8"]}), illegal)
    with pytest.raises(ValueError, match="illegal.parquet.*row 0.*illegal move"):
        load_eval_positions(illegal)
    unlabelled = tmp_path / "plain.fen"
    unlabelled.write_text(ITALIAN + "\n")
    with pytest.raises(ValueError, match="no engine pool"):
        load_eval_positions(unlabelled)
    with pytest.raises(ValueError, match="expected a dataset directory"):
        load_eval_positions(_touch(tmp_path / "x.csv"))
    mated = tmp_path / "mated.fen"
    mated.write_text("6k1/5ppp/8/8/8/8/5PPP/r5K1 w - - 0 1\n")  # no legal move: dropped, nothing left
    with pytest.raises(ValueError, match="no position with a legal move"):
        load_eval_positions(mated)


def _touch(path):
    path.write_text("x\n")
    return path


ENGINE_ARGS = (f"nodes={NODES}", "engine.processes=2", "engine.cache=false", "baseline_nodes=50")


@pytest.mark.slow
def test_cli_offline_json_shape(cli, tmp_path):
    path = tmp_path / "positions.fen"
    path.write_text("\n".join(TACTICAL + QUIET) + "\n")
    result = cli.run(
        "eval",
        "offline",
        "--policy",
        "random",
        "--positions",
        str(path),
        "--max-positions",
        "6",
        "--json",
        *ENGINE_ARGS,
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["player"] == "random" and set(report["baselines"]) == {"stockfish"}  # no duplicate random row
    for metrics in (report, report["baselines"]["stockfish"]):
        for key in ("top1", "esl", "blunder_rate"):
            assert set(metrics[key]) == {"value", "low", "high", "n"} and metrics[key]["n"] == 6
            assert 0.0 <= metrics[key]["low"] <= metrics[key]["value"] <= metrics[key]["high"] <= 1.0
    assert report["baselines"]["stockfish"]["esl"]["value"] < report["esl"]["value"]
    assert report["valuation"] == f"nodes={NODES}" and report["positions"]["n"] == 6


@pytest.mark.slow
def test_cli_offline_table_and_errors(cli, tmp_path):
    path = tmp_path / "positions.epd"
    path.write_text("\n".join(TACTICAL) + "\n")
    output = tmp_path / "out" / "offline.json"
    table = cli.run(
        "eval", "offline", "--policy", "stockfish", "--positions", str(path), f"output={output}", *ENGINE_ARGS
    )
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("offline eval: 4 positions") and "top-1 agreement" in lines[1]
    assert lines[2].startswith("stockfish (50 nodes)") and lines[3].startswith("random")
    saved = json.loads(output.read_text())
    assert saved["config"]["nodes"] == NODES and len(saved["records"]["player"]) == 4
    missing = cli.run("eval", "offline", "--policy", "random", "--positions", str(tmp_path / "nope.fen"), *ENGINE_ARGS)
    assert missing.returncode == 2 and "nope.fen" in missing.stderr
    both = cli.run("eval", "offline", "--policy", "random", "--checkpoint", str(tmp_path))
    assert both.returncode == 2 and "not allowed with" in both.stderr


@pytest.mark.slow
def test_policy_player_from_a_checkpoint_through_the_cli(cli, tmp_path):
    import torch

    from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
    from chessgrpo.play.players import PolicyPlayer

    torch.manual_seed(0)
    checkpoint = save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), tmp_path / "ckpt")
    player = PolicyPlayer.from_checkpoint(checkpoint, batch_size=2)
    boards = [chess.Board(fen) for fen in TACTICAL + QUIET]
    moves = player.choose_moves(boards)
    assert all(board.is_legal(move) for board, move in zip(boards, moves))
    assert player.choose_moves(boards) == moves  # argmax: deterministic

    path = tmp_path / "positions.fen"
    path.write_text("\n".join(TACTICAL + QUIET) + "\n")
    result = cli.run(
        "eval",
        "offline",
        "--checkpoint",
        str(checkpoint),
        "--positions",
        str(path),
        "--json",
        "baselines=false",
        *ENGINE_ARGS,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["player"] == str(checkpoint) and report["baselines"] == {} and report["top1"]["n"] == 8
    missing = cli.run("eval", "puzzles", "--checkpoint", str(tmp_path / "none"), "baselines=false")
    assert missing.returncode == 2 and "no checkpoint" in missing.stderr


# --------------------------------------------------------------------------------------------
# A node budget: the policy's search instead of its argmax

BACK_RANK_MATE = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"  # Ra8# (a1a8) is the only mate


def value_head_checkpoint(directory):
    import torch

    from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy

    torch.manual_seed(0)
    return save_policy(ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=True)), directory)


def test_policy_player_with_search_finds_the_mate_an_untrained_policy_misses(tmp_path):
    from chessgrpo.play.players import PolicyPlayer, search_settings

    checkpoint = value_head_checkpoint(tmp_path / "vh")
    player = PolicyPlayer.from_checkpoint(checkpoint, search=search_settings(200))
    try:
        assert player.name == f"{checkpoint} (puct 200 nodes)" and player.search.nodes == 200
        # The rules score the mate exactly, whatever the untrained network thinks.
        assert player.choose_moves([chess.Board(BACK_RANK_MATE)]) == [chess.Move.from_uci("a1a8")]
        boards = [chess.Board(fen) for fen in QUIET[:2]]
        assert all(board.is_legal(move) for board, move in zip(boards, player.choose_moves(boards)))
    finally:
        player.close()
    # Budget 0 is the argmax player, unchanged; sampling and search do not mix.
    assert search_settings(0) is None and PolicyPlayer.from_checkpoint(checkpoint, search=None).name == str(checkpoint)
    with pytest.raises(ValueError, match="search plays deterministically"):
        PolicyPlayer.from_checkpoint(checkpoint, temperature=1.0, search=search_settings(8))
    with pytest.raises(ValueError, match="search_c_puct must be > 0"):
        search_settings(8, c_puct=0.0)


@pytest.mark.slow
def test_cli_offline_with_search_nodes(cli, tmp_path):
    from helpers import SYZYGY_DIR

    checkpoint = value_head_checkpoint(tmp_path / "vh")
    path = tmp_path / "positions.fen"
    path.write_text("\n".join([BACK_RANK_MATE, *TACTICAL[:2]]) + "\n")
    result = cli.run(
        "eval",
        "offline",
        "--checkpoint",
        str(checkpoint),
        "--positions",
        str(path),
        "--search-nodes",
        "16",
        "--json",
        "baselines=false",
        f"engine.syzygy_path={SYZYGY_DIR}",
        *ENGINE_ARGS,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["player"] == f"{checkpoint} (puct 16 nodes)" and report["top1"]["n"] == 3
    assert report["search"]["nodes"] == 16 and report["search"]["algorithm"] == "puct"
    assert report["search"]["syzygy_path"] == str(SYZYGY_DIR)
    baseline = cli.run(
        "eval", "offline", "--policy", "random", "--positions", str(path), "--search-nodes", "8", *ENGINE_ARGS
    )
    assert baseline.returncode == 2 and "only a --checkpoint policy searches" in baseline.stderr
