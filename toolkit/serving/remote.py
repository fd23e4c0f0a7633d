"""The box-side steps of a sweep over one SSH session (``Remote``), and the context-length restart.

Each remote step has a timeout. ``Remote.setup`` copies the box-side package
(``dsv4kit.serving.box``, with ``core/unit_env.py``) into a scratch directory on the box as
``dsv4box``; the other methods run its commands there (``python -m dsv4box``).
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from pathlib import Path
from typing import Callable, Optional

from dsv4kit.core import box_paths, exitcodes
from dsv4kit.serving.abort import ServingAbort

#: Timeouts of the short box-side steps, and of the probe (it reads the model files).
SMALL_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 120.0
#: The playbook tag that re-renders and restarts the serving units.
RESTART_TAG = "sglang_service"

#: The name the box-side package (``dsv4kit.serving.box``) has in the scratch directory on the box.
BOX_PACKAGE = "dsv4box"


class Remote:
    """The box-side steps over one SSH session."""

    def __init__(self, session, host, progress: Callable[[str], None]):
        self.session = session
        self.host = host
        self.progress = progress
        self.python = host.venv_python
        self.workdir: Optional[str] = None

    def setup(self) -> None:
        check = self.session.run(f"test -x {shlex.quote(self.python)}", timeout=SMALL_TIMEOUT_S, check=False)
        if check.exit_code != 0:
            raise ServingAbort(exitcodes.ENVIRONMENT,
                               f"{self.host.name}: no SGLang venv python at {self.python} (dsv4_venv_dir); "
                               f"run `dsv4kit provision` first")
        # <dsv4_state_dir>/scratch/bench-XXXXXXXX (as validate does), else the box's temp dir.
        scratch = f"{str(self.host.get('dsv4_state_dir') or '/var/lib/dsv4kit').rstrip('/')}/scratch"
        made = self.session.run(
            f"mkdir -p {shlex.quote(scratch)} 2>/dev/null && mktemp -d {shlex.quote(scratch)}/bench-XXXXXXXX "
            f"|| mktemp -d -t dsv4kit-bench.XXXXXXXX", timeout=SMALL_TIMEOUT_S)
        self.workdir = made.stdout.strip().splitlines()[-1]
        from dsv4kit.core import unit_env

        self.session.run(f"mkdir -p {shlex.quote(self.workdir + '/' + BOX_PACKAGE)}", timeout=SMALL_TIMEOUT_S)
        for module in (*sorted(Path(__file__).with_name("box").glob("*.py")), Path(unit_env.__file__)):
            self.session.put(module, f"{self.workdir}/{BOX_PACKAGE}/{module.name}")

    def box_command(self, *args: str) -> list:
        """The argv of one box-side command (run with ``cwd`` = the scratch directory)."""
        return [self.python, "-m", BOX_PACKAGE, *args]

    def restart_units(self, progress: Callable[[str], None], timeout: float) -> None:
        """``systemctl restart`` of the serving units the probe found (``sudo -n`` unless root):
        a plain restart, nothing reconfigured (``--restarts``)."""
        if not getattr(self, "units", None):
            raise ServingAbort(exitcodes.ENVIRONMENT, f"{self.host.name}: --restarts needs the dsv4-*.service units, "
                                                      f"and none were found (run `dsv4kit provision`)")
        names = " ".join(shlex.quote(f"{u}.service") for u in self.units)
        result = self.session.run(f'if [ "$(id -u)" = 0 ]; then systemctl restart {names}; '
                                  f'else sudo -n systemctl restart {names}; fi', timeout=timeout, check=False)
        if result.exit_code != 0:
            raise ServingAbort(exitcodes.TOOL_FAILED, f"{self.host.name}: restarting {names} failed (exit "
                                                      f"{result.exit_code}): {(result.stderr or result.stdout)[-800:]}")

    def cleanup(self) -> None:
        if self.workdir and ".." not in self.workdir and re.fullmatch(
                r"/[\w./-]*/(bench-|dsv4kit-bench\.)\w+", self.workdir):
            try:
                self.session.run(f"rm -rf {shlex.quote(self.workdir)}", timeout=SMALL_TIMEOUT_S, check=False)
            except Exception as exc:  # best effort; the directory is in the box's temp dir
                self.progress(f"warning: could not remove {self.workdir} on {self.host.name}: {exc}")
        self.workdir = None

    def helper(self, *args: str, timeout: float = SMALL_TIMEOUT_S, env: Optional[dict] = None) -> dict:
        command = shlex.join(self.box_command(*args))
        result = self.session.run(command, timeout=timeout, env=env, cwd=self.workdir, check=False)
        lines = [l for l in result.stdout.splitlines() if l.strip()]
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            raise ServingAbort(exitcodes.TOOL_FAILED,
                               f"{self.host.name}: bench helper {args[0]} gave no JSON (exit {result.exit_code}): "
                               f"{(result.stderr or result.stdout).strip()[-800:]}") from None

    def server_info(self, port: int, env: Optional[dict]) -> dict:
        answer = self.helper("server-info", "--port", str(port), env=env)
        if not answer.get("ok"):
            raise ServingAbort(exitcodes.ENVIRONMENT,
                               f"{self.host.name}: {answer.get('error')}; is the serving unit running? "
                               f"(`dsv4kit provision` starts it)")
        return answer["server_info"]

    def wait_health(self, ports: list[int], timeout: float, env: Optional[dict]) -> None:
        answer = self.helper("wait-health", "--ports", ",".join(str(p) for p in ports), "--timeout",
                             str(timeout), timeout=timeout + SMALL_TIMEOUT_S, env=env)
        if not answer.get("ok"):
            raise ServingAbort(exitcodes.TIMEOUT,
                               f"{self.host.name}: serving ports {answer.get('pending')} not healthy after "
                               f"{timeout:g}s: {answer.get('last_error')}")

    def probe(self) -> dict:
        return self.helper("probe", "--model-path", str(self.host.get("dsv4_model_path") or ""),
                           "--state-dir", str(self.host.get("dsv4_state_dir") or ""),
                           "--unit-dir", box_paths.unit_dir(self.host),
                           "--decision-file", box_paths.decision_file(self.host), timeout=PROBE_TIMEOUT_S)

    def fetch_json(self, remote_file: str, label: str) -> dict:
        with tempfile.TemporaryDirectory(prefix="dsv4kit-point-") as tmp:
            local = Path(tmp) / "evidence.json"
            try:
                self.session.get(remote_file, local)
                return json.loads(local.read_text())
            except (OSError, ValueError) as exc:
                raise ServingAbort(exitcodes.TOOL_FAILED, f"{label}: the box-side evidence file {remote_file} "
                                                          f"could not be read: {exc}") from None

    def fetch_line(self, remote_file: str, label: str) -> dict:
        with tempfile.TemporaryDirectory(prefix="dsv4kit-point-") as tmp:
            local = Path(tmp) / "point.jsonl"
            self.session.get(remote_file, local)
            lines = [l for l in local.read_text().splitlines() if l.strip()]
        if len(lines) != 1:
            raise ServingAbort(exitcodes.TOOL_FAILED,
                               f"{label}: expected one result line in {remote_file}, found {len(lines)}")
        try:
            return json.loads(lines[0])
        except ValueError as exc:
            raise ServingAbort(exitcodes.TOOL_FAILED, f"{label}: the client's result line is not JSON: {exc}") from None



def restart_units(inventory_path, host, tags: list, extra_vars: dict, what: str,
                  progress: Callable[[str], None], timeout: float) -> None:
    """Re-run the playbook's ``tags`` on ``host`` with ``extra_vars``; ServingAbort naming ``what``
    (e.g. "with context length 8192") when it cannot run or fails."""
    from dsv4kit.provision import playbook as provision

    try:
        summary = provision.run_playbook(inventory_path, limit=host.name, tags=tags, extra_vars=extra_vars,
                                         progress=lambda line: progress(f"  ansible: {line}"), timeout=timeout)
    except provision.ProvisionError as exc:  # no ansible-playbook, no playbook: nothing ran
        raise ServingAbort(exc.exit_code, f"cannot restart the serving units {what}: {exc}") from None
    if summary.failed:
        raise ServingAbort(exitcodes.TIMEOUT if summary.timed_out else exitcodes.TOOL_FAILED,
                           f"restarting the serving units {what} failed "
                           f"(ansible-playbook exit {summary.returncode}):\n{summary.stdout_tail[-1500:]}")


def default_restart(inventory_path, host, context_length: int, progress: Callable[[str], None],
                    timeout: float) -> None:
    """Re-run the playbook's serving tag with the new context length (same settings as provision;
    an ``auto`` setting as ``dsv4kit.serving.pins.pin_running`` pinned it)."""
    from dsv4kit.serving.pins import pinned_settings

    restart_units(inventory_path, host, [RESTART_TAG], {"dsv4_context_length": context_length, **pinned_settings(host)},
                  f"with context length {context_length}", progress, timeout)


