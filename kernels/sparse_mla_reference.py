"""Float32 reference for DeepSeek-V4 sparse-MLA decode, the V4 KV page builder, and case inputs.

One reference shared by the tests, the validation suite and the benchmark (docs/sglang-contract.md §4.4)::

    s_j = softmax_scale * <q[b,h,0:512], kv_j[0:512]>          j over valid SWA + valid extra entries
    m   = max_j s_j
    out = sum_j e^(s_j - m) kv_j  /  (sum_j e^(s_j - m) + e^(sink_h - m))     (0 when no valid j)

An entry ``j`` of a row is valid when ``j < length`` and ``idx >= 0`` (and, defensively here as in
the kernels, ``idx < num_pages * page_size``). V = K over all 512 dims.

``KVLayout.V4`` (docs/sglang-contract.md §4.3), 584 bytes per token stored block-split in a page of
``page_bytes(ps) = ceil(ps * 584 / 576) * 576`` bytes. For slot ``i``: ``page = i // ps``,
``off = i % ps``, ``base = page * stride(0)``:

* nope: ``base + off*576 + [0, 448)``  fp8 e4m3fn, 7 tiles of 64 values;
* rope: ``base + off*576 + [448, 576)`` 64 bf16 values, unquantised;
* scales: ``base + ps*576 + off*8 + [0, 7)`` ue8m0 bytes ``e``: tile scale ``2^(e - 127)``.

The cache tensor handed to the kernels is the ``[num_pages, ps, 1, 584]`` uint8 view whose
``stride(0)`` is the page size in bytes (its ``stride(1) = 584`` is fake, as in SGLang).

Only torch is imported here, so the reference runs anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

NOPE_DIM = 448
ROPE_DIM = 64
HEAD_DIM = NOPE_DIM + ROPE_DIM  # 512
TILE = 64
NOPE_TILES = NOPE_DIM // TILE  # 7
TOKEN_DATA_BYTES = 576  # 448 fp8 + 64 bf16
TOKEN_SCALE_BYTES = 8  # 7 ue8m0 + 1 pad
TOKEN_BYTES = TOKEN_DATA_BYTES + TOKEN_SCALE_BYTES  # 584
SOFTMAX_SCALE = HEAD_DIM ** -0.5
SWA_WINDOW = 128
FP8_MAX = 448.0


def page_bytes(page_size: int) -> int:
    """Bytes of one V4 page: ``ceil(ps * 584 / 576) * 576`` (149760, 37440, 1728 for 256, 64, 2)."""
    return -(-page_size * TOKEN_BYTES // TOKEN_DATA_BYTES) * TOKEN_DATA_BYTES


# --------------------------------------------------------------------------------------------
# Page builder: float KV -> V4 bytes
# --------------------------------------------------------------------------------------------

def quantize_v4_pages(kv: torch.Tensor, page_size: int) -> torch.Tensor:
    """Quantise ``kv [num_slots, 512]`` (float) into V4 pages; returns the ``[P, ps, 1, 584]`` view.

    Slot ``i`` of the result holds ``kv[i]``. ``num_slots`` is rounded up to whole pages (the
    extra slots are zero). The per-tile scale is ``amax / 448`` rounded **up** to a power of two
    (as SGLang's writer does), stored as the ue8m0 exponent byte.
    """
    if kv.dim() != 2 or kv.shape[1] != HEAD_DIM:
        raise ValueError(f"kv must be [num_slots, {HEAD_DIM}], got {tuple(kv.shape)}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    device = kv.device
    num_slots = kv.shape[0]
    num_pages = max(1, -(-num_slots // page_size))
    pb = page_bytes(page_size)
    kv = kv.float()
    padded = torch.zeros(num_pages * page_size, HEAD_DIM, dtype=torch.float32, device=device)
    padded[:num_slots] = kv

    nope = padded[:, :NOPE_DIM].reshape(-1, NOPE_TILES, TILE)
    amax = nope.abs().amax(dim=-1).clamp_min(1e-30)
    # Smallest power of two with amax / scale <= 448.
    exponent = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-127, 127)
    scale = torch.exp2(exponent)
    nope_fp8 = (nope / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    scale_bytes = (exponent + 127).to(torch.uint8)  # [slots, 7]
    rope_bytes = padded[:, NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)  # [slots,128]

    buf = torch.zeros(num_pages, pb, dtype=torch.uint8, device=device)
    data = buf[:, : page_size * TOKEN_DATA_BYTES].view(num_pages, page_size, TOKEN_DATA_BYTES)
    data[:, :, :NOPE_DIM] = nope_fp8.reshape(num_pages, page_size, NOPE_DIM).view(torch.uint8)
    data[:, :, NOPE_DIM:] = rope_bytes.reshape(num_pages, page_size, 2 * ROPE_DIM)
    scales = buf[:, page_size * TOKEN_DATA_BYTES: page_size * TOKEN_BYTES]
    scales = scales.reshape(num_pages, page_size, TOKEN_SCALE_BYTES)
    scales[:, :, :NOPE_TILES] = scale_bytes.reshape(num_pages, page_size, NOPE_TILES)
    return v4_cache_view(buf.reshape(-1), num_pages, page_size)


def v4_cache_view(flat: torch.Tensor, num_pages: int, page_size: int) -> torch.Tensor:
    """The SGLang-shaped ``[num_pages, ps, 1, 584]`` view over a flat uint8 buffer of V4 pages."""
    pb = page_bytes(page_size)
    if flat.numel() < num_pages * pb:
        raise ValueError(f"buffer of {flat.numel()} bytes is smaller than {num_pages} pages of {pb}")
    return torch.as_strided(flat, (num_pages, page_size, 1, TOKEN_BYTES),
                            (pb, TOKEN_BYTES, TOKEN_BYTES, 1))


def cache_to(cache: torch.Tensor, device) -> torch.Tensor:
    """Move a V4 cache view keeping its page stride (``.to()`` would compact the fake view)."""
    rows = _page_rows(cache).to(device).contiguous()
    return torch.as_strided(rows.reshape(-1), cache.shape, cache.stride())


def as_bytes(cache: torch.Tensor) -> torch.Tensor:
    """The cache as uint8, same shape and strides. SGLang may hand over an fp8 view
    (``get_key_buffer``); the V4 page mixes fp8, bf16 and ue8m0 bytes, so it is read as bytes."""
    return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)


def _page_rows(k_cache: torch.Tensor) -> torch.Tensor:
    """``[num_pages, stride(0)]`` byte rows over the cache's storage (the real page extent)."""
    k_cache = as_bytes(k_cache)
    return torch.as_strided(k_cache, (k_cache.shape[0], k_cache.stride(0)), (k_cache.stride(0), 1))


def dequantize_v4(k_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Float32 KV vectors ``[*slots.shape, 512]`` for non-negative slot ids (exact dequantisation)."""
    page_size = k_cache.shape[1]
    rows = _page_rows(k_cache)
    flat_slots = slots.reshape(-1).long()
    page = flat_slots // page_size
    off = flat_slots % page_size
    data_start = off * TOKEN_DATA_BYTES
    cols = torch.arange(TOKEN_DATA_BYTES, device=k_cache.device)
    data = rows[page.unsqueeze(1), data_start.unsqueeze(1) + cols]  # [n, 576] uint8
    scale_start = page_size * TOKEN_DATA_BYTES + off * TOKEN_SCALE_BYTES
    scol = torch.arange(NOPE_TILES, device=k_cache.device)
    scale_bytes = rows[page.unsqueeze(1), scale_start.unsqueeze(1) + scol]  # [n, 7]
    nope = data[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scale = torch.exp2(scale_bytes.float() - 127.0)
    nope = (nope.view(-1, NOPE_TILES, TILE) * scale.unsqueeze(-1)).reshape(-1, NOPE_DIM)
    rope = data[:, NOPE_DIM:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=1).reshape(*slots.shape, HEAD_DIM)


# --------------------------------------------------------------------------------------------
# The reference
# --------------------------------------------------------------------------------------------

def _valid_mask(indices: torch.Tensor, length: Optional[torch.Tensor], num_slots: int) -> torch.Tensor:
    idx = indices[:, 0, :]
    valid = (idx >= 0) & (idx < num_slots)
    if length is not None:
        j = torch.arange(idx.shape[1], device=idx.device).unsqueeze(0)
        valid &= j < length.view(-1, 1).to(idx.device)
    return valid


def sparse_mla_reference(
    *, q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor, topk_length: Optional[torch.Tensor],
    attn_sink: Optional[torch.Tensor], softmax_scale: float, extra_k_cache: Optional[torch.Tensor] = None,
    extra_indices_in_kvcache: Optional[torch.Tensor] = None, extra_topk_length: Optional[torch.Tensor] = None,
    head_dim_v: int = HEAD_DIM, max_chunk_bytes: int = 1 << 28, **unused,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 maths of docs/sglang-contract.md §4.4. Returns ``(out [T,1,H,512] float32, lse [T,H,1] float32)``.

    ``lse`` is the natural-log sum-exp without the sink (``-inf`` for rows with no valid entry),
    as SGLang's torch path returns it. Rows are processed in chunks sized from the shapes only
    (never from device values), so this path has no host synchronisation.
    """
    T, _, H, _ = q.shape
    out = torch.zeros(T, 1, H, head_dim_v, dtype=torch.float32, device=q.device)
    lse = torch.full((T, H, 1), float("-inf"), dtype=torch.float32, device=q.device)
    width = indices.shape[-1] + (extra_indices_in_kvcache.shape[-1] if extra_k_cache is not None else 0)
    rows_per_chunk = max(1, max_chunk_bytes // max(1, width * HEAD_DIM * 4 * 2))
    sink = attn_sink.float() if attn_sink is not None else None
    for t0 in range(0, T, rows_per_chunk):
        t1 = min(T, t0 + rows_per_chunk)
        scopes = [(k_cache, indices[t0:t1], None if topk_length is None else topk_length[t0:t1])]
        if extra_k_cache is not None:
            scopes.append((extra_k_cache, extra_indices_in_kvcache[t0:t1],
                           None if extra_topk_length is None else extra_topk_length[t0:t1]))
        kvs, masks = [], []
        for cache, idx, length in scopes:
            valid = _valid_mask(idx, length, cache.shape[0] * cache.shape[1])
            kv = dequantize_v4(cache, idx[:, 0, :].clamp_min(0).clamp_max(cache.shape[0] * cache.shape[1] - 1))
            kvs.append(torch.where(valid.unsqueeze(-1), kv, torch.zeros((), device=kv.device)))
            masks.append(valid)
        kv = torch.cat(kvs, dim=1)  # [t, N, 512]
        valid = torch.cat(masks, dim=1)  # [t, N]
        qf = q[t0:t1, 0].float()  # [t, H, 512]
        scores = torch.einsum("thd,tnd->thn", qf, kv) * softmax_scale
        scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # [t, H]; -inf when empty
        empty = torch.isneginf(row_lse)
        denom_lse = row_lse if sink is None else torch.logaddexp(row_lse, sink.view(1, H).expand_as(row_lse))
        denom_lse = torch.where(empty, torch.full_like(denom_lse, float("inf")), denom_lse)
        weights = torch.exp(scores - denom_lse.unsqueeze(-1))
        o = torch.einsum("thn,tnd->thd", weights, kv[..., :head_dim_v])
        o = torch.where(empty.unsqueeze(-1), torch.zeros((), device=o.device), o)
        out[t0:t1, 0] = o
        lse[t0:t1, :, 0] = row_lse
    return out, lse


# --------------------------------------------------------------------------------------------
# Case inputs
# --------------------------------------------------------------------------------------------

@dataclass
class AttentionInputs:
    """Keyword arguments for ``flash_mla_with_kvcache_sm120`` plus what the checks need."""

    kwargs: dict
    real_heads: int  # heads [0, real_heads) are compared; the rest are padding (may be NaN)

    @property
    def T(self) -> int:
        return self.kwargs["q"].shape[0]


def _random_kv(num_slots: int, gen: torch.Generator) -> torch.Tensor:
    kv = torch.randn(num_slots, HEAD_DIM, generator=gen)
    # Per-token magnitudes spread over a few octaves so that the ue8m0 scales differ per tile.
    kv[:, :NOPE_DIM] *= torch.exp2(torch.randint(-2, 3, (num_slots, 1), generator=gen).float())
    return kv


def make_inputs(
    *, T: int, heads: int, padded_heads: int, swa_page_size: int = 256, swa_width: int = SWA_WINDOW,
    extra: Optional[str] = None, extra_width: int = 0, seq_lens: Optional[list[int]] = None,
    holes: bool = False, empty_rows: int = 0, short_rows: bool = True, nan_padding: bool = True,
    strided_q: bool = True, seed: int = 0, device: str = "cpu", unique_slots: bool = False,
) -> AttentionInputs:
    """Build one decode call the way SGLang lays it out (docs/sglang-contract.md §4.2).

    * SWA indices: newest first (``pos, pos-1, ...``), ``-1`` for negative positions, ``topk_length
      = min(seq_len, 128)``; the slots come from a shuffled pool of ``swa_page_size`` pages.
    * ``extra="c4"``: ``[T,1,extra_width]`` unordered slots of 64-slot pages, ``-1`` past
      ``min(max(L//4,1), width)``; ``extra="c128"``: ascending slots of 2-slot pages, ``-1`` past
      ``max(L//128, 1)``.
    * ``holes`` punches ``-1`` holes inside the lengths; ``empty_rows`` makes the last rows have
      ``-1`` as their only index (length 1) in every scope; ``padded_heads > heads`` fills the
      padded heads of q with NaN (when ``nan_padding``) and their sink with 0.
    * ``strided_q`` makes q a non-contiguous slice of a wider buffer.
    """
    if extra not in (None, "c4", "c128"):
        raise ValueError(f"extra must be None, 'c4' or 'c128', got {extra!r}")
    gen = torch.Generator().manual_seed(seed)
    if seq_lens is None:
        ratio = {None: 1, "c4": 4, "c128": 128}[extra]
        high = max(2 * swa_width, ratio * extra_width + ratio)
        seq_lens = torch.randint(1, high + 1, (T,), generator=gen).tolist()
    if len(seq_lens) != T:
        raise ValueError(f"seq_lens has {len(seq_lens)} entries for T={T}")

    # --- q, sink ---------------------------------------------------------------------------
    q_store = torch.randn(T, 1, padded_heads, HEAD_DIM + (64 if strided_q else 0), generator=gen)
    if nan_padding and padded_heads > heads:
        q_store[:, :, heads:] = float("nan")
    q = q_store.to(torch.bfloat16).to(device)[..., :HEAD_DIM]
    sink = torch.zeros(padded_heads)
    sink[:heads] = torch.randn(heads, generator=gen)

    # --- SWA scope -------------------------------------------------------------------------
    swa_lens = [min(L, swa_width) for L in seq_lens]
    swa_slots_needed = max(1, sum(swa_lens))
    swa_pages = -(-swa_slots_needed // swa_page_size) + 1
    swa_kv = _random_kv(swa_pages * swa_page_size, gen)
    swa_cache = quantize_v4_pages(swa_kv, swa_page_size)
    perm = torch.randperm(swa_pages * swa_page_size, generator=gen)
    indices = torch.full((T, 1, swa_width), -1, dtype=torch.int32)
    cursor = 0
    for b, n in enumerate(swa_lens):
        if unique_slots:
            indices[b, 0, :n] = perm[cursor:cursor + n].int()
            cursor += n
        else:
            indices[b, 0, :n] = torch.randint(0, swa_pages * swa_page_size, (n,), generator=gen).int()
    topk_length = torch.tensor(swa_lens, dtype=torch.int32)

    kwargs = dict(q=q, k_cache=swa_cache, head_dim_v=HEAD_DIM, softmax_scale=SOFTMAX_SCALE,
                  indices=indices, topk_length=topk_length, attn_sink=sink)

    # --- extra scope -----------------------------------------------------------------------
    if extra is not None:
        ps = 64 if extra == "c4" else 2
        ratio = 4 if extra == "c4" else 128
        lens = []
        for L in seq_lens:
            n = min(max(L // ratio, 1), extra_width)
            lens.append(n)
        pool = max(1, sum(lens) if unique_slots else max(lens) * 2)
        pages = -(-pool // ps) + 1
        ex_kv = _random_kv(pages * ps, gen)
        ex_cache = quantize_v4_pages(ex_kv, ps)
        ex_idx = torch.full((T, 1, extra_width), -1, dtype=torch.int32)
        perm = torch.randperm(pages * ps, generator=gen)
        cursor = 0
        for b, n in enumerate(lens):
            if unique_slots:
                slots = perm[cursor:cursor + n]
                cursor += n
            else:
                slots = torch.randperm(pages * ps, generator=gen)[:n]
            if extra == "c128":
                slots = torch.sort(slots).values
            ex_idx[b, 0, :n] = slots.int()
            if seq_lens[b] // ratio == 0:  # the clamp-to-1 case: slot 0 is -1 inside the length
                ex_idx[b, 0, 0] = -1
        kwargs.update(extra_k_cache=ex_cache, extra_indices_in_kvcache=ex_idx,
                      extra_topk_length=torch.tensor(lens, dtype=torch.int32))

    # --- holes, short rows, empty rows -------------------------------------------------------
    if holes:
        for key, len_key in (("indices", "topk_length"), ("extra_indices_in_kvcache", "extra_topk_length")):
            if key not in kwargs:
                continue
            idx, lens = kwargs[key], kwargs[len_key]
            for b in range(T):
                n = int(lens[b])
                if n > 2:
                    k = max(1, n // 8)
                    pos = torch.randperm(n, generator=gen)[:k]
                    idx[b, 0, pos] = -1
    for b in range(max(0, T - empty_rows), T):
        kwargs["indices"][b, 0, :] = -1
        kwargs["topk_length"][b] = 1
        if extra is not None:
            kwargs["extra_indices_in_kvcache"][b, 0, :] = -1
            kwargs["extra_topk_length"][b] = 1
    del short_rows  # lengths below the width come from seq_lens; kept for call-site readability

    for key in ("indices", "topk_length", "attn_sink", "extra_indices_in_kvcache", "extra_topk_length"):
        if key in kwargs:
            kwargs[key] = kwargs[key].to(device)
    for key in ("k_cache", "extra_k_cache"):
        if key in kwargs:
            kwargs[key] = cache_to(kwargs[key], device)
    return AttentionInputs(kwargs=kwargs, real_heads=heads)


def as_sglang_views(kwargs: dict) -> dict:
    """The same call with the tensor kinds SGLang may hand over: the caches as fp8 views of their
    bytes (``get_key_buffer``) and ``topk_length`` / ``extra_topk_length`` / ``attn_sink`` as
    stride-2 views of wider buffers (junk in the other column). Values are unchanged."""
    out = dict(kwargs)
    for key in ("k_cache", "extra_k_cache"):
        if out.get(key) is not None:
            out[key] = as_bytes(out[key]).view(torch.float8_e4m3fn)
    for key, junk in (("topk_length", -9), ("extra_topk_length", -9), ("attn_sink", 50.0)):
        if out.get(key) is not None:
            value = out[key]
            out[key] = torch.stack([value, torch.full_like(value, junk)], 1)[:, 0]
    return out


def compare(out: torch.Tensor, ref: torch.Tensor, real_heads: int) -> dict:
    """rel / max_abs over the real heads, and whether any real head holds a NaN.

    The reference is finite (a row with no valid entry is 0), so an infinite output is an
    infinite difference: it fails the rel bar like any other wrong value."""
    o = out[:, :, :real_heads].float()
    r = ref[:, :, :real_heads].float()
    nan_free = not bool(torch.isnan(o).any())
    diff = torch.where(torch.isnan(o), torch.zeros((), device=o.device), o - r)
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    denom = float(r.norm())
    rel = float(diff.norm()) / denom if denom > 0 else float(diff.norm())
    if not nan_free:
        rel = math.nan
    return {"rel": rel, "max_abs": max_abs, "nan_free": nan_free}
