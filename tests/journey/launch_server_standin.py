"""``python -m sglang.launch_server`` on the simulated box: SGLang 0.5.23's own parser first, then serve.

The argv is parsed with ``sglang.srt.server_args.prepare_server_args`` from the cached 0.5.23 wheel
(its site directory is on ``PYTHONPATH``): what SGLang rejects exits 2 with SGLang's own message,
before anything listens. What it accepts is served by tests/fake_sglang_server.py on the parsed
host and port, and ``/server_info`` reports the parsed values (mode, CUDA-graph batch, API key).
A ``--disaggregation-mode prefill`` server answers ``/generate`` as a PD prefill worker does: the
prompt only (one token, never streamed), whatever the request asked, one prompt at a time and
:data:`PREFILL_MS` each (a prefill server is busy with one long prompt's chunks at a time); the
decode worker streams.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # fake_sglang_server's own imports (after the stdlib)


def main(argv: list[str]) -> int:
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(argv)  # SystemExit(2) on what SGLang rejects
    from tests import fake_sglang_server as fake

    parsed = {"disaggregation_mode": args.disaggregation_mode, "cuda_graph_max_bs_decode": args.cuda_graph_max_bs_decode,
              "tp_size": args.tp_size, "port": args.port, "host": args.host, "api_key": args.api_key,
              "mem_fraction_static": args.mem_fraction_static,
              "speculative_algorithm": args.speculative_algorithm,
              # the chat API: the name /v1/models lists and the parsers the health wait checks
              "served_model_name": args.served_model_name, "tool_call_parser": args.tool_call_parser,
              "reasoning_parser": args.reasoning_parser,
              "launch_command": args.launch_command}  # SGLang's own record of the argv it was given
    plain = fake.State.server_info
    fake.State.server_info = lambda self: {**plain(self), **parsed}
    if args.disaggregation_mode == "prefill":
        _prefill_only(fake)
    if args.api_key:
        _require_key(fake, args.api_key)
    # With a drafter, the fake's own acceptance: its /metrics, /server_info and tokens per forward pass.
    accept = ["--spec-accept-length", str(_accept_length(args))] if args.speculative_algorithm else []
    return fake.main(["--port", str(args.port), "--model-path", args.model_path, *accept,
                      "--disaggregation-mode", args.disaggregation_mode,  # PD's series on /metrics
                      "--served-model-name", args.served_model_name or args.model_path,
                      # its gauges rewritten on the unit's cadence (SGLang's default 40), as /server_info says
                      "--gauge-refresh-passes", str(args.decode_log_interval),
                      "--context-length", str(args.context_length),
                      "--max-running-requests", str(args.max_running_requests or 256),
                      # and holds to it: requests beyond it queue, as SGLang's scheduler makes them
                      "--decode-cap", str(args.max_running_requests or 256),
                      # A KV pool that holds the quickstart's sweep (64 x 128K tokens), as the doc's
                      # box is expected to; the kv_capacity gate reads it from /server_info.
                      "--max-total-num-tokens", str(MAX_TOTAL_NUM_TOKENS),
                      # A decode step of 8 ms alone, 17 ms with 16 running and 44 ms with 64 (at 128K
                      # the step's KV reads grow with the batch). Each wave of a point must hold exact
                      # occupancy over half its decode phase (the bench's share rule) while its ramp
                      # is not short: every point is cold (the bench flushes, then each 128K prompt
                      # prefills for 1 s) and the client sends 64 such prompts through 2 loaded cores.
                      # At 12 and 24 ms cold waves held 49 to 60% (CI failed one at 49%); at a flat
                      # 6 ms a wave held only 11 to 15 of the 20 scrapes (0.1 s apart) a window needs.
                      "--token-delay-ms", "8", "--batch-slowdown", str(4.5 / 63), "--max-lifetime", "3600"])


MAX_TOTAL_NUM_TOKENS = 64 * 131072 + 65536
#: One prompt's prefill on the stand-in prefill worker. Serial: the quickstart's C=64 point waits
#: 64 of these before its last request decodes, so each wave's exact-occupancy stretch on the
#: decode server is its decode minus this ramp.
PREFILL_MS = 5
#: The KV transfer the prefill worker reports for each request it hands to decode.
KV_TRANSFER_MS = 3.0


#: The acceptance length the stand-in reports with a drafter: a healthy DSpark drafter's (about 3
#: tokens a verify step); a drafter whose config.json says ``dsv4kit_standin_accept_length`` reports
#: that (1.0: the broken drafter whose drafts are never accepted).
HEALTHY_ACCEPT_LENGTH = 3.1


def _accept_length(args) -> float:
    import json

    path = Path(args.speculative_draft_model_path or args.model_path) / "config.json"
    try:
        return float(json.loads(path.read_text()).get("dsv4kit_standin_accept_length", HEALTHY_ACCEPT_LENGTH))
    except (OSError, ValueError):
        return HEALTHY_ACCEPT_LENGTH


def _prefill_only(fake) -> None:
    """A PD prefill worker: it prefills, hands the KV to decode and answers with one token."""
    import threading
    import time

    make = fake.make_handler
    busy = threading.Lock()

    def make_handler(state):
        handler = make(state)
        generate = handler._generate

        def prefill(self, body):
            params = dict(body.get("sampling_params") or {}, max_new_tokens=1)
            with busy:
                time.sleep(PREFILL_MS / 1000.0)
            answer = generate(self, {**body, "sampling_params": params, "stream": False})
            with state.lock:  # then its KV goes to the decode worker: one transfer observed
                state.serving.transferred(KV_TRANSFER_MS)
            return answer

        handler._generate = prefill
        return handler

    fake.make_handler = make_handler


def _require_key(fake, key: str) -> None:
    """SGLang's API-key middleware: every path but /health*, /ready*, /metrics* needs the key."""
    make = fake.make_handler

    def make_handler(state):
        handler = make(state)

        def guard(method):
            def checked(self):
                path = self.path.split("?")[0]
                if not path.startswith(("/health", "/ready", "/metrics")) and \
                        self.headers.get("Authorization") != f"Bearer {key}":
                    return self._json(401, {"error": "Unauthorized"})
                return method(self)
            return checked

        handler.do_GET, handler.do_POST = guard(handler.do_GET), guard(handler.do_POST)
        return handler

    fake.make_handler = make_handler


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
