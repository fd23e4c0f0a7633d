"""Test support for the bench tests: the real client's venv, a tiny tokenizer, the stand-in server.

- ``client_venv()``: a venv with the real ``sglang.benchmark.serving`` (sglang 0.5.23 installed
  ``--no-deps``; its import chain from the test venv's declared extras, torch 2.13 CPU), built
  once and cached; see ``tests/sglang_wheel.py``. ``$DSV4KIT_BENCH_CLIENT_VENV`` points at a
  prebuilt one instead.
- ``make_tokenizer(python, dir)``: a ``PreTrainedTokenizerFast`` around a ``tokenizers`` WordLevel
  model over the words ``w0 .. w{V-1}`` that the stand-in server generates, saved to ``dir``.
- ``FakeServer``: ``tests/fake_sglang_server.py`` as a subprocess on 127.0.0.1, by default as a
  server launched with ``--decode-log-interval 8`` (``TEST_GAUGE_REFRESH_PASSES``).
- ``DcgmStandin``: the DCGM exporter stand-in (``tests/fake_exporters.py``), the GPU telemetry source
  of every bench and eval box (``box_dcgm`` in conftest.py: a point no source observed is invalid).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from tests.sglang_wheel import client_venv  # noqa: F401  (the bench tests import it from here)

HERE = Path(__file__).resolve().parent
SGLANG_VERSION = "0.5.23"
VOCAB_SIZE = 200
#: The stand-in's gauge cadence unless a test names one: it rewrites its running gauge every 8
#: decode passes and says so in /server_info, as a box launched with ``--decode-log-interval 8``.
#: The bench then waits 8 passes after each finish, not SGLang's default 40, before a scrape is
#: exact again: the 64-token outputs these tests use for speed would otherwise spend most of each
#: wave waiting. SGLang's 40 stays where the cadence is the point (the quickstart journey, the
#: stand-in's fault sweep).
TEST_GAUGE_REFRESH_PASSES = 8


#: The stand-in tokenizer's pre-tokenizer: words with their leading space, single digits,
#: newlines, punctuation; decoding fuses the tokens back (the text round-trips exactly).
PRETOKENIZE = r" ?[A-Za-z_][A-Za-z0-9_]*| ?[0-9]|\n| ?[^\sA-Za-z0-9]| +"

_TOKENIZER_SCRIPT = """
import json, sys
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
size = int(sys.argv[2])
vocab = {f"w{i}": i for i in range(size)}
vocab["[UNK]"] = size
pre = pre_tokenizers.Split(Regex(sys.argv[4]), behavior="isolated")
for text in json.load(open(sys.argv[3])):
    for piece, _ in pre.pre_tokenize_str(text):
        vocab.setdefault(piece, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre
tok.decoder = decoders.Fuse()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                        clean_up_tokenization_spaces=False).save_pretrained(sys.argv[1])
"""


def tokenizer_corpus() -> list[str]:
    """Every text the stand-in model must read and write: the bench's words, the eval's prompts
    (dsv4kit.quality.prompts) and the generated task items (tests/quality_support.py)."""
    from dsv4kit.quality import prompts
    from tests.quality_support import TASK_WORDS

    texts = [" ".join(f"w{i}" for i in range(VOCAB_SIZE)), *prompts.FILLER, *prompts.NEEDLE_LABELS,
             prompts.needle_sentence("amber gate", "0123456789"), prompts.needle_question("amber gate"),
             "Question: What is 0 plus 1?\nAnswer: 0 plus 1 is 1. #### 1\n\n unknown.",
             " ".join(prompts.NEEDLE_LABELS), TASK_WORDS, "The river bends twice before",
             *(prompts.long_answer_prompt(0, i) for i in range(len(prompts.LONG_ANSWER_TOPICS))),
             "0 1 2 3 4 5 6 7 8 9 0123456789 .,:;?!#-'\"()$%&*+/<=>@[]^_{|}~",
             " . , : ; ? ! # - ' \" ( ) $ % & * + / < = > @ [ ] ^ _ { | } ~"]
    return texts + [" " + t for t in texts]


def make_tokenizer(python: Path, directory: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """A tiny local tokenizer directory (no hub access), written by the venv's transformers: the
    bench's words ``w0 .. w{V-1}`` at ids 0..V-1, then every piece of ``tokenizer_corpus``."""
    directory.mkdir(parents=True, exist_ok=True)
    corpus = directory.parent / f".{directory.name}-corpus.json"
    corpus.write_text(json.dumps(tokenizer_corpus()))
    subprocess.run([str(python), "-c", _TOKENIZER_SCRIPT, str(directory), str(vocab_size), str(corpus), PRETOKENIZE],
                   check=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    corpus.unlink()
    # config.json too, in case a loader looks for it (docs/sglang-contract.md §8.3).
    (directory / "config.json").write_text(json.dumps({"model_type": "dsv4kit-test", "vocab_size": vocab_size + 1}))
    return directory


class FakeServer:
    """tests/fake_sglang_server.py on 127.0.0.1 (a subprocess; stopped by ``stop``)."""

    def __init__(self, workdir: Path, model_path: Path, *, context_length: int = 4096,
                 token_delay_ms: float = 10.0, error_every: int = 0, cached_tokens: int = 0,
                 gauge_refresh_passes: int = TEST_GAUGE_REFRESH_PASSES, **faults):
        """``faults``: the stand-in's hostile switches, e.g. ``decode_cap=2``, ``serial_prefill=True``,
        ``prefill_ms=80``, ``batch_slowdown=0.1``, ``omit="cached_tokens"``, ``max_running_requests=4``.
        ``gauge_refresh_passes``: the running gauge's rewrite cadence in decode passes (0: live)."""
        self.workdir = workdir
        self.args = [
            "--model-path", str(model_path), "--context-length", str(context_length),
            "--token-delay-ms", str(token_delay_ms), "--error-every", str(error_every),
            "--cached-tokens", str(cached_tokens), "--vocab-size", str(VOCAB_SIZE), "--max-lifetime", "900",
            "--gauge-refresh-passes", str(gauge_refresh_passes),
        ]
        for name, value in faults.items():
            flag = "--" + name.replace("_", "-")
            if value is True:
                self.args.append(flag)
            elif value not in (None, False):
                self.args += [flag, str(value)]
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> "FakeServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        port_file = self.workdir / "fake_server.port"
        port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, str(HERE / "fake_sglang_server.py"), "--port-file",
                                      str(port_file), *self.args],
                                     stdout=subprocess.DEVNULL, stderr=open(self.workdir / "fake_server.log", "ab"))
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fake server did not start: {(self.workdir / 'fake_server.log').read_text()}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        return self

    def post(self, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body or {}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"{}")

    def stats(self) -> dict:
        return self.post("/_test/stats")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class DcgmStandin:
    """tests/fake_exporters.py ``dcgm`` on 127.0.0.1 (a subprocess): the box's DCGM exporter with
    ``gpus`` GPUs. ``plant(faults)`` posts a fault (``{"throttle": {"0": "thermal"}}``, see there)."""

    def __init__(self, workdir: Path, gpus: int = 8, lifetime_s: float = 600.0):
        self.workdir, self.gpus, self.lifetime_s = workdir, gpus, lifetime_s
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> "DcgmStandin":
        self.workdir.mkdir(parents=True, exist_ok=True)
        port_file = self.workdir / "dcgm.port"
        port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, str(HERE / "fake_exporters.py"), "dcgm", "--port-file",
                                      str(port_file), "--gpus", str(self.gpus), "--max-lifetime", str(self.lifetime_s)])
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the DCGM exporter stand-in did not start")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        return self

    def plant(self, faults: dict) -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/_test/config", data=json.dumps(faults).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=5).read()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


