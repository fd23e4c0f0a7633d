"""Would an fp8 x fp8 QKᵀ keep the sparse-MLA decode within its 1e-2 bar? (CPU, float32 maths.)

``python -m dsv4kit.validation.attention_fp8_q --json PATH`` / ``--render PATH``

K's 448 nope dims are e4m3 already (with power-of-two tile scales), so an fp8 QKᵀ only needs q
in e4m3: per (token, head, 64-dim tile) ``q8 = e4m3(q / s) * s`` with ``s = amax / 448`` (``tile``),
the same rounded up to a power of two (``tile_pow2``) or one scale per (token, head)
(``head``); the rope dims stay bf16. ``hi_lo`` keeps q as an e4m3 pair ``q8 + e4m3(q - q8)``
(two fp8 MMAs: the bf16 MMA's cost again). Every other step is the float32 reference, so the
``rel`` column is the error an fp8 QKᵀ adds by itself, against the kernel's bar of 1e-2.
"""

from __future__ import annotations

import json
import sys

from dsv4kit.validation import bench_cli

REL_BAR = 1e-2
CASES = [  # (kind, T, seq_len, extra width)
    ("c4", 8, 131072, 512),
    ("c4", 4, 300, 512),
    ("c128", 4, 131072, 8256),
]
MODES = ("tile", "tile_pow2", "head", "hi_lo")


def quantise_q(q, mode: str):
    """q ``[T, 1, H, 512]`` with its nope dims passed through e4m3 as ``mode`` says (float32)."""
    import torch

    q = q.float()
    nope = q[..., :448].reshape(*q.shape[:3], 7, 64)

    def e4m3(x, per_head: bool, pow2: bool):
        dims = (-1, -2) if per_head else (-1,)
        amax = x.abs().amax(dim=dims, keepdim=True).clamp_min(1e-30)
        scale = amax / 448.0
        if pow2:
            scale = torch.exp2(torch.ceil(torch.log2(scale)))
        return (x / scale).to(torch.float8_e4m3fn).float() * scale

    if mode == "tile":
        q8 = e4m3(nope, False, False)
    elif mode == "tile_pow2":
        q8 = e4m3(nope, False, True)
    elif mode == "head":
        q8 = e4m3(nope, True, False)
    elif mode == "hi_lo":
        hi = e4m3(nope, False, False)
        q8 = hi + e4m3(nope - hi, False, False)
    else:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    out = q.clone()
    out[..., :448] = q8.reshape(*q.shape[:3], 448)
    return out


def run(cases=CASES, heads: int = 64) -> dict:
    import torch

    from dsv4kit.kernels.sparse_mla_reference import compare, make_inputs, sparse_mla_reference

    rows = []
    for kind, T, seq_len, width in cases:
        inputs = make_inputs(T=T, heads=heads, padded_heads=heads, swa_page_size=256, extra=kind,
                             extra_width=width, seq_lens=[seq_len] * T, nan_padding=False, strided_q=False,
                             unique_slots=True, seed=1)
        kw = inputs.kwargs
        ref, _ = sparse_mla_reference(**kw)
        for mode in MODES:
            out, _ = sparse_mla_reference(**{**kw, "q": quantise_q(kw["q"], mode)})
            rel = compare(out, ref, heads)["rel"]
            rows.append({"layer": kind, "T": T, "seq_len": seq_len, "H": heads, "mode": mode, "rel": rel,
                         "within_bar": rel <= REL_BAR})
    return {"schema": 1, "kind": "dsv4kit-attention-fp8-q", "command": "python -m dsv4kit.validation.attention_fp8_q",
            "torch": torch.__version__, "bar": REL_BAR, "rows": rows}


def table(result: dict) -> str:
    lines = ["| layer | T | seq_len | q for QKᵀ | rel vs float32 reference | within 1e-2 |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['layer']} | {r['T']} | {r['seq_len']} | {r['mode']} | {r['rel']:.1e} | "
                     f"{'yes' if r['within_bar'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = bench_cli.new_parser("attention_fp8_q",
                                  description="Accuracy of an fp8 (e4m3) q in QK^T against the 1e-2 bar (CPU).")
    parser.add_argument("--json", default=None, help="write the result JSON here")
    parser.add_argument("--render", metavar="JSON", default=None, help="print the table of a result JSON and exit")
    args = parser.parse_args(argv)
    if args.render:
        return bench_cli.render_file(args.render, table)
    result = run()
    text = table(result)
    print(text, end="")
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
