"""The typer commands: each parses its options, calls one function of its capability and maps the result to output and an exit code."""
