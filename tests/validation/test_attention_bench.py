"""The attention benchmark's bookkeeping on the CPU: inputs, floors, targets, table, JSON, plot.

The GPU timers and rates are replaced by fakes; the numbers themselves come only from a GPU run
(docs/results/bench_attention_h200.json).
"""

import json
from pathlib import Path

import pytest

from dsv4kit.validation import bench_attention as bench


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "measure_copy_bandwidth", lambda: 4.0e12)
    monkeypatch.setattr(bench, "measure_bf16_matmul_rate", lambda: 7.0e14)
    monkeypatch.setattr(bench, "device_properties",
                        lambda: {"gpu": "fake", "capability": "sm_90", "sm_count": 132, "l2_bytes": 1 << 20})
    monkeypatch.setattr(bench, "check_against_reference", lambda fn, kw: 1e-3)

    def fake_time(fn, layers, target_ms=3.0, replays=7):
        kw = layers[0]
        valid = int(kw["topk_length"].sum()) + int(kw["extra_topk_length"].sum())
        simt = getattr(fn, "__name__", "") == "simt_sparse_mla_decode"
        width = kw["indices"].shape[2] + kw["extra_indices_in_kvcache"].shape[2]
        return (kw["q"].shape[0] * width * 0.5) if simt else 1.0 + valid * 0.004

    monkeypatch.setattr(bench, "time_under_graph", fake_time)


def test_quick_benchmark_bookkeeping(fake_gpu, tmp_path):
    result = bench.run_benchmark(quick=True)
    assert {(p["layer"], p["T"]) for p in result["points"]} == {("c4", 1), ("c4", 64), ("c128", 1), ("c128", 64)}
    c4 = next(p for p in result["points"] if p["layer"] == "c4" and p["T"] == 64)
    assert c4["kv_bytes"] == 64 * 640 * 584
    assert c4["mma_flops"] == 4 * 64 * 64 * 640 * 512
    assert c4["floor_us"] == max(c4["kv_bytes"] / 4.0e12, c4["mma_flops"] / 7.0e14) * 1e6
    c128 = next(p for p in result["points"] if p["layer"] == "c128" and p["T"] == 64)
    assert c128["valid_extra"] == 1024 and c128["width"] == 128 + 8256
    assert [s["valid_extra"] for s in result["c128_length_sweep"]] == [128, 1024, 8192]
    assert set(result["targets"]) >= {"c4_T64_within_2x_floor", "c4_T64_20x_faster_than_simt",
                                      "c128_time_follows_valid_length"}
    text = bench.table(result)
    assert "| c4 | 64 |" in text and "Targets:" in text
    json.dumps(result)
    assert bench.plot(result, str(tmp_path / "b.png"))  # matplotlib is in the test extra
    assert (tmp_path / "b.png").stat().st_size > 1000


def test_without_gpu_exits_with_environment_code(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", "/nonexistent-never-written"]) == 5
    assert "needs a GPU" in capsys.readouterr().err


def test_sweep_bookkeeping_and_fastest_tiles(fake_gpu, tmp_path, capsys):
    result = bench.run_sweep(quick=True)
    names = [e["name"] for e in result["variants"]]
    assert names[0] == "default" and len(names) == 4
    assert all(e["correct"] and "c4_T64_zero_length_us" in e for e in result["variants"])
    assert "| variant |" in bench.render(result)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(result))
    assert bench.main(["--fastest-tiles", str(path)]) == 0
    tiles = capsys.readouterr().out.strip().split(",")
    assert len(tiles) == 6 and all(t.isdigit() for t in tiles)


def test_mma_sync_sweep_times_the_sm120_shapes(fake_gpu):
    result = bench.run_sweep(quick=True, mma_sync=True)
    assert "--mma-sync" in result["command"] and "mma.sync" in result["mma"]
    assert isinstance(result["compiled_mma_kinds"], dict)
    assert [e["config"]["wide"] for e in result["variants"]] == [False] * len(result["variants"])
    assert result["variants"][0]["name"] == "default"


def test_the_sweep_on_sm120_times_only_shapes_that_fit_it():
    assert bench.sweep_variants((12, 0)) == bench.sm120_variants()
    assert any(cfg.wide for _, cfg, _ in bench.sweep_variants((9, 0)))


def test_mma_sync_needs_sweep(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--mma-sync", "--out", "/nonexistent-never-written"])
    assert exc.value.code == 2 and "--sweep" in capsys.readouterr().err


def test_compare_renders_before_and_after(fake_gpu, tmp_path, capsys):
    result = bench.run_benchmark(quick=True)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(result))
    assert bench.main(["--compare", str(path), str(path)]) == 0
    assert "| c4 | 64 |" in capsys.readouterr().out and "1.0x" in bench.comparison_table(result, result)
    assert bench.main(["--compare", str(path), str(tmp_path / "missing.json")]) == 2


def test_main_writes_json_and_table(fake_gpu, monkeypatch, tmp_path, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    rc = bench.main(["--quick", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "bench_attention.json").read_text())
    assert rc == (0 if result["all_targets_met"] else 1)
    # The JSON is written with sorted keys, so only the order of the targets may differ.
    assert sorted((tmp_path / "bench_attention.md").read_text().splitlines()) == sorted(bench.table(result).splitlines())
    assert not (tmp_path / "bench_attention.partial.json").exists()
    assert "| c4 | 64 |" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).resolve().parents[2] / "docs" / "results")
                                        .glob("bench_attention_sweep_h200*.json")))
def test_fastest_tiles_of_each_committed_sweep_is_a_valid_override(name, monkeypatch):
    from dsv4kit.kernels import sparse_mla_decode as dec

    result = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results" / name).read_text())
    tiles = bench.fastest_tiles(result)
    assert tiles is not None
    monkeypatch.setenv(dec.TILES_ENV, tiles)
    assert dec.default_config(64, (9, 0)).block_h == int(tiles.split(",")[0])
