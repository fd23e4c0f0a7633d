"""A missing third-party package anywhere in the CLI: exit 5 and one line naming the package and the
install command, never a traceback (dsv4kit.core.missing).

"Missing" is made real in a subprocess: a directory first on PYTHONPATH holds a package of that name
whose import fails exactly as an absent one does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4kit.core import exitcodes

from dsv4kit.core import missing
from tests.bench_support import publish_record, synthetic_record


def _blocker(directory: Path, *names: str) -> Path:
    for name in names:
        package = directory / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    return directory


def _run(cmd, blocked: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(blocked)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def _assert_one_line(done: subprocess.CompletedProcess, package: str, extra: str) -> None:
    assert done.returncode == exitcodes.ENVIRONMENT, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    # Ours is one line, the last; a library's own warning about the same package may precede it.
    ours = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and done.stderr.strip().splitlines()[-1] == ours[0], done.stderr
    assert f"'{package}' is missing" in ours[0]
    assert ours[0].endswith(missing.install_command(extra)), ours[0]


def test_validate_local_without_numpy_is_exit_5_naming_the_gpu_extra(tmp_path):
    # The first README command on a venv without numpy: Triton's interpreter imports it.
    blocked = _blocker(tmp_path / "blocked", "numpy")
    done = _run([sys.executable, "-m", "dsv4kit.cli", "validate", "--local", "--interpret",
                 "--cases", "indexer:3x1x64"], blocked)
    _assert_one_line(done, "numpy", "gpu")


def test_the_console_script_without_the_cli_stack_is_exit_5(tmp_path):
    # As on the GPU box, where the wheel goes in with --no-deps: typer is not there.
    script = Path(sys.executable).parent / "dsv4kit"
    if not script.exists():
        pytest.skip(f"no dsv4kit console script beside {sys.executable}")
    blocked = _blocker(tmp_path / "blocked", "typer")
    done = _run([str(script), "--version"], blocked, timeout=120)
    _assert_one_line(done, "typer", "")


def test_records_plot_without_matplotlib_is_exit_5_naming_the_plot_extra(tmp_path):
    repo = tmp_path / "results"
    record = synthetic_record("lo-ctx4096-20260101T000000Z", {1: [100.0, 101.0], 16: [500.0, 502.0]})
    publish_record(repo, record)
    blocked = _blocker(tmp_path / "blocked", "matplotlib")
    done = _run([sys.executable, "-m", "dsv4kit.cli", "records", "plot", "--results-repo", str(repo),
                 "-o", str(tmp_path / "p.png")], blocked, timeout=120)
    _assert_one_line(done, "matplotlib", "plot")
    assert not (tmp_path / "p.png").exists()


def test_a_missing_dsv4kit_module_keeps_its_traceback():
    # Our own module missing is a packaging bug, not the user's environment.
    with pytest.raises(ModuleNotFoundError):
        with missing.missing_package_exit():
            import dsv4kit.no_such_module  # noqa: F401


def test_messages_name_the_distribution_and_the_extra(monkeypatch):
    monkeypatch.setattr(missing, "_editable_checkout", lambda: "/src/dsv4kit")
    assert missing.message("yaml").endswith("'pyyaml' is missing (import yaml); "
                                            "install it with: pip install -e '/src/dsv4kit'")
    assert missing.message("triton.language").endswith("pip install -e '/src/dsv4kit[gpu]'")
    monkeypatch.setattr(missing, "_editable_checkout", lambda: None)
    assert missing.message("matplotlib.pyplot").endswith("pip install 'dsv4kit[plot]'")
    assert missing.message("markupsafe").endswith("'markupsafe' is missing (import markupsafe); "
                                                  "install it with: pip install markupsafe")


def test_each_named_extra_declares_the_package_it_is_named_for():
    # The message's install command must install what is missing (the installed metadata).
    import re
    from importlib.metadata import requires

    declared: dict = {}
    for line in requires("dsv4kit") or []:
        spec, _, marker = line.partition(";")
        extra = re.search(r"extra == .([\w-]+).", marker)
        name = re.split(r"[<>=!~\[ (]", spec.strip(), maxsplit=1)[0].lower()
        declared.setdefault(extra[1] if extra else "", set()).add(name)
    for module, (package, extra) in missing.PROVIDERS.items():
        assert package in declared.get(extra, set()), f"{module}: {package} is not in the {extra or 'base'} dependencies"
