"""What ``dsv4kit profile`` does, as plain functions: check, drive the load, profile, fetch, analyse.

``plan`` makes every check that needs no box and raises ``Abort`` naming the problem. ``capture``
profiles the decode server once over an open ``dsv4kit.serving.session.ServingSession`` (its
scratch directory and box-side helper) with the bench's client command line; ``execute``
connects and captures each context asked for (restarting the serving units for another context
length through the serving session, as ``dsv4kit bench`` does). The command
(``dsv4kit.commands.profile``) only parses and prints.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from dsv4kit.bench import sweep
from dsv4kit.core import exitcodes
from dsv4kit.core.cli_common import doing
from dsv4kit.core.exitcodes import Abort
from dsv4kit.profile import breakdown, trace
from dsv4kit.records.record import decode_info
from dsv4kit.serving.abort import ServingAbort
from dsv4kit.serving.session import Addresses, ServingSession

Say = Callable[[str], None]
MAX_STEPS = 256
BOX_SCRIPT = Path(__file__).with_name("box_profile.py")
#: box_profile's failure kinds -> exit codes.
KIND_CODES = {"no_profiler": exitcodes.ENVIRONMENT, "rejected": exitcodes.TOOL_FAILED, "too_large": exitcodes.TOOL_FAILED,
              "timeout": exitcodes.TIMEOUT, "load": exitcodes.TOOL_FAILED, "interrupted": exitcodes.INTERRUPTED}


@dataclass
class ProfileRequest:
    ctx: int
    concurrency: int = 16
    compare_ctx: Optional[int] = None
    num_steps: int = 8
    input_len: Optional[int] = None
    output_len: Optional[int] = None
    max_trace_mb: float = 256.0
    steady_timeout: float = 900.0
    timeout: float = 600.0
    server_timeout: float = 1800.0
    restart: bool = True
    host: Optional[str] = None
    inventory: Optional[Path] = None
    max_class_share: list = field(default_factory=list)
    trust_new_host_key: bool = False


@dataclass
class ProfilePlan:
    request: ProfileRequest
    target: object
    inventory_path: Path
    contexts: list
    input_len: int
    output_len: int
    limits: dict


def check_request(req: ProfileRequest) -> tuple[int, int, dict]:
    """(input_len, output_len, share limits) once the arguments make sense; Abort(USAGE) otherwise."""
    problems = []
    if not 1 <= req.num_steps <= MAX_STEPS:
        problems.append(f"--num-steps must be between 1 and {MAX_STEPS} decode steps, got {req.num_steps} "
                        f"(each step of a 43-layer model is thousands of kernels in the trace)")
    if req.concurrency < 1:
        problems.append(f"--concurrency must be >= 1, got {req.concurrency}")
    if req.ctx < 2 or (req.compare_ctx is not None and req.compare_ctx < 2):
        problems.append("--ctx and --compare-ctx must be positive token counts")
    if req.compare_ctx is not None and req.compare_ctx == req.ctx:
        problems.append(f"--compare-ctx {req.compare_ctx} is --ctx itself: nothing to compare")
    if req.max_trace_mb <= 0:
        problems.append(f"--max-trace-mb must be > 0, got {req.max_trace_mb}")
    if problems:
        raise Abort(exitcodes.USAGE, "; ".join(problems))
    smallest = min(req.ctx, req.compare_ctx or req.ctx)
    osl = req.output_len if req.output_len is not None else 1024
    isl = req.input_len if req.input_len is not None else max(1, smallest - max(1024, osl) - 64)
    if osl < req.num_steps + 32:
        problems.append(f"--output-len {osl} is too short for --num-steps {req.num_steps}: the requests must still "
                        f"be decoding when the profile ends (give at least {req.num_steps + 32})")
    if isl < 1 or isl + osl > smallest:
        problems.append(f"--input-len {isl} + --output-len {osl} must fit the smaller context length {smallest} "
                        f"(both contexts are profiled with the same request lengths)")
    if problems:
        raise Abort(exitcodes.USAGE, "; ".join(problems))
    return isl, osl, breakdown.parse_share_limits(req.max_class_share)


def plan(req: ProfileRequest) -> ProfilePlan:
    from dsv4kit.core.inventory import InventoryError, default_inventory_path, load_inventory

    isl, osl, limits = check_request(req)
    inventory_path = req.inventory or default_inventory_path()
    try:
        target = load_inventory(inventory_path).host(req.host)
        sweep.check_host(target)
    except InventoryError as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None
    contexts = [req.ctx] + ([req.compare_ctx] if req.compare_ctx else [])
    return ProfilePlan(request=req, target=target, inventory_path=inventory_path, contexts=contexts,
                       input_len=isl, output_len=osl, limits=limits)


def _client_argv(remote, host, *, ctx: int, concurrency: int, isl: int, osl: int, out_file: str) -> list:
    cfg = sweep.SweepConfig(context_length=ctx, concurrency=[concurrency], input_len=isl, output_len=osl,
                            num_prompts=concurrency, warmup_requests=1)
    return sweep.client_argv(remote.python, cfg, concurrency=concurrency, base_url=Addresses.of(host).router_url,
                             model_path=str(host["dsv4_model_path"]), output_file=out_file, tag="dsv4kit-profile")


def capture(remote, session, host, *, ctx: int, concurrency: int, num_steps: int, isl: int, osl: int,
            max_trace_mb: float, steady_timeout: float, timeout: float, progress: Say,
            env: Optional[dict] = None) -> dict:
    """Profile ``num_steps`` decode steps under a steady load of ``concurrency`` requests; the
    combined breakdown. ``remote`` is a set-up ``dsv4kit.serving.session.ServingSession``."""
    decode_port = Addresses.of(host).decode_port
    info = remote.server_info(decode_port, env)
    ranks = int(decode_info(info).get("tp_size") or 1)
    session.put(BOX_SCRIPT, f"{remote.workdir}/{BOX_SCRIPT.name}")
    profile_id = f"dsv4kit-{ctx}-{int(time.time())}"
    out_dir = f"{remote.workdir}/traces-{ctx}"
    argv = _client_argv(remote, host, ctx=ctx, concurrency=concurrency, isl=isl, osl=osl,
                        out_file=f"{remote.workdir}/profile-{ctx}.jsonl")
    command = [remote.python, f"{remote.workdir}/{BOX_SCRIPT.name}", "run", "--port", str(decode_port),
               "--out-dir", out_dir, "--profile-id", profile_id, "--num-steps", str(num_steps),
               "--min-running", str(concurrency), "--expect-ranks", str(ranks),
               "--max-trace-bytes", str(int(max_trace_mb * 1e6)), "--steady-timeout", f"{steady_timeout:g}",
               "--files-timeout", f"{timeout:g}", "--", *argv]
    doing(f"profiling the decode server at context {ctx}", "the server is asked to stop profiling; nothing was written")
    progress(f"profile at context {ctx}: {concurrency} requests of {isl}+{osl} tokens, then {num_steps} decode "
             f"steps of profile on port {decode_port} ({ranks} rank(s))...")
    try:
        result = session.run(shlex.join(command), timeout=steady_timeout + timeout + 120, env={**sweep.CLIENT_ENV,
                             **(env or {})}, cwd=remote.workdir, check=False)
    except KeyboardInterrupt:
        stopped = _stop(remote, session, decode_port, env)
        raise Abort(exitcodes.INTERRUPTED, f"interrupted during the profile at context {ctx}; {stopped}") from None
    answer = _last_json(result.stdout)
    if not answer.get("ok"):
        kind = answer.get("kind", "load")
        error = answer.get("error") or (result.stderr or result.stdout).strip()[-800:]
        if kind == "load":
            error += "; the client's output: " + _tail(session, f"{remote.workdir}/profile-client.log")
        stopped = answer.get("stop_profile")
        note = f" (sent /stop_profile: HTTP {stopped.get('status')})" if stopped else ""
        raise Abort(KIND_CODES.get(kind, exitcodes.TOOL_FAILED), f"profile at context {ctx}: {error}{note}")
    ranks_out = []
    with tempfile.TemporaryDirectory(prefix="dsv4kit-profile-") as tmp:
        for item in answer["files"]:
            local = Path(tmp) / Path(item["path"]).name
            session.get(item["path"], local)
            try:
                ranks_out.append(trace.analyze_file(local, steps_hint=num_steps))
            except trace.TraceError as exc:
                raise Abort(exitcodes.TOOL_FAILED, f"profile at context {ctx}: {exc}") from None
    profile = breakdown.combine(ranks_out, context_length=ctx, concurrency=concurrency, input_len=isl,
                                output_len=osl, num_steps_requested=num_steps, profile_id=profile_id,
                                trace_bytes=sum(i["bytes"] for i in answer["files"]))
    tok = answer.get("metrics_tok_s")
    profile["metrics_tok_s"] = tok
    profile["tok_s"], profile["tok_s_source"] = ((tok, "sglang:gen_throughput before the profile") if tok else
                                                  (profile.get("trace_tok_s"), "batch size / step time in the trace"))
    return profile


def _stop(remote, session, port: int, env) -> str:
    """After Ctrl-C: ask the server to stop profiling (best effort) and say what came of it."""
    try:
        result = session.run(shlex.join([remote.python, f"{remote.workdir}/{BOX_SCRIPT.name}", "stop", "--port",
                                         str(port)]), timeout=90, env=env, check=False)
        answer = _last_json(result.stdout)
        return f"sent /stop_profile to the decode server (HTTP {answer.get('status')}: {answer.get('message')})"
    except Exception as exc:  # the box-side script's own TERM handler has sent it too
        return f"could not send /stop_profile ({exc}); the box-side script sends it when killed"


def _last_json(text: str) -> dict:
    for line in reversed([l for l in (text or "").splitlines() if l.strip()]):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return {}


def _tail(session, path: str) -> str:
    result = session.run(f"tail -c 1500 {shlex.quote(path)}", timeout=30, check=False)
    return result.stdout.strip() or "(empty)"


def check_client(remote, session, host) -> None:
    """Abort(ENVIRONMENT) unless the box's SGLang venv has SGLang's bench client, which drives the load."""
    probe = (f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('sglang') and "
             f"importlib.util.find_spec('{sweep.CLIENT_MODULE}') else 3)")
    found = session.run(shlex.join([remote.python, "-c", probe]), timeout=120, check=False)
    if found.exit_code != 0:
        raise Abort(exitcodes.ENVIRONMENT,
                    f"{host.name}: SGLang's bench client ({sweep.CLIENT_MODULE}) is not installed in {remote.python} "
                    f"(dsv4_venv_dir): the profile's load comes from it. Run `dsv4kit provision` (or point "
                    f"dsv4_venv_dir at the SGLang venv); nothing was profiled")


def execute(p: ProfilePlan, progress: Say, restart: Optional[Callable] = None) -> dict:
    """Connect, profile each context, and return {"profiles": [...], "context_tax": ... or None,
    "gate", "exit_code"}. ``restart`` replaces the playbook restart
    (``dsv4kit.serving.remote.default_restart``)."""
    from dsv4kit.core.ssh import RemoteError, open_session

    req = p.request
    profiles = []
    doing(f"connecting to {p.target.name}", "nothing was written")
    try:
        with open_session(p.target, trust_new_host_key=req.trust_new_host_key, say=progress) as session:
            doing(f"preparing the bench client on {p.target.name}", "nothing was written")
            with ServingSession(session, p.target, progress, inventory_path=p.inventory_path) as remote:
                check_client(remote, session, p.target)
                for ctx in p.contexts:
                    doing(f"checking the serving units' context length ({ctx})", "nothing was written")
                    remote.ensure_context(ctx, req.server_timeout, allow_restart=req.restart, restart=restart)
                    profiles.append(capture(remote, session, p.target, ctx=ctx, concurrency=req.concurrency,
                                            num_steps=req.num_steps, isl=p.input_len, osl=p.output_len,
                                            max_trace_mb=req.max_trace_mb, steady_timeout=req.steady_timeout,
                                            timeout=req.timeout, progress=progress, env=remote.env))
    except ServingAbort as exc:
        raise Abort(exc.exit_code, str(exc)) from None
    except RemoteError as exc:
        raise Abort(exc.exit_code, str(exc)) from None
    tax = breakdown.compare_contexts(profiles[0], profiles[1]) if len(profiles) == 2 else None
    breaches = breakdown.check_shares(profiles[0], p.limits)
    return {"profiles": profiles, "context_tax": tax, "gate": {"limits": p.limits, "breaches": breaches},
            "exit_code": exitcodes.CHECK_FAILED if breaches else exitcodes.OK}


def bench_hook(num_steps: int, share_limits: list[str]) -> Callable:
    """What ``dsv4kit bench --profile`` runs after its points, on the sweep's own session: one
    profile at the sweep's context, at its largest concurrency. A failed profile is recorded as
    ``{"error": ...}`` (the sweep is kept); Ctrl-C stays Ctrl-C."""
    limits = breakdown.parse_share_limits(share_limits)

    def hook(remote, session, host, cfg, progress: Say, env: Optional[dict]) -> dict:
        osl = max(cfg.output_len, num_steps + 32)
        isl = max(1, min(cfg.input_len, cfg.context_length - osl))
        try:
            profile = capture(remote, session, host, ctx=cfg.context_length, concurrency=max(cfg.concurrency),
                              num_steps=num_steps, isl=isl, osl=osl, max_trace_mb=256.0, steady_timeout=900.0,
                              timeout=600.0, progress=progress, env=env)
        except Abort as exc:
            if exc.exit_code == exitcodes.INTERRUPTED:
                raise KeyboardInterrupt from None
            progress(f"warning: the profile failed; the sweep is recorded without it: {exc}")
            return {"error": str(exc), "exit_code": exc.exit_code}
        profile.pop("per_rank", None)  # the record keeps the combined breakdown
        profile["gate"] = {"limits": limits, "breaches": breakdown.check_shares(profile, limits)}
        return profile

    return hook
