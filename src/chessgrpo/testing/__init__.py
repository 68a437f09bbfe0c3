"""Tools for testing chessgrpo from the outside: fault injection into real processes (`faults`).

Used by `tests/test_faults.py` and `bench/faults.py`; nothing in the library imports this package.
"""
