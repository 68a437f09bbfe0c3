"""`python -m chessgrpo ...`: the same command line as `chessgrpo` (what torchrun's ``-m chessgrpo`` runs)."""

import sys

from chessgrpo.cli import main

if __name__ == "__main__":
    sys.exit(main())
