"""What ``dsv4kit eval`` does, as plain functions: check, connect, run each arm, judge, record.

``plan`` makes every check that needs no box (context against the inventory, the tasks file line
by line, ``--ab``, the results repository, the restart's playbook) and raises ``Abort`` naming the
problem. ``execute`` connects, probes the served model (logprob fields, model, context: before any
long work), runs each arm on the box through ``box_eval.py`` (a restart through the playbook
before each arm with ``--ab``), judges the answers (``checks.judge``) and publishes one eval
record. The command (``dsv4kit.commands.eval``) only parses and prints.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from dsv4kit.bench.gpu_throttle import arm_telemetry, dcgm_port
from dsv4kit.core import exitcodes, host_limits
from dsv4kit.core.exitcodes import Abort
from dsv4kit.quality import prompts
from dsv4kit.quality.checks import Thresholds, judge, outcome_exit_code, task_floor
from dsv4kit.quality.shapes import shape_spec
from dsv4kit.records.task_floors import task_floors

Say = Callable[[str], None]

#: The GSM8K test set as SGLang 0.5.23's few_shot_gsm8k downloads it (1,319 lines), and its sha256.
GSM8K = {"name": "gsm8k", "lines": 1319,
         "url": "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/test.jsonl",
         "sha256": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"}
SMALL_TIMEOUT_S = 120.0
#: At most this many tokens between neighbouring needles (``prompts.needle_depths``): a page range
#: of this length that the indexer loses always holds a needle.
NEEDLE_SPACING = 4096


@dataclass
class EvalRequest:
    """The eval as the user asked for it, in the CLI's own terms (None: the documented default)."""

    ctx: Optional[int] = None
    quick: bool = False
    tasks: str = "gsm8k"
    questions: Optional[int] = None
    seed: int = 42
    ab: Optional[str] = None
    host: Optional[str] = None
    inventory: Optional[Path] = None
    results_repo: Optional[Path] = None
    server_timeout: float = 1800.0
    arm_timeout: float = 3600.0
    trust_new_host_key: bool = False


@dataclass
class EvalPlan:
    request: EvalRequest
    target: object
    inventory_path: Path
    repo: Path
    tasks: Optional[dict]  # {"name", "sha256", "lines", "local": Path | None, "url": str | None}
    ab_spec: Optional[object] = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    # The inventory's serving configuration as configured ('auto' as 'auto'), taken before the arms
    # pin anything: quality evidence is matched against the inventory (dsv4kit.records.quality_evidence).
    served: Optional[dict] = None


@dataclass
class EvalOutcome:
    record: dict
    published: object
    exit_code: int


