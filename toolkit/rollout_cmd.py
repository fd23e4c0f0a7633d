"""``dsv4kit rollout``: the state of the kernel rollout in an SGLang venv. (Not implemented yet.)"""

import typer

app = typer.Typer(help="Kernel rollout into SGLang: status.", no_args_is_help=True)


@app.command("status")
def status() -> None:
    """Show the SGLang version, plugin, flags and targets (not implemented yet)."""
    raise typer.Exit(2)
