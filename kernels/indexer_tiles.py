"""FP8 paged MQA logits for row tiles that share keys (SGLang's prefill and verify calls).

In SGLang 0.5.23 prefill reaches the indexer through the same paged entry as decode
(docs/sglang-contract.md §2.8): one row per extend token, thousands of rows, and the rows of one
request carry identical page-table rows and causal lengths. Scoring every row on its own reads the
request's keys once per row. This kernel scores ``ROWS`` consecutive rows per program and reads a
key page once for all of them wherever they agree on it.

Layout, maths, tail policies and bounds are those of ``dsv4kit.kernels.indexer`` (its module
docstring): the same eight arguments, the same fp32 ``[B, max_seq_len]`` result, the same
``"exact"``/``"skip"`` tails, a page id outside ``[0, num_pages)`` read below ``L`` scores ``-inf``
and is never dereferenced.

Work and grid
-------------
Rows ``[ROWS*i, ROWS*i + ROWS)`` form tile ``i``; the grid is ``(ceil(B/ROWS), R)`` with ``R`` from
``programs_per_tile`` (``indexer.programs_per_row`` for the number of tiles, above one rounded up
to a multiple of ``ROWS``). Every program of a tile first compares the tile's page-table rows over
all pages ``p < max_r ceil(L_r/64)`` (rows compared only where ``p < ceil(L_r/64)``; lengths
clamped to ``[0, max_seq_len]``), so all of them take the same path:

* **shared** (every such page id agrees): the rows' ``q`` are stacked into one ``[ROWS*H, 128]``
  operand, and for pages ``p = j, j+R, ...`` the program loads the key page and its scales once
  and runs one fp8 ``tl.dot`` ``[64 x 128] @ [128 x ROWS*H]`` (M = rows x heads on the tensor
  cores), ReLU, weights, a sum over each row's heads; positions ``t >= L_r`` of each row are
  ``-inf`` (causal rows end at different slots of one page). The loop has no branch, so Triton
  pipelines its key loads; page ids are read one step ahead.
* **per row** otherwise (tiles across a request boundary, decode-like tables): program ``j``
  scores row ``j % ROWS`` at pages ``j//ROWS, j//ROWS + R/ROWS, ...`` as the per-row kernel does
  (when ``R`` is 1, the one program scores each row in turn).

No host sync, static launch configuration, capture-safe. Stores of a row stop at
``min(ceil(L_r/64)*64, max_seq_len)``; with the exact policy each program also writes its ``1/R``
share of every row's ``-inf`` tail.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv4kit.kernels.indexer_rows import page_id, row_scalars, tile_scalars, tile_shares_pages

# The index-K page layout of dsv4kit.kernels.indexer (docs/sglang-contract.md §2.3), repeated here
# because that module imports this one; a test holds the two equal.
PAGE_SIZE = 64
HEAD_DIM = 128
PAGE_BYTES = PAGE_SIZE * (HEAD_DIM + 4)
SCALE_OFFSET = PAGE_SIZE * HEAD_DIM

ROWS = 4  # rows per tile: M = ROWS x H on the tensor cores for a page the tile shares
NUM_WARPS = 4
NUM_STAGES = 3
CHECK = 64  # page-table columns a program compares per step when it decides shared / per row


@triton.jit
def load_key_page(kv_fp8, kv_f32, page, ok, PAGE: tl.constexpr, D: tl.constexpr,
               PAGE_BYTES: tl.constexpr, SCALE_OFFSET: tl.constexpr):
    """A page's fp8 keys [PAGE, D] and fp32 scales [PAGE]; an id outside the pool reads page 0."""
    offs_t = tl.arange(0, PAGE)
    offs_d = tl.arange(0, D)
    page = tl.where(ok, page, 0).to(tl.int64)
    k = tl.load(kv_fp8 + page * PAGE_BYTES + offs_t[:, None] * D + offs_d[None, :])
    s_k = tl.load(kv_f32 + page * (PAGE_BYTES // 4) + SCALE_OFFSET // 4 + offs_t)
    return k, s_k


@triton.jit
def _shared_rows_kernel(
    q_ptr,  # fp8 e4m3 [B, 1, H, D], contiguous
    kv_ptr,  # uint8 [num_pages, 8448]
    w_ptr,  # fp32 [B, H], contiguous
    seq_lens_ptr,  # int32 [B] with stride seq_lens_stride
    page_table_ptr,  # int32 [B, P], unit column stride
    out_ptr,  # fp32 [B, max_seq_len], contiguous
    seq_lens_stride,
    pt_stride,
    num_pages,
    max_seq_len,
    batch,
    progs,
    ROWS: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    PAGE_BYTES: tl.constexpr,
    SCALE_OFFSET: tl.constexpr,
    FILL: tl.constexpr,
    EXACT_TAIL: tl.constexpr,
    CHECK: tl.constexpr,
):
    tile = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    offs_t = tl.arange(0, PAGE)
    offs_d = tl.arange(0, D)
    seq_len, n_pages, pt_rows, out_rows, store_end = tile_scalars(
        seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr, tile, batch,
        max_seq_len, j, progs, ROWS, PAGE, FILL, EXACT_TAIL)

    kv_fp8 = kv_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    kv_f32 = kv_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
    n_max = tl.max(n_pages, axis=0)
    # Decided over the whole tile (every program of it the same way), so that the two paths'
    # page splits never mix within a tile.
    if tile_shares_pages(pt_rows, n_pages, n_max, 0, 1, CHECK):
        # One key page for the whole tile: [PAGE, D] @ [D, ROWS*H], the rows' q stacked.
        offs_m = tl.arange(0, ROWS * H)
        m_live = (tile * ROWS + offs_m // H) < batch
        q = tl.load(q_ptr + (tile * (ROWS * H) + offs_m)[:, None] * D + offs_d[None, :],
                    mask=m_live[:, None], other=0.0)
        w = tl.load(w_ptr + tile * (ROWS * H) + offs_m, mask=m_live, other=0.0)
        q_t = tl.trans(q)  # outside the loop, so its shared-memory copy for the MMA is made once
        # The page ids are read a step ahead, so a page's key load waits on nothing but its id.
        ids_next = tl.load(pt_rows + j, mask=j < n_pages, other=-1)
        for p in range(j, n_max, progs):
            lead = tl.max(ids_next, axis=0)
            ids_next = tl.load(pt_rows + (p + progs), mask=(p + progs) < n_pages, other=-1)
            ok = (lead >= 0) & (lead < num_pages)
            k, s_k = load_key_page(kv_fp8, kv_f32, lead, ok, PAGE, D, PAGE_BYTES, SCALE_OFFSET)
            scores = tl.dot(k, q_t)  # [PAGE, ROWS*H], fp32 accumulation
            scores = tl.maximum(scores, 0.0) * w[None, :]
            logit = tl.trans(tl.sum(tl.reshape(scores, (PAGE, ROWS, H)), axis=2))  # [ROWS, PAGE]
            logit = logit * s_k[None, :]
            t = p * PAGE + offs_t
            scored_until = tl.where(ok, seq_len, 0)
            logit = tl.where(t[None, :] < scored_until[:, None], logit, float("-inf"))
            tl.store(out_rows[:, None] + t[None, :], logit, mask=t[None, :] < store_end[:, None])
    elif progs % ROWS == 0:
        # Rows that do not share (decode-like tables, a tile across requests), with the programs
        # split over the rows: row j % ROWS, every (R/ROWS)-th page, as the per-row kernel's grid.
        _score_row(q_ptr, w_ptr, seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr,
                   kv_fp8, kv_f32, tile * ROWS + j % ROWS, batch, num_pages, max_seq_len,
                   j // ROWS, progs // ROWS, H, D, PAGE, PAGE_BYTES, SCALE_OFFSET)
    else:
        for r in tl.static_range(ROWS):
            _score_row(q_ptr, w_ptr, seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride,
                       out_ptr, kv_fp8, kv_f32, tile * ROWS + r, batch, num_pages, max_seq_len,
                       j, progs, H, D, PAGE, PAGE_BYTES, SCALE_OFFSET)


@triton.jit
def _score_row(q_ptr, w_ptr, seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr,
               kv_fp8, kv_f32, row, batch, num_pages, max_seq_len, first, step, H: tl.constexpr,
               D: tl.constexpr, PAGE: tl.constexpr, PAGE_BYTES: tl.constexpr,
               SCALE_OFFSET: tl.constexpr):
    """Pages ``first, first+step, ...`` of one row on its own (nothing past the batch)."""
    offs_t = tl.arange(0, PAGE)
    offs_h = tl.arange(0, H)
    offs_d = tl.arange(0, D)
    seq_len, n_pages, pt_row, out_row, store_end = row_scalars(
        seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr, row, batch,
        max_seq_len, PAGE)
    row_c = tl.where(row < batch, row, 0)
    q_t = tl.trans(tl.load(q_ptr + row_c * (H * D) + offs_h[:, None] * D + offs_d[None, :]))
    w = tl.load(w_ptr + row_c * H + offs_h)
    id_next, ok_next = page_id(pt_row, first, n_pages, num_pages)
    for p in range(first, n_pages, step):
        page, ok = id_next, ok_next
        id_next, ok_next = page_id(pt_row, p + step, n_pages, num_pages)
        k, s_k = load_key_page(kv_fp8, kv_f32, page, ok, PAGE, D, PAGE_BYTES, SCALE_OFFSET)
        scores = tl.maximum(tl.dot(k, q_t), 0.0)  # [PAGE, H]
        logit = tl.sum(scores * w[None, :], axis=1) * s_k
        t = p * PAGE + offs_t
        logit = tl.where(t < tl.where(ok, seq_len, 0), logit, float("-inf"))
        tl.store(out_row + t, logit, mask=t < store_end)


def programs_per_tile(programs_per_row_of_tiles: int, rows: int = ROWS) -> int:
    """``R`` for the ``(ceil(B/rows), R)`` grid from the per-row kernel's choice for ``ceil(B/rows)``
    rows: above one, rounded up to a multiple of ``rows``, so a tile whose rows do not share keys
    splits its programs over its rows."""
    r = programs_per_row_of_tiles
    return r if r <= 1 else -(-r // rows) * rows


def launch(q_fp8, kv_pages, weight, seq_lens_1d, page_table, out, num_pages, max_seq_len, progs,
           tail, fill_block, num_warps=NUM_WARPS, num_stages=NUM_STAGES, rows=ROWS, check=CHECK):
    """Launch on already-checked arguments (``indexer.check_args``); ``progs`` is ``R`` for the
    ``(ceil(B/rows), R)`` grid (``programs_per_tile``), ``tail`` ``"exact"`` or ``"skip"``."""
    batch, _, heads, head_dim = q_fp8.shape
    grid = (-(-batch // rows), progs)
    _shared_rows_kernel[grid](
        q_fp8, kv_pages, weight, seq_lens_1d, page_table, out,
        seq_lens_1d.stride(0), page_table.stride(0), num_pages, max_seq_len, batch, progs,
        ROWS=rows, H=heads, D=head_dim, PAGE=PAGE_SIZE, PAGE_BYTES=PAGE_BYTES,
        SCALE_OFFSET=SCALE_OFFSET, FILL=fill_block, EXACT_TAIL=tail == "exact", CHECK=check,
        num_warps=num_warps, num_stages=num_stages,
    )