def bench_inventory(directory: Path, sshd, *, venv: Path, model_path: Path, port: int, context_length: int,
                    name: str = "lo", prefill_port: int | None = None, prefix: Path | None = None,
                    **extra) -> Path:
    """A one-host inventory whose box is this machine over the loopback sshd, serving on ``port``
    (router and decode; prefill too unless ``prefill_port`` names another server)."""
    from tests.remote_inventory import write_inventory

    return write_inventory(
        directory, sshd, name=name,
        dsv4_venv_dir=str(venv), dsv4_model_path=str(model_path), dsv4_model_revision="test-rev-1",
        dsv4_context_length=context_length, dsv4_router_port=port, dsv4_decode_port=port,
        dsv4_prefill_port=prefill_port or port, dsv4_prefill_gpus=[0, 1, 2, 3], dsv4_decode_gpus=[4, 5, 6, 7],
        dsv4_gpu_count=8, dsv4_kernel_flags={"SGLANG_SM120_TRITON_INDEXER": "1"},
        dsv4_prefix=str(prefix) if prefix else None, **extra,
    )


def write_units(prefix: Path, venv: Path, port: int, prefill_port: int | None = None) -> None:
    """dsv4-decode.service (and dsv4-prefill.service on ``prefill_port``) + environment files under
    ``prefix``, shaped like the playbook's."""
    etc = prefix / "etc" / "dsv4kit"
    units = prefix / "etc" / "systemd" / "system"
    etc.mkdir(parents=True, exist_ok=True)
    units.mkdir(parents=True, exist_ok=True)
    (etc / "kernel-flags.env").write_text("# kernel flags\nSGLANG_SM120_TRITON_INDEXER=1\nSGLANG_SM120_MMA_ATTENTION=0\n")
    (etc / "nccl.env").write_text("NCCL_P2P_DISABLE=1\nSGLANG_HF_TOKEN=hf_FAKE-SECRET-unit\n")
    (units / "dsv4-decode.service").write_text(
        "[Service]\n"
        f"EnvironmentFile={etc}/nccl.env\n"
        f"EnvironmentFile={etc}/kernel-flags.env\n"
        f"EnvironmentFile=-{etc}/missing.env\n"
        "Environment=CUDA_VISIBLE_DEVICES=4,5,6,7\n"
        f"ExecStart={venv}/bin/python -m sglang.launch_server --tp 4 --port {port} --context-length 4096\n"
    )
    if prefill_port:
        (units / "dsv4-prefill.service").write_text(
            "[Service]\n"
            f"EnvironmentFile={etc}/nccl.env\n"
            f"EnvironmentFile={etc}/kernel-flags.env\n"
            "Environment=CUDA_VISIBLE_DEVICES=0,1,2,3\n"
            f"ExecStart={venv}/bin/python -m sglang.launch_server --tp 4 --port {prefill_port} --context-length 4096\n"
        )


