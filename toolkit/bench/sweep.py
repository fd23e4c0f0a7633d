"""The sweep loop behind ``dsv4kit bench``: drive the real client on the box, point by point.

Steps (each remote step has a timeout; see docs/benchmarking.md):

1. The configuration is checked before anything connects (``dsv4kit.bench.config``).
2. Connect, make a scratch directory on the box, copy the box-side package there (``dsv4kit.serving.remote``).
3. Read ``/server_info`` of the decode server. If its ``context_length`` differs from ``--ctx``,
   re-run the playbook's ``sglang_service`` tag with ``dsv4_context_length=<ctx>``, wait for
   ``/health`` on every serving port, and read it back again.
4. Probe provenance on the box (versions, GPUs, serving processes, model files).
5. For each repetition, for each concurrency: run ``python -m sglang.benchmark.serving`` under
   ``dsv4box run-point`` (``/metrics`` scrapes, GPU telemetry, a ``meta_info`` probe, the
   client's own request count as progress), fetch the result line and the evidence, and turn
   them into the point's entry (``dsv4kit.bench.assembly``: the exact-occupancy window, the
   gates); spill the point locally at once (``dsv4kit.bench.spill``). With ``--ab`` the
   repetitions alternate between two arms, with a restart before each (``dsv4kit.serving.arms``).
6. Remove the scratch directory. Only then is the record built; ``dsv4kit bench`` publishes it.
   A sweep that stops after some points hands its completed points back as an incomplete
   record (``exc.partial``).
"""

from __future__ import annotations

import json
import shlex
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from dsv4kit.bench import assembly
from dsv4kit.bench.assembly import (PointContext, SweepResult, SweepState, _context_of,  # noqa: F401
                                    _provenance_differs, arm_comparison, format_summary)
from dsv4kit.bench.gpu_throttle import dcgm_port
from dsv4kit.bench.config import (BOX_KEY_FIELDS, CLIENT_ENV, CLIENT_MODULE, LONG_INPUT,  # noqa: F401
                                  RESTART_TAG, BenchAbort, SweepConfig, check_config, check_host,
                                  check_restart_tools, client_argv, client_section, default_lengths,
                                  parse_concurrency, planned_record, run_names, safe_name, slo_limits, utc_stamp)
from dsv4kit.bench.spill import (MIN_FREE_MB, Spill, SpillError, check_free_space,  # noqa: F401
                                 default_spill_root, write_durably)
from dsv4kit.core import exitcodes
from dsv4kit.core.ssh import RemoteError
from dsv4kit.records.record import decode_info
from dsv4kit.serving.arms import (ABSpec, arm_extra_vars, default_apply_arm,  # noqa: F401  (re-exported)
                                  parse_ab)
from dsv4kit.serving.box.point import NOT_IDLE_EXIT, PROGRESS_PREFIX
from dsv4kit.serving.remote import default_restart  # noqa: F401  (re-exported)
from dsv4kit.serving.served_model import expected_model, served_name_candidates
from dsv4kit.serving.session import Addresses, ServingSession, api_env

Say = Callable[[str], None]


def _eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class PointProgress:
    """Turns the box helper's progress lines into 'requests done of total, rate, ETA' lines."""

    def __init__(self, s: SweepState, label: str, progress: Say, verbose: bool):
        self.s, self.label, self.progress, self.verbose = s, label, progress, verbose
        self.started = time.monotonic()

    def __call__(self, line: str) -> None:
        if not line.startswith(PROGRESS_PREFIX):
            if self.verbose:
                self.progress(f"  | {line}")
            return
        try:
            state = json.loads(line[len(PROGRESS_PREFIX):])
        except ValueError:
            return
        done, total = state.get("done"), state.get("total")
        point_eta = None
        elapsed = state.get("measured_s")
        if isinstance(done, int) and isinstance(total, int) and done > 0 and elapsed:
            point_eta = elapsed * (total - done) / done
        self.progress(f"  {self.label}: {done if done is not None else '?'}/{total if total is not None else '?'} "
                      f"requests, decode {assembly._num(state.get('decode_tok_s'))} tok/s, running "
                      f"{assembly._num(state.get('running'), 0)}, queued {assembly._num(state.get('queued'), 0)}; "
                      f"ETA point {_eta(point_eta)}, sweep {_eta(self.sweep_eta(point_eta))}")

    def sweep_eta(self, point_eta: Optional[float]) -> Optional[float]:
        """This point's ETA plus the points still to run, each as long as the mean finished one
        (or as this one, when none has finished)."""
        if point_eta is None:
            return None
        left = self.s.total - len(self.s.points) - 1
        this_point = time.monotonic() - self.started + point_eta
        per_point = (sum(self.s.point_seconds) / len(self.s.point_seconds)) if self.s.point_seconds else this_point
        return point_eta + left * per_point


