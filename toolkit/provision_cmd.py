"""``dsv4kit provision``: runs playbooks/site.yml. (Not implemented yet.)"""

import typer

from dsv4kit import exitcodes


def provision() -> None:
    """Provision the box(es) in the inventory with Ansible (not implemented yet)."""
    typer.echo("error: provision is not implemented yet", err=True)
    raise typer.Exit(exitcodes.USAGE)
