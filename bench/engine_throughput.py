"""Engine pool throughput against a raw UCI pipe driving the same number of Stockfish processes.

For each node limit and each repeat, four variants search the same list of positions, each with
freshly started engines whose startup is excluded from the timing. The variants are interleaved:
they take turns every `--chunk` positions (rotating the order), so a burst of load from anything
else on the machine hits all of them alike; a variant's time is the sum of its turns.

  raw          a minimal driver: one thread per Stockfish process, shared work counter,
               ``position fen``/``go nodes`` and read until ``bestmove``, keeping the last score.
               This is the yardstick.
  pool         ``EnginePool(clear_hash=True)``: the default, ``ucinewgame`` before every search.
               Timed: ``pool.evaluate(chunk)`` (validation, dispatch, parsing, WDL, everything).
  pool-noclear ``EnginePool(clear_hash=False)``.
  raw+clear    the raw driver sending ``ucinewgame`` before every search: isolates what clearing
               costs from the pool's own overhead.

Reported: median positions/s over repeats per variant, and ratios computed per repeat (median,
min, max). Then cached lookups per second through a pool with a persistent cache (all hits).

Run:  .venv/bin/python bench/engine_throughput.py [--processes N] [--positions 400]
      [--repeats 5] [--nodes 1000,10000] [--chunk 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

# Runnable from a checkout without installing: put src/ on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from chessgrpo.board.sources import random_playout_positions
from chessgrpo.engine.locate import find_stockfish
from chessgrpo.engine.pool import (
    HALFMOVE_CLOCK_RELEVANT_FROM,
    EnginePool,
    available_cores,
)

VARIANTS = ("raw", "pool", "pool-noclear", "raw+clear")
RATIOS = (
    ("pool/raw", "pool", "raw"),
    ("pool-noclear/raw", "pool-noclear", "raw"),
    ("raw+clear/raw", "raw+clear", "raw"),
    ("pool/raw+clear", "pool", "raw+clear"),
)


# --------------------------------------------------------------------------------------------
# The yardstick: a raw UCI driver, as simple and fast as Python allows.


class RawEngine:
    """One Stockfish process over buffered binary pipes."""

    def __init__(self, path: str, threads: int = 1, hash_mb: int = 16):
        self.proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.stdin = self.proc.stdin
        self.stdout = self.proc.stdout
        self.name = ""
        self._send(b"uci\n")
        for line in self._until(b"uciok"):
            if line.startswith(b"id name "):
                self.name = line[8:].decode().strip()
        self._send(f"setoption name Threads value {threads}\nsetoption name Hash value {hash_mb}\nisready\n".encode())
        for _ in self._until(b"readyok"):
            pass

    def _send(self, data: bytes) -> None:
        self.stdin.write(data)
        self.stdin.flush()

    def _until(self, prefix: bytes):
        readline = self.stdout.readline
        while True:
            line = readline()
            if not line:
                raise RuntimeError("stockfish exited")
            yield line
            if line.startswith(prefix):
                return

    def search(self, fen: str, go: bytes, clear: bool) -> tuple[int | None, int | None]:
        """(cp, mate) of the last non-bound score line of a search."""
        prefix = b"ucinewgame\n" if clear else b""
        self._send(prefix + b"position fen " + fen.encode() + b"\n" + go)
        readline = self.stdout.readline
        last = None
        while True:
            line = readline()
            if line.startswith(b"bestmove"):
                break
            if line.startswith(b"info") and b" score " in line and b"bound" not in line:
                last = line
            elif not line:
                raise RuntimeError("stockfish exited")
        if last is None:
            return None, None
        tokens = last.split()
        i = tokens.index(b"score")
        value = int(tokens[i + 2])
        return (value, None) if tokens[i + 1] == b"cp" else (None, value)

    def close(self) -> None:
        try:
            self._send(b"quit\n")
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.stdin.close()
        self.stdout.close()


def engine_fen(fen: str) -> str:
    """The FEN the pool sends for `fen` (halfmove clock zeroed below 60, fullmove 1), so the raw
    driver searches exactly the same positions (it then returns the same scores as the pool)."""
    fields = fen.split()
    clock = int(fields[4]) if int(fields[4]) >= HALFMOVE_CLOCK_RELEVANT_FROM else 0
    return " ".join(fields[:4] + [str(clock), "1"])


class RawDriver:
    """`processes` RawEngines; `run` searches a list of FENs with one thread per engine."""

    def __init__(self, path: str, processes: int, nodes: int, clear: bool, hash_mb: int = 16):
        self.engines: list[RawEngine] = [None] * processes  # type: ignore[list-item]

        def start(slot: int) -> None:
            self.engines[slot] = RawEngine(path, hash_mb=hash_mb)

        starters = [threading.Thread(target=start, args=(slot,)) for slot in range(processes)]
        for thread in starters:
            thread.start()
        for thread in starters:
            thread.join()
        if any(engine is None for engine in self.engines):
            raise RuntimeError("raw driver: an engine failed to start")
        self.name = self.engines[0].name
        self.go = f"go nodes {nodes}\n".encode()
        self.clear = clear

    def run(self, fens: list[str]) -> float:
        """Seconds to search all `fens` (thread start-up excluded)."""
        fens = [engine_fen(fen) for fen in fens]  # not timed
        counter = itertools.count()  # next() on a count is atomic under the GIL: a shared work queue
        total = len(fens)
        results: list = [None] * total
        begin = threading.Barrier(len(self.engines) + 1)
        go, clear = self.go, self.clear

        def work(engine: RawEngine) -> None:
            begin.wait()
            while True:
                index = next(counter)
                if index >= total:
                    return
                results[index] = engine.search(fens[index], go, clear)

        workers = [threading.Thread(target=work, args=(engine,)) for engine in self.engines]
        for thread in workers:
            thread.start()
        begin.wait()
        started = time.perf_counter()
        for thread in workers:
            thread.join()
        elapsed = time.perf_counter() - started
        if any(result is None or result == (None, None) for result in results):
            raise RuntimeError("raw driver: a search returned no score")
        return elapsed

    def close(self) -> None:
        for engine in self.engines:
            engine.close()


class PoolDriver:
    """An `EnginePool` without cache; `run` times one `evaluate` call."""

    def __init__(self, processes: int, nodes: int, clear: bool, hash_mb: int = 16):
        self.pool = EnginePool(processes=processes, hash_mb=hash_mb, nodes=nodes, clear_hash=clear, cache_path=None)

    def run(self, fens: list[str]) -> float:
        started = time.perf_counter()
        evaluations = self.pool.evaluate(fens)
        elapsed = time.perf_counter() - started
        if len(evaluations) != len(fens) or self.pool.stats.failures or self.pool.stats.retries:
            raise RuntimeError(f"pool: unexpected result ({len(evaluations)} evaluations, {self.pool.stats})")
        return elapsed

    def close(self) -> None:
        self.pool.close()


def start_variant(variant: str, path: str, processes: int, nodes: int, hash_mb: int):
    if variant == "raw":
        return RawDriver(path, processes, nodes, clear=False, hash_mb=hash_mb)
    if variant == "raw+clear":
        return RawDriver(path, processes, nodes, clear=True, hash_mb=hash_mb)
    if variant == "pool":
        return PoolDriver(processes, nodes, clear=True, hash_mb=hash_mb)
    if variant == "pool-noclear":
        return PoolDriver(processes, nodes, clear=False, hash_mb=hash_mb)
    raise ValueError(variant)


def run_repeat(
    path: str, processes: int, fens: list[str], nodes: int, chunk: int, hash_mb: int = 16
) -> dict[str, float]:
    """Positions/s of each variant in one repeat.

    Every variant gets fresh engines (started before timing). The positions are cut into chunks
    and the variants take turns chunk by chunk, in rotating order, so a burst of load from
    something else on the machine hits all variants alike. chunk=0: one chunk of everything.
    """
    drivers = {variant: start_variant(variant, path, processes, nodes, hash_mb) for variant in VARIANTS}
    seconds = dict.fromkeys(VARIANTS, 0.0)
    try:
        size = chunk if chunk > 0 else len(fens)
        for number, first in enumerate(range(0, len(fens), size)):
            part = fens[first : first + size]
            shift = number % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                seconds[variant] += drivers[variant].run(part)
    finally:
        for driver in drivers.values():
            driver.close()
    return {variant: len(fens) / seconds[variant] for variant in VARIANTS}


# --------------------------------------------------------------------------------------------
# Cached lookups


def cached_lookups(processes: int, fens: list[str], nodes: int, repeats: int) -> dict:
    """Fill a fresh cache with `fens` at `nodes`, then time `repeats` all-hit evaluates."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        EnginePool(processes=processes, nodes=nodes, cache_path=Path(tmp) / "cache.sqlite") as pool,
    ):
        started = time.perf_counter()
        pool.evaluate(fens)
        fill_s = time.perf_counter() - started
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            evaluations = pool.evaluate(fens)
            times.append(time.perf_counter() - started)
            if not all(evaluation.cached for evaluation in evaluations):
                raise RuntimeError("cached lookup benchmark: not every position was a cache hit")
        searches = pool.stats.searches
    rates = [len(fens) / t for t in times]
    return {
        "positions": len(fens),
        "fill_nodes": nodes,
        "fill_seconds": fill_s,
        "searches": searches,
        "lookups_per_s_median": statistics.median(rates),
        "lookups_per_s_min": min(rates),
        "lookups_per_s_max": max(rates),
        "repeats": repeats,
    }


