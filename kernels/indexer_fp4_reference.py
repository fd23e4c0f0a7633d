"""Reference and input generator for the FP4-cache indexer kernel (``dsv4kit.kernels.indexer_fp4``).

Shared by the tests, the validation harness and the benchmark.

* ``quantize_fp4`` packs rows of 128 values as SGLang 0.5.23's writers do
  (docs/sglang-contract.md §2.10): per 32-value block a ue8m0 exponent
  ``e = ceil_ue8m0(max(amax, 1e-4) / 6)``, values ``x / 2^(e-127)`` rounded to e2m1 by threshold
  (``> 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5``), two codes a byte (element ``2i`` in the low nibble).
* ``dequantize_fp4`` is its exact inverse onto float64: ``code_value * 2^(e-127)``.
* ``exact_logits_f64``: the logits in float64 on ``[0, L)`` of each row, ``-inf`` beyond, reading
  only pages ``< ceil(L/64)``::

      logit[b, t] = sum_h weights[b, h] * relu( sum_d q[b, h, d] * k[pg, o, d] )

  with ``q`` and ``k`` the dequantised vectors (block scales included).
* ``make_fp4_inputs``: the real 4352-byte page (64 slots x 64 packed bytes, then 64 x 4 exponent
  bytes), shuffled page tables, stale entries past each length, the eight SGLang arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dsv4kit.kernels.indexer_reference import (INDEX_WEIGHT_SCALE, compare, edge_lengths,
                                              make_prefill_inputs)

__all__ = ["compare", "dequantize_fp4", "exact_logits_f64", "make_fp4_inputs", "quantize_fp4",
           "Fp4IndexerInputs"]

PAGE_SIZE = 64
HEAD_DIM = 128
PACKED_BYTES = HEAD_DIM // 2  # 64: two e2m1 codes a byte
SCALE_BYTES = HEAD_DIM // 32  # 4: one ue8m0 exponent per 32 values
SLOT_BYTES = PACKED_BYTES + SCALE_BYTES  # 68
PAGE_BYTES = PAGE_SIZE * SLOT_BYTES  # 4352
SCALE_OFFSET = PAGE_SIZE * PACKED_BYTES  # 4096
FP4_MAX = 6.0
# Magnitudes of the e2m1 codes 0..7 (bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def ue8m0_ceil(x: torch.Tensor) -> torch.Tensor:
    """The smallest ue8m0 exponent whose power of two is >= ``x`` (fp32 bits, as SGLang rounds)."""
    bits = x.float().contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    return (exponent + ((bits & 0x7FFFFF) != 0).int()).clamp(0, 254)


def quantize_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., 128]`` -> ``(packed uint8 [..., 64], exponents uint8 [..., 4])``."""
    lead = x.shape[:-1]
    blocks = x.float().reshape(*lead, SCALE_BYTES, 32)
    exponent = ue8m0_ceil(blocks.abs().amax(-1).clamp_min(1e-4) / FP4_MAX)
    scaled = blocks / torch.pow(2.0, exponent.double() - 127).float().unsqueeze(-1)
    magnitude = scaled.abs().clamp_max(FP4_MAX)
    code = torch.zeros_like(magnitude, dtype=torch.int32)
    for threshold in _THRESHOLDS:
        code += (magnitude > threshold).int()
    code |= ((scaled < 0) & (code != 0)).int() << 3
    code = code.reshape(*lead, PACKED_BYTES, 2)
    packed = (code[..., 0] | (code[..., 1] << 4)).to(torch.uint8)
    return packed, exponent.to(torch.uint8)


