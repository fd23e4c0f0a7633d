"""Kernel flags that follow the evidence: resolve ``auto`` from validation reports and quality records.

``dsv4_kernel_flags`` values are ``"1"``/``"0"`` (SGLang's boolean spellings) or ``"auto"``. An
``auto`` flag is on only when both pieces of evidence hold for the host as it is now:

* the numbers: the kernel verdict of a full ``dsv4kit validate`` report (``validation/verdict.py``)
  recommends it: ours correct at every shape and faster than SGLang's stock default;
* the answers: a passing ``dsv4kit eval --ab FLAG=0,1`` record (``quality=``, a lookup from
  ``dsv4kit.records.quality_evidence``; docs/quality.md).

Which report: ``--from-report PATH``, else the host's newest *full* report in the validation
results directory (``<results-dir>/<host>-gpu<N>-<UTC stamp>.json``). A partial report (made with
``--interpret``, ``--cases`` or without the verdict) is kept but skipped, with a note. Evidence that
does not hold is not an error: the flag stays stock (``"0"``) and its decision says why (a failed
kernel, a report or record from another GPU model, driver, SGLang or kernels, a changed serving
configuration, no quality record). Only input that is not evidence at all is refused (exit 2: a
file that is not a validation report, an unknown flag name); host facts that cannot be read are
exit 3 or 5.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from dsv4kit.core import exitcodes
from dsv4kit.core.paths import results_dir_or_default
from dsv4kit.rollout import fp4_plan

AUTO = "auto"
PROBE_TIMEOUT_S = 60.0
_STAMP = re.compile(r"-gpu(\d+)-(\d{8}T\d{6}Z)(?:-(\d+))?\.json")  # after the host: see report_filename


class PlanError(exitcodes.Abort):
    """The plan cannot be made: a refused report (exit 2), host facts missing (5), unreachable (3)."""


@dataclass
class HostFacts:
    """What the host runs now: GPU models by index, driver, installed SGLang version."""

    gpus: dict = field(default_factory=dict)  # index -> model name
    driver: Optional[str] = None
    sglang: Optional[str] = None


# --------------------------------------------------------------------------- finding reports
def safe_host(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def host_reports(results_dir: Path, host_name: str) -> list[Path]:
    """The host's reports in ``results_dir``, oldest first (by the UTC stamp in the name, not mtime)."""
    pattern = re.compile(re.escape(safe_host(host_name)) + _STAMP.pattern)
    found = []
    if Path(results_dir).is_dir():
        for path in Path(results_dir).iterdir():
            match = pattern.fullmatch(path.name)
            if match and path.is_file():
                found.append(((match.group(2), int(match.group(3) or 1)), path))
    return [p for _, p in sorted(found)]


def latest_report(results_dir: Path, host_name: str) -> Optional[Path]:
    reports = host_reports(results_dir, host_name)
    return reports[-1] if reports else None


def load_report(path: Path) -> dict:
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise PlanError(exitcodes.USAGE, f"report {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PlanError(exitcodes.USAGE, f"report {str(path)!r} is not UTF-8 text (byte {exc.start}): not a "
                                         f"dsv4kit validation report") from None
    try:
        report = json.loads(text)
    except ValueError as exc:
        raise PlanError(exitcodes.USAGE, f"report {str(path)!r} is not JSON: {exc}") from None
    if not isinstance(report, dict) or report.get("kind") != "dsv4kit-validation":
        raise PlanError(exitcodes.USAGE, f"report {str(path)!r} is not a dsv4kit validation report")
    return report


def partial(report: dict) -> Optional[str]:
    """Why a report is not a full verdict (None: it is): only a full verdict is evidence."""
    remote = report.get("remote") or {}
    if remote.get("interpret") or (report.get("environment") or {}).get("interpret"):
        return "it ran on Triton's CPU interpreter (--interpret)"
    if remote.get("cases"):
        return f"it ran only --cases {remote.get('cases')!r}"
    verdict = report.get("verdict")
    if not isinstance(verdict, dict):
        return "it has no kernel verdict (made without the verdict step)"
    if verdict.get("status") != "complete":
        return f"its kernel verdict is {verdict.get('status') or 'unreadable'}" + (
            f": {verdict.get('reason')}" if verdict.get("reason") else "")
    return None


