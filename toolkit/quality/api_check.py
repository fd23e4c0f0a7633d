"""The ``api`` check's verdict: the chat API answers as a client needs them (docs/quality.md).

Judges the raw answers ``api_prompts.run_api`` wrote, per arm:

* tool calls: the function names the prompt wants, each call's ``arguments`` JSON that the tool's
  ``parameters`` schema accepts (``jsonschema``), no call where none is wanted;
* reasoning: thinking on, ``reasoning_content`` is filled; thinking off, none is returned; either
  way ``content`` holds no DSML or thinking markup and not the reasoning again;
* streaming: the streamed deltas (reasoning, content, each call's name and argument pieces) add
  up to exactly the whole answer of the same request (temperature 0, same seed);
* identity: ``/v1/models`` lists the served name.

Every problem names the prompt and quotes the offending text. Any problem fails the check. With
two arms the tool-call results are also paired per prompt with the exact McNemar test, as the
``tasks`` check pairs its items.
"""

from __future__ import annotations

import json
from typing import Optional

from dsv4kit.quality.stats import mcnemar_exact

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
#: Markup that never belongs in ``content``: the DSML marker and the thinking tags.
MARKUP = {"｜DSML｜": "DSML tool-call markup", "<think>": "thinking markup", "</think>": "thinking markup"}
QUOTE = 240


def _quote(text) -> str:
    text = "" if text is None else str(text)
    return repr(text if len(text) <= QUOTE else text[:QUOTE] + "…")


def _message(answer: dict) -> tuple[Optional[dict], Optional[str]]:
    if answer.get("status") != 200 or "body" not in answer:
        return None, f"HTTP {answer.get('status')}: {_quote(answer.get('error'))}"
    try:
        choice = answer["body"]["choices"][0]
        return {**choice["message"], "finish_reason": choice.get("finish_reason")}, None
    except (KeyError, IndexError, TypeError):
        return None, f"not a chat completion: {_quote(json.dumps(answer.get('body'))[:QUOTE])}"