def run_sweep(cfg: SweepConfig, *, host, session, inventory_path, progress: Say,
              argv: Optional[list[str]] = None, stamp: Optional[str] = None,
              restart: Optional[Callable] = None, spill_root: Optional[Path] = None,
              ab: Optional[ABSpec] = None, apply_arm: Optional[Callable] = None,
              restart_units: Optional[Callable] = None, profile: Optional[Callable] = None) -> SweepResult:
    """Run the whole sweep over ``session``; return the record (nothing is published here).

    Each finished point is written at once under ``spill_root/<run_id>/`` (``Spill``). When the
    sweep stops after some points (BenchAbort, RemoteError), the exception carries ``partial``: an
    incomplete record with the completed points, for the caller to publish. ``profile`` (``bench
    --profile``, ``dsv4kit.profile.run.bench_hook``) runs after the last point; what it returns is
    the record's ``profile`` section."""
    check_config(cfg)
    check_host(host)
    created = datetime.now(timezone.utc)
    run_id, tag = run_names(host.name, cfg.context_length, stamp or utc_stamp(created))
    s = SweepState(cfg=cfg, run_id=run_id, tag=tag, created=created, started=time.time(), argv=argv,
                   total=cfg.repeat * len(cfg.concurrency) * (2 if ab else 1), ab=ab, slo=slo_limits(host))
    helper_env = api_env(host)
    env = {**CLIENT_ENV, **(helper_env or {})}
    spill = Spill(Path(spill_root) / run_id, progress) if spill_root is not None else None
    if spill is not None:
        spill.create()
    remote = ServingSession(session, host, progress, inventory_path)
    try:
        remote.setup()
        loop = _SweepLoop(s, remote, host, inventory_path, progress, env, helper_env, spill)
        loop.prepare(restart)
        if spill is not None:  # from here on the spill always holds a record the points join
            spill.progress(assembly.build_record(s, incomplete="the sweep did not finish"))
        loop.run(apply_arm, restart_units)
        if cfg.prefill_lengths:  # under --ab each arm's was taken after its last repetition
            from dsv4kit.bench.prefill import ab_section

            s.extras["prefill"] = ab_section(loop.prefill_arms) if ab else loop.prefill()
        if profile is not None:
            s.extras["profile"] = profile(remote, session, host, cfg, progress, helper_env)
    except (BenchAbort, RemoteError) as exc:
        if s.points:  # the completed points are kept: an incomplete record, never a baseline
            exc.partial = assembly.build_record(s, incomplete=str(exc))
        elif spill is not None:
            spill.remove()  # no point finished: nothing to keep
        raise
    except KeyboardInterrupt as exc:
        if not s.points and spill is not None:
            spill.remove()
        exc.points_kept = (len(s.points), spill.directory if s.points and spill is not None else None)
        raise
    finally:
        remote.cleanup()
    result = assembly.build_record(s)
    if spill is not None:
        try:
            spill.finished(result)
        except SpillError as exc:  # every point is spilled already; the record is about to be published
            progress(f"warning: {exc}")
    return result


