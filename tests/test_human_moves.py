"""Human moves from real games: `data import-pgn` keeps the move played, the ratings, the ``[%eval]``
and ``[%clk]`` annotations and the headers of each position (checked ply by ply against hand-written
values), datasets written before those columns still read and pretrain, and ``objective: human``
learns the players' moves (with a rating band that keeps exactly the rows it should). Real PGN files,
the real Stockfish at tiny node limits, real tiny models.

Cross-cutting: data/pgn_import.py (the import), train/dataset.py (human moves, old datasets) and
tasks/kinds/pretrain.py (`objective: human`) on train/loop.py.
"""

from __future__ import annotations

import io
import shutil

import chess
import chess.engine
import chess.pgn
import pyarrow.parquet as pq
import pytest

from chessgrpo import cli
from chessgrpo.board import random_playout_positions
from chessgrpo.config import ConfigError, RunConfig, from_dict
from chessgrpo.data import schema
from chessgrpo.data.pgn_import import ImportPgnConfig, import_pgn, mainline_positions
from chessgrpo.engine import EnginePool
from chessgrpo.tasks.kinds.pretrain import PretrainKind, PretrainTrainConfig
from chessgrpo.train.dataset import HumanMoves, NoRowsLeft, load_split
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics

NODES = 30
OLD_COLUMNS = (
    "fen",
    "source",
    "best_move",
    "best_action",
    "moves",
    "win_probs",
    "value",
    "legal_moves",
    "legal_win_probs",
    "nodes",
)
GAME_KEYS = (
    "ply",
    "human_move",
    "mover_rating",
    "opponent_rating",
    "pgn_eval_cp",
    "pgn_eval_mate",
    "mover_clock",
    "result",
    "time_control",
)


@pytest.fixture(scope="module")
def pool():
    with EnginePool(processes=1, nodes=NODES) as engine_pool:
        yield engine_pool


# ------------------------------------------------------------------------------------------------
# The annotated games


def white_pov(score: chess.engine.Score) -> chess.engine.PovScore:
    return chess.engine.PovScore(score, chess.WHITE)


# (move, %eval after it from White's point of view or None, %clk after it or None)
RUY_LOPEZ = [
    ("e2e4", chess.engine.Cp(30), 179.5),
    ("e7e5", chess.engine.Cp(25), 178.0),
    ("g1f3", chess.engine.Mate(5), 175.25),
    ("b8c6", chess.engine.Cp(-15), 170.0),
    ("f1b5", None, None),
    ("a7a6", chess.engine.Mate(-2), 160.0),
    ("b5a4", chess.engine.Cp(40), 150.5),
    ("g8f6", chess.engine.Cp(-100), 140.0),
]
# Expected game columns per ply, written out by hand (side to move's point of view, the mover's own
# previous clock): ply, human_move, mover_rating, opponent_rating, pgn_eval_cp, pgn_eval_mate, mover_clock.
RUY_LOPEZ_ROWS = [
    (0, "e2e4", 1834, 2012, 20, None, None),  # the eval before move 1 (the game comment)
    (1, "e7e5", 2012, 1834, -30, None, None),  # Black to move: White's +0.30 is -30 for Black
    (2, "g1f3", 1834, 2012, 25, None, 179.5),  # White's clock after 1. e4
    (3, "b8c6", 2012, 1834, None, -5, 178.0),  # White mates in 5 = Black is mated in 5
    (4, "f1b5", 1834, 2012, -15, None, 175.25),
    (5, "a7a6", 2012, 1834, None, None, 170.0),  # 3. Bb5 has no comment
    (6, "b5a4", 1834, 2012, None, -2, None),  # White's previous move (3. Bb5) had no clock
    (7, "g8f6", 2012, 1834, -40, None, 160.0),
    (8, None, 1834, 2012, -100, None, 150.5),  # the game's last position: no move was played
]
# A game as Lichess writes them (hand-typed): unrated White, no TimeControl header.
LICHESS_STYLE = """[Event "Rated Bullet game"]
[Site "https://lichess.org/abcdefgh"]
[White "anon"]
[Black "someone"]
[Result "1-0"]
[WhiteElo "?"]
[BlackElo "1650"]

1. d4 { [%eval 0.1] [%clk 0:01:00] } 1... d5 { [%eval 0.12] [%clk 0:00:59] } 2. c4 { [%eval #-3] [%clk 0:00:58.5] } 2... dxc4 { [%clk 0:00:57] } 1-0
"""
LICHESS_ROWS = [  # plies 1..4 (ply 0 is the start position, stored with the first game's columns)
    (1, "d7d5", 1650, None, -10, None, None),
    (2, "c2c4", None, 1650, 12, None, 60.0),
    (3, "d5c4", 1650, None, None, 3, 59.0),  # White's "#-3": Black mates in 3
    (4, None, None, 1650, None, None, 58.5),
]


