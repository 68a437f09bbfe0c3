"""`chessgrpo data rookworld`: P: and A: text datasets, generated with the engine pool or imported.

Generation (`generate_rookworld`):

- positions are the ends of seeded uniformly random playouts (1..`max_plies` plies, distinct,
  non-terminal), each with its move history;
- **P:** a multipv-`multipv` analysis at `nodes` of every position (engine pool; the cache is on
  so the GRPO reward and the evaluation later hit it). M = the engine's top moves shuffled with a
  per-position seed, E = their values for the side to move, B = the engine's best move: the first
  multipv line, correct for both colours (the upstream data took the last line for Black);
- **A:** at the same position, a move (the engine's best with probability `engine_move_fraction`,
  a uniformly random legal move otherwise, or with probability `illegal_fraction` a syntactically
  valid illegal move), the history of the last <= 10 moves including it, and the answer from
  python-chess (`data.rookworld_format.environment_step`).

Import (`import_rookworld_text`): lines of an existing RookWorld text file are parsed and
validated; a P: line whose B: is not the best of its own listed evaluations (the upstream Black
defect, `data.rookworld_format.upstream_best_defect`) is flagged, counted and dropped unless
``keep_defective``.

Output directory::

    DIR/manifest.json, DIR/config.yaml
    DIR/train.txt, DIR/test.txt                 one RookWorld line per example
    DIR/train/shard-00000.parquet, DIR/test/... columns of `ROOKWORLD_SCHEMA`

``layout=move_first`` writes the P: answers decision first (``B: <move>``, then M:/E:, or with ``move_only`` the
move alone; `data.rookworld_format`); the manifest records the layout (``policy_layout``).

The split is `data.schema.split_of` of the position, so both tasks of a position land in the same
split, and the same settings give the same files.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import chess
import pyarrow as pa

from chessgrpo.board import random_playout_positions
from chessgrpo.config import save_config, to_dict
from chessgrpo.data import schema
from chessgrpo.data.labelling import DataEngineConfig, require
from chessgrpo.data.rookworld_examples import (  # noqa: F401 -- re-exported: the dataset's example type and builders
    RookWorldExample,
    environment_example,
    environment_move,
    hash_seed,
    illegal_move,
    policy_example,
)
from chessgrpo.data.rookworld_format import (
    FEN_PROMPT,
    MAX_LISTED_MOVES,
    MOVE_FIRST_LAYOUT,
    POLICY_LAYOUTS,
    POLICY_PROMPTS,
    ROOKWORLD_LAYOUT,
    parse_environment_line,
    parse_policy_line,
    policy_layout_of,
    split_environment_line,
    split_policy_line,
    upstream_best_defect,
)
from chessgrpo.data.rookworld_truths import PolicyTruth, mover_pawns
from chessgrpo.errors import InputError
from chessgrpo.files import text_lines, write_text_atomic
from chessgrpo.paths import SYZYGY_DEFAULT, find_data_path

logger = logging.getLogger(__name__)

ROOKWORLD_SCHEMA = pa.schema(
    [
        ("task", pa.string()),  # "policy" | "environment"
        ("prompt", pa.string()),
        ("completion", pa.string()),
        ("fen", pa.string()),  # the position of the prompt
        ("source", pa.string()),  # "random_playout" | "imported"
        ("moves", pa.list_(pa.string())),  # P: engine top moves, best first (imported: by listed E)
        ("pawns", pa.list_(pa.float32())),  # P: their values, side to move's view
        ("defect", pa.bool_()),  # imported P: B: not the best of its listed evaluations
        ("nodes", pa.int32()),  # node limit of the P: analysis (0 = imported / A:)
    ]
)
SPLIT_FILES = {"train": "train.txt", "test": "test.txt"}


@dataclasses.dataclass
class RookWorldDataConfig:
    """`chessgrpo data rookworld`: P:/A: text datasets (see the module docstring)."""

    out: str = ""
    """Output directory (required; `--out`)."""
    positions: int = 2000
    """Distinct positions; each gives one P: and one A: example."""
    nodes: int = 1000
    """Node limit of each multipv analysis (use the same in the GRPO reward: its labels are then cache hits)."""
    multipv: int = 5
    """Engine lines per position (M: holds them)."""
    seed: int = 0
    """Seed of the playouts, the M: shuffles and the A: move choices."""
    test_fraction: float = 0.05
    """Share of positions in the test split (`data.schema.split_of`)."""
    max_plies: int = 80
    """Longest random playout; lengths are uniform in 1..max_plies."""
    engine_move_fraction: float = 0.5
    """A: the engine's best move with this probability, else a random legal move."""
    illegal_fraction: float = 0.05
    """A: share of examples whose move is illegal (answer: FEN unchanged, -1.0, truncated)."""
    endgames: list[str] = dataclasses.field(default_factory=list)
    """Material signatures (e.g. [KQvK, KRvK]): endgame positions with every truth from the Syzygy
    tables instead of engine-analysed playouts (`data.rookworld_endgames`); `positions` train
    positions are split evenly over them, the test split is `eval endgame`'s held-out starts."""
    syzygy_path: str = SYZYGY_DEFAULT
    """Syzygy tables (endgames only)."""
    held_out: int = 200
    """Endgames: held-out start positions per material, the test split (= `chessgrpo eval endgame
    --positions N --seed SEED` with the same colours)."""
    colours: str = "white"
    """Endgames: the strong side's colour: white, black or both."""
    workers: int = 0
    """Endgames: processes probing the tables (0 = one per CPU core)."""
    symmetries: bool = False
    """Endgames: also write each train position's rotations and mirror images (pawnless material: up to 8x
    the train positions at no extra probes; no image of a held-out start is written)."""
    from_text: str | None = None
    """Import this RookWorld text file instead of generating (`--from-text`)."""
    keep_defective: bool = False
    """Import: keep P: lines whose B: is not their best listed move (flagged in column `defect`)."""
    layout: str = ROOKWORLD_LAYOUT
    """How P: answers are written (`data.rookworld_format.POLICY_LAYOUTS`): rookworld = M: E: B: (RookWorld's own);
    move_first = ``B: <move>`` first, then M: and E: as auxiliary text (issue 66). A: lines are the same in both;
    the manifest records it (``policy_layout``, `dataset_policy_layout`). Generation only: an import keeps its lines."""
    move_only: bool = False
    """layout move_first: write ``B: <move>`` alone, without the M:/E: text after it."""
    policy_prompt: str = FEN_PROMPT
    """How P: prompts are written (`data.rookworld_format.POLICY_PROMPTS`): fen = ``P: <FEN>``; legal_moves = the
    FEN and its sorted legal moves, ``P: <FEN>+<moves>+`` (issue 66's second lever; layout move_first only). The
    manifest records it (``policy_prompt``, `dataset_policy_prompt`); SFT gives it to the model it trains."""
    engine: DataEngineConfig = dataclasses.field(default_factory=lambda: DataEngineConfig(cache=True))
    """Stockfish pool (cache on: the same analyses serve the GRPO reward and evaluation)."""

    def validate(self) -> None:
        require(bool(self.out), "out", self.out, "give the output directory with --out DIR (or out=DIR)")
        require(self.positions >= 1, "positions", self.positions, "must be >= 1")
        require(self.nodes >= 1, "nodes", self.nodes, "must be >= 1")
        require(1 <= self.multipv <= MAX_LISTED_MOVES, "multipv", self.multipv, f"must be in 1..{MAX_LISTED_MOVES}")
        require(0.0 <= self.test_fraction < 1.0, "test_fraction", self.test_fraction, "must be in [0, 1)")
        require(self.max_plies >= 1, "max_plies", self.max_plies, "must be >= 1")
        require(
            0.0 <= self.engine_move_fraction <= 1.0,
            "engine_move_fraction",
            self.engine_move_fraction,
            "must be in [0, 1]",
        )
        require(0.0 <= self.illegal_fraction < 1.0, "illegal_fraction", self.illegal_fraction, "must be in [0, 1)")
        require(self.engine.depth is None, "engine.depth", self.engine.depth, "analyses use node limits: set `nodes`")
        require(self.layout in POLICY_LAYOUTS, "layout", self.layout, f"must be one of {', '.join(POLICY_LAYOUTS)}")
        require(
            not self.move_only or self.layout == MOVE_FIRST_LAYOUT,
            "move_only",
            self.move_only,
            f"applies to layout={MOVE_FIRST_LAYOUT} only",
        )
        require(
            self.policy_prompt in POLICY_PROMPTS,
            "policy_prompt",
            self.policy_prompt,
            f"must be one of {', '.join(POLICY_PROMPTS)}",
        )
        require(
            self.policy_prompt == FEN_PROMPT or self.layout == MOVE_FIRST_LAYOUT,
            "policy_prompt",
            self.policy_prompt,
            f"a prompt that lists the legal moves needs layout={MOVE_FIRST_LAYOUT}",
        )
        require(
            not self.from_text or (self.layout == ROOKWORLD_LAYOUT and not self.move_only),
            "layout",
            self.layout,
            "applies to generated data; an import (from_text) keeps its lines as written",
        )
        if self.endgames:
            from chessgrpo.board.endgames import COLOURS, Material

            for name in self.endgames:
                try:
                    Material.parse(name)
                except ValueError as error:
                    require(False, "endgames", self.endgames, str(error))
            require(not self.from_text, "from_text", self.from_text, "give either endgames or from_text, not both")
            require(self.colours in COLOURS, "colours", self.colours, f"must be one of {', '.join(COLOURS)}")
            require(self.held_out >= 0, "held_out", self.held_out, "must be >= 0")
            require(self.workers >= 0, "workers", self.workers, "must be >= 0 (0 = one per CPU core)")
        else:
            require(not self.symmetries, "symmetries", self.symmetries, "applies to endgames only (set endgames=[...])")


