"""The policy as a UCI engine (`chessgrpo uci`): the protocol loop (`engine`), its options
(`options`), the text of ``position`` and ``info`` (`protocol_text`), its scores and WDL
(`scores`), Chess960 positions for the standard-chess network (`chess960`), and the chess LM as the
player (`lm`). ``docs/uci.md`` has the user's view.
"""