# --------------------------------------------------------------------------------------------
# Machine description


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class LoadMeter:
    """How busy the machine was with other work while a section ran (Linux /proc/stat).

    other_cores: CPU time used by everything but this process and its (reaped) children, per
    second of wall time; steal_cores: time the hypervisor gave our virtual CPUs to someone else.
    Both should be near 0 for trustworthy numbers; the interleaving limits the damage otherwise.
    """

    def __enter__(self) -> Self:
        self.wall, self.busy, self.steal, self.own = time.perf_counter(), *self._stat(), self._own()
        self.result: dict = {}
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self.wall
        busy, steal = self._stat()
        own = self._own() - self.own
        self.result = {
            "other_cores": max(0.0, (busy - self.busy - own) / wall) if busy >= 0 else None,
            "steal_cores": (steal - self.steal) / wall if steal >= 0 else None,
            "loadavg_1min_end": os.getloadavg()[0],
        }

    @staticmethod
    def _stat() -> tuple[float, float]:
        try:
            fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return -1.0, -1.0
        tick = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        steal = fields[7] if len(fields) > 7 else 0
        return (sum(fields[:8]) - idle - steal) / tick, steal / tick

    @staticmethod
    def _own() -> float:
        total = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            usage = resource.getrusage(who)
            total += usage.ru_utime + usage.ru_stime
        return total

    def describe(self) -> str:
        r = self.result
        if r.get("other_cores") is None:
            return f"load average {r['loadavg_1min_end']:.2f}"
        return f"other work used {r['other_cores']:.2f} cores on average, steal {r['steal_cores']:.2f}, load average {r['loadavg_1min_end']:.2f}"


