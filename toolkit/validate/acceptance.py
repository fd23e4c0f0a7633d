"""Speculative acceptance as a health signal of ``validate --gpu``.

With a drafter configured (``dsv4_speculative`` EAGLE or DSPARK), the box's servers are asked for a
few short greedy answers through the router, then the decode server's ``/server_info`` is read:
SGLang 0.5.23 reports ``internal_states[i].avg_spec_accept_length``, the tokens accepted per verify
step since the start (draft tokens accepted + the one the target adds). A value near 1 means no
draft is ever accepted (drafter weights in the wrong scale format give NaN drafts and no
acceptance while the answers still read well): below ``dsv4_speculative_min_acceptance`` the
check fails, with that reason. A server that cannot be reached or has run no verify step yet
leaves the check inconclusive (``passed`` None), never failed.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Callable, Optional

GENERATE_TOKENS = 48
#: Greedy prompts whose answers a drafter predicts well (counting, a known text).
PROMPTS = ("Count from 1 to 40, separated by commas:", "Write the English alphabet in order, one letter per line:")

# Run on the box by the venv's python in the serving session's scratch directory, beside the box-side
# package (``dsv4box``: its HTTP client sends the router's key as it read it on the box): argv
# router_port decode_port tokens prompts; prints one JSON object.
BOX_SCRIPT = r"""
import json, sys
from dsv4box.http import post, server_info
router, decode, tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out = {"generated": 0}
try:
    for prompt in json.loads(sys.argv[4]):
        body = {"text": prompt, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
        post(router, "/generate", body, 120)
        out["generated"] += 1
    info = server_info(decode, 120)
    out["server_info"] = {k: info.get(k) for k in ("speculative_algorithm", "speculative_num_draft_tokens",
                                                   "avg_spec_accept_length", "internal_states")}
except Exception as exc:
    out["error"] = type(exc).__name__ + ": " + " ".join(str(exc).split())[:300]
print(json.dumps(out))
"""


def read_acceptance(server_info: dict) -> Optional[float]:
    """The acceptance length a server reports (mean over its DP ranks), or None when none yet."""
    values = [state.get("avg_spec_accept_length") for state in server_info.get("internal_states") or []
              if isinstance(state, dict)]
    values = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not values and isinstance(server_info.get("avg_spec_accept_length"), (int, float)):
        values = [float(server_info["avg_spec_accept_length"])]
    return sum(values) / len(values) if values else None


def judge(algorithm: str, least: float, probe: dict) -> dict:
    """The check's result: ``passed`` True, False or None (inconclusive), with its reason."""
    result: dict[str, Any] = {"algorithm": algorithm, "min_acceptance": least, "acceptance_length": None}
    if probe.get("error") or not isinstance(probe.get("server_info"), dict):
        return {**result, "passed": None, "message": "acceptance not checked: the servers did not answer "
                f"({probe.get('error') or 'no /server_info'}); start them (dsv4kit provision --tags sglang_service)"}
    info = probe["server_info"]
    served = info.get("speculative_algorithm")
    if served != algorithm:
        return {**result, "passed": False, "message": f"the inventory configures {algorithm} speculative decoding "
                f"but the decode server runs {served!r}: provision again (dsv4kit provision --tags sglang_service)"}
    accepted = read_acceptance(info)
    result["acceptance_length"] = accepted
    if accepted is None:
        return {**result, "passed": None, "message": f"acceptance not checked: the decode server reports no "
                f"acceptance length after {probe.get('generated', 0)} answers (no verify step ran)"}
    if accepted < least:
        return {**result, "passed": False, "message": (
            f"the {algorithm} drafter's acceptance length is {accepted:.2f} tokens per verify step, below "
            f"dsv4_speculative_min_acceptance {least:g}: about 1 means no draft token is accepted (broken "
            f"drafter weights, e.g. a wrong scale format), even when the answers look right")}
    return {**result, "passed": True,
            "message": f"the {algorithm} drafter's acceptance length is {accepted:.2f} tokens per verify step"}


def check(session, host, say: Callable[[str], None], timeout: float = 600.0) -> Optional[dict]:
    """Run the probe on the box through its serving session (``dsv4kit.serving.ServingSession``: the
    ports, the key and the venv python) and judge it; None when the host configures no drafter."""
    from dsv4kit.serving.abort import ServingAbort
    from dsv4kit.serving.session import ServingSession

    algorithm = host.get("dsv4_speculative") or "off"
    if algorithm == "off":
        return None
    least = float(host.get("dsv4_speculative_min_acceptance") or 1.3)
    say(f"speculative decoding ({algorithm}): reading the served acceptance length after "
        f"{len(PROMPTS)} short answers")
    try:
        with ServingSession(session, host, say) as serving:
            command = shlex.join([serving.python, "-c", BOX_SCRIPT, str(serving.addresses.router_port),
                                  str(serving.addresses.decode_port), str(GENERATE_TOKENS), json.dumps(PROMPTS)])
            ran = session.run(command, timeout=timeout, env=serving.env, cwd=serving.workdir, check=False)
    except ServingAbort as exc:
        return judge(algorithm, least, {"error": str(exc)})
    try:
        probe = json.loads((ran.stdout.strip().splitlines() or ["{}"])[-1])
    except ValueError:
        probe = {"error": f"the probe printed no JSON (exit {ran.exit_code}): {ran.stderr.strip()[-300:]}"}
    return judge(algorithm, least, probe)


def exit_code(code: int, result: Optional[dict], say: Callable[[str], None]) -> int:
    """The harness's exit code, made 1 (check failed) when the acceptance check failed."""
    from dsv4kit.core import exitcodes

    if result is None:
        return code
    say(("FAIL: " if result["passed"] is False else "") + result["message"])
    return exitcodes.CHECK_FAILED if result["passed"] is False and code == exitcodes.OK else code
