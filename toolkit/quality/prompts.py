"""The eval's prompts, made deterministically from a seed; no data set is needed but the tasks file.

Standard library only: this file is copied to the box next to ``box_eval.py``, which builds the
token ids with the model's own tokenizer. The same functions run here in the tests.

* Logprob prompts: ``filler_text(seed, index, sentences)``, plain prose.
* Needles (pass keys): ``needle_plan`` gives, per context length and variant, one haystack of
  filler prose with one needle per depth; each needle is asked for in its own short request
  after the haystack (the radix cache shares the haystack between them).
* Long answers: ``long_answer_prompt(seed, index)``, a request for a long essay (thousands of
  tokens), for the long generations.
* Tasks: GSM8K's JSONL (``question``, ``answer`` ending ``#### N``), few-shot as SGLang 0.5.23's
  ``few_shot_gsm8k`` formats it; the answer is the last integer in the output.
"""

from __future__ import annotations

import json
import random
import re
from typing import Optional

# Neutral filler prose (our own sentences). No digits: a number in the haystack could be taken
# for a pass key.
FILLER = (
    "The river bends twice before it reaches the old mill at the edge of the valley.",
    "Most of the houses in the village were built from grey stone and dark timber.",
    "In spring the orchards fill with blossom and the bees work from dawn to dusk.",
    "A narrow road climbs the hill, passing a chapel, a well and a row of cottages.",
    "The market opens early, and by noon the square is quiet again.",
    "Fishermen mend their nets on the quay while gulls circle over the harbour.",
    "The library keeps maps of the coast drawn by hand over many generations.",
    "Autumn brings fog in the mornings and clear, cold evenings.",
    "Children walk to the school along the canal, counting the boats they pass.",
    "The baker lights the oven before sunrise and sells out of bread by midday.",
    "On the far side of the lake a forest of pine and birch stretches to the mountains.",
    "Travellers often stop at the inn to rest their horses and share the news.",
    "The clock in the tower has kept time for the town through wars and floods.",
    "Farmers bring wool, cheese and honey to the autumn fair.",
    "A wooden bridge crosses the stream where the water runs fast over the rocks.",
    "In winter the pond freezes and the whole village comes out to skate.",
    "The lighthouse keeper writes the weather in a notebook every evening.",
    "Wild flowers grow along the walls of the abandoned monastery.",
    "The train stops at the station only twice a day, once in each direction.",
    "Merchants from the south bring spices, cloth and stories of distant cities.",
)

_COLOURS = ("amber", "blue", "copper", "silver", "green", "iron", "golden", "crimson", "violet", "white", "black",
            "scarlet")
_THINGS = ("gate", "harbour", "bell", "orchard", "lantern", "bridge", "mill", "tower", "garden", "chapel", "anchor",
           "door")
#: 144 labels: enough for one needle every ``spacing`` tokens of the longest haystack.
NEEDLE_LABELS = tuple(f"{c} {t}" for c in _COLOURS for t in _THINGS)
KEY_DIGITS = 7
#: Tokens kept free at the end of a needle prompt for the question and the answer.
QUESTION_RESERVE = 64

FEW_SHOT_STOP = ["Question", "Assistant:", "<|separator|>"]
#: The DSA indexer's logits are read only once a row has more than 512 compressed (c4) positions,
#: i.e. more than 2,048 tokens (docs/sglang-contract.md §2.6).
INDEXER_THRESHOLD_TOKENS = 2048

LONG_ANSWER_TOPICS = (
    "how a river shapes the valley it runs through, from its source to the sea",
    "the history of lighthouses and the people who kept them",
    "how a small town prepares for winter, season by season",
    "the craft of building a wooden boat by hand",
)
INVALID = None


def filler_text(seed: int, index: int, sentences: int) -> str:
    """``sentences`` filler sentences, the same for the same (seed, index)."""
    rng = random.Random(f"filler:{seed}:{index}")
    return " ".join(rng.choice(FILLER) for _ in range(sentences))


def long_answer_prompt(seed: int, index: int) -> str:
    """A plain-completion request for a long answer (thousands of tokens), the same for the same (seed, index)."""
    topic = LONG_ANSWER_TOPICS[random.Random(f"long:{seed}:{index}").randrange(len(LONG_ANSWER_TOPICS))]
    return (f"\n\nQuestion: Write a long, detailed essay of at least three thousand words about {topic}. "
            f"Use many sections and explain every step.\nAnswer:")


def needle_sentence(label: str, key: str) -> str:
    return f" The pass key of the {label} is {key}. Remember it, the pass key of the {label} is {key}."


def needle_question(label: str) -> str:
    return f"\n\nWhat is the pass key of the {label}? The pass key of the {label} is"


def needle_depths(context: int, depths: list[float], spacing: Optional[int]) -> list[float]:
    """``depths``, and with ``spacing`` also an even grid so that no two neighbouring needles (nor
    an end of the haystack and its nearest needle) are more than ``spacing`` tokens apart: a lost
    page range that long always holds a needle."""
    if not spacing:
        return list(depths)
    n = min(len(NEEDLE_LABELS), max(1, -(-context // spacing)))
    return sorted(set(depths) | {(i + 0.5) / n for i in range(n)})


def needle_plan(seed: int, contexts: list[int], depths: list[float], variants: int,
                spacing: Optional[int] = None) -> list[dict]:
    """One haystack per (context, variant): ``{"context", "variant", "needles": [{"label", "key",
    "depth"}]}`` with one needle per depth (fractions of the haystack, 0 = start; ``needle_depths``)."""
    plan = []
    for context in contexts:
        at = needle_depths(context, depths, spacing)
        for variant in range(variants):
            rng = random.Random(f"needles:{seed}:{context}:{variant}")
            labels = rng.sample(NEEDLE_LABELS, len(at))
            needles = [{"label": label, "key": str(rng.randrange(10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS)),
                        "depth": depth} for label, depth in zip(labels, at)]
            plan.append({"context": context, "variant": variant, "needles": needles})
    return plan


def first_key(text: str) -> Optional[str]:
    """The first run of digits in an answer (thousands separators and spaces inside it removed)."""
    match = re.search(r"\d[\d, ]*", text or "")
    return re.sub(r"[, ]", "", match.group(0)) if match else None


def few_shot_prefix(shots: list[dict]) -> str:
    return "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)


def task_prompt(prefix: str, question: str) -> str:
    return f"{prefix}Question: {question}\nAnswer:"


def answer_value(text: str) -> Optional[int]:
    """The last integer in ``text`` (commas removed), as SGLang's few_shot_gsm8k reads answers."""
    numbers = re.findall(r"-?\d+", (text or "").replace(",", ""))
    return int(numbers[-1]) if numbers else INVALID


def parse_tasks(text: str, where: str) -> tuple[list[dict], list[str]]:
    """GSM8K's JSONL: one ``{"question": str, "answer": str ending "#### N"}`` object a line.
    Returns (items, problems); each problem names its line (blank lines are skipped)."""
    items, problems = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            problems.append(f"{where}:{number}: not JSON ({exc})")
            continue
        if not isinstance(item, dict) or not isinstance(item.get("question"), str) or \
                not isinstance(item.get("answer"), str):
            problems.append(f"{where}:{number}: needs string fields \"question\" and \"answer\"")
        elif "####" not in item["answer"] or answer_value(item["answer"].split("####")[-1]) is None:
            problems.append(f"{where}:{number}: the answer does not end in \"#### <integer>\" (GSM8K's format)")
        else:
            items.append({"question": item["question"], "answer": item["answer"], "line": number})
        if len(problems) >= 5:
            break
    return items, problems
