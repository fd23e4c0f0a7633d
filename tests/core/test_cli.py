import subprocess
import sys

from typer.testing import CliRunner

from dsv4kit import __version__
from dsv4kit.cli import app

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"dsv4kit {__version__}"


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("validate", "provision", "bench", "records", "rollout"):
        assert command in result.stdout


def test_validate_needs_local_or_gpu():
    result = runner.invoke(app, ["validate", "--local", "--gpu", "7"])
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
