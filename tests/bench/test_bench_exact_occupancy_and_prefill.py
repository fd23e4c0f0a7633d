"""Exact occupancy, the served model and cold prefill, with the REAL 0.5.23 client against the
stand-in (tests/fake_sglang_server.py).

The stand-in decides the truth here, and says it through its own counters: how many requests it
runs and queues, the tokens it generates per forward pass, what model it names in /server_info.
Each fault below recorded a wrong number as valid, with exit 0, before round four."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.bench.test_bench_sweep import dsv4kit, git
from tests.bench_support import ForeignLoad, in_process_sweep, publish_record, synthetic_record

pytestmark = pytest.mark.slow


def test_only_exactly_c_counts_and_the_served_model_and_the_engine_are_recorded(bench_box):
    # One stand-in, five repetitions of one wave at C=16, reshaped before each:
    # 1 honest; 2 one decode slot short (15 of 16, the rest queued; it passed round three's 0.8 x C)
    # and another model served; 3 one foreign request beside the bench's 16 (it fitted under round
    # three's C + floor(0.1 x C)); 4 speculative decoding accepting 3 tokens a forward pass; 5 a PD
    # decode server that gets each request 200 ms after the prefill server's first token (the KV
    # transfer): the client's stretch from first token to finish holds that wait, the decode
    # server's own count does not.
    server, inventory = bench_box(context_length=4096)
    foreign = []

    def reshape(line):
        if "prompts of" not in line:
            return
        if "rep 2/5:" in line:
            server.post("/_test/config", {"decode_cap": 15, "served_model_path": "/srv/models/DeepSeek-V3"})
        elif "rep 3/5:" in line:
            server.post("/_test/config", {"decode_cap": 0, "served_model_path": ""})
            foreign.append(ForeignLoad(server, 1, tokens=400, after_flushes=server.stats()["flush_count"]).start())
        elif "rep 4/5:" in line:
            foreign[0].stop()  # 3 tokens a pass, a pass 30 ms: a wave still outlasts 20 scrapes
            server.post("/_test/config", {"spec_accept_length": 3, "token_delay_ms": 30})
        elif "rep 5/5:" in line:
            server.post("/_test/config", {"spec_accept_length": 0, "token_delay_ms": 10, "kv_transfer_ms": 200})

    from dsv4kit.bench.config import SweepConfig

    assert SweepConfig(1, [1], 1, 2).metrics_interval_s <= 0.1  # 20 scrapes fit a 2 s stretch by default
    record, lines = in_process_sweep(inventory, reshape, concurrency=[16], repeat=5, num_prompts=16,
                                     warmup_requests=2, output_len=96, progress_every_s=0.5)
    honest, short, loaded, spec, pd = record["points"]

    # 1: valid; the headline is the server's own count over exact-occupancy scrapes, and agrees
    # with what the client saw while all 16 decoded; one forward pass per token per request.
    assert honest["validity"]["passed"], honest["validity"]
    occupancy = honest["window"]["occupancy"]
    assert occupancy["admissible"] and occupancy["window_scrapes"] >= 20 and occupancy["exact_share"] >= 0.98
    derived = honest["derived"]
    assert derived["decode_tok_s"] == pytest.approx(honest["window"]["client_decode_tok_s"], rel=0.2)
    assert derived["forward_passes_per_s"] == pytest.approx(derived["decode_tok_s"] / 16, rel=0.1)
    assert derived["acceptance_length"] is None and derived["tokens_per_pass_per_request"] == pytest.approx(1, rel=0.1)
    assert "served_model" in honest["validity"]["gates"] and honest["validity"]["gates"]["served_model"]["passed"]

    # 2: one short of C is not C: invalid, no headline, and it says what the server ran
    gate = short["validity"]["gates"]["exact_occupancy"]
    assert "exact_occupancy" in short["validity"]["failed"] and short["derived"]["decode_tok_s"] is None
    assert "to 15 requests" in gate["detail"] and "queued up to" in gate["detail"], gate

    # 3: one foreign request is foreign load, named
    gate = loaded["validity"]["gates"]["exact_occupancy"]
    assert "exact_occupancy" in loaded["validity"]["failed"] and "foreign load" in gate["detail"], gate
    assert loaded["window"]["occupancy"]["foreign_max"] >= 1

    # ... and another model served fails the point, naming it
    gate = short["validity"]["gates"]["served_model"]
    assert "served_model" in short["validity"]["failed"] and "/srv/models/DeepSeek-V3" in gate["detail"], gate

    # 4: the acceptance length the server reports, and forward passes beside tokens
    assert spec["validity"]["passed"], {k: v for k, v in spec["validity"]["gates"].items() if not v["passed"]}
    assert spec["derived"]["acceptance_length"] == pytest.approx(3.0)
    assert spec["derived"]["tokens_per_pass_per_request"] == pytest.approx(3.0, rel=0.15)
    assert spec["derived"]["forward_passes_per_s"] == pytest.approx(spec["derived"]["decode_tok_s"] / 48, rel=0.15)

    # progress inside a point: requests done of total, the rate, the ETA of the point and the sweep
    inside = [l for l in lines if "/16 requests" in l and "ETA point" in l and ", sweep " in l]
    assert inside, lines[-20:]
    assert record["sweep"]["gates"]["min_exact_share"] == 0.98 and record["sweep"]["gates"]["min_window_scrapes"] == 20
    # 5: in PD the transfer is never decode time
    assert pd["validity"]["passed"], pd["validity"]
    headline, client = pd["derived"]["decode_tok_s"], pd["window"]["client_decode_tok_s"]
    assert headline > 1.12 * client, (headline, client)
    assert record["summary"]["per_concurrency"]["16"]["valid_repetitions"] == 3
    assert len(record["summary"]["per_concurrency"]["16"]) and spec["derived"]["acceptance_length_source"].startswith(
        "/metrics")


def _spill_of(tmp_path, record: dict, partial_points: int):
    """A spill as a sweep leaves it when the write of record.partial.json failed after the last
    point's own file: the partial record has ``partial_points`` points, the point files all."""
    from dsv4kit.records.record import dumps

    spill = tmp_path / "spill" / record["run_id"]
    spill.mkdir(parents=True)
    for point in record["points"]:
        (spill / f"point-c{point['max_concurrency']}-r{point['repetition']}.json").write_text(dumps(point))
    partial = dict(record, points=record["points"][:partial_points], incomplete=True)
    (spill / "record.partial.json").write_text(dumps(partial))
    return spill


