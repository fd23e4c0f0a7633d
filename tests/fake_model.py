"""A small deterministic "model" for the stand-in SGLang server (tests only): it reads its prompt.

It answers non-streaming ``/generate`` as SGLang 0.5.23 does, with the logprob fields of
``srt/managers/tokenizer_manager.py`` (``add_logprob_to_meta_info``): ``input_token_logprobs`` and
``output_token_logprobs`` as ``[logprob, token_id, null]`` triples (the first input position's
logprob is null: ``[None] + ...`` in ``logprob_result_processor.py``), ``input_top_logprobs`` /
``output_top_logprobs`` per position when ``top_logprobs_num > 0``, and NaN written as null
(SGLang's responses go through orjson, which writes NaN as null). Its tokenizer is the model
directory's ``tokenizer.json`` (tests/bench_support.make_tokenizer).

What it knows, from the prompt text alone:
* a pass-key question (``What is the pass key of the <label>?``) is answered with the key the
  prompt states for that label, if it can see it;
* a few-shot question ``What is A plus|minus|times B?`` is answered ``A op B is R. #### R``;
* anything else continues with tokens chosen by a hash of the last three ids.
Every position's distribution is a pure function of the prefix, so decoding and re-prefilling the
same tokens give the same logprobs (plus a 1e-4 jitter on decode, as two kernels would).

Faults (``POST /_test/config {"model": {...}}``), each what a broken kernel path does:
* ``blind_after_tokens: N``: tokens at or beyond N of the prompt are unseen (the question at the
  end stays seen), so needles deeper than N are lost;
* ``kl_drift: D``: decode logprobs of the greedy token are D lower than prefill's (greedy text unchanged);
  with ``drift_past_tokens: N`` only at positions past N (a kernel read only past the indexer's threshold);
* ``bend_topk: D``: decode's ranks 2..k are D nats higher than prefill's (the argmax and its logprob kept);
* ``flip_questions: [substring, ...]``: those task questions get a wrong answer;
* ``flip_past_tokens: N``: every task question asked after more than N prompt tokens is answered wrong;
* ``degenerate_after: N``: after N generated tokens the output loops over its last 8 tokens;
* ``wrong_beside_long: true``: a request that starts while an uncached long prompt is being
  prefilled gets the runner-up token at every position (and a wrong task answer);
* ``sampled_wrong: true``: task answers at temperature > 0 are wrong (greedy ones right);
* ``null_logprob_past: N``: requests with more than N prompt tokens get null output logprobs;
* ``nan_once: true``: the next decode with logprobs has NaN (null) logprobs;
* ``no_logprobs: true``: logprob requests are answered without the logprob fields.

Prefill time: a prompt longer than 1,024 tokens whose first 1,024 ids were not seen since the last
fault change (a unit restart) or ``/flush_cache`` (``forget_cache``) sleeps ``prefill_us_per_token``
(default 50, at most 1 s), the radix cache's effect on a real server; while it sleeps it counts as
a long prefill in flight. A flushed cache is cold: the bench's points, each after a flush, all pay
their prompts' prefill, as they do on a real server (and as its ``cached_tokens`` of 0 says).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from pathlib import Path

TOP_K = 5
#: A position's top-1 probability lies in [0.45, 0.95] (a hash of the prefix picks it); the other
#: four take these shares of what is left, so the top-5 is a distribution (sums below 1, descending).
REST_SHARES = (0.5, 0.25, 0.12, 0.06)
ANSWER_PROB = 0.98
OTHER_LOGPROB = -9.0
_OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}


PREFILL_US_PER_TOKEN = 50.0
PREFILL_CAP_S = 1.0
CACHED_PREFIX = 1024


class StandInModel:
    def __init__(self, model_path: str):
        self.model_path = model_path
        self._faults: dict = {}
        self.lock = threading.Lock()
        self._tok = None
        self.seen: set = set()  # the first CACHED_PREFIX ids of prompts prefilled since the last restart
        self.prefilling = 0  # uncached long prompts in flight
        self.cold_prefills = 0  # uncached long prompts prefilled, ever (GET /_test/stats)

    @property
    def faults(self) -> dict:
        return self._faults

    @faults.setter
    def faults(self, value: dict) -> None:  # a fault change is a unit restart: the cache is empty
        with self.lock:
            self._faults = value
            self.seen = set()

    def forget_cache(self) -> None:
        """``/flush_cache``: the prefix cache is empty, so every long prompt prefills again."""
        with self.lock:
            self.seen = set()

    # ---------------------------------------------------------------- the tokenizer
    @property
    def tok(self):
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(str(Path(self.model_path) / "tokenizer.json"))
            vocab = self._tok.get_vocab()
            self.words = sorted(i for t, i in vocab.items() if re.fullmatch(r" [a-z]+", t))
        return self._tok

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def available(self) -> bool:
        """A model directory with a tokenizer (bench tests' directories have one; others may not)."""
        return (Path(self.model_path) / "tokenizer.json").is_file()

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    # ---------------------------------------------------------------- the distribution
    def candidates(self, prefix, position: int) -> list[int]:
        """The ranked candidates for the token at ``position`` after ``prefix`` (its last three ids
        and its length decide: free text never falls into a short loop)."""
        digest = hashlib.sha256(json.dumps([position] + list(prefix[-3:])).encode()).digest()
        words = self.words
        out: list[int] = []
        for i in range(len(digest)):
            token = words[int.from_bytes(digest[i:i + 2], "big") % len(words)]
            if token not in out:
                out.append(token)
            if len(out) == TOP_K:
                break
        return out

    def top(self, prefix, position: int, forced=None) -> list[tuple[float, int]]:
        """The top-5 ``(logprob, id)`` of the token at ``position`` after ``prefix``; ``forced`` (an
        answer token) ranks first."""
        cands = self.candidates(prefix, position)
        if forced is None:
            first = 0.45 + 0.5 * hashlib.sha256(b"p" + json.dumps(list(prefix[-3:])).encode()).digest()[0] / 255
        else:
            first, cands = ANSWER_PROB, [forced] + [c for c in cands if c != forced][:TOP_K - 1]
        probs = [first] + [(1.0 - first) * share for share in REST_SHARES]
        return [(math.log(p), t) for p, t in zip(probs, cands)]

    def logprob(self, prefix, position: int, token) -> float:
        return dict((t, lp) for lp, t in self.top(prefix, position)).get(token, OTHER_LOGPROB)

    # ---------------------------------------------------------------- reading the prompt
    def answer(self, ids, wrong: bool = False) -> str | None:
        faults = self.faults
        visible = ids
        blind = faults.get("blind_after_tokens")
        if blind:
            visible = list(ids[:blind]) + list(ids[-48:])
        text = self.decode(visible)
        tail = self.decode(ids[-48:])
        needle = re.search(r"What is the pass key of the ([a-z ]+)\?", tail)
        if needle:
            label = needle.group(1)
            found = re.findall(rf"pass key of the {re.escape(label)} is (\d+)\.", text)
            return f" {found[0]}." if found else " unknown."
        question = re.findall(r"Question: (What is (\d+) (plus|minus|times) (\d+)\?)\nAnswer:$", text)
        if question:
            q, a, op, b = question[-1]
            result = _OPS[op](int(a), int(b))
            if wrong or any(s in q for s in faults.get("flip_questions") or []):
                result += 1
            return f" {a} {op} {b} is {result}. #### {result}"
        return None

    # ---------------------------------------------------------------- /generate
    def _prefill(self, ids, faults: dict) -> bool:
        """Sleep the prefill time of an uncached long prompt; True when another long prompt was
        being prefilled as this request started."""
        with self.lock:
            beside = self.prefilling > 0
            key = hash(tuple(ids[:CACHED_PREFIX]))
            uncached = len(ids) > CACHED_PREFIX and key not in self.seen
            self.seen.add(key)
            if uncached:
                self.prefilling += 1
                self.cold_prefills += 1
        if uncached:
            try:
                rate = float(faults.get("prefill_us_per_token", PREFILL_US_PER_TOKEN))
                time.sleep(min(PREFILL_CAP_S, rate * len(ids) / 1e6))
            finally:
                with self.lock:
                    self.prefilling -= 1
        return beside

    def generate(self, body: dict, index: int) -> dict:
        with self.lock:
            faults = dict(self.faults)
            nan = bool(faults.get("nan_once")) and bool(body.get("return_logprob"))
            if nan:
                self.faults["nan_once"] = False
        ids = list(body["input_ids"]) if "input_ids" in body else self.encode(str(body.get("text", "")))
        params = body.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 128))
        beside = self._prefill(ids, faults) and bool(faults.get("wrong_beside_long"))
        past = faults.get("flip_past_tokens")
        wrong = beside or (bool(faults.get("sampled_wrong")) and float(params.get("temperature", 1.0)) > 0) or \
            (past is not None and len(ids) > past)
        text_answer = self.answer(ids, wrong) if max_new else None
        forced = self.encode(text_answer) if text_answer else None
        loop = faults.get("degenerate_after")
        out, tops = [], []
        for j in range(max_new if forced is None else min(max_new, len(forced))):
            top = self.top((ids + out)[-3:], len(ids) + j, forced[j] if forced else None)
            if beside and forced is None:  # the runner-up wins: a different, still fluent text
                top = [(top[0][0], top[1][1]), (top[1][0], top[0][1])] + top[2:]
            if loop is not None and j >= max(loop, 8):
                repeat = out[j - 8]
                top = [(math.log(ANSWER_PROB), repeat)] + [e for e in top if e[1] != repeat][:TOP_K - 1]
            out.append(top[0][1])
            tops.append(top)
        meta = {"id": f"req-{index}", "prompt_tokens": len(ids), "completion_tokens": len(out),
                "cached_tokens": 0, "weight_version": "default",
                "finish_reason": {"type": "stop", "matched": None} if forced is not None and len(out) == len(forced)
                else {"type": "length", "length": max_new}}
        if body.get("return_logprob") and not faults.get("no_logprobs"):
            null_past = faults.get("null_logprob_past")
            self._logprobs(meta, ids, out, tops, body, faults, nan or (null_past is not None and len(ids) > null_past))
        return {"text": self.decode(out), "output_ids": out, "meta_info": meta}

    def _logprobs(self, meta: dict, ids, out, tops, body: dict, faults: dict, nan: bool) -> None:
        top_n = int(body.get("top_logprobs_num") or 0)
        start = body.get("logprob_start_len", -1)
        start = -1 if start is None else int(start)
        drift = float(faults.get("kl_drift") or 0.0)
        drift_from = faults.get("drift_past_tokens")
        bend = float(faults.get("bend_topk") or 0.0)
        jitter = [1e-4 * ((t % 3) - 1) for t in out]
        output = []
        for j, token in enumerate(out):
            shift = drift if drift_from is None or len(ids) + j > drift_from else 0.0
            value = tops[j][0][0] - shift + jitter[j]
            output.append([None if nan else value, token, None])
        if bend:
            tops = [top[:1] + [(lp + bend, t) for lp, t in top[1:]] for top in tops]
        meta["output_token_logprobs"] = output
        meta["output_token_logprobs_length"] = len(output)
        if start >= 0:
            meta["input_token_logprobs"] = [[None, ids[start], None]] + [
                [self.logprob(ids[max(0, p - 3):p], p, ids[p]), ids[p], None] for p in range(start + 1, len(ids))]
        if top_n > 0:
            meta["output_top_logprobs"] = [[[None if nan else lp, t, None] for lp, t in top[:top_n]] for top in tops]
            if start >= 0:
                meta["input_top_logprobs"] = [None] + [[[lp, t, None] for lp, t in self.top(ids[max(0, p - 3):p], p)[:top_n]]
                                                      for p in range(start + 1, len(ids))]
