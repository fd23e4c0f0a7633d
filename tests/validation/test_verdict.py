"""The kernel verdict: the pure decision rule, the decode shapes, and the run with stand-ins."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dsv4kit.validation import verdict as v
from dsv4kit.validation import verdict_run
from tests.verdict_standins import BUILDERS, StandIn, identity, issue_table, provider, timer

REPO = Path(__file__).resolve().parents[2]


def m(impl, shape, samples, stock=False, rel=1e-5, bar=1e-3, error="", target="indexer"):
    return v.Measurement(target, impl, stock, shape, rel, bar, tuple(samples), error)


def jitter(base, spread=0.01, n=7):
    return [base * (1 + spread * (i - n // 2)) for i in range(n)]


# --------------------------------------------------------------------------- the timing rule
def test_faster_needs_the_margin_and_separated_quartiles():
    assert v.compare_timings(jitter(90), jitter(100)) == v.FASTER
    assert v.compare_timings(jitter(110), jitter(100)) == v.SLOWER
    assert v.compare_timings(jitter(97), jitter(100)) == v.TIE  # within the 5 % margin
    # Medians 10 % apart, but the samples overlap in their middle halves: noise, not evidence.
    assert v.compare_timings(jitter(90, spread=0.08), jitter(100, spread=0.08)) == v.TIE


def test_one_sample_or_a_few_are_no_evidence():
    assert v.compare_timings([1.0], [100.0]) == v.NO_EVIDENCE
    assert v.compare_timings([1.0] * (v.MIN_SAMPLES - 1), [100.0] * 9) == v.NO_EVIDENCE


def test_a_slow_outlier_does_not_decide():
    ours = [10, 10.1, 9.9, 10, 10.2, 9.8, 80]  # one slow replay: the mean would say "slower"
    assert v.compare_timings(ours, jitter(12)) == v.FASTER


# --------------------------------------------------------------------------- the decision
SHAPES = ["s1", "s2"]


def test_on_only_when_correct_and_faster_at_every_shape():
    rows = [m("dsv4kit", "s1", jitter(5)), m("dsv4kit", "s2", jitter(5)),
            m("stock", "s1", jitter(10), stock=True), m("stock", "s2", jitter(10), stock=True),
            m("other", "s1", jitter(1)), m("other", "s2", jitter(1))]  # faster, but not what stock runs
    verdict = v.decide("indexer", rows, shapes=SHAPES)
    assert verdict.recommend == "on" and verdict.stock_default == "stock"
    assert verdict.to_dict()["flag_value"] == "1"
    assert [c.outcome for c in verdict.comparisons] == [v.FASTER, v.FASTER]


@pytest.mark.parametrize("case, expect", [
    ("slower at one shape", "s2: slower against stock"),
    ("a tie at one shape", "s2: tie against stock"),
    ("wrong at one shape", "s2: dsv4kit's error is above the bar"),
    ("a shape not measured", "s2: no-evidence against stock"),
    ("ours raised", "s2: no-evidence against stock (median ratio"),
])
def test_off_otherwise_with_the_reason(case, expect):
    ours2 = {"slower at one shape": m("dsv4kit", "s2", jitter(20)),
             "a tie at one shape": m("dsv4kit", "s2", jitter(10)),
             "wrong at one shape": m("dsv4kit", "s2", jitter(5), rel=0.5),
             "a shape not measured": None,
             "ours raised": m("dsv4kit", "s2", jitter(5), error="RuntimeError: boom")}[case]
    rows = [m("dsv4kit", "s1", jitter(5)), m("stock", "s1", jitter(10), stock=True),
            m("stock", "s2", jitter(10), stock=True)] + ([ours2] if ours2 else [])
    verdict = v.decide("indexer", rows, shapes=SHAPES)
    assert verdict.recommend == "off"
    assert any(r.startswith(expect) for r in verdict.reasons), verdict.reasons


def test_no_stock_default_is_no_evidence_and_names_why():
    rows = [m("dsv4kit", "s1", jitter(5), target="attention")]
    verdict = v.decide("attention", rows, {"flashinfer-sm120": "flashinfer is not installed"}, shapes=["s1"])
    assert verdict.recommend == "off"
    assert "stock default was not measured" in verdict.reasons[0] and "flashinfer is not installed" in verdict.reasons[0]


def test_ours_missing_or_two_stock_defaults_is_off():
    assert v.decide("indexer", [m("stock", "s1", jitter(5), stock=True)], {"dsv4kit": "triton missing"},
                    shapes=["s1"]).reasons == ["dsv4kit's kernel was not measured (triton missing)"]
    rows = [m("dsv4kit", "s1", jitter(5)), m("a", "s1", jitter(9), stock=True), m("b", "s1", jitter(9), stock=True)]
    assert "more than one" in v.decide("indexer", rows, shapes=["s1"]).reasons[0]


def test_a_wrong_stock_default_is_noted_not_hidden():
    rows = [m("dsv4kit", "s1", jitter(5)), m("stock", "s1", jitter(10), stock=True, rel=0.3)]
    verdict = v.decide("indexer", rows, shapes=["s1"])
    assert verdict.recommend == "on" and "the stock default's error" in verdict.comparisons[0].note


# --------------------------------------------------------------------------- shapes and defaults
def test_decode_shapes_cover_the_context_and_every_concurrency():
    labels = [s.label for s in verdict_run.decode_shapes("indexer", 131072, (1, 16, 64))]
    assert labels == [f"B={b} ctx=131072 L={n}" for b in (1, 16, 64) for n in (2048, 131072)]
    assert [s.label for s in verdict_run.decode_shapes("attention", 8192, (4,))] == ["c4 T=4 ctx=8192 H=16",
                                                                                    "c128 T=4 ctx=8192 H=16"]
    assert [s.params["tokens"] for s in verdict_run.decode_shapes("indexer", 1024, (1,))] == [1024]
    with pytest.raises(ValueError, match="unknown verdict target"):
        verdict_run.decode_shapes("moe", 8192, (1,))


def test_the_indexer_verdict_also_measures_prefill_chunks_that_fit_the_context():
    labels = [s.label for s in verdict_run.prefill_shapes("indexer", 131072)]
    assert labels == [f"prefill R={r} prefix={p}K ctx=131072" for r in (1024, 4096, 8192) for p in (0, 32, 124)
                      if p * 1024 + r <= 131072]  # 124K + 8K does not fit a 128K context
    assert len(labels) == 8
    assert [s.params["rows"] for s in verdict_run.prefill_shapes("indexer", 8192)] == [1024, 4096, 8192]
    assert verdict_run.prefill_shapes("attention", 131072) == []
    section = run()
    shapes = {c["shape"] for c in section["targets"]["indexer"]["comparisons"]}
    assert {s.label for s in verdict_run.prefill_shapes("indexer", 8192)} <= shapes


def test_defaults_are_the_bench_concurrencies_and_the_inventory_context():
    import inspect

    from dsv4kit.commands.bench import bench

    default = inspect.signature(bench).parameters["concurrency"].default
    assert verdict_run.DEFAULT_CONCURRENCY == tuple(int(c) for c in default.split(","))
    all_vars = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    assert verdict_run.DEFAULT_CONTEXT == all_vars["dsv4_context_length"]
    assert all_vars["dsv4_kernel_flags"] == {flag: "auto" for flag in v.FLAGS.values()}


@pytest.mark.parametrize("text", ["", "1,,x", "0,4", "4,4"])
def test_bad_concurrency_is_refused(text):
    with pytest.raises(ValueError, match="--concurrency"):
        verdict_run.parse_concurrency(text)


# --------------------------------------------------------------------------- the run, stood in
def run(table=None, unavailable=None, **kw):
    return verdict_run.run(["indexer", "attention"], 8192, (1, 16, 64), "cuda", False,
                           provider=provider(table or issue_table(), unavailable), builders=BUILDERS,
                           timer=timer, identity_fn=identity, **kw)


def test_the_issue_table_keeps_the_indexer_stock_and_turns_attention_on():
    section = run()
    assert section["status"] == "complete"
    assert section["recommendation"] == {"SGLANG_SM120_TRITON_INDEXER": "0", "SGLANG_SM120_MMA_ATTENTION": "1"}
    indexer = section["targets"]["indexer"]
    assert indexer["stock_default"] == "sglang-tilelang"
    outcomes = {c["shape"]: c["outcome"] for c in indexer["comparisons"]}
    assert outcomes["B=64 ctx=8192 L=2048"] == "slower" and outcomes["B=64 ctx=8192 L=8192"] == "faster"
    # Every implementation's error and time is in the report, not only the two compared.
    names = {row["impl"] for row in indexer["measurements"]}
    assert names == {"dsv4kit", "sglang-tilelang", "sglang-torch"}
    assert all(len(row["samples_us"]) == 7 and row["median_us"] for row in indexer["measurements"])
    assert section["identity"]["gpu"].startswith("NVIDIA RTX PRO 6000")
    text = "\n".join(v.render(section))
    assert "SGLANG_SM120_TRITON_INDEXER=0 (off)" in text and "SGLANG_SM120_MMA_ATTENTION=1 (on)" in text


def test_an_implementation_that_raises_is_a_finding_not_a_crash():
    table = issue_table()
    table["attention"][1] = StandIn("attention", "flashinfer-sm120", True, raises="CUDA error: no kernel image")
    section = run(table)
    assert section["status"] == "complete"
    attention = section["targets"]["attention"]
    assert attention["recommend"] == "off"
    stock_rows = [r for r in attention["measurements"] if r["impl"] == "flashinfer-sm120"]
    assert stock_rows and all("no kernel image" in r["error"] for r in stock_rows)


def test_a_provider_that_fails_makes_the_verdict_incomplete():
    def broken(target, device):
        raise ImportError("No module named 'dsv4kit.validation.implementations'")

    section = verdict_run.run(["indexer"], 8192, (1,), "cuda", False, provider=broken, builders=BUILDERS,
                              timer=timer, identity_fn=identity)
    assert section["status"] == "incomplete" and "could not be loaded" in section["reason"]
    assert section["recommendation"] == {"SGLANG_SM120_TRITON_INDEXER": "0"}


def test_no_gpu_means_no_verdict():
    section = verdict_run.run(["indexer"], 8192, (1,), "cpu", True, identity_fn=identity)
    assert section["status"] == "skipped" and "mean nothing" in section["reason"]
    assert section["targets"] == {} and "not measured" in v.render(section)[0]


def test_the_docs_name_the_rule_by_its_constants():
    """docs/rollout.md states the rule through the names in validation/verdict.py and verdict_run.py,
    and the shapes it describes are the ones measured."""
    doc = (REPO / "docs/rollout.md").read_text()
    section = doc.split("## Which kernels to turn on: following the evidence", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())
    for name in ("MARGIN", "MIN_SAMPLES", "SAMPLES"):
        assert f"`{name}`" in section
    assert f"short request ({verdict_run.SHORT_TOKENS} tokens)" in section
    assert f"default `{','.join(map(str, verdict_run.DEFAULT_CONCURRENCY))}`" in section
    assert f"`--local`: {verdict_run.DEFAULT_CONTEXT}" in section
    assert "64 divided by the decode TP (`len(dsv4_decode_gpus)`" in section and "§4.2" in section


def test_the_driver_version_is_read_from_the_nvrm_line():
    line = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
            "(dvs-builder@U22-I3-AF03-09-1)  Thu Sep 25 02:04:16 UTC 2025")
    assert verdict_run.parse_nvrm(line) == "580.95.05"
    assert verdict_run.parse_nvrm("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54 Tue") == "550.54"
    assert verdict_run.parse_nvrm("garbage") is None
