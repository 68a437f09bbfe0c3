"""Labelled positions in memory as tensors, and the exactly-resumable batch sampler.

`load_split` reads one split of a dataset directory (`chessgrpo.data.schema`) once and keeps:

- ``tokens``      uint8 [N, 77]      `encode_fens` of the FENs
- ``legal_bits``  uint8 [N, 246]     legal-move masks packed 8 per byte (1968 / 8); a batch is
                                     unpacked on demand, so 10^6 positions take 246 MB, not 2 GB
- ``best_action`` int64 [N]          the engine's best move (behaviour-cloning target)
- ``actions``     int64 [N, M]       the multipv moves as action indices, -1 padded
- ``win_probs``   float32 [N, M]     win probability (side to move) after each of those moves
- ``facts``       (only with ``move_facts=True``) each position's non-zero move facts
                  (`board.move_facts`), sparse: a batch's inputs are then the 77 tokens followed by
                  one fact byte per action, as `ActionPolicy.inputs` builds them
- ``human_action`` (only with ``human=HumanMoves(...)``) int64 [N]: the move a player made in the
                  game (the ``human_move`` column of `data import-pgn`), the human-imitation target.
                  Only rows with a human move whose mover's rating is inside the band are loaded
                  (`HumanMoves`); `load_split` logs how many rows each condition removed.

Every label is checked on load: the best move must equal ``moves[0]`` and every listed move must
be legal in its position (the human move too), so a mislabelled row (a move from another position, a flipped
perspective) fails loudly instead of training silently on garbage.

`EpochSampler` draws batches from a seeded permutation per epoch; its state is (epoch, offset),
which the checkpoint stores, so a resumed run sees exactly the batches a straight run would.
`BatchPrefetcher` builds a sampler's next batches ahead in a background thread (pretraining's
``prefetch_batches``), in the same order, so a GPU does not wait for the host between steps.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Generic, TypeVar

import chess
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from chessgrpo.board import NUM_ACTIONS, encode_fens, legal_masks, move_to_action
from chessgrpo.board.move_facts import move_facts
from chessgrpo.data.schema import Split, read_positions, shard_paths
from chessgrpo.errors import InputError, quote
from chessgrpo.paths import find_data_path, places_looked

logger = logging.getLogger(__name__)

COLUMNS = ("fen", "best_move", "best_action", "moves", "win_probs")
HUMAN_COLUMNS = ("human_move", "mover_rating")
_CHUNK = 8192  # rows whose dense legal masks exist at once while loading


@dataclasses.dataclass
class PositionTensors:
    """One split of a dataset in memory (see the module docstring for shapes)."""

    tokens: torch.Tensor
    legal_bits: np.ndarray
    best_action: torch.Tensor
    actions: torch.Tensor
    win_probs: torch.Tensor
    facts: SparseMoveFacts | None = None
    human_action: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def batch(self, indices: torch.Tensor, *, token_dtype: torch.dtype = torch.long) -> Batch:
        """The rows at `indices` (CPU tensors; legal masks unpacked; move facts appended to the tokens).

        `token_dtype=torch.uint8` keeps the inputs in their storage type (every token and fact byte fits):
        an eighth of the bytes to build, pin and copy to a GPU, and `ActionPolicy.forward` casts them there
        itself (the same embedding rows and fact gathers, so the same results, bit for bit).
        """
        index = indices.numpy()
        masks = np.unpackbits(self.legal_bits[index], axis=1, count=NUM_ACTIONS).view(bool)
        # Gathered in numpy, single-threaded: torch's indexing and cat spread these small copies over its
        # thread pool, which cost more than they saved (up to 10x on a busy 2-core machine) and competes with
        # the model's step when batches are prepared in the background.
        inputs = self.tokens.numpy()[index]
        if self.facts is not None:
            inputs = np.concatenate([inputs, self.facts.dense(index, dtype=np.uint8)], axis=1)
        if token_dtype == torch.long:
            inputs = inputs.astype(np.int64)
        tokens = torch.from_numpy(inputs).to(token_dtype)

        def rows(column: Any) -> torch.Tensor:
            return torch.from_numpy(column.numpy()[index])  # the same numpy gather

        return Batch(
            tokens=tokens,
            legal_mask=torch.from_numpy(masks),
            best_action=rows(self.best_action),
            actions=rows(self.actions),
            win_probs=rows(self.win_probs),
            human_action=rows(self.human_action) if self.human_action is not None else None,
        )


@dataclasses.dataclass
class SparseMoveFacts:
    """Each row's non-zero move facts: row i's are ``actions/bits[offsets[i]:offsets[i + 1]]``
    (about one per position, where a dense array would take 1968 bytes)."""

    offsets: np.ndarray  # int64 [N + 1]
    actions: np.ndarray  # int16
    bits: np.ndarray  # uint8

    @classmethod
    def of(cls, boards: list[chess.Board], extra_facts: Collection[str] = ()) -> SparseMoveFacts:
        offsets, actions, bits = [0], [], []
        for board in boards:
            for action, value in move_facts(board, extra=extra_facts):
                actions.append(action)
                bits.append(value)
            offsets.append(len(actions))
        return cls(
            np.asarray(offsets, dtype=np.int64), np.asarray(actions, dtype=np.int16), np.asarray(bits, dtype=np.uint8)
        )

    @classmethod
    def concatenate(cls, parts: list[SparseMoveFacts]) -> SparseMoveFacts:
        offsets, base = [np.zeros(1, dtype=np.int64)], 0
        for part in parts:
            offsets.append(part.offsets[1:] + base)
            base += int(part.offsets[-1])
        return cls(
            np.concatenate(offsets), np.concatenate([p.actions for p in parts]), np.concatenate([p.bits for p in parts])
        )

    def dense(self, rows: np.ndarray, dtype: type = np.int64) -> np.ndarray:
        """[len(rows), 1968] of `dtype` (int64 by default): the fact byte of every action of the given rows."""
        rows = np.asarray(rows, dtype=np.int64)
        out: np.ndarray = np.zeros((len(rows), NUM_ACTIONS), dtype=dtype)
        starts, stops = self.offsets[rows], self.offsets[rows + 1]
        counts = stops - starts
        total = int(counts.sum())
        if total:
            # One scatter for the whole batch (a per-row Python loop held the GIL for ~1.4 ms per 256 rows):
            # entry j of output row i is fact starts[i] + j.
            row_of = np.repeat(np.arange(len(rows)), counts)
            first = np.repeat(np.cumsum(counts) - counts, counts)
            source = np.repeat(starts, counts) + (np.arange(total) - first)
            out[row_of, self.actions[source]] = self.bits[source]
        return out


@dataclasses.dataclass
class Batch:
    """A batch ready for the model: tokens [B, 77] long (or [B, 77 + 1968] with move facts),
    legal_mask [B, 1968] bool, targets (human_action [B] only when the split was loaded with `HumanMoves`)."""

    tokens: torch.Tensor
    legal_mask: torch.Tensor
    best_action: torch.Tensor
    actions: torch.Tensor
    win_probs: torch.Tensor
    human_action: torch.Tensor | None = None

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory (what an asynchronous host-to-GPU copy reads from)."""
        pinned: dict[str, Any] = {
            f.name: t.pin_memory() if (t := getattr(self, f.name)) is not None else None
            for f in dataclasses.fields(self)
        }
        return dataclasses.replace(self, **pinned)

    def to(self, device: torch.device | str) -> Batch:
        """The batch on `device`; host-to-GPU copies go through pinned memory, asynchronously
        (a batch already pinned, `pin_memory`, is not copied again on the host)."""
        device = torch.device(device)

        def move(tensor: torch.Tensor | None) -> torch.Tensor | None:
            if tensor is None:
                return None
            if device.type == "cuda":
                return tensor.pin_memory().to(device, non_blocking=True)
            return tensor.to(device)

        moved: dict[str, Any] = {f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **moved)