class _SweepLoop:
    """The steps of one sweep after the box is set up: read the servers, then every point."""

    def __init__(self, s: SweepState, remote: ServingSession, host, inventory_path, progress: Say, env: dict,
                 helper_env: Optional[dict], spill: Optional[Spill]):
        self.s, self.remote, self.host, self.inventory_path = s, remote, host, inventory_path
        self.progress, self.env, self.helper_env, self.spill = progress, env, helper_env, spill
        addresses = Addresses.of(host)
        self.decode_port, self.router_port = addresses.decode_port, addresses.router_port
        self.serving_ports, self.prefill_port = addresses.serving_ports, addresses.prefill_port
        self.current: dict = {}

    def prepare(self, restart: Optional[Callable]) -> None:
        """Read the decode server (restarting it for ``--ctx`` when needed), the prefill server and
        the box's provenance."""
        from dsv4kit.records.provenance import sections
        from dsv4kit.serving.pins import pin_running

        s, cfg, remote, host = self.s, self.s.cfg, self.remote, self.host
        restarted = remote.ensure_context(cfg.context_length, cfg.server_timeout_s, allow_restart=cfg.restart,
                                          restart=restart)
        if restarted:
            s.notes.append(f"serving units restarted for context length {cfg.context_length}")
        info = remote.decode_info()
        current = _context_of(info)
        self.progress(f"decode server on {host.name}:{self.decode_port}: context length {current} (ok)")
        prefill_info = None
        if self.prefill_port:
            answer = remote.helper("server-info", "--port", str(self.prefill_port), env=self.helper_env)
            prefill_info = answer.get("server_info") if answer.get("ok") else None
            if prefill_info is None:
                s.notes.append(f"prefill server /server_info unavailable: {answer.get('error')}")
        s.probe = probe = remote.probe()
        if s.ab is not None:  # every arm restarts the units: each other 'auto' stays as they run it now
            pin_running(host, probe, cfg.context_length, keep=s.ab.key)
        if not (probe.get("packages") or {}).get("sglang"):
            raise BenchAbort(exitcodes.ENVIRONMENT, f"{host.name}: sglang is not installed in {remote.python}")
        gpus_note = (probe.get("gpus") or {}).get("reason")
        if gpus_note:
            s.notes.append(f"GPU facts unavailable: {gpus_note}")
        s.base_url = f"http://127.0.0.1:{self.router_port}"
        s.first_provenance = sections(host=host, probe=probe, server_info=info, context_length=cfg.context_length,
                                      restarted=restarted, prefill_server_info=prefill_info)
        remote.units = sorted((probe.get("units") or {}).keys())
        startup_time = decode_info(info).get("startup_time")
        s.starts = [{"before_repetition": 0, "startup_time": startup_time, "provenance_differs": []}]
        self.current = {"info": info, "startup_time": startup_time, "start": 0,
                        "prefill_startup_time": decode_info(prefill_info or {}).get("startup_time")}
        serving_gpus = self.serving_gpus(info, prefill_info, s.first_provenance)
        self.ctx = PointContext(decode_port=self.decode_port, prefill_port=self.prefill_port,
                                metrics_ports=[self.decode_port] + ([self.prefill_port] if self.prefill_port else []),
                                serving_gpus=serving_gpus, model=expected_model(host, probe))

    def run(self, apply_arm: Optional[Callable], restart_units: Optional[Callable]) -> None:
        s, cfg, ab = self.s, self.s.cfg, self.s.ab
        self.prefill_arms: dict = {}  # --prefill under --ab: each arm's, after its last repetition
        if ab is None:
            for rep in range(cfg.repeat):
                if rep and restart_before(rep, cfg.repeat, cfg.restarts):
                    self.progress(f"restarting the serving units before repetition {rep + 1}/{cfg.repeat} "
                                  f"(--restarts {cfg.restarts})...")
                    (restart_units or self.remote.restart_units)(self.progress, cfg.server_timeout_s)
                    provenance = self.restarted(f"repetition {rep + 1}")
                    s.starts.append({"before_repetition": rep, "startup_time": self.current["startup_time"],
                                     "provenance_differs": _provenance_differs(s.first_provenance, provenance)})
                self.current["start"] = len(s.starts) - 1
                for c in cfg.concurrency:
                    self.point(c, rep, None)
            return
        # Interleaved A B A B ..., a server restart before every arm, so that the variance from
        # restart to restart is inside each arm's interval.
        for rep in range(cfg.repeat):
            for arm in ab.arms:
                self.progress(f"A/B: restarting the serving units with {ab.key}={ab.values[arm]} (arm {arm}, "
                              f"repetition {rep + 1}/{cfg.repeat})...")
                (apply_arm or default_apply_arm)(self.inventory_path, self.host, cfg.context_length, ab, arm,
                                                 self.progress, cfg.server_timeout_s)
                provenance = self.restarted(f"arm {arm}")
                s.arm_provenance.setdefault(arm, provenance)
                for c in cfg.concurrency:
                    self.point(c, rep, arm)
                if cfg.prefill_lengths and rep == cfg.repeat - 1:  # --prefill with this arm's servers
                    self.prefill_arms[arm] = self.prefill()

    def point(self, c: int, rep: int, arm: Optional[str]) -> None:
        s, cfg, remote, ab = self.s, self.s.cfg, self.remote, self.s.ab
        label = f"[{len(s.points) + 1}/{s.total}] C={c} rep {rep + 1}/{cfg.repeat}" + (
            f" arm {arm} ({ab.key}={ab.values[arm]})" if arm else "")
        suffix = f"_{arm}" if arm else ""
        n = cfg.prompts_for(c)
        out_file = f"{remote.workdir}/c{c}_r{rep}{suffix}.jsonl"
        argv_point = client_argv(remote.python, cfg, concurrency=c, base_url=s.base_url,
                                 model_path=str(self.host["dsv4_model_path"]), output_file=out_file,
                                 served_name=next(iter(served_name_candidates(self.host)), None),
                                 tag=f"{s.run_id}/c{c}/r{rep}" + (f"/{arm}" if arm else ""))
        evidence_file = f"{remote.workdir}/c{c}_r{rep}{suffix}.evidence.json"
        wrapped = [*remote.box_command("run-point"),
                   "--evidence-out", evidence_file, "--metrics-ports", ",".join(map(str, self.ctx.metrics_ports)),
                   "--probe-port", str(self.router_port), "--interval", f"{cfg.metrics_interval_s:g}",
                   "--idle-timeout", f"{cfg.gates.idle_timeout_s:g}", "--progress-every",
                   f"{cfg.progress_every_s:g}", "--dcgm-port", str(dcgm_port(self.host)), "--", *argv_point]
        self.progress(f"{label}: {n} prompts of {cfg.input_len}+{cfg.output_len} tokens, "
                      f"warm-up {cfg.warmup_for(c)}...")
        t0 = time.monotonic()
        result = self.remote.session.run(shlex.join(wrapped), timeout=cfg.point_timeout_s, env=self.env,
                                         cwd=remote.workdir, stream=PointProgress(s, label, self.progress, cfg.verbose),
                                         check=False)
        wall = time.monotonic() - t0
        shown_argv = [a.replace(remote.workdir, "<workdir>") for a in argv_point]
        common = dict(c=c, rep=rep, arm=arm, n=n, argv_point=shown_argv, wall=wall)
        if result.exit_code == NOT_IDLE_EXIT:
            point = assembly.not_run_point(s, self.ctx, self.current, evidence=remote.fetch_json(evidence_file, label),
                                           **common)
            self.keep(point, None)
            self.progress(f"{label}: INVALID (idle): {point['validity']['gates']['idle']['detail']}")
            return
        if result.exit_code != 0:
            tail = (result.stderr.strip() or result.stdout.strip())[-1500:]
            raise BenchAbort(exitcodes.TOOL_FAILED,
                             f"{label}: {CLIENT_MODULE} exited {result.exit_code}; sweep aborted:\n{tail}")
        line = remote.fetch_line(out_file, label)
        evidence = remote.fetch_json(evidence_file, label)
        point = assembly.measured_point(s, self.ctx, self.current, line=line, evidence=evidence, **common)
        self.keep(point, point["details_file"])
        s.point_seconds.append(wall)
        self.progress(assembly.point_line(label, point, wall))
        validity = point["validity"]
        for name in validity["failed"]:
            self.progress(f"    gate {name}: {validity['gates'][name]['detail']}")

    def prefill(self) -> dict:
        """``--prefill``: cold prefill tokens/s per prompt length from the prefill server's counters."""
        from dsv4kit.bench import prefill

        cfg = self.s.cfg
        return prefill.run(self.remote, cfg.prefill_lengths, router_port=self.router_port,
                           prefill_port=self.prefill_port or self.decode_port, requests=cfg.prefill_requests,
                           seed=cfg.seed, timeout=cfg.point_timeout_s, env=self.helper_env, progress=self.progress,
                           decode_port=self.decode_port, idle_timeout=cfg.gates.idle_timeout_s)

    def keep(self, point: dict, details_file: Optional[str]) -> None:
        self.s.points.append(point)
        if self.spill is not None:
            self.spill.point(point, details_file, self.s.details.get(details_file) if details_file else None)
            self.spill.progress(assembly.build_record(self.s, incomplete="the sweep did not finish"))

    def serving_gpus(self, info: dict, prefill_info: Optional[dict], provenance: dict) -> int:
        """The GPUs the serving servers report (``dsv4kit.bench.gpu_count``), written into
        ``provenance``; a disagreement with the inventory stops the run."""
        from dsv4kit.bench import gpu_count

        total, problem = gpu_count.check(self.host, decode_info(info),
                                         decode_info(prefill_info or {}) if self.prefill_port else None)
        if problem:
            raise BenchAbort(exitcodes.ENVIRONMENT, f"{self.host.name}: {problem}")
        # serving_count stays the inventory's (the records' comparability key); the per-GPU
        # rates divide by what the servers report, which agrees with it server by server
        provenance["gpus"]["servers_report"] = total
        return total

    def restarted(self, what: str) -> dict:
        """After a restart: wait for the servers, read them again, and take this start's own
        provenance (what ran after the restart, not before it)."""
        from dsv4kit.records.provenance import sections

        cfg, remote = self.s.cfg, self.remote
        remote.wait_health(self.serving_ports, cfg.server_timeout_s, self.helper_env)
        self.current["info"] = remote.server_info(self.decode_port, self.helper_env)
        if _context_of(self.current["info"]) != cfg.context_length:
            raise BenchAbort(exitcodes.ENVIRONMENT,
                             f"{self.host.name}: after the restart for {what} the decode server reports "
                             f"context length {_context_of(self.current['info'])}, not {cfg.context_length}")
        self.current["startup_time"] = decode_info(self.current["info"]).get("startup_time")
        prefill = None
        if self.prefill_port:
            answer = remote.helper("server-info", "--port", str(self.prefill_port), env=self.helper_env)
            prefill = answer.get("server_info") if answer.get("ok") else None
            self.current["prefill_startup_time"] = decode_info(prefill or {}).get("startup_time")
        start_probe = remote.probe()
        self.ctx.model = expected_model(self.host, start_probe)
        provenance = sections(host=self.host, probe=start_probe, server_info=self.current["info"],
                              context_length=cfg.context_length, restarted=True, prefill_server_info=prefill)
        self.ctx.serving_gpus = self.serving_gpus(self.current["info"], prefill, provenance)
        return provenance


def restart_before(rep: int, repeat: int, restarts: int) -> bool:
    """Whether the servers restart before repetition ``rep`` (0-based): ``restarts`` restarts spread
    evenly over the gaps between the ``repeat`` repetitions (``repeat - 1`` of them: before each)."""
    if rep <= 0 or restarts <= 0:
        return False
    return (rep * (restarts + 1)) // repeat != ((rep - 1) * (restarts + 1)) // repeat