def choose_report(results_dir: Path, host_name: str, say) -> tuple[Optional[Path], list[str]]:
    """The host's newest full report, and a note for each newer one skipped (partial, unreadable)."""
    skipped = []
    for path in reversed(host_reports(results_dir, host_name)):
        try:
            reason = partial(load_report(path))
        except PlanError as exc:
            reason = str(exc)
        if reason is None:
            return path, skipped
        skipped.append(f"{path.name}: {reason}")
        say(f"{host_name}: skipping report {path.name}: {reason} (only a full verdict is evidence)")
    return None, skipped


# --------------------------------------------------------------------------- host facts
_PROBE = r"""
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout -k 5 30 nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu=/'
else
  echo gpu_error=nvidia-smi not found
fi
if [ -x {python} ]; then
  timeout -k 5 60 {python} -c 'import importlib.metadata as m
try:
    print("sglang=" + m.version("sglang"))
except m.PackageNotFoundError:
    print("sglang=")' 2>&1 | tail -n 1
else
  echo sglang=
fi
"""


def parse_probe(text: str) -> tuple[HostFacts, list[str]]:
    facts, notes = HostFacts(), []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "gpu":
            parts = [p.strip() for p in value.split(",")]
            if len(parts) == 3 and parts[0].isdigit():
                facts.gpus[int(parts[0])] = parts[1]
                facts.driver = facts.driver or parts[2]
            else:
                notes.append(value.strip())
        elif key == "gpu_error":
            notes.append(value.strip())
        elif key == "sglang":
            facts.sglang = value.strip() or None
    return facts, notes


def probe_host(host) -> HostFacts:
    """GPU models and driver (nvidia-smi) and the venv's SGLang version, over SSH."""
    from dsv4kit.core import ssh

    try:
        with ssh.open_session(host, trust_new_host_key=False, say=lambda s: None) as session:
            result = session.run(_PROBE.replace("{python}", shlex.quote(host.venv_python)),
                                 timeout=PROBE_TIMEOUT_S, check=False)
    except ssh.RemoteError as exc:
        raise PlanError(exc.exit_code, f"cannot read {host.name}'s GPU, driver and SGLang version: {exc}") from None
    facts, notes = parse_probe(result.stdout)
    if not facts.gpus or not facts.driver:
        raise PlanError(exitcodes.ENVIRONMENT,
                        f"cannot tell {host.name}'s GPU model and driver ({'; '.join(notes) or 'nvidia-smi said nothing'}): "
                        "an auto kernel flag needs them to match the report; provision the driver first "
                        "(kernel flags stay as set) or set the flags to '0'/'1'")
    return facts


# --------------------------------------------------------------------------- checking a report
def content_problems(report: dict, needed_targets: list[str]) -> list[str]:
    """Why this report cannot decide any host's auto flags, from the report alone (empty: it can)."""
    problems = []
    if not report.get("passed"):
        problems.append("its validation table failed (a kernel case did not pass)")
    verdict = report.get("verdict")
    if not isinstance(verdict, dict):
        return problems + ["it has no kernel verdict (made by a dsv4kit validate without the verdict step)"]
    status = verdict.get("status")
    if status != "complete":
        problems.append(f"its kernel verdict is {status or 'unreadable'}"
                        + (f": {verdict.get('reason')}" if verdict.get("reason") else ""))
    targets = verdict.get("targets") or {}
    missing = [t for t in needed_targets if t not in targets]
    if missing and status == "complete":
        problems.append(f"its verdict has no {', '.join(missing)} target (validated with --cases?)")
    return problems


