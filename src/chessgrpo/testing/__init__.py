"""Tools for testing chessgrpo from the outside: fault injection into real processes (`faults`),
the `/proc` walker it uses (`processes`) and the checks that judge the outcome (`outcomes`).

Used by `tests/test_faults.py` and `bench/faults.py`; nothing in the library imports this package.
"""
