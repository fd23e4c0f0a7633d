"""The CLI keeps its own promises (docs/cli.md): Ctrl-C at any moment is one line and exit 130, one
JSON error object under ``--json``, the same condition gives the same exit code, and an option that
would be ignored is refused.

The box is the real loopback sshd (tests/sshd.py); a "silent port" accepts TCP and never speaks SSH
(a hung sshd), so a run that reaches the connection waits there until it is interrupted.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer

from dsv4kit.core import exitcodes
from tests.cli_support import REPO_ROOT, cli, interrupt
from tests.remote_inventory import write_inventory


class _SilentPort:
    """A listening socket that never answers (a hung sshd)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.held: list = []

    def accepted(self) -> bool:
        """Whether a client has connected (it is held open, never answered)."""
        try:
            self.held.append(self.sock.accept()[0])
        except BlockingIOError:
            pass
        return bool(self.held)

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent_port():
    port = _SilentPort()
    try:
        yield port
    finally:
        port.close()


# Where a check is missing, provision would run this instead of the real site.yml on this machine.
_HARMLESS_PLAY = {"DSV4KIT_PLAYBOOK": str(REPO_ROOT / "tests" / "core" / "harmless_play.yml")}


def _silent_inventory(tmp_path: Path, sshd, port: int, **overrides) -> Path:
    values = dict(ansible_port=port, dsv4_connect_timeout=60, dsv4_context_length=4096,
                  dsv4_model_path="/models/m")
    values.update(overrides)
    return write_inventory(tmp_path / "inv", sshd, **values)


