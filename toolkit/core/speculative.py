"""The inventory's model and speculative-decoding choice, checked as SGLang 0.5.23 checks it.

The serving units (sglang_service) pass the same setting to the prefill and the decode server:
``off``; ``EAGLE`` (``--speculative-num-steps N --speculative-eagle-topk 1
--speculative-num-draft-tokens N+1``: the checkpoint's MTP layer drafts); ``DSPARK``
(``--speculative-dspark-block-size G --speculative-draft-model-path <model>`` for a drafter bundled
in the checkpoint, ``<model>/<drafter>`` for one in a folder). What SGLang's argument pipeline
would refuse for DeepSeek-V4 on sm_120 is refused here, before connecting, with SGLang's own
reason; tests/provision/test_speculative_units.py runs every combination through that pipeline and
checks the two agree. Two rules are dsv4kit's own, for settings SGLang accepts that draft nothing:
EAGLE with 0 draft steps, and EAGLE on a checkpoint that bundles a DSpark drafter (its ``mtp.*``
weights are the DSpark stages, not an MTP layer). Standard library only.
"""

from __future__ import annotations

from typing import Any, Optional

ALGORITHMS = ("off", "EAGLE", "DSPARK")
BUNDLED = "bundled"  # dsv4_models' drafter: the checkpoint holds it (config.json's dspark_* keys)

# SGLang 0.5.23's reasons, as its argument pipeline words them (arg_groups/deepseek_v4_hook.py,
# arg_groups/speculative_hook.py).
SGLANG_ONLY_EAGLE_DSPARK = "Only EAGLE and DSPARK speculative algorithms are supported for DeepseekV4ForCausalLM"
SGLANG_DSPARK_NEEDS_DRAFT = "DSpark dense speculative decoding requires setting --speculative-draft-model-path."
SGLANG_DSPARK_BLOCK_POSITIVE = "DSpark requires --speculative-dspark-block-size to be positive"


def verify_tokens(values: dict) -> int:
    """Tokens one request puts into a verify step (draft tokens + 1); 1 with speculation off."""
    algorithm = values.get("dsv4_speculative", "off")
    if algorithm == "EAGLE":
        return int(values.get("dsv4_speculative_num_steps", 3)) + 1
    if algorithm == "DSPARK":
        return int(values.get("dsv4_speculative_dspark_block_size", 3)) + 1
    return 1


def problem(values: dict) -> Optional[tuple[str, str]]:
    """(field, message) for the first choice SGLang 0.5.23 would refuse; None when all is servable."""
    models, model = values.get("dsv4_models"), values.get("dsv4_model")
    if isinstance(models, dict) and model is not None:
        if model not in models:
            return "dsv4_model", (f"dsv4_model {model!r} is not one of dsv4_models: "
                                  f"{', '.join(sorted(map(str, models)))}")
        entry = models[model]
        missing = [key for key in ("repo", "revision", "drafter") if not isinstance(entry, dict) or key not in entry]
        if missing:
            return "dsv4_models", f"dsv4_models[{model!r}] lacks {', '.join(missing)} (repo, revision, drafter)"
    algorithm = values.get("dsv4_speculative", "off")
    if algorithm not in ALGORITHMS:
        return "dsv4_speculative", (f"dsv4_speculative must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}. "
                                    f"SGLang 0.5.23: {SGLANG_ONLY_EAGLE_DSPARK}")
    if algorithm == "EAGLE":
        # dsv4kit's own rules: SGLang accepts these, and they draft nothing (acceptance 1.0 always).
        if values.get("dsv4_model_drafter") == BUNDLED:
            return "dsv4_speculative", (
                f"dsv4_speculative is EAGLE but dsv4_model {model!r} bundles a DSpark drafter: its checkpoint's "
                f"mtp.* weights are the DSpark stages, not an MTP layer, so EAGLE loads and accepts no draft: "
                f"use DSPARK, or off")
        return _positive(values, "dsv4_speculative_num_steps", "EAGLE draft steps")
    if algorithm == "DSPARK":
        found = _positive(values, "dsv4_speculative_dspark_block_size", "the DSpark draft block (gamma)")
        if found and values.get("dsv4_speculative_dspark_block_size") is not None:
            return found[0], f"{found[1]}. SGLang 0.5.23: {SGLANG_DSPARK_BLOCK_POSITIVE}"
        if found:
            return found
        if not values.get("dsv4_model_drafter"):
            return "dsv4_speculative", (
                f"dsv4_speculative is DSPARK but dsv4_model {model!r} ships no DSpark drafter "
                f"(its drafter is ''): choose a model with one (DeepSeek-V4-Flash-0731), or EAGLE or off. "
                f"SGLang 0.5.23: {SGLANG_DSPARK_NEEDS_DRAFT}")
    least = values.get("dsv4_speculative_min_acceptance")
    if isinstance(least, (int, float)) and not isinstance(least, bool) and least < 1:
        return "dsv4_speculative_min_acceptance", (
            f"dsv4_speculative_min_acceptance must be >= 1 (tokens per verify step), got {least!r}")
    return None


def _positive(values: dict, name: str, what: str) -> Optional[tuple[str, str]]:
    value: Any = values.get(name)
    if value is None:
        return name, f"{name} is not set ({what}, a whole number >= 1)"
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return name, f"{name} ({what}) must be a whole number >= 1, got {value!r}"
    return None