def client_line(*, n: int = 8, isl: int = 16, osl: int = 8, concurrency: int = 4, tpot_ms: float = 10.0,
                ttft_ms: float = 12.0, error_chunks: int = 0, cached: int = 0, startup_time: float = 1.0) -> dict:
    """A synthetic ``sglang.benchmark.serving`` JSONL line with --output-details --cache-report.

    ``error_chunks`` requests look the way the native client records an HTTP-200 error chunk:
    success, ``output_len`` = the requested length, empty text, ``ttft`` 0.
    """
    good = n - error_chunks
    ttfts = [ttft_ms / 1000] * good + [0.0] * error_chunks
    texts = [" ".join(["w1"] * osl)] * good + [""] * error_chunks
    return {
        "tag": "t", "backend": "sglang", "dataset_name": "random-ids", "request_rate": float("inf"),
        "max_concurrency": concurrency, "random_input_len": isl, "random_output_len": osl, "random_range_ratio": 1.0,
        "server_info": {"context_length": 4096, "startup_time": startup_time, "api_key": "sk-dsv4kit-FAKE-SECRET-3f9a"},
        "duration": 1.0, "completed": n, "total_input_tokens": n * isl, "total_output_tokens": n * osl,
        "total_output_tokens_retokenized": good * osl, "request_throughput": n, "input_throughput": n * isl,
        "output_throughput": n * osl * 0.9, "total_throughput": n * (isl + osl),
        "median_ttft_ms": ttft_ms, "p99_ttft_ms": ttft_ms * 1.5, "median_tpot_ms": tpot_ms, "p99_tpot_ms": tpot_ms * 1.2,
        "median_itl_ms": tpot_ms, "concurrency": concurrency * 0.95, "max_concurrent_requests": concurrency,
        "cache_report": {"total_prompt_tokens": n * isl, "total_cached_tokens": n * cached,
                         "cache_hit_rate_pct": round(100.0 * cached / isl, 2)},
        "input_lens": [isl] * n, "output_lens": [osl] * n, "ttfts": ttfts, "itls": [[tpot_ms / 1000] * (osl - 1)] * n,
        "generated_texts": texts, "errors": [""] * n, "cached_tokens": [cached] * n,
        "cached_tokens_details": [None] * n,
    }


