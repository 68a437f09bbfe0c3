#!/usr/bin/env bash
# Set up everything chessgrpo needs on a fresh machine; safe to run again (fast when done).
#   - .venv with Python >= 3.10
#   - torch pinned to 2.13.0 (the local CPU wheel on CPU machines, the CUDA build on GPU machines)
#   - chessgrpo in editable mode with its dev extras
#   - Debian's stockfish via apt when missing and we are root; otherwise a clear message
#   - optional: Debian's chromium (headless, for the report's browser tests)
#   - optional: Debian's ethereal-chess (a non-Stockfish UCI engine, ~100 KB) for the tests of other
#     engines as eval games opponents (tests/test_other_engines.py); a failed install only says so
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
TORCH_VERSION=2.13.0

say() { printf '[setup] %s\n' "$*"; }

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "[setup] error: $PYTHON not found; install Python >= 3.10 (e.g. apt-get install python3 python3-venv)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "[setup] error: Python >= 3.10 required, found $("$PYTHON" --version 2>&1)" >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV" || {
    echo "[setup] error: could not create a virtual env (Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  say "installing torch==$TORCH_VERSION"
  "${PIP[@]}" install -q "torch==$TORCH_VERSION"
fi

# Reinstall the package only when its metadata changed (editable: code changes need nothing).
stamp="$VENV/.chessgrpo-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || ! "$VENV/bin/python" -c "import chessgrpo" 2>/dev/null; then
  say "installing chessgrpo and its dependencies"
  "${PIP[@]}" install -q -e ".[dev]"
  touch "$stamp"
fi

find_stockfish() {
  if [ -n "${CHESSGRPO_STOCKFISH:-}" ] && [ -x "$CHESSGRPO_STOCKFISH" ]; then return 0; fi
  command -v stockfish >/dev/null 2>&1 && return 0
  for p in /usr/games/stockfish /usr/local/bin/stockfish; do [ -x "$p" ] && return 0; done
  return 1
}
if ! find_stockfish; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Debian's stockfish with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q stockfish >/dev/null
  else
    echo "[setup] error: Stockfish not found. Install it with 'sudo apt-get install stockfish' (Debian/Ubuntu)" >&2
    echo "[setup]        or 'brew install stockfish', or set CHESSGRPO_STOCKFISH=/path/to/stockfish." >&2
    exit 1
  fi
fi
find_stockfish || { echo "[setup] error: stockfish still not found after apt-get install" >&2; exit 1; }

# Optional, never fatal: without it tests/test_other_engines.py installs it itself or skips.
if ! command -v ethereal-chess >/dev/null 2>&1 && [ ! -x /usr/games/ethereal-chess ] \
   && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  say "installing Debian's ethereal-chess (optional: another UCI engine for the tests)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get install -y -q --no-install-recommends ethereal-chess >/dev/null 2>&1 \
    || { timeout 300 apt-get update -q >/dev/null 2>&1 \
         && timeout 300 apt-get install -y -q --no-install-recommends ethereal-chess >/dev/null 2>&1; } \
    || say "optional ethereal-chess not installed (tests/test_other_engines.py will try again or skip)"
fi
# Optional, never fatal: headless Chromium for the report's browser tests (tests/test_report.py renders the
# HTML report and takes a screenshot); without it those two tests skip with a message.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 \
   && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  say "installing Debian's chromium (optional: the report's headless-browser tests)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
    || { timeout 300 apt-get update -q >/dev/null 2>&1 \
         && timeout 600 apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; } \
    || say "optional chromium not installed (the report's browser tests will skip)"
fi
say "ready ($("$VENV/bin/python" -c 'import torch, chess; print(f"torch {torch.__version__}, python-chess {chess.__version__}")'))"
