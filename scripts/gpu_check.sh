#!/usr/bin/env bash
# One command for a GPU machine (one H100/H200): does the GPU path work, and how fast is it there?
#   (d) the issue-53 figures, each on cuda AND on the machine's CPU threads in the same run (ratios of one run):
#       rollout throughput (bench/rollout_throughput.py: one-move groups and trajectories against Stockfish at the
#       shipped shapes; targets on cuda >= 2,000 samples/s and >= 1,200 own plies/s) from a tiny policy pretrained
#       here on a small labelled dataset (`chessgrpo data generate`, PRETRAIN_DATA_POSITIONS positions), and
#       pretraining through the real input pipeline against the model alone (bench/pretrain_pipeline.py: `small`,
#       prefetch on and off; target on cuda: real / model-only >= 0.9)
#   (b) GRPO throughput of configs/rookworld_124m_gpu.yaml on a random-init GPT-2 124M (scripts/make_gpt2_124m.py)
#       for GRPO_STEPS steps (default 5): completions/s, sampling vs rewards vs learning seconds per step (from the
#       run's metrics.jsonl: perf/step_s, perf/sample_s, perf/reward_s, perf/learn_s), the CUDA allocator's peak;
#       the first step is reported apart (warm-up). Target: >= 100 completions/s.
#   (a) the CUDA tests, tests/test_cuda.py (bounded by TESTS_TIMEOUT seconds, default 300)
#   (c) only with --full (or GPU_CHECK_FULL=1): SFT of a ~27.6M llama chess LM (configs/rookworld_sft_gpu.yaml) for
#       SFT_MINUTES (default 8), then LM_GRPO_MINUTES (default 3) of GRPO from it (configs/rookworld_124m_gpu.yaml,
#       chess-tokenizer lengths), then `chessgrpo eval lm` of both and their paired comparison (--compare).
# (d) and (b) run before (a) so the measurements come back even if the tests run long; the default run (set-up, d, b,
# a) keeps to GPU_CHECK_BUDGET seconds (default 470: under 8 minutes): the tests get what is left of it (at most
# TESTS_TIMEOUT). --full adds ~13 minutes (more than one device-tool call's 10 minutes: run it as its own call,
# e.g. `--full --no-tests --no-throughput --no-benches`, with SFT_MINUTES/LM_GRPO_MINUTES lowered to fit).
# It prints a compact summary and writes gpu_check.json (the machine, every figure, its target, pass/fail) and
# gpu_check.md (the same as one Markdown table), with the logs and metrics, under $OUT when OUT is set (else WORK).
#
# Usage:
#   bash scripts/gpu_check.sh --prepare    # here (network, the project's .venv): fill runs/gpu_carry/ (see below)
#   bash scripts/gpu_check.sh              # on the GPU machine: set-up, (d), (b), (a)
#   bash scripts/gpu_check.sh --full       # ... and (c)
#   bash scripts/gpu_check.sh --dry-run    # the same pipeline with tiny sizes on CPU (< 2 min); also DEVICE=cpu
#                                          # (its "cuda" column runs on the CPU with one thread: not a measurement)
#   options: --no-tests, --no-throughput (b), --no-benches (d), --keep (reuse WORK's data and model)
#
# The GPU machine (docs: the device tool's README) runs its own Python 3.12 + CUDA PyTorch and has no network.
# `--prepare` puts what else it needs into runs/gpu_carry/ (ignored by git, ~45 MB):
#   whl/          wheels of the pinned packages it lacks or has at other versions (transformers, tokenizers,
#                 huggingface_hub, python-chess, rust-chess), for CPython 3.12 x86-64
#   stockfish.xz  this machine's Stockfish binary, xz-compressed
# The data (RookWorld samples for the BPE, puzzles, Syzygy tables) is in the repository's data/ and travels with the tree.
# Then, with the device tool: run(command="bash scripts/gpu_check.sh", carry=["runs/gpu_carry"], timeout_s=600).
# On the GPU machine the script installs the wheels with `pip --target` into GPU_CHECK_SITE (default
# /tmp/chessgrpo_site) when the interpreter lacks the pinned transformers, runs the package from src/ (PYTHONPATH),
# and decompresses Stockfish unless one is found ($CHESSGRPO_STOCKFISH, PATH, /usr/games).
# Environment: PYTHON (interpreter; default .venv/bin/python if present, else python3), WORK (default
# runs/gpu_check, or runs/gpu_check_dry), OUT, GRPO_STEPS, DATA_POSITIONS, TESTS_TIMEOUT, SFT_MINUTES,
# GRPO_TIMEOUT (default 300 s), LM_GRPO_MINUTES, LM_GRPO_LR (default 1e-5), EVAL_P / EVAL_A (held-out prompts per task, default 200 / 100),
# GPU_CHECK_BUDGET (seconds, default 470), and the sizes of (d), defaults on a GPU (dry run):
#   PRETRAIN_DATA_POSITIONS 4096 (256), PRETRAIN_DATA_NODES 200 (50): the labelled set both benches read;
#   INIT_STEPS 30 (1): pretraining steps of the tiny policy the rollouts start from;
#   ROLLOUT_STEPS 5 (1), ROLLOUT_WARMUP 2 (0): timed and untimed steps per setting and device (one round);
#   ROLLOUT_REWARD_NODES (dry run only) 200: set it empty for the shipped 2000;
#   PRETRAIN_SIZE small (tiny), PRETRAIN_BATCH 1024 (64) on cuda, PRETRAIN_CPU_BATCH 128 (64) on the CPU threads,
#   PRETRAIN_STEPS 10 (2) and PRETRAIN_CPU_STEPS 2 (2) per window, PRETRAIN_REPEATS 3 (2), PRETRAIN_WARMUP 3 (1),
#   PREFETCH 2; BENCH_TIMEOUT 180 s per bench run.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$SECONDS

