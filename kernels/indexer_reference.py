"""References for the indexer kernel, and the input generator every check shares.

* ``fallback_logits``: the O(max_context) torch fallback with the semantics of SGLang 0.5.23's
  ``fp8_paged_mqa_logits_torch_sm120`` (docs/sglang-contract.md §2.5): it gathers all ``P`` pages of every row,
  scores them with a bf16 ``bmm`` (each per-head dot rounded to bf16, relu in bf16), then applies
  the weights, head sum and ``s_k`` in fp32 and writes ``-inf`` at ``t >= L``. This is the
  "before" of the benchmark.
* ``exact_logits_f64``: the same maths in float64 on ``[0, L)``, ``-inf`` beyond.
* ``make_indexer_inputs``: the real 8448-byte page layout (docs/sglang-contract.md §2.3).

Byte layout of a page: 64 x 128 fp8 e4m3fn K values (token-major) at bytes ``[0, 8192)``, then 64
fp32 scales ``s_k = max(amax|k|, 1e-4) / 448`` at bytes ``[8192, 8448)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

PAGE_SIZE = 64
HEAD_DIM = 128
PAGE_BYTES = PAGE_SIZE * (HEAD_DIM + 4)
SCALE_OFFSET = PAGE_SIZE * HEAD_DIM
FP8_MAX = 448.0
INDEX_WEIGHT_SCALE = 128 ** -0.5 * 64 ** -0.5


def _split_pages(kvcache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 pool -> (fp8 values [num_pages, 64, 128], fp32 scales [num_pages, 64]) views."""
    flat = kvcache.reshape(kvcache.shape[0], PAGE_BYTES)
    values = flat[:, :SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn)
    scales = flat[:, SCALE_OFFSET:].contiguous().view(torch.float32)
    return values.view(-1, PAGE_SIZE, HEAD_DIM), scales.view(-1, PAGE_SIZE)


def _lengths_1d(seq_lens: torch.Tensor) -> torch.Tensor:
    return seq_lens.reshape(-1) if seq_lens.dim() == 2 else seq_lens


