"""The fp8-q accuracy check (validation/attention_fp8_q.py) on a tiny case: CPU, float32 maths."""

import torch

from dsv4kit.validation import attention_fp8_q as fp8q


def test_quantise_q_touches_only_the_nope_dims():
    q = torch.randn(2, 1, 4, 512).to(torch.bfloat16)
    for mode in fp8q.MODES:
        out = fp8q.quantise_q(q, mode)
        assert torch.equal(out[..., 448:], q.float()[..., 448:])
        err = (out[..., :448] - q.float()[..., :448]).abs().max()
        assert 0 < err < (0.01 if mode == "hi_lo" else 0.5)


def test_run_and_render_a_small_case():
    result = fp8q.run(cases=[("c4", 2, 300, 64)], heads=16)
    assert [r["mode"] for r in result["rows"]] == list(fp8q.MODES)
    text = fp8q.table(result)
    assert "| c4 | 2 | 300 | hi_lo |" in text
