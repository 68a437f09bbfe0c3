"""Running many games (`run_games`): in this process, or across worker processes (multiprocessing "spawn"; each
worker loads its own copy of the model, its own anchor engines and its own tablebase handle, `GameWorker`), handing
every finished `GameResult` to a callback (progress bars, SPRT early stopping). A worker stops when its parent dies,
so a killed ``eval games`` leaves no worker playing on. The games themselves are `play.games.play_game`'s."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from chessgrpo.play.anchors import AnchorSpec
from chessgrpo.play.games import Adjudicator, GameAbandoned, GameResult, GameSettings, GameTask, play_game
from chessgrpo.play.lm_player import LMMover
from chessgrpo.play.movers import Mover, PolicyMover, make_mover


class GameWorker:
    """A worker's players and adjudicator, created once and reused for all its games."""

    def __init__(self, settings: GameSettings):
        self.settings = settings
        self.player: Mover
        if settings.lm_player is not None:
            self.player = LMMover.from_path(settings.checkpoint, device=settings.device, config=settings.lm_player)
        else:
            self.player = PolicyMover.from_checkpoint(
                settings.checkpoint,
                device=settings.device,
                temperature=settings.temperature,
                avoid_repetition=settings.avoid_repetition,
                winning_material=settings.winning_material,
                search=settings.search,
            )
        self.adjudicator = Adjudicator(settings)
        self._anchors: dict[str, Mover] = {}

    def anchor(self, spec: AnchorSpec) -> Mover:
        if spec.text not in self._anchors:
            self._anchors[spec.text] = make_mover(
                spec,
                engine_path=self.settings.engine_path,
                device=self.settings.device,
                temperature=self.settings.temperature,
                avoid_repetition=self.settings.avoid_repetition,
                winning_material=self.settings.winning_material,
            )
        return self._anchors[spec.text]

    def play(self, task: GameTask, abandon: Callable[[], bool] | None = None) -> GameResult:
        return play_game(task, self.player, self.anchor(task.anchor), self.adjudicator, self.settings, abandon)

    def close(self) -> None:
        self.player.close()
        for mover in self._anchors.values():
            mover.close()
        self.adjudicator.close()


def _worker_main(settings: GameSettings, tasks: Any, results: Any, stop: Any, parent: int) -> None:
    """Entry point of a spawned worker: play tasks until a None sentinel, the stop event, or the
    death of `parent` (the pid of `eval games`; a SIGTERM or kill -9 runs no cleanup there, and
    without this check its workers would go on playing every queued game). The pid comes from
    the parent: the parent may die while a worker is still importing."""
    try:
        import torch

        torch.set_num_threads(1)  # one core per worker; the engines need the others
        worker = GameWorker(settings)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        results.put(("error", "worker start-up failed:\n" + traceback.format_exc()))
        return
    try:
        while not stop.is_set() and os.getppid() == parent:
            task = tasks.get()
            if task is None or stop.is_set() or os.getppid() != parent:
                break
            try:
                results.put(("ok", worker.play(task, abandon=lambda: os.getppid() != parent)))
            except GameAbandoned:
                break
            except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
                results.put(
                    (
                        "error",
                        f"game {task.anchor.text} pair {task.pair + 1} game {task.game + 1} failed:\n{traceback.format_exc()}",
                    )
                )
                break
    finally:
        if os.getppid() != parent:
            # Nobody reads the results any more: exiting must not wait to flush them into the pipe.
            results.cancel_join_thread()
        worker.close()


ResultCallback = Callable[[GameResult], bool]
"""Called with every finished game, in completion order; returning True stops the run early."""


def run_games(
    settings: GameSettings, tasks: Sequence[GameTask], workers: int = 1, on_result: ResultCallback | None = None
) -> tuple[list[GameResult], bool]:
    """Play `tasks`; returns (results sorted by anchor, pair, game; whether stopped early).

    When `on_result` returns True, no new game starts; games already running finish and are
    discarded, so the results are exactly those seen by the callback up to the stop.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    workers = min(workers, max(1, len(tasks)))
    results: list[GameResult] = []
    stopped = False
    if workers == 1:
        import torch

        # Batch-1 forwards of a small model: one thread is ~100x faster than two on a busy 2-core
        # machine (thread hand-offs dominate); restored afterwards, this is the caller's process.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        worker = GameWorker(settings)
        try:
            for task in tasks:
                result = worker.play(task)
                results.append(result)
                if on_result is not None and on_result(result):
                    stopped = True
                    break
        finally:
            worker.close()
            torch.set_num_threads(threads)
    else:
        results, stopped = _run_parallel(settings, tasks, workers, on_result)
    results.sort(key=lambda r: (r.anchor_index, r.pair, r.game))
    return results, stopped


def _run_parallel(
    settings: GameSettings, tasks: Sequence[GameTask], workers: int, on_result: ResultCallback | None
) -> tuple[list[GameResult], bool]:
    context = multiprocessing.get_context("spawn")
    task_queue = context.Queue()
    result_queue = context.Queue()
    stop = context.Event()
    for task in tasks:
        task_queue.put(task)
    for _ in range(workers):
        task_queue.put(None)
    processes = [
        context.Process(
            target=_worker_main,
            args=(settings, task_queue, result_queue, stop, os.getpid()),
            name=f"games-{i}",
            daemon=True,
        )
        for i in range(workers)
    ]
    for process in processes:
        process.start()
    results: list[GameResult] = []
    stopped = False
    error: str | None = None
    try:
        while len(results) < len(tasks):
            try:
                kind, payload = result_queue.get(timeout=1.0)
            except queue.Empty:
                if not any(process.is_alive() for process in processes):
                    error = error or "every game worker exited before the games were finished (see the log above)"
                    break
                continue
            if kind == "error":
                error = payload
                break
            results.append(payload)
            if on_result is not None and on_result(payload):
                stopped = True
                break
    finally:
        stop.set()
        # Unblock workers waiting for a task, then let running games finish (their results are dropped).
        for _ in processes:
            task_queue.put(None)
        # Keep draining while joining: a worker cannot exit while its last result sits in a full pipe.
        deadline = time.monotonic() + 300
        while any(process.is_alive() for process in processes) and time.monotonic() < deadline:
            _drain(result_queue)
            for process in processes:
                process.join(timeout=0.1)
        for process in processes:
            if process.is_alive():  # pragma: no cover - a hung worker: end it, its engines see EOF and exit
                process.terminate()
                process.join(timeout=10)
        _drain(result_queue)
        task_queue.cancel_join_thread()
        result_queue.cancel_join_thread()
    if error is not None:
        raise RuntimeError(f"a game worker failed: {error.strip()}")
    return results, stopped


def _drain(results: Any) -> None:
    while True:
        try:
            results.get_nowait()
        except (queue.Empty, OSError, ValueError):
            return
