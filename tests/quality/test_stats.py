"""The eval's statistics against known values (scipy is not a dependency; these are textbook)."""

from __future__ import annotations

import math

import pytest

from dsv4kit.quality import prompts
from dsv4kit.quality.stats import approx_kl, mcnemar_exact, topk_agreement, wilson


def test_exact_mcnemar_is_the_two_sided_binomial_on_the_discordant_pairs():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(6, 0) == pytest.approx(2 * 0.5 ** 6)  # 0.03125
    assert mcnemar_exact(5, 0) == pytest.approx(0.0625)  # five one-way flips are not yet significant
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(10, 2) == mcnemar_exact(2, 10) == pytest.approx(2 * sum(math.comb(12, i) for i in range(3)) / 2 ** 12)


def test_wilson_interval_matches_the_closed_form():
    low, high = wilson(95, 100)
    assert (round(low, 4), round(high, 4)) == (0.8882, 0.9785)
    assert wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12) and wilson(10, 10)[1] == pytest.approx(1.0)
    assert wilson(0, 0) is None


def test_kl_is_sglangs_estimate_and_nan_is_none():
    assert approx_kl([-0.5, -1.0], [-0.5, -1.0]) == 0.0
    assert approx_kl([-0.35], [-0.75]) == pytest.approx(math.exp(0.4) - 1 - 0.4)
    assert approx_kl([-0.35, None], [-0.75, -1.0]) is None and approx_kl([float("nan")], [-1.0]) is None


def test_topk_agreement_stops_at_the_first_divergence():
    top = [[[-0.1, 1], [-2.0, 9]], [[-0.1, 2], [-2.0, 8]], [[-0.1, 3], [-2.0, 7]]]
    same = topk_agreement([1, 2, 3], top, [1, 2, 3], top)
    assert same == {"first_divergence": None, "compared": 3, "agree": 3, "contained": True}
    tie = topk_agreement([1, 2, 3], top, [1, 8, 4], [top[0], [[-0.1, 8], [-0.2, 2]], top[2]])
    assert tie["first_divergence"] == 1 and tie["compared"] == 2 and tie["contained"]
    far = topk_agreement([1, 2], top, [1, 5], [top[0], [[-0.1, 5], [-0.2, 6]]])
    assert not far["contained"]


def test_tasks_in_gsm8ks_format_are_checked_by_line():
    good = '{"question": "q", "answer": "so 3 + 4 = 7\\n#### 1,007"}'
    items, problems = prompts.parse_tasks("\n".join([good, "", "{", '{"question": 1}', '{"question": "q", "answer": "7"}']), "t.jsonl")
    assert len(items) == 1 and prompts.answer_value(items[0]["answer"].split("####")[-1]) == 1007
    assert [p.split(":")[1] for p in problems] == ["3", "4", "5"]
    assert prompts.first_key(" 1,234,567.") == "1234567" and prompts.answer_value("no number") is None
