"""The stand-in server's ``/start_profile`` and ``/stop_profile``, as SGLang 0.5.23 serves them.

Request body: SGLang's ``ProfileReq`` fields (``output_dir``, ``start_step``, ``num_steps``,
``activities``, ``profile_by_stage``, ``with_stack``, ``record_shapes``, ``profile_id``,
``merge_profiles``, ``profile_prefix``, ``profile_stages``, ``detailed_annotations``); unknown
fields are ignored and a value of the wrong type is a 400 in SGLang's error shape. Behaviour:

* ``/start_profile`` answers ``200 Start profiling.`` at once. With ``num_steps`` the profile
  stops by itself after that many steps; without it, it runs until ``/stop_profile``. A start
  while a profile runs is a 500 (SGLang's handler raises on the scheduler's failure message).
* ``/stop_profile`` when nothing runs is a 500 as well; otherwise ``200 Stop profiling...``.
* Each "rank" (``tp_size`` of ``/server_info``) writes a REAL torch-profiler Chrome trace (CPU
  activity, the way the real rank's would be were it on a CPU) named as SGLang's profiler mixin
  does: ``[<profile_prefix>-]<profile_id>-TP-<rank>.trace.json.gz`` in ``output_dir``. Each step
  is a ``step[DECODE bs=N]`` span (SGLang's model-runner span) around real torch ops: a dense
  matmul, elementwise glue, a copy, a top-k, an op no class knows (``aten::fft_r2c``), and a
  function named like SGLang's torch indexer fallback whose cost grows with the configured
  context length (``context_length``), the trap the context-tax flag is for.

``--no-profiler`` makes both endpoints 404 (a server without them). The state is in
``/_test/profiler``.
"""

from __future__ import annotations

import json
import os
import threading
import time

FIELDS = {"output_dir": str, "start_step": int, "num_steps": int, "activities": list, "profile_by_stage": bool,
          "with_stack": bool, "record_shapes": bool, "profile_id": str, "merge_profiles": bool,
          "profile_prefix": str, "profile_stages": list, "detailed_annotations": bool}


def _bad_request(message: str):
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return 400, "application/json", json.dumps(body).encode()


def _text(status: int, text: str):
    return status, "text/plain; charset=utf-8", text.encode()


def fp8_paged_mqa_logits_torch_sm120(torch, batch: int, context_length: int):
    """What the torch fallback does: score every position of the configured context, every step."""
    # Every position of the context, whatever the request's length; wide enough that its cost is
    # set by the context length, not by the per-op overhead of a loaded 2-core machine.
    k = torch.ones(batch, context_length, 128)
    q = torch.ones(batch, 128, 512)
    scores = torch.bmm(k, q).clamp_min(0)
    return scores.sum(-1)


class FakeProfiler:
    def __init__(self, state, enabled: bool = True):
        self.state = state
        self.enabled = enabled
        self.lock = threading.Lock()
        self.running = False
        self.stop_event = threading.Event()
        self.thread = None
        self.starts = 0
        self.stops = 0
        self.written: list[str] = []
        self.last_request: dict = {}

    def stats(self) -> dict:
        with self.lock:
            return {"enabled": self.enabled, "profiling": self.running, "starts": self.starts,
                    "stops": self.stops, "written": list(self.written), "last_request": dict(self.last_request)}

    def handle(self, path: str, raw: bytes):
        """(status, content type, body) for the profiler paths; None for any other path."""
        if path == "/_test/profiler":
            return 200, "application/json", json.dumps(self.stats()).encode()
        if path not in ("/start_profile", "/stop_profile"):
            return None
        if not self.enabled:
            return 404, "application/json", json.dumps({"detail": "Not Found"}).encode()
        if path == "/stop_profile":
            with self.lock:
                if not self.running:
                    return _text(500, "Internal Server Error")
            self.stop_event.set()
            self.thread.join(timeout=60)
            return _text(200, "Stop profiling. This will take some time.\n")
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            return _bad_request(f"JSON decode error: {exc}")
        req = {}
        for name, kind in FIELDS.items():
            value = body.get(name)
            if value is None:
                req[name] = None
                continue
            if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)  # pydantic's lax mode
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                return _bad_request(f"1 validation error for ProfileReq\n{name}\n  Input should be a valid "
                                    f"{kind.__name__}, got {value!r}")
            req[name] = value
        with self.lock:
            if self.running:
                return _text(500, "Internal Server Error")  # "Profiling is already in progress."
            self.running = True
            self.starts += 1
            self.last_request = dict(req)
            self.stop_event.clear()
        profile_id = req["profile_id"] or str(time.time())
        self.thread = threading.Thread(target=self._profile, args=(req, profile_id), daemon=True)
        self.thread.start()
        return _text(200, "Start profiling.\n")

    def _profile(self, req: dict, profile_id: str) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        # One intra-op thread: on a loaded machine a multi-threaded op waits for its slowest thread,
        # noise out of proportion to the op's work (the context-tax test's ratio fell to 4 from 16).
        torch.set_num_threads(1)
        try:
            out_dir = req["output_dir"] or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
            os.makedirs(out_dir, exist_ok=True)
            prefix = f"{req['profile_prefix']}-" if req["profile_prefix"] else ""
            steps = req["num_steps"]
            with self.state.lock:
                ranks = int(self.state.server_info().get("tp_size") or 1)
                context_length = self.state.context_length
                delay = self.state.token_delay_ms / 1000.0
            with_stack = req["with_stack"] is not False
            profilers = []
            for _ in range(ranks):
                p = profile(activities=[ProfilerActivity.CPU], with_stack=with_stack,
                            record_shapes=bool(req["record_shapes"]))
                profilers.append(p)
            with self.state.lock:  # every rank runs the same batch, as the TP ranks of one server do
                batch = max(self.state.running, 1)
            done = 0
            a = torch.ones(64, 64)
            for p in profilers:
                p.start()
                done = 0
                while (steps is None or steps <= 0 or done < steps) and not self.stop_event.is_set():
                    if steps is not None and steps < 0:
                        break
                    with record_function(f"step[DECODE bs={batch}]"):
                        b = a @ a
                        (b * 2.0 + 1.0).sum()
                        b.clone()
                        torch.topk(b[0], 4)
                        torch.fft.rfft(b[0])
                        fp8_paged_mqa_logits_torch_sm120(torch, batch, context_length)
                    done += 1
                    time.sleep(delay)
                p.stop()
            for rank, p in enumerate(profilers):
                path = os.path.join(out_dir, f"{prefix}{profile_id}-TP-{rank}.trace.json.gz")
                p.export_chrome_trace(path)
                self.written.append(path)
        finally:
            with self.lock:
                self.running = False
                self.stops += 1