def ruy_lopez_pgn() -> str:
    game = chess.pgn.Game()
    game.headers.update(White="W", Black="B", WhiteElo="1834", BlackElo="2012", TimeControl="180+2", Result="0-1")
    game.set_eval(white_pov(chess.engine.Cp(20)))
    node = game
    for move, score, clock in RUY_LOPEZ:
        node = node.add_variation(chess.Move.from_uci(move))
        if score is not None:
            node.set_eval(white_pov(score))
        if clock is not None:
            node.set_clock(clock)
    return str(game) + "\n"


def test_import_keeps_the_human_move_ratings_eval_and_clock_of_each_position(pool, tmp_path):
    text = ruy_lopez_pgn()
    assert "[%eval 0.30]" in text and "[%clk 0:02:59.5]" in text and "[%eval #5]" in text  # real annotations
    pgn = tmp_path / "games.pgn"
    pgn.write_text(text + "\n" + LICHESS_STYLE)
    summary = import_pgn(
        ImportPgnConfig(pgn=str(pgn), out=str(tmp_path / "out"), nodes=NODES, multipv=2, positions_per_game=None),
        pool=pool,
    )
    assert summary.games.games_used == 2 and summary.total == 9 + 4  # every ply; the start position once
    rows = {schema.position_key(row["fen"]): row for row in schema.read_positions(tmp_path / "out").to_pylist()}

    def check(game_text: str, expected: list[tuple], result: str, time_control: str | None) -> None:
        game = chess.pgn.read_game(io.StringIO(game_text))
        boards = [game.board()] + [node.board() for node in game.mainline()]
        for ply, human_move, mover, opponent, cp, mate, clock in expected:
            row = rows[schema.position_key(boards[ply].fen())]
            got = tuple(row[key] for key in GAME_KEYS)
            assert got == (ply, human_move, mover, opponent, cp, mate, clock, result, time_control), (ply, got)
            assert row["source"] == "pgn" and row["best_move"] == row["moves"][0]  # still engine-labelled
            if human_move is not None:
                assert chess.Move.from_uci(human_move) in boards[ply].legal_moves

    check(text, RUY_LOPEZ_ROWS, "0-1", "180+2")
    check(LICHESS_STYLE, LICHESS_ROWS, "1-0", None)
    assert schema.read_manifest(tmp_path / "out")["game_columns"] is True
    # The same values straight from the parser, without the engine (every ply, terminal ones included).
    infos = [info for _, info in mainline_positions(chess.pgn.read_game(io.StringIO(text)))]
    assert [(i["ply"], i["human_move"], i["mover_clock"]) for i in infos] == [
        (r[0], r[1], r[6]) for r in RUY_LOPEZ_ROWS
    ]


def test_generated_rows_have_null_game_columns(pool, tmp_path):
    from chessgrpo.data.labelling import LabelSettings, label_boards

    rows = label_boards(
        pool, random_playout_positions(3, seed=2), "random_playout", LabelSettings(nodes=NODES, multipv=1)
    )
    schema.write_shard(rows, tmp_path / "train" / "shard-00000.parquet")
    for row in schema.read_positions(tmp_path, "train").to_pylist():
        assert all(row[key] is None for key in GAME_KEYS)


# ------------------------------------------------------------------------------------------------
# A dataset of consistent, learnable human moves


def rule_move(board: chess.Board) -> chess.Move:
    """The 'human' habit of the learning test: the legal move to the lowest square (a1 = 0), ties by origin."""
    return min(board.legal_moves, key=lambda move: (move.to_square, move.from_square, -(move.promotion or 0)))


def rating(game: int, color: chess.Color) -> int | None:
    if color == chess.BLACK and game % 7 == 0:
        return None  # BlackElo "?"
    return (1200 if color == chess.WHITE else 1250) + 100 * (game % 8)


def habit_pgn(games: int) -> str:
    """`games` games, each from a distinct random position (FEN header) with two moves by `rule_move`."""
    texts = []
    for index, board in enumerate(random_playout_positions(games, seed=5, max_plies=30)):
        game = chess.pgn.Game.from_board(board)
        for color, key in ((chess.WHITE, "WhiteElo"), (chess.BLACK, "BlackElo")):
            value = rating(index, color)
            game.headers[key] = "?" if value is None else str(value)
        game.headers["TimeControl"] = "60+0"
        node, board = game, board.copy()
        for _ in range(2):
            if board.is_game_over():
                break
            move = rule_move(board)
            node = node.add_variation(move)
            board.push(move)
        texts.append(str(game))
    return "\n\n".join(texts) + "\n"


