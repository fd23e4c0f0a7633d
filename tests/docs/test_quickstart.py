"""docs/quickstart.md and the README only show ``dsv4kit`` command lines that the CLI accepts, the
walkthrough covers what a first box needs, and its by-hand weights check works."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from dsv4kit.core import ssh
from dsv4kit.cli import app
from dsv4kit.core.inventory import load_inventory
from dsv4kit.provision.playbook import ProvisionError, check_tags, default_playbook
from tests.remote_inventory import write_inventory

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
SHOWN_IN = [QUICKSTART, ROOT / "README.md"]


def shown_commands(text: str) -> list[tuple[str, bool]]:
    """``(line, complete)``: the ``dsv4kit ...`` lines of code blocks (continuations joined), which
    must run as shown, and inline code spans, which may name a command without its required
    options (`dsv4kit bench`) but must use real subcommands and options."""
    found = []
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    for block in blocks:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("dsv4kit"):
                found.append((line, True))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`(dsv4kit\s[^`]*)`", prose):
        words = span.split()
        if words[1].endswith(":"):
            continue  # a log line's prefix ("dsv4kit rollout: ..."), not a command
        found.append((" ".join(words), False))
    return found


def parse_error(line: str, complete: bool = True):
    """None when the CLI accepts ``line`` (parsed, not run), else the CLI's own message. An
    incomplete line may leave out required options and arguments."""
    argv = shlex.split(line, comments=True)[1:]
    command, path = typer.main.get_command(app), ["dsv4kit"]
    while hasattr(command, "list_commands"):  # a group: the next word names a subcommand
        if not argv or argv[0].startswith("-"):
            return None if argv[:1] in (["--version"], ["--help"]) else f"{line!r}: no subcommand"
        sub = command.get_command(command.context_class(command), argv[0])
        if sub is None:
            return f"{line!r}: no command {argv[0]!r} under {' '.join(path)}"
        path.append(argv.pop(0))
        command = sub
    if not argv and not complete:
        return None  # the command's name alone
    try:
        context = command.make_context(" ".join(path), argv)
    except Exception as exc:  # click's UsageError / BadParameter, from whichever click typer uses
        if not hasattr(exc, "format_message"):
            raise
        if not complete and type(exc).__name__ == "MissingParameter":
            return None  # unknown options were rejected before this; only required ones are missing
        return f"{line!r}: {exc.format_message()}"
    if path == ["dsv4kit", "provision"]:  # stage names are checked when it runs; check them here
        try:
            check_tags(default_playbook(), tags=context.params.get("tags"), skip_tags=context.params.get("skip_tags"))
        except ProvisionError as exc:
            return f"{line!r}: {exc}"
    return None


@pytest.mark.parametrize("doc", SHOWN_IN, ids=lambda p: p.name)
def test_every_dsv4kit_command_shown_parses(doc):
    commands = shown_commands(doc.read_text())
    assert commands
    errors = [e for e in (parse_error(line, complete) for line, complete in commands) if e]
    assert not errors, "\n".join(errors)


def test_the_parse_check_catches_bad_lines():
    assert parse_error("dsv4kit bench --ctx 131072") is None
    assert parse_error("dsv4kit records show RUN_ID --results-repo x") is None
    assert parse_error("dsv4kit bench", complete=False) is None
    assert parse_error("dsv4kit bench") and parse_error("dsv4kit bench --no-such", complete=False)
    for bad in ("dsv4kit bench --ctx abc", "dsv4kit validate --gpu 7 --no-such-option",
                "dsv4kit nope", "dsv4kit records frobnicate", "dsv4kit records show a b",
                "dsv4kit provision --skip-tags flash-attn"):
        assert parse_error(bad), bad


def test_the_walkthrough_covers_a_first_box():
    text = QUICKSTART.read_text()
    commands = [line for line, complete in shown_commands(text) if complete]
    for wanted in ("dsv4kit provision", "dsv4kit validate --gpu 7", "dsv4kit bench --ctx 131072", "dsv4kit monitor"):
        assert any(c.startswith(wanted) for c in commands), wanted
    for wanted in ("ssh-keyscan", "known_hosts", "ssh-keygen -lf", "deepseek-ai/DeepSeek-V4-Flash",
                   "dsv4_model_revision", "dsv4_model_path", "dsv4_service_user", "--inventory",
                   "DSV4KIT_INVENTORY", "systemctl status", "rollout.md#rollback", "provisioning.md#rollback"):
        assert wanted in text, wanted
    defaults = yaml.safe_load((ROOT / "playbooks/roles/sglang_service/defaults/main.yml").read_text())
    for unit in defaults["sglang_service_unit_names"]:
        name = unit.removesuffix(".service")
        assert f"journalctl -u {name}" in text and f"systemctl status {name}" in text, unit
    # The inventory is edited in a copy of the user's own, never in the checkout.
    edited = re.findall(r"\$EDITOR\s+(\S+)", text)
    assert edited and all(path.startswith("~/dsv4/inventory/") for path in edited), edited
    # the monitoring step's picture is there, drawn from the monitoring journey's Prometheus
    pictures = re.findall(r"!\[[^\]]*simulated box\]\((images/[^)]+\.png)\)", text)
    assert pictures and all((ROOT / "docs" / p).stat().st_size > 20_000 for p in pictures), pictures


def test_readme_links_the_quickstart_first():
    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| [docs/")]
    assert rows[0].startswith("| [docs/quickstart.md](docs/quickstart.md) |")


def _weights_check_script() -> str:
    text = QUICKSTART.read_text()
    match = re.search(r"python3 - /tmp/v4flash-files\.json \S+ <<'EOF'\n(.*?)\nEOF\n", text, re.S)
    assert match, "the weights check is gone from docs/quickstart.md"
    return match.group(1)


def _git_blob_id(data: bytes, tmp_path: Path) -> str:
    path = tmp_path / "blob"
    path.write_bytes(data)
    return subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def test_the_weights_check_accepts_a_match_and_names_each_mismatch(tmp_path):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    big, small = b"\x01\x02" * 50_000, b'{"architectures": ["DeepseekV4ForCausalLM"]}\n'
    (model / "sub" / "model-00001.safetensors").write_bytes(big)
    (model / "config.json").write_bytes(small)
    meta = {"sha": "0" * 40, "siblings": [
        {"rfilename": "sub/model-00001.safetensors", "size": len(big), "blobId": "x" * 40,
         "lfs": {"sha256": hashlib.sha256(big).hexdigest(), "size": len(big), "pointerSize": 134}},
        {"rfilename": "config.json", "size": len(small), "blobId": _git_blob_id(small, tmp_path)},
    ]}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    script = tmp_path / "check.py"
    script.write_text(_weights_check_script())

    def check():
        return subprocess.run([sys.executable, str(script), str(tmp_path / "meta.json"), str(model)],
                              capture_output=True, text=True, timeout=60)

    ok = check()
    assert ok.returncode == 0 and "all files match" in ok.stdout, ok.stdout + ok.stderr
    assert "2 files" in ok.stdout

    (model / "config.json").write_bytes(small.replace(b"V4", b"V3"))  # same size, other bytes
    (model / "sub" / "model-00001.safetensors").unlink()
    bad = check()
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "MISMATCH config.json" in bad.stdout and "MISMATCH sub/model-00001.safetensors" in bad.stdout


def _fingerprints(path: Path) -> set[str]:
    listing = subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True, check=True,
                             timeout=60).stdout
    return {line.split()[1] for line in listing.splitlines() if line.strip()}


def test_the_host_key_step_works_against_a_real_sshd(tmp_path, loopback_ssh):
    """Section 3 as written, against the loopback sshd: scan, compare fingerprints with the box's
    own key files, append to a known_hosts, and dsv4kit's SSH layer then connects with it."""
    text = QUICKSTART.read_text()
    scan = re.search(r"^(ssh-keyscan .*?) > /tmp/box1\.keys", text, re.M).group(1)
    argv = shlex.split(scan.replace("-p 22", f"-p {loopback_ssh.port}").replace("192.0.2.10", loopback_ssh.host))
    keys = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    assert f"[{loopback_ssh.host}]:{loopback_ssh.port} " in keys  # filed under the address and port
    scanned = tmp_path / "box1.keys"
    scanned.write_text(keys)
    assert _fingerprints(scanned) == _fingerprints(loopback_ssh.host_key.with_suffix(".pub"))
    known = tmp_path / "known_hosts"
    known.write_text(keys)
    host = load_inventory(write_inventory(tmp_path / "inv", loopback_ssh, dsv4_known_hosts=str(known))).host()
    with ssh.open_session(host) as session:
        assert session.run("echo ok", timeout=20).stdout == "ok\n"
