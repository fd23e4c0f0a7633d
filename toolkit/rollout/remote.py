"""``dsv4kit rollout status --host NAME``: the rollout report of a box, over the SSH layer of
``dsv4kit validate`` (``dsv4kit.core.ssh``: verified host keys, remote commands under a timeout).

On the box, the venv python (``dsv4_venv_dir``) reads the environment the GPU servers get: the
``EnvironmentFile=`` and ``Environment=`` lines of the units the sglang_service role writes (their
names are the role's ``sglang_service_gpu_unit_names``: ``dsv4-prefill.service``, ``dsv4-decode.service``
under ``<dsv4_prefix>/etc/systemd/system``). It builds ``dsv4kit.rollout.status.status_report()`` from that
environment alone (no kernel flag of the SSH login), as ``python -m dsv4kit.rollout status`` would in
the server. The report says which files its flags came from (``environment_from``). No such unit on
the box: exit 5, naming the paths.
"""

from __future__ import annotations

import json
import shlex
from typing import Callable, Optional

from dsv4kit.core import exitcodes
from dsv4kit.core.box_paths import decision_file, unit_dir
from dsv4kit.core.exitcodes import Abort

# Runs on the box with the venv python; standard library plus the installed dsv4kit only.
_BOX_SCRIPT = r'''
import json, os, sys
try:
    from dsv4kit.core.unit_env import read_unit
    from dsv4kit.rollout.status import status_report
except ImportError as exc:
    print(json.dumps({"dsv4kit_missing": str(exc)}))
    sys.exit(0)
env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}  # nothing of the login's
used, missing = [], []
for path in sys.argv[2:]:
    try:
        unit = read_unit(path)
    except OSError:
        missing.append(path)
        continue
    used += [path, *unit["env_files"]]
    env.update(unit["env"])
if not used:
    print(json.dumps({"units_missing": missing}))
    sys.exit(0)
os.environ.clear()
os.environ.update(env)
try:  # the decision file kernel_rollout wrote beside the flags (a dsv4kit before it has no such argument)
    report = status_report(env, decision_path=sys.argv[1] or None)
except TypeError:
    report = status_report(env)
report["environment_from"] = used
print(json.dumps(report))
'''

#: The GPU servers' units when the checkout's role cannot be read (an installed wheel has no
#: playbooks); tests/rollout/test_rollout_status_host.py holds it to the role's defaults.
FALLBACK_SERVER_UNITS = ("dsv4-prefill.service", "dsv4-decode.service")


def server_unit_names() -> list[str]:
    """The serving units that run SGLang, by the sglang_service role's own variable."""
    from dsv4kit.core.paths import REPO_ROOT

    defaults = REPO_ROOT / "playbooks/roles/sglang_service/defaults/main.yml"
    try:
        import yaml

        names = yaml.safe_load(defaults.read_text()).get("sglang_service_gpu_unit_names")
    except (OSError, ImportError, ValueError, AttributeError):
        names = None
    return [str(n) for n in names] if isinstance(names, list) and names else list(FALLBACK_SERVER_UNITS)


def remote_report(host, *, timeout: float, trust_new_host_key: bool = False,
                  say: Optional[Callable[[str], None]] = None, decision: Optional[str] = None) -> dict:
    """The box's rollout report; Abort with 3 (unreachable), 4 (timeout), 5 (no venv python or
    no dsv4kit there) or 6 (no report came back)."""
    from dsv4kit.core import ssh

    python = host.venv_python
    units = [f"{unit_dir(host)}/{name}" for name in server_unit_names()]
    command = (f"if [ ! -x {shlex.quote(python)} ]; then echo __no_python__; exit 0; fi; "
               f"{shlex.quote(python)} -c {shlex.quote(_BOX_SCRIPT)} "
               f"{shlex.quote(decision_file(host) if decision is None else decision)} "
               + " ".join(shlex.quote(u) for u in units))
    try:
        with ssh.open_session(host, trust_new_host_key=trust_new_host_key, say=say) as session:
            result = session.run(command, timeout=timeout, cwd="/", check=False)
    except ssh.RemoteError as exc:
        raise Abort(exc.exit_code, str(exc)) from None
    out = result.stdout.strip()
    if out == "__no_python__":
        raise Abort(exitcodes.ENVIRONMENT, f"no venv python on {host.name}: {python} does not exist or is not "
                                           f"executable (provision the box first: dsv4kit provision)")
    try:
        report = json.loads(out.splitlines()[-1]) if out else None
    except ValueError:
        report = None
    if not isinstance(report, dict):
        tail = (result.stderr.strip() or out)[-2000:]
        raise Abort(exitcodes.TOOL_FAILED, f"{python} on {host.name} exited {result.exit_code} without a "
                                           f"report" + (f":\n{tail}" if tail else ""))
    if "dsv4kit_missing" in report:
        raise Abort(exitcodes.ENVIRONMENT, f"dsv4kit is not installed in {host['dsv4_venv_dir']} on {host.name} "
                                           f"({report['dsv4kit_missing']}); roll it out with dsv4kit provision "
                                           f"--tags kernel_rollout")
    if "units_missing" in report:
        raise Abort(exitcodes.ENVIRONMENT, f"no serving unit on {host.name}: {', '.join(report['units_missing'])} "
                                           f"do not exist, so the servers' kernel flags are unknown (provision "
                                           f"the box first: dsv4kit provision)")
    report["host"] = host.name
    return report


def environment_line(report: dict, host) -> str:
    used = report.get("environment_from") or []
    return f"Flags read from the serving units' environment on {host.name}: {', '.join(used)}"
