"""The verdict names the fastest correct implementation of a target (FP4 and FP8 indexers side by
side), and a target without a flag of its own (the FP4 indexer) informs without deciding a flag."""

from dsv4kit.validation import implementations, verdict as v, verdict_run


def _m(impl, shape, median, rel=1e-7, stock=False):
    return v.Measurement("indexer_fp4", impl, stock, shape, rel, 5e-4,
                         tuple(median * (1 + 0.001 * i) for i in range(7)))


def test_fastest_correct_skips_incorrect_and_counts_shapes_won():
    rows = [_m("dsv4kit", "s1", 10.0), _m("deepgemm-fp4", "s1", 12.0, stock=True),
            _m("dsv4kit-fp8", "s1", 8.0, rel=1.0),  # fastest but wrong: not a candidate
            _m("dsv4kit", "s2", 30.0), _m("deepgemm-fp4", "s2", 20.0, stock=True),
            _m("dsv4kit", "s3", 5.0), _m("deepgemm-fp4", "s3", 6.0, stock=True)]
    overall, by_shape = v.fastest_correct(rows)
    assert by_shape == {"s1": "dsv4kit", "s2": "deepgemm-fp4", "s3": "dsv4kit"}
    assert overall == "dsv4kit"
    verdict = v.decide("indexer_fp4", rows, shapes=["s1", "s2", "s3"])
    body = verdict.to_dict()
    assert body["fastest"] == "dsv4kit" and body["fastest_by_shape"]["s2"] == "deepgemm-fp4"
    assert body["flag"] == "" and body["recommend"] == "off"  # slower than DeepGEMM at s2
    section = v.section([verdict], {"gpu": "x"}, {})
    assert section["recommendation"] == {}
    assert any("fastest correct implementation: dsv4kit" in line for line in v.render(section))


def test_without_deepgemm_the_fastest_is_still_named():
    rows = [_m("dsv4kit", "s1", 10.0), _m("sglang-tilelang", "s1", 9.0)]
    verdict = v.decide("indexer_fp4", rows, {"deepgemm-fp4": "not available"}, ["s1"])
    assert verdict.fastest == "sglang-tilelang" and verdict.recommend == "off"
    assert "stock default was not measured" in verdict.reasons[0]


def test_the_fp4_target_measures_every_indexer_on_the_host_shapes():
    assert "indexer_fp4" in verdict_run.TARGETS and "indexer_fp4" in implementations.TARGETS
    assert [s.label for s in verdict_run.decode_shapes("indexer_fp4", 131072, (16,))] == \
        [s.label for s in verdict_run.decode_shapes("indexer", 131072, (16,))]
    loaded, missing = implementations.implementations("indexer_fp4", "cpu")
    assert {i.name: i.fn.cache_format for i in loaded} == {"dsv4kit": "fp4", "dsv4kit-fp8": "fp8"}
    assert "deepgemm-fp4" in missing and "sglang-tilelang" in missing