@dataclasses.dataclass
class RookWorldSummary:
    directory: Path
    counts: dict[str, dict[str, int]]
    """split -> task -> examples."""
    defects: int
    dropped: int
    seconds: float
    already_complete: bool = False
    """The output directory already held this dataset (same settings): nothing was written."""


# ------------------------------------------------------------------------------------------------
# Generation


def _playouts(count: int, seed: int, max_plies: int) -> list[chess.Board]:
    """`count` distinct non-terminal random-playout positions, with their move stacks."""
    return random_playout_positions(count, seed=seed, max_plies=max_plies, keep_history=True)


def generate_examples(
    config: RookWorldDataConfig, pool: Any, progress: Callable[[int], None] | None = None
) -> list[RookWorldExample]:
    """The P: and A: examples of `config` (pure function of the config and the engine)."""
    boards = _playouts(config.positions, config.seed, config.max_plies)
    examples: list[RookWorldExample] = []
    chunk = 256
    for start in range(0, len(boards), chunk):
        part = boards[start : start + chunk]
        analyses = pool.analyse_many(part, multipv=config.multipv, nodes=config.nodes)
        for board, analysis in zip(part, analyses):
            fen = board.fen()
            truth = PolicyTruth(
                fen=fen,
                moves=tuple(line.move for line in analysis.lines),
                pawns=tuple(mover_pawns(line.cp, line.mate) for line in analysis.lines),
                legal=frozenset(m.uci() for m in board.legal_moves),
            )
            if not truth.moves:
                raise RuntimeError(f"the engine returned no line for {fen!r}")
            examples.append(
                policy_example(
                    truth,
                    config.seed,
                    config.nodes,
                    layout=config.layout,
                    move_only=config.move_only,
                    prompt=config.policy_prompt,
                )
            )
            move = environment_move(
                board,
                truth,
                seed=config.seed,
                illegal_fraction=config.illegal_fraction,
                engine_move_fraction=config.engine_move_fraction,
            )
            examples.append(environment_example(board, move))
        if progress is not None:
            progress(len(part))
    return examples