DRY=0; FULL=${GPU_CHECK_FULL:-0}; TESTS=1; THROUGHPUT=1; BENCHES=1; PREPARE=0; KEEP=0
[ "${DEVICE:-cuda}" = "cpu" ] && DRY=1
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    --full) FULL=1 ;;
    --no-tests) TESTS=0 ;;
    --no-throughput) THROUGHPUT=0 ;;
    --no-benches) BENCHES=0 ;;
    --prepare) PREPARE=1 ;;
    --keep) KEEP=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

say() { printf '[gpu_check %4ds] %s\n' "$((SECONDS - START))" "$*"; }
die() { echo "gpu_check: error: $*" >&2; exit 2; }

CARRY=${GPU_CHECK_CARRY:-$ROOT/runs/gpu_carry}  # what --prepare fills and the device tool carries
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
command -v "$PYTHON" >/dev/null 2>&1 || die "no Python interpreter $PYTHON (set PYTHON=...)"

find_stockfish() {
  if [ -n "${CHESSGRPO_STOCKFISH:-}" ] && [ -x "$CHESSGRPO_STOCKFISH" ]; then echo "$CHESSGRPO_STOCKFISH"; return 0; fi
  command -v stockfish 2>/dev/null && return 0
  for p in /usr/games/stockfish /usr/local/bin/stockfish; do [ -x "$p" ] && { echo "$p"; return 0; }; done
  return 1
}
data_dir() {  # the repository's shipped data, or $CHESSGRPO_DATA when it holds the RookWorld samples
  if [ -n "${CHESSGRPO_DATA:-}" ] && [ -f "$CHESSGRPO_DATA/rookworld_samples.txt" ]; then echo "$CHESSGRPO_DATA"
  elif [ -f data/rookworld_samples.txt ]; then (cd data && pwd)
  else return 1; fi
}

