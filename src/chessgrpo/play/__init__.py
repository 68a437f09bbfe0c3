"""Playing games: who picks a move (`players`: the policy, random, Stockfish; `lm_player`: the chess LM;
`movers`: a player with its engine process and clock), the game loop (`games`) and many games in worker
processes (`game_runner`), the anchors an Elo is measured against (`anchors`, `anchor_checks`,
`anchor_runs`), clocks and the crash-safe game journal,
Elo with pentanomial intervals and SPRT (`elo`), and the match driver of `chessgrpo eval games` (`match`,
`GamesConfig`). `search_control` is what one UCI ``go`` asks for (limits, time management, the stop rule),
shared by movers on a clock and by the UCI engine.

Modules are imported directly; they pull in multiprocessing and engines, so nothing is loaded here.
"""
