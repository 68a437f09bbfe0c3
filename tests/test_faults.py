"""Fault injection, the fast subset of `bench/faults.py`: real processes, faults from the outside.

Engines are found through /proc below the process that owns them and killed (SIGKILL) or frozen
(SIGSTOP) by `chessgrpo.testing.faults`; commands are killed with ``kill -9`` and resumed or run
again. Every outcome is compared with an undisturbed run: evaluations equal, weights bitwise,
metrics and dataset rows row for row. The whole matrix (every kind, several kill rates, corrupt
files, malformed inputs) is `bench/faults.py`; its last table is in docs/reliability.md.

Rely on the engine pool's fault handling (start-up retries with backoff, per-search retries on a
fresh process, `engine.timeout_s`): the start-up, SIGSTOP and kill-storm tests. Rely on the
readers' one-line errors that name their input: `test_malformed_input_gives_one_line_naming_it`.

Cross-cutting: testing/faults.py injects the faults; what is under test is engine/pool_workers.py's fault
handling, the `train` and `data generate` commands killed and resumed or run again (train/loop.py,
data/generate.py), and the readers' one-line errors (`engine eval`, `eval offline`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from chessgrpo.board import random_playout_positions
from chessgrpo.engine import EnginePool, RetryPolicy
from chessgrpo.testing.faults import EngineFaults, StartupKiller, run_command
from chessgrpo.testing.outcomes import (
    dataset_difference,
    digest_difference,
    error_problem,
    metrics_rows,
    rows_difference,
    tree_digest,
    weights_difference,
)
from chessgrpo.testing.processes import engine_processes, process_info, send_signal
from helpers import NO_LABELLED_LOSSES, REPO_ROOT, SYZYGY_DIR

CLI = [sys.executable, "-m", "chessgrpo.cli"]
NODES = 300


@pytest.fixture(scope="module")
def positions() -> list[str]:
    return [board.fen() for board in random_playout_positions(8, seed=11, max_plies=40)]


@pytest.fixture(scope="module")
def expected(positions):
    with EnginePool(processes=1, nodes=NODES) as pool:
        return pool.evaluate(positions)


# --------------------------------------------------------------------------------------------
# The tools themselves


def test_proc_walker_finds_a_pools_engines_and_reads_their_stat():
    with EnginePool(processes=2, nodes=NODES) as pool:
        found = engine_processes(os.getpid())
        assert {info.pid for info in found} == set(pool.pids)
        assert all(info.ppid == os.getpid() and info.comm.startswith("stockfish") for info in found)
        assert all(0 <= info.age_s < 600 for info in found)
        me = process_info(os.getpid())
        assert me is not None and me.pid == os.getpid() and me.state in "RS"
    assert engine_processes(os.getpid()) == []  # closed: nothing left behind
    assert process_info(2**22 + 12345) is None


# --------------------------------------------------------------------------------------------
# Engine faults (the pool's retries: start-up, per search, timeouts)


def test_engines_killed_in_their_first_milliseconds_are_replaced(positions, expected):
    # Handshakes take 20-300 ms (the network file loads): 100 ms catches them in it on a fast
    # machine too; one caught after its handshake is found dead at its first search instead.
    killer = StartupKiller(os.getpid(), limit=3, max_age_s=0.1)
    with killer:  # both slots' first processes die in their handshake, and one replacement too
        with EnginePool(processes=2, nodes=NODES, retry=RetryPolicy(backoff_s=0.01)) as pool:
            got = pool.evaluate(positions)
            engine_failures = pool.stats.engine_failures
    assert killer.faults, "no engine was caught in its first 100 ms"
    assert all(fault.age_s <= 0.11 and fault.signal == "SIGKILL" for fault in killer.faults)
    assert got == expected
    assert engine_failures >= len(killer.faults) - 1  # a kill just after the handshake is found at the next search


def test_a_sigstopped_engine_is_detected_within_its_timeout_and_replaced(positions, expected):
    with EnginePool(processes=1, nodes=NODES, timeout_s=1.0, retry=RetryPolicy(backoff_s=0.01)) as pool:
        assert pool.evaluate(positions[:2]) == expected[:2]
        [victim] = engine_processes(os.getpid())
        assert send_signal(victim, signal.SIGSTOP)
        try:
            started = time.monotonic()
            got = pool.evaluate(positions[2:])
            elapsed = time.monotonic() - started
        finally:
            send_signal(victim, signal.SIGCONT)  # a no-op once the pool has killed it
        assert got == expected[2:]
        assert pool.stats.retries == 1 and victim.pid not in pool.pids
        assert elapsed < 1.0 + 5.0  # the deadline, plus a fresh engine's start-up and the searches
    assert process_info(victim.pid) is None or process_info(victim.pid).start_ticks != victim.start_ticks


# --------------------------------------------------------------------------------------------
# Whole commands: engines killed under a GRPO run, kill -9 then --resume or the same command


def grpo_args(out_dir: Path, name: str, *extra: str) -> list[str]:
    """A from-scratch move_group run of 20 steps, engine rewards at 1000 nodes on 2 engines."""
    return [
        *CLI,
        "train",
        "--config",
        str(REPO_ROOT / "configs/grpo_tiny.yaml"),
        f"run.out_dir={out_dir}",
        f"run.name={name}",
        "init_checkpoint=null",
        "positions=random:128",
        "position_mixture=[]",
        "eval.positions=null",
        "eval.puzzles=null",
        "task.positions_per_step=8",
        "task.group_size=4",
        "task.reward_nodes=1000",
        "task.best_move_values=false",
        "grpo.minibatch_size=16",
        "engine.processes=2",
        "engine.cache=false",
        f"engine.syzygy_path={SYZYGY_DIR}",
        "threads=1",
        "log_every=1",
        "warmup_steps=0",
        "lr=3e-3",
        "steps=20",
        "eval_every=0",
        "eval_at_start=false",
        "checkpoint_every=5",
        *NO_LABELLED_LOSSES,
        *extra,
    ]


@pytest.fixture(scope="module")
def undisturbed_grpo(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grpo")
    result = run_command(grpo_args(out, "straight"), timeout_s=300)
    assert result.ok, result.stderr[-2000:]
    return out / "straight"


def assert_same_run(run_dir: Path, reference: Path) -> None:
    assert weights_difference(reference, run_dir) is None
    ignore = ("time", "perf/", "health/")  # timings and fault counters differ; nothing else may
    assert (
        rows_difference(
            metrics_rows(reference / "metrics.jsonl", ignore), metrics_rows(run_dir / "metrics.jsonl", ignore)
        )
        is None
    )


@pytest.mark.slow
def test_a_grpo_run_whose_engines_are_killed_every_0_3_to_1_s_ends_bitwise_equal(tmp_path, undisturbed_grpo):
    result = run_command(
        grpo_args(tmp_path, "killed"),
        timeout_s=300,
        injectors=[lambda pid: EngineFaults(pid, every=(0.3, 1.0), seed=3)],  # no engines yet: no-ops
    )
    assert result.ok, result.stderr[-2000:]
    assert len(result.faults) >= 2, "too few kills landed to test anything"
    assert result.leftovers == 0
    assert_same_run(tmp_path / "killed", undisturbed_grpo)


@pytest.mark.slow
def test_kill_9_of_a_grpo_run_then_resume_is_bitwise_equal(tmp_path, undisturbed_grpo):
    run_dir = tmp_path / "killed"
    metrics = run_dir / "metrics.jsonl"
    first = run_command(
        grpo_args(tmp_path, "killed"),
        timeout_s=300,
        kill_when=lambda: metrics.exists() and metrics.read_text().count("\n") >= 8,  # past the step-5 checkpoint
    )
    assert first.killed and first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert first.leftovers == 0  # the orphaned engines noticed and exited
    resumed = run_command([*CLI, "train", "--resume", str(run_dir)], timeout_s=300)
    assert resumed.ok, resumed.stderr[-2000:]
    assert_same_run(run_dir, undisturbed_grpo)


def generate_args(out: Path) -> list[str]:
    return [
        *CLI,
        "data",
        "generate",
        "--out",
        str(out),
        "--positions",
        "300",
        "--nodes",
        "100",
        "--multipv",
        "3",
        "--seed",
        "2",
        "shard_size=50",
        "concurrent_games=8",
        "engine.processes=2",
        f"engine.syzygy_path={SYZYGY_DIR}",
    ]


@pytest.mark.slow
def test_kill_9_of_data_generate_then_the_same_command_gives_the_same_rows(tmp_path):
    straight = run_command(generate_args(tmp_path / "straight"), timeout_s=300)
    assert straight.ok, straight.stderr[-2000:]
    out = tmp_path / "killed"
    shards = out / "train"
    first = run_command(
        generate_args(out),
        timeout_s=300,
        kill_when=lambda: shards.is_dir() and len(list(shards.glob("*.parquet"))) >= 2,
    )
    assert first.killed, "the run ended before it could be killed"
    again = run_command(generate_args(out), timeout_s=300)
    assert again.ok, again.stderr[-2000:]
    assert dataset_difference(tmp_path / "straight", out) is None  # same shards, same rows, same order
    assert not list(out.rglob("*.tmp"))


# --------------------------------------------------------------------------------------------
# Malformed input: one line naming it, no traceback, nothing changed


LONG_FEN = "8/" * 5000


def _malformed(tmp_path: Path, case: str) -> tuple[list[str], list[str], list[Path]]:
    if case == "fen-10k":
        return [*CLI, "engine", "eval", "--fen", LONG_FEN], [LONG_FEN[:20]], []
    if case == "non-utf8-fen-file":
        path = tmp_path / "positions.fen"
        path.write_bytes(b"\xff\xfe garbage\n")
        return [*CLI, "engine", "eval", "--file", str(path)], [path.name], [path]
    if case == "lr-inf":
        args = grpo_args(tmp_path, "fresh", "lr=.inf")
        return args, ["config key lr"], [tmp_path / "fresh"]
    if case == "scrambled-parquet":
        straight = run_command(generate_args(tmp_path / "data"), timeout_s=300)
        assert straight.ok, straight.stderr[-2000:]
        shard = tmp_path / "data" / "train" / "shard-00000.parquet"
        data = bytearray(shard.read_bytes())
        for offset in range(len(data) // 3, 2 * len(data) // 3, 7):
            data[offset] ^= 0x5A
        shard.write_bytes(bytes(data))
        return [*CLI, "eval", "offline", "--policy", "random", "--positions", str(shard)], [shard.name], [shard]
    raise ValueError(case)


@pytest.mark.parametrize("case", ["fen-10k", "non-utf8-fen-file", "lr-inf", "scrambled-parquet"])
def test_malformed_input_gives_one_line_naming_it(tmp_path, case):
    args, names, inputs = _malformed(tmp_path, case)
    before = tree_digest(*inputs)
    result = run_command(args, cwd=tmp_path, timeout_s=120)
    assert error_problem(result, names) is None, (error_problem(result, names), result.stderr[-1000:])
    assert digest_difference(before, tree_digest(*inputs)) is None