def assemble(answer: dict) -> tuple[Optional[dict], Optional[str]]:
    """The message the streamed deltas add up to: reasoning, content, calls (name, argument pieces)."""
    if answer.get("status") != 200 or "lines" not in answer:
        return None, f"HTTP {answer.get('status')}: {_quote(answer.get('error'))}"
    reasoning, content, calls, finish = [], [], {}, None
    for line in answer["lines"]:
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            break
        try:
            choice = json.loads(payload)["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            return None, f"a stream chunk that is not a chat chunk: {_quote(payload)}"
        delta = choice.get("delta") or {}
        reasoning.append(delta.get("reasoning_content") or "")
        content.append(delta.get("content") or "")
        for piece in delta.get("tool_calls") or []:
            call = calls.setdefault(piece.get("index", 0), {"name": None, "arguments": ""})
            function = piece.get("function") or {}
            call["name"] = call["name"] or function.get("name")
            call["arguments"] += function.get("arguments") or ""
        finish = choice.get("finish_reason") or finish
    return {"reasoning_content": "".join(reasoning), "content": "".join(content),
            "calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}, None


def _calls(message: dict) -> list[dict]:
    return [{"name": (c.get("function") or {}).get("name"), "arguments": (c.get("function") or {}).get("arguments")}
            for c in message.get("tool_calls") or []]


def tool_problems(item: dict, message: dict) -> list[str]:
    """What is wrong with the whole answer's tool calls (empty: right names, schema-valid arguments)."""
    import jsonschema

    pid, problems = item["id"], []
    calls, wanted = _calls(message), list(item["expect_calls"])
    got = [c["name"] for c in calls]
    if sorted(got) != sorted(wanted):
        if wanted and not got:
            problems.append(f"{pid}: no tool call, wanted {', '.join(wanted)}; content {_quote(message.get('content'))}")
        elif not wanted:
            problems.append(f"{pid}: tool call(s) {', '.join(map(str, got))} where none is wanted")
        else:
            problems.append(f"{pid}: called {', '.join(map(str, got))}, wanted {', '.join(wanted)}")
    schemas = {tool["name"]: tool.get("parameters") or {} for tool in item["tools"]}
    for call in calls:
        if call["name"] not in schemas:
            problems.append(f"{pid}: a call to {call['name']!r}, which the request did not offer")
            continue
        try:
            arguments = json.loads(call["arguments"])
        except (TypeError, ValueError) as exc:
            problems.append(f"{pid}: the arguments of {call['name']} are not JSON ({exc}): {_quote(call['arguments'])}")
            continue
        for error in jsonschema.Draft202012Validator(schemas[call["name"]]).iter_errors(arguments):
            where = "/".join(map(str, error.absolute_path)) or "(top)"
            problems.append(f"{pid}: the arguments of {call['name']} break the tool's schema at {where}: "
                            f"{error.message}; arguments {_quote(call['arguments'])}")
    return problems


def reasoning_problems(item: dict, message: dict) -> list[str]:
    pid, problems = item["id"], []
    content, reasoning = message.get("content") or "", message.get("reasoning_content") or ""
    for mark, what in MARKUP.items():
        if mark in content:
            problems.append(f"{pid}: content holds {what} ({mark}): {_quote(content)}")
            break
    if item["thinking"] and not reasoning.strip():
        problems.append(f"{pid}: thinking on but reasoning_content is empty; content {_quote(content)}")
    if not item["thinking"] and reasoning:
        problems.append(f"{pid}: thinking off but reasoning_content is returned: {_quote(reasoning)}")
    if reasoning.strip() and reasoning.strip() in content:
        problems.append(f"{pid}: the thinking leaked into content: {_quote(content)}")
    return problems


def stream_problems(item: dict, message: dict) -> list[str]:
    pid = item["id"]
    streamed, error = assemble(item["streamed"])
    if error:
        return [f"{pid}: the streamed request failed: {error}"]
    whole = {"reasoning_content": message.get("reasoning_content") or "", "content": message.get("content") or "",
             "calls": _calls(message), "finish_reason": message.get("finish_reason")}
    return [f"{pid}: the streamed deltas do not add up to the whole answer: {field} streamed "
            f"{_quote(streamed[field])}, whole {_quote(whole[field])}"
            for field in ("reasoning_content", "content", "calls", "finish_reason") if streamed[field] != whole[field]]


def identity_problems(result: dict, served_names) -> list[str]:
    models = result.get("models") or {}
    try:
        listed = [m["id"] for m in models["body"]["data"]]
    except (KeyError, TypeError):
        return [f"/v1/models did not answer a model list: HTTP {models.get('status')}: {_quote(models.get('error'))}"]
    if not set(served_names) & set(listed):
        return [f"/v1/models lists {', '.join(map(repr, listed)) or 'nothing'}, not the served name "
                f"{' or '.join(map(repr, served_names))}"]
    return []


def arm_numbers(result: dict, served_names) -> dict:
    """One arm: every problem, and per prompt whether its tool calls were right."""
    names = list(served_names) or [result.get("served_model")]  # records compare: the name the run asked by
    problems, tool_ok = identity_problems(result, names), {}
    for item in result.get("items") or []:
        message, error = _message(item["whole"])
        if error:
            problems.append(f"{item['id']}: the request failed: {error}")
            tool_ok[item["id"]] = False
            continue
        tools = tool_problems(item, message)
        tool_ok[item["id"]] = not tools
        problems += tools + reasoning_problems(item, message) + stream_problems(item, message)
    return {"prompts": len(result.get("items") or []), "problems": problems, "tool_ok": tool_ok,
            "tool_right": sum(tool_ok.values())}


def api_check(arms: dict, served_names, alpha: float = 0.05) -> dict:
    """The ``api`` check of the arms' results (``arms[arm]["checks"]["api"]``)."""
    per_arm = {arm: arm_numbers(r["checks"]["api"], served_names) for arm, r in arms.items()}
    if not any(n["prompts"] for n in per_arm.values()):
        return {"check": "api", "outcome": INCONCLUSIVE, "why": "no chat prompt was asked", "per_arm": per_arm}
    numbers: dict = {"per_arm": per_arm}
    why = []
    if "B" in per_arm:
        a, b = per_arm["A"]["tool_ok"], per_arm["B"]["tool_ok"]
        paired = sorted(set(a) & set(b))
        lost = [p for p in paired if a[p] and not b[p]]
        gained = [p for p in paired if b[p] and not a[p]]
        p = mcnemar_exact(len(lost), len(gained))
        numbers.update(paired=len(paired), lost=lost, gained=gained, mcnemar_p=p)
        why.append(f"tool calls: B wrong where A right on {len(lost)} prompt(s), right where A wrong on "
                   f"{len(gained)}; McNemar p={p:.3g}")
        if len(lost) > len(gained) and p < alpha:
            return {"check": "api", "outcome": FAIL, "why": "; ".join(why) + f" < {alpha}", **numbers}
    bad = {arm: n["problems"] for arm, n in per_arm.items() if n["problems"]}
    if bad:
        lines = [f"arm {arm}: {problem}" if len(per_arm) > 1 else problem
                 for arm, problems in bad.items() for problem in problems]
        return {"check": "api", "outcome": FAIL, "why": f"{len(lines)} problem(s): " + " | ".join(lines[:8])
                + (f" | and {len(lines) - 8} more" if len(lines) > 8 else ""), "problems": lines, **numbers}
    right = ", ".join(f"arm {arm}: {n['tool_right']}/{n['prompts']} prompts right" for arm, n in per_arm.items())
    return {"check": "api", "outcome": PASS, "why": "; ".join([right, *why]) + "; reasoning, streaming and "
            "/v1/models as a client needs them", **numbers}