def test_every_spill_state_publishes_or_is_cleared_and_one_branch_holds_the_records(tmp_path, loopback_ssh):
    repo = tmp_path / "results"
    publish_record(repo, synthetic_record("lo-ctx4096-20260101T000000Z-aaaaaa", {1: [100.0, 101.0, 99.0]}))

    # a full disk lost the partial record's last write: the finished point is published all the same
    record = synthetic_record("lo-ctx4096-20260101T000100Z-bbbbbb", {1: [100.0, 101.0]})
    spill = _spill_of(tmp_path, record, partial_points=1)
    out = dsv4kit("records", "publish", str(spill), "--results-repo", str(repo), "--json")
    assert out.returncode == 0, out.stderr
    published = json.loads((repo / "records" / record["run_id"] / "record.json").read_text())
    assert [p["repetition"] for p in published["points"]] == [0, 1] and published["incomplete"]
    assert not spill.exists()

    # a bench SIGKILLed after its commit point: branch and tag moved, the work tree and index not,
    # and its spill kept. `records publish` clears the spill, saying where the record is, and brings
    # the work tree along; nothing is committed twice.
    record = synthetic_record("lo-ctx4096-20260101T000200Z-cccccc", {1: [100.0, 101.0, 99.0]})
    publish_record(repo, record)
    git(repo, "read-tree", "-m", "-u", "HEAD", "HEAD~1")  # the index and files as the killed publish left them
    assert "D  records/" in git(repo, "status", "--porcelain")
    spill = _spill_of(tmp_path, record, partial_points=3)
    out = dsv4kit("records", "publish", str(spill), "--results-repo", str(repo))
    assert out.returncode == 0 and "already published" in out.stdout and record["tag"] in out.stdout, out
    assert not spill.exists() and git(repo, "status", "--porcelain") == ""
    assert git(repo, "rev-list", "--count", "HEAD") == "3"

    # a spill of a sweep that stopped before its first point: cleared, with a message
    empty = _spill_of(tmp_path, synthetic_record("lo-ctx4096-20260101T000300Z-dddddd", {1: [1.0]}), 0)
    for path in empty.glob("point-*.json"):
        path.unlink()
    out = dsv4kit("records", "publish", str(empty), "--results-repo", str(repo))
    assert out.returncode == 2 and "nothing to publish" in out.stderr and not empty.exists(), out

    # a detached HEAD (a checked-out record tag) or a user's branch: refused before any work,
    # naming what is checked out; `records list` reads the records branch whatever is checked out
    git(repo, "checkout", "-q", record["tag"])
    from tests.bench_support import bench_inventory

    inventory = bench_inventory(tmp_path / "inv", loopback_ssh, venv=tmp_path / "venv", model_path=tmp_path / "m",
                                port=1, context_length=4096)
    bench = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1", "-i", str(inventory),
                    "--results-repo", str(repo))
    assert bench.returncode == 2 and "HEAD is detached at" in bench.stderr and "branch 'main'" in bench.stderr, bench
    listed = dsv4kit("records", "list", "--results-repo", str(repo))
    assert listed.returncode == 0 and record["run_id"] in listed.stdout
    git(repo, "checkout", "-q", "-b", "mine")
    bench = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1", "-i", str(inventory),
                    "--results-repo", str(repo))
    assert bench.returncode == 2 and "on branch 'mine'" in bench.stderr, bench.stderr
    assert git(repo, "rev-list", "--count", "mine") == "3"  # nothing went onto the user's branch


