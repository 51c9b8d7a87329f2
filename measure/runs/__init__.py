"""One module per measurement kind, each with `run(ctx: RunContext) -> None` (see worker.py)."""