def good_evidence(concurrency: int, *, meta_keys=("prompt_tokens", "completion_tokens", "cached_tokens"),
                  running: float | None = None) -> tuple[dict, dict]:
    """(evidence, window) as a point on an honest server leaves them: every field reported and the
    running batch at ``running`` (default C) in the steady-state window."""
    from dsv4kit.bench.window import exact_occupancy

    held = float(concurrency if running is None else running)
    evidence = {"meta_info": {"ok": True, "keys": sorted(meta_keys)}, "startup_after": {}, "samples": []}
    samples = [{"t": 0.1 * k, "port": 1, "num_running_reqs": held, "num_queue_reqs": 0.0,
                "prefill_tokens_total": 100.0, "num_requests_total": 8.0, "decode_tokens_total": 10.0 * k,
                "decode_passes_total": float(k)} for k in range(30)]
    window = {"running": {"median": held, "min": held, "max": held, "mean": held}, "samples": 30,
              "duration_s": 3.0, "decode_tok_s": None, "evidence": None,
              "occupancy": exact_occupancy(samples, concurrency, 0.98, 20),
              "sources": {rule: {"passed": True, "detail": "held"}
                          for rule in ("conservation", "counters_up", "no_foreign_requests")}}
    return evidence, window


def point_expectation(n: int, isl: int, osl: int, concurrency: int, startup_time: float | None = 1.0):
    from dsv4kit.bench.gates import PointExpectation

    return PointExpectation(n, isl, osl, concurrency, startup_time, max_running_requests=256,
                            max_total_num_tokens=1_000_000)


def served_software(indexer: str = "1", *, configured: str = "auto") -> dict:
    """``software.kernel_*`` as the probe leaves them when the decode server's environment was read:
    the inventory says ``configured`` for both flags, the server ran with INDEXER=``indexer``."""
    flags = {"SGLANG_SM120_MMA_ATTENTION": "0", "SGLANG_SM120_TRITON_INDEXER": indexer}
    return {"kernel_flags": flags, "kernel_flags_reason": None,
            "kernel_flags_servers": {"decode": {"flags": flags, "source": "/proc/4242/environ", "reason": None}},
            "kernel_flags_configured": {name: configured for name in flags},
            "server_env": {"SGLANG_SM120_TRITON_INDEXER": indexer, "NCCL_P2P_DISABLE": "1"}}


def synthetic_record(run_id: str, decode: dict, *, context_length: int = 4096, isl: int = 16, osl: int = 8,
                     gpu_model="NVIDIA RTX PRO 6000 Blackwell", invalid: tuple = (), host: str = "lo",
                     indexer: str = "1") -> dict:
    """A schema-valid record whose decode tok/s per concurrency and repetition is ``decode[C][r]``.

    ``invalid`` lists (C, repetition) points to mark as failing a gate.
    """
    from dsv4kit.bench.gates import GateConfig, evaluate
    from dsv4kit.records.record import KIND, SCHEMA_VERSION, comparability_key, derive, split_client_line, summarize_points

    points = []
    for c, values in sorted(decode.items()):
        for rep, value in enumerate(values):
            line = client_line(n=8, isl=isl, osl=osl, concurrency=c, tpot_ms=c * 1000.0 / value,
                               error_chunks=2 if (c, rep) in invalid else 0)
            raw, _details, _ = split_client_line(line)
            evidence, window = good_evidence(c)
            window["decode_tok_s"] = value
            validity = evaluate(line, point_expectation(8, isl, osl, c), GateConfig(), evidence, window)
            points.append({"max_concurrency": c, "repetition": rep, "num_prompts": 8, "raw": raw,
                           "derived": derive(raw, 8, window), "validity": validity, "window": window,
                           "details_file": f"details/c{c}_r{rep}.json.gz"})
    stamp = run_id.rsplit("-", 1)[-1]
    record = {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "run_id": run_id,
        "tag": f"bench/{host}/{context_length}/{stamp}", "created_at_utc": "2026-01-01T00:00:00+00:00",
        "duration_wall_s": 1.0, "toolkit": {"version": "0.1.0", "git_commit": "abc", "git_dirty": False},
        "host": {"name": host}, "gpus": {"model": gpu_model, "count": 8, "serving_count": 8, "driver": "580.1"},
        "software": {"sglang_version": "0.5.23", **served_software(indexer)},
        "model": {"name": "DeepSeek-V4-Flash", "revision": "r1"},
        "server": {"context_length": context_length, "launch_args_sha256": "x"},
        "client": {"tool": "sglang.benchmark.serving", "tool_version": "0.5.23", "backend": "sglang",
                   "dataset": {"name": "random-ids", "input_len": isl, "output_len": osl, "range_ratio": 1.0},
                   "seed": 42, "tokenize_prompt": True, "num_prompts": {str(c): 8 for c in decode},
                   "warmup_requests": {str(c): max(c, 8) for c in decode}},
        "sweep": {"concurrency": sorted(decode), "repeat": max(len(v) for v in decode.values()),
                  "gates": GateConfig().to_dict()},
        "points": points, "summary": summarize_points(points),
        "validity_passed": all(p["validity"]["passed"] for p in points),
        "invalid_points": sum(not p["validity"]["passed"] for p in points), "notes": [],
    }
    record["comparability_key"] = comparability_key(record)
    return record


