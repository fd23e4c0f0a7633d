"""The sweep's configuration: the options as the sweep uses them, checked before any connection.

``SweepConfig`` and its checks (``check_config``, ``check_host``, ``check_restart_tools``), the
client's command line (``client_argv``) and the record sections that follow from the
configuration alone (``client_section``, ``planned_record``). ``from_request`` turns the CLI's
``BenchRequest`` into a checked ``SweepConfig`` in one step.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

from dsv4kit.bench import api as bench_api
from dsv4kit.bench.gates import GateConfig
from dsv4kit.core import exitcodes
from dsv4kit.core.scrub import scrub
from dsv4kit.serving.abort import ServingAbort
from dsv4kit.serving.remote import PROBE_TIMEOUT_S, RESTART_TAG, SMALL_TIMEOUT_S  # noqa: F401  (re-exported)

CLIENT_MODULE = "sglang.benchmark.serving"
DATASET = "random-ids"
#: Input lengths at or above this are "long context": fewer prompts per point (each is a big prefill).
LONG_INPUT = 32768
CLIENT_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
              "PYTHONUNBUFFERED": "1"}
#: Requests per prompt length of ``--prefill`` (one at a time, the cache flushed before each).
PREFILL_REQUESTS = 3


def prefill_lengths(context_length: int, text: Optional[str]) -> list:
    """``--prefill-lengths`` as a list (Abort(USAGE) naming a bad one); None: 1024, 8192, 32768 and
    ``ctx - 1024``, those below the context length (a request needs room for its one new token)."""
    if text is None:
        wanted = [1024, 8192, 32768, context_length - 1024]
        return sorted({n for n in wanted if 1 <= n < context_length})
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise exitcodes.Abort(exitcodes.USAGE, f"--prefill-lengths must be comma-separated integers, got {text!r}") from None
    bad = [v for v in values if not 1 <= v < context_length]
    if not values or bad:
        raise exitcodes.Abort(exitcodes.USAGE, f"--prefill-lengths: each length must be 1 to {context_length - 1} "
                                               f"(below --ctx {context_length}), got {text!r}")
    return sorted(set(values))


#: Comparability-key fields that only the box can tell (the probe), not known before a sweep.
BOX_KEY_FIELDS = ("gpu_model", "client_tool_version", "kernel_flags", "sglang_wheel", "sgl_kernel", "flashinfer",
                  "dsv4kit_wheel", "weights", "driver", "launch_args")


#: Stop the sweep: nothing is recorded. The serving stack's own type, so that its failed restarts
#: and health waits stop a sweep as the sweep's own failures do.
BenchAbort = ServingAbort


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
    metrics_interval_s: float = 0.1
    gates: GateConfig = field(default_factory=GateConfig)
    verbose: bool = False
    #: Seconds between two progress lines inside a point (requests done, rate, ETA).
    progress_every_s: float = 10.0
    #: ``--prefill``: the prompt lengths of the cold-prefill measurement (empty: none).
    prefill_lengths: list = field(default_factory=list)
    prefill_requests: int = PREFILL_REQUESTS
    #: ``--api``: the route measured (``dsv4kit.bench.api``).
    api: str = "generate"

    def prompts_for(self, concurrency: int) -> int:
        if self.num_prompts:
            return self.num_prompts
        if self.input_len >= LONG_INPUT:
            return max(8, 2 * concurrency)
        return max(32, 10 * concurrency)

    def warmup_for(self, concurrency: int) -> int:
        return self.warmup_requests if self.warmup_requests is not None else max(concurrency, 8)


def from_request(req) -> "SweepConfig":
    """The CLI's ``BenchRequest`` (``dsv4kit.bench.run``) as a checked SweepConfig; Abort(USAGE) naming
    the first problem, in the user's terms first (``dsv4kit.bench.args``), then the derived lengths."""
    from dsv4kit.bench.args import check_lengths, check_prompts

    for name, value in (("--point-timeout", req.point_timeout), ("--server-timeout", req.server_timeout)):
        if not math.isfinite(value):
            raise exitcodes.Abort(exitcodes.USAGE, f"{name} must be a finite number of seconds, got {value}")
    check_lengths(req.ctx, req.input_len, req.output_len)
    check_prompts(req.num_prompts, req.concurrency, req.min_concurrency_ratio, ratio_given=req.ratio_given)
    isl, osl = default_lengths(req.ctx, req.input_len, req.output_len)
    cfg = SweepConfig(
        context_length=req.ctx, concurrency=parse_concurrency(req.concurrency), input_len=isl, output_len=osl,
        repeat=req.repeat, num_prompts=req.num_prompts, warmup_requests=req.warmup_requests, seed=req.seed,
        point_timeout_s=req.point_timeout, server_timeout_s=req.server_timeout, restart=req.restart,
        verbose=req.verbose, metrics_interval_s=req.metrics_interval, restarts=req.restarts,
        api=bench_api.check(req.api),
        gates=GateConfig(retok_tolerance=req.retok_tolerance, min_concurrency_ratio=req.min_concurrency_ratio,
                         max_cache_hit_pct=req.max_cache_hit_pct, idle_timeout_s=req.idle_timeout),
    )
    if req.prefill:
        cfg.prefill_lengths = prefill_lengths(req.ctx, req.prefill_lengths)
    elif req.prefill_lengths is not None:
        raise exitcodes.Abort(exitcodes.USAGE, "--prefill-lengths needs --prefill")
    check_config(cfg)
    return cfg


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
    if any(not v.strip() for v in text.split(",")):
        raise BenchAbort(exitcodes.USAGE, f"--concurrency {text!r} has an empty item; give comma-separated "
                                          f"integers, e.g. 1,16,64")
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
                output_file: str, tag: str, served_name: Optional[str] = None) -> list[str]:
    """The exact ``sglang.benchmark.serving`` command line of one point (``served_name``: the
    model's name on the chat route, ``--api chat``)."""
    return [
        python, "-m", CLIENT_MODULE,
        *bench_api.client_flags(cfg.api, model_path=model_path, served_name=served_name),
        "--base-url", base_url,
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
        "--cache-report",
        "--output-details",
        "--output-file", output_file,
        "--tag", tag,
        "--ready-check-timeout-sec", "60",
    ]  # the client's progress bar stays on: the box side reads its request count for the progress lines



def slo_limits(host) -> Optional[dict]:
    """The p99 TTFT/TPOT limits of goodput, from the inventory (None when neither is set)."""
    limits = {"ttft_ms": host.get("dsv4_bench_slo_ttft_ms"), "tpot_ms": host.get("dsv4_bench_slo_tpot_ms")}
    if all(v is None for v in limits.values()):
        return None
    return {**limits, "source": "inventory dsv4_bench_slo_ttft_ms / dsv4_bench_slo_tpot_ms", "percentile": 99}



def client_section(cfg: SweepConfig, *, tool_version: Optional[str], base_url: str) -> dict:
    """The record's ``client`` section: how the client was driven, through which API."""
    return {
        "tool": CLIENT_MODULE,
        "tool_version": tool_version,
        "api": cfg.api,
        "backend": bench_api.BACKENDS[cfg.api],
        "base_url": base_url,
        "dataset": {"name": DATASET, "input_len": cfg.input_len, "output_len": cfg.output_len,
                    "range_ratio": 1.0},
        "seed": cfg.seed,
        "tokenize_prompt": cfg.api == "generate",
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


