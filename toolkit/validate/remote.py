"""Remote validation over SSH: ``dsv4kit validate --gpu N``.

Steps, each bounded by a timeout:

1. Load the host from the inventory (and, without ``--gpu``, its ``dsv4_validate_gpu``); check
   ``--cases``, ``--results-dir`` and ``--output``, then the key file and known_hosts
   (``dsv4kit.core.cli_common.check_hosts``) here (bad input fails before any build or SSH).
2. Build this checkout's wheel (or take ``--wheel``; nothing with ``--installed``).
3. Connect (host key verified against known_hosts; see ``dsv4kit.core.ssh``).
4. Preflight on the box: the venv directory and its python exist, which GPUs exist
   (``nvidia-smi -L``, else torch in the venv), whether SGLang is importable.
5. Copy the wheel to ``<dsv4_state_dir>/scratch/validate-<stamp>`` and install it there with
   ``pip install --no-deps --target`` (unpacked when the venv has no pip; the venv itself is never
   modified), unless ``--installed``.
6. Run ``python -m dsv4kit.validation.harness`` with the venv python, ``CUDA_VISIBLE_DEVICES=N``
   and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (so N is nvidia-smi's index), streaming its lines, under a
   hard timeout that kills the remote process group.
7. Fetch the JSON report, add a ``remote`` section (host, GPU, wheel hash, host-key fingerprint),
   keep it as ``<results-dir>/<host>-gpu<N>-<UTC stamp>.json``, print the table.
8. Remove the scratch directory.

Exit codes (``dsv4kit.core.exitcodes``): 0 all cases passed, 1 a case failed, 2 bad input (inventory,
no GPU given or configured, --cases, --wheel, an unwritable --results-dir or --output), 3 unreachable /
authentication / host key, 4 timeout, 5 environment (no venv, no python, GPU absent, a report that
cannot be written), 6 a driven tool failed (wheel build, pip, harness crash), 130 interrupted.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from dsv4kit.core import exitcodes, host_limits
from dsv4kit.core.paths import cannot_write, results_dir_or_default

PREFLIGHT_TIMEOUT_S = 180.0  # importing torch on a cold box can take a while
INSTALL_TIMEOUT_S = 300.0
SMALL_TIMEOUT_S = 60.0
REPORT_NAME = "report.json"
_NVIDIA_SMI_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: [^)]*\))?\s*$")


class ValidationAbort(exitcodes.Abort):
    """Stop the remote validation with this exit code and message."""


@dataclass
class BoxFacts:
    """What the preflight found on the box."""

    venv_ok: bool = False
    python_version: Optional[str] = None
    python_error: str = ""
    gpus: list[tuple[int, str]] = field(default_factory=list)
    gpu_source: str = "none"  # "nvidia-smi", "torch", or "none"
    gpu_query_notes: list[str] = field(default_factory=list)
    torch_cuda_count: Optional[int] = None
    probe: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- pure helpers
def parse_nvidia_smi_list(text: str) -> list[tuple[int, str]]:
    """``nvidia-smi -L`` output -> [(index, name)]; lines that are not GPU lines are ignored."""
    found = []
    for line in text.splitlines():
        match = _NVIDIA_SMI_LINE.match(line.strip())
        if match:
            found.append((int(match.group(1)), match.group(2).strip()))
    return found


def describe_gpus(gpus: list[tuple[int, str]]) -> str:
    if not gpus:
        return "none"
    return ", ".join(f"{index}: {name}" for index, name in gpus)


def check_gpu(gpu: int, facts: BoxFacts, interpret: bool, host_name: str) -> Optional[str]:
    """The reason GPU ``gpu`` cannot be used for this run, or None when it can (or need not)."""
    if interpret:
        return None  # the Triton interpreter runs on the CPU, asked for explicitly
    notes = "; ".join(facts.gpu_query_notes)
    if not facts.gpus:
        return (
            f"GPU {gpu} absent on {host_name}: no NVIDIA GPU found ({notes or 'nothing reported'}). "
            "Pass --interpret to run the kernels on the box's CPU through the Triton interpreter."
        )
    if gpu not in {index for index, _ in facts.gpus}:
        return (
            f"GPU {gpu} absent on {host_name}: it has {len(facts.gpus)} GPU(s) "
            f"({describe_gpus(facts.gpus)}; from {facts.gpu_source})"
        )
    if facts.torch_cuda_count is not None and facts.torch_cuda_count <= gpu:
        error = facts.probe.get("torch_error") or facts.probe.get("cuda_error") or ""
        return (
            f"GPU {gpu} is listed by {facts.gpu_source} on {host_name} but torch in the venv sees only "
            f"{facts.torch_cuda_count} CUDA device(s)" + (f" ({error})" if error else "")
        )
    return None


def report_filename(host_name: str, gpu: int, when: datetime) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", host_name)
    return f"{safe}-gpu{gpu}-{when.strftime('%Y%m%dT%H%M%SZ')}.json"


def format_table(report: dict) -> list[str]:
    """The validation table from a harness JSON report."""
    from dsv4kit.validation.rows import row_from_json

    lines = []
    for suite, body in report.get("suites", {}).items():
        for row in body.get("rows", []):
            lines.append(row_from_json(row).line())
        lines.append(f"{suite}: {'PASS' if body.get('passed') else 'FAIL'}")
    return lines


# --------------------------------------------------------------------------- box-side scripts
def _preflight_script(venv: str, python: str) -> str:
    probe = (
        "import importlib.util as u, json, sys\n"
        "r = {'python': '%d.%d.%d' % sys.version_info[:3]}\n"
        "for m in ('triton', 'sglang', 'dsv4kit'):\n"
        "    s = u.find_spec(m)\n"
        "    r[m] = (s.origin or (list(s.submodule_search_locations or []) or [''])[0]) if s else None\n"
        "if len(sys.argv) > 1:\n"
        "    try:\n"
        "        import torch\n"
        "        r['torch'] = torch.__version__\n"
        "        r['cuda_count'] = torch.cuda.device_count()\n"
        "        r['cuda_names'] = [torch.cuda.get_device_name(i) for i in range(r['cuda_count'])]\n"
        "    except Exception as e:\n"
        "        r['torch_error'] = '%s: %s' % (type(e).__name__, e)\n"
        "print('probe=' + json.dumps(r))\n"
    )
    v, py = shlex.quote(venv), shlex.quote(python)
    return f"""
