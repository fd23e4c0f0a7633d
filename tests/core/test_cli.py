import json
import subprocess
import sys

from tests.cli_support import invoke

from dsv4kit import __version__


def test_version():
    result = invoke(["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith(f"dsv4kit {__version__} (commit ")


def test_help_lists_every_command():
    result = invoke(["--help"])
    assert result.exit_code == 0
    for command in ("validate", "provision", "bench", "records", "rollout"):
        assert command in result.stdout


def test_validate_needs_local_or_gpu():
    result = invoke(["validate", "--local", "--gpu", "7"])
    assert result.exit_code == 2
    assert "exactly one of --local or --gpu" in result.stderr


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "dsv4kit.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and __version__ in out.stdout


def test_package_imports_without_cli_dependencies():
    """The box's SGLang venv has torch and triton only: dsv4kit must import without typer."""
    code = (
        "import sys\n"
        "for name in ('typer', 'fabric', 'invoke', 'paramiko', 'ansible', 'yaml'):\n"
        "    sys.modules[name] = None\n"
        "import dsv4kit, dsv4kit.core.exitcodes, dsv4kit.validation.harness\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_validate_with_no_mode_says_what_is_missing():
    result = invoke(["validate"])
    assert result.exit_code == 2 and result.stderr.startswith("error: give --local, --gpu N"), result.stderr


JSON_FAILURES = [
    ["validate", "--json"],
    ["validate", "--gpu", "1", "-i", "/nonexistent/hosts.yml", "--json"],
    ["provision", "-i", "/nonexistent/hosts.yml", "--json"],
    ["bench", "--ctx", "4096", "-i", "/nonexistent/hosts.yml", "--json"],
    ["profile", "--ctx", "4096", "-i", "/nonexistent/hosts.yml", "--json"],
    ["records", "list", "--results-repo", "/nonexistent/repo", "--json"],
    ["records", "show", "x", "--results-repo", "/nonexistent/repo", "--json"],
    ["records", "compare", "a", "b", "--results-repo", "/nonexistent/repo", "--json"],
    ["records", "publish", "/nonexistent/spill", "--json"],
    ["rollout", "status", "--host", "h", "-i", "/nonexistent/hosts.yml", "--json"],
]


def test_json_failure_prints_one_error_object_in_every_command():
    for args in JSON_FAILURES:
        result = invoke(args)
        assert result.exit_code == 2, (args, result.exit_code, result.output)
        body = json.loads(result.stdout)
        assert body["ok"] is False and body["exit_code"] == 2 and body["error"], (args, body)


def test_json_failure_of_an_option_click_refuses(monkeypatch, capsys):
    """Through the console script's main: click's own refusals (a missing --ctx) print the object too."""
    from dsv4kit.cli import main

    monkeypatch.setattr(sys, "argv", ["dsv4kit", "bench", "--json"])
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    assert code == 2 and json.loads(out.out)["error"] == "Missing option '--ctx'.", out


def test_validate_refuses_empty_cases():
    for empty in ("", " , "):
        result = invoke(["validate", "--local", "--cases", empty])
        assert result.exit_code == 2 and "names no case" in result.stderr, result.output


def test_docs_cli_lists_every_exit_code():
    from pathlib import Path

    from dsv4kit.core import exitcodes

    text = (Path(__file__).resolve().parents[2] / "docs/cli.md").read_text().split("## Exit codes", 1)[1]
    for name, code in vars(exitcodes).items():
        if name.isupper() and isinstance(code, int):
            assert f"{code} " in text, (name, code)
