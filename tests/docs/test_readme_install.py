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
    commands = [shlex.split(c) for c in re.findall(r"`(pip install torch[^`]*)`", readme)]
    assert commands, "the README gives no `pip install torch...` line"
    for argv in commands:
        assert pin in argv, f"{argv}: not the pin tests/run.sh installs ({pin})"
        # --index-url replaces the default index (an --extra-index-url would still offer PyPI's CUDA build).
        assert "--index-url" in argv and argv[argv.index("--index-url") + 1] == CPU_INDEX, argv
        assert "--extra-index-url" not in argv, argv