def publish_record(repo: Path, record: dict) -> None:
    """Put a (synthetic) record into a results repository the way ``dsv4kit bench`` does."""
    from dsv4kit.records.record import dumps
    from dsv4kit.records.results_repo import publish

    publish(repo, run_id=record["run_id"], tag=record["tag"],
            files={f"records/{record['run_id']}/record.json": dumps(record).encode()}, message=f"bench {record['run_id']}")


class ForeignLoad:
    """A second client loading the stand-in: ``n`` streamed ``/generate`` requests of ``tokens``
    new tokens each, in threads, started at once or when the server's ``flush_count`` passes
    ``after_flushes`` (the bench client flushes right before its measured run)."""

    def __init__(self, server: FakeServer, n: int, tokens: int, after_flushes: int | None = None):
        import threading

        self.server, self.n, self.tokens, self.after = server, n, tokens, after_flushes
        self.threads = [threading.Thread(target=self._one, args=(i,), daemon=True) for i in range(n)]
        self.trigger = threading.Thread(target=self._start_all, daemon=True)
        self.errors: list[str] = []
        self.stopped = threading.Event()

    def stop(self) -> None:
        """Hang up every request (the stand-in ends them at its next token) and wait for them."""
        self.stopped.set()
        self.join()

    def _one(self, i: int) -> None:
        body = json.dumps({"input_ids": [1, 2, 3, 4], "stream": True,
                           "sampling_params": {"max_new_tokens": self.tokens, "ignore_eos": True}}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.server.port}/generate", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                for _ in response:
                    if self.stopped.is_set():
                        break  # closing the connection ends the request on the server
        except Exception as exc:  # the test asserts on the bench, not on this load
            self.errors.append(str(exc))

    def _start_all(self) -> None:
        if self.after is not None:
            deadline = time.monotonic() + 600
            while self.server.stats()["flush_count"] <= self.after and time.monotonic() < deadline:
                time.sleep(0.02)
        for thread in self.threads:
            thread.start()

    def start(self) -> "ForeignLoad":
        self.trigger.start()
        return self

    def running(self) -> bool:
        return any(t.is_alive() for t in self.threads) or self.trigger.is_alive()

    def join(self, timeout: float = 120) -> None:
        self.trigger.join(timeout)
        for thread in self.threads:
            if thread.ident is not None:
                thread.join(timeout)


@contextlib.contextmanager
def cli_running(*args: str, stdout=subprocess.PIPE, timeout: float = 300):
    """``python -m dsv4kit.cli ARGS`` started in the background (stderr a pipe, text) for a test that
    acts while it runs; killed when the block is left, and after ``timeout`` s by a watchdog, so a
    silent hang also ends a loop over its stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "dsv4kit.cli", *args], stdout=stdout, stderr=subprocess.PIPE,
                            text=True, cwd=HERE.parent)
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        yield proc
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()


def in_process_sweep(inventory, progress=None, **cfg_kw):
    """``run_sweep`` in this process over the inventory's loopback box (the real client runs there):
    ``(record, progress lines)``. ``progress(line)`` sees each line as it comes, so a test can
    reshape the stand-in between points; ``cfg_kw`` are ``SweepConfig`` fields (small defaults)."""
    from dsv4kit.bench.sweep import SweepConfig, run_sweep
    from dsv4kit.core.inventory import load_inventory
    from dsv4kit.core.ssh import open_session

    host = load_inventory(inventory).host()
    restart_units = cfg_kw.pop("restart_units", None)
    gates = cfg_kw.pop("gates", None)
    cfg = SweepConfig(**{"context_length": 4096, "input_len": 16, "output_len": 64, "metrics_interval_s": 0.02,
                         **({"gates": gates} if gates else {}), **cfg_kw})
    lines = []

    def say(line):
        lines.append(line)
        if progress:
            progress(line)

    with open_session(host) as session:
        result = run_sweep(cfg, host=host, session=session, inventory_path=inventory, progress=say,
                           restart_units=restart_units)
    return result.record, lines