# ------------------------------------------------------------------------------------------------ --prepare
if [ "$PREPARE" = 1 ]; then
  mkdir -p "$CARRY/whl"
  version() { "$PYTHON" -c "from importlib import metadata; print(metadata.version('$1'))"; }
  PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
             --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
  rm -f "$CARRY"/whl/*.whl
  for name in transformers tokenizers huggingface_hub rust-chess; do
    spec="$name==$(version $name)" || die "$name is not installed in $PYTHON"
    say "wheel $spec (CPython 3.12, x86-64)"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
      -d "$CARRY/whl" "$spec" || die "pip could not download $spec"
  done
  spec="chess==$(version chess)"
  say "wheel $spec (pure Python, built from its sdist)"
  python3 -m pip wheel -q --no-deps -w "$CARRY/whl" "$spec" || die "pip could not build a wheel of $spec"
  fish=$(find_stockfish) || die "no Stockfish here to carry (apt-get install stockfish, or CHESSGRPO_STOCKFISH=...)"
  say "Stockfish $fish -> $CARRY/stockfish.xz"
  if command -v xz >/dev/null 2>&1; then xz -6 -T0 -c "$fish" >"$CARRY/stockfish.xz"
  else "$PYTHON" -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.compress(open(sys.argv[1], 'rb').read(), preset=6))" \
    "$fish" "$CARRY/stockfish.xz"; fi || die "could not compress $fish"
  say "ready: $(du -sh "$CARRY" | cut -f1) in $CARRY; with the tree ($(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes tracked) it must stay under 64 MiB"
  say "device tool: run(command=\"bash scripts/gpu_check.sh\", carry=[\"${CARRY#$ROOT/}\"], timeout_s=600)"
  exit 0
fi

# ------------------------------------------------------------------------------------------------ set-up
if [ "$DRY" = 1 ]; then
  MODE=dry-run; DEV=cpu; WORK=${WORK:-runs/gpu_check_dry}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  MODE=gpu; DEV=cuda; WORK=${WORK:-runs/gpu_check}
fi
case "$WORK" in /*) ;; *) WORK=$ROOT/$WORK ;; esac
LOGS=${OUT:-$WORK}
mkdir -p "$WORK" "$LOGS" || die "cannot create $WORK / $LOGS"
rm -rf "$WORK/stages"
export PYTHONUNBUFFERED=1

# The interpreter must hold the pinned transformers; carried wheels fill what it lacks (never on the project's .venv).
deps_ok() { "$PYTHON" -c "import transformers, tokenizers, chess, sys; sys.exit(transformers.__version__ != '$(sed -n 's/.*"transformers==\([^"]*\)".*/\1/p' pyproject.toml)')" 2>/dev/null; }
if ! deps_ok && ls "$CARRY"/whl/*.whl >/dev/null 2>&1; then
  SITE=${GPU_CHECK_SITE:-/tmp/chessgrpo_site}
  say "installing the carried wheels into $SITE: $(ls "$CARRY/whl" | tr '\n' ' ')"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$CARRY"/whl/*.whl \
    || die "pip could not install the carried wheels"
  export PYTHONPATH=$SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
fi
HELPER=("$PYTHON" "$ROOT/scripts/gpu_check.py")
CLI=("${HELPER[@]}" cli --work "$WORK")

if [ "$DRY" = 1 ]; then "${HELPER[@]}" preflight --work "$WORK" || exit $?
else "${HELPER[@]}" preflight --work "$WORK" --require-cuda || exit $?; fi

if ! fish=$(find_stockfish); then
  if [ -f "$CARRY/stockfish.xz" ]; then
    fish=/tmp/chessgrpo_stockfish/stockfish
    mkdir -p /tmp/chessgrpo_stockfish
    "$PYTHON" -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.decompress(open(sys.argv[1], 'rb').read()))" \
      "$CARRY/stockfish.xz" $fish && chmod +x $fish || die "could not unpack $CARRY/stockfish.xz"
  else
    die "Stockfish not found (CHESSGRPO_STOCKFISH, PATH, /usr/games) and no $CARRY/stockfish.xz: run --prepare and carry $CARRY"
  fi
fi
export CHESSGRPO_STOCKFISH=$fish
DATA_DIR=$(data_dir) || die "no data/rookworld_samples.txt in the checkout (or \$CHESSGRPO_DATA)"
say "mode $MODE, work $WORK, logs $LOGS, Stockfish $fish, data $DATA_DIR"

GRPO_CONFIG=configs/rookworld_124m_gpu.yaml
SFT_CONFIG=configs/rookworld_sft_gpu.yaml
CACHE=$WORK/cache/evaluations.sqlite
DATA=$WORK/rookworld_data
MODEL=$WORK/gpt2_124m
"${HELPER[@]}" meta --work "$WORK" mode=$MODE full=$FULL grpo_config=$GRPO_CONFIG grpo_run="$WORK/grpo_throughput" \
  sft_run="$WORK/sft" lm_grpo_run="$WORK/lm_grpo"

if [ "$DRY" = 1 ]; then
  POSITIONS=${DATA_POSITIONS:-60}
  DATA_EXTRA=(engine.processes=2 test_fraction=0.2)
  MODEL_SHAPE=(--n-layer 2 --n-embd 64 --n-head 2 --n-positions 512)
  GRPO_STEPS=${GRPO_STEPS:-3}
  GRPO_SIZE=(device=cpu bf16=false threads=1 engine.processes=1 task.prompts_per_step=4 task.group_size=2
             task.max_new_tokens=16 task.logprob_chunk_rows=4 grpo.minibatch_size=8 grpo.micro_batch_size=4)
  TESTS_TIMEOUT=${TESTS_TIMEOUT:-120}
  SFT_BUDGET=$(( ${SFT_MINUTES:-1} * 60 )); LM_GRPO_BUDGET=${LM_GRPO_SECONDS:-12}
  SFT_SIZE=(device=cpu bf16=false threads=1 model.n_layer=1 model.n_embd=32 model.n_head=2 batch_size=8 steps=6
            first_tasks_steps=2 warmup_steps=0 eval_every=0 eval_examples=8 eval_prompts=2 eval_batch_size=8
            max_new_tokens=8 checkpoint_every=0)
  LM_GRPO_SIZE=(device=cpu bf16=false threads=1 engine.processes=1 task.prompts_per_step=4 task.group_size=2
                task.logprob_chunk_rows=4 grpo.minibatch_size=8 grpo.micro_batch_size=4 task.max_new_tokens=16)
  EVAL_P=${EVAL_P:-4}; EVAL_A=${EVAL_A:-4}; EVAL_SIZE=(max_new_tokens=16 batch_size=8 device=cpu threads=1 resamples=200)
  BUDGET=${GPU_CHECK_BUDGET:-100000}
  PDATA_POSITIONS=${PRETRAIN_DATA_POSITIONS:-256}; PDATA_EXTRA=(nodes="${PRETRAIN_DATA_NODES:-50}" engine.processes=2 concurrent_games=8)
  INIT_STEPS=${INIT_STEPS:-1}; INIT_SIZE=(batch_size=64 threads=1)
  ROLLOUT_STEPS=${ROLLOUT_STEPS:-1}; ROLLOUT_WARMUP=${ROLLOUT_WARMUP:-0}
  ROLLOUT_EXTRA=(--set engine.processes=2)
  # 10x fewer reward nodes than the shipped shapes: a dry run (ROLLOUT_REWARD_NODES= keeps the shipped 2000)
  [ -n "${ROLLOUT_REWARD_NODES-200}" ] && ROLLOUT_EXTRA+=(--set task.reward_nodes="${ROLLOUT_REWARD_NODES-200}")
  PT_SIZE=${PRETRAIN_SIZE:-tiny}; PT_BATCH=${PRETRAIN_BATCH:-64}; PT_CPU_BATCH=${PRETRAIN_CPU_BATCH:-64}
  PT_STEPS=${PRETRAIN_STEPS:-2}; PT_CPU_STEPS=${PRETRAIN_CPU_STEPS:-2}; PT_REPEATS=${PRETRAIN_REPEATS:-2}; PT_WARMUP=${PRETRAIN_WARMUP:-1}
  # The "cuda" column of a dry run: the same commands on the CPU, one thread (the "cpu" column: every thread).
  ACCEL=cpu; ACCEL_THREADS=1
else
  POSITIONS=${DATA_POSITIONS:-$([ "$FULL" = 1 ] && echo 20000 || echo 2000)}
  DATA_EXTRA=()
  MODEL_SHAPE=()
  GRPO_STEPS=${GRPO_STEPS:-5}
  GRPO_SIZE=()
  TESTS_TIMEOUT=${TESTS_TIMEOUT:-300}
  SFT_BUDGET=$(( ${SFT_MINUTES:-8} * 60 )); LM_GRPO_BUDGET=$(( ${LM_GRPO_MINUTES:-3} * 60 ))
  SFT_SIZE=()
  LM_GRPO_SIZE=(task.max_new_tokens=96)
  EVAL_P=${EVAL_P:-200}; EVAL_A=${EVAL_A:-100}; EVAL_SIZE=(max_new_tokens=96 batch_size=256 device=cuda)
  BUDGET=${GPU_CHECK_BUDGET:-470}
  PDATA_POSITIONS=${PRETRAIN_DATA_POSITIONS:-4096}; PDATA_EXTRA=(nodes="${PRETRAIN_DATA_NODES:-200}")
  INIT_STEPS=${INIT_STEPS:-30}; INIT_SIZE=()
  ROLLOUT_STEPS=${ROLLOUT_STEPS:-5}; ROLLOUT_WARMUP=${ROLLOUT_WARMUP:-2}; ROLLOUT_EXTRA=()
  PT_SIZE=${PRETRAIN_SIZE:-small}; PT_BATCH=${PRETRAIN_BATCH:-1024}; PT_CPU_BATCH=${PRETRAIN_CPU_BATCH:-128}
  PT_STEPS=${PRETRAIN_STEPS:-10}; PT_CPU_STEPS=${PRETRAIN_CPU_STEPS:-2}; PT_REPEATS=${PRETRAIN_REPEATS:-3}; PT_WARMUP=${PRETRAIN_WARMUP:-3}
  ACCEL=cuda; ACCEL_THREADS=0
fi
PREFETCH=${PREFETCH:-2}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-180}
PDATA=$WORK/pretrain_data
INIT=$WORK/rollout_init
BENCH=$WORK/bench
left() { echo $((BUDGET - (SECONDS - START))); }  # seconds of GPU_CHECK_BUDGET still left

# Data (Stockfish labels at 1000 nodes: the GRPO reward's budget, so P: labels are cache hits) and the model.
if [ "$THROUGHPUT" = 0 ] && [ "$FULL" = 0 ]; then
  :  # the RookWorld data serves (b) and (c) only
elif [ "$KEEP" = 1 ] && [ -f "$DATA/manifest.json" ]; then
  say "data: keeping $DATA"
else
  say "data: $POSITIONS positions -> $DATA"
  rm -rf "$DATA"
  tick=$SECONDS
  "$PYTHON" -m chessgrpo data rookworld --out "$DATA" --positions "$POSITIONS" engine.cache_path="$CACHE" "${DATA_EXTRA[@]}" \
    >"$WORK/data.log" 2>&1
  rc=$?
  "${HELPER[@]}" record --work "$WORK" --stage data --rc $rc --seconds $((SECONDS - tick))
  [ $rc = 0 ] || { tail -20 "$WORK/data.log" >&2; die "chessgrpo data rookworld failed (log: $WORK/data.log)"; }
fi
if [ "$THROUGHPUT" = 1 ]; then
  if [ "$KEEP" = 1 ] && [ -f "$MODEL/config.json" ]; then
    say "model: keeping $MODEL"
  else
    say "model: scripts/make_gpt2_124m.py ${MODEL_SHAPE[*]:-(GPT-2 124M)} -> $MODEL"
    tick=$SECONDS
    "$PYTHON" scripts/make_gpt2_124m.py --out "$MODEL" --samples "$DATA_DIR/rookworld_samples.txt" "${MODEL_SHAPE[@]}" \
      >"$WORK/model.log" 2>&1
    rc=$?
    "${HELPER[@]}" record --work "$WORK" --stage model --rc $rc --seconds $((SECONDS - tick))
    [ $rc = 0 ] || { tail -20 "$WORK/model.log" >&2; die "scripts/make_gpt2_124m.py failed (log: $WORK/model.log)"; }
  fi
fi

# ------------------------------------------------------------------------------------------------ (d) benches
# bench_run NAME TIMEOUT COMMAND...: run a bench (its log in $BENCH/NAME.log), record its stage, show a failure's end.
bench_run() {
  local name=$1 limit=$2; shift 2
  local tick=$SECONDS
  timeout -k 15 "$limit" "$@" >"$BENCH/$name.log" 2>&1
  local rc=$?
  extra=(); [ $rc = 124 ] || [ $rc = 137 ] && extra=(--timed-out)
  "${HELPER[@]}" record --work "$WORK" --stage "$name" --rc $rc --seconds $((SECONDS - tick)) "${extra[@]}"
  [ $rc = 0 ] || { say "$name failed (rc $rc); its log's end:"; tail -15 "$BENCH/$name.log"; }
  return $rc
}
if [ "$BENCHES" = 1 ]; then
  mkdir -p "$BENCH"; rm -f "$BENCH"/*.json
  "${HELPER[@]}" meta --work "$WORK" bench_dir="$BENCH" accel="$ACCEL" accel_threads=$ACCEL_THREADS prefetch=$PREFETCH \
    pretrain_size=$PT_SIZE pretrain_batch=$PT_BATCH pretrain_cpu_batch=$PT_CPU_BATCH rollout_steps=$ROLLOUT_STEPS
  if [ "$KEEP" = 1 ] && [ -f "$PDATA/manifest.json" ]; then
    say "(d) labelled positions: keeping $PDATA"
  else
    say "(d) labelled positions: $PDATA_POSITIONS -> $PDATA"
    rm -rf "$PDATA"
    bench_run pretrain_data 300 "$PYTHON" -m chessgrpo data generate --config configs/data_tiny.yaml out="$PDATA" \
      positions="$PDATA_POSITIONS" shard_size="$PDATA_POSITIONS" "${PDATA_EXTRA[@]}"
  fi
  if [ -f "$PDATA/manifest.json" ]; then
    say "(d) the rollouts' starting policy: configs/pretrain_tiny.yaml, $INIT_STEPS steps -> $INIT"
    rm -rf "$INIT"
    bench_run rollout_init 300 "$PYTHON" -m chessgrpo pretrain --config configs/pretrain_tiny.yaml data="$PDATA" run.out_dir="$WORK" \
      run.name=rollout_init steps="$INIT_STEPS" warmup_steps=0 eval_every=0 checkpoint_every=0 device="$ACCEL" "${INIT_SIZE[@]}"
    for column in cuda cpu; do
      dev=cpu; threads=0; [ $column = cuda ] && { dev=$ACCEL; threads=$ACCEL_THREADS; }
      if [ -d "$INIT/checkpoints" ]; then
        say "(d) rollout throughput ($column column: device $dev, threads $threads): one_move, trajectory"
        bench_run rollout_$column "$BENCH_TIMEOUT" "$PYTHON" bench/rollout_throughput.py --init "$INIT" --positions "$PDATA" \
          --settings one_move,trajectory --steps "$ROLLOUT_STEPS" --warmup "$ROLLOUT_WARMUP" --repeats 1 --set device=$dev \
          --set threads=$threads "${ROLLOUT_EXTRA[@]}" --json "$BENCH/rollout_$column.json"
      fi
      batch=$PT_CPU_BATCH; steps=$PT_CPU_STEPS; [ $column = cuda ] && { batch=$PT_BATCH; steps=$PT_STEPS; }
      say "(d) pretraining pipeline ($column column: $PT_SIZE, batch $batch, device $dev, threads $threads)"
      bench_run pretrain_$column "$BENCH_TIMEOUT" "$PYTHON" bench/pretrain_pipeline.py --data "$PDATA" --size "$PT_SIZE" \
        --batch "$batch" --device $dev --threads $threads --prefetch "$PREFETCH" --steps "$steps" --warmup "$PT_WARMUP" \
        --repeats "$PT_REPEATS" --json "$BENCH/pretrain_$column.json"
    done
  fi
fi

# ------------------------------------------------------------------------------------------------ (b) throughput
if [ "$THROUGHPUT" = 1 ]; then
  say "(b) GRPO throughput: $GRPO_CONFIG, $GRPO_STEPS steps"
  rm -rf "$WORK/grpo_throughput"
  timeout -k 30 "${GRPO_TIMEOUT:-300}" "${CLI[@]}" --stage grpo_throughput -- train --config $GRPO_CONFIG data="$DATA" run.out_dir="$WORK" \
    run.name=grpo_throughput init_checkpoint=null model.path="$MODEL" steps="$GRPO_STEPS" log_every=1 eval_at_start=false \
    eval_every=0 eval.policy_prompts=0 eval.environment_prompts=0 checkpoint_every=0 engine.cache_path="$CACHE" \
    "${GRPO_SIZE[@]}" >"$LOGS/grpo_throughput.log" 2>&1
  rc=$?
  [ $rc = 0 ] || { say "GRPO throughput run failed (rc $rc); its log's end:"; tail -25 "$LOGS/grpo_throughput.log"; }
  [ -f "$WORK/grpo_throughput/metrics.jsonl" ] && cp "$WORK/grpo_throughput/metrics.jsonl" "$LOGS/grpo_metrics.jsonl"
  "$PYTHON" -c "import json,sys; json.load(open(sys.argv[1]))" "$WORK/stages/grpo_throughput.json" 2>/dev/null \
    || "${HELPER[@]}" record --work "$WORK" --stage grpo_throughput --rc $rc --seconds 0
fi

# ------------------------------------------------------------------------------------------------ (a) CUDA tests
if [ "$TESTS" = 1 ]; then
  # What is left of the budget, less ~20 s for the summary (never under a minute: a started suite gets a chance).
  budget_left=$(( $(left) - 20 )); [ "$budget_left" -lt "$TESTS_TIMEOUT" ] && TESTS_TIMEOUT=$(( budget_left > 60 ? budget_left : 60 ))
  say "(a) tests/test_cuda.py (at most $TESTS_TIMEOUT s)"
  tick=$SECONDS
  timeout -k 15 "$TESTS_TIMEOUT" "$PYTHON" -m pytest -q -p no:cacheprovider -m "slow or not slow" tests/test_cuda.py \
    >"$LOGS/test_cuda.log" 2>&1
  rc=$?
  extra=(); [ $rc = 124 ] || [ $rc = 137 ] && extra=(--timed-out)
  "${HELPER[@]}" record --work "$WORK" --stage tests --rc $rc --seconds $((SECONDS - tick)) --log "$LOGS/test_cuda.log" "${extra[@]}"
  [ $rc = 0 ] || say "tests/test_cuda.py: rc $rc (log: $LOGS/test_cuda.log)"
fi

# ------------------------------------------------------------------------------------------------ (c) SFT, GRPO, eval lm
if [ "$FULL" = 1 ]; then
  say "(c) SFT: $SFT_CONFIG for at most $SFT_BUDGET s"
  rm -rf "$WORK/sft" "$WORK/lm_grpo"
  timeout -k 30 $((SFT_BUDGET + 600)) "${CLI[@]}" --stage sft --budget-s "$SFT_BUDGET" -- train --config $SFT_CONFIG \
    data="$DATA" run.out_dir="$WORK" run.name=sft "${SFT_SIZE[@]}" >"$WORK/sft.log" 2>&1
  rc=$?
  [ -f "$WORK/sft/metrics.jsonl" ] && cp "$WORK/sft/metrics.jsonl" "$LOGS/sft_metrics.jsonl"
  if [ $rc != 0 ]; then
    say "SFT failed (rc $rc); its log's end:"; tail -25 "$WORK/sft.log"
  else
    say "(c) GRPO of the SFT model: $GRPO_CONFIG for at most $LM_GRPO_BUDGET s"
    timeout -k 30 $((LM_GRPO_BUDGET + 600)) "${CLI[@]}" --stage lm_grpo --budget-s "$LM_GRPO_BUDGET" -- train \
      --config $GRPO_CONFIG data="$DATA" run.out_dir="$WORK" run.name=lm_grpo init_checkpoint="$WORK/sft" steps=100000 \
      lr="${LM_GRPO_LR:-1e-5}" eval_at_start=false eval_every=0 eval.policy_prompts=0 eval.environment_prompts=0 \
      checkpoint_every=0 engine.cache_path="$CACHE" "${LM_GRPO_SIZE[@]}" >"$WORK/lm_grpo.log" 2>&1
    rc=$?
    [ $rc = 0 ] || { say "GRPO of the SFT model failed (rc $rc); its log's end:"; tail -25 "$WORK/lm_grpo.log"; }
    for which in sft grpo; do
      run=$WORK/sft; [ $which = grpo ] && run=$WORK/lm_grpo
      [ -d "$run" ] || continue
      say "(c) eval lm of $run ($EVAL_P P: + $EVAL_A A: held-out prompts)"
      timeout -k 30 900 "${CLI[@]}" --stage eval_$which -- eval lm --checkpoint "$run" --data "$DATA" --policy-prompts "$EVAL_P" \
        --environment-prompts "$EVAL_A" rewards.policy.nodes=1000 engine.cache_path="$CACHE" output="$WORK/eval_$which.json" \
        "${EVAL_SIZE[@]}" >"$WORK/eval_$which.log" 2>&1 || { say "eval lm failed; its log's end:"; tail -15 "$WORK/eval_$which.log"; }
    done
    if [ -f "$WORK/eval_sft.json" ] && [ -f "$WORK/eval_grpo.json" ]; then
      "$PYTHON" -m chessgrpo eval lm --compare "$WORK/eval_sft.json" "$WORK/eval_grpo.json" >"$WORK/eval_compare.txt" 2>&1 \
        || say "eval lm --compare failed: $(tail -3 "$WORK/eval_compare.txt")"
      cp "$WORK/eval_compare.txt" "$LOGS/eval_compare.txt" 2>/dev/null
    fi
  fi
fi

# ------------------------------------------------------------------------------------------------ summary
"${HELPER[@]}" meta --work "$WORK" total_s=$((SECONDS - START)) budget_s=$BUDGET
echo
"${HELPER[@]}" summary --work "$WORK" --out "$LOGS"  # also gpu_check.json and gpu_check.md
GRPO_RC=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['rc'])" "$WORK/stages/grpo_throughput.json" 2>/dev/null || echo 0)
[ "$THROUGHPUT" = 0 ] || [ "$GRPO_RC" = 0 ] || exit 1
exit 0
