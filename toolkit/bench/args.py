"""``dsv4kit bench`` length options checked in the user's own terms, before defaults are derived.

The sweep's own check (``dsv4kit.bench.sweep.check_config``) sees the derived lengths; a message from
there about ``--input-len -1024`` would name a value the user never gave (``--ctx 0``).
"""

from __future__ import annotations

import math
from typing import Optional

from dsv4kit.core import exitcodes
from dsv4kit.core.exitcodes import Abort

DEFAULT_OUTPUT_LEN = 512
#: The default prompt length is --ctx minus max(PROMPT_ROOM, output length).
PROMPT_ROOM = 1024


def check_lengths(ctx: int, input_len: Optional[int], output_len: Optional[int]) -> None:
    """Abort(USAGE) naming only the options the user gave (and defaults by name)."""
    if ctx < 2:
        raise Abort(exitcodes.USAGE, f"--ctx must be a context length of at least 2 tokens, got {ctx}")
    if input_len is not None and input_len < 1:
        raise Abort(exitcodes.USAGE, f"--input-len must be at least 1 token, got {input_len}")
    if output_len is not None and output_len < 2:
        raise Abort(exitcodes.USAGE, f"--output-len must be at least 2 tokens (TPOT needs two), got {output_len}")
    if input_len is None:
        room = max(PROMPT_ROOM, output_len if output_len is not None else DEFAULT_OUTPUT_LEN)
        if ctx - room < 1:
            rule = f"max({PROMPT_ROOM}, --output-len)" if output_len is not None else str(PROMPT_ROOM)
            raise Abort(exitcodes.USAGE,
                        f"--ctx {ctx} leaves no room for a prompt: without --input-len the prompt is --ctx minus "
                        f"{rule} tokens; give a larger --ctx or an explicit --input-len")
    elif output_len is None and input_len + DEFAULT_OUTPUT_LEN > ctx:
        raise Abort(exitcodes.USAGE,
                    f"--input-len {input_len} plus the default output length ({DEFAULT_OUTPUT_LEN} tokens; "
                    f"--output-len sets it) exceeds --ctx {ctx}: give a smaller --input-len or an --output-len")


def check_prompts(num_prompts: Optional[int], concurrency: str, ratio: float, *, ratio_given: bool) -> None:
    """Abort(USAGE) when --num-prompts cannot reach the concurrency gate at some --concurrency point;
    the gate's ratio is named as the default when the user did not give --min-concurrency-ratio."""
    if num_prompts is None:
        return
    try:
        points = [int(part) for part in concurrency.split(",") if part.strip()]
    except ValueError:
        return  # the sweep's own check names a malformed --concurrency
    short = [c for c in points if num_prompts < ratio * c]
    if not short:
        return
    gate = (f"--min-concurrency-ratio {ratio:g}" if ratio_given
            else f"the concurrency gate's default ratio {ratio:g} (--min-concurrency-ratio sets it)")
    raise Abort(exitcodes.USAGE,
                f"--num-prompts {num_prompts} is too few for --concurrency {', '.join(map(str, short))}: at most "
                f"{num_prompts} requests can be in flight, below {gate} x C, so every such point would fail "
                f"the concurrency gate; give at least {math.ceil(ratio * max(short))} prompts, or leave "
                f"--num-prompts out")
