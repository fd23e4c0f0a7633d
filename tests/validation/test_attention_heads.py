"""The heads the verdict and the attention benchmarks time are the ones SGLang 0.5.23 hands the
sparse-MLA call on one GPU of the inventory's decode server (docs/sglang-contract.md §4.2)."""

import ast
import re

import pytest

from dsv4kit.validation import attention_heads as ah
from dsv4kit.validation import verdict_run
from tests import sglang_wheel


def test_decode_tp_gives_the_heads_and_the_backend_the_padding():
    assert ah.kernel_heads(4, 16) == (16, 16)  # the inventory's TP4 decode, FlashInfer: unpadded
    assert ah.kernel_heads(4, 64, "triton") == (16, 64) and ah.kernel_heads(4, 1, "torch") == (16, 64)
    assert ah.kernel_heads(2, 64) == (32, 32) and ah.kernel_heads(8, 1) == (8, 8)
    assert ah.kernel_heads(1, 64, "triton") == (64, 64)  # attention-TP 1: never padded
    assert ah.kernel_heads(4, 65, "triton") == (16, 16)  # over the decode limit: the real count
    with pytest.raises(ValueError, match="does not divide"):
        ah.kernel_heads(3, 1)


def test_the_verdict_times_attention_at_the_decode_servers_heads():
    shapes = verdict_run.decode_shapes("attention", 131072, (1, 64))
    assert {(s.params["heads"], s.params["padded_heads"]) for s in shapes} == {(16, 16)}
    assert all(s.label.endswith(" H=16") for s in shapes)
    padded = verdict_run.decode_shapes("attention", 131072, (16,), decode_tp=4, backend="triton")
    assert [s.label for s in padded] == ["c4 T=16 ctx=131072 H=16of64", "c128 T=16 ctx=131072 H=16of64"]


def test_the_rules_are_sglang_0_5_23s_own():
    """What attention_heads encodes, read from the 0.5.23 wheel's source."""
    site = sglang_wheel.sglang_site() / "sglang"
    model = (site / "srt/models/deepseek_v4.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(model)) if isinstance(n, ast.FunctionDef) and n.name == "_kernel_num_heads")
    body = ast.unparse(fn)
    assert "if self.attn_tp_size == 1:\n        return self.n_local_heads" in body
    assert "if num_tokens > SM120_DECODE_MAX_TOKENS:\n            return self.n_local_heads" in body
    assert "SGLANG_SM120_FLASHMLA_BACKEND.get() == 'flashinfer'" in body
    assert "flashinfer_dsv4_decode_supports_num_heads(self.n_local_heads, num_tokens)" in body
    assert body.rstrip().endswith("return 64 if self.n_local_heads <= 64 else self.n_heads")
    assert "self.n_local_heads = self.n_heads // self.attn_tp_size" in model
    fm = (site / "kernels/ops/attention/flash_mla_sm120.py").read_text()
    assert re.search(r"^SM120_DECODE_MAX_TOKENS = (\d+)$", fm, re.M).group(1) == str(ah.DECODE_MAX_TOKENS)
    assert "return num_tokens <= decode_max_tokens and num_heads in supported_heads" in fm
    environ = (site / "srt/environ.py").read_text()
    assert re.search(r'SGLANG_SM120_FLASHMLA_BACKEND = \w+\("flashinfer"', environ)
    pin = next(line for line in (sglang_wheel.sglang_site().glob("sglang-*.dist-info/METADATA")).__next__()
               .read_text().splitlines() if line.startswith("Requires-Dist: flashinfer_python"))
    assert "==0.7.2" in pin  # the FlashInfer whose dedicated DSV4 decode heads FLASHINFER_DSV4_DECODE_HEADS copies