# ------------------------------------------------------------------------------------------------
# Import


def read_rookworld_text(
    path: str | os.PathLike, *, keep_defective: bool = False
) -> tuple[list[RookWorldExample], int, int]:
    """(examples, defective P: lines seen, lines dropped) of a RookWorld text file.

    Blank lines and lines starting with '#' are skipped; any other line that is not a valid P:
    or A: line raises `ValueError` naming its line number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"RookWorld text file {str(path)!r} does not exist")
    examples = []
    defects = dropped = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(text_lines(handle, path), start=1):  # a stray byte: ValueError naming its line
            line = raw.rstrip("\r\n")
            if not line.strip() or line.startswith("#"):
                continue
            try:
                if line.startswith("P:"):
                    fen, answer = parse_policy_line(line)
                    prompt, completion = split_policy_line(line)
                    defect = upstream_best_defect(answer)
                    defects += defect
                    if defect and not keep_defective:
                        dropped += 1
                        continue
                    ranked = sorted(zip(answer.evals, answer.moves), key=lambda pair: -pair[0])
                    examples.append(
                        RookWorldExample(
                            "policy",
                            prompt,
                            completion,
                            fen,
                            "imported",
                            moves=tuple(m for _, m in ranked),
                            pawns=tuple(v for v, _ in ranked),
                            defect=defect,
                        )
                    )
                elif line.startswith("A:"):
                    query, _ = parse_environment_line(line)
                    prompt, completion = split_environment_line(line)
                    examples.append(RookWorldExample("environment", prompt, completion, query.fen, "imported"))
                else:
                    raise InputError("starts with neither 'P:' nor 'A:'")
            except ValueError as error:
                raise InputError(f"{path}:{number}: {error}") from None
    return examples, defects, dropped


# ------------------------------------------------------------------------------------------------
# Writing and reading


def write_examples(
    directory: Path, examples: Iterable[RookWorldExample], test_fraction: float
) -> dict[str, dict[str, int]]:
    """Text files and one Parquet shard per split (atomic writes); returns split -> task -> count.

    The split is `schema.split_of` of the position, except for endgame examples, which carry theirs
    (the held-out starts of `eval endgame` are the test split: `data.rookworld_endgames`)."""
    from chessgrpo.data.rookworld_endgames import example_split

    by_split: dict[str, list[RookWorldExample]] = {split: [] for split in schema.SPLITS}
    for example in examples:
        by_split[example_split(example) or schema.split_of(example.fen, test_fraction)].append(example)
    counts = {}
    for split, rows in by_split.items():
        (directory / split).mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist([r.row() for r in rows], schema=ROOKWORLD_SCHEMA)
        schema.write_parquet(table, directory / split / "shard-00000.parquet")
        write_text_atomic(directory / SPLIT_FILES[split], "".join(r.line + "\n" for r in rows))
        counts[split] = {task: sum(r.task == task for r in rows) for task in ("policy", "environment")}
    return counts


def read_rookworld(directory: str | os.PathLike, split: str, *, task: str | None = None) -> list[RookWorldExample]:
    """The examples of one split of a `data rookworld` directory (optionally one task)."""
    directory = find_data_path(directory) or Path(directory)  # a relative path, from any current directory
    paths = sorted((directory / split).glob("shard-*.parquet"))
    if not paths:
        raise FileNotFoundError(
            f"no RookWorld Parquet shards for split {split!r} under {str(directory)!r} (make them with `chessgrpo data rookworld`)"
        )
    checksums = schema.read_manifest(directory).get("shard_sha256", {})
    examples = []
    for path in paths:
        schema.verify_shard(directory, path, checksums)
        table = schema.read_parquet(path, ROOKWORLD_SCHEMA.names, what="RookWorld shard")  # errors name the file
        for row in table.to_pylist():
            if task is not None and row["task"] != task:
                continue
            examples.append(
                RookWorldExample(
                    row["task"],
                    row["prompt"],
                    row["completion"],
                    row["fen"],
                    row["source"],
                    tuple(row["moves"] or ()),
                    tuple(row["pawns"] or ()),
                    bool(row["defect"]),
                    int(row["nodes"] or 0),
                )
            )
    return examples


def written_policy_layout(examples: Iterable[RookWorldExample]) -> str | None:
    """The layout the P: lines of `examples` are written in (`POLICY_LAYOUTS`), "mixed" when they differ,
    None without P: lines."""
    layouts = {policy_layout_of(e.completion) or "unknown" for e in examples if e.task == "policy"}
    if not layouts:
        return None
    return layouts.pop() if len(layouts) == 1 else "mixed"


def dataset_policy_prompt(directory: str | os.PathLike) -> str | None:
    """The P: prompt style a `data rookworld` directory records in its manifest (``policy_prompt``,
    `data.rookworld_format.POLICY_PROMPTS`): a dataset made before the key existed is ``fen``; None without a
    `data rookworld` manifest."""
    directory = find_data_path(directory) or Path(directory)
    manifest = schema.read_manifest(directory)
    if manifest.get("command") != "rookworld":
        return None
    return str(manifest.get("policy_prompt", FEN_PROMPT))


def dataset_policy_layout(directory: str | os.PathLike) -> str | None:
    """The P: layout a `data rookworld` directory records in its manifest (``policy_layout``): a dataset made
    before the key existed is ``rookworld`` (the only layout then); None without a manifest or P: lines."""
    directory = find_data_path(directory) or Path(directory)
    manifest = schema.read_manifest(directory)
    if manifest.get("command") != "rookworld":
        return None
    return manifest.get("policy_layout", ROOKWORLD_LAYOUT)


def _existing_dataset(directory: Path, config: RookWorldDataConfig) -> RookWorldSummary | None:
    """The summary of a complete dataset in `directory` made with exactly `config`'s settings, else None.

    The manifest is written last and the directory renamed into place after it, so a manifest
    means every file is there."""
    try:
        manifest = schema.read_manifest(directory)
    except ValueError:  # not JSON: not ours
        return None
    settings = manifest.get("settings")
    if isinstance(settings, dict):  # a dataset made before `layout` existed was made with the defaults
        settings = {"layout": ROOKWORLD_LAYOUT, "move_only": False, "policy_prompt": FEN_PROMPT, **settings}
    if manifest.get("command") != "rookworld" or settings != to_dict(config):
        return None
    return RookWorldSummary(
        directory,
        manifest["counts"],
        manifest.get("defects", 0),
        manifest.get("dropped_defective", 0),
        0.0,
        already_complete=True,
    )


def partial_directory(directory: Path) -> Path:
    """A new hidden sibling of `directory` to write into before the final rename (named by our pid)."""
    partial = directory.parent / f".{directory.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


def remove_abandoned_partials(directory: Path) -> None:
    """Delete the hidden partial directories of killed runs for `directory` (their process is gone)."""
    for partial in directory.parent.glob(f".{directory.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _process_alive(int(pid)):
            logger.info("removing %s left by a killed run", partial)
            shutil.rmtree(partial, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_rookworld_data(config: RookWorldDataConfig, progress: Callable[[int], None] | None = None) -> RookWorldSummary:
    """Generate or import a dataset into config.out (refuses a non-empty directory)."""
    config.validate()
    directory = Path(config.out)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        done = _existing_dataset(directory, config)
        if done is not None:  # the same command again (e.g. after a kill between the rename and the exit)
            return done
        raise InputError(
            f"output directory {str(directory)!r} exists and is not empty (and holds no dataset made with these settings); choose a new one"
        )
    remove_abandoned_partials(directory)
    started = time.perf_counter()
    defects = dropped = 0
    engine_name = None
    if config.from_text:
        examples, defects, dropped = read_rookworld_text(config.from_text, keep_defective=config.keep_defective)
        if progress is not None:
            progress(len(examples))
    elif config.endgames:
        from chessgrpo.data.rookworld_endgames import generate_endgame_examples

        examples = generate_endgame_examples(config, progress)
        engine_name = "syzygy"
    else:
        from chessgrpo.engine import EnginePool

        engine = dataclasses.replace(config.engine, nodes=config.nodes, depth=None)
        with EnginePool.from_config(engine) as pool:
            examples = generate_examples(config, pool, progress)
            engine_name = pool.engine_name
    # Everything is written into a hidden sibling and renamed into place last, so a killed run leaves
    # no half-written dataset behind and rerunning the same command simply starts again.
    partial = partial_directory(directory)
    try:
        counts = write_examples(partial, examples, config.test_fraction)
        save_config(config, partial / "config.yaml")
        schema.write_manifest(
            partial,
            {
                "command": "rookworld",
                "settings": to_dict(config),
                "engine": engine_name,
                "counts": counts,
                "defects": defects,
                "dropped_defective": dropped,
                "policy_layout": written_policy_layout(examples),
                "policy_prompt": config.policy_prompt,
                "shard_sha256": schema.shard_checksums(partial),
            },
        )
        if directory.is_dir():
            directory.rmdir()  # empty (checked above); os.replace needs the name free or an empty dir
        os.replace(partial, directory)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return RookWorldSummary(directory, counts, defects, dropped, time.perf_counter() - started)