@pytest.fixture(scope="module")
def habit_dataset(pool, tmp_path_factory):
    directory = tmp_path_factory.mktemp("habit")
    (directory / "games.pgn").write_text(habit_pgn(160))
    config = ImportPgnConfig(
        pgn=str(directory / "games.pgn"),
        out=str(directory / "data"),
        nodes=NODES,
        multipv=1,
        positions_per_game=None,
        test_fraction=0.25,
    )
    summary = import_pgn(config, pool=pool)
    assert summary.games.games_used == 160 and summary.counts["splits"]["test"] >= 60
    return directory / "data"


def _config(data, tmp_path, name="run", **overrides) -> PretrainTrainConfig:
    values = dict(
        data=str(data),
        objective="human",
        batch_size=64,
        steps=30,
        lr=3e-3,
        warmup_steps=3,
        log_every=5,
        eval_every=15,
        eval_at_start=True,
        checkpoint_every=0,
        threads=1,
    )
    values.update(overrides)
    return PretrainTrainConfig(run=RunConfig(name=name, out_dir=str(tmp_path)), **values)


@pytest.mark.slow
def test_human_objective_learns_the_players_moves(habit_dataset, tmp_path):
    table = schema.read_positions(habit_dataset, "test", ["fen", "human_move"]).to_pylist()
    with_move = [row for row in table if row["human_move"] is not None]
    assert 0 < len(with_move) < len(table)  # the games' last positions have none: skipped
    assert all(rule_move(chess.Board(row["fen"])).uci() == row["human_move"] for row in with_move)
    with Trainer(_config(habit_dataset, tmp_path)) as trainer:
        assert isinstance(trainer.kind, PretrainKind) and len(trainer.kind.test_data) == len(with_move)
        result = trainer.train()
        summary = trainer.kind.summary()
    rows = {row["step"]: row for row in read_metrics(tmp_path / "run" / "metrics.jsonl")}
    start, end = rows[0], rows[30]
    assert start["eval/human_top1"] < 0.15 and end["eval/human_top1"] > start["eval/human_top1"] + 0.4
    assert end["eval/human_nll"] < 0.6 * start["eval/human_nll"]
    for row in (start, rows[15], end):  # the engine metrics too, on the same rows; eval/loss is the objective
        assert {"eval/top1", "eval/top5", "eval/nll", "eval/in_multipv", "eval/human_top5"} <= set(row)
        assert row["eval/loss"] == row["eval/human_nll"]
    assert "train/human_top1" in rows[30] and rows[30]["loss/train"] < rows[5]["loss/train"]
    assert result.finished and result.eval_metrics["eval/human_top1"] == end["eval/human_top1"]
    best = min((15, 30), key=lambda step: rows[step]["eval/human_nll"])  # checkpoints/best follows eval/human_nll
    assert result.best_checkpoint is not None and result.best_checkpoint.name == f"step_{best:06d}"
    assert summary[0].startswith("human (any rating) on") and "human-move top-1" in summary[1]


def test_rating_band_keeps_exactly_the_rows_inside_it(habit_dataset, tmp_path):
    table = schema.read_positions(habit_dataset, None, ["human_move", "mover_rating", "fen"]).to_pylist()
    moves = [row for row in table if row["human_move"] is not None]
    # The stored ratings are the headers of the game the position came from.
    by_position = {}
    for index, board in enumerate(random_playout_positions(160, seed=5, max_plies=30)):
        by_position[schema.position_key(board.fen())] = rating(index, board.turn)
        board.push(rule_move(board))
        by_position[schema.position_key(board.fen())] = rating(index, board.turn)
    assert all(row["mover_rating"] == by_position[schema.position_key(row["fen"])] for row in moves)
    unrated = sum(row["mover_rating"] is None for row in moves)
    assert unrated > 10  # Black's rows of every seventh game

    def loaded(human: HumanMoves) -> int:
        return sum(len(load_split(habit_dataset, split, human=human)) for split in schema.SPLITS)

    def expected(low: int | None, high: int | None) -> int:
        return sum(
            row["mover_rating"] is not None
            and (low is None or row["mover_rating"] >= low)
            and (high is None or row["mover_rating"] <= high)
            for row in moves
        )

    assert loaded(HumanMoves()) == len(moves)  # no bound: every row with a human move, unrated ones too
    for low, high in ((1400, 1700), (1650, None), (None, 1349), (1550, 1550)):
        count = expected(low, high)
        assert 0 < count < len(moves) - unrated and loaded(HumanMoves(low, high)) == count, (low, high)
    # By hand for one band: 1400..1700 keeps White's 1400/1500/1600/1700 and Black's 1450/1550/1650.
    in_band = {1400, 1500, 1600, 1700, 1450, 1550, 1650}
    assert expected(1400, 1700) == sum(row["mover_rating"] in in_band for row in moves)
    # Through the kind: both splits filtered the same way.
    with Trainer(_config(habit_dataset, tmp_path, human_min_rating=1400, human_max_rating=1700)) as trainer:
        assert len(trainer.kind.train_data) + len(trainer.kind.test_data) == expected(1400, 1700)
        assert "1400 <= mover_rating <= 1700" in trainer.kind.summary()[0]
    with pytest.raises(NoRowsLeft, match="0 of those with 9000 <= mover_rating"):
        load_split(habit_dataset, "train", human=HumanMoves(9000, None))