def identity_problems(report: dict, host_name: str, facts: HostFacts, sglang_pin: Optional[str],
                      serving: frozenset = frozenset(), decode_tp: Optional[int] = None) -> list[str]:
    """Where the report's GPU model, driver or SGLang version differ from the host's (empty: none)."""
    problems = []
    ident = (report.get("verdict") or {}).get("identity") or {}
    gpu_index = (report.get("remote") or {}).get("gpu")
    host_gpu = facts.gpus.get(gpu_index) if gpu_index in facts.gpus else (
        next(iter(facts.gpus.values())) if facts.gpus else None)
    if ident.get("gpu") != host_gpu:
        problems.append(f"it was measured on GPU {ident.get('gpu')!r}, {host_name} has {host_gpu!r}")
    serving = serving or frozenset(facts.gpus)  # no GPU sets in the inventory: the servers may use any
    others = sorted({name for i, name in facts.gpus.items() if i in serving and name != ident.get("gpu")})
    if others and ident.get("gpu") == host_gpu:
        problems.append(f"it was measured on {ident.get('gpu')!r}, but {host_name}'s servers also run on {others}")
    if ident.get("driver") != facts.driver:
        problems.append(f"it was measured on driver {ident.get('driver')!r}, {host_name} has {facts.driver!r}")
    if ident.get("sglang") != facts.sglang:
        problems.append(f"it was measured with SGLang {ident.get('sglang')!r}, {host_name} has "
                        f"{facts.sglang or 'no SGLang'!r} installed")
    elif sglang_pin is not None and ident.get("sglang") != sglang_pin:
        problems.append(f"it was measured with SGLang {ident.get('sglang')!r}, the inventory pins "
                        f"dsv4_sglang_version {sglang_pin!r} (provisioning would change it)")
    measured_tp = ((report.get("verdict") or {}).get("shapes") or {}).get("decode_tp")
    if decode_tp and measured_tp != decode_tp:
        problems.append(f"its attention was timed at the heads of decode TP {measured_tp or 'unrecorded (64 heads)'}, "
                        f"{host_name} decodes at TP {decode_tp} (docs/sglang-contract.md §4.2)")
    from dsv4kit.validation.verdict_run import kernels_digest

    shipped = kernels_digest()
    if ident.get("kernels_sha256") != shipped:
        problems.append(f"it measured other dsv4kit kernels (sources sha256 {str(ident.get('kernels_sha256'))[:12]}) "
                        f"than this checkout ships ({str(shipped)[:12]})")
    return problems


# --------------------------------------------------------------------------- the plan
def _target_of(flag: str) -> Optional[str]:
    from dsv4kit.validation.verdict import FLAGS

    return next((t for t, f in FLAGS.items() if f == flag), None)


def auto_flags(flags: dict) -> list[str]:
    return [name for name, value in (flags or {}).items() if str(value).strip().lower() == AUTO]


def plan_host(host, *, results_dir: Optional[Path] = None, from_report: Optional[Path] = None,
              probe: Optional[Callable] = None, say: Callable[[str], None] = lambda s: None,
              quality: Optional[Callable] = None) -> dict:
    """The kernel flags and the FP4 setting for ``host`` (an inventory Host), each with where its value came from.

    Returns {"host", "flags": {FLAG: value}, "decisions": {FLAG: {...}}, "settings": {"dsv4_fp4_indexer":
    {"value": bool, ...}}, "report": {...} or None, "skipped_reports": [...]}. ``quality(host, key, facts)``
    is the quality-evidence lookup (``dsv4kit.records.quality_evidence.finder``); without it nothing
    ``auto`` turns on. Raises PlanError for input that is not evidence (exit 2) or host facts that
    cannot be read (3, 5).
    """
    results_dir = results_dir_or_default(results_dir)
    configured = dict(host.get("dsv4_kernel_flags") or {})
    autos = auto_flags(configured)
    fp4_auto = fp4_plan.is_auto(host.get(fp4_plan.SETTING))
    plan = {"host": host.name, "flags": {}, "decisions": {}, "settings": {}, "report": None, "skipped_reports": []}
    for name, value in configured.items():
        if name not in autos:
            plan["flags"][name] = str(value)
            plan["decisions"][name] = {"value": str(value), "source": "inventory",
                                       "why": "set in dsv4_kernel_flags"}
    if not fp4_auto:
        plan["settings"][fp4_plan.SETTING] = fp4_plan.inventory_decision(host.get(fp4_plan.SETTING) or False)
    if not autos and not fp4_auto and from_report is None:
        return plan
    unknown = [f for f in autos if _target_of(f) is None]
    if unknown:
        raise PlanError(exitcodes.USAGE, f"{host.name}: 'auto' is only known for the kernel flags "
                                         f"{', '.join(sorted(known_flags()))}, not {', '.join(unknown)}")
    report, path, facts, source, why = _evidence(host, plan, autos, results_dir, from_report, probe, say)
    if why is not None:
        return _stock(plan, autos, source, why, fp4_auto)
    remote = report.get("remote") or {}
    if remote.get("host") not in (None, host.name):
        say(f"{host.name}: report {Path(path).name} was measured on {remote.get('host')} (same GPU, driver, SGLang)")
    numbers = {name: _numbers(name, report, path) for name in autos}
    if not fp4_auto:
        _resolve_flags(plan, host, numbers, facts, quality, bool(host.get(fp4_plan.SETTING) or False))
        return plan
    # The FP4 cache and the indexer flag choose which of each other's code runs, so each one's quality
    # record counts only with the other as served (quality_evidence.coupled): the FP4 cache is on only
    # when the flags resolved with it on keep it on; otherwise the flags are resolved with it off.
    with_fp4 = _resolve_flags(dict(plan, flags=dict(plan["flags"]), decisions=dict(plan["decisions"])),
                              host, numbers, facts, quality, True)
    fp4_on = fp4_plan.decide(host, report, path, facts, quality, _indexer_value(host, with_fp4))
    if fp4_on["value"]:
        plan.update(flags=with_fp4["flags"], decisions=with_fp4["decisions"])
        plan["settings"][fp4_plan.SETTING] = fp4_on
        return plan
    _resolve_flags(plan, host, numbers, facts, quality, False)
    on, off = _indexer_value(host, with_fp4), _indexer_value(host, plan)
    decision = fp4_on  # the same indexer flag either way: the same decision
    if on != off:
        flag = _indexer_flag()
        decision = fp4_plan.off(fp4_on["source"], f"with the FP4 cache on, {flag} would be {on} "
                                f"({with_fp4['decisions'].get(flag, {}).get('why')}), and then: {fp4_on['why']}",
                                **{k: fp4_on[k] for k in ("report", "serving", "quality_record") if k in fp4_on})
    plan["settings"][fp4_plan.SETTING] = decision
    return plan


