"""The indexer suite through the harness: case parsing, defaults, and `dsv4kit validate --local`
end to end through the Triton interpreter (CPU profile)."""

import json
import os
import subprocess
import sys

import pytest

from dsv4kit.core import exitcodes
from dsv4kit.validation import harness, indexer_suite

ORIGINAL_FIVE = ["1x8x512", "16x32x2048", "32x16x1024", "4x64x4096", "8x4x256"]


def test_gpu_defaults_hold_the_original_five_b64_and_edges():
    cases = [indexer_suite.parse_case(s) for s in indexer_suite.default_cases("gpu")]
    specs = indexer_suite.default_cases("gpu")
    assert specs[:5] == ORIGINAL_FIVE
    assert all(c.heads == 64 for c in cases)
    assert any(c.batch == 64 for c in cases)
    assert any(c.pages == 1 for c in cases)  # one-page rows: lengths 0 and exactly 64
    assert any(c.pages * 64 == 262208 for c in cases)  # the 1M-context table width


def test_cpu_defaults_are_small():
    for spec in indexer_suite.default_cases("cpu"):
        case = indexer_suite.parse_case(spec)
        assert case.batch * case.pages <= 512


def test_parse_case_and_label():
    case = indexer_suite.parse_case("16x32x2048")
    assert (case.batch, case.pages, case.max_len, case.heads) == (16, 32, 2048, 64)
    assert case.label == "B=16 H=64 pages=32 seqlen<=2048"
    assert indexer_suite.parse_case("4x2x100x32").heads == 32


@pytest.mark.parametrize("spec,message", [
    ("16x32", "must be BxPxN"), ("axbxc", "must be BxPxN"), ("0x4x10", "B and P must be >= 1"),
    ("2x2x200", "exceeds P*64=128"), ("2x2x100x48", "H must be 16, 32, 64 or 128"),
])
def test_parse_case_rejects_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        indexer_suite.parse_case(spec)


def test_bad_case_spec_is_a_usage_error_before_anything_runs(capsys):
    code = harness.run_cli("indexer:16x32", None, True)
    assert code == exitcodes.USAGE
    assert "must be BxPxN" in capsys.readouterr().err


def test_validate_local_runs_the_indexer_suite_end_to_end(tmp_path):
    report = tmp_path / "validation.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-m", "dsv4kit.cli", "validate", "--local", "--interpret",
         "--cases", "indexer:3x1x64,indexer:12x5x300,indexer:16x8x512", "-o", str(report)],
        capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    kernel_lines = [l for l in lines if l.startswith("indexer") and " kernel " in l]
    assert len(kernel_lines) == 3
    assert "B=12 H=64 pages=5 seqlen<=300" in kernel_lines[1]
    assert all("max|d|=" in l and "rel=" in l and "pattern=match" in l and "PASS" in l
               for l in kernel_lines)
    assert any(l.startswith("WORST indexer:") for l in lines)
    assert "VERDICT: PASS" in out.stdout

    payload = json.loads(report.read_text())
    assert payload["passed"] and payload["environment"]["interpret"]
    rows = payload["suites"]["indexer"]["rows"]
    impls = [r["impl"] for r in rows]
    assert impls.count("kernel") == 3 and impls.count("fallback") == 3
    for row in rows:
        if row["impl"] == "kernel":
            assert row["bar"] == indexer_suite.KERNEL_REL_BAR and row["rel"] <= row["bar"]
        if row["impl"] == "fallback":
            assert row["bar"] is None and row["pattern_ok"]


SGLANG_ROW_SCRIPT = r"""
import json, os
os.environ["TRITON_INTERPRET"] = "1"
from dsv4kit.validation import indexer_suite
from dsv4kit.validation.rows import RunOptions
rows = list(indexer_suite.run(["3x1x64", "12x5x300"], RunOptions(device="cpu", interpret=True)))
print(json.dumps([[r.impl, r.passed, r.bar, r.note, r.rel, r.pattern_ok] for r in rows]))
"""


def test_sglang_implementations_get_their_own_rows_from_the_real_wheel():
    from tests import sglang_wheel

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["DSV4KIT_SGLANG_SOURCE"] = str(sglang_wheel.sglang_site())
    out = subprocess.run([sys.executable, "-c", SGLANG_ROW_SCRIPT], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    torch_rows = [r for r in rows if r[0] == "sglang-torch"]
    assert len(torch_rows) == 2 and all(r[1] and r[2] is None and r[5] for r in torch_rows)
    assert all("SGLang 0.5.23, wheel" in r[3] and 1e-4 < r[4] < 5e-3 for r in torch_rows)
    tilelang = [r for r in rows if r[0] == "sglang-tilelang"]
    assert len(tilelang) == 1 and "needs a CUDA GPU" in tilelang[0][3]
    ours = [r for r in rows if r[0] == "dsv4kit"]  # the plugin's call: skip tail policy
    assert len(ours) == 2 and all(r[1] and r[2] == indexer_suite.KERNEL_REL_BAR for r in ours)


def test_verify_cases_give_each_request_k_causal_rows_over_one_page_row():
    """A speculative verify step (docs/sglang-contract.md, "Speculative shapes"): B requests x K rows."""
    from dsv4kit.kernels import indexer_reference as ref

    case = indexer_suite.parse_case("3x2x128v4")
    assert (case.batch, case.verify, case.rows) == (3, 4, 12)
    assert case.label == "B=12 (3 requests x 4 verify tokens) H=64 pages=2 seqlen<=128"
    lengths = indexer_suite.verify_lengths(case, 5)
    assert len(lengths) == 12 and max(lengths) == 128 and min(lengths) == 0
    for request in range(3):  # one request's rows: consecutive tokens, so c4 lengths never fall
        rows = lengths[request * 4:(request + 1) * 4]
        assert rows == sorted(rows) and rows[-1] - rows[0] <= 1, rows
    inputs = ref.make_indexer_inputs(case.rows, case.heads, case.pages, case.max_len, seed=5, lengths=lengths)
    indexer_suite.share_request_pages(inputs, case.verify)
    table = inputs.page_table.view(3, 4, -1)
    assert bool((table == table[:, -1:, :]).all())
    assert any(indexer_suite.parse_case(s).verify > 1 and indexer_suite.parse_case(s).rows > 64
               for s in indexer_suite.default_cases("gpu"))  # past SGLang's 64-token decode limit
    with pytest.raises(ValueError, match="K \\(verify tokens per request\\) must be >= 1"):
        indexer_suite.parse_case("2x2x100v0")


def test_validate_local_runs_a_verify_case_through_the_interpreter(tmp_path):
    report = tmp_path / "validation.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-m", "dsv4kit.cli", "validate", "--local", "--interpret", "--no-verdict",
         "--cases", "indexer:3x2x128v4", "-o", str(report)],
        capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = json.loads(report.read_text())["suites"]["indexer"]["rows"]
    kernel = [r for r in rows if r["impl"] in ("kernel", "dsv4kit")]
    assert len(kernel) == 2 and all(r["passed"] for r in kernel), kernel
