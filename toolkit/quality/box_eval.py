"""The box-side half of ``dsv4kit eval``: ask the served model, write what it answered.

Runs in the SGLang venv on the box (standard library, plus ``transformers`` for the model's own
tokenizer), next to ``prompts.py``, against the router on 127.0.0.1 as users reach it::

    python box_eval.py probe --url URL
    python box_eval.py run --spec SPEC.json --out RESULT.json

``probe`` prints one JSON line: the served model and context length (``/server_info``) and
whether ``/generate`` returns the logprob fields SGLang 0.5.23 writes (``meta_info``
``output_token_logprobs``: ``[logprob, token_id, text|null]`` triples; ``output_top_logprobs``:
per position a list of such triples). ``run`` runs the checks the spec names and writes the raw
answers; judging them is the local side's job (``dsv4kit.quality.checks``). Progress goes to
stderr as ``progress CHECK DONE TOTAL``. Every HTTP call has a timeout. ``$OPENAI_API_KEY`` is sent
as the bearer key when set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prompts  # noqa: E402  (copied beside this file)
import api_prompts  # noqa: E402  (copied beside this file; the api check)

REQUEST_TIMEOUT_S = 900.0


class EvalError(Exception):
    pass


def _headers() -> dict:
    headers = {"Content-Type": "application/json"}
    if os.environ.get("OPENAI_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
    return headers


def call(url: str, path: str, body=None, timeout: float = REQUEST_TIMEOUT_S):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers=_headers(), method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise EvalError(f"{path}: HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EvalError(f"{path}: {getattr(exc, 'reason', exc)}") from None
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


# ------------------------------------------------------------------------------ the checks
def logprob_check(url: str, tokens: Tokens, spec: dict, parallel: int) -> dict:
    """Decode against re-prefill (SGLang 0.5.23's KL method) on seeded prose prompts."""
    n, top_k = spec["samples"], spec["top_k"]
    prompts_ids = [(tokens.bos + tokens.encode(prompts.filler_text(spec["seed"], i, 80)))[:spec["prompt_tokens"]]
                   for i in range(n)]
    progress = Progress("logprob", 2 * n)

    def decode(ids):
        answer = generate(url, {"input_ids": ids, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": spec["max_new_tokens"], "ignore_eos": True},
            "return_logprob": True, "logprob_start_len": -1, "top_logprobs_num": top_k,
            "return_text_in_logprobs": False})
        progress.step()
        return answer

    def reprefill(ids):
        answer = generate(url, {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 0},
                                "return_logprob": True, "logprob_start_len": 0, "return_text_in_logprobs": False})
        progress.step()
        return answer

    call(url, "/flush_cache", {}, timeout=120)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        decoded = list(pool.map(decode, prompts_ids))
    call(url, "/flush_cache", {}, timeout=120)  # the re-prefill must compute, not reuse the decode's KV
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        prefilled = list(pool.map(reprefill, [ids + list(a.get("output_ids") or []) for ids, a in
                                              zip(prompts_ids, decoded)]))
    samples = []
    for i, (ids, a, p) in enumerate(zip(prompts_ids, decoded, prefilled)):
        meta = a["meta_info"]
        out = [t[0] for t in meta.get("output_token_logprobs") or []]
        top = [[[e[0], e[1]] for e in (pos or [])] for pos in meta.get("output_top_logprobs") or []]
        inputs = [t[0] for t in p["meta_info"].get("input_token_logprobs") or []]
        tail = inputs[-len(out):] if out else []
        samples.append({"index": i, "prompt_tokens": len(ids), "output_ids": list(a.get("output_ids") or []),
                        "output_logprobs": out, "output_top": top, "reprefill_logprobs": tail})
    return {"samples": samples}


def needle_check(url: str, tokens: Tokens, spec: dict) -> dict:
    """Pass keys at several depths of haystacks up to the served context (``prompts.needle_plan``)."""
    plan = prompts.needle_plan(spec["seed"], spec["contexts"], spec["depths"], spec["variants"])
    progress = Progress("needles", sum(len(cell["needles"]) for cell in plan))
    filler = [tokens.encode(" " + s) for s in prompts.FILLER]
    cells = []
    for cell in plan:
        haystack = _haystack(tokens, filler, cell, spec["seed"])
        results = []
        for needle in cell["needles"]:
            ids = haystack + tokens.encode(prompts.needle_question(needle["label"]))
            answer = generate(url, {"input_ids": ids, "sampling_params": {
                "temperature": 0.0, "max_new_tokens": spec["max_new_tokens"]}})
            text = answer.get("text") or ""
            results.append({**needle, "answer": text[:200], "found": prompts.first_key(text) == needle["key"]})
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


def task_check(url: str, spec: dict, parallel: int) -> dict:
    """Few-shot items, temperature 0, SGLang's stop strings; the answer is the last integer."""
    with open(spec["path"], encoding="utf-8") as fh:
        items, problems = prompts.parse_tasks(fh.read(), spec["path"])
    if problems:
        raise EvalError("; ".join(problems))
    shots, questions = items[:spec["shots"]], items[spec["shots"]:][:spec["questions"]]
    prefix = prompts.few_shot_prefix(shots)
    progress = Progress("tasks", len(questions))

    def ask(pair):
        index, item = pair
        answer = generate(url, {"text": prompts.task_prompt(prefix, item["question"]), "sampling_params": {
            "temperature": 0.0, "max_new_tokens": spec["max_new_tokens"], "stop": prompts.FEW_SHOT_STOP}})
        progress.step()
        pred = prompts.answer_value(answer.get("text") or "")
        label = prompts.answer_value(item["answer"].split("####")[-1])
        return {"line": item["line"], "label": label, "pred": pred, "correct": pred is not None and pred == label,
                "output_tokens": (answer.get("meta_info") or {}).get("completion_tokens")}

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        results = list(pool.map(ask, list(enumerate(questions))))
    return {"items": results, "shots": len(shots)}


def fetch(url: str, sha256: str, out: str, timeout: float = 120.0) -> dict:
    """Download a tasks file and keep it only when its sha256 is the documented one."""
    import hashlib

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
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
    tokens = Tokens(spec["model_path"]) if ("logprob" in spec or "needles" in spec) else None
    for name, fn in (("logprob", lambda s: logprob_check(url, tokens, s, spec["parallel"])),
                     ("needles", lambda s: needle_check(url, tokens, s)),
                     ("tasks", lambda s: task_check(url, s, spec["parallel"])),
                     ("api", lambda s: api_prompts.run_api(url, s, _headers(), REQUEST_TIMEOUT_S, lambda done, total:
                                                           print(f"progress api {done} {total}", file=sys.stderr,
                                                                 flush=True)))):
        if name in spec:
            t0 = time.time()
            out["checks"][name] = fn(spec[name])
            out["timings_s"][name] = round(time.time() - t0, 3)
    out["timings_s"]["total"] = round(time.time() - started, 3)
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
