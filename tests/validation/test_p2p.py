"""The P2P check's flagging logic on stand-in numbers (CPU), and its skip where there are no GPUs."""

import pytest

from dsv4kit.validation import p2p


def test_a_pair_far_below_the_others_is_flagged():
    fast = {(a, b): 52.0 + (a + b) % 3 for a in range(4) for b in range(4) if a != b}
    fast[(1, 3)] = 11.0  # through the root complex
    assert p2p.flag_slow_pairs(fast) == [(1, 3)]


def test_even_pairs_are_not_flagged():
    assert p2p.flag_slow_pairs({(0, 1): 50.0, (1, 0): 48.0, (0, 2): 41.0, (2, 0): 44.0}) == []
    assert p2p.flag_slow_pairs({(0, 1): 5.0}) == []  # one pair: nothing to compare with


def test_bad_groups_are_named():
    assert p2p.parse_groups(["0,1,2,3", "4,5,6,7"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="'0,x'"):
        p2p.parse_groups(["0,x"])


def test_skipped_and_said_so_without_gpus(monkeypatch, capsys):
    monkeypatch.setattr(p2p, "gpus_available", lambda: 0)
    assert p2p.main([]) == 7
    assert "skipped: no CUDA GPU" in capsys.readouterr().out
    monkeypatch.setattr(p2p, "gpus_available", lambda: 1)
    assert p2p.main([]) == 7
    assert "skipped: one GPU" in capsys.readouterr().out