def test_records_compare_words_each_outcome_by_its_cause(tmp_path):
    from dsv4kit.records.compare import compare, format_comparison

    old = synthetic_record("lo-ctx4096-20260101T000000Z-aaaaaa", {1: [100.0, 101.0, 99.0]})
    new = synthetic_record("lo-ctx4096-20260101T000100Z-bbbbbb", {1: [100.5, 100.0, 99.5]})
    # three valid repetitions, one without a p99 (a metric that went unmeasured): neither "invalid"
    # nor "fewer than 3 valid repetitions"
    new["points"][0]["derived"]["p99_ttft_ms"] = None
    for point in old["points"] + new["points"]:
        point["derived"].setdefault("p99_ttft_ms", 10.0)
    text = format_comparison(compare(old, new))
    assert "INVALID" not in text and "fewer than" not in text, text
    assert "1 of 3 valid repetitions have no p99_ttft_ms" in text, text
    few = synthetic_record("lo-ctx4096-20260101T000200Z-cccccc", {1: [100.0, 101.0]})
    text = format_comparison(compare(old, few))
    assert "new side: 2 valid repetition(s) (a verdict needs 3" in text, text
    bad = synthetic_record("lo-ctx4096-20260101T000300Z-dddddd", {1: [100.0, 101.0, 99.0]}, invalid=((1, 2),))
    text = format_comparison(compare(old, bad))
    assert "C=1 invalid" in text and "1 of 3 repetitions invalid (output_tokens" in text, text