# ------------------------------------------------------------------------------ before connecting
def needle_contexts(ctx: int, quick: bool) -> list[int]:
    """The haystack lengths: fractions of ``ctx`` up to ``ctx`` itself, multiples of 1024."""
    fractions = (8, 1) if quick else (16, 4, 2, 1)
    return sorted({max(1024, (ctx // f) // 1024 * 1024) if f > 1 else ctx for f in fractions})


def spec_for(ctx: int, quick: bool, seed: int, tasks_path: Optional[str], questions: Optional[int]) -> dict:
    """What ``box_eval.py run`` asks (docs/quality.md: the default and the ``--quick`` sets)."""
    spec = {
        "logprob": {"samples": 8 if quick else 32, "prompt_tokens": 256 if quick else 512,
                    "max_new_tokens": 64 if quick else 256, "top_k": 5, "seed": seed},
        "needles": {"contexts": needle_contexts(ctx, quick), "depths": [0.1, 0.5, 0.9] if quick else
                    [0.05, 0.25, 0.5, 0.75, 0.95], "variants": 1 if quick else 2, "max_new_tokens": 16,
                    "seed": seed, "spacing": NEEDLE_SPACING},
    }
    if tasks_path is not None:
        spec["tasks"] = {"path": tasks_path, "shots": 5, "questions": questions or (50 if quick else 200),
                         "max_new_tokens": 256 if quick else 512}
    spec.update(shape_spec(ctx, quick, seed, tasks_path, questions, spec["needles"]))  # docs/quality.md
    return spec


def _tasks_source(value: str) -> Optional[dict]:
    if value == "none":
        return None
    if value == "gsm8k":
        return {"name": "gsm8k", "sha256": GSM8K["sha256"], "lines": GSM8K["lines"], "url": GSM8K["url"],
                "local": None}
    path = Path(value).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise Abort(exitcodes.USAGE, f"--tasks {value!r}: cannot read it ({exc.strerror or exc}); give a "
                                     f"GSM8K-format JSONL file, 'gsm8k' (downloaded on the box) or 'none'") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Abort(exitcodes.USAGE, f"--tasks {value!r}: not UTF-8 text (byte {exc.start})") from None
    items, problems = prompts.parse_tasks(text, str(path))
    if problems:
        raise Abort(exitcodes.USAGE, "--tasks: " + "; ".join(problems))
    if len(items) < 6:
        raise Abort(exitcodes.USAGE, f"--tasks {value!r}: {len(items)} item(s); 5 go to the few-shot examples, "
                                     f"so at least 6 are needed")
    return {"name": path.name, "sha256": hashlib.sha256(data).hexdigest(), "lines": len(items), "url": None,
            "local": path}


def plan(req: EvalRequest, warn: Say) -> EvalPlan:
    """Every check that needs no box, in the order the user meets them; Abort naming the first problem."""
    from dsv4kit.bench import config
    from dsv4kit.core.inventory import InventoryError, default_inventory_path, load_inventory
    from dsv4kit.core.paths import results_repo_or_default
    from dsv4kit.records import results_repo
    from dsv4kit.serving import arms as serving_arms

    if req.ctx is not None and req.ctx < 2048:
        raise Abort(exitcodes.USAGE, f"--ctx {req.ctx}: the needle check needs at least 2048 tokens of context")
    if req.questions is not None and req.questions < 1:
        raise Abort(exitcodes.USAGE, f"--questions {req.questions}: give at least 1")
    tasks = _tasks_source(req.tasks)
    ab_spec = serving_arms.parse_ab(req.ab) if req.ab is not None else None
    repo = results_repo_or_default(req.results_repo)
    results_repo.check_option(repo)
    inventory_path = req.inventory or default_inventory_path()
    try:
        target = load_inventory(inventory_path).host(req.host)
        config.check_host(target)
        if req.ctx is not None:
            host_limits.check_context(target, req.ctx)
    except InventoryError as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None
    if ab_spec is not None:
        from dsv4kit.provision import playbook

        try:  # every arm restarts the serving units through the playbook
            playbook.check_tags(playbook.check_tools(), tags=serving_arms.arm_extra_vars(
                target, int(target.get("dsv4_context_length") or 0), ab_spec, "A")[0])
        except playbook.ProvisionError as exc:
            raise Abort(exc.exit_code, f"--ab restarts the serving units for every arm: {exc}") from None
    if tasks is None:
        warn("warning: --tasks none: the task-accuracy check is skipped, so this record cannot turn an "
             "'auto' kernel flag on")
    if req.quick:
        warn("warning: --quick is a smoke test: its record never turns an 'auto' kernel flag on")
    try:
        floors = task_floors(target)
    except ValueError as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None
    thresholds = task_floor(Thresholds(), (tasks or {}).get("sha256"), floors)
    return EvalPlan(request=req, target=target, inventory_path=inventory_path, repo=repo, tasks=tasks,
                    ab_spec=ab_spec, served=served_config(target, ab_spec), thresholds=thresholds)


# ------------------------------------------------------------------------------ on the box
class BoxEval:
    """``box_eval.py`` on the box, in the scratch directory of a ``dsv4kit.serving.session.ServingSession``."""

    def __init__(self, remote, url: str, env: Optional[dict], progress: Say):
        self.remote, self.url, self.env, self.progress = remote, url, env, progress
        here = Path(__file__).resolve().parent
        for name in ("box_eval.py", "prompts.py", "api_prompts.py"):
            remote.session.put(here / name, f"{remote.workdir}/{name}")
        self.script = f"{remote.workdir}/box_eval.py"

    def _json(self, args: list[str], timeout: float, stream=None, wrap: Optional[list] = None) -> dict:
        """``wrap``: a box-side command line the script runs under (``dsv4box watch``)."""
        result = self.remote.session.run(shlex.join([*(wrap or []), self.remote.python, self.script, *args]),
                                         timeout=timeout, env=self.env, check=False, stream=stream,
                                         **({"cwd": self.remote.workdir} if wrap else {}))
        lines = [line for line in result.stdout.splitlines() if line.strip().startswith("{")]
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            raise Abort(exitcodes.TOOL_FAILED, f"box_eval.py {args[0]} gave no answer (exit {result.exit_code}): "
                                               f"{(result.stderr or result.stdout).strip()[-800:]}") from None

    def probe(self) -> dict:
        answer = self._json(["probe", "--url", self.url], SMALL_TIMEOUT_S)
        if not answer.get("ok"):
            raise Abort(exitcodes.ENVIRONMENT, f"the router at {self.url} did not answer as SGLang does: "
                                               f"{answer.get('error')}; is the serving stack up? (`dsv4kit provision`)")
        if not answer.get("logprobs"):
            raise Abort(exitcodes.ENVIRONMENT, f"the server at {self.url} returns no usable logprobs, which every "
                                               f"check needs: {'; '.join(answer.get('problems') or [])}")
        return answer

    def fetch_tasks(self, tasks: dict) -> str:
        path = f"{self.remote.workdir}/tasks.jsonl"
        if tasks["local"] is not None:
            self.remote.session.put(tasks["local"], path)
            return path
        answer = self._json(["fetch", "--url", tasks["url"], "--sha256", tasks["sha256"], "--out", path],
                            SMALL_TIMEOUT_S + 60)
        if not answer.get("ok"):
            hint = (" (the box is offline: download the file where you can, check its sha256, and give "
                    "--tasks PATH)" if answer.get("offline") else "")
            raise Abort(exitcodes.ENVIRONMENT, f"--tasks gsm8k: {answer.get('error')}{hint}")
        return path

    def run(self, spec: dict, label: str, timeout: float) -> dict:
        spec_file, out_file = f"{self.remote.workdir}/{label}.spec.json", f"{self.remote.workdir}/{label}.json"
        with tempfile.TemporaryDirectory(prefix="dsv4kit-eval-") as tmp:
            local = Path(tmp) / "spec.json"
            local.write_text(json.dumps(spec))
            self.remote.session.put(local, spec_file)
            eta = Eta(label, self.progress)
            watch = [*self.remote.box_command("watch", "--out", f"{out_file}.gpu", "--dcgm-port",
                                              str(dcgm_port(self.remote.host)), "--")]
            answer = self._json(["run", "--spec", spec_file, "--out", out_file], timeout, stream=eta.line, wrap=watch)
            if not answer.get("ok"):
                raise Abort(exitcodes.TOOL_FAILED, f"{label}: the box could not finish the checks: {answer.get('error')}")
            result_file, telemetry_file = Path(tmp) / "result.json", Path(tmp) / "gpu.json"
            self.remote.session.get(out_file, result_file)
            result = json.loads(result_file.read_text())
            self.remote.session.get(f"{out_file}.gpu", telemetry_file)
            result["gpu_telemetry"] = json.loads(telemetry_file.read_text())
            return result


class Eta:
    """Progress lines from the box (``progress CHECK DONE TOTAL``) with a rate and an ETA per check."""

    def __init__(self, label: str, say: Say):
        self.label, self.say, self.started, self.last, self.rated = label, say, {}, 0.0, set()

    def line(self, text: str) -> None:
        parts = text.split()
        if len(parts) != 4 or parts[0] != "progress":
            return
        check, done, total = parts[1], int(parts[2]), int(parts[3])
        now = time.monotonic()
        start = self.started.setdefault(check, now)
        if done not in (0, total) and now - self.last < 5.0 and check in self.rated:
            return
        if done:
            self.rated.add(check)  # the first line with a rate, then one every 5 s
        self.last = now
        eta = f", ETA {((now - start) / done) * (total - done):.0f} s" if 0 < done < total else ""
        self.say(f"  {self.label}: {check} {done}/{total}{eta}")


def _paths(report: dict) -> str:
    """Which path served decode in this arm, from the plugin's own status on the box."""
    if report.get("error"):
        return f"which kernels served decode is unknown: {report['error']}"
    ours = [t.get("key") for t in report.get("targets") or [] if t.get("replaced") and t.get("on_route", True)]
    decode = f"decode on dsv4kit {', '.join(ours)}" if ours else "decode on SGLang's stock kernels"
    return f"{decode}; re-prefill on SGLang's prefill path (docs/quality.md)"


def _plugin_status(host, remote_report) -> dict:
    """The plugin's own status on the box (``rollout status --host``); what stopped it, if it could not run."""
    try:
        return remote_report(host, timeout=SMALL_TIMEOUT_S)
    except Abort as exc:
        return {"error": str(exc), "targets": []}


def _arm_setting(ab, arm: Optional[str]) -> Optional[str]:
    return f"{ab.key}={ab.values[arm]}" if ab is not None and arm is not None else None


def execute(p: EvalPlan, progress: Say, argv: list[str]) -> EvalOutcome:
    """Connect, probe, run every arm, judge, publish. Abort with the exit code of what stopped it."""
    from dsv4kit.core.ssh import RemoteError, open_session

    try:
        with open_session(p.target, trust_new_host_key=p.request.trust_new_host_key, say=progress) as session:
            record, details = _run_arms(p, session, progress, argv)
    except KeyboardInterrupt:
        raise Abort(exitcodes.INTERRUPTED, "interrupted: nothing was recorded") from None
    except RemoteError as exc:
        raise Abort(exc.exit_code, f"{exc} (nothing was recorded)") from None
    return _publish(p, record, details, progress)


def _run_arms(p: EvalPlan, session, progress: Say, argv: list[str]) -> tuple[dict, dict]:
    from dsv4kit.records.provenance import sections, toolkit_info
    from dsv4kit.records.record import decode_info
    from dsv4kit.rollout.remote import remote_report
    from dsv4kit.serving.session import ServingSession

    host, req = p.target, p.request
    created, started = datetime.now(timezone.utc), time.time()
    with ServingSession(session, host, progress, inventory_path=p.inventory_path) as remote:
        box = BoxEval(remote, remote.addresses.router_url, remote.env, progress)
        probe = box.probe()
        served = probe.get("context_length")
        ctx = req.ctx or served
        if not isinstance(served, int) or ctx > served:
            raise Abort(exitcodes.USAGE, f"--ctx {ctx} is above the context length the server serves ({served}): the "
                                         f"needles would not fit; give --ctx {served} or less, or serve a longer context")
        _check_model(host, probe)
        tasks_path = box.fetch_tasks(p.tasks) if p.tasks is not None else None
        spec = spec_for(ctx, req.quick, req.seed, tasks_path, req.questions)
        spec["api"] = {"model": remote.served_name(),
                       "seeds": [req.seed] if req.quick else [req.seed + i for i in range(3)],
                       "max_tokens": 4096}  # the chat API check (dsv4kit.quality.api_check)
        spec.update(url=box.url, model_path=str(host["dsv4_model_path"]), parallel=min(64, int(
            host.get("dsv4_max_running_requests") or 64)))
        arms, details, provenance, ran = {}, {}, {}, {}
        if p.ab_spec is not None:  # the playbook cannot resolve 'auto': the arms keep what runs now
            remote.pin(served, keep=p.ab_spec.key)
        names = list(p.ab_spec.arms) if p.ab_spec is not None else ["A"]
        for arm in names:
            if p.ab_spec is not None:
                progress(f"arm {arm}: restarting the serving units with {_arm_setting(p.ab_spec, arm)}...")
                remote.apply_arm(p.ab_spec, arm, served, req.server_timeout)
            info = remote.decode_info()
            arm_probe = remote.probe()
            provenance[arm] = sections(host=host, probe=arm_probe, server_info=info, context_length=served,
                                       restarted=p.ab_spec is not None)
            ran[arm] = ran_with(host, arm_probe, p.ab_spec)
            plugin = _plugin_status(host, remote_report)
            progress(f"arm {arm}: {_paths(plugin)}; checks at context {ctx}...")
            details[arm] = box.run(spec, f"arm-{arm}", req.arm_timeout)
            if arm == "A" and p.ab_spec is not None and "tasks" in spec:
                # The control: arm A's tasks once more, so the flips of one configuration against
                # itself (batch composition) stand beside the flips between the arms.
                progress("arm A: the task items once more, the control...")
                details[arm]["control"] = box.run({k: v for k, v in spec.items() if k == "tasks" or not isinstance(v, dict)},
                                                  "arm-A-control", req.arm_timeout)
            after = decode_info(remote.decode_info())
            arms[arm] = {"setting": _arm_setting(p.ab_spec, arm), "paths": _paths(plugin),
                         "plugin": {k: plugin.get(k) for k in ("flags", "targets", "indexer_route", "problems", "error")},
                         "software": {k: provenance[arm]["software"].get(k) for k in
                                      ("kernel_flags", "kernel_flags_reason", "kernel_flags_configured")},
                         "provenance_sha256": hashlib.sha256(json.dumps(provenance[arm], sort_keys=True,
                                                                        default=str).encode()).hexdigest(),
                         "timings_s": details[arm].get("timings_s"), "details_file": f"details/arm-{arm}.json.gz",
                         "budget": details[arm].get("budget"),  # per check: requests, tokens, lengths
                         "gpu_telemetry": arm_telemetry(details[arm]),
                         # speculative decoding: what the drafts did while the answers were judged
                         "speculative_algorithm": after.get("speculative_algorithm"),
                         "avg_spec_accept_length": next((s.get("avg_spec_accept_length") for s in
                                                         after.get("internal_states") or [] if isinstance(s, dict)), None)}
        for arm, body in arms.items():  # speculative acceptance is judged with the answers
            details[arm]["speculative"] = {"algorithm": body["speculative_algorithm"],
                                           "accept_length": body["avg_spec_accept_length"]}
        outcome, checks = judge(details, p.thresholds, served_names=[remote.served_name()])
        record = _build(p, argv, created, started, ctx, spec, provenance["A"], arms, checks, outcome,
                        decode_info(info), toolkit_info(argv))
        record["evidence"]["ran_with"] = agreed(ran)
        from dsv4kit.monitor.textfile import publish_record

        publish_record(session, host, "eval", record, record["outcome"], progress)
        return record, details


def ran_with(host, probe: dict, ab) -> dict:
    """What one arm ran with of the FP4 cache, where it decides with the A/B key
    (``quality_evidence.coupled``; the kernel flags are in the arm's ``software``): read from the
    running servers, else the value the arm's restart rendered (a literal or pinned inventory
    value); None where neither is known."""
    from dsv4kit.serving.pins import running_fp4
    from dsv4kit.records.quality_evidence import FP4_SETTING, coupled, normalise

    if FP4_SETTING not in coupled(getattr(ab, "key", None)):
        return {}
    value = running_fp4(host, probe)[0]
    return {FP4_SETTING: normalise(FP4_SETTING, value if value is not None else host.get(FP4_SETTING))}


def agreed(per_arm: dict) -> dict:
    """The arms' common values (None where the arms differ or one could not be read)."""
    keys = {k for values in per_arm.values() for k in values}
    return {k: (vals.pop() if len(vals := {v.get(k) for v in per_arm.values()}) == 1 else None) for k in sorted(keys)}


def served_config(host, ab) -> dict:
    """The record's ``evidence.served_config``: the A/B key under test (a server flag or a setting) left out."""
    from dsv4kit.records import eval_record

    kind = getattr(ab, "kind", None)
    return eval_record.served_config(host, without_arg=ab.key if kind == "server_flag" else None,
                                     without_var=ab.key if kind == "setting" else None)


def _check_model(host, probe: dict) -> None:
    """The served model must be the inventory's (``dsv4_model_path``): else every answer is another model's."""
    want = str(host.get("dsv4_model_path") or "").rstrip("/")
    served = {str(v).rstrip("/") for v in (probe.get("model_path"), probe.get("served_model_name")) if v}
    if want and served and want not in served:
        raise Abort(exitcodes.ENVIRONMENT, f"the server serves {sorted(served)}, not the inventory's model {want}: "
                                           f"an eval of it says nothing about this deployment")


def _build(p: EvalPlan, argv, created, started, ctx: int, spec: dict, provenance: dict, arms: dict, checks: list,
           outcome: str, decode: dict, toolkit: dict) -> dict:
    from dsv4kit.bench.config import run_names, safe_name, utc_stamp
    from dsv4kit.core.scrub import scrub
    from dsv4kit.records import eval_record
    from dsv4kit.records.record import sha256_json
    from dsv4kit.validation.verdict_run import kernels_digest

    stamp = utc_stamp(created)
    host_name = p.target.name
    run_id = run_names(host_name, ctx, stamp)[0].replace("-ctx", "-eval-ctx", 1)
    served = p.served if p.served is not None else served_config(p.target, p.ab_spec)
    tasks = None if p.tasks is None else {k: v for k, v in p.tasks.items() if k != "local"}
    record = {
        "schema_version": eval_record.SCHEMA_VERSION, "kind": eval_record.KIND, "run_id": run_id,
        "tag": f"{eval_record.TAG_PREFIX}{safe_name(host_name)}/{ctx}/{stamp}",
        "created_at_utc": created.isoformat(timespec="seconds"),
        "finished_at_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_wall_s": round(time.time() - started, 3), "toolkit": toolkit,
        **{k: provenance.get(k) for k in ("host", "gpus", "software", "model", "server")},
        "eval": {"context_length": ctx, "served_context_length": decode.get("context_length"),
                 "quick": p.request.quick, "seed": p.request.seed,
                 "spec": {k: {kk: vv for kk, vv in v.items() if kk != "path"} for k, v in spec.items()
                          if isinstance(v, dict)},
                 "tasks_source": tasks, "thresholds": p.thresholds.to_dict()},
        "ab": p.ab_spec.to_dict() if p.ab_spec is not None else None,
        "arms": arms, "checks": checks, "outcome": outcome,
        "evidence": {"kernels_sha256": kernels_digest(), "served_config": served,
                     "served_config_sha256": sha256_json(served),
                     "gpu_model": (provenance.get("gpus") or {}).get("model"),
                     "driver": (provenance.get("gpus") or {}).get("driver"),
                     "checks_run": [c["check"] for c in checks]},
        "notes": [] if p.tasks is not None else ["--tasks none: no task accuracy was measured"],
    }
    record["comparability_key"] = eval_record.comparability_key(record)
    return scrub(record)


def _publish(p: EvalPlan, record: dict, details: dict, progress: Say) -> EvalOutcome:
    import gzip

    from dsv4kit.quality.heatmap import heatmaps
    from dsv4kit.records import results_repo
    from dsv4kit.records.record import dumps, strict_json

    base = f"records/{record['run_id']}"
    files = {f"{base}/record.json": dumps(record).encode()}
    for arm, result in details.items():
        files[f"{base}/details/arm-{arm}.json.gz"] = gzip.compress(json.dumps(strict_json(result)).encode(), mtime=0)
    pngs, note = heatmaps(record)
    if note:
        record["notes"].append(note)
        files[f"{base}/record.json"] = dumps(record).encode()
    files.update({f"{base}/{name}": data for name, data in pngs.items()})
    try:
        published = results_repo.publish(p.repo, run_id=record["run_id"], tag=record["tag"], files=files,
                                         message=f"eval {record['run_id']}\n\noutcome {record['outcome']}")
    except results_repo.ResultsRepoError as exc:
        raise Abort(exitcodes.TOOL_FAILED, f"the eval finished ({record['outcome']}) but could not be recorded: "
                                           f"{exc}") from None
    return EvalOutcome(record=record, published=published, exit_code=outcome_exit_code(record["outcome"]))


def summary(p: EvalPlan, outcome: EvalOutcome) -> dict:
    """The ``--json`` summary of a published eval."""
    record = outcome.record
    return {"run_id": record["run_id"], "tag": record["tag"], "commit": outcome.published.commit,
            "results_repo": str(p.repo), "outcome": record["outcome"], "checks": record["checks"],
            "ab": record["ab"], "arms": {a: {k: v for k, v in b.items() if k != "plugin"} for a, b in record["arms"].items()},
            "exit_code": outcome.exit_code}
