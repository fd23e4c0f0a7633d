"""Quality evidence for ``auto``: a passing ``dsv4kit eval --ab FLAG=0,1`` record (a kernel flag) or
``--ab dsv4_fp4_indexer=false,true`` (the FP4 setting).

``finder(repo)`` returns the lookup ``dsv4kit.rollout.plan.plan_host`` takes (``quality=``):
``lookup(host, key, facts, served_with) -> {"ok", "why", "record"}``. The newest eval record
of the host whose A/B key is ``key`` (arms ``0`` and ``1``, or ``false`` and ``true`` for the
setting) decides. It counts only when it passed every check it had to run (decode against
re-prefill, arm agreement, needles up to the served context, tasks, the chat API),
and was measured on the host's serving GPU model and driver, with the kernels this checkout ships
and the inventory's serving configuration as it is now. Otherwise ``why`` names what is missing.

The FP4 index-K cache changes what every arm computes, and the indexer flag chooses which FP4
indexer the setting's arms ran, so these are compared as served values, not as the inventory spells
them (``auto`` resolves either way): a kernel flag's record counts only with the FP4 cache served as
its arms ran it, the setting's record only with the indexer flag served as its arms ran it
(``coupled``). What the arms ran with is read from the record: the kernel flags each arm's servers ran, and
``evidence.ran_with`` for the FP4 cache (an older record: its fingerprint's literal value);
``lookup``'s ``served_with`` holds what provisioning would serve (``dsv4kit.rollout.plan``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from dsv4kit.records import eval_record, results_repo
from dsv4kit.records.record import RecordError
from dsv4kit.records.task_floors import floor_for, task_floors
from dsv4kit.rollout.targets import INDEXER_FLAG

REQUIRED_CHECKS = ("logprob_validity", "logprob_kl", "topk_reprefill", "arm_agreement", "needles", "tasks",
                   "logprob_kl_long", "arm_agreement_long", "kernel_reach", "api")
FP4_SETTING = "dsv4_fp4_indexer"  # dsv4kit.rollout.fp4_plan.SETTING


def coupled(key: str) -> tuple[str, ...]:
    """The keys whose served value must be what ``key``'s A/B arms ran with."""
    return (INDEXER_FLAG,) if key == FP4_SETTING else (FP4_SETTING,)


def normalise(key: str, value):
    """A coupled key's value in one spelling: the setting as a bool, a kernel flag as "0"/"1";
    None for ``auto`` or anything else that is not a served value."""
    if key == FP4_SETTING:
        return value if isinstance(value, bool) else False if value is None else None
    text = str(value).strip() if value is not None else "0"  # an unset flag is stock
    return text if text in ("0", "1") else None


def ran_value(record: dict, key: str) -> tuple[bool, object]:
    """(known, value) of ``key`` in the record's arms. The FP4 setting: ``evidence.ran_with`` (an
    older record: its fingerprint's literal value). A kernel flag: what every arm's servers ran
    (``arms.<arm>.software.kernel_flags``, read on the box)."""
    evidence = record.get("evidence") or {}
    if key == FP4_SETTING:
        ran = evidence.get("ran_with") or {}
        if key in ran:  # None: the arms differed, or it could not be read
            value = None if ran[key] is None else normalise(key, ran[key])
        else:
            value = normalise(key, (evidence.get("served_config") or {}).get(key))
        return value is not None, value
    seen = set()
    for arm in (record.get("arms") or {}).values():
        flags = (arm.get("software") or {}).get("kernel_flags") if isinstance(arm, dict) else None
        seen.add(None if flags is None else str(flags.get(key, "0")))
    if len(seen) != 1 or None in seen:
        return False, None
    value = normalise(key, seen.pop())
    return value is not None, value


def coupled_problems(record: dict, host, served_with: dict) -> list[str]:
    """Why the record's arms ran with another value of a coupled key than ``served_with`` serves."""
    key = (record.get("ab") or {}).get("key")
    out = []
    for other in coupled(key):
        served = normalise(other, served_with.get(other))
        if served is None:  # not decided by the plan (an 'auto' the plan does not resolve)
            continue
        known, ran = ran_value(record, other)
        if not known:
            out.append(f"it does not show which {other} its arms ran with (they differed, or it was 'auto' and "
                       f"not recorded)")
        elif ran != served:
            out.append(f"its arms ran with {other}={_spell(ran)}, and {host.name} would serve {other}={_spell(served)}")
    return out


def without_served_values(config: dict) -> dict:
    """The fingerprint less the keys compared as served values (``coupled``)."""
    return {k: v for k, v in config.items() if k != FP4_SETTING}