def test_the_fake_reports_passes_and_transfer_honestly(bench_box):
    # the stand-in's own account, checked once without the bench: at C=1 with 3 accepted tokens a
    # pass, 30 tokens take 10 passes; a transferred request runs only after its transfer.
    import urllib.request

    server, _ = bench_box(context_length=4096, spec_accept_length=3, kv_transfer_ms=100)
    body = json.dumps({"input_ids": [1, 2, 3], "stream": True,
                       "sampling_params": {"max_new_tokens": 31, "ignore_eos": True}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/generate", data=body, method="POST")
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    assert time.monotonic() - started >= 0.1
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
        text = response.read().decode()
    from dsv4kit.serving.box import metrics as box_helper

    values, problems = box_helper.select_metrics(box_helper.parse_exposition(text, names=box_helper.METRICS))
    assert values["decode_tokens_total"] == 30 and values["decode_passes_total"] == pytest.approx(10)
    assert values["prefill_tokens_total"] == 0 and values["num_requests_total"] == 1  # PD decode: no prompt computed
    assert values["spec_accept_length"] == 3 and not problems


def test_bench_prefill_records_cold_prefill_per_length_from_the_prefill_servers_counters(bench_box, tmp_path):
    # The stand-in reuses 8 prompt tokens of each request at first (a warm cache it does not
    # flush), then none: the first sweep's prefill is not cold and says so; the second's is.
    server, inventory = bench_box(context_length=4096, prefill_ms=50, cached_tokens=8)
    from tests.bench.test_bench_sweep import SMALL

    repo = tmp_path / "results"
    args = ["bench", "--ctx", "4096", "--concurrency", "2", "--repeat", "1", *SMALL, "--prefill",
            "--prefill-lengths", "256,1024", "-i", str(inventory), "--results-repo", str(repo), "--json"]
    warm = dsv4kit(*args)
    out = json.loads(warm.stdout)
    record = json.loads((repo / out["record_path"]).read_text())
    entry = record["prefill"]["per_length"]["256"]
    assert warm.returncode == 1 and not entry["valid"] and entry["tokens_per_s"] is None
    assert "8 prompt tokens came from the cache: not a cold prefill" in " ".join(entry["problems"]), entry
    # A second client's request while a cold prefill request runs (300 ms here): its started count
    # is 2 on the port. Before round five only the cache counters were read, and this one was valid.
    server.post("/_test/config", {"cached_tokens": 0, "prefill_ms": 300})
    point_flushes = server.stats()["flush_count"] + 1  # the bench client flushes once before its point

    def beside_the_first_prefill_request() -> None:
        while server.stats()["flush_count"] <= point_flushes:  # the prefill flushes before each request
            time.sleep(0.02)
        time.sleep(0.1)
        ForeignLoad(server, 1, tokens=1).start().join()

    beside = threading.Thread(target=beside_the_first_prefill_request, daemon=True)
    beside.start()
    busy = dsv4kit(*("256" if a == "256,1024" else a for a in args))
    beside.join(timeout=60)
    out = json.loads(busy.stdout)
    entry = json.loads((repo / out["record_path"]).read_text())["prefill"]["per_length"]["256"]
    assert busy.returncode == 1 and not entry["valid"], entry
    assert f"request 1: generation requests started meanwhile: port {server.port}: 2" in entry["problems"][0], entry
    server.post("/_test/config", {"prefill_ms": 50})
    cold = dsv4kit(*args)
    assert cold.returncode == 0, cold.stderr[-3000:]
    out = json.loads(cold.stdout)
    record = json.loads((repo / out["record_path"]).read_text())
    per = record["prefill"]["per_length"]
    assert set(per) == {"256", "1024"} and all(e["valid"] and e["requests"] == 3 for e in per.values()), per
    # 50 ms a prompt whatever its length: the longer prompt's rate is about 4x the shorter's
    assert per["1024"]["tokens_per_s"] > 2.5 * per["256"]["tokens_per_s"], per
    assert "prefill [2/2]: 1024 tokens:" in cold.stderr and "prompt tok/s (cold), TTFT" in cold.stderr
    # TTFT: the wall time of each one-token request, at least the stand-in's 50 ms prefill
    assert all(0.05 <= e["ttft_s"] < 5 for e in per.values()), per


def test_bench_prefill_under_ab_measures_each_arm_with_its_own_servers(bench_box, tmp_path):
    # Arm B's prefill takes 4x as long: the record holds both arms' cold prefill side by side,
    # B's rate about a quarter of A's and its TTFT about 4x.
    from dsv4kit.bench.prefill import ab_section  # noqa: F401  (the section the record holds)
    from dsv4kit.bench.sweep import SweepConfig, parse_ab, run_sweep
    from dsv4kit.bench import assembly
    from dsv4kit.core.inventory import load_inventory
    from dsv4kit.core.ssh import open_session

    server, inventory = bench_box(context_length=4096, prefill_ms=40)
    host = load_inventory(inventory).host()
    applied = []

    def apply_arm(inventory_path, host_, context_length, ab_, arm, progress, timeout):
        applied.append(arm)
        server.post("/_test/config", {"restart": True, "prefill_ms": 40 if arm == "A" else 160})

    cfg = SweepConfig(context_length=4096, concurrency=[1], input_len=16, output_len=8, repeat=1, num_prompts=2,
                      warmup_requests=1, metrics_interval_s=0.02, prefill_lengths=[512], prefill_requests=1)
    with open_session(host) as session:
        record = run_sweep(cfg, host=host, session=session, inventory_path=inventory, progress=lambda _: None,
                           ab=parse_ab("SGLANG_SM120_TRITON_INDEXER=0,1"), apply_arm=apply_arm).record
    assert applied == ["A", "B"]
    prefill = record["prefill"]
    assert set(prefill["arms"]) == {"A", "B"} and prefill["valid"], prefill["per_length"]
    entry = prefill["per_length"]["512"]
    assert 0.15 < entry["B_over_A_tokens_per_s"] < 0.5 and 2 < entry["B_over_A_ttft"] < 6, entry
    table = assembly.format_summary(record)
    assert "cold tok/s A" in table and "TTFT s A" in table and "\n     512 " in table, table


def test_the_admissible_window_rule():
    from dsv4kit.bench.window import exact_occupancy

    def scrapes(states):
        """``states``: per scrape (running, queued, prompt tokens so far, finished so far)."""
        return [{"t": 0.1 * k, "num_running_reqs": r, "num_queue_reqs": q, "prefill_tokens_total": p,
                 "num_requests_total": f, "decode_tokens_total": 80.0 * k, "decode_passes_total": 10.0 * k}
                for k, (r, q, p, f) in enumerate(states)]

    exact = (8, 0, 100, 0)
    # one stray scrape in 70 (a queued request for a moment): 98.6% exact, one window
    window = exact_occupancy(scrapes([exact] * 35 + [(8, 1, 100, 0)] + [exact] * 35), 8, 0.98, 20)
    assert window["admissible"] and window["window_scrapes"] == 70 and window["exact_share"] < 1
    assert window["decode_tok_s"] == pytest.approx(800.0) and window["forward_passes_per_s"] == pytest.approx(100.0)
    # a prefill or a finish between two scrapes that both show 8 running breaks exactness
    window = exact_occupancy(scrapes([exact] * 15 + [(8, 0, 200, 0)] * 15 + [(8, 0, 200, 1)] * 15), 8, 0.98, 20)
    assert not window["admissible"] and window["window_scrapes"] == 14, window  # the first has no scrape before it
    # After a finish the running gauge may still say 8 while 7 run, until SGLang rewrites it (every 40
    # decode passes): the scrapes before the pass counter has moved 40 past the finish are not exact,
    # even where no other request finished and the next one joined (10 passes a scrape here).
    after_finish = scrapes([exact] * 10 + [(8, 0, 100, 1)] * 50)  # a finish at scrape 10 (pass 100)
    window = exact_occupancy(after_finish, 8, 0.98, 20)
    assert window["admissible"] and window["window_s"][0] == pytest.approx(1.5) and window["window_scrapes"] == 45
    slow = exact_occupancy(after_finish, 8, 0.98, 20, refresh_passes=400)  # a decode_log_interval of 400
    assert not slow["admissible"] and slow["window_scrapes"] == 9 and "within 400 decode passes" in slow["detail"]
    # and says what it cost and what leaves more exact time: 40 scrapes at 8 waited for the rewrite
    assert window["gauge_wait_scrapes"] == 4 and slow["gauge_wait_scrapes"] == 40
    assert "40 scrape(s) of exactly C=8 waited for the running gauge's rewrite" in slow["detail"], slow["detail"]
    assert "--output-len" in slow["detail"] and "--decode-log-interval" in slow["detail"]
    # a gauge that changed after the finish (7, then 8 again as the next request joined) was rewritten:
    # current again at once
    rejoined = exact_occupancy(scrapes([exact] * 10 + [(7, 0, 100, 1)] + [(8, 0, 100, 1)] * 40), 8, 0.98, 20)
    assert rejoined["admissible"] and rejoined["window_s"][0] == pytest.approx(1.2), rejoined
    # 19 exact scrapes are too few; 21 of one short are not C; a foreign request is named
    assert not exact_occupancy(scrapes([exact] * 19), 8, 0.98, 20)["admissible"]
    short = exact_occupancy(scrapes([(7, 1, 100, 0)] * 21), 8, 0.98, 20)
    assert not short["admissible"] and "ran 7 to 7 requests" in short["detail"] and "queued up to 1" in short["detail"]
    foreign = exact_occupancy(scrapes([(9, 0, 100, 0)] * 21), 8, 0.98, 20)
    assert "foreign load" in foreign["detail"] and foreign["foreign_max"] == 1
    # a counter the server does not have is named, never taken as 0
    blind = scrapes([exact] * 30)
    for s in blind:
        del s["num_requests_total"]
    assert "lacks num_requests_total" in exact_occupancy(blind, 8, 0.98, 20)["detail"]
