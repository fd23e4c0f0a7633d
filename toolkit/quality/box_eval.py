"""The box-side half of ``dsv4kit eval``: ask the served model, write what it answered.

Runs in the SGLang venv on the box (standard library, plus ``transformers`` for the model's own
tokenizer), next to ``prompts.py``, against the router on 127.0.0.1 as users reach it::

    python box_eval.py probe --url URL
    python box_eval.py run --spec SPEC.json --out RESULT.json

``probe`` prints one JSON line: the served model and context length (``/server_info``) and
whether ``/generate`` returns the logprob fields SGLang 0.5.23 writes (``meta_info``
``output_token_logprobs``: ``[logprob, token_id, text|null]`` triples; ``output_top_logprobs``:
per position a list of such triples). ``run`` runs the checks the spec names and writes the raw
answers; judging them is the local side's job (``dsv4kit.quality.checks``). Every request asks
for logprobs with the top-k; the result's ``budget`` holds, per check, the requests, tokens and
lengths it drove and the logprob values that were null or not finite (``Ledger``). Progress goes to
stderr as ``progress CHECK DONE TOTAL``. Every HTTP call has a timeout. The router's key, when the
box has one, is read from the box's key file (``dsv4box.key``) and sent as the bearer key.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prompts  # noqa: E402  (copied beside this file)
import api_prompts  # noqa: E402  (copied beside this file; the api check)
try:  # on the box: the serving stack's box-side package, copied beside this file
    from dsv4box.http import headers as key_headers, open_request, request
except ImportError:  # on the control machine (the judge imports finite from here)
    from dsv4kit.serving.box.http import headers as key_headers, open_request, request

REQUEST_TIMEOUT_S = 900.0


class EvalError(Exception):
    pass


def _headers() -> dict:
    return {"Content-Type": "application/json", **key_headers()}


def call(url: str, path: str, body=None, timeout: float = REQUEST_TIMEOUT_S):
    try:
        status, raw = request(url, path, body, timeout)
    except (urllib.error.URLError, OSError) as exc:
        raise EvalError(f"{path}: {getattr(exc, 'reason', exc)}") from None
    if status >= 400:
        raise EvalError(f"{path}: HTTP {status}: {raw[:300].decode(errors='replace')}")
    try:
        return json.loads(raw) if raw.strip()[:1] in (b"{", b"[") else raw.decode(errors="replace")
    except ValueError as exc:
        raise EvalError(f"{path}: not JSON: {exc}") from None


def decode_info(info: dict) -> dict:
    """The decode server's part of a router's ``{"prefill": [...], "decode": [...]}``."""
    if isinstance(info.get("decode"), list) and info["decode"]:
        return info["decode"][0]
    return info


def generate(url: str, body: dict) -> dict:
    answer = call(url, "/generate", body)
    if isinstance(answer, list):  # a batch answer; we send one prompt a request
        answer = answer[0]
    if not isinstance(answer, dict) or "meta_info" not in answer:
        raise EvalError(f"/generate answered without meta_info: {str(answer)[:300]}")
    return answer


def probe(url: str) -> dict:
    info = decode_info(call(url, "/server_info", timeout=60))
    answer = generate(url, {"text": "The river bends twice before", "sampling_params": {
        "temperature": 0.0, "max_new_tokens": 2, "ignore_eos": True}, "return_logprob": True,
        "logprob_start_len": -1, "top_logprobs_num": 2, "return_text_in_logprobs": False})
    meta = answer["meta_info"]
    token_lp = meta.get("output_token_logprobs")
    top = meta.get("output_top_logprobs")
    problems = []
    if not isinstance(token_lp, list) or not token_lp or not all(isinstance(t, list) and len(t) == 3 for t in token_lp):
        problems.append(f"meta_info.output_token_logprobs is {str(token_lp)[:120]!r}, not [logprob, id, text] triples")
    if not isinstance(top, list) or len(top) != len(token_lp or []):
        problems.append(f"meta_info.output_top_logprobs is {str(top)[:120]!r}, not one list per output token")
    if "output_ids" not in answer:
        problems.append("the answer has no output_ids")
    return {"ok": True, "logprobs": not problems, "problems": problems,
            "model_path": info.get("model_path"), "served_model_name": info.get("served_model_name"),
            "context_length": info.get("context_length"), "disable_radix_cache": info.get("disable_radix_cache")}


class Progress:
    def __init__(self, check: str, total: int):
        self.check, self.total, self.done, self.lock = check, total, 0, threading.Lock()
        self._say()

    def step(self, n: int = 1) -> None:
        with self.lock:
            self.done += n
            self._say()

    def _say(self) -> None:
        print(f"progress {self.check} {self.done} {self.total}", file=sys.stderr, flush=True)


class Tokens:
    """The model's tokenizer: pieces encoded without special tokens, a prompt starts with BOS.

    ``tokenizer.json`` through ``tokenizers`` when the model directory has one (what
    ``transformers``' fast tokenizer wraps, without its import time), else ``AutoTokenizer``."""

    def __init__(self, model_path: str):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            if os.path.isfile(os.path.join(model_path, "tokenizer.json")):
                self._fast(model_path)
            else:
                self._auto(model_path)
        except EvalError:
            raise
        except Exception as exc:  # noqa: BLE001 - any loader failure is one clear error
            raise EvalError(f"cannot load the tokenizer of {model_path}: {exc}") from None

    def _fast(self, model_path: str) -> None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(os.path.join(model_path, "tokenizer.json"))
        self._encode = lambda text: tok.encode(text, add_special_tokens=False).ids
        bos = None
        config = os.path.join(model_path, "tokenizer_config.json")
        if os.path.isfile(config):
            with open(config, encoding="utf-8") as fh:
                bos = json.load(fh).get("bos_token")
        bos = bos.get("content") if isinstance(bos, dict) else bos
        bos_id = tok.token_to_id(bos) if bos else None
        self.bos = [bos_id] if bos_id is not None else []

    def _auto(self, model_path: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise EvalError(f"no tokenizer.json in {model_path} and transformers is not importable: {exc}") from None
        tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=False)
        self._encode = lambda text: list(tok(text, add_special_tokens=False)["input_ids"])
        self.bos = [tok.bos_token_id] if tok.bos_token_id is not None else []

    def encode(self, text: str) -> list:
        return list(self._encode(text))


# ------------------------------------------------------------------------------ every request
def finite(value) -> bool:
    """The one rule for a logprob, here and in the judge (``quality.stats`` uses this one): a real,
    finite number. Null, NaN, an infinity or a bool is not."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Ledger:
    """What each check drove (requests, tokens, prompt lengths, the furthest position reached and
    whether it passed the indexer's threshold) and the logprob health of every answer: null or
    non-finite values anywhere in the output (and re-prefill input) logprobs, or missing fields."""

    def __init__(self, threshold: int):
        self.threshold, self.lock, self.checks = threshold, threading.Lock(), {}

    def add(self, check: str, prompt_len: int, answer: dict, top_k: int) -> None:
        meta = answer.get("meta_info") or {}
        out = len(answer.get("output_ids") or []) or int(meta.get("completion_tokens") or 0)
        values, missing = [], False
        lp, top = meta.get("output_token_logprobs"), meta.get("output_top_logprobs")
        if out and not lp or out and top_k and not top:
            missing = True
        values += [t[0] if isinstance(t, list) and t else None for t in lp or []]
        values += [e[0] if isinstance(e, list) and e else None for pos in top or [] for e in (pos or [None])]
        inputs = meta.get("input_token_logprobs")
        if inputs:  # the first input position has no logprob (SGLang writes null there)
            values += [t[0] if isinstance(t, list) and t else None for t in inputs[1:]]
        bad = sum(1 for v in values if not finite(v))
        with self.lock:
            e = self.checks.setdefault(check, {"requests": 0, "prompt_tokens": 0, "output_tokens": 0,
                                               "prompt_min": None, "prompt_max": 0, "max_position": 0,
                                               "past_threshold": 0, "logprob_values": 0, "bad_logprobs": 0,
                                               "missing_logprobs": 0})
            e["requests"] += 1
            e["prompt_tokens"] += prompt_len
            e["output_tokens"] += out
            e["prompt_min"] = prompt_len if e["prompt_min"] is None else min(e["prompt_min"], prompt_len)
            e["prompt_max"] = max(e["prompt_max"], prompt_len)
            e["max_position"] = max(e["max_position"], prompt_len + out)
            e["past_threshold"] += prompt_len + out > self.threshold
            e["logprob_values"] += len(values)
            e["bad_logprobs"] += bad
            e["missing_logprobs"] += missing

    def report(self) -> dict:
        with self.lock:
            return {name: {**e, "threshold_tokens": self.threshold, "crossed_threshold": e["max_position"] > self.threshold}
                    for name, e in self.checks.items()}


def ask(url: str, ledger: Ledger, check: str, body: dict, top_k: int) -> dict:
    """``/generate`` with logprobs (top-k) on: every answer is checked for null or non-finite values."""
    body = {"return_logprob": True, "logprob_start_len": -1, "top_logprobs_num": top_k,
            "return_text_in_logprobs": False, **body}
    started = time.monotonic()
    answer = generate(url, body)
    answer["_span"] = [started, time.monotonic()]
    prompt_len = len(body["input_ids"]) if "input_ids" in body else int(
        (answer.get("meta_info") or {}).get("prompt_tokens") or 0)
    ledger.add(check, prompt_len, answer, body.get("top_logprobs_num") or 0)
    return answer


def _lp(meta: dict, key: str) -> list:
    return [t[0] for t in meta.get(key) or []]


def _top(positions) -> list:
    return [[[e[0], e[1]] for e in (pos or [])] for pos in positions or []]


# ------------------------------------------------------------------------------ the checks
def logprob_check(url: str, tokens: Tokens, spec: dict, parallel: int, ledger: Ledger) -> dict:
    """Decode against re-prefill (SGLang 0.5.23's KL method) on seeded prose prompts."""
    n, top_k = spec["samples"], spec["top_k"]
    prompts_ids = [(tokens.bos + tokens.encode(prompts.filler_text(spec["seed"], i, 80)))[:spec["prompt_tokens"]]
                   for i in range(n)]
    progress = Progress("logprob", 2 * n)

    def decode(ids):
        answer = ask(url, ledger, "logprob", {"input_ids": ids, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": spec["max_new_tokens"], "ignore_eos": True}}, top_k)
        progress.step()
        return answer

    def reprefill(pair):
        # Logprobs (and top-k) from the last prompt position on: SGLang's first one is null, the
        # rest are the generated tokens' positions.
        prompt, ids = pair
        answer = ask(url, ledger, "logprob", {"input_ids": ids, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": 0}, "logprob_start_len": max(0, len(prompt) - 1)}, top_k)
        progress.step()
        return answer

    call(url, "/flush_cache", {}, timeout=120)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        decoded = list(pool.map(decode, prompts_ids))
    call(url, "/flush_cache", {}, timeout=120)  # the re-prefill must compute, not reuse the decode's KV
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        prefilled = list(pool.map(reprefill, [(ids, ids + list(a.get("output_ids") or [])) for ids, a in
                                              zip(prompts_ids, decoded)]))
    samples = []
    for i, (ids, a, p) in enumerate(zip(prompts_ids, decoded, prefilled)):
        meta = a["meta_info"]
        out = [t[0] for t in meta.get("output_token_logprobs") or []]
        top = [None if pos is None else [[e[0], e[1]] for e in pos] for pos in meta.get("output_top_logprobs") or []]
        inputs = [t[0] for t in p["meta_info"].get("input_token_logprobs") or []]
        tail = inputs[-len(out):] if out else []
        pre_top = [None if pos is None else [[e[0], e[1]] for e in pos]
                   for pos in p["meta_info"].get("input_top_logprobs") or []]
        samples.append({"index": i, "prompt_tokens": len(ids), "output_ids": list(a.get("output_ids") or []),
                        "output_logprobs": out, "output_top": top, "reprefill_logprobs": tail,
                        "reprefill_top": pre_top[-len(out):] if out else []})
    return {"samples": samples}


def needle_check(url: str, tokens: Tokens, spec: dict, ledger: Ledger, top_k: int) -> dict:
    """Pass keys at several depths of haystacks up to the served context (``prompts.needle_plan``)."""
    plan = prompts.needle_plan(spec["seed"], spec["contexts"], spec["depths"], spec["variants"], spec.get("spacing"))
    progress = Progress("needles", sum(len(cell["needles"]) for cell in plan))
    filler = [tokens.encode(" " + s) for s in prompts.FILLER]
    cells = []
    for cell in plan:
        haystack = _haystack(tokens, filler, cell, spec["seed"])
        results = []
        for needle in cell["needles"]:
            ids = haystack + tokens.encode(prompts.needle_question(needle["label"]))
            answer = ask(url, ledger, "needles", {"input_ids": ids, "sampling_params": {
                "temperature": 0.0, "max_new_tokens": spec["max_new_tokens"]}}, top_k)
            text = answer.get("text") or ""
            results.append({**needle, "answer": text[:200], "found": prompts.first_key(text) == needle["key"],
                            "output_ids": list(answer.get("output_ids") or [])})
            progress.step()
        cells.append({"context": cell["context"], "variant": cell["variant"], "prompt_tokens": len(haystack),
                      "needles": results})
    return {"cells": cells}


def _haystack(tokens: Tokens, filler: list, cell: dict, seed: int) -> list:
    """BOS + filler sentences with each needle sentence where its depth falls; exactly
    ``context - QUESTION_RESERVE`` tokens (the last filler sentence is cut)."""
    import random

    target = cell["context"] - prompts.QUESTION_RESERVE
    needles = sorted(cell["needles"], key=lambda n: n["depth"])
    pieces = [(tokens.encode(prompts.needle_sentence(n["label"], n["key"])), n["depth"]) for n in needles]
    body_len = target - len(tokens.bos) - sum(len(p) for p, _ in pieces)
    rng = random.Random(f"haystack:{seed}:{cell['context']}:{cell['variant']}")
    out, placed = list(tokens.bos), 0
    filled = 0
    while filled < body_len:
        while placed < len(pieces) and filled >= pieces[placed][1] * body_len:
            out += pieces[placed][0]
            placed += 1
        sentence = filler[rng.randrange(len(filler))][:body_len - filled]
        out += sentence
        filled += len(sentence)
    for piece, _ in pieces[placed:]:
        out += piece
    return out


def task_check(url: str, spec: dict, parallel: int, ledger: Ledger, top_k: int, check: str = "tasks",
               tokens=None) -> dict:
    """Few-shot items, SGLang's stop strings; the answer is the last integer. Temperature 0, or
    ``spec["sampling"]`` (temperature, top_p) with a fixed seed per item; after
    ``spec["prefix"]`` (a needle haystack cut to ``prompt_tokens``) when given."""
    with open(spec["path"], encoding="utf-8") as fh:
        items, problems = prompts.parse_tasks(fh.read(), spec["path"])
    if problems:
        raise EvalError("; ".join(problems))
    shots, questions = items[:spec["shots"]], items[spec["shots"]:][:spec["questions"]]
    prefix = prompts.few_shot_prefix(shots)
    sampling = spec.get("sampling") or {"temperature": 0.0}
    haystack = _prefix_haystack(tokens, spec["prefix"], spec["seed"]) if spec.get("prefix") else None
    progress = Progress(check, len(questions))

    def ask_one(pair):
        index, item = pair
        params = {**sampling, "max_new_tokens": spec["max_new_tokens"], "stop": prompts.FEW_SHOT_STOP}
        if "sampling_seed" in sampling:
            params["sampling_seed"] = sampling["sampling_seed"] + item["line"]
        text = prompts.task_prompt(prefix, item["question"])
        if haystack is not None:
            question = tokens.encode("\n\n" + text)
            cut = spec["prefix"]["context"] - len(question) - spec["max_new_tokens"] - 8
            body = {"input_ids": haystack[:cut] + question, "sampling_params": params}
        else:
            body = {"text": text, "sampling_params": params}
        answer = ask(url, ledger, check, body, top_k)
        progress.step()
        pred = prompts.answer_value(answer.get("text") or "")
        label = prompts.answer_value(item["answer"].split("####")[-1])
        meta = answer.get("meta_info") or {}
        return {"line": item["line"], "label": label, "pred": pred, "correct": pred is not None and pred == label,
                "output_tokens": meta.get("completion_tokens"), "prompt_tokens": meta.get("prompt_tokens"),
                "output_ids": list(answer.get("output_ids") or [])}

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        results = list(pool.map(ask_one, list(enumerate(questions))))
    return {"items": results, "shots": len(shots), "sampling": sampling}


_HAYSTACKS: dict = {}


def _prefix_haystack(tokens: Tokens, where: dict, seed: int) -> list:
    """The needle check's haystack of ``where["context"]`` / ``where["variant"]`` (same ids: the
    radix cache holds it once the needles ran); built once per run."""
    key = (seed, where["context"], where["variant"], tuple(where["depths"]))
    if key not in _HAYSTACKS:
        cell = next(c for c in prompts.needle_plan(seed, [where["context"]], where["depths"], where["variant"] + 1)
                    if c["variant"] == where["variant"])
        _HAYSTACKS[key] = _haystack(tokens, [tokens.encode(" " + s) for s in prompts.FILLER], cell, seed)
    return _HAYSTACKS[key]


def long_check(url: str, tokens: Tokens, spec: dict, parallel: int, ledger: Ledger) -> dict:
    """Decode against re-prefill past the indexer's threshold: prefixes of the needle haystacks
    (cut to leave room for the output) and long generations, from a short prompt or after a
    haystack. The re-prefill sends prompt + output back with ``logprob_start_len`` at the prompt's
    last token: SGLang then reuses at most that much cached prefix, so the output positions are
    computed again by the prefill path, without a cache flush (the long prefix stays cached)."""
    top_k, seed = spec["top_k"], spec["seed"]
    wanted = []
    for where in spec["prefixes"]:  # {"context", "variant", "depths", "max_new_tokens"}
        hay = _prefix_haystack(tokens, where, seed)
        wanted.append({"kind": "prefix", "context": where["context"], "variant": where["variant"],
                       "ids": hay[:where["context"] - where["max_new_tokens"] - 8],
                       "max_new_tokens": where["max_new_tokens"], "ignore_eos": True})
    for g, gen in enumerate(spec["generations"]):  # {"max_new_tokens", "prefix": None | {"context", ...}}
        ask_ids = tokens.encode(prompts.long_answer_prompt(seed, g))
        if gen.get("prefix"):
            where = gen["prefix"]
            hay = _prefix_haystack(tokens, where, seed)
            ids = hay[:where["context"] - gen["max_new_tokens"] - len(ask_ids) - 8] + ask_ids
        else:
            ids = tokens.bos + ask_ids
        wanted.append({"kind": "generation", "context": (gen.get("prefix") or {}).get("context"),
                       "variant": (gen.get("prefix") or {}).get("variant"), "ids": ids,
                       "max_new_tokens": gen["max_new_tokens"], "ignore_eos": False})
    progress = Progress("long", 2 * len(wanted))

    def decode(w):
        answer = ask(url, ledger, "long", {"input_ids": w["ids"], "sampling_params": {
            "temperature": 0.0, "max_new_tokens": w["max_new_tokens"], "ignore_eos": w["ignore_eos"]}}, top_k)
        progress.step()
        return answer

    def reprefill(pair):
        w, answer = pair
        ids = w["ids"] + list(answer.get("output_ids") or [])
        again = ask(url, ledger, "long", {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 0},
                                          "logprob_start_len": len(w["ids"]) - 1}, top_k)
        progress.step()
        return again

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        decoded = list(pool.map(decode, wanted))
        prefilled = list(pool.map(reprefill, list(zip(wanted, decoded))))
    samples = []
    for i, (w, a, p) in enumerate(zip(wanted, decoded, prefilled)):
        meta, again = a["meta_info"], p["meta_info"]
        out = _lp(meta, "output_token_logprobs")
        n = len(out)
        samples.append({"index": i, "kind": w["kind"], "context": w["context"], "variant": w["variant"],
                        "prompt_tokens": len(w["ids"]), "max_position": len(w["ids"]) + n,
                        "finish": (meta.get("finish_reason") or {}).get("type"),
                        "output_ids": list(a.get("output_ids") or []), "output_logprobs": out,
                        "output_top": _top(meta.get("output_top_logprobs")),
                        "reprefill_logprobs": _lp(again, "input_token_logprobs")[-n:] if n else [],
                        "reprefill_top": _top((again.get("input_top_logprobs") or [])[-n:]) if n else []})
    return {"samples": samples, "threshold_tokens": spec["threshold_tokens"]}


#: Mixed phases run at most, until one has a short request in flight beside a long prefill.
MIXED_ATTEMPTS = 3


def batch_check(url: str, tokens: Tokens, spec: dict, parallel: int, ledger: Ledger) -> dict:
    """The box's batch mix: short greedy requests one at a time, then the same requests at the
    serving concurrency while uncached long prompts prefill (chunked prefill mixes them). The
    client-side start and end of every request are kept, so the judge can see the overlap.

    Every request of the mixed phase waits at one barrier, so a slow client cannot hold the short
    ones back until the long prefills are over; the longs go first, the shorts ``stagger_s`` later.
    A mixed phase in which no short request was in flight beside a long one is run again, with
    fresh long prompts, up to ``MIXED_ATTEMPTS`` times (``attempts`` says how many ran)."""
    top_k, seed = spec["top_k"], spec["seed"]
    shorts = [(tokens.bos + tokens.encode(prompts.filler_text(seed + 7919, i, 60)))[:spec["prompt_tokens"]]
              for i in range(spec["samples"])]
    if spec.get("prefix"):  # the first rows after a cached haystack: their decode reads the indexer's logits
        hay = _prefix_haystack(tokens, spec["prefix"], seed)
        room = spec["prefix"]["context"] - spec["prompt_tokens"] - spec["max_new_tokens"] - 8
        for i in range(min(spec["long_rows"], len(shorts))):
            shorts[i] = hay[:room - i] + shorts[i][len(tokens.bos):]

    def long_prompts(attempt: int) -> list:  # haystack variants no other check asks: not in the cache
        out = []
        for k in range(spec["long_prefills"]):
            where = {"context": spec["long_context"], "variant": 1000 + attempt * spec["long_prefills"] + k,
                     "depths": [0.5]}
            out.append(_prefix_haystack(tokens, where, seed)[:spec["long_context"] - 16])
        return out

    longs = long_prompts(0)
    progress = Progress("batch", 2 * len(shorts) + len(longs))

    def short(ids):
        answer = ask(url, ledger, "batch", {"input_ids": ids, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": spec["max_new_tokens"], "ignore_eos": True}}, top_k)
        progress.step()
        return answer

    def long(ids):
        answer = ask(url, ledger, "batch", {"input_ids": ids, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": 4}}, top_k)
        progress.step()
        return answer

    # Background rows that fill the batch up to the serving concurrency (not compared).
    load = [(tokens.bos + tokens.encode(prompts.filler_text(seed + 104729, i, 60)))[:spec["prompt_tokens"]]
            for i in range(max(0, parallel - len(shorts) - len(longs)))]

    def background(ids):
        return ask(url, ledger, "batch", {"input_ids": ids, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": 2 * spec["max_new_tokens"], "ignore_eos": True}}, top_k)

    def mixed_phase(longs: list) -> tuple[list, list]:
        stagger = spec.get("stagger_s", 0.05)  # the long prefills are scheduled first
        jobs = [(long, ids, 0.0) for ids in longs] + [(short, ids, stagger) for ids in shorts] + [
            (background, ids, stagger) for ids in load]
        gate = threading.Barrier(len(jobs))

        def run(job):
            fn, ids, wait = job
            gate.wait(timeout=120)
            time.sleep(wait)
            return fn(ids)

        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            answers = list(pool.map(run, jobs))
        return answers[len(longs):len(longs) + len(shorts)], answers[:len(longs)]

    alone = [short(ids) for ids in shorts]
    for attempt in range(MIXED_ATTEMPTS):
        if attempt:
            longs = long_prompts(attempt)
            with progress.lock:  # the ETA counts the phase run again
                progress.total += len(shorts) + len(longs)
        mixed, long_answers = mixed_phase(longs)
        long_spans = [a["_span"] for a in long_answers]
        if any(m["_span"][0] < s[1] and s[0] < m["_span"][1] for m in mixed for s in long_spans):
            break
    zero = min([a["_span"][0] for a in alone + mixed + long_answers] or [0.0])

    def side(answer):
        meta = answer["meta_info"]
        return {"output_ids": list(answer.get("output_ids") or []), "output_top": _top(meta.get("output_top_logprobs")),
                "span": [round(t - zero, 4) for t in answer["_span"]]}

    return {"concurrency": len(shorts) + len(longs) + len(load), "background": len(load), "attempts": attempt + 1,
            "requests": [{"index": i, "prompt_tokens": len(ids), "alone": side(a), "mixed": side(m)}
                         for i, (ids, a, m) in enumerate(zip(shorts, alone, mixed))],
            "long": [{"prompt_tokens": len(ids), "span": side(a)["span"]} for ids, a in zip(longs, long_answers)]}


def fetch(url: str, sha256: str, out: str, timeout: float = 120.0) -> dict:
    """Download a tasks file and keep it only when its sha256 is the documented one."""
    import hashlib

    try:
        with open_request(url, "", None, timeout, sent_headers={}) as response:  # no key to a download
            data = response.read()
    except (urllib.error.URLError, OSError) as exc:
        return {"ok": False, "offline": True, "error": f"cannot download {url}: {getattr(exc, 'reason', exc)}"}
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        return {"ok": False, "error": f"{url} has sha256 {digest}, not the documented {sha256}"}
    with open(out + ".tmp", "wb") as fh:
        fh.write(data)
    os.replace(out + ".tmp", out)
    return {"ok": True, "path": out, "sha256": digest}


def run(spec: dict) -> dict:
    url, started = spec["url"], time.time()
    out = {"checks": {}, "timings_s": {}}
    top_k = int(spec.get("top_k") or 5)
    ledger = Ledger(int(spec.get("threshold_tokens") or prompts.INDEXER_THRESHOLD_TOKENS))
    needs_tokens = {"logprob", "needles", "long", "batch", "tasks_long"} & set(spec)
    tokens = Tokens(spec["model_path"]) if needs_tokens else None
    parallel = spec["parallel"]
    for name, fn in (("logprob", lambda s: logprob_check(url, tokens, s, parallel, ledger)),
                     ("needles", lambda s: needle_check(url, tokens, s, ledger, top_k)),
                     ("long", lambda s: long_check(url, tokens, s, parallel, ledger)),
                     ("tasks", lambda s: task_check(url, s, parallel, ledger, top_k)),
                     ("tasks_long", lambda s: task_check(url, s, parallel, ledger, top_k, "tasks_long", tokens)),
                     ("tasks_sampled", lambda s: task_check(url, s, parallel, ledger, top_k, "tasks_sampled")),
                     ("batch", lambda s: batch_check(url, tokens, s, parallel, ledger)),
                     ("api", lambda s: api_prompts.run_api(url, s, _headers(), REQUEST_TIMEOUT_S, lambda done, total:
                                                           print(f"progress api {done} {total}", file=sys.stderr,
                                                                 flush=True)))):
        if name in spec:
            t0 = time.time()
            out["checks"][name] = fn(spec[name])
            out["timings_s"][name] = round(time.time() - t0, 3)
    out["timings_s"]["total"] = round(time.time() - started, 3)
    out["budget"] = ledger.report()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--url", required=True)
    r = sub.add_parser("run")
    r.add_argument("--spec", required=True)
    r.add_argument("--out", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--url", required=True)
    f.add_argument("--sha256", required=True)
    f.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "probe":
            print(json.dumps(probe(args.url)))
            return 0
        if args.command == "fetch":
            print(json.dumps(fetch(args.url, args.sha256, args.out)))
            return 0
        with open(args.spec, encoding="utf-8") as fh:
            result = run(json.load(fh))
        tmp = args.out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
        os.replace(tmp, args.out)
        print(json.dumps({"ok": True, "out": args.out}))
        return 0
    except EvalError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
