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
``indexer.programs_per_row`` applied to the number of tiles. Program ``(i, j)`` loads each row's
length ``L_r`` (clamped to ``[0, max_seq_len]``), its ``q`` ``[H, 128]`` and weights once, then for
pages ``p = j, j+R, ... < max_r ceil(L_r/64)``:

* reads the ``ROWS`` page ids ``page_table[r, p]`` of the rows that still have page ``p``
  (``p < ceil(L_r/64)``; others are never read);
* **shared**: if they are all the same id, loads that key page and its scales once and scores
  every row of the tile from it (``ROWS`` fp8 ``tl.dot`` of ``[64 x 128] @ [128 x H]`` on one
  tile in shared memory); positions ``t >= L_r`` of each row are ``-inf`` (causal rows end at
  different slots of one page);
* **per row** otherwise (tiles across a request boundary, decode-like tables): each row loads and
  scores its own page, as the per-row kernel does.

The choice is made per tile and page in the kernel, from the page table: no host sync, static
launch configuration, capture-safe. Stores of a row stop at ``min(ceil(L_r/64)*64, max_seq_len)``;
with the exact policy each program also writes its ``1/R`` share of every row's ``-inf`` tail.
"""

from __future__ import annotations

import triton
import triton.language as tl

# The index-K page layout of dsv4kit.kernels.indexer (docs/sglang-contract.md §2.3), repeated here
# because that module imports this one; a test holds the two equal.
PAGE_SIZE = 64
HEAD_DIM = 128
PAGE_BYTES = PAGE_SIZE * (HEAD_DIM + 4)
SCALE_OFFSET = PAGE_SIZE * HEAD_DIM

ROWS = 4  # rows per tile: a page read once serves four rows
NUM_WARPS = 4
NUM_STAGES = 2
# Products as [H x 128] @ [128 x 64], q on the left: on sm_90 the four q tiles then go to shared
# memory once, before the page loop, and a key page is stored once for the four products (with q on
# the right Triton re-stores each q tile at every page).
HEADS_MAJOR = True


@triton.jit
def _row_setup(q_ptr, w_ptr, seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr,
               row, batch, max_seq_len, H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr):
    """One row's length (0 past the batch), page count, q [H, D], weights [H], table row, output
    row, store end and where its exact tail starts."""
    live = row < batch
    row_c = tl.where(live, row, 0)
    seq_len = tl.load(seq_lens_ptr + row_c * seq_lens_stride)
    seq_len = tl.where(live, tl.minimum(tl.maximum(seq_len, 0), max_seq_len), 0)
    n_pages = (seq_len + PAGE - 1) // PAGE
    offs_h = tl.arange(0, H)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + row_c * (H * D) + offs_h[:, None] * D + offs_d[None, :])
    w = tl.load(w_ptr + row_c * H + offs_h)
    # A row past the batch stores nothing: its page range is empty and its tail starts at the end.
    store_end = tl.where(live, tl.minimum(n_pages * PAGE, max_seq_len), 0)
    fill_from = tl.where(live, store_end, max_seq_len)
    return seq_len, n_pages, q, w, page_table_ptr + row_c * pt_stride, out_ptr + row_c * max_seq_len, \
        store_end, fill_from


@triton.jit
def _fill_tail(out_row, store_end, max_seq_len, j, progs, FILL: tl.constexpr, PAGE: tl.constexpr):
    """This program's share of ``[store_end, max_seq_len)`` set to ``-inf`` (exact policy); a row
    past the batch has ``store_end == max_seq_len``."""
    tail_start = store_end
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
def _page_id(pt_row, p, n_pages, num_pages):
    """Page ``p`` of a row that has it (else -1), and whether it lies in the pool."""
    page = tl.load(pt_row + p, mask=p < n_pages, other=-1)
    return page, (page >= 0) & (page < num_pages)


@triton.jit
def _score(k, s_k, ok, q, w, seq_len, p, out_row, store_end, PAGE: tl.constexpr,
           HEADS_MAJOR: tl.constexpr):
    """Score page ``p`` of one row from a loaded key tile; store below ``store_end``."""
    offs_t = tl.arange(0, PAGE)
    scored_until = tl.where(ok, seq_len, 0)
    if HEADS_MAJOR:
        # q as the left operand (it may stay in registers on sm_90), the key tile shared by
        # the tile's four products as the right one.
        scores = tl.dot(q, tl.trans(k))  # [H, PAGE], fp32 accumulation
        scores = tl.maximum(scores, 0.0)
        logit = tl.sum(scores * w[:, None], axis=0) * s_k
    else:
        scores = tl.dot(k, tl.trans(q))  # [PAGE, H], fp32 accumulation
        scores = tl.maximum(scores, 0.0)
        logit = tl.sum(scores * w[None, :], axis=1) * s_k
    t = p * PAGE + offs_t
    logit = tl.where(t < scored_until, logit, float("-inf"))
    tl.store(out_row + t, logit, mask=t < store_end)


@triton.jit
def _load_page(kv_fp8, kv_f32, page, ok, PAGE: tl.constexpr, D: tl.constexpr,
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
    H: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    PAGE_BYTES: tl.constexpr,
    SCALE_OFFSET: tl.constexpr,
    FILL: tl.constexpr,
    EXACT_TAIL: tl.constexpr,
    HEADS_MAJOR: tl.constexpr,
):
    tile = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    row0 = tile * 4
    L0, n0, q0, w0, pt0, o0, e0, f0 = _row_setup(q_ptr, w_ptr, seq_lens_ptr, seq_lens_stride,
                                             page_table_ptr, pt_stride, out_ptr, row0, batch,
                                             max_seq_len, H, D, PAGE)
    L1, n1, q1, w1, pt1, o1, e1, f1 = _row_setup(q_ptr, w_ptr, seq_lens_ptr, seq_lens_stride,
                                             page_table_ptr, pt_stride, out_ptr, row0 + 1, batch,
                                             max_seq_len, H, D, PAGE)
    L2, n2, q2, w2, pt2, o2, e2, f2 = _row_setup(q_ptr, w_ptr, seq_lens_ptr, seq_lens_stride,
                                             page_table_ptr, pt_stride, out_ptr, row0 + 2, batch,
                                             max_seq_len, H, D, PAGE)
    L3, n3, q3, w3, pt3, o3, e3, f3 = _row_setup(q_ptr, w_ptr, seq_lens_ptr, seq_lens_stride,
                                             page_table_ptr, pt_stride, out_ptr, row0 + 3, batch,
                                             max_seq_len, H, D, PAGE)
    if EXACT_TAIL:
        _fill_tail(o0, f0, max_seq_len, j, progs, FILL, PAGE)
        _fill_tail(o1, f1, max_seq_len, j, progs, FILL, PAGE)
        _fill_tail(o2, f2, max_seq_len, j, progs, FILL, PAGE)
        _fill_tail(o3, f3, max_seq_len, j, progs, FILL, PAGE)

    kv_fp8 = kv_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    kv_f32 = kv_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
    n_max = tl.maximum(tl.maximum(n0, n1), tl.maximum(n2, n3))
    # Page ids are read one step ahead, so a page's key load waits on nothing but its own id.
    nid0, nok0 = _page_id(pt0, j, n0, num_pages)
    nid1, nok1 = _page_id(pt1, j, n1, num_pages)
    nid2, nok2 = _page_id(pt2, j, n2, num_pages)
    nid3, nok3 = _page_id(pt3, j, n3, num_pages)
    for p in range(j, n_max, progs):
        id0, ok0, id1, ok1, id2, ok2, id3, ok3 = nid0, nok0, nid1, nok1, nid2, nok2, nid3, nok3
        nid0, nok0 = _page_id(pt0, p + progs, n0, num_pages)
        nid1, nok1 = _page_id(pt1, p + progs, n1, num_pages)
        nid2, nok2 = _page_id(pt2, p + progs, n2, num_pages)
        nid3, nok3 = _page_id(pt3, p + progs, n3, num_pages)
        # The page the rows that still have page p agree on (-1 marks a row past its length).
        lead = tl.maximum(tl.maximum(id0, id1), tl.maximum(id2, id3))
        same = ((id0 == lead) | (p >= n0)) & ((id1 == lead) | (p >= n1)) & \
            ((id2 == lead) | (p >= n2)) & ((id3 == lead) | (p >= n3))
        if same:
            ok = (lead >= 0) & (lead < num_pages)
            k, s_k = _load_page(kv_fp8, kv_f32, lead, ok, PAGE, D, PAGE_BYTES, SCALE_OFFSET)
            _score(k, s_k, ok, q0, w0, L0, p, o0, e0, PAGE, HEADS_MAJOR)
            _score(k, s_k, ok, q1, w1, L1, p, o1, e1, PAGE, HEADS_MAJOR)
            _score(k, s_k, ok, q2, w2, L2, p, o2, e2, PAGE, HEADS_MAJOR)
            _score(k, s_k, ok, q3, w3, L3, p, o3, e3, PAGE, HEADS_MAJOR)
        else:
            k, s_k = _load_page(kv_fp8, kv_f32, id0, ok0, PAGE, D, PAGE_BYTES, SCALE_OFFSET)
            _score(k, s_k, ok0, q0, w0, L0, p, o0, e0, PAGE, HEADS_MAJOR)
            k, s_k = _load_page(kv_fp8, kv_f32, id1, ok1, PAGE, D, PAGE_BYTES, SCALE_OFFSET)
            _score(k, s_k, ok1, q1, w1, L1, p, o1, e1, PAGE, HEADS_MAJOR)
            k, s_k = _load_page(kv_fp8, kv_f32, id2, ok2, PAGE, D, PAGE_BYTES, SCALE_OFFSET)
            _score(k, s_k, ok2, q2, w2, L2, p, o2, e2, PAGE, HEADS_MAJOR)
            k, s_k = _load_page(kv_fp8, kv_f32, id3, ok3, PAGE, D, PAGE_BYTES, SCALE_OFFSET)
            _score(k, s_k, ok3, q3, w3, L3, p, o3, e3, PAGE, HEADS_MAJOR)


def launch(q_fp8, kv_pages, weight, seq_lens_1d, page_table, out, num_pages, max_seq_len, progs,
           tail, fill_block, num_warps=NUM_WARPS, num_stages=NUM_STAGES, heads_major=HEADS_MAJOR):
    """Launch on already-checked arguments (``indexer.check_args``); ``progs`` is ``R`` for the
    ``(ceil(B/4), R)`` grid, ``tail`` ``"exact"`` or ``"skip"``."""
    batch, _, heads, head_dim = q_fp8.shape
    grid = (-(-batch // ROWS), progs)
    _shared_rows_kernel[grid](
        q_fp8, kv_pages, weight, seq_lens_1d, page_table, out,
        seq_lens_1d.stride(0), page_table.stride(0), num_pages, max_seq_len, batch, progs,
        H=heads, D=head_dim, PAGE=PAGE_SIZE, PAGE_BYTES=PAGE_BYTES, SCALE_OFFSET=SCALE_OFFSET,
        FILL=fill_block, EXACT_TAIL=tail == "exact", HEADS_MAJOR=heads_major,
        num_warps=num_warps, num_stages=num_stages,
    )
