"""The README's CPU install line gives a CPU torch from a clean pip configuration: the pin that
tests/run.sh installs, from PyTorch's own CPU index as the only index (the default index's
``torch==2.13.0`` is the CUDA build)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def test_the_readme_installs_the_cpu_torch_that_tests_run_sh_pins():
    pin = re.search(r'^TORCH_PIN="([^"]+)"', (ROOT / "tests/run.sh").read_text(), re.MULTILINE).group(1)
    readme = (ROOT / "README.md").read_text()
    shown = re.findall(r"`(pip install torch[^`]*)`", readme)  # inline, or a line of a code block
    shown += re.findall(r"^(pip install torch\b.*)$", readme, re.MULTILINE)
    commands = [shlex.split(c) for c in shown]
    assert commands, "the README gives no `pip install torch...` line"
    for argv in commands:
        assert pin in argv, f"{argv}: not the pin tests/run.sh installs ({pin})"
        # --index-url replaces the default index (an --extra-index-url would still offer PyPI's CUDA build).
        assert "--index-url" in argv and argv[argv.index("--index-url") + 1] == CPU_INDEX, argv
        assert "--extra-index-url" not in argv, argv


def test_the_readme_first_block_runs_in_order_from_a_fresh_clone():
    """Followed literally on a CPU machine: clone, cd, venv, the CPU torch BEFORE the install that
    would otherwise pull the CUDA build, then validate; and what a CPU run shows is expected."""
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    lines = [line.strip() for line in first.splitlines() if line.strip() and not line.strip().startswith("#")]

    def at(prefix: str) -> int:
        found = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        assert found, f"the README's first block has no `{prefix} ...` line:\n{first}"
        return found[0]

    order = [at("git clone"), at("cd "), at("python3 -m venv"), at("source "), at("pip install torch"),
             at("pip install -e"), at("dsv4kit validate --local")]
    assert order == sorted(order), f"out of order: {lines}"
    assert not any("&&" in line for line in lines), "one step a line, so a failed one stops there"
    assert "SKIPPED" in readme and "not measured" in readme  # what a CPU run shows is said to be expected
    assert re.search(r"\((?:under|about|a few|several) [^)]*minute", first), "expected durations"
