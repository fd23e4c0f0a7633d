"""SGLang 0.5.23's own argument pipeline, run as an sm_120 CUDA machine would run it: one process,
many command lines.

Usage: python sglang_resolve_worker.py CASES.json  (PYTHONPATH: the cached wheel's site directory)
CASES.json: {name: [argv...]}. Prints one JSON object {name: result}: ``{"ok": true, "resolved":
{field: value}}`` after ``prepare_server_args`` and ``resolve_once`` (what ``launch_server`` runs
before anything loads), or ``{"ok": false, "error": "<type>: <SGLang's message>"}``.

The machine facts come from SGLang's own override (``runtime_context.override_platform``): CUDA,
compute capability 12.0 (RTX PRO 6000 Blackwell), FlashInfer present. torchvision, which SGLang's
config package imports and a CPU torch cannot load, is tests/standins.py's stand-in.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

FIELDS = ("speculative_algorithm", "speculative_num_draft_tokens", "speculative_num_steps",
          "speculative_eagle_topk", "speculative_draft_model_path", "speculative_dspark_block_size",
          "disaggregation_mode", "tp_size", "max_running_requests", "cuda_graph_max_bs_decode", "page_size",
          "context_length", "device", "enable_deepseek_v4_fp4_indexer",
          # the OpenAI chat API
          "served_model_name", "tool_call_parser", "reasoning_parser", "chat_template")
SM120 = dict(is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False, is_sm90=False,
             is_sm100=False, is_sm100_or_sm110=False, is_sm110=False, is_sm120=True, is_blackwell=True,
             has_flashinfer=True, device_sm=120, device_capability=(12, 0))


def main(path: str) -> int:
    import logging

    import standins

    standins.install(("torchvision",))
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import prepare_server_args

    override_platform(**SM120).install()
    results = {}
    for name, argv in json.loads(Path(path).read_text()).items():
        try:
            args = prepare_server_args(list(argv) + ["--device", "cuda"])  # no probe: the platform says CUDA
            args.resolve_once()
            view = resolving_view(args)
            results[name] = {"ok": True, "resolved": {f: getattr(view, f, None) for f in FIELDS}}
        except SystemExit as exc:
            results[name] = {"ok": False, "error": f"SystemExit: {exc.code}"}
        except Exception as exc:  # SGLang's refusals are ValueError and AssertionError
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        logging.getLogger().handlers.clear()
    print("RESULTS " + json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
