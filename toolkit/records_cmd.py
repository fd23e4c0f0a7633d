"""``dsv4kit records``: list, show, compare and plot bench records. (Not implemented yet.)"""

import typer

app = typer.Typer(help="List, show, compare and plot bench records.", no_args_is_help=True)


@app.command("list")
def list_records() -> None:
    """List the records in the results repository (not implemented yet)."""
    raise typer.Exit(2)