if [ ! -d {v} ]; then echo venv=missing; exit 0; fi
echo venv=ok
if [ ! -e {py} ]; then echo python=missing; exit 0; fi
if [ ! -x {py} ]; then echo python=not-executable; exit 0; fi
if command -v nvidia-smi >/dev/null 2>&1; then
  if gpus=$(timeout -k 5 30 nvidia-smi -L 2>&1); then
    printf '%s\\n' "$gpus" | sed 's/^/nvidia_smi=/'; echo nvidia_smi_rc=0
  else
    echo "nvidia_smi_rc=$?"; printf '%s\\n' "$gpus" | tail -n 2 | sed 's/^/nvidia_smi_error=/'
  fi
else
  echo nvidia_smi_rc=absent
fi
timeout -k 5 120 {py} -c {shlex.quote(probe)} torch 2>&1 | tail -n 5
"""


def parse_preflight(output: str) -> BoxFacts:
    facts = BoxFacts()
    smi_lines, smi_rc, smi_errors = [], None, []
    for line in output.splitlines():
        key, _, value = line.partition("=")
        if key == "venv":
            facts.venv_ok = value == "ok"
        elif key == "python" and value in ("missing", "not-executable"):
            facts.python_error = value
        elif key == "nvidia_smi":
            smi_lines.append(value)
        elif key == "nvidia_smi_rc":
            smi_rc = value
        elif key == "nvidia_smi_error":
            smi_errors.append(value.strip())
        elif key == "probe":
            try:
                facts.probe = json.loads(value)
            except ValueError:
                facts.python_error = f"probe output unreadable: {value[:200]}"
    if facts.venv_ok and not facts.python_error:
        if not facts.probe:
            tail = [l for l in output.splitlines() if "=" not in l or not l.split("=")[0].isidentifier()]
            facts.python_error = "broken: " + (" | ".join(tail[-3:]) or "no output")
        else:
            facts.python_version = facts.probe.get("python")
    if "cuda_count" in facts.probe:
        facts.torch_cuda_count = int(facts.probe["cuda_count"])
    smi_gpus = parse_nvidia_smi_list("\n".join(smi_lines))
    if smi_rc == "0" and smi_gpus:
        facts.gpus, facts.gpu_source = smi_gpus, "nvidia-smi -L"
    else:
        if smi_rc == "absent":
            facts.gpu_query_notes.append("nvidia-smi is not installed")
        elif smi_rc == "0":
            facts.gpu_query_notes.append("nvidia-smi -L lists no GPU")
        elif smi_rc == "124":
            facts.gpu_query_notes.append("nvidia-smi -L hung and was stopped after 30 s")
        elif smi_rc is not None:
            facts.gpu_query_notes.append(f"nvidia-smi -L failed (exit {smi_rc}): {' '.join(smi_errors)[:300]}")
        names = facts.probe.get("cuda_names") or []
        if names:
            facts.gpus, facts.gpu_source = list(enumerate(names)), "torch in the venv"
        elif "torch_error" in facts.probe:
            facts.gpu_query_notes.append(f"torch in the venv failed: {facts.probe['torch_error']}")
        elif facts.probe:
            facts.gpu_query_notes.append(
                f"torch {facts.probe.get('torch', '?')} in the venv sees 0 CUDA devices")
    return facts


# --------------------------------------------------------------------------- the run
@dataclass
class Output:
    """Where the run writes: ``out`` for the streamed lines and the table, ``err`` for progress."""

    out: Callable[[str], None]
    err: Callable[[str], None]


def _default_output() -> Output:
    return Output(out=lambda s: print(s, flush=True), err=lambda s: print(s, file=sys.stderr, flush=True))


def run(*, gpu: Optional[int], host: Optional[str] = None, inventory: Optional[Path] = None, timeout: float = 1800.0,
        cases: Optional[str] = None, output_path: Optional[Path] = None, interpret: bool = False,
        installed: bool = False, trust_new_host_key: bool = False,
        results_dir: Optional[Path] = None, wheel: Optional[Path] = None,
        output: Optional[Output] = None, on_report: Optional[Callable[[dict], None]] = None,
        _test_remote_sleep_s: Optional[float] = None,
        verdict: bool = True, ctx: Optional[int] = None, concurrency: Optional[str] = None) -> int:
    """Validate on ``gpu`` of an inventory host. Returns the exit code; prints progress and table.

    ``gpu`` None: the host's ``dsv4_validate_gpu`` (exit 2 when it has none). ``output_path``:
    a copy of the report (``--output``). ``on_report`` receives the kept report (``--json``).
    ``verdict``: end with the kernel verdict at ``ctx`` (default: the host's dsv4_context_length)
    and ``concurrency``.

    ``_test_remote_sleep_s`` (tests only, not reachable from the CLI) makes the box sleep before
    the harness starts, to exercise the timeout path.
    """
    io = output or _default_output()
    run = _Run(io, gpu=gpu, host_name=host, inventory=inventory, timeout=timeout, cases=cases,
               json_path=output_path, interpret=interpret, installed=installed,
               trust_new_host_key=trust_new_host_key, results_dir=results_dir, wheel=wheel,
               test_sleep=_test_remote_sleep_s, on_report=on_report,
               verdict=(ctx, concurrency) if verdict else None)
    try:
        return run.execute()
    except ValidationAbort as exc:
        io.err(f"error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        doing, left = run.step
        io.err(f"interrupted: dsv4kit validate stopped while {doing}; {left}")
        return exitcodes.INTERRUPTED


class _Run:
    def __init__(self, io: Output, *, gpu, host_name, inventory, timeout, cases, json_path, interpret,
                 installed, trust_new_host_key, results_dir, wheel, test_sleep, on_report=None, verdict=None):
        self.io = io
        self.on_report = on_report
        self.verdict = verdict  # (ctx or None, concurrency text or None), or None: no verdict
        # What is running now and what a Ctrl-C leaves behind, for the message it prints.
        self.step = ("checking the inputs", "nothing was run")
        self.gpu = gpu
        self.host_name = host_name
        self.inventory = inventory
        self.timeout = timeout
        self.cases = cases
        self.json_path = json_path
        self.interpret = interpret
        self.installed = installed
        self.trust = trust_new_host_key
        self.results_dir = results_dir_or_default(results_dir)
        self.wheel_arg = wheel
        self.test_sleep = test_sleep
        self.started = datetime.now(timezone.utc)
        self.host = None
        self.gpu_origin = ""  # how a GPU the user did not give was chosen, for messages about it
        self.install_method: Optional[str] = None  # "pip" or "unzip" once the wheel is installed
        self.session = None
        self.scratch: Optional[str] = None

    def say(self, message: str) -> None:
        self.io.err(f"[{self.host.name if self.host else '-'}] {message}")

    # ---- steps -----------------------------------------------------------------------------
    def execute(self) -> int:
        from dsv4kit.core import ssh

        if not 0 < self.timeout < float("inf"):  # before the wheel build and any SSH
            raise ValidationAbort(exitcodes.USAGE,
                                  f"--timeout must be a finite number of seconds > 0, got {self.timeout!r}")
        self._load_host()
        self._check_cases()
        if self.installed and self.wheel_arg is not None:
            raise ValidationAbort(exitcodes.USAGE, "--installed and --wheel exclude each other")
        self._check_outputs()
        self._check_connection_inputs()
        with tempfile.TemporaryDirectory(prefix="dsv4kit-validate-") as local_tmp:
            self.step = ("building the wheel", "nothing was run on the box")
            built = None if self.installed else self._wheel(Path(local_tmp))
            self.step = (f"connecting to {self.host.name}", "nothing was run on the box")
            try:
                self.session = ssh.open_session(self.host, trust_new_host_key=self.trust, say=self.say)
            except ssh.RemoteError as exc:
                raise ValidationAbort(exc.exit_code, str(exc)) from None
            self.step = (f"checking {self.host.name}", "its scratch directory was removed; no report was kept")
            try:
                return self._on_box(built, Path(local_tmp))
            except ssh.RemoteError as exc:  # RemoteTimeout's exit_code is exitcodes.TIMEOUT
                raise ValidationAbort(exc.exit_code, str(exc)) from None
            finally:
                self._cleanup()
                self.session.close()

    def _load_host(self) -> None:
        from dsv4kit.core.inventory import InventoryError, load_inventory

        try:
            self.host = load_inventory(self.inventory).host(self.host_name)
            self.venv = self.host["dsv4_venv_dir"].rstrip("/") or "/"
            self.python = self.host.venv_python
        except InventoryError as exc:
            raise ValidationAbort(exitcodes.USAGE, str(exc)) from None
        state = str(self.host.get("dsv4_state_dir") or "/tmp/dsv4kit").rstrip("/")
        self.scratch_root = f"{state}/scratch"
        if self.gpu is None:
            default = self.host.get("dsv4_validate_gpu")
            if default is None:
                raise ValidationAbort(exitcodes.USAGE,
                                      f"no GPU to validate on: pass --gpu N, or set dsv4_validate_gpu for host "
                                      f"{self.host.name!r} in {self.host.source} (or its group_vars/host_vars)")
            self.gpu = int(default)
            self.gpu_origin = f" (GPU {self.gpu} is dsv4_validate_gpu of {self.host.name} in the inventory; --gpu N picks another)"
            self.say(f"GPU {self.gpu}: dsv4_validate_gpu of {self.host.name} (--gpu N picks another)")
        try:
            host_limits.check_gpu(self.host, self.gpu)  # before connecting: the inventory's GPUs
        except exitcodes.Abort as exc:
            raise ValidationAbort(exc.exit_code, str(exc)) from None
        if self.verdict is not None:
            from dsv4kit.validation.verdict_run import DEFAULT_CONCURRENCY, parse_concurrency

            ctx, concurrency = self.verdict
            try:
                levels = parse_concurrency(concurrency) if concurrency else DEFAULT_CONCURRENCY
            except ValueError as exc:
                raise ValidationAbort(exitcodes.USAGE, str(exc)) from None
            self.verdict = (int(ctx or self.host["dsv4_context_length"]), ",".join(map(str, levels)))
            try:  # the decode shapes the user gave, within what the servers can run
                if ctx:
                    host_limits.check_context(self.host, int(ctx))
                if concurrency:
                    host_limits.check_concurrency(self.host, levels)
            except exitcodes.Abort as exc:
                raise ValidationAbort(exc.exit_code, str(exc)) from None

    def _check_connection_inputs(self) -> None:
        """The key file and known_hosts, as provision and bench check them (exit 2 or 3)."""
        from dsv4kit.core.cli_common import check_hosts

        try:
            check_hosts(self.inventory, host=self.host.name, trust_new_host_key=self.trust)
        except exitcodes.Abort as exc:
            raise ValidationAbort(exc.exit_code, str(exc)) from None

    def _check_outputs(self) -> None:
        """--results-dir and --output must be writable before anything runs (exit 2 naming the path)."""
        from dsv4kit.core.cli_common import check_output

        try:
            self.results_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValidationAbort(exitcodes.USAGE, f"--results-dir {str(self.results_dir)!r} cannot be created: "
                                                   f"{exc.strerror or exc}") from None
        problem = cannot_write(self.results_dir)
        if problem:
            raise ValidationAbort(exitcodes.USAGE, f"--results-dir: cannot write into {str(self.results_dir)!r}: {problem}")
        if self.json_path is not None:
            try:
                check_output(self.json_path)
            except exitcodes.Abort as exc:
                raise ValidationAbort(exc.exit_code, str(exc)) from None

    def _check_cases(self) -> None:
        from dsv4kit.validation.harness import parse_cases

        try:
            parse_cases(self.cases)
        except (ValueError, ImportError) as exc:
            raise ValidationAbort(exitcodes.USAGE, f"--cases: {exc}") from None

    def _wheel(self, tmp: Path):
        from dsv4kit.core import wheelbuild

        try:
            if self.wheel_arg is not None:
                return wheelbuild.given_wheel(Path(self.wheel_arg))
            self.say("building the dsv4kit wheel from this checkout")
            built = wheelbuild.build_wheel(tmp / "wheel")
        except wheelbuild.WheelBuildError as exc:
            code = exitcodes.USAGE if self.wheel_arg is not None else exitcodes.TOOL_FAILED
            raise ValidationAbort(code, str(exc)) from None
        self.say(f"built {built.path.name} (sha256 {built.sha256[:16]}, commit {built.commit or 'unknown'})")
        return built

    def _preflight(self) -> BoxFacts:
        result = self.session.run(_preflight_script(self.venv, self.python), timeout=PREFLIGHT_TIMEOUT_S,
                                  env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, check=False)
        facts = parse_preflight(result.stdout)
        if not facts.venv_ok:
            raise ValidationAbort(
                exitcodes.ENVIRONMENT,
                f"no venv on {self.host.name}: dsv4_venv_dir {self.venv} does not exist "
                "(provision the box first: dsv4kit provision)")
        if facts.python_error:
            what = {"missing": "does not exist", "not-executable": "is not executable"}.get(
                facts.python_error, facts.python_error)
            raise ValidationAbort(exitcodes.ENVIRONMENT, f"no usable python on {self.host.name}: {self.python} {what}")
        return facts

    def _on_box(self, built, local_tmp: Path) -> int:
        facts = self._preflight()
        probe = facts.probe
        self.say(f"venv python {self.python} (Python {facts.python_version}); GPUs: "
                 f"{describe_gpus(facts.gpus)}" + (f" [{facts.gpu_source}]" if facts.gpus else
                                                   f" [{'; '.join(facts.gpu_query_notes)}]"))
        expected = self.host.get("dsv4_gpu_count")
        if facts.gpus and expected is not None and len(facts.gpus) != expected:
            self.say(f"warning: the inventory says dsv4_gpu_count={expected}, the box has {len(facts.gpus)} GPU(s)")
        problem = check_gpu(self.gpu, facts, self.interpret, self.host.name)
        if problem:
            raise ValidationAbort(exitcodes.ENVIRONMENT, problem + self.gpu_origin)
        if self.interpret:
            self.say(f"--interpret: kernels run on the box's CPU through the Triton interpreter "
                     f"(GPU check skipped; CUDA_VISIBLE_DEVICES={self.gpu} is still set)")
        if probe.get("torch_error"):
            raise ValidationAbort(exitcodes.ENVIRONMENT,
                                  f"torch does not import in {self.venv} on {self.host.name}: {probe['torch_error']}")
        if not probe.get("triton"):
            raise ValidationAbort(exitcodes.ENVIRONMENT, f"triton is not installed in {self.venv} on {self.host.name}")
        self.say("SGLang is importable on the box: its installed fallback is compared too" if probe.get("sglang")
                 else "SGLang is not importable on the box: no SGLang comparison rows")
        if self.installed and not probe.get("dsv4kit"):
            raise ValidationAbort(
                exitcodes.ENVIRONMENT,
                f"--installed: dsv4kit is not installed in {self.venv} on {self.host.name} "
                "(roll it out with dsv4kit rollout, or drop --installed to ship this checkout's wheel)")

        self.scratch = f"{self.scratch_root}/validate-{self.started.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"
        made = self.session.run(f"mkdir -p -m 700 {shlex.quote(self.scratch)}", timeout=SMALL_TIMEOUT_S, check=False)
        if made.exit_code != 0:
            bad, self.scratch = self.scratch, None
            raise ValidationAbort(exitcodes.ENVIRONMENT,
                                  f"cannot create the scratch directory {bad} on {self.host.name}: the SSH "
                                  f"user {self.host.user} needs write access to {self.scratch_root} "
                                  f"(dsv4_state_dir/scratch): {made.stderr.strip()[-300:]}")
        env = {"CUDA_VISIBLE_DEVICES": str(self.gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
               "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        if built is not None:
            env["PYTHONPATH"] = self._install_wheel(built)
        if self.interpret:
            env["TRITON_INTERPRET"] = "1"
        return self._harness(env, built, facts, local_tmp)

    def _install_wheel(self, built) -> str:
        remote_wheel = f"{self.scratch}/{built.path.name}"
        target = f"{self.scratch}/target"  # not "site": the cwd is on sys.path
        self.session.put(built.path, remote_wheel)
        py, q_target, q_wheel = shlex.quote(self.python), shlex.quote(target), shlex.quote(remote_wheel)
        # pip when the venv has it; a venv made without pip (e.g. by uv) gets the pure-Python wheel
        # unpacked, which is all an import needs. Either way the run says which it was.
        unpack = "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])"
        install = (
            f"if {py} -c 'import pip' >/dev/null 2>&1; then echo install=pip; "
            f"{py} -m pip install --no-deps --no-index --no-compile --disable-pip-version-check -q "
            f"--target {q_target} {q_wheel}; "
            f"else echo install=unzip; {py} -c {shlex.quote(unpack)} {q_wheel} {q_target}; fi && "
            f"PYTHONPATH={q_target} {py} -c 'import dsv4kit; print(\"dsv4kit_file=\" + dsv4kit.__file__)'"
        )
        result = self.session.run(install, timeout=INSTALL_TIMEOUT_S, check=False,
                                  env={"PIP_NO_INPUT": "1", "PIP_ROOT_USER_ACTION": "ignore"})
        method = "unzip" if "install=unzip" in result.stdout else "pip"
        if result.exit_code != 0:
            text = (result.stderr + result.stdout).strip()
            raise ValidationAbort(exitcodes.TOOL_FAILED,
                                  f"could not install {built.path.name} into {target} on {self.host.name} "
                                  f"with {method} (exit {result.exit_code}):\n{text[-2000:]}")
        how = ("pip install --target" if method == "pip"
               else "unpacked: the venv has no pip")
        self.say(f"installed {built.path.name} into {target} ({how}; the venv is not modified)")
        loaded = next((l.split("=", 1)[1] for l in result.stdout.splitlines() if l.startswith("dsv4kit_file=")), "")
        if not loaded.startswith(target + "/"):
            raise ValidationAbort(exitcodes.ENVIRONMENT,
                                  f"the shipped dsv4kit in {target} is shadowed on {self.host.name}: "
                                  f"python imports {loaded or 'nothing'}")
        self.install_method = method
        return target

    def _harness(self, env: dict, built, facts: BoxFacts, local_tmp: Path) -> int:
        remote_report = f"{self.scratch}/{REPORT_NAME}"
        args = [self.python, "-m", "dsv4kit.validation.harness", "--json", remote_report]
        if self.cases:
            args += ["--cases", self.cases]
        if self.interpret:
            args.append("--interpret")
        if self.verdict is not None:
            args += ["--ctx", str(self.verdict[0]), "--concurrency", self.verdict[1],
                     "--decode-tp", str(len(self.host.get("dsv4_decode_gpus") or []) or 4)]
        command = " ".join(shlex.quote(a) for a in args)
        if self.test_sleep:
            command = f"sleep {float(self.test_sleep):g}; {command}"
        self.say(f"running the harness on GPU {self.gpu} (timeout {self.timeout:g}s)")
        self.step = (f"running the harness on {self.host.name} GPU {self.gpu}",
                     "the remote process group was killed and its scratch directory removed; no report was kept")
        result = self.session.run(command, timeout=self.timeout, env=env, cwd=self.scratch,
                                  stream=lambda line: self.io.out(f"[{self.host.name}] {line}"), check=False)
        if result.exit_code not in (exitcodes.OK, exitcodes.CHECK_FAILED):
            tail = (result.stderr.strip() or result.stdout.strip())[-2000:]
            code = result.exit_code if result.exit_code in (exitcodes.USAGE, exitcodes.ENVIRONMENT) else exitcodes.TOOL_FAILED
            raise ValidationAbort(code, f"the harness on {self.host.name} exited with {result.exit_code}"
                                  + (f":\n{tail}" if tail else ""))
        fetched = local_tmp / REPORT_NAME
        self.session.get(remote_report, fetched)
        try:
            report = json.loads(fetched.read_text())
        except ValueError as exc:
            raise ValidationAbort(exitcodes.TOOL_FAILED, f"the harness report from {self.host.name} is not JSON: {exc}") from None
        device = report.get("environment", {}).get("device")
        if not self.interpret and device != "cuda":
            raise ValidationAbort(exitcodes.ENVIRONMENT,
                                  f"the harness on {self.host.name} ran on {device!r}, not on GPU {self.gpu}, "
                                  "although --interpret was not given; no report was kept")
        report["remote"] = self._record(built, facts)
        from dsv4kit.validate import acceptance

        serving = acceptance.check(self.session, self.host, self.say)  # None: no drafter
        if serving is not None:
            report["speculative"] = serving
        from dsv4kit.monitor.textfile import publish_record

        publish_record(self.session, self.host, "validate",
                       {"run_id": report_filename(self.host.name, self.gpu, self.started).removesuffix(".json"),
                        "created_at_utc": report["remote"]["started_utc"]},
                       "pass" if report.get("passed") else "fail", self.say)
        return acceptance.exit_code(self._keep(report), serving, self.say)

    def _record(self, built, facts: BoxFacts) -> dict:
        from dsv4kit import __version__

        return {
            "host": self.host.name,
            "address": f"{self.host.address}:{self.host.port}",
            "user": self.host.user,
            "gpu": self.gpu,
            "gpus_on_box": [{"index": i, "name": n} for i, n in facts.gpus],
            "gpu_source": facts.gpu_source,
            "interpret": self.interpret,
            "cases": self.cases,
            "timeout_s": self.timeout,
            "venv_python": self.python,
            "sglang_on_box": facts.probe.get("sglang"),
            "installed": self.installed,
            "install_method": self.install_method,
            "wheel": None if built is None else {
                "name": built.path.name, "sha256": built.sha256,
                "commit": built.commit, "source": str(built.source) if built.source else None},
            "host_key_fingerprint": self.session.host_key_fingerprint,
            "host_key_trusted_now": self.session.host_key_trusted_now,
            "known_hosts": str(self.host.known_hosts),
            "started_utc": self.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "control_dsv4kit": __version__,
        }

    def _keep(self, report: dict) -> int:
        from dsv4kit.validation.rows import write_json_atomic

        name = report_filename(self.host.name, self.gpu, self.started)
        path = self.results_dir / name
        n = 2
        while path.exists():
            path = self.results_dir / name.replace(".json", f"-{n}.json")
            n += 1
        try:
            write_json_atomic(str(path), report)
        except OSError as exc:
            raise ValidationAbort(exitcodes.ENVIRONMENT, f"the report could not be written to {path}: "
                                                         f"{exc.strerror or exc}; no report was kept") from None
        json_error = None
        if self.json_path:
            try:
                write_json_atomic(str(self.json_path), report)
            except OSError as exc:
                json_error = f"the report could not be written to --output {self.json_path}: {exc.strerror or exc}"
        env = report.get("environment", {})
        self.io.out("")
        self.io.out(f"validation table: {self.host.name} GPU {self.gpu} "
                    f"({env.get('gpu') or ('Triton interpreter on the CPU' if env.get('interpret') else env.get('device'))}; "
                    f"torch {env.get('torch')}, triton {env.get('triton')}, sglang {env.get('sglang') or 'absent'})")
        for line in format_table(report):
            self.io.out(line)
        if "verdict" in report:
            from dsv4kit.validation.verdict import render

            for line in render(report["verdict"]):
                self.io.out(line)
        passed = bool(report.get("passed"))
        self.io.out(f"VERDICT: {'PASS' if passed else 'FAIL'}")
        self.io.out(f"report: {path}" + (f" (and {self.json_path})" if self.json_path and not json_error else ""))
        if self.on_report is not None:
            self.on_report(report)
        if json_error:  # the report is kept all the same; a failed case still says 1
            self.io.err(f"error: {json_error}")
            return exitcodes.CHECK_FAILED if not passed else exitcodes.ENVIRONMENT
        return exitcodes.OK if passed else exitcodes.CHECK_FAILED

    def _cleanup(self) -> None:
        scratch, self.scratch = self.scratch, None
        if not scratch or self.session is None:
            return
        # Only ever our own directory: <state>/scratch/validate-<stamp>-<hex>.
        if not re.fullmatch(re.escape(self.scratch_root) + r"/validate-\d{8}T\d{6}Z-[0-9a-f]{6}", scratch):
            return
        try:
            self.session.run(f"rm -rf -- {shlex.quote(scratch)}", timeout=SMALL_TIMEOUT_S, check=True)
        except Exception as exc:
            self.say(f"warning: could not remove the scratch directory {scratch}: {exc}")
