"""``dsv4kit bench``: the throughput sweep. (Not implemented yet.)"""

import typer

from dsv4kit import exitcodes


def bench() -> None:
    """Run the throughput sweep against the served model (not implemented yet)."""
    typer.echo("error: bench is not implemented yet", err=True)
    raise typer.Exit(exitcodes.USAGE)