def _resolve_flags(plan: dict, host, numbers: dict, facts, quality, fp4: bool) -> dict:
    """Each auto flag of ``numbers`` decided with its quality record, the FP4 cache served as ``fp4``."""
    served = {fp4_plan.SETTING: fp4}
    for name, (ok, decision) in numbers.items():
        plan["flags"][name], plan["decisions"][name] = (
            _with_quality(host, name, decision, facts, quality, served) if ok else ("0", decision))
    return plan


def _indexer_value(host, plan: dict) -> str:
    """The indexer flag as ``plan`` serves it: decided, else the inventory's, else stock."""
    flag = _indexer_flag()
    return str(plan["flags"].get(flag, (host.get("dsv4_kernel_flags") or {}).get(flag, "0")))


def _evidence(host, plan: dict, autos: list[str], results_dir: Path, from_report, probe, say) -> tuple:
    """(report, path, facts, None, None) when a report holds for the host as it is now, else
    (None, None, None, source, why): every ``auto`` stays stock for that reason."""
    if from_report is not None:
        path, report = Path(from_report), load_report(Path(from_report))
        reason = partial(report)
        if reason:
            return None, None, None, "report skipped", (f"report {path} is partial: {reason}; only a full verdict is "
                                                        f"evidence (run `dsv4kit validate --host {host.name}`)")
    else:
        path, plan["skipped_reports"] = choose_report(results_dir, host.name, say)
        if path is None:
            why = (f"no full validation report for {host.name} in {results_dir}" +
                   (f" (skipped: {'; '.join(plan['skipped_reports'])})" if plan["skipped_reports"] else "") +
                   f": stock SGLang until `dsv4kit validate --host {host.name}` has measured the kernels")
            say(f"{host.name}: no full validation report in {results_dir}; auto kernel flags stay stock (0)")
            return None, None, None, "no report", why
        report = load_report(path)
    problems = content_problems(report, [_target_of(f) for f in autos])
    facts = None
    if not problems:  # only a usable report is worth an SSH connection
        facts = (probe or probe_host)(host)
        serving = frozenset(host.get("dsv4_prefill_gpus") or []) | frozenset(host.get("dsv4_decode_gpus") or [])
        problems = identity_problems(report, host.name, facts, host.get("dsv4_sglang_version"), serving,
                                     len(host.get("dsv4_decode_gpus") or []) or None)
    plan["report"] = _report_summary(path, report)
    if problems:
        why = (f"report {path} is not evidence for {host.name} as it is now: " + "; ".join(problems)
               + f". Stock until `dsv4kit validate --host {host.name}` measures the host as it is")
        say(f"{host.name}: {why}")
        return None, None, None, "report not evidence", why
    return report, path, facts, None, None


def _indexer_flag() -> str:
    from dsv4kit.rollout.targets import INDEXER_FLAG

    return INDEXER_FLAG


def _stock(plan: dict, autos: list[str], source: str, why: str, fp4_auto: bool = False) -> dict:
    for name in autos:
        plan["flags"][name] = "0"
        plan["decisions"][name] = {"value": "0", "source": source, "why": why}
    if fp4_auto:
        plan["settings"][fp4_plan.SETTING] = fp4_plan.off(source, why)
    return plan