def machine_info(engine_name: str, processes: int) -> dict:
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": available_cores(),
        "processes": processes,
        "stockfish": engine_name,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


# --------------------------------------------------------------------------------------------


def summarise(rates: dict[str, list[float]]) -> dict:
    out = {"positions_per_s": {}, "ratios": {}}
    for variant, values in rates.items():
        out["positions_per_s"][variant] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "runs": values,
        }
    for label, top, bottom in RATIOS:
        per_repeat = [a / b for a, b in zip(rates[top], rates[bottom], strict=True)]
        out["ratios"][label] = {
            "median": statistics.median(per_repeat),
            "min": min(per_repeat),
            "max": max(per_repeat),
            "runs": per_repeat,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--processes", type=int, default=available_cores(), help="Stockfish processes (default: usable cores)"
    )
    parser.add_argument("--positions", type=int, default=400, help="positions per run (default 400)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per variant; medians are reported (default 5)")
    parser.add_argument("--nodes", default="1000,10000", help="comma-separated node limits (default 1000,10000)")
    parser.add_argument(
        "--chunk",
        type=int,
        default=50,
        help="variants take turns every this many positions within a repeat (default 50; 0 = whole list per turn)",
    )
    parser.add_argument(
        "--hash-mb",
        type=int,
        default=1,
        help="Stockfish Hash in MB for every variant (default 1, the pool's default)",
    )
    parser.add_argument(
        "--cache-positions", type=int, default=2000, help="distinct positions for the cached-lookup test (default 2000)"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    node_limits = [int(value) for value in args.nodes.split(",") if value.strip()]
    if min(args.repeats, args.positions, args.processes, args.hash_mb) < 1 or not node_limits:
        parser.error("--processes, --positions, --repeats and --hash-mb must be >= 1 and --nodes non-empty")

    path = str(find_stockfish(None))
    fens = [board.fen() for board in random_playout_positions(args.positions, seed=0, max_plies=80)]

    # Engine identity and a machine header first.
    probe = RawEngine(path)
    engine_name = probe.name
    probe.close()
    machine = machine_info(engine_name, args.processes)
    print(f"machine : {machine['cpu_model']}, {machine['cpu_count']} cores ({machine['usable_cores']} usable)")
    print(f"engine  : {engine_name} at {path}; {args.processes} processes x 1 thread, hash {args.hash_mb} MB")
    print(f"python  : {machine['python']} on {machine['platform']}")
    print(f"date    : {machine['date']}")
    print(
        f"settings: {args.positions} random-playout positions (seed 0, max 80 plies), {args.repeats} repeats, nodes {node_limits}, "
        f"variants alternate every {args.chunk or args.positions} positions"
    )
    print()

    results: dict = {
        "machine": machine,
        "settings": vars(args) | {"json": str(args.json) if args.json else None, "nodes": node_limits},
        "limits": {},
    }
    for nodes in node_limits:
        rates: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        loads = []
        for repeat in range(args.repeats):
            with LoadMeter() as meter:
                repeat_rates = run_repeat(path, args.processes, fens, nodes, args.chunk, args.hash_mb)
            loads.append(meter.result)
            line = []
            for variant in VARIANTS:
                rates[variant].append(repeat_rates[variant])
                line.append(f"{variant} {repeat_rates[variant]:7.1f}")
            print(
                f"  nodes={nodes} repeat {repeat + 1}/{args.repeats}: "
                + "  ".join(line)
                + f"  pos/s  ({meter.describe()})",
                flush=True,
            )
        summary = summarise(rates)
        summary["load"] = loads
        results["limits"][str(nodes)] = summary
        print()

    print(f"Throughput, positions/s (median of {args.repeats}; min-max in brackets)")
    header = f"{'variant':<14}" + "".join(f"{'nodes=' + str(n):>28}" for n in node_limits)
    print(header)
    for variant in VARIANTS:
        cells = []
        for nodes in node_limits:
            stat = results["limits"][str(nodes)]["positions_per_s"][variant]
            cells.append(f"{stat['median']:>10.1f} [{stat['min']:.1f}-{stat['max']:.1f}]")
        print(f"{variant:<14}" + "".join(f"{cell:>28}" for cell in cells))
    print()
    print("Ratios, computed per repeat (median [min-max])")
    for label, _, _ in RATIOS:
        cells = []
        for nodes in node_limits:
            stat = results["limits"][str(nodes)]["ratios"][label]
            cells.append(f"{stat['median']:>10.3f} [{stat['min']:.3f}-{stat['max']:.3f}]")
        print(f"{label:<18}" + "".join(f"{cell:>24}" for cell in cells))
    print()
    for nodes in node_limits:
        med = results["limits"][str(nodes)]["positions_per_s"]
        # Extra wall time per search (per process) of the pool over raw, and of clearing.
        pool_extra = args.processes * (1 / med["pool"]["median"] - 1 / med["raw"]["median"]) * 1e6
        clear_extra = args.processes * (1 / med["raw+clear"]["median"] - 1 / med["raw"]["median"]) * 1e6
        results["limits"][str(nodes)]["extra_us_per_search"] = {"pool_vs_raw": pool_extra, "clear_vs_raw": clear_extra}
        print(
            f"nodes={nodes}: per search, pool costs {pool_extra:+.0f} us over raw; ucinewgame costs {clear_extra:+.0f} us"
        )
        others = [
            load["other_cores"] for load in results["limits"][str(nodes)]["load"] if load["other_cores"] is not None
        ]
        if others:
            print(
                f"          other work on the machine meanwhile: {statistics.median(others):.2f} cores (median over repeats)"
            )
    print()

    cache_sets = [("same positions", fens, min(node_limits))]
    if args.cache_positions > 0:
        many = [board.fen() for board in random_playout_positions(args.cache_positions, seed=1, max_plies=80)]
        cache_sets.append((f"{args.cache_positions} distinct positions", many, 1))
    results["cached"] = []
    for label, positions, fill_nodes in cache_sets:
        stat = cached_lookups(args.processes, positions, fill_nodes, args.repeats) | {"label": label}
        results["cached"].append(stat)
        print(
            f"cached lookups ({label}: {stat['positions']} positions, filled at nodes={fill_nodes}): "
            f"{stat['lookups_per_s_median']:.0f}/s median [{stat['lookups_per_s_min']:.0f}-{stat['lookups_per_s_max']:.0f}]"
        )

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
