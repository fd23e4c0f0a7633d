"""The throughput sweep behind ``dsv4kit bench``: drive the real client on the box, gate, record.

Steps (each remote step has a timeout; see docs/benchmarking.md):

1. Check the arguments (lengths fit the context, concurrency list, enough prompts for the
   concurrency gate) before anything runs; ``dsv4kit bench`` also checks the inventory, the
   results repository, the restart's playbook and the baseline's key (``planned_record``) then.
2. Connect (``dsv4kit.core.ssh``), make a scratch directory on the box, copy ``box_helper.py`` there.
3. Read ``/server_info`` of the decode server on the box. If its ``context_length`` differs from
   ``--ctx``, re-run the playbook's ``sglang_service`` tag with ``dsv4_context_length=<ctx>``
   (the same settings ``dsv4kit provision`` uses), wait for ``/health`` on every serving port,
   and read it back again.
4. Probe provenance on the box (versions, GPUs, serving processes, model files).
5. For each repetition, for each concurrency: run ``python -m sglang.benchmark.serving`` in the
   SGLang venv against the router on 127.0.0.1 with fixed lengths (``--random-range-ratio 1.0``),
   ``--tokenize-prompt``, the ``random-ids`` dataset, the model directory as tokenizer,
   ``HF_HUB_OFFLINE=1``, warm-up, ``--flush-cache`` (after warm-up, before the measured run),
   ``--seed``, ``--cache-report``, ``--output-details`` and its own ``--output-file``, under the
   box-side ``box_helper.py run-point`` (``/metrics`` scrapes, GPU telemetry, a ``meta_info``
   probe); fetch the JSONL line and the evidence, find the steady-state window and the headline
   (``dsv4kit.bench.window``), the percentiles and goodput (``dsv4kit.bench.slo``), apply the
   validity gates (``dsv4kit.bench.gates``) and spill the point locally at once (``Spill``).
   With ``--ab`` the repetitions alternate between two arms, with a restart before each.
6. Remove the scratch directory. Only then is the record built, and ``dsv4kit bench`` publishes
   it (``dsv4kit.records.results_repo.publish``, atomic). A sweep that stops after some points hands its
   completed points back as an incomplete record (``exc.partial``).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from dsv4kit.core import exitcodes
from dsv4kit.bench.box_helper import NOT_IDLE_EXIT
from dsv4kit.bench.gates import GateConfig, PointExpectation, effective_max_running, evaluate
from dsv4kit.bench.metrics import cross_check
from dsv4kit.bench.slo import latency_block
from dsv4kit.bench.window import analyze as analyze_window
from dsv4kit.records.record import (KIND, SCHEMA_VERSION, comparability_key, decode_info, derive, dumps,
                             split_client_line, strict_json, summarize_points)
from dsv4kit.core.scrub import scrub
from dsv4kit.core.ssh import RemoteError

CLIENT_MODULE = "sglang.benchmark.serving"
DATASET = "random-ids"
SMALL_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 120.0
#: Input lengths at or above this are "long context": fewer prompts per point (each is a big prefill).
LONG_INPUT = 32768
CLIENT_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
              "PYTHONUNBUFFERED": "1"}
#: The playbook tag that (re)starts the serving units; a context-length restart runs only it.
RESTART_TAG = "sglang_service"
#: Comparability-key fields that only the box can tell (the probe), not known before a sweep.
BOX_KEY_FIELDS = ("gpu_model", "client_tool_version", "kernel_flags", "sglang_wheel", "sgl_kernel", "flashinfer",
                  "dsv4kit_wheel", "weights", "driver", "launch_args")


class BenchAbort(exitcodes.Abort):
    """Stop the sweep: nothing is recorded. ``exit_code`` from dsv4kit.core.exitcodes."""


@dataclass
class SweepConfig:
    context_length: int
    concurrency: list[int]
    input_len: int
    output_len: int
    repeat: int = 3
    num_prompts: Optional[int] = None
    warmup_requests: Optional[int] = None
    seed: int = 42
    point_timeout_s: float = 3600.0
    server_timeout_s: float = 1800.0
    restart: bool = True
    #: Server restarts between repetitions (``--restarts``), spread evenly (``restart_before``).
    restarts: int = 0
    #: Seconds between two /metrics scrapes of each serving port during a point.
    metrics_interval_s: float = 0.25
    gates: GateConfig = field(default_factory=GateConfig)
    verbose: bool = False

    def prompts_for(self, concurrency: int) -> int:
        if self.num_prompts:
            return self.num_prompts
        if self.input_len >= LONG_INPUT:
            return max(8, 2 * concurrency)
        return max(32, 10 * concurrency)

    def warmup_for(self, concurrency: int) -> int:
        return self.warmup_requests if self.warmup_requests is not None else max(concurrency, 8)


def default_lengths(context_length: int, input_len: Optional[int], output_len: Optional[int]) -> tuple[int, int]:
    """ISL/OSL: given ones, else OSL 512 and ISL = ctx - max(1024, OSL) (room for the output)."""
    osl = output_len if output_len is not None else 512
    isl = input_len if input_len is not None else context_length - max(1024, osl)
    return isl, osl


def check_config(cfg: SweepConfig) -> None:
    """Bad input fails here, before any connection (exit 2)."""
    problems = []
    if cfg.context_length < 2:
        problems.append(f"--ctx must be a positive token count, got {cfg.context_length}")
    if not cfg.concurrency:
        problems.append("--concurrency needs at least one value")
    if any(c < 1 for c in cfg.concurrency):
        problems.append(f"--concurrency values must be >= 1, got {cfg.concurrency}")
    if len(set(cfg.concurrency)) != len(cfg.concurrency):
        problems.append(f"--concurrency has duplicates: {cfg.concurrency}")
    if cfg.input_len < 1 or cfg.output_len < 2:
        problems.append(f"--input-len must be >= 1 and --output-len >= 2 (TPOT needs two tokens), "
                        f"got {cfg.input_len}/{cfg.output_len}")
    elif cfg.input_len + cfg.output_len > cfg.context_length:
        problems.append(
            f"--input-len {cfg.input_len} + --output-len {cfg.output_len} = {cfg.input_len + cfg.output_len} "
            f"exceeds --ctx {cfg.context_length}: the server would reject every request")
    if cfg.repeat < 1:
        problems.append(f"--repeat must be >= 1, got {cfg.repeat}")
    elif not 0 <= cfg.restarts <= cfg.repeat - 1:
        problems.append(f"--restarts {cfg.restarts}: give 0 to {cfg.repeat - 1} (a restart goes between two of the "
                        f"{cfg.repeat} repetitions)")
    if cfg.num_prompts is not None and cfg.num_prompts < 1:
        problems.append(f"--num-prompts must be >= 1, got {cfg.num_prompts}")
    elif cfg.num_prompts is not None:
        # At most num_prompts requests are ever in flight, so the achieved concurrency of a point
        # cannot exceed it: below ratio x C the concurrency gate fails whatever the server does.
        ratio = cfg.gates.min_concurrency_ratio
        short = [c for c in cfg.concurrency if cfg.num_prompts < ratio * c]
        if short:
            problems.append(
                f"--num-prompts {cfg.num_prompts} is too few for --concurrency {', '.join(map(str, short))}: "
                f"at most {cfg.num_prompts} requests can be in flight, below --min-concurrency-ratio {ratio:g} "
                f"x C, so every such point would fail the concurrency gate (give at least "
                f"{math.ceil(ratio * max(short))} prompts, or leave --num-prompts out)")
    if problems:
        raise BenchAbort(exitcodes.USAGE, "; ".join(problems))


def check_host(host) -> None:
    """Inventory values the sweep needs beyond the schema's required ones (exit 2, before connecting)."""
    if not host.get("dsv4_model_path"):
        raise BenchAbort(exitcodes.USAGE, f"{host.source}: host {host.name!r} has no dsv4_model_path "
                                          f"(the tokenizer is read from the model directory)")