@dataclasses.dataclass(frozen=True)
class HumanMoves:
    """Load a split for human-move imitation: only rows with a ``human_move``, and with a bound set,
    only rows whose ``mover_rating`` is known and inside [min_rating, max_rating] (inclusive)."""

    min_rating: int | None = None
    max_rating: int | None = None

    def describe(self) -> str:
        if self.min_rating is None and self.max_rating is None:
            return "any rating"
        low = "" if self.min_rating is None else f"{self.min_rating} <= "
        high = "" if self.max_rating is None else f" <= {self.max_rating}"
        return f"{low}mover_rating{high}"


class NoRowsLeft(InputError):
    """A split has no row left after the `HumanMoves` filter (the message gives the counts)."""


def _human_filter(table: pa.Table, human: HumanMoves, where: str) -> pa.Table:
    """The rows of `table` that `human` keeps; logs the counts, raises `NoRowsLeft` when none is."""
    has_move = pc.is_valid(table.column("human_move"))
    keep = has_move
    rating = table.column("mover_rating")
    if human.min_rating is not None:
        keep = pc.and_kleene(keep, pc.greater_equal(rating, human.min_rating))
    if human.max_rating is not None:
        keep = pc.and_kleene(keep, pc.less_equal(rating, human.max_rating))
    keep = pc.fill_null(keep, False)  # an unknown rating is outside any band
    total, with_move, kept = table.num_rows, int(pc.sum(has_move).as_py() or 0), int(pc.sum(keep).as_py() or 0)
    counts = f"{total} rows, {with_move} with a human move, {kept} of those with {human.describe()}"
    if kept == 0:
        hint = (
            ""
            if with_move
            else " (human moves come from `chessgrpo data import-pgn`; older imports and generated data have none)"
        )
        raise NoRowsLeft(f"{where}: no row to imitate: {counts}{hint}")
    logger.info("%s: human moves: %s", where, counts)
    return table.filter(keep)