# ============================================================ 13: Ctrl-C
def test_ctrl_c_while_the_cli_loads_is_one_line_and_130(tmp_path):
    """The handler is installed before the heavy imports: a Ctrl-C while typer loads is no traceback."""
    marker = tmp_path / "importing"
    hook = tmp_path / "hook"
    hook.mkdir()
    # Python imports sitecustomize at start-up: it makes the first import of typer wait, so that
    # the signal lands inside the CLI's heavy imports, every time.
    (hook / "sitecustomize.py").write_text(
        "import importlib.abc, sys, time\n"
        "class _Slow(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'typer':\n"
        "            sys.meta_path.remove(self)\n"
        f"            open({str(marker)!r}, 'w').close()\n"
        "            time.sleep(60)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Slow())\n")
    env = {"PYTHONPATH": f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code, out, err = interrupt(["records", "list", "--results-repo", str(tmp_path / "repo")],
                               lambda out, err: marker.exists(), env=env, timeout=60)
    assert code == exitcodes.INTERRUPTED, err
    assert "interrupted: dsv4kit stopped before its command ran; nothing was run" in err
    assert "Traceback" not in err and "Aborted" not in err


class _SwallowsCtrlC:
    """An object whose finalizer is running when Ctrl-C comes (as Ansible's do): Python prints
    "Exception ignored in ..." and goes on."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # the handler runs here; its KeyboardInterrupt is swallowed


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_swallowed_by_a_finalizer_still_ends_the_run_with_130(capsys):
    from dsv4kit.core.cli_common import interruptible

    @interruptible("dsv4kit demo", "nothing was run")
    def command():
        _SwallowsCtrlC()  # freed at once: its __del__ runs here
        raise typer.Exit(exitcodes.TIMEOUT)  # what the run went on to do

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(typer.Exit) as info:
        command()
    assert info.value.exit_code == exitcodes.INTERRUPTED
    assert "interrupted: dsv4kit demo stopped while starting; nothing was run" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_ctrl_c_while_profile_connects_names_the_connection(tmp_path, loopback_ssh, silent_port):
    inventory = _silent_inventory(tmp_path, loopback_ssh, silent_port.port)
    code, out, err = interrupt(["profile", "--ctx", "4096", "-c", "2", "-i", str(inventory)],
                               lambda out, err: silent_port.accepted())
    assert code == exitcodes.INTERRUPTED, err
    assert "interrupted: dsv4kit profile stopped while connecting to lo; nothing was written" in err, err
    assert "while profiling" not in err and "Traceback" not in err


def test_ctrl_c_while_bench_connects_keeps_no_points(tmp_path, loopback_ssh, silent_port):
    inventory = _silent_inventory(tmp_path, loopback_ssh, silent_port.port)
    spill = tmp_path / "spill"
    code, out, err = interrupt(["bench", "--ctx", "4096", "--input-len", "16", "--output-len", "8", "-c", "1",
                                "--num-prompts", "8", "-i", str(inventory), "--results-repo", str(tmp_path / "repo")],
                               lambda out, err: silent_port.accepted(), env={"DSV4KIT_SPILL_DIR": str(spill)})
    assert code == exitcodes.INTERRUPTED, err
    assert "no point had finished; nothing was kept" in err, err
    assert "points that had finished" not in err and "Traceback" not in err
    assert not spill.exists() or not any(spill.iterdir())


# ============================================================ 14: --json
def _blocking(tmp_path: Path, module: str) -> dict:
    """An environment whose Python cannot import ``module`` (as a control machine without it)."""
    hook = tmp_path / f"without-{module}"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class _Gone(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {module!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Gone())\n")
    return {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _envelope(stdout: str, code: int) -> dict:
    import json

    from dsv4kit.core.cli_common import exit_name

    data = json.loads(stdout)
    assert data["ok"] is False and data["exit_code"] == code and data["exit"] == exit_name(code), data
    assert isinstance(data["error"], str) and data["error"], data
    return data


def test_every_json_failure_is_the_same_envelope(tmp_path, loopback_ssh):
    # rollout plan: it had its own shape (a "host" key, no "exit").
    code, out, err = cli("rollout", "plan", "-i", tmp_path / "nope.yml", "--json")
    assert code == exitcodes.USAGE
    assert "not found" in _envelope(out, code)["error"]
    # rollout status: the report with no ok/exit/error (this interpreter has no SGLang).
    code, out, err = cli("rollout", "status", "--json")
    assert code == exitcodes.ENVIRONMENT, out + err
    assert "SGLang is not installed" in _envelope(out, code)["error"]
    # provision: the per-host summary of a failed play (exit 6) names what failed.
    playbook = tmp_path / "fail.yml"
    playbook.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - name: this fails\n"
                        "      ansible.builtin.fail:\n        msg: on purpose\n")
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_connection="local",
                                ansible_python_interpreter=sys.executable)
    code, out, err = cli("provision", "-i", inventory, "--json", env={"DSV4KIT_PLAYBOOK": str(playbook)})
    assert code == exitcodes.TOOL_FAILED, out + err
    data = _envelope(out, code)
    assert "lo: this fails" in data["error"] and data["hosts"], data


def test_validate_local_without_torch_prints_the_json_object(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dsv4kit.cli", "validate", "--local", "--json"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, env=_blocking(tmp_path, "torch"))
    assert proc.returncode == exitcodes.ENVIRONMENT, proc.stderr
    assert "'torch' is missing" in _envelope(proc.stdout, exitcodes.ENVIRONMENT)["error"]
    assert "Traceback" not in proc.stderr


def test_records_show_json_exits_as_the_plain_run(tmp_path):
    from tests.bench_support import publish_record, synthetic_record

    repo = tmp_path / "results"
    record = synthetic_record("lo-ctx4096-20260101T000000Z", {1: [100.0]})
    publish_record(repo, record)
    gate = ["--max-class-share", "indexer=2%"]  # the record carries no profile: the gate fails
    plain = cli("records", "show", record["run_id"], "--results-repo", repo, *gate)
    as_json = cli("records", "show", record["run_id"], "--results-repo", repo, *gate, "--json")
    assert plain[0] == as_json[0] == exitcodes.CHECK_FAILED, (plain, as_json)
    import json

    assert json.loads(as_json[1])["run_id"] == record["run_id"]  # the record itself, unchanged


def test_every_command_takes_json_as_the_help_says():
    from tests.core.test_cli_language import all_commands

    code, out, _ = cli("--help")
    assert "In every command --json" in " ".join(out.split())
    for name, command in all_commands():
        assert any("--json" in p.opts for p in command.params if hasattr(p, "opts")), f"{name} has no --json"


# ============================================================ 15: the same condition, the same exit code
def test_a_hung_sshd_is_unreachable_as_in_provision(tmp_path, loopback_ssh, silent_port):
    inventory = _silent_inventory(tmp_path, loopback_ssh, silent_port.port, dsv4_connect_timeout=2)
    code, out, err = cli("rollout", "status", "--host", "lo", "-i", inventory)
    assert code == exitcodes.UNREACHABLE, err
    assert "no SSH server answered within 2s" in err


def test_a_missing_vault_id_file_is_bad_input(tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_connection="local")
    code, out, err = cli("provision", "-i", inventory, "--vault-id", f"prod@{tmp_path / 'no-such-pass'}",
                         env=_HARMLESS_PLAY)
    assert code == exitcodes.USAGE, out + err
    assert f"--vault-id 'prod@{tmp_path / 'no-such-pass'}'" in err and "does not exist" in err


def test_a_python_that_is_not_a_program_is_bad_input(tmp_path):
    text = tmp_path / "python"
    text.write_text("not a program\n")  # executable, but no interpreter line: exec format error
    text.chmod(0o755)
    code, out, err = cli("rollout", "status", "--python", text)
    assert code == exitcodes.USAGE, err
    assert f"--python {text}: not an executable interpreter" in err


def test_records_refuses_a_repository_on_another_branch_as_bench_does(tmp_path):
    repo = tmp_path / "results"
    subprocess.run(["git", "init", "-q", "-b", "master", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "first"], check=True)
    code, out, err = cli("records", "list", "--results-repo", repo)
    assert code == exitcodes.USAGE, out + err
    assert "HEAD is on branch 'master'" in err and f"git -C {repo} checkout main" in err
    assert "no records" not in out


# ============================================================ 16: refuse what would be ignored
@pytest.mark.parametrize("extra, named", [
    (["--host", "box1"], "--host"),
    (["--installed"], "--installed"),
    (["--trust-new-host-key"], "--trust-new-host-key"),
    (["--wheel", "x.whl", "--results-dir", "/tmp"], "--results-dir, --wheel"),
])
def test_validate_local_refuses_the_remote_only_options(extra, named):
    code, out, err = cli("validate", "--local", *extra)
    assert code == exitcodes.USAGE, err
    assert f"{named} only apply to a run on the box" in err


def test_validate_refuses_verdict_shapes_without_the_verdict():
    code, out, err = cli("validate", "--local", "--no-verdict", "-c", "1,16")
    assert code == exitcodes.USAGE and "--no-verdict skips the verdict" in err, err


@pytest.mark.parametrize("args", [["validate", "--local", "-c", "1,,2"],
                                  ["bench", "--ctx", "4096", "-c", "1,,2", "-i", "{inv}"]])
def test_an_empty_concurrency_item_is_refused(args, tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_model_path="/models/m")
    code, out, err = cli(*[a.format(inv=inventory) for a in args], "--json")
    assert code == exitcodes.USAGE, err
    assert "--concurrency '1,,2' has an empty item" in err
    _envelope(out, code)


@pytest.mark.parametrize("option", ["--timeout", "--steady-timeout"])
def test_profile_refuses_a_negative_timeout(option):
    code, out, err = cli("profile", "--ctx", "4096", option, "-5")
    assert code == exitcodes.USAGE and option in err, err


@pytest.mark.parametrize("args", [["--skip-tags", ""], ["--tags", "preflight,,nvidia_driver"], ["--limit", ""]])
def test_provision_refuses_an_empty_name(args, tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_connection="local")
    code, out, err = cli("provision", "-i", inventory, *args, env=_HARMLESS_PLAY)
    assert code == exitcodes.USAGE, out + err
    assert f"{args[0]} {args[1]!r} has an empty name" in err


def test_a_results_dir_variable_naming_a_file_is_refused(tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh)
    afile = tmp_path / "reports"
    afile.write_text("not a directory\n")
    code, out, err = cli("rollout", "plan", "-i", inventory, env={"DSV4KIT_RESULTS_DIR": str(afile)})
    assert code == exitcodes.USAGE, out + err
    assert f"$DSV4KIT_RESULTS_DIR {str(afile)!r} is a file, not a directory" in err


# ============================================================ 19: what this audience expects
@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_names_the_commit_and_the_pins(flag):
    import yaml

    from dsv4kit import __version__

    pins = yaml.safe_load((REPO_ROOT / "inventory" / "group_vars" / "all.yml").read_text())
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    code, out, err = cli(flag)
    assert code == 0, err
    assert out.startswith(f"dsv4kit {__version__} (commit {head.strip()}")
    assert f"SGLang {pins['dsv4_sglang_version']}" in out and f"torch {pins['dsv4_torch_version']}" in out


def test_shell_completion_is_offered():
    code, out, err = cli("--show-completion", "bash")
    assert code == 0 and "_DSV4KIT_COMPLETE" in out.upper(), out + err


@pytest.mark.parametrize("flag, shows", [("--list-hosts", "lo"), ("--list-tasks", "Say so"),
                                         ("--syntax-check", "harmless_play.yml")])
def test_provision_passes_the_listing_modes_through(flag, shows, tmp_path, loopback_ssh):
    """Through the real ansible-playbook, over the same inventory and selection; nothing runs."""
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_connection="local")
    code, out, err = cli("provision", "-i", inventory, "--tags", "preflight", flag, env=_HARMLESS_PLAY)
    assert code == exitcodes.OK, out + err
    assert shows in out + err
    assert "PLAY RECAP" not in out + err  # nothing ran


# ============================================================ 20: the CLI's vocabulary, declared once
def test_a_shared_option_has_one_help_text_everywhere():
    """--trust-new-host-key had four help texts; every option two commands take is declared once,
    in core.options, with one short help text."""
    from tests.core.test_cli_language import all_commands

    takers: dict = {}
    helps: dict = {}
    for name, command in all_commands():
        for param in command.params:
            for opt in getattr(param, "opts", []) + getattr(param, "secondary_opts", []):
                takers.setdefault(opt, set()).add(name)
                helps.setdefault(opt, {}).setdefault(param.help, []).append(name)
    shared = {opt for opt, names in takers.items() if len(names) > 1}
    assert {"--trust-new-host-key", "--inventory", "--host", "--json", "--timeout", "-c", "--ab"} <= shared
    for opt in shared:
        texts = helps[opt]
        assert len(texts) == 1, f"{opt} has {len(texts)} help texts: {texts}"
        (text,) = texts
        assert text and len(text) <= 120, f"{opt}: one short line, the story in docs/cli.md"


def test_every_help_line_is_short():
    """One short line per option; the long story is in docs/ (docs/cli.md and the command's page)."""
    from tests.core.test_cli_language import all_commands

    long = [(name, param.opts, len(param.help)) for name, command in all_commands() for param in command.params
            if len(param.help or "") > 160]
    assert long == [], f"shorten these help texts (the story goes in docs/): {long}"


def _declared_options(path: Path) -> dict:
    """{option name: [where]} for every typer.Option(...) literal in a module."""
    import ast

    found: dict = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Option":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                    for name in arg.value.split("/"):
                        found.setdefault(name, []).append(f"{path.name}:{node.lineno}")
    return found


def test_no_option_name_is_declared_in_two_places():
    """An option two commands take is a typed alias in core.options; the command modules never
    declare the same name twice (one meaning, one help text)."""
    commands = REPO_ROOT / "toolkit" / "commands"
    places: dict = {}
    for path in sorted(commands.glob("*.py")):
        for name, where in _declared_options(path).items():
            places.setdefault(name, []).extend(where)
    twice = {name: where for name, where in places.items() if len(where) > 1}
    assert twice == {}, f"declare these once in toolkit/core/options.py: {twice}"
    assert _declared_options(REPO_ROOT / "toolkit" / "core" / "options.py")


def test_the_duplicate_finder_can_fail(tmp_path):
    module = tmp_path / "two.py"
    module.write_text('import typer\ndef a(x=typer.Option(None, "--limit")): ...\n'
                      'def b(y=typer.Option(None, "--limit", "-l")): ...\n')
    assert len(_declared_options(module)["--limit"]) == 2


def test_the_formatter_setting_is_in_pyproject():
    import re

    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert re.search(r"^\[tool\.black\]\nline-length = 120$", text, re.M), "no [tool.black] line-length"


def test_one_cli_runner_serves_the_tests():
    """tests/cli_support (cli, invoke) is the one in-process run of dsv4kit; no test module keeps
    its own: no typer test runner of its own, no copy of the wrapper."""
    needle = "result.exit_code, " + "result.stdout, result.stderr"  # split: this file holds no copy
    runner = "Cli" + "Runner"
    copies = [path.relative_to(REPO_ROOT) for path in (REPO_ROOT / "tests").rglob("*.py")
              if path.name != "cli_support.py" and (needle in path.read_text() or runner in path.read_text())]
    assert copies == [], f"use tests.cli_support.cli (or invoke) instead of a runner of its own in {copies}"