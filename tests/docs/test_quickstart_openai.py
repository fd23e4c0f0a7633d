"""The quickstart's last step as written: its ``openai`` client example runs against the stand-in
server's chat route (SGLang 0.5.23's own DeepSeek-V4 chat encoding and parser, tests/chat_standin.py)
and prints exactly the expected output the page shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import chat_faults

DOC = Path(__file__).resolve().parents[2] / "docs/quickstart.md"


def _blocks(text: str) -> tuple[str, str]:
    last = text.split("## 11.", 1)[1]
    code = re.search(r"```python\n(.*?)```", last, re.DOTALL)
    expected = re.search(r"Expected output:\s*```text\n(.*?)```", last, re.DOTALL)
    assert code and expected, "section 11 lost its example or its expected output"
    return code[1], expected[1]


@pytest.fixture(scope="module")
def server(chat_server_factory):
    return chat_server_factory("openai")


def test_the_openai_client_example_prints_what_the_quickstart_says(server, tmp_path):
    code, expected = _blocks(DOC.read_text())
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "DSV4KIT_URL": f"http://127.0.0.1:{server.port}"}
    env.pop("DSV4KIT_API_KEY", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == expected, (done.stdout, expected)


def test_the_example_fails_when_the_parsers_are_off(server, tmp_path):
    """The same example against servers without the parsers: no tool_calls, so it cannot print the
    expected output (the check above is not vacuous)."""
    code, expected = _blocks(DOC.read_text())
    chat_faults(server, ["parsers_off"])
    try:
        script = tmp_path / "example.py"
        script.write_text(code)
        env = {**os.environ, "DSV4KIT_URL": f"http://127.0.0.1:{server.port}"}
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
        assert done.stdout != expected and done.returncode != 0, (done.stdout, done.stderr[-2000:])
    finally:
        chat_faults(server)