def _report_summary(path: Path, report: dict) -> dict:
    remote, verdict = report.get("remote") or {}, report.get("verdict") or {}
    return {"path": str(path), "name": Path(path).name, "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
            "measured_on": remote.get("host"), "gpu_index": remote.get("gpu"), "started_utc": remote.get("started_utc"),
            "identity": verdict.get("identity"), "shapes": verdict.get("shapes")}


def _numbers(name: str, report: dict, path: Path) -> tuple[bool, dict]:
    """One auto flag's numbers: (whether they recommend it, its decision so far; its ``why`` the verdict's reasons)."""
    body = report["verdict"]["targets"][_target_of(name)]
    comparisons = body.get("comparisons", [])
    decision = {"source": "report", "report": Path(path).name, "recommend": body.get("recommend"),
                "stock_default": body.get("stock_default"),
                "numbers": [{k: c.get(k) for k in ("shape", "ours_us", "stock_us", "ratio", "outcome", "ours_correct")}
                            for c in comparisons]}
    wrong = [c.get("shape") for c in comparisons if c.get("ours_correct") is not True]
    if body.get("recommend") != "on" or not comparisons or wrong:
        reasons = list(body.get("reasons") or [])
        if wrong:
            reasons.append(f"dsv4kit's kernel is not shown correct at {', '.join(map(str, wrong))}")
        return False, {**decision, "value": "0", "why": "; ".join(reasons) or "the verdict recommends it off"}
    return True, {**decision, "why": "; ".join(body.get("reasons") or [])}


def _with_quality(host, name: str, decision: dict, facts, quality, served_with: dict) -> tuple[str, dict]:
    """An auto flag the numbers recommend: on only with the answers (a quality record that holds)."""
    decision = dict(decision)
    reasons = decision.pop("why", "")
    if quality is None:
        return "0", {**decision, "value": "0", "why": "the numbers recommend it, but no quality evidence was looked up"}
    found = quality(host, name, facts, served_with)
    decision["quality_record"] = found.get("record")
    if not found.get("ok"):
        return "0", {**decision, "value": "0", "source": "quality record missing",
                     "why": f"the numbers recommend it ({reasons}), but {found['why']}"}
    return "1", {**decision, "value": "1", "source": "report + quality record", "why": f"{reasons}; {found['why']}"}


def known_flags() -> list[str]:
    """Every kernel flag the toolkit knows (``dsv4kit.validation.verdict.FLAGS``)."""
    from dsv4kit.validation.verdict import FLAGS

    return list(FLAGS.values())


def render(plan: dict) -> list[str]:
    lines = [f"{plan['host']}: kernel flags"]
    if plan.get("report"):
        r = plan["report"]
        ident = r.get("identity") or {}
        lines.append(f"  from report {r['path']} ({r.get('measured_on')} GPU {r.get('gpu_index')}, "
                     f"{r.get('started_utc')}; {ident.get('gpu')}, driver {ident.get('driver')}, "
                     f"SGLang {ident.get('sglang')})")
    for name, d in plan["decisions"].items():
        lines.append(f"  {name}={d['value']}  [{d['source']}] {d.get('why', '')}")
        for n in d.get("numbers", []):
            ours = "-" if n["ours_us"] is None else f"{n['ours_us']:.1f}"
            stock = "-" if n["stock_us"] is None else f"{n['stock_us']:.1f}"
            lines.append(f"      {n['shape']:<28} dsv4kit {ours:>8} us  {d.get('stock_default')} {stock:>8} us  "
                         f"{n['outcome']}")
    fp4 = (plan.get("settings") or {}).get(fp4_plan.SETTING)
    if fp4:
        lines.append(fp4_plan.render(fp4))
    return lines


def extra_vars(plans: list[dict]) -> dict:
    """The ansible extra-vars that carry the resolved flags and decisions to kernel_rollout, and the
    resolved FP4 setting (true/false, never 'auto') to sglang_service, per host."""
    out = {"kernel_rollout_plan": {p["host"]: {"flags": p["flags"], "decision": {
        "report": p.get("report"), "flags": p["decisions"], "settings": p.get("settings") or {}}} for p in plans}}
    decided = {p["host"]: (p.get("settings") or {}).get(fp4_plan.SETTING) for p in plans}
    fp4 = {host: bool(d["value"]) for host, d in decided.items() if d and d.get("source") != "inventory"}
    if fp4:
        out[FP4_PLAN_VAR] = fp4
    return out


