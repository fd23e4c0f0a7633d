"""How many GPUs each serving server runs on, as the server itself reports it (``/server_info``),
held against the inventory before any point runs.

SGLang 0.5.23 resolves ``tp_size``, ``pp_size``, ``dp_size`` and ``enable_dp_attention`` into its
server arguments, which ``/server_info`` returns. One server runs on ``tp_size x pp_size`` GPUs;
``dp_size`` replicas multiply that unless DP attention splits the same ``tp_size`` GPUs into
``dp_size`` attention groups. The per-GPU rates divide by the sum over the serving servers.
"""

from __future__ import annotations

from typing import Optional


def server_gpus(info: dict) -> tuple:
    """(GPUs the server runs on, how that was read) or (None, why not)."""
    tp, pp, dp = info.get("tp_size"), info.get("pp_size") or 1, info.get("dp_size") or 1
    if not isinstance(tp, int) or tp < 1:
        return None, "its /server_info reports no tp_size"
    if not isinstance(pp, int) or not isinstance(dp, int):
        return None, f"its /server_info reports pp_size {pp!r} and dp_size {dp!r}"
    replicas = 1 if info.get("enable_dp_attention") else dp
    return tp * pp * replicas, (f"tp_size {tp} x pp_size {pp}" + (f" x dp_size {dp}" if replicas > 1 else "")
                                + (f" (dp_size {dp} with DP attention)" if dp > 1 and replicas == 1 else ""))


def check(host, decode_info: dict, prefill_info: Optional[dict]) -> tuple:
    """(serving GPUs, problem): the servers' own counts summed, or the first disagreement with the
    inventory in words (the bench stops before any point)."""
    decode_gpus = list(host.get("dsv4_decode_gpus") or [])
    prefill_gpus = list(host.get("dsv4_prefill_gpus") or [])
    servers = [("decode", decode_info, len(decode_gpus) if decode_gpus else host.get("dsv4_gpu_count"),
                "dsv4_decode_gpus" if decode_gpus else "dsv4_gpu_count")]
    if prefill_info is not None:
        servers.append(("prefill", prefill_info, len(prefill_gpus) or None, "dsv4_prefill_gpus"))
    total = 0
    for role, info, expected, key in servers:
        count, how = server_gpus(info or {})
        if count is None:
            return None, f"the {role} server's GPU count cannot be read: {how}"
        if expected is not None and count != int(expected):
            return None, (f"the {role} server runs on {count} GPU(s) ({how}, from its /server_info) but the "
                          f"inventory gives it {expected} ({key}); fix the inventory or the serving units")
        total += count
    return total, None