def _spell(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def serving_gpu_models(host, facts) -> set:
    """The GPU models of the GPUs the servers use (prefill and decode sets; all when unset)."""
    gpus = facts.gpus or {}
    indices = set(host.get("dsv4_prefill_gpus") or []) | set(host.get("dsv4_decode_gpus") or [])
    return {gpus[i] for i in indices if i in gpus} or set(gpus.values())


def ab_values(key: str) -> tuple[str, str]:
    """The (off, on) arms an A/B of ``key`` must have to be its quality evidence."""
    from dsv4kit.rollout import fp4_plan

    return fp4_plan.AB_VALUES if key == fp4_plan.SETTING else ("0", "1")


def _arms_match(key: str, values: dict) -> bool:
    """A kernel flag's record has arms 0 and 1 (either order); the setting's has A=false, B=true."""
    off, on = ab_values(key)
    if off == "0":
        return set(values.values()) == {off, on}
    return values == {"A": off, "B": on}


def _records_for(repo: Path, host_name: str, flag: str) -> list[dict]:
    found = []
    for entry in results_repo.list_records(repo):
        if "-eval-" not in entry.run_id:
            continue
        try:
            record = results_repo.read_entry(repo, entry)
        except RecordError:
            continue
        ab = record.get("ab") or {}
        if ((record.get("host") or {}).get("name") == host_name and ab.get("key") == flag
                and _arms_match(flag, ab.get("values") or {})):
            found.append(record)
    return found


def problems(record: dict, host, facts, kernels_sha256: Optional[str], served_with: dict) -> list[str]:
    """Why ``record`` is not quality evidence for ``host`` as it is now, serving ``served_with``
    for the coupled keys (empty: it is)."""
    out = []
    if record.get("outcome") != "pass":
        failed = [f"{c['check']} {c['outcome']}: {c['why']}" for c in record.get("checks") or [] if c["outcome"] != "pass"]
        out.append(f"it did not pass ({'; '.join(failed) or record.get('outcome')})")
    if (record.get("eval") or {}).get("quick"):
        out.append("it is a --quick record, a smoke test: a quick record never counts (run eval without --quick)")
    ran = {c["check"]: c for c in record.get("checks") or []}
    required = REQUIRED_CHECKS + (("spec_acceptance",) if any(
        isinstance(a, dict) and a.get("speculative_algorithm") for a in (record.get("arms") or {}).values()) else ())
    missing = [c for c in required if c not in ran]
    if missing:
        out.append(f"it ran no {', '.join(missing)} check (eval --tasks none, or a record of an older dsv4kit?)")
    if "tasks" in ran:
        out += task_problems(record, ran["tasks"], host)
    served_ctx = host.get("dsv4_context_length")
    ctx = (record.get("eval") or {}).get("context_length")
    if served_ctx and (ctx or 0) < int(served_ctx):
        out.append(f"its needles reached {ctx} tokens, not the served {served_ctx}")
    evidence = record.get("evidence") or {}
    models = serving_gpu_models(host, facts)
    if models and models != {evidence.get("gpu_model")}:
        out.append(f"it was measured on GPU {evidence.get('gpu_model')!r}, {host.name} serves on {sorted(models)}")
    if facts.driver and evidence.get("driver") != facts.driver:
        out.append(f"it was measured on driver {evidence.get('driver')!r}, {host.name} has {facts.driver!r}")
    if evidence.get("kernels_sha256") != kernels_sha256:
        out.append(f"it measured other dsv4kit kernels ({str(evidence.get('kernels_sha256'))[:12]}) than this "
                   f"checkout ships ({str(kernels_sha256)[:12]})")
    now = without_served_values(eval_record.served_config(host))
    then = without_served_values(evidence.get("served_config") or {})
    if then != now:
        changed = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))
        out.append(f"the serving configuration changed since ({', '.join(changed) or 'its fingerprint'})")
    return out + coupled_problems(record, host, served_with)


def task_problems(record: dict, tasks: dict, host) -> list[str]:
    """The task check against what ``auto`` needs: every arm at the task set's accuracy floor (the
    inventory's ``dsv4_eval_task_floors`` as it is now, else GSM8K's), on at least its number of
    items, and the control run of arm A beside the A/B flips."""
    sha = ((record.get("eval") or {}).get("tasks_source") or {}).get("sha256")
    try:
        min_accuracy, min_items = floor_for(task_floors(host), sha)
    except ValueError as exc:
        return [str(exc)]
    out = []
    for arm, n in sorted((tasks.get("per_arm") or {}).items()):
        accuracy, items = n.get("accuracy"), n.get("n") or 0
        if items < min_items:
            out.append(f"arm {arm} asked {items} task items, fewer than the {min_items} the task set's floor needs")
        elif accuracy is None or accuracy < min_accuracy:
            out.append(f"arm {arm}'s task accuracy {accuracy} is below the task set's floor {min_accuracy}")
    if not tasks.get("per_arm"):
        out.append("its task check has no per-arm accuracy")
    if not tasks.get("control"):
        out.append("it has no control run (arm A's tasks asked twice), so the A/B flips cannot be told from the box's "
                   "own noise")
    return out


def finder(repo: Optional[Path] = None) -> Callable:
    """The lookup for ``plan_host(quality=...)`` over the results repository ``repo`` (default:
    ``$DSV4KIT_RESULTS_REPO``, else ``~/.local/share/dsv4kit/results``, where ``dsv4kit eval`` records)."""
    from dsv4kit.core.paths import results_repo_or_default
    from dsv4kit.validation.verdict_run import kernels_digest

    repo = results_repo_or_default(repo)

    def lookup(host, flag: str, facts, served_with: dict) -> dict:
        values = ",".join(ab_values(flag))
        advice = f"run `dsv4kit eval --ab {flag}={values} --host {host.name}` (docs/quality.md)"
        try:
            records = _records_for(repo, host.name, flag) if repo.exists() else []
        except results_repo.ResultsRepoError as exc:
            return {"ok": False, "record": None, "why": f"the results repository {repo} cannot be read ({exc}); {advice}"}
        if not records:
            return {"ok": False, "record": None,
                    "why": f"no quality record: no `eval --ab {flag}={values}` of {host.name} in {repo}; {advice}"}
        newest = records[-1]
        found = problems(newest, host, facts, kernels_digest(), served_with)
        if found:
            return {"ok": False, "record": newest["run_id"],
                    "why": f"quality record {newest['run_id']} does not hold: {'; '.join(found)}; {advice}"}
        return {"ok": True, "record": newest["run_id"],
                "why": f"quality record {newest['run_id']} passed ({', '.join(REQUIRED_CHECKS)})"}

    return lookup
