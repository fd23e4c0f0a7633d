"""``--dry-run`` of the commands that restart the serving units (``bench``, ``eval --ab``,
``profile``): the restarts a run would make, in order, with the playbook tags and the values each
changes, built from the checked inputs alone. Nothing here connects to the box; what only the box
knows (the context length the units run now) makes a step conditional, and says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from dsv4kit.bench.config import RESTART_TAG


@dataclass
class Step:
    when: str
    tags: list
    changes: dict = field(default_factory=dict)
    how: str = "ansible-playbook"  # or "systemctl restart" (bench --restarts)


def serving_units() -> list[str]:
    """Every serving unit (GPU servers and router), by the sglang_service role's own variable."""
    from dsv4kit.core.paths import REPO_ROOT

    try:
        import yaml

        names = yaml.safe_load((REPO_ROOT / "playbooks/roles/sglang_service/defaults/main.yml").read_text())
        names = names.get("sglang_service_unit_names")
    except (OSError, ImportError, ValueError, AttributeError):
        names = None
    if isinstance(names, list) and names:
        return [str(n) for n in names]
    return ["dsv4-prefill.service", "dsv4-decode.service", "dsv4-router.service"]


def context_steps(contexts: list, restart: bool) -> list[Step]:
    """A restart to each context length the run needs, when the units run another one."""
    if not restart:
        return []
    return [Step(f"before measuring at context length {ctx}, only if the decode server runs another one",
                 [RESTART_TAG], {"dsv4_context_length": ctx}) for ctx in contexts]


def arm_changes(ab, arm: str) -> dict:
    """What arm ``arm`` of ``--ab`` changes, in the inventory's terms."""
    value = ab.values[arm]
    if ab.kind == "env":
        return {f"dsv4_kernel_flags.{ab.key}": value}
    if ab.kind == "server_flag":
        return {f"dsv4_server_extra_args {ab.key}": value}
    return {ab.key: value == "true"}


def arm_steps(ab, repeat: int, context_length: Optional[int]) -> list[Step]:
    """The A/B arms' restarts: interleaved A B A B, one restart before every arm (bench), or A then B (eval, repeat 1)."""
    tags = ["kernel_rollout", RESTART_TAG] if ab.kind == "env" else [RESTART_TAG]
    ctx = {"dsv4_context_length": context_length} if context_length else {}
    return [Step(f"repetition {rep + 1}/{repeat}, arm {arm}", tags, {**arm_changes(ab, arm), **ctx})
            for rep in range(repeat) for arm in ab.arms]


def restarts_steps(repeat: int, restarts: int) -> list[Step]:
    """``bench --restarts``: a plain ``systemctl restart`` before some repetitions, nothing changed."""
    from dsv4kit.bench.sweep import restart_before

    return [Step(f"before repetition {rep + 1}/{repeat} (--restarts {restarts})", [], how="systemctl restart")
            for rep in range(repeat) if rep and restart_before(rep, repeat, restarts)]


def build(command: str, host, inventory_path, steps: list[Step]) -> dict:
    return {"dry_run": True, "command": command, "host": host.name,
            "address": f"{host.get('ansible_host') or host.name}:{host.get('ansible_port') or 22}",
            "inventory": str(inventory_path), "units": serving_units(),
            "steps": [asdict(s) for s in steps]}


def render(plan: dict) -> str:
    lines = [f"dry run of dsv4kit {plan['command']}: nothing was run, the box was not contacted",
             f"box: {plan['host']} ({plan['address']}), inventory {plan['inventory']}",
             f"units restarted at each step: {', '.join(plan['units'])}"]
    if not plan["steps"]:
        lines.append("no restart: the run uses the units as they run now")
    for n, step in enumerate(plan["steps"], 1):
        if step["how"] == "systemctl restart":
            what = "systemctl restart of the units, nothing changed"
        else:
            changes = ", ".join(f"{k}={v}" for k, v in step["changes"].items())
            what = f"ansible-playbook --limit {plan['host']} --tags {','.join(step['tags'])}: {changes}"
        lines.append(f"  {n}. {step['when']}: {what}")
    return "\n".join(lines)


def for_bench(p) -> dict:
    """``bench --dry-run``: the context restart, then the arms' restarts or ``--restarts``."""
    cfg = p.cfg
    later = (arm_steps(p.ab_spec, cfg.repeat, cfg.context_length) if p.ab_spec is not None
             else restarts_steps(cfg.repeat, cfg.restarts))
    return build("bench", p.target, p.inventory_path, context_steps([cfg.context_length], cfg.restart) + later)


def for_eval(p) -> dict:
    """``eval --dry-run``: with ``--ab``, arm A then arm B, each at the context length served now."""
    steps = arm_steps(p.ab_spec, 1, None) if p.ab_spec is not None else []
    return build("eval", p.target, p.inventory_path, steps)


def for_profile(p) -> dict:
    """``profile --dry-run``: a restart to each context length profiled (--ctx, then --compare-ctx)."""
    return build("profile", p.target, p.inventory_path, context_steps(list(p.contexts), p.request.restart))


def output(plan: dict, json_out: bool) -> str:
    """What ``--dry-run`` prints on stdout: the plan, or its JSON in the ``--json`` envelope."""
    import json

    from dsv4kit.core import exitcodes
    from dsv4kit.core.cli_common import json_result

    return json.dumps(json_result(plan, exitcodes.OK), indent=2) if json_out else render(plan)
