"""One module per top-level command: each has `add_parser(subparsers)` setting `handler=run(args) -> int`.

The CLI imports every module listed in `COMMAND_MODULES`; a new command is a new module plus one
entry here. Handlers import heavy packages (torch, engines) lazily so `--help` stays fast.
"""

COMMAND_MODULES = ("doctor", "engine", "data", "train", "evaluate", "uci", "diagnose", "report", "summary", "sweep")