def check_restart_tools(host, context_length: int) -> Optional[str]:
    """Before connecting: a warning when a restart is likely (``--ctx`` differs from the inventory's
    ``dsv4_context_length``) but could not run (no ansible-playbook, no playbook, or a playbook
    without the ``sglang_service`` tag); None otherwise. Only a warning: a server restarted to this
    length by an earlier bench (``-e``, the inventory keeps its value) needs no restart, and a
    restart that is needed fails cleanly (BenchAbort) before the sweep starts."""
    from dsv4kit.provision import playbook as provision

    if host.get("dsv4_context_length") == context_length:
        return None
    try:
        provision.check_tags(provision.check_tools(), tags=[RESTART_TAG])
    except provision.ProvisionError as exc:
        return (f"--ctx {context_length} differs from the inventory's dsv4_context_length "
                f"{host.get('dsv4_context_length')}; if the server does not already run with {context_length}, "
                f"the restart (which runs the playbook) will fail: {exc}")
    return None


def parse_concurrency(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise BenchAbort(exitcodes.USAGE, f"--concurrency must be comma-separated integers, got {text!r}") from None
    return values


def utc_stamp(now: Optional[datetime] = None) -> str:
    """``20260101T120000Z-3f9a1c``: the UTC second and 24 random bits, so that two sweeps started
    in the same second on one host never share a run id, a tag or a spill directory."""
    import secrets

    return (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "host"


def run_names(host_name: str, context_length: int, stamp: str) -> tuple[str, str]:
    """(run_id, tag) of a sweep: ``<host>-ctx<ctx>-<stamp>`` and ``bench/<host>/<ctx>/<stamp>``."""
    host = safe_name(host_name)
    return f"{host}-ctx{context_length}-{stamp}", f"bench/{host}/{context_length}/{stamp}"


def client_argv(python: str, cfg: SweepConfig, *, concurrency: int, base_url: str, model_path: str,
                output_file: str, tag: str) -> list[str]:
    """The exact ``sglang.benchmark.serving`` command line of one point."""
    return [
        python, "-m", CLIENT_MODULE,
        "--backend", "sglang",
        "--base-url", base_url,
        "--model", model_path,
        "--tokenizer", model_path,
        "--dataset-name", DATASET,
        "--random-input-len", str(cfg.input_len),
        "--random-output-len", str(cfg.output_len),
        "--random-range-ratio", "1.0",
        "--num-prompts", str(cfg.prompts_for(concurrency)),
        "--max-concurrency", str(concurrency),
        "--request-rate", "inf",
        "--warmup-requests", str(cfg.warmup_for(concurrency)),
        "--flush-cache",
        "--seed", str(cfg.seed),
        "--temperature", "0.0",
        "--tokenize-prompt",
        "--cache-report",
        "--output-details",
        "--output-file", output_file,
        "--tag", tag,
        "--ready-check-timeout-sec", "60",
        "--disable-tqdm",
    ]


@dataclass
class SweepResult:
    record: dict
    details: dict[str, dict]  # details file name -> per-request arrays

    @property
    def run_id(self) -> str:
        return self.record["run_id"]

    @property
    def tag(self) -> str:
        return self.record["tag"]

    def files(self) -> dict[str, bytes]:
        """Repository paths -> bytes: the record and its gzipped details (deterministic bytes)."""
        base = f"records/{self.run_id}"
        out = {f"{base}/record.json": dumps(self.record).encode()}
        for name, details in sorted(self.details.items()):
            data = json.dumps(strict_json(scrub(details)), separators=(",", ":"), allow_nan=False).encode()
            out[f"{base}/{name}"] = gzip.compress(data, mtime=0)
        return out


@dataclass(frozen=True)
class ABSpec:
    """``--ab KEY=A,B``: an environment variable of the serving units (an upper-case name, e.g.
    ``SGLANG_SM120_TRITON_INDEXER``) or a ``sglang.launch_server`` flag (``--attention-backend``)
    and its two values. Arm ``A`` runs with the first value, ``B`` with the second."""
    key: str
    values: dict  # {"A": value, "B": value}

    arms = ("A", "B")

    @property
    def kind(self) -> str:
        return "server_flag" if self.key.startswith("--") else "env"

    def to_dict(self) -> dict:
        return {"key": self.key, "kind": self.kind, "values": dict(self.values), "order": "interleaved A B A B, "
                "a server restart before every arm"}


def parse_ab(text: str) -> ABSpec:
    """``KEY=A,B`` -> ABSpec; bad input is BenchAbort(USAGE)."""
    key, sep, values = text.partition("=")
    key = key.strip()
    parts = [v.strip() for v in values.split(",")] if sep else []
    problems = []
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]*|--[a-z0-9][a-z0-9-]*", key):
        problems.append(f"KEY must be an environment variable (upper case, e.g. SGLANG_SM120_TRITON_INDEXER) or a "
                        f"server flag (e.g. --attention-backend), got {key!r}")
    if len(parts) != 2 or not all(parts):
        problems.append(f"give exactly two comma-separated values, got {values!r}")
    elif parts[0] == parts[1]:
        problems.append(f"the two values are the same ({parts[0]!r}): nothing to compare")
    if problems:
        raise BenchAbort(exitcodes.USAGE, f"--ab {text!r}: " + "; ".join(problems))
    return ABSpec(key=key, values={"A": parts[0], "B": parts[1]})


def arm_extra_vars(host, context_length: int, ab: ABSpec, arm: str) -> tuple[list[str], dict]:
    """(playbook tags, extra vars) that restart the serving units as arm ``arm`` wants: an env
    variable goes into ``dsv4_kernel_flags`` (the units' environment file; tags kernel_rollout and
    sglang_service), a flag replaces its value in ``dsv4_server_extra_args`` (tag sglang_service).
    The inventory is not changed: the next ``dsv4kit provision`` restores its values."""
    value = ab.values[arm]
    extra = {"dsv4_context_length": context_length}
    if ab.kind == "env":
        extra["dsv4_kernel_flags"] = {**(host.get("dsv4_kernel_flags") or {}), ab.key: value}
        return ["kernel_rollout", RESTART_TAG], extra
    args = [str(a) for a in host.get("dsv4_server_extra_args") or []]
    kept, skip = [], False
    for item in args:
        if skip:
            skip = False
            continue
        if item == ab.key:
            skip = True
            continue
        if item.startswith(ab.key + "="):
            continue
        kept.append(item)
    extra["dsv4_server_extra_args"] = kept + [ab.key, value]
    return [RESTART_TAG], extra


def default_apply_arm(inventory_path, host, context_length: int, ab: ABSpec, arm: str,
                      progress: Callable[[str], None], timeout: float) -> None:
    """Restart the serving units with arm ``arm``'s setting (``arm_extra_vars``) via the playbook."""
    from dsv4kit.provision import playbook as provision

    tags, extra = arm_extra_vars(host, context_length, ab, arm)
    try:
        summary = provision.run_playbook(inventory_path, limit=host.name, tags=tags, extra_vars=extra,
                                         progress=lambda line: progress(f"  ansible: {line}"), timeout=timeout)
    except provision.ProvisionError as exc:
        raise BenchAbort(exc.exit_code, f"cannot restart the serving units for arm {arm} "
                                        f"({ab.key}={ab.values[arm]}): {exc}") from None
    if summary.failed:
        raise BenchAbort(exitcodes.TIMEOUT if summary.timed_out else exitcodes.TOOL_FAILED,
                         f"restarting the serving units for arm {arm} ({ab.key}={ab.values[arm]}) failed "
                         f"(ansible-playbook exit {summary.returncode}):\n{summary.stdout_tail[-1500:]}")


def arm_comparison(record: dict):
    """The A/B verdicts: arm B against arm A, from the one record's points (``dsv4kit.records.compare``)."""
    from dsv4kit.records.compare import compare, select_arm

    sides = {arm: select_arm(record, arm) for arm in ABSpec.arms}
    # One record: the arms differ by design, in the A/B key itself (served_flags.key_value names both).
    # One record: the arms differ by design, in the A/B key itself (served_flags.key_value names both,
    # and a server flag changes the launch arguments).
    return compare(sides["A"], sides["B"], ignore=("kernel_flags", "launch_args"))


def slo_limits(host) -> Optional[dict]:
    """The p99 TTFT/TPOT limits of goodput, from the inventory (None when neither is set)."""
    limits = {"ttft_ms": host.get("dsv4_bench_slo_ttft_ms"), "tpot_ms": host.get("dsv4_bench_slo_tpot_ms")}
    if all(v is None for v in limits.values()):
        return None
    return {**limits, "source": "inventory dsv4_bench_slo_ttft_ms / dsv4_bench_slo_tpot_ms", "percentile": 99}


def default_spill_root() -> Path:
    """Where finished points are kept until their record is published: ``$DSV4KIT_SPILL_DIR``, else
    ``$XDG_STATE_HOME/dsv4kit/spill`` (``~/.local/state/dsv4kit/spill``)."""
    if os.environ.get("DSV4KIT_SPILL_DIR"):
        return Path(os.environ["DSV4KIT_SPILL_DIR"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "dsv4kit" / "spill"


class SpillError(BenchAbort):
    """A finished point could not be written to the spill directory: the sweep stops at once."""


#: A sweep does not start with less free space than this where it spills and publishes
#: (``$DSV4KIT_BENCH_MIN_FREE_MB`` overrides it).
MIN_FREE_MB = 512


def check_free_space(paths, need_mb: Optional[float] = None) -> None:
    """Exit 5 (before connecting) when the file system of any of ``paths`` (or of its nearest
    existing ancestor) has less than ``need_mb`` MiB free."""
    import shutil

    need = float(os.environ.get("DSV4KIT_BENCH_MIN_FREE_MB") or MIN_FREE_MB) if need_mb is None else need_mb
    for path in paths:
        probe = Path(path).absolute()
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free / 2**20
        if free < need:
            raise BenchAbort(exitcodes.ENVIRONMENT,
                             f"only {free:.0f} MiB free on the file system of {path} (need {need:.0f} MiB for the "
                             f"spilled points and the record; $DSV4KIT_BENCH_MIN_FREE_MB sets it): nothing was run")


def write_durably(target: Path, data: bytes) -> None:
    """``data`` into ``target``: a sibling temporary file, fsync, rename, fsync of the directory.
    A reader sees the old file or the whole new one; a failure leaves no temporary file behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spill:
    """A local directory holding each finished point the moment it is done (scrubbed, durable
    writes: ``write_durably``): ``point-c<C>-r<R>.json``, ``details/c<C>_r<R>.json.gz`` and
    ``record.partial.json`` (the incomplete record so far) after every point, ``record.json`` when
    the sweep ends. ``dsv4kit records publish DIR`` publishes a kept one. A write that fails raises
    SpillError: the sweep stops, the points written before stay. The caller removes the
    directory once the record is published."""

    from dsv4kit.records.spill_publish import FINAL, PARTIAL

    def __init__(self, directory: Path, warn: Optional[Callable[[str], None]] = None):
        self.directory = directory
        self.warn = warn

    def create(self) -> None:
        """Make the directory; one that exists already is another sweep's (run ids never repeat)."""
        try:
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            self.directory.mkdir()
        except FileExistsError:
            raise BenchAbort(exitcodes.TOOL_FAILED, f"spill directory {self.directory} exists already: another sweep "
                                                    f"has this run id") from None
        except OSError as exc:
            raise SpillError(exitcodes.ENVIRONMENT, f"cannot create the spill directory {self.directory}: {exc}") from None

    def _write(self, name: str, data: bytes) -> None:
        try:
            write_durably(self.directory / name, data)
        except OSError as exc:
            kept = sorted(p.name for p in self.directory.glob("point-*.json")) if self.directory.is_dir() else []
            raise SpillError(exitcodes.ENVIRONMENT,
                             f"cannot spill {name} to {self.directory}: {exc}; the sweep stopped here so that no "
                             f"point is measured without a copy ({len(kept)} earlier point(s) are kept there)") from None

    def point(self, point: dict, details_file: Optional[str], details: Optional[dict]) -> None:
        arm = f"-{point['arm']}" if point.get("arm") else ""
        name = f"point-c{point['max_concurrency']}-r{point['repetition']}{arm}.json"
        if details_file is not None:
            self._write(details_file, gzip.compress(json.dumps(strict_json(scrub(details)), separators=(",", ":"),
                                                               allow_nan=False).encode(), mtime=0))
        self._write(name, dumps(scrub(point)).encode())

    def progress(self, result: "SweepResult") -> None:
        self._write(self.PARTIAL, dumps(result.record).encode())

    def finished(self, result: "SweepResult") -> None:
        self._write(self.FINAL, dumps(result.record).encode())

    def remove(self) -> None:
        import shutil

        shutil.rmtree(self.directory, ignore_errors=True)


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
            raise BenchAbort(exitcodes.ENVIRONMENT,
                             f"{self.host.name}: no SGLang venv python at {self.python} (dsv4_venv_dir); "
                             f"run `dsv4kit provision` first")
        # <dsv4_state_dir>/scratch/bench-XXXXXXXX (as validate does), else the box's temp dir.
        scratch = f"{str(self.host.get('dsv4_state_dir') or '/var/lib/dsv4kit').rstrip('/')}/scratch"
        made = self.session.run(
            f"mkdir -p {shlex.quote(scratch)} 2>/dev/null && mktemp -d {shlex.quote(scratch)}/bench-XXXXXXXX "
            f"|| mktemp -d -t dsv4kit-bench.XXXXXXXX", timeout=SMALL_TIMEOUT_S)
        self.workdir = made.stdout.strip().splitlines()[-1]
        from dsv4kit.core import unit_env

        for module in (Path(__file__).with_name("box_helper.py"), Path(unit_env.__file__)):
            self.session.put(module, f"{self.workdir}/{module.name}")

    def restart_units(self, progress: Callable[[str], None], timeout: float) -> None:
        """``systemctl restart`` of the serving units the probe found (``sudo -n`` unless root):
        a plain restart, nothing reconfigured (``--restarts``)."""
        if not getattr(self, "units", None):
            raise BenchAbort(exitcodes.ENVIRONMENT, f"{self.host.name}: --restarts needs the dsv4-*.service units, and "
                                                    f"none were found (run `dsv4kit provision`)")
        names = " ".join(shlex.quote(f"{u}.service") for u in self.units)
        result = self.session.run(f'if [ "$(id -u)" = 0 ]; then systemctl restart {names}; '
                                  f'else sudo -n systemctl restart {names}; fi', timeout=timeout, check=False)
        if result.exit_code != 0:
            raise BenchAbort(exitcodes.TOOL_FAILED, f"{self.host.name}: restarting {names} failed (exit "
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
        command = shlex.join([self.python, f"{self.workdir}/box_helper.py", *args])
        result = self.session.run(command, timeout=timeout, env=env, check=False)
        lines = [l for l in result.stdout.splitlines() if l.strip()]
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            raise BenchAbort(exitcodes.TOOL_FAILED,
                             f"{self.host.name}: bench helper {args[0]} gave no JSON (exit {result.exit_code}): "
                             f"{(result.stderr or result.stdout).strip()[-800:]}") from None

    def server_info(self, port: int, env: Optional[dict]) -> dict:
        answer = self.helper("server-info", "--port", str(port), env=env)
        if not answer.get("ok"):
            raise BenchAbort(exitcodes.ENVIRONMENT,
                             f"{self.host.name}: {answer.get('error')}; is the serving unit running? "
                             f"(`dsv4kit provision` starts it)")
        return answer["server_info"]

    def wait_health(self, ports: list[int], timeout: float, env: Optional[dict]) -> None:
        answer = self.helper("wait-health", "--ports", ",".join(str(p) for p in ports), "--timeout",
                             str(timeout), timeout=timeout + SMALL_TIMEOUT_S, env=env)
        if not answer.get("ok"):
            raise BenchAbort(exitcodes.TIMEOUT,
                             f"{self.host.name}: serving ports {answer.get('pending')} not healthy after "
                             f"{timeout:g}s: {answer.get('last_error')}")

    def probe(self) -> dict:
        prefix = str(self.host.get("dsv4_prefix") or "/").rstrip("/")
        return self.helper("probe", "--model-path", str(self.host.get("dsv4_model_path") or ""),
                           "--state-dir", str(self.host.get("dsv4_state_dir") or ""),
                           "--unit-dir", f"{prefix}/etc/systemd/system",
                           "--decision-file", f"{prefix}/etc/dsv4kit/kernel-decision.json", timeout=PROBE_TIMEOUT_S)

    def fetch_json(self, remote_file: str, label: str) -> dict:
        with tempfile.TemporaryDirectory(prefix="dsv4kit-point-") as tmp:
            local = Path(tmp) / "evidence.json"
            try:
                self.session.get(remote_file, local)
                return json.loads(local.read_text())
            except (OSError, ValueError) as exc:
                raise BenchAbort(exitcodes.TOOL_FAILED, f"{label}: the box-side evidence file {remote_file} "
                                                        f"could not be read: {exc}") from None

    def fetch_line(self, remote_file: str, label: str) -> dict:
        with tempfile.TemporaryDirectory(prefix="dsv4kit-point-") as tmp:
            local = Path(tmp) / "point.jsonl"
            self.session.get(remote_file, local)
            lines = [l for l in local.read_text().splitlines() if l.strip()]
        if len(lines) != 1:
            raise BenchAbort(exitcodes.TOOL_FAILED,
                             f"{label}: expected one result line in {remote_file}, found {len(lines)}")
        try:
            return json.loads(lines[0])
        except ValueError as exc:
            raise BenchAbort(exitcodes.TOOL_FAILED, f"{label}: the client's result line is not JSON: {exc}") from None


def _num(value, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


def _context_of(server_info: dict) -> Optional[int]:
    value = decode_info(server_info).get("context_length")
    return int(value) if isinstance(value, (int, float)) else None


def default_restart(inventory_path, host, context_length: int, progress: Callable[[str], None],
                    timeout: float) -> None:
    """Re-run the playbook's serving tag with the new context length (same settings as provision)."""
    from dsv4kit.provision import playbook as provision

    try:
        summary = provision.run_playbook(inventory_path, limit=host.name, tags=[RESTART_TAG],
                                         extra_vars={"dsv4_context_length": context_length},
                                         progress=lambda line: progress(f"  ansible: {line}"), timeout=timeout)
    except provision.ProvisionError as exc:  # no ansible-playbook, no playbook: nothing ran
        raise BenchAbort(exc.exit_code, f"cannot restart the serving units with context length "
                                        f"{context_length}: {exc}") from None
    if summary.failed:
        raise BenchAbort(exitcodes.TIMEOUT if summary.timed_out else exitcodes.TOOL_FAILED,
                         f"restarting the serving units with context length {context_length} failed "
                         f"(ansible-playbook exit {summary.returncode}):\n{summary.stdout_tail[-1500:]}")


def run_sweep(cfg: SweepConfig, *, host, session, inventory_path, progress: Callable[[str], None],
              argv: Optional[list[str]] = None, stamp: Optional[str] = None,
              restart: Optional[Callable] = None, spill_root: Optional[Path] = None,
              ab: Optional["ABSpec"] = None, apply_arm: Optional[Callable] = None,
              restart_units: Optional[Callable] = None, profile: Optional[Callable] = None) -> SweepResult:
    """Run the whole sweep over ``session``; return the record (nothing is published here).

    Each finished point is written at once under ``spill_root/<run_id>/`` (``Spill``). When the
    sweep stops after some points (BenchAbort, RemoteError), the exception carries ``partial``: an
    incomplete record with the completed points, for the caller to publish. ``profile`` (``bench
    --profile``, ``dsv4kit.profile.run.bench_hook``) runs after the last point; what it returns is
    the record's ``profile`` section."""
    from dsv4kit.records.provenance import sections, serving_gpu_count, toolkit_info

    check_config(cfg)
    started = time.time()
    created = datetime.now(timezone.utc)
    stamp = stamp or utc_stamp(created)
    run_id, tag = run_names(host.name, cfg.context_length, stamp)
    decode_port = int(host["dsv4_decode_port"])
    router_port = int(host.get("dsv4_router_port") or decode_port)
    serving_ports = sorted({p for p in (router_port, host.get("dsv4_prefill_port"), decode_port) if p})
    check_host(host)
    model_path = str(host["dsv4_model_path"])
    env = dict(CLIENT_ENV)
    if os.environ.get("DSV4KIT_API_KEY"):
        env["OPENAI_API_KEY"] = os.environ["DSV4KIT_API_KEY"]
    helper_env = {"OPENAI_API_KEY": env["OPENAI_API_KEY"]} if "OPENAI_API_KEY" in env else None

    spill = Spill(Path(spill_root) / run_id, progress) if spill_root is not None else None
    if spill is not None:
        spill.create()
    remote = Remote(session, host, progress)
    total = cfg.repeat * len(cfg.concurrency) * (2 if ab else 1)
    points: list[dict] = []
    details: dict[str, dict] = {}
    notes: list[str] = []
    extras: dict = {}
    try:
        remote.setup()
        info = remote.server_info(decode_port, helper_env)
        current = _context_of(info)
        restarted = False
        if current != cfg.context_length:
            if not cfg.restart:
                raise BenchAbort(exitcodes.ENVIRONMENT,
                                 f"{host.name}: the decode server runs with context length {current}, not "
                                 f"{cfg.context_length}, and --no-restart was given")
            progress(f"decode server context length is {current}; restarting the serving units with "
                     f"{cfg.context_length}...")
            (restart or default_restart)(inventory_path, host, cfg.context_length, progress, cfg.server_timeout_s)
            remote.wait_health(serving_ports, cfg.server_timeout_s, helper_env)
            info = remote.server_info(decode_port, helper_env)
            current = _context_of(info)
            if current != cfg.context_length:
                raise BenchAbort(exitcodes.ENVIRONMENT,
                                 f"{host.name}: after the restart the decode server still reports context "
                                 f"length {current}, not {cfg.context_length}")
            restarted = True
            notes.append(f"serving units restarted for context length {cfg.context_length}")
        progress(f"decode server on {host.name}:{decode_port}: context length {current} (ok)")
        startup_time = decode_info(info).get("startup_time")
        prefill_info = None
        prefill_port = host.get("dsv4_prefill_port")
        prefill_port = int(prefill_port) if prefill_port and int(prefill_port) != decode_port else None
        if prefill_port:
            answer = remote.helper("server-info", "--port", str(prefill_port), env=helper_env)
            prefill_info = answer.get("server_info") if answer.get("ok") else None
            if prefill_info is None:
                notes.append(f"prefill server /server_info unavailable: {answer.get('error')}")
        metrics_ports = [decode_port] + ([prefill_port] if prefill_port else [])
        probe = remote.probe()
        if not (probe.get("packages") or {}).get("sglang"):
            raise BenchAbort(exitcodes.ENVIRONMENT, f"{host.name}: sglang is not installed in {remote.python}")
        gpus_note = (probe.get("gpus") or {}).get("reason")
        if gpus_note:
            notes.append(f"GPU facts unavailable: {gpus_note}")
        serving_gpus = serving_gpu_count(host)
        base_url = f"http://127.0.0.1:{router_port}"
        slo = slo_limits(host)

        def build(incomplete: Optional[str] = None) -> SweepResult:
            finished = datetime.now(timezone.utc)
            invalid = sum(1 for p in points if not p["validity"]["passed"])
            record_notes = list(notes)
            if invalid:
                record_notes.append(f"{invalid} of {len(points)} points failed a validity gate; they are excluded "
                                    f"from the summary")
            if incomplete:
                record_notes.append(f"INCOMPLETE: the sweep stopped after {len(points)} of {total} points: {incomplete}")
            record = {
                "schema_version": SCHEMA_VERSION,
                "kind": KIND,
                "run_id": run_id,
                "tag": tag,
                "created_at_utc": created.isoformat(timespec="seconds"),
                "finished_at_utc": finished.isoformat(timespec="seconds"),
                "duration_wall_s": round(time.time() - started, 3),
                "toolkit": toolkit_info(argv),
                **first_provenance,
                "client": client_section(cfg, tool_version=(probe.get("packages") or {}).get("sglang"),
                                         base_url=base_url),
                "starts": list(starts) if ab is None else None,
                "sweep": {"concurrency": list(cfg.concurrency), "repeat": cfg.repeat, "order": "repetition-major",
                          "restarts": cfg.restarts,
                          "point_timeout_s": cfg.point_timeout_s, "metrics_interval_s": cfg.metrics_interval_s,
                          "gates": cfg.gates.to_dict(), "slo": slo},
                "points": list(points),
                "summary": summarize_points(points) if ab is None else {
                    "per_concurrency": {}, "per_arm": {arm: summarize_points([p for p in points if p.get("arm") == arm])
                                                       for arm in ab.arms}},
                "validity_passed": invalid == 0 and bool(points) and not incomplete,
                "invalid_points": invalid,
                "incomplete": bool(incomplete),
                "incomplete_reason": incomplete,
                "notes": record_notes,
            }
            record.update(extras)
            record["comparability_key"] = comparability_key(record)
            if ab is not None:
                record["ab"] = ab.to_dict()
                record["ab"]["provenance"] = dict(arm_provenance)
                comparison = arm_comparison(record)
                record["ab"]["comparison"] = comparison.to_dict()
                record["ab"]["outcome"] = comparison.outcome
                record["ab"]["summary"] = comparison.summary()
            return SweepResult(record=scrub(record), details=dict(details))

        first_provenance = sections(host=host, probe=probe, server_info=info, context_length=cfg.context_length,
                                    restarted=restarted, prefill_server_info=prefill_info)
        remote.units = sorted((probe.get("units") or {}).keys())
        starts: list[dict] = [{"before_repetition": 0, "startup_time": startup_time, "provenance_differs": []}]
        arm_provenance: dict = {}
        current = {"info": info, "startup_time": startup_time, "start": 0,
                   "prefill_startup_time": decode_info(prefill_info or {}).get("startup_time")}

        def run_point(c: int, rep: int, arm: Optional[str]) -> None:
            label = f"[{len(points) + 1}/{total}] C={c} rep {rep + 1}/{cfg.repeat}" + (
                f" arm {arm} ({ab.key}={ab.values[arm]})" if arm else "")
            suffix = f"_{arm}" if arm else ""
            n = cfg.prompts_for(c)
            out_file = f"{remote.workdir}/c{c}_r{rep}{suffix}.jsonl"
            argv_point = client_argv(remote.python, cfg, concurrency=c, base_url=base_url,
                                     model_path=model_path, output_file=out_file, tag=f"{run_id}/c{c}/r{rep}" + (f"/{arm}" if arm else ""))
            evidence_file = f"{remote.workdir}/c{c}_r{rep}{suffix}.evidence.json"
            wrapped = [remote.python, f"{remote.workdir}/box_helper.py", "run-point",
                       "--evidence-out", evidence_file, "--metrics-ports", ",".join(map(str, metrics_ports)),
                       "--probe-port", str(router_port), "--interval", f"{cfg.metrics_interval_s:g}",
                       "--idle-timeout", f"{cfg.gates.idle_timeout_s:g}", "--", *argv_point]
            progress(f"{label}: {n} prompts of {cfg.input_len}+{cfg.output_len} tokens, "
                     f"warm-up {cfg.warmup_for(c)}...")
            t0 = time.monotonic()
            stream = (lambda line: progress(f"  | {line}")) if cfg.verbose else None
            result = session.run(shlex.join(wrapped), timeout=cfg.point_timeout_s, env=env,
                                 cwd=remote.workdir, stream=stream, check=False)
            wall = time.monotonic() - t0
            if result.exit_code == NOT_IDLE_EXIT:
                not_run_point(c, rep, arm, n, argv_point, wall, remote.fetch_json(evidence_file, label), label)
                return
            if result.exit_code != 0:
                tail = (result.stderr.strip() or result.stdout.strip())[-1500:]
                raise BenchAbort(exitcodes.TOOL_FAILED,
                                 f"{label}: {CLIENT_MODULE} exited {result.exit_code}; sweep aborted:\n{tail}")
            line = remote.fetch_line(out_file, label)
            evidence = remote.fetch_json(evidence_file, label)
            limits = decode_info(current["info"])
            expected = PointExpectation(num_prompts=n, input_len=cfg.input_len, output_len=cfg.output_len,
                                        max_concurrency=c, startup_time=current["startup_time"], prefill_port=prefill_port,
                                        prefill_startup_time=current["prefill_startup_time"],
                                        max_running_requests=effective_max_running(current["info"]),
                                        max_total_num_tokens=limits.get("max_total_num_tokens"))
            window = analyze_window(line, c, evidence, decode_port)
            problem = cross_check(evidence, decode_port)
            if problem:
                window["parse_problem"] = problem
            validity = evaluate(line, expected, cfg.gates, evidence, window)
            latency = latency_block(line, slo)
            raw, point_details, _ = split_client_line(line)
            derived = derive(raw, serving_gpus, window, latency)
            details_file = f"details/c{c}_r{rep}{suffix}.json.gz"
            point_details["metrics_samples"] = evidence.get("samples") or []
            telemetry = evidence.get("telemetry") or {"available": False, "reason": "not collected"}
            point_details["gpu_telemetry_samples"] = telemetry.get("samples") or []
            details[details_file] = point_details
            points.append({
                "max_concurrency": c, "repetition": rep, "num_prompts": n, **({"arm": arm} if arm else {}),
                "warmup_requests": cfg.warmup_for(c), "server_start": current["start"],
                "argv": [a.replace(remote.workdir, "<workdir>") for a in argv_point],
                "wall_s": round(wall, 3), "raw": raw, "details_file": details_file,
                "derived": derived, "validity": validity, "window": window, "latency": latency,
                "server_evidence": {"metrics_ports": metrics_ports, "interval_s": cfg.metrics_interval_s,
                                    "samples": len(evidence.get("samples") or ()),
                                    "scrape_errors": evidence.get("scrape_errors") or {},
                                    "meta_info": evidence.get("meta_info"),
                                    "startup_after": evidence.get("startup_after")},
                "gpu_telemetry": {k: v for k, v in telemetry.items() if k != "samples"},
            })
            if spill is not None:
                spill.point(points[-1], details_file, point_details)
                spill.progress(build(incomplete="the sweep did not finish"))
            verdict = "valid" if validity["passed"] else f"INVALID ({', '.join(validity['failed'])})"
            progress(f"{label}: decode {_num(derived.get('decode_tok_s'))} tok/s (running batch "
                     f"{_num((window.get('running') or {}).get('median'))}), output "
                     f"{_num(raw.get('output_throughput'))} tok/s, TTFT p50 {_num(raw.get('median_ttft_ms'))} ms, "
                     f"TPOT p50 {_num(raw.get('median_tpot_ms'), 2)} ms [{wall:.0f}s]: {verdict}")
            if not validity["passed"]:
                for name in validity["failed"]:
                    progress(f"    gate {name}: {validity['gates'][name]['detail']}")

        def not_run_point(c: int, rep: int, arm: Optional[str], n: int, argv_point: list, wall: float,
                          evidence: dict, label: str) -> None:
            """The servers were busy with another client's load: the point is invalid, never run."""
            idle = evidence.get("idle_before") or {}
            detail = idle.get("detail") or "the servers were not idle before the point"
            points.append({
                "max_concurrency": c, "repetition": rep, "num_prompts": n, **({"arm": arm} if arm else {}),
                "warmup_requests": cfg.warmup_for(c), "server_start": current["start"], "not_run": True,
                "argv": [a.replace(remote.workdir, "<workdir>") for a in argv_point],
                "wall_s": round(wall, 3), "raw": {}, "details_file": None,
                "derived": derive({}, serving_gpus, None, None), "window": {}, "latency": None,
                "validity": {"passed": False, "failed": ["idle"], "gates": {"idle": {"passed": False, "detail": detail}},
                             "retok_ratio": None, "achieved_concurrency_ratio": None, "cache_hit_pct": None,
                             "errors": 0},
                "server_evidence": {"metrics_ports": metrics_ports, "idle_before": idle},
            })
            if spill is not None:
                spill.point(points[-1], None, None)
                spill.progress(build(incomplete="the sweep did not finish"))
            progress(f"{label}: INVALID (idle): {detail}")

        def restarted(what: str) -> dict:
            """After a restart: wait for the servers, read them again, and take this start's own
            provenance (what ran after the restart, not before it)."""
            remote.wait_health(serving_ports, cfg.server_timeout_s, helper_env)
            current["info"] = remote.server_info(decode_port, helper_env)
            if _context_of(current["info"]) != cfg.context_length:
                raise BenchAbort(exitcodes.ENVIRONMENT,
                                 f"{host.name}: after the restart for {what} the decode server reports "
                                 f"context length {_context_of(current['info'])}, not {cfg.context_length}")
            current["startup_time"] = decode_info(current["info"]).get("startup_time")
            prefill = None
            if prefill_port:
                answer = remote.helper("server-info", "--port", str(prefill_port), env=helper_env)
                prefill = answer.get("server_info") if answer.get("ok") else None
                current["prefill_startup_time"] = decode_info(prefill or {}).get("startup_time")
            start_probe = remote.probe()
            return sections(host=host, probe=start_probe, server_info=current["info"],
                            context_length=cfg.context_length, restarted=True, prefill_server_info=prefill)

        if ab is None:
            for rep in range(cfg.repeat):
                if rep and restart_before(rep, cfg.repeat, cfg.restarts):
                    progress(f"restarting the serving units before repetition {rep + 1}/{cfg.repeat} "
                             f"(--restarts {cfg.restarts})...")
                    (restart_units or remote.restart_units)(progress, cfg.server_timeout_s)
                    provenance = restarted(f"repetition {rep + 1}")
                    starts.append({"before_repetition": rep, "startup_time": current["startup_time"],
                                   "provenance_differs": _provenance_differs(first_provenance, provenance)})
                current["start"] = len(starts) - 1
                for c in cfg.concurrency:
                    run_point(c, rep, None)
        else:
            # Interleaved A B A B ..., a server restart before every arm, so that the variance from
            # restart to restart is inside each arm's interval.
            for rep in range(cfg.repeat):
                for arm in ab.arms:
                    progress(f"A/B: restarting the serving units with {ab.key}={ab.values[arm]} (arm {arm}, "
                             f"repetition {rep + 1}/{cfg.repeat})...")
                    (apply_arm or default_apply_arm)(inventory_path, host, cfg.context_length, ab, arm, progress,
                                                     cfg.server_timeout_s)
                    provenance = restarted(f"arm {arm}")
                    arm_provenance.setdefault(arm, provenance)
                    for c in cfg.concurrency:
                        run_point(c, rep, arm)
        if profile is not None:
            extras["profile"] = profile(remote, session, host, cfg, progress, helper_env)
    except (BenchAbort, RemoteError) as exc:
        if points:  # the completed points are kept: an incomplete record, never a baseline
            exc.partial = build(incomplete=str(exc))
        raise
    finally:
        remote.cleanup()
    result = build()
    if spill is not None:
        try:
            spill.finished(result)
        except SpillError as exc:  # every point is spilled already; the record is about to be published
            progress(f"warning: {exc}")
    return result


def restart_before(rep: int, repeat: int, restarts: int) -> bool:
    """Whether the servers restart before repetition ``rep`` (0-based): ``restarts`` restarts spread
    evenly over the gaps between the ``repeat`` repetitions (``repeat - 1`` of them: before each)."""
    if rep <= 0 or restarts <= 0:
        return False
    return (rep * (restarts + 1)) // repeat != ((rep - 1) * (restarts + 1)) // repeat


def _provenance_differs(first: dict, later: dict) -> list[str]:
    """Which provenance facts of a later server start differ from the first start's."""
    paths = (("software", "packages"), ("software", "sglang_wheel"), ("software", "dsv4kit_wheel"),
             ("software", "kernel_flags"), ("model", "weights_fingerprint"), ("server", "launch_args_sha256"),
             ("server", "resolved_args_sha256"), ("gpus", "driver"))
    return [".".join(p) for p in paths if (first.get(p[0]) or {}).get(p[1]) != (later.get(p[0]) or {}).get(p[1])]


def client_section(cfg: SweepConfig, *, tool_version: Optional[str], base_url: str) -> dict:
    """The record's ``client`` section: how the client was driven."""
    return {
        "tool": CLIENT_MODULE,
        "tool_version": tool_version,
        "backend": "sglang",
        "base_url": base_url,
        "dataset": {"name": DATASET, "input_len": cfg.input_len, "output_len": cfg.output_len,
                    "range_ratio": 1.0},
        "seed": cfg.seed,
        "tokenize_prompt": True,
        "flush_cache": True,
        "cache_report": True,
        "ignore_eos": True,
        "temperature": 0.0,
        "request_rate": "inf",
        "tokenizer": "model directory (dsv4_model_path), HF_HUB_OFFLINE=1",
        "env": dict(CLIENT_ENV),
        "num_prompts": {str(c): cfg.prompts_for(c) for c in cfg.concurrency},
        "warmup_requests": {str(c): cfg.warmup_for(c) for c in cfg.concurrency},
    }


def planned_record(cfg: SweepConfig, host) -> dict:
    """The parts of the record a sweep of ``cfg`` on ``host`` will write that decide comparability,
    as far as they are known before it runs: everything but the GPU model and the client version
    (``BOX_KEY_FIELDS``), which only the box's probe tells. Built the way the record is, so the
    two cannot drift apart; compare it with ``key_differences`` ignoring ``BOX_KEY_FIELDS``."""
    from dsv4kit.records.provenance import model_section, serving_gpu_count

    return scrub({
        "client": client_section(cfg, tool_version=None, base_url=""),
        "sweep": {"concurrency": list(cfg.concurrency), "gates": cfg.gates.to_dict()},
        "server": {"context_length": cfg.context_length},
        "model": model_section(host, {}, {}),
        "gpus": {"serving_count": serving_gpu_count(host)},
    })


def format_summary(record: dict) -> str:
    summary = record["summary"]
    if summary.get("per_arm"):
        ab = record.get("ab") or {}
        blocks = []
        for arm, per_c in summary["per_arm"].items():
            blocks.append(f"arm {arm}: {ab.get('key')}={(ab.get('values') or {}).get(arm)}")
            blocks.append(_summary_table(per_c["per_concurrency"]))
        if ab.get("summary") is not None:
            blocks.append(f"A/B (B against A): {ab.get('outcome')}: {ab.get('summary')}")
        return "\n".join(blocks)
    return _summary_table(summary["per_concurrency"])


def _summary_table(per_concurrency: dict) -> str:
    lines = [f"{'C':>5} {'valid':>7} {'decode tok/s':>24} {'per GPU':>9} {'output tok/s':>13} "
             f"{'TTFT p50 ms':>12} {'TPOT p50 ms':>12}"]
    for c, entry in per_concurrency.items():
        dec = entry["decode_tok_s"]

        def m(name: str, digits: int = 1) -> str:
            value = (entry.get(name) or {}).get("mean")
            return "-" if value is None else f"{value:.{digits}f}"

        if dec.get("n"):
            ci = dec.get("ci95")
            dec_text = f"{dec['mean']:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")
        else:
            dec_text = "-"
        lines.append(f"{c:>5} {entry['valid_repetitions']:>3}/{entry['total_repetitions']:<3} {dec_text:>24} "
                     f"{m('decode_tok_s_per_gpu'):>9} {m('output_throughput'):>13} {m('median_ttft_ms'):>12} "
                     f"{m('median_tpot_ms', 2):>12}")
    return "\n".join(lines)