#: The sglang_service role's per-host FP4 setting resolved from 'auto' (playbooks/roles/sglang_service).
FP4_PLAN_VAR = "sglang_service_fp4_indexer_plan"


def _wants_plan(host, fp4_only: bool) -> bool:
    fp4 = fp4_plan.is_auto(host.get(fp4_plan.SETTING))
    return fp4 or (not fp4_only and bool(auto_flags(host.get("dsv4_kernel_flags") or {})))


def plan_inventory(inventory_path, *, limit=None, results_dir: Optional[Path] = None,
                   probe: Optional[Callable] = None, say: Callable[[str], None] = lambda s: None,
                   quality: Optional[Callable] = None, fp4_only: bool = False,
                   unreachable: Optional[dict] = None) -> list[dict]:
    """A plan for every host (of ``limit``'s plain names, when given) whose kernel flags or FP4 setting
    hold ``auto`` (``fp4_only``: only hosts whose FP4 setting does).

    ``unreachable``: a dict that collects ``{host: why}`` for hosts SSH could not reach (exit 3)
    instead of stopping at the first one (provision then leaves them out of the play)."""
    from dsv4kit.core.inventory import load_inventory

    inventory = load_inventory(inventory_path)
    names = [n.strip() for value in ([limit] if isinstance(limit, str) else (limit or []))
             for n in value.split(",") if n.strip()]
    if any(set(n) & set("*?:!&~[]^") for n in names):
        names = []  # an Ansible pattern: resolve every host rather than guess which it selects
    plans = []
    for host in inventory.hosts.values():
        if names and not ({host.name, *host.groups} & set(names)):
            continue
        if _wants_plan(host, fp4_only):
            try:
                plans.append(plan_host(host, results_dir=results_dir, probe=probe, say=say, quality=quality))
            except PlanError as exc:
                if unreachable is None or exc.exit_code != exitcodes.UNREACHABLE:
                    raise
                unreachable[host.name] = str(exc)
    return plans


STAGE = "kernel_rollout"


def stage_runs(tags=None, skip_tags=None, stage: str = STAGE) -> bool:
    """Whether ``--tags``/``--skip-tags`` let ``stage`` run (default kernel_rollout, which writes the
    flags; sglang_service renders the FP4 setting)."""
    def names(values):
        values = [values] if isinstance(values, str) else (values or [])
        return {n.strip() for v in values for n in v.split(",") if n.strip()}

    chosen, skipped = names(tags), names(skip_tags)
    if stage in skipped:
        return False
    return not chosen or bool(chosen & {stage, "all", "untagged"} | (chosen - (_KNOWN_STAGES - {stage})))


# Tags that select only their own stage; anything else (a pattern, "tagged") might select any, and
# is resolved to be safe.
_KNOWN_STAGES = {"preflight", "nvidia_driver", "cuda_toolkit", "host_tuning", "sglang_venv", "flash_attn",
                 "kernel_rollout", "sglang_service", "monitoring", "never", "always"}
SERVING_STAGE = "sglang_service"


def resolve_for_provision(inventory_path, *, limit=None, results_dir: Optional[Path] = None,
                          tags=None, skip_tags=None, probe: Optional[Callable] = None,
                          say: Callable[[str], None] = lambda s: None,
                          quality: Optional[Callable] = None, unreachable: Optional[dict] = None) -> Optional[dict]:
    """``dsv4kit provision``'s step before Ansible: the extra-vars for the hosts' ``auto`` flags and
    ``auto`` FP4 setting, or None.

    Nothing is resolved (no report read, no SSH) when the tags leave kernel_rollout and sglang_service
    out: a driver upgrade alone must not be stopped by a report that the new driver makes stale. With
    sglang_service alone, only hosts whose FP4 setting is ``auto`` are resolved (the units render it).
    ``unreachable``: see :func:`plan_inventory`.
    """
    rollout = stage_runs(tags, skip_tags)
    if not rollout and not stage_runs(tags, skip_tags, SERVING_STAGE):
        return None
    plans = plan_inventory(inventory_path, limit=limit, results_dir=results_dir,
                           probe=probe, say=say, quality=quality, fp4_only=not rollout, unreachable=unreachable)
    for plan in plans:
        for line in render(plan):
            say(line)
    return extra_vars(plans) if plans else None
