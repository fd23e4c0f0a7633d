"""``@triton.jit`` helpers the indexer kernels share (FP8 and FP4, per row and row tiles).

A row's setup from its length, a program's share of a row's ``-inf`` tail, a page-table read
that never lets an id outside the pool be dereferenced, and the row-tile kernels' setup and
shared-or-per-row decision (``dsv4kit.kernels.indexer_tiles``). Layouts:
``dsv4kit.kernels.indexer``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_scalars(seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr, row, batch,
                max_seq_len, PAGE: tl.constexpr):
    """A row's (or a vector of rows') length clamped to ``[0, max_seq_len]`` (0 past the batch),
    page count, table row, output row and store end ``min(ceil(L/64)*64, max_seq_len)`` (0 past
    the batch)."""
    live = row < batch
    row_c = tl.where(live, row, 0)
    seq_len = tl.load(seq_lens_ptr + row_c * seq_lens_stride)
    seq_len = tl.where(live, tl.minimum(tl.maximum(seq_len, 0), max_seq_len), 0)
    n_pages = (seq_len + PAGE - 1) // PAGE
    store_end = tl.where(live, tl.minimum(n_pages * PAGE, max_seq_len), 0)
    return seq_len, n_pages, page_table_ptr + row_c * pt_stride, out_ptr + row_c * max_seq_len, \
        store_end


@triton.jit
def fill_tail(out_row, tail_start, max_seq_len, j, progs, FILL: tl.constexpr, PAGE: tl.constexpr):
    """Program ``j`` of ``progs``: its share of ``[tail_start, max_seq_len)`` set to ``-inf``, in
    chunks that are multiples of ``PAGE`` (aligned stores); the exact tail policy."""
    tail = tl.maximum(max_seq_len - tail_start, 0)
    chunk = tl.cdiv(tl.cdiv(tail, progs), PAGE) * PAGE
    start = tail_start + j * chunk
    end = tl.minimum(start + chunk, max_seq_len)
    neg_inf = tl.full([FILL], float("-inf"), tl.float32)
    for off in range(start, end, FILL):
        off = tl.multiple_of(off, PAGE)
        idx = off + tl.arange(0, FILL)
        tl.store(out_row + idx, neg_inf, mask=idx < end)


@triton.jit
def page_id(pt_row, p, n_pages, num_pages):
    """Page ``p`` of a row (read only if ``p < n_pages``) as int64, and whether it lies in
    ``[0, num_pages)``; an id outside the pool comes back as 0, never to be dereferenced."""
    page = tl.load(pt_row + p, mask=p < n_pages, other=0).to(tl.int64)
    ok = (page >= 0) & (page < num_pages)
    return tl.where(ok, page, 0), ok


@triton.jit
def tile_scalars(seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr, tile, batch,
                 max_seq_len, j, progs, ROWS: tl.constexpr, PAGE: tl.constexpr,
                 FILL: tl.constexpr, EXACT_TAIL: tl.constexpr):
    """``row_scalars`` of the tile's rows ``[tile*ROWS, tile*ROWS + ROWS)`` (as vectors), after
    program ``j`` of ``progs`` wrote its share of each live row's ``-inf`` tail (exact policy)."""
    if EXACT_TAIL:
        for r in tl.static_range(ROWS):
            _, _, _, o_r, e_r = row_scalars(seq_lens_ptr, seq_lens_stride, page_table_ptr,
                                             pt_stride, out_ptr, tile * ROWS + r, batch,
                                             max_seq_len, PAGE)
            # a row past the batch has nothing to fill (its store end is 0 but it has no row)
            if tile * ROWS + r < batch:
                fill_tail(o_r, e_r, max_seq_len, j, progs, FILL, PAGE)
    return row_scalars(seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr,
                       tile * ROWS + tl.arange(0, ROWS), batch, max_seq_len, PAGE)


@triton.jit
def tile_shares_pages(pt_rows, n, n_max, j, progs, CHECK: tl.constexpr):
    """Whether, at every page ``p = j, j+R, ... < n_max``, the tile's rows that have page ``p``
    carry the same id there (rows are the leading axis of ``pt_rows`` and ``n``)."""
    offs_c = tl.arange(0, CHECK)
    differ = 0
    for p0 in range(j, n_max, progs * CHECK):
        ps = p0 + offs_c * progs
        has = ps[None, :] < n[:, None]
        ids = tl.load(pt_rows[:, None] + ps[None, :], mask=has, other=-1)
        lead = tl.max(ids, axis=0)
        differ += tl.sum(tl.sum((has & (ids != lead[None, :])).to(tl.int32), axis=1), axis=0)
    return differ == 0
