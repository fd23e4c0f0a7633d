"""The ``dsv4kit`` typer application: the commands, assembled (``dsv4kit.cli`` runs it)."""

from __future__ import annotations

from typing import Optional

import typer

from dsv4kit.commands import bench, doctor, eval as eval_, monitor, profile, provision, records, rollout, validate

app = typer.Typer(
    name="dsv4kit",
    help=(
        "Bring an 8x RTX PRO 6000 (sm_120) box to a validated, benchmarked DeepSeek-V4-Flash "
        "server on SGLang 0.5.23.\n\n"
        "In every command --json prints a machine-readable summary on stdout and --output/-o PATH "
        "writes a file, checked before any work (docs/cli.md).\n\n"
        "Exit codes: 0 ok, 1 a check failed, 2 bad input, 3 host unreachable, 4 timeout, "
        "5 environment missing something, 6 a driven tool failed, 7 a comparison was inconclusive, "
        "130 interrupted."
    ),
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish)
    pretty_exceptions_enable=False,
    # Click's own help layout: it wraps the text to the terminal (or $COLUMNS, 80 when piped) but
    # never cuts an option name, as rich's tables do at 80 columns. -h is --help in every command.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
)


def _print_version(value: bool) -> None:
    if value:
        from dsv4kit.core.version_info import describe

        typer.echo(describe())
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(
        None, "--version", "-V", callback=_print_version, is_eager=True,
        help="Print the version, the checkout's commit and the SGLang and torch pins, and exit."
    ),
) -> None:
    """dsv4kit: provision, validate, eval, bench, profile, records, rollout."""


# Extra arguments reach validate, which explains them (`--json PATH` was once the report file).
app.command("validate", context_settings={"allow_extra_args": True})(validate.validate)
app.command("provision")(provision.provision)
app.command("bench")(bench.bench)
app.command("profile")(profile.profile)
app.command("eval")(eval_.eval_cmd)
app.command("monitor")(monitor.monitor)
app.command("doctor")(doctor.doctor)
app.add_typer(records.app, name="records")
app.add_typer(rollout.app, name="rollout")
for _group in (records.app, rollout.app):  # their help too: click's layout, never cut
    _group.rich_markup_mode = None
