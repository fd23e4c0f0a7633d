"""``--help`` and ``-h`` of every dsv4kit command, as a user's terminal or pipe gets them.

The help is printed by the real console module in a subprocess whose stdout is a pipe, with
``COLUMNS`` set to a narrow and a common width: every option name of every command must appear
whole (rich's tables once cut 15 of bench's option names to ``--min-concurrency-r…``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import typer

from dsv4kit.cli import app

# One process per width: it prints the help of every command, split by a marker line.
_PRINT_ALL = r"""
import json, sys
import typer
from dsv4kit.cli import app

root = typer.main.get_command(app)

def walk(path, command):
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from walk(path + [name], sub)

for path in walk([], root):
    for flag in ("--help", "-h"):
        print("@@@ " + json.dumps([*path, flag]), flush=True)
        try:
            app(path + [flag], prog_name="dsv4kit")
        except SystemExit as exc:
            print(f"@@@ exit {exc.code}", flush=True)
"""


def _commands():
    """(path, click command) for the root, every group and every leaf."""
    def walk(path, command):
        yield path, command
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(path + [name], sub)
    return list(walk([], typer.main.get_command(app)))


def _helps(columns: int) -> dict[tuple[str, ...], tuple[str, int]]:
    proc = subprocess.run([sys.executable, "-c", _PRINT_ALL], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": str(columns), "TERMINAL_WIDTH": str(columns)})
    assert proc.returncode == 0, proc.stderr
    helps, key, lines = {}, None, []
    for line in proc.stdout.splitlines():
        if line.startswith("@@@ exit "):
            helps[key] = ("\n".join(lines), int(line.split()[-1] or 0))
        elif line.startswith("@@@ "):
            key, lines = tuple(json.loads(line[4:])), []
        else:
            lines.append(line)
    return helps


@pytest.fixture(scope="module", params=[40, 80])
def helps(request):
    return request.param, _helps(request.param)


def test_every_option_name_appears_whole_at_any_width(helps):
    columns, printed = helps
    commands = _commands()
    assert len(commands) >= 10
    for path, command in commands:
        text, code = printed[(*path, "--help")]
        where = f"dsv4kit {' '.join(path)} --help at COLUMNS={columns}"
        assert code == 0, where
        assert "…" not in text, f"{where} cuts something:\n{text}"
        for param in command.params:
            if getattr(param, "hidden", False) or param.param_type_name != "option":
                continue
            for name in [*param.opts, *param.secondary_opts]:
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"{where}: {name} is not whole"


def test_dash_h_is_help_in_every_command(helps):
    columns, printed = helps
    for path, _ in _commands():
        long, code_long = printed[(*path, "--help")]
        short, code_short = printed[(*path, "-h")]
        assert (code_short, short) == (code_long, long), f"dsv4kit {' '.join(path)} -h differs from --help"