def has_split(directory: str | os.PathLike, split: Split) -> bool:
    """True when the dataset directory (a relative path from any current directory: `paths.find_data_path`) has at least
    one shard of `split`."""
    return bool(shard_paths(find_data_path(directory) or directory, split))


def load_split(
    directory: str | os.PathLike,
    split: Split,
    move_facts: bool = False,
    human: HumanMoves | None = None,
    *,
    extra_facts: Collection[str] = (),
) -> PositionTensors:
    """Read and validate one split of a dataset directory into memory (with each position's move
    facts when `move_facts`: about 0.3 ms a position, for a policy that reads them; with the
    optional facts named in `extra_facts` too, `board.move_facts.EXTRA_FACTS`). With `human`,
    only the rows it keeps are loaded, with their human moves (`human_action`).

    Raises:
        FileNotFoundError: the directory or the split's shards are missing.
        NoRowsLeft: `human` keeps no row of the split.
        ValueError: a row's labels are inconsistent (the message names the row and the FEN).
    """
    given = directory
    directory = find_data_path(directory) or Path(directory)  # a relative path, from any current directory
    if not directory.is_dir():
        raise FileNotFoundError(
            f"dataset directory {str(given)!r} does not exist (looked at {places_looked(given)}); "
            "run `chessgrpo data generate` first"
        )
    if not has_split(directory, split):
        raise FileNotFoundError(
            f"dataset directory {str(directory)!r} has no {split} shards ({split}/shard-*.parquet); "
            "run `chessgrpo data generate` first"
        )
    where = f"dataset {str(directory)!r} {split} split"
    table = read_positions(directory, split, COLUMNS + (HUMAN_COLUMNS if human is not None else ()))
    if human is not None and table.num_rows:
        table = _human_filter(table, human, where)
        where += f" (the {table.num_rows} rows with a human move kept)"  # row numbers below count those
    fens = table.column("fen").to_pylist()
    best_moves = table.column("best_move").to_pylist()
    best_column = np.asarray(table.column("best_action").to_numpy(zero_copy_only=False), dtype=np.int64)
    moves = table.column("moves").to_pylist()
    wins = table.column("win_probs").to_pylist()
    count = len(fens)
    if count == 0:
        raise InputError(f"dataset directory {str(directory)!r}: the {split} split is empty")
    width = max(1, max(len(m or ()) for m in moves))

    tokens = encode_fens(fens)  # validates every FEN string
    legal_bits = np.zeros((count, (NUM_ACTIONS + 7) // 8), dtype=np.uint8)
    actions = np.full((count, width), -1, dtype=np.int64)
    win_probs = np.zeros((count, width), dtype=np.float32)
    human_moves = table.column("human_move").to_pylist() if human is not None else None
    human_action = np.full(count, -1, dtype=np.int64)
    fact_parts: list[SparseMoveFacts] = []
    for start in range(0, count, _CHUNK):
        stop = min(count, start + _CHUNK)
        boards = [chess.Board(fen) for fen in fens[start:stop]]
        masks = legal_masks(boards)
        if move_facts:
            fact_parts.append(SparseMoveFacts.of(boards, extra_facts))
        legal_bits[start:stop] = np.packbits(masks, axis=1)
        for row in range(start, stop):
            _check_row(
                where, row, fens[row], best_moves[row], int(best_column[row]), moves[row], wins[row], masks[row - start]
            )
            actions[row, : len(moves[row])] = [move_to_action(m) for m in moves[row]]
            win_probs[row, : len(wins[row])] = wins[row]
            if human_moves is not None:
                human_action[row] = _human_action(where, row, fens[row], human_moves[row], masks[row - start])
    _warn_if_best_is_not_best(where, actions, win_probs)
    return PositionTensors(
        tokens=torch.from_numpy(tokens),
        legal_bits=legal_bits,
        best_action=torch.from_numpy(best_column),
        actions=torch.from_numpy(actions),
        win_probs=torch.from_numpy(win_probs),
        facts=SparseMoveFacts.concatenate(fact_parts) if move_facts else None,
        human_action=torch.from_numpy(human_action) if human is not None else None,
    )


def _human_action(where: str, row: int, fen: str, move: str, mask: np.ndarray) -> int:
    """The action index of a row's human move, checked to be a legal move there."""
    try:
        action = move_to_action(move)
    except (ValueError, KeyError):
        action = -1
    if action < 0 or not mask[action]:
        raise InputError(f"{where}, row {row} ({quote(fen)}): human_move {quote(move)} is not legal there")
    return action


def _check_row(where, row, fen, best_move, best_action, moves, wins, mask) -> None:
    def bad(reason: str) -> ValueError:
        return ValueError(f"{where}, row {row} ({quote(fen)}): {reason}")

    if not mask.any():
        raise bad("the position has no legal move")
    if not moves or wins is None or len(moves) != len(wins):
        raise bad(f"moves {quote(moves)} and win_probs {quote(wins)} must be non-empty and of equal length")
    if best_move != moves[0]:
        raise bad(f"best_move {quote(best_move)} is not moves[0] {quote(moves[0])}")
    if move_to_action(best_move) != best_action:
        raise bad(f"best_action {best_action} is not the index of best_move {quote(best_move)}")
    for move in moves:
        if not mask[move_to_action(move)]:
            raise bad(f"labelled move {quote(move)} is not legal there")
    if any(not 0.0 <= w <= 1.0 for w in wins):
        raise bad(f"win_probs {quote(wins)} are not all in [0, 1]")


def _warn_if_best_is_not_best(where: str, actions: np.ndarray, win_probs: np.ndarray) -> None:
    """Multipv lists are best first; many rows where moves[0] is clearly not the best smell of a
    perspective flip (labels from the wrong side), which would teach the worst move."""
    valid = actions >= 0
    best_other = np.where(valid, win_probs, -np.inf)[:, 1:].max(axis=1, initial=-np.inf)
    worse = float(np.mean(best_other > win_probs[:, 0] + 0.05))
    if worse > 0.05:
        logger.warning(
            "%s: in %.0f%% of rows another listed move beats moves[0] by > 0.05 win probability; "
            "are win_probs from the side to move's point of view?",
            where,
            100 * worse,
        )


class EpochSampler:
    """Batches of indices from a fresh seeded permutation each epoch; state = (epoch, offset).

    The permutation of epoch ``e`` comes from a `torch.Generator` seeded with a hash of
    ``(seed, e)``, so it depends on nothing but those two numbers. A batch that runs past the end
    of an epoch continues into the next one, so every batch has exactly `batch_size` rows (also
    when the dataset is smaller than a batch) and no position is skipped.
    """

    def __init__(self, size: int, batch_size: int, seed: int, *, epoch: int = 0, offset: int = 0):
        if size < 1 or batch_size < 1:
            raise ValueError(f"need size >= 1 and batch_size >= 1, got {size}, {batch_size}")
        if not 0 <= offset < size or epoch < 0:
            raise ValueError(f"sampler position (epoch={epoch}, offset={offset}) is outside a dataset of {size}")
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.epoch, self.offset = epoch, offset
        self._permutation = self._permute(epoch)

    def _permute(self, epoch: int) -> torch.Tensor:
        seed = int(np.random.SeedSequence([self.seed, epoch]).generate_state(1, dtype=np.uint64)[0])
        generator = torch.Generator().manual_seed(seed)
        return torch.randperm(self.size, generator=generator)

    def next_indices(self) -> torch.Tensor:
        parts, needed = [], self.batch_size
        while needed:
            take = min(needed, self.size - self.offset)
            parts.append(self._permutation[self.offset : self.offset + take])
            self.offset += take
            needed -= take
            if self.offset == self.size:
                self.epoch, self.offset = self.epoch + 1, 0
                self._permutation = self._permute(self.epoch)
        return torch.cat(parts)

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "size": self.size,
            "batch_size": self.batch_size,
            "seed": self.seed,
        }

    @classmethod
    def from_state(cls, state: dict[str, int], size: int, batch_size: int, seed: int) -> EpochSampler:
        """Rebuild a sampler; refuses when the dataset or batch size changed since the checkpoint."""
        saved = (state["size"], state["batch_size"], state["seed"])
        if saved != (size, batch_size, seed):
            raise InputError(
                f"cannot resume the data order exactly: checkpoint has (positions, batch_size, seed) = {saved}, "
                f"now {(size, batch_size, seed)}; did the dataset change?"
            )
        return cls(size, batch_size, seed, epoch=state["epoch"], offset=state["offset"])


T = TypeVar("T")


class _Failed:
    """What the prefetch thread leaves in the queue when building a batch raised."""

    def __init__(self, error: BaseException):
        self.error = error


class BatchPrefetcher(Generic[T]):
    """The next `depth` batches of an `EpochSampler`, built ahead in a background thread.

    The thread draws from its own copy of the sampler (the caller's is left alone), so it yields the
    index batches the caller's sampler will draw, in the same order, with ``build(indices)`` of each.
    The caller keeps advancing its own sampler by one batch per `next` and checkpoints that one: a
    checkpoint then holds the batches consumed, not the ones prepared, and a resume is exact.

    A thread, not worker processes: building a batch (`PositionTensors.batch` with uint8 tokens) is
    numpy gathers that mostly release the GIL (measured: a busy builder costs a pure-Python main
    thread ~35% on the 2-core VM, at 60 batches of 1024 a second; a training step consumes one batch),
    and processes would add a copy of every batch through shared memory.
    """

    def __init__(self, sampler: EpochSampler, build: Callable[[torch.Tensor], T], depth: int):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._sampler = EpochSampler.from_state(sampler.state_dict(), sampler.size, sampler.batch_size, sampler.seed)
        self._build = build
        self._queue: queue.Queue[tuple[torch.Tensor, T] | _Failed] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batch-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: tuple[torch.Tensor, T] | _Failed) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                indices = self._sampler.next_indices()
                if not self._put((indices, self._build(indices))):
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._put(_Failed(error))

    def next(self) -> tuple[torch.Tensor, T]:
        """The next (indices, built batch), in the sampler's order; re-raises what building it raised."""
        while True:
            try:
                item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the batch prefetch thread stopped without a batch") from None
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        return item

    def close(self) -> None:
        """Stop the thread (it finishes the batch it is building) and drop the prepared batches."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