def fallback_logits(q_fp8, kvcache, weight, seq_lens, page_table, deep_gemm_metadata,
                    max_seq_len, clean_logits=False, row_chunk: Optional[int] = None):
    """O(B * max_seq_len) torch fallback with bf16 per-head scores (SGLang's sm_120 semantics).

    ``row_chunk`` bounds memory by scoring that many rows at a time (the result is identical:
    rows are independent). SGLang itself chunks at 1024 rows.
    """
    del deep_gemm_metadata
    assert not clean_logits
    batch = q_fp8.shape[0]
    chunk = row_chunk or 1024
    if batch > chunk:
        return torch.cat([
            fallback_logits(q_fp8[i:i + chunk], kvcache, weight[i:i + chunk], seq_lens[i:i + chunk],
                            page_table[i:i + chunk], None, max_seq_len, row_chunk=chunk)
            for i in range(0, batch, chunk)
        ])
    lengths = _lengths_1d(seq_lens)
    pages = -(-max_seq_len // PAGE_SIZE)
    padded = pages * PAGE_SIZE
    flat = kvcache.reshape(kvcache.shape[0], PAGE_BYTES)
    gathered = flat[page_table[:, :pages].long()]  # every page of every row, stale ones too
    k = gathered[..., :SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn)
    k = k.to(torch.bfloat16).view(batch, padded, HEAD_DIM)
    s_k = gathered[..., SCALE_OFFSET:].contiguous().view(torch.float32).view(batch, padded)
    q = q_fp8[:, 0].to(torch.bfloat16)  # [B, H, D]
    scores = torch.relu(torch.bmm(k, q.transpose(1, 2)))  # bf16 [B, padded, H]
    logits_full = (scores * weight.unsqueeze(1)).sum(dim=2) * s_k  # fp32
    logits = logits_full.new_full((batch, max_seq_len), float("-inf"))
    width = min(padded, max_seq_len)
    logits[:, :width] = logits_full[:, :width]
    positions = torch.arange(max_seq_len, device=logits.device)
    logits.masked_fill_(positions.unsqueeze(0) >= lengths.unsqueeze(1), float("-inf"))
    return logits


def exact_logits_f64(q_fp8, kvcache, weight, seq_lens, page_table, max_seq_len):
    """float64 logits on ``[0, L)`` of each row (only pages < ceil(L/64) are read), -inf beyond."""
    values, scales = _split_pages(kvcache)
    lengths = _lengths_1d(seq_lens).long().clamp(0, max_seq_len).tolist()
    out = torch.full((q_fp8.shape[0], max_seq_len), float("-inf"), dtype=torch.float64,
                     device=q_fp8.device)
    for b, length in enumerate(lengths):
        if length == 0:
            continue
        n_pages = -(-length // PAGE_SIZE)
        ids = page_table[b, :n_pages].long()
        k = values[ids].to(torch.float64).reshape(-1, HEAD_DIM)[:length]
        s_k = scales[ids].to(torch.float64).reshape(-1)[:length]
        q = q_fp8[b, 0].to(torch.float64)  # [H, D]
        dots = torch.relu(k @ q.T)  # [L, H]
        out[b, :length] = (dots @ weight[b].to(torch.float64)) * s_k
    return out


@dataclass
class IndexerInputs:
    q_fp8: torch.Tensor  # [B, 1, H, 128] fp8
    kvcache: torch.Tensor  # [num_pages, 64, 1, 132] uint8
    weight: torch.Tensor  # [B, H] fp32
    seq_lens: torch.Tensor  # [B] int32 (or [B, 1])
    page_table: torch.Tensor  # [B, P] int32
    max_seq_len: int

    def args(self):
        """The eight positional arguments of the SGLang signature."""
        return (self.q_fp8, self.kvcache, self.weight, self.seq_lens, self.page_table, None,
                self.max_seq_len, False)


def edge_lengths(batch: int, max_len: int, generator: torch.Generator) -> list[int]:
    """Lengths covering 0, 1, page boundaries, exact multiples and max_len, then random ones."""
    fixed = [max_len, 0, (max_len // PAGE_SIZE) * PAGE_SIZE, 1, PAGE_SIZE - 1, PAGE_SIZE,
             PAGE_SIZE + 1, max(max_len - 1, 0)]
    lengths = [min(x, max_len) for x in fixed[:batch]]
    while len(lengths) < batch:
        lengths.append(int(torch.randint(0, max_len + 1, (1,), generator=generator)))
    return lengths


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row fp8 e4m3 quantisation as SGLang's writers do: s = max(amax, 1e-4) / 448."""
    scale = x.abs().amax(dim=-1).clamp_min(1e-4) / FP8_MAX
    return (x / scale.unsqueeze(-1)).to(torch.float8_e4m3fn), scale.float()


def _pool_and_queries(num_pages: int, batch: int, heads: int, gen: torch.Generator, device):
    """The shared part of both input generators, in this order from ``gen``: a pool of
    ``num_pages`` quantised key pages, ``batch`` rows of fp8 queries with their weights, and a
    permutation of the pool for the page tables."""
    # Keys: Hadamard-rotated values look Gaussian; give each position its own magnitude.
    k = torch.randn(num_pages, PAGE_SIZE, HEAD_DIM, generator=gen, device=device)
    k *= torch.rand(num_pages, PAGE_SIZE, 1, generator=gen, device=device) * 2 + 0.1
    k8, s_k = quantize_rows(k)
    del k
    pool = torch.empty(num_pages, PAGE_BYTES, dtype=torch.uint8, device=device)
    pool[:, :SCALE_OFFSET] = k8.view(torch.uint8).reshape(num_pages, SCALE_OFFSET)
    pool[:, SCALE_OFFSET:] = s_k.contiguous().view(torch.uint8).reshape(num_pages, PAGE_SIZE * 4)
    del k8
    # Queries: quantised per head; the q scale and the softmax scales are folded into the weights.
    q = torch.randn(batch, heads, HEAD_DIM, generator=gen, device=device)
    q8, s_q = quantize_rows(q)
    w = torch.randn(batch, heads, generator=gen, device=device) * INDEX_WEIGHT_SCALE * s_q
    perm = torch.randperm(num_pages, generator=gen, device=device).to(torch.int32)
    return pool, q8, w, perm


def make_indexer_inputs(batch: int, heads: int, pages_per_row: int, max_len: int,
                        num_pages: Optional[int] = None, seed: int = 0, device="cpu",
                        lengths: Optional[list[int]] = None, stale: str = "random",
                        seq_lens_2d: bool = False) -> IndexerInputs:
    """Build inputs with SGLang's real layouts.

    ``pages_per_row`` is ``P`` (``max_seq_len = P*64``); lengths lie in ``[0, max_len]`` and include
    0 and exact page multiples (see ``edge_lengths``). Each row's live pages are distinct pool pages
    in shuffled order; entries past a row's length are ``stale``: ``"random"`` (random valid ids, as
    SGLang leaves them) or ``"invalid"`` (ids far outside the pool, which must never be read).
    """
    if max_len > pages_per_row * PAGE_SIZE:
        raise ValueError(f"max_len {max_len} exceeds P*64 = {pages_per_row * PAGE_SIZE}")
    lengths_gen = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = edge_lengths(batch, max_len, lengths_gen)
    live = [-(-n // PAGE_SIZE) for n in lengths]
    needed = sum(live)
    num_pages = num_pages or max(needed + 3, 4)
    if num_pages < needed:
        raise ValueError(f"num_pages {num_pages} < {needed} live pages")
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)  # data made where it is used
    pool, q8, w, perm = _pool_and_queries(num_pages, batch, heads, gen, device)
    if stale == "random":
        table = torch.randint(0, num_pages, (batch, pages_per_row), generator=gen, device=device,
                              dtype=torch.int32)
    elif stale == "invalid":
        table = torch.randint(2 ** 30, 2 ** 31 - 1, (batch, pages_per_row), generator=gen,
                              device=device, dtype=torch.int32)
    else:
        raise ValueError(f"stale must be 'random' or 'invalid', got {stale!r}")
    cursor = 0
    for b, n in enumerate(live):  # live entries: distinct pool pages in shuffled order
        table[b, :n] = perm[cursor:cursor + n]
        cursor += n
    seq = torch.tensor(lengths, dtype=torch.int32, device=device)
    if seq_lens_2d:
        seq = seq.unsqueeze(1)
    return IndexerInputs(
        q_fp8=q8.unsqueeze(1).contiguous(),
        kvcache=pool.view(num_pages, PAGE_SIZE, 1, HEAD_DIM + 4),
        weight=w.float().contiguous(),
        seq_lens=seq,
        page_table=table,
        max_seq_len=pages_per_row * PAGE_SIZE,
    )


TAIL_CHECKS = ("exact", "page", "none")


def compare(out: torch.Tensor, ref: torch.Tensor, seq_lens: torch.Tensor, tail: str = "exact") -> dict:
    """max|d| and rel = ||out-ref|| / ||ref|| over [0, L) of each row; exactness of the -inf pattern.

    ``pattern_ok``: every position < L is finite, and ``-inf`` at every position >= L
    (``tail="exact"``), at ``[L, ceil(L/64)*64)`` only (``"page"``: the kernel's skip policy), or
    nowhere checked (``"none"``: an implementation that leaves the tail unwritten, as TileLang).
    """
    if tail not in TAIL_CHECKS:
        raise ValueError(f"tail must be one of {TAIL_CHECKS}, got {tail!r}")
    lengths = _lengths_1d(seq_lens).long().clamp(0, out.shape[1]).to(out.device)
    positions = torch.arange(out.shape[1], device=out.device)
    valid = positions.unsqueeze(0) < lengths.unsqueeze(1)
    out64 = out.to(torch.float64)
    ref64 = ref.to(torch.float64)
    if tail == "exact":
        checked = ~valid
    elif tail == "page":
        checked = ~valid & (positions.unsqueeze(0) < ((lengths + 63) // 64 * 64).unsqueeze(1))
    else:
        checked = torch.zeros_like(valid)
    tail_ok = bool(torch.all(torch.where(checked, out64 == float("-inf"), True)))
    head_ok = bool(torch.all(torch.where(valid, torch.isfinite(out64), True)))
    diff = torch.where(valid, out64 - ref64, 0.0)
    diff = torch.nan_to_num(diff, nan=math.inf)
    ref_valid = torch.where(valid, ref64, 0.0)
    ref_norm = float(torch.linalg.vector_norm(ref_valid))
    diff_norm = float(torch.linalg.vector_norm(diff))
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    if ref_norm == 0.0:
        rel = 0.0 if diff_norm == 0.0 else math.inf
    else:
        rel = diff_norm / ref_norm
    return {"max_abs": max_abs, "rel": rel, "pattern_ok": tail_ok and head_ok,
            "compared": int(valid.sum())}


def make_prefill_inputs(requests: list[tuple[int, int]], heads: int = 64, pages_per_row: Optional[int] = None,
                        seed: int = 0, device="cpu", shared_prefix_pages: int = 0,
                        zero_rows: tuple[int, ...] = ()) -> IndexerInputs:
    """Rows as SGLang's prefill hands them to the indexer (docs/sglang-contract.md §2.8).

    ``requests`` is a list of ``(prefix_tokens, extend_tokens)``: request ``i`` contributes one row
    per extend token, row ``r`` with the causal compressed length ``(prefix + r + 1) // 4``, and
    all its rows carry the same page-table row (the request's pages, shuffled pool pages). The
    first ``shared_prefix_pages`` pages of every request are the same pool pages (a radix-cache
    prefix). ``zero_rows`` get length 0. ``max_seq_len`` is the largest length (at least 1), as
    SGLang passes it in prefill; ``P`` is the widest request's page count unless given.
    """
    lengths, owners = [], []
    for i, (prefix, extend) in enumerate(requests):
        lengths += [(prefix + r + 1) // 4 for r in range(extend)]
        owners += [i] * extend
    for r in zero_rows:
        lengths[r] = 0
    need = [-(-((prefix + extend) // 4) // PAGE_SIZE) for prefix, extend in requests]
    pages = pages_per_row or max(max(need), 1)
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    num_pages = sum(need) + 3
    batch = len(lengths)
    pool, q8, w, perm = _pool_and_queries(num_pages, batch, heads, gen, device)
    request_rows = torch.randint(0, num_pages, (len(requests), pages), generator=gen, device=device,
                                 dtype=torch.int32)  # stale entries: random valid ids
    cursor = 0
    for i, n in enumerate(need):
        n = min(n, pages)
        request_rows[i, :n] = perm[cursor:cursor + n]
        cursor += n
    if shared_prefix_pages:
        request_rows[:, :shared_prefix_pages] = request_rows[0, :shared_prefix_pages].clone()
    table = request_rows[torch.tensor(owners, device=device, dtype=torch.long)].contiguous()
    max_len = max(max(lengths), 1)
    return IndexerInputs(
        q_fp8=q8.unsqueeze(1).contiguous(),
        kvcache=pool.view(num_pages, PAGE_SIZE, 1, HEAD_DIM + 4),
        weight=w.float().contiguous(),
        seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
        page_table=table,
        max_seq_len=min(max_len, pages * PAGE_SIZE),
    )