def dequantize_fp4(packed: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """Exact float64 values of packed codes ``[..., 64]`` with exponents ``[..., 4]``."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float64,
                         device=packed.device)
    codes = packed.long()
    values = torch.stack([table[codes & 0xF], table[codes >> 4]], dim=-1)
    values = values.reshape(*packed.shape[:-1], HEAD_DIM)
    scale = torch.pow(2.0, exponents.double() - 127).repeat_interleave(32, dim=-1)
    return values * scale


def split_pages(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 pool -> (packed codes [num_pages, 64, 64], exponents [num_pages, 64, 4])."""
    flat = kv_cache.reshape(kv_cache.shape[0], PAGE_BYTES)
    packed = flat[:, :SCALE_OFFSET].reshape(-1, PAGE_SIZE, PACKED_BYTES)
    exponents = flat[:, SCALE_OFFSET:].reshape(-1, PAGE_SIZE, SCALE_BYTES)
    return packed, exponents


def q_values(q) -> torch.Tensor:
    """``(q_fp4 [B, 1, H, 64] int8, q_sf [B, 1, H] int32)`` -> float64 ``[B, H, 128]``."""
    q_fp4, q_sf = q
    packed = q_fp4[:, 0].contiguous().view(torch.uint8)
    exponents = q_sf[:, 0].contiguous().view(torch.uint8).reshape(*packed.shape[:2], SCALE_BYTES)
    return dequantize_fp4(packed, exponents)


def exact_logits_f64(q, kv_cache, weights, seq_lens, page_table, max_seq_len) -> torch.Tensor:
    """float64 logits on ``[0, L)`` of each row (only pages < ceil(L/64) are read), -inf beyond."""
    packed, exponents = split_pages(kv_cache)
    queries = q_values(q)
    lengths = (seq_lens.reshape(-1) if seq_lens.dim() == 2 else seq_lens)
    lengths = lengths.long().clamp(0, max_seq_len).tolist()
    out = torch.full((queries.shape[0], max_seq_len), float("-inf"), dtype=torch.float64,
                     device=queries.device)
    for b, length in enumerate(lengths):
        if length == 0:
            continue
        ids = page_table[b, :-(-length // PAGE_SIZE)].long()
        k = dequantize_fp4(packed[ids], exponents[ids]).reshape(-1, HEAD_DIM)[:length]
        dots = torch.relu(k @ queries[b].T)  # [L, H]
        out[b, :length] = dots @ weights[b].double()
    return out


@dataclass
class Fp4IndexerInputs:
    q_fp4: torch.Tensor  # [B, 1, H, 64] int8, packed e2m1
    q_sf: torch.Tensor  # [B, 1, H] int32, four ue8m0 exponents (byte i: block i)
    kv_cache: torch.Tensor  # [num_pages, 64, 1, 68] uint8
    weights: torch.Tensor  # [B, H] fp32
    seq_lens: torch.Tensor  # [B] or [B, 1] int32
    page_table: torch.Tensor  # [B, P] int32
    max_seq_len: int

    @property
    def q(self) -> tuple:
        return (self.q_fp4, self.q_sf)

    def args(self) -> tuple:
        """The eight positional arguments of DeepGEMM's ``fp8_fp4_paged_mqa_logits`` as SGLang
        0.5.23 passes them."""
        return (self.q, self.kv_cache, self.weights, self.seq_lens, self.page_table, None,
                self.max_seq_len, False)

    def exact(self) -> torch.Tensor:
        return exact_logits_f64(self.q, self.kv_cache, self.weights, self.seq_lens,
                                self.page_table, self.max_seq_len)


def pack_pool(packed: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """``packed [N, 64, 64]`` and ``exponents [N, 64, 4]`` -> the uint8 pool ``[N, 64, 1, 68]``."""
    num_pages = packed.shape[0]
    pool = torch.empty(num_pages, PAGE_BYTES, dtype=torch.uint8, device=packed.device)
    pool[:, :SCALE_OFFSET] = packed.reshape(num_pages, SCALE_OFFSET)
    pool[:, SCALE_OFFSET:] = exponents.reshape(num_pages, PAGE_SIZE * SCALE_BYTES)
    return pool.view(num_pages, PAGE_SIZE, 1, SLOT_BYTES)


def pack_q(packed: torch.Tensor, exponents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``packed [B, H, 64]`` and ``exponents [B, H, 4]`` -> ``(q_fp4 [B,1,H,64] int8, q_sf [B,1,H] int32)``."""
    q_fp4 = packed.view(torch.int8).unsqueeze(1).contiguous()
    q_sf = exponents.contiguous().view(torch.int32).reshape(packed.shape[0], 1, packed.shape[1])
    return q_fp4, q_sf.contiguous()


def make_fp4_inputs(batch: int, heads: int, pages_per_row: int, max_len: int,
                    num_pages: Optional[int] = None, seed: int = 0, device="cpu",
                    lengths: Optional[list[int]] = None, stale: str = "random",
                    seq_lens_2d: bool = False, live_pages: str = "distinct") -> Fp4IndexerInputs:
    """Inputs with SGLang's FP4 layouts.

    ``pages_per_row`` is ``P`` (``max_seq_len = P*64``); lengths include 0, 1, page edges and
    ``max_len`` (``indexer_reference.edge_lengths``) unless given. Live pages are distinct pool
    pages in shuffled order (``live_pages="distinct"``) or drawn with repeats from a few pages
    (``"repeated"``: one page id may back several positions of a row and several rows). Entries
    past a row's length are ``stale``: ``"random"`` valid ids or ``"invalid"`` ids far outside
    the pool, which must never be read.
    """
    if max_len > pages_per_row * PAGE_SIZE:
        raise ValueError(f"max_len {max_len} exceeds P*64 = {pages_per_row * PAGE_SIZE}")
    if lengths is None:
        lengths = edge_lengths(batch, max_len, torch.Generator().manual_seed(seed))
    live = [-(-n // PAGE_SIZE) for n in lengths]
    needed = sum(live) if live_pages == "distinct" else 1
    num_pages = num_pages or max(needed + 3, 4)
    if num_pages < needed:
        raise ValueError(f"num_pages {num_pages} < {needed} live pages")
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    # Hadamard-rotated keys look Gaussian; each position gets its own magnitude.
    k = torch.randn(num_pages, PAGE_SIZE, HEAD_DIM, generator=gen, device=device)
    k *= torch.rand(num_pages, PAGE_SIZE, 1, generator=gen, device=device) * 2 + 0.1
    kv_cache = pack_pool(*quantize_fp4(k))
    del k
    q = torch.randn(batch, heads, HEAD_DIM, generator=gen, device=device)
    q_fp4, q_sf = pack_q(*quantize_fp4(q))
    weights = (torch.randn(batch, heads, generator=gen, device=device)
               * INDEX_WEIGHT_SCALE).float().contiguous()

    if stale == "random":
        table = torch.randint(0, num_pages, (batch, pages_per_row), generator=gen, device=device,
                              dtype=torch.int32)
    elif stale == "invalid":
        table = torch.randint(2 ** 30, 2 ** 31 - 1, (batch, pages_per_row), generator=gen,
                              device=device, dtype=torch.int32)
    else:
        raise ValueError(f"stale must be 'random' or 'invalid', got {stale!r}")
    if live_pages == "distinct":
        perm = torch.randperm(num_pages, generator=gen, device=device).to(torch.int32)
        cursor = 0
        for b, n in enumerate(live):
            table[b, :n] = perm[cursor:cursor + n]
            cursor += n
    elif live_pages == "repeated":
        few = max(1, min(3, num_pages))
        for b, n in enumerate(live):
            table[b, :n] = torch.randint(0, few, (n,), generator=gen, device=device,
                                         dtype=torch.int32)
    else:
        raise ValueError(f"live_pages must be 'distinct' or 'repeated', got {live_pages!r}")
    seq = torch.tensor(lengths, dtype=torch.int32, device=device)
    if seq_lens_2d:
        seq = seq.unsqueeze(1)
    return Fp4IndexerInputs(q_fp4, q_sf, kv_cache, weights, seq, table, pages_per_row * PAGE_SIZE)


def make_fp4_prefill_inputs(requests: list[tuple[int, int]], heads: int = 64, seed: int = 0,
                            device="cpu", shared_prefix_pages: int = 0,
                            zero_rows: tuple[int, ...] = ()) -> Fp4IndexerInputs:
    """Prefill-shaped rows over an FP4 pool: lengths, page table and ``max_seq_len`` exactly as
    ``indexer_reference.make_prefill_inputs`` makes them (causal lengths, one shared page-table
    row a request), keys, queries and weights drawn for the FP4 layouts."""
    rows = make_prefill_inputs(requests, 1, seed=seed, device=device,
                               shared_prefix_pages=shared_prefix_pages, zero_rows=zero_rows)
    num_pages, batch = rows.kvcache.shape[0], rows.q_fp8.shape[0]
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    k = torch.randn(num_pages, PAGE_SIZE, HEAD_DIM, generator=gen, device=device)
    k *= torch.rand(num_pages, PAGE_SIZE, 1, generator=gen, device=device) * 2 + 0.1
    kv_cache = pack_pool(*quantize_fp4(k))
    del k
    q_fp4, q_sf = pack_q(*quantize_fp4(torch.randn(batch, heads, HEAD_DIM, generator=gen,
                                                   device=device)))
    weights = (torch.randn(batch, heads, generator=gen, device=device)
               * INDEX_WEIGHT_SCALE).float().contiguous()
    return Fp4IndexerInputs(q_fp4, q_sf, kv_cache, weights, rows.seq_lens, rows.page_table,
                            rows.max_seq_len)