def test_an_illegal_human_move_is_an_error_naming_the_row(habit_dataset, tmp_path):
    rows = [row for row in schema.read_positions(habit_dataset, "test").to_pylist() if row["human_move"] is not None][
        :3
    ]
    board = chess.Board(rows[2]["fen"])
    rows[2]["human_move"] = next(
        move for move in ("e2e4", "e7e5", "a1a8", "h8h1") if chess.Move.from_uci(move) not in board.legal_moves
    )
    schema.write_shard(rows, tmp_path / "bad" / "test" / "shard-00000.parquet")
    assert len(load_split(tmp_path / "bad", "test")) == 3  # the engine labels alone are fine
    with pytest.raises(ValueError, match=rf"row 2 .*human_move '{rows[2]['human_move']}' is not legal there"):
        load_split(tmp_path / "bad", "test", human=HumanMoves())


def test_pretrain_config_checks_the_human_keys(habit_dataset, tmp_path):
    def make(**values):
        return from_dict(PretrainTrainConfig, {"data": str(habit_dataset), **values})

    assert make(objective="human", human_min_rating=1000, human_max_rating=1000).human_moves == HumanMoves(1000, 1000)
    assert make(objective="bc").human_moves is None and make(objective="human").best_metric() == (
        "eval/human_nll",
        "min",
    )
    cases = [
        (dict(objective="maia"), "objective"),
        (
            dict(objective="bc", human_min_rating=1500),
            "human_min_rating filters the human moves: it needs objective: human",
        ),
        (dict(objective="human", human_max_rating=-1), "human_max_rating must be an integer rating >= 0"),
        (dict(objective="human", human_min_rating=1600, human_max_rating=1500), "rating band is empty"),
        (dict(objective="human", human_min_rating="high"), "human_min_rating"),
        (dict(objective="human", human_min_elo=1500), "human_min_elo"),
    ]
    for values, message in cases:
        with pytest.raises(ConfigError, match=message):
            make(**values)


# ------------------------------------------------------------------------------------------------
# Datasets written before the game columns


def test_an_old_dataset_without_the_game_columns_reads_and_pretrains(habit_dataset, tmp_path, capsys, caplog):
    old = tmp_path / "old"
    shutil.copytree(habit_dataset, old)
    for path in schema.shard_paths(old):  # as the import wrote them before: the first ten columns only
        schema.write_parquet(pq.read_table(path).select(list(OLD_COLUMNS)), path)
    manifest = schema.read_manifest(old)
    manifest.pop("game_columns")
    schema.write_manifest(old, {**manifest, "shard_sha256": schema.shard_checksums(old)})
    assert pq.read_schema(schema.shard_paths(old)[0]).names == list(OLD_COLUMNS)

    everything = schema.read_positions(old)  # all columns
    assert everything.schema == schema.POSITION_SCHEMA and everything.num_rows == schema.read_manifest(old)["positions"]
    assert all(everything.column(key).null_count == everything.num_rows for key in GAME_KEYS)
    named = schema.read_positions(old, "train", ["fen", "best_move", "human_move"])
    assert (
        named.column_names == ["fen", "best_move", "human_move"]
        and named.column("human_move").null_count == named.num_rows
    )
    assert len(load_split(old, "train")) == len(named)

    with Trainer(
        _config(old, tmp_path, name="bc", objective="bc", steps=3, eval_every=3, eval_at_start=False)
    ) as trainer:
        result = trainer.train()
    assert result.finished and result.eval_metrics["eval/top1"] >= 0.0
    # Resuming its import says that the rows so far have no game columns.
    config = ImportPgnConfig(
        pgn=str(habit_dataset.parent / "games.pgn"),
        out=str(old),
        nodes=NODES,
        multipv=1,
        positions_per_game=None,
        test_fraction=0.25,
    )
    with caplog.at_level("WARNING"):
        assert import_pgn(config).already_complete
    assert "before imports kept the game columns" in caplog.text
    # Human imitation on it is one clear error (no human moves to imitate), not a crash.
    code = cli.main(
        [
            "pretrain",
            f"data={old}",
            f"run.out_dir={tmp_path}",
            "run.name=human",
            "objective=human",
            "steps=1",
            "threads=1",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "no row to imitate" in err and "import-pgn" in err
