"""What the eval asks beyond the short set: the lengths, batch mix and sampling the box serves.

``shape_spec`` adds to ``box_eval.py``'s spec the checks that reach the kernels the gate decides
(docs/quality.md, *What the defaults ask*): long-prefix samples and long generations past the
indexer's threshold (``long``), tasks after a long context (``tasks_long``), sampled tasks
(``tasks_sampled``) and short requests beside long prefills at the serving concurrency
(``batch``). Pure: no box, no I/O.
"""

from __future__ import annotations

from typing import Optional

from dsv4kit.quality.prompts import INDEXER_THRESHOLD_TOKENS

TOP_K = 5
#: DeepSeek's recommended sampling for its recent chat models (the model cards' temperature and top-p).
DEEPSEEK_SAMPLING = {"temperature": 1.0, "top_p": 0.95}
#: Room the long answer request and the margin take after a haystack prefix.
_ASK_ROOM = 256


def _cells(needles: dict, room: int, threshold: int) -> list[dict]:
    """The needle haystacks (context, variant) whose prefix, ``room`` tokens shorter, still passes ``threshold``."""
    return [{"context": c, "variant": v, "depths": list(needles["depths"])}
            for c in needles["contexts"] for v in range(needles["variants"]) if c - room > threshold]


def shape_spec(ctx: int, quick: bool, seed: int, tasks_path: Optional[str], questions: Optional[int],
               needles: dict, threshold: int = INDEXER_THRESHOLD_TOKENS) -> dict:
    """The spec keys for the long, batch-mix and sampled checks, beside the short set's."""
    prefix_new = 32 if quick else 128
    prefixes = [{**cell, "max_new_tokens": prefix_new} for cell in _cells(needles, prefix_new + 8, threshold)]
    generations: list[dict] = [{"max_new_tokens": 512 if quick else 4096}]
    if not quick:
        generations.append({"max_new_tokens": 4096})
    after_new = 256 if quick else 2048
    longest = max(needles["contexts"])
    if longest - after_new - _ASK_ROOM > threshold:  # a long answer after the longest haystack
        generations.append({"max_new_tokens": after_new,
                            "prefix": {"context": longest, "variant": 0, "depths": list(needles["depths"])}})
    spec = {
        "threshold_tokens": threshold, "top_k": TOP_K,
        "long": {"prefixes": prefixes, "generations": generations, "top_k": TOP_K, "seed": seed,
                 "threshold_tokens": threshold},
        "batch": {"samples": 8 if quick else 16, "prompt_tokens": 256, "max_new_tokens": 48 if quick else 96,
                  "long_prefills": 1 if quick else 2, "long_context": min(ctx, 32768) if quick else ctx,
                  "top_k": TOP_K, "seed": seed},
    }
    if longest - 512 > threshold:  # some rows after the longest haystack: past the threshold in the mix
        spec["batch"].update(long_rows=4 if quick else 6,
                             prefix={"context": longest, "variant": 0, "depths": list(needles["depths"])})
    if tasks_path is not None:
        asked = min(questions or 200, 20 if quick else 100)
        max_new = 256 if quick else 512
        base = {"path": tasks_path, "shots": 5, "questions": asked, "max_new_tokens": max_new, "seed": seed}
        spec["tasks_sampled"] = {**base, "sampling": {**DEEPSEEK_SAMPLING, "sampling_seed": seed * 100_000}}
        if longest - max_new - 2048 > threshold:  # 5 shots and the question take about 1K tokens
            spec["tasks_long"] = {**base, "prefix": {"context": longest, "variant": 0,
                                                     "depths": list(needles["depths"])}}
    return spec
