"""Capture-safe Triton attention over the native engine's static KV cache (split-KV decoding).

Called by the native torch engine's static attention path (``kvcache/slot_attention.py``) on
CUDA for decode and speculative-verify steps: each query reads the slots ``[lo, q_pos]`` of its
cache row. Why a kernel of our own: the step runs inside a CUDA graph, so nothing may sync with
the host or size anything by tensor values, and a padded torch attention would read every row up
to the cache's full length, while this kernel's loops are bounded by the loaded ``lo``/``q_pos``,
so a row costs what its real length costs. flash-attn is not installed on our GPU machines.

Design ("flash-decoding"): one program per (batch row, kv head, split). A program loads the
queries of every query head sharing its kv head, for all ``Q`` queries, as the rows of one
``[BLOCK_M, D]`` tile (padded to at least 16 rows, the smallest ``tl.dot`` tile), so each K/V
block is read once for the whole GQA group. The splits partition the row's slot span
``[min lo, max q_pos]`` (computed in the kernel from loaded values); a split past the span writes
an empty partial (max -inf, sum 0). A second kernel merges the splits' partial softmax states;
with a single split the first kernel normalises and writes the output itself. The split count is
a pure function of shapes and the device's SM count (:func:`launch_config`), and the scratch
buffers are sized from shapes only, so a captured graph replays the same launches whatever the
row lengths are.

Slots inside the span but outside one query's own ``[lo, q_pos]`` are loaded and masked out of
that query's softmax: they must hold finite values (a NaN value would survive a zero weight),
which the engine guarantees because it writes every slot up to each row's last query. Slots
outside the span are never read.

The first call for a shape compiles the kernels, so run one step before capturing a graph.

Status: checked on CPU under Triton's interpreter
(``tests/unit/workers/engine/test_triton_attention.py``), compiled ahead of time for sm_90
without a GPU (pipelined loads, tensor-core dots, no register spills), and run on an H200 in
``pytest -m gpu`` (Triton against the torch backend, docs/performance.md). ``BLOCK_N``,
``num_warps``, the split target (``_WAVES``) and the split cap are first guesses, not tuned;
``num_stages`` is Triton's default.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, no_type_check

import torch

try:
    import triton  # type: ignore[import-untyped, import-not-found, unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError:  # the module stays importable; available() is False
    triton = None
    tl = None

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)
_WAVES = 2  # aim for about this many programs per SM when splitting
_MAX_SPLITS = 128
_INTERPRET_SMS = 4  # the interpreter has no SMs; a small count keeps its grids small
_LOG2E = 1.4426950408889634  # softmax in base 2: exp(x) == exp2(x * log2(e))


@dataclass(frozen=True)
class LaunchConfig:
    """Compile-time launch parameters; depend only on shapes, never on tensor values."""

    num_splits: int  # programs per (row, kv head); a power of two
    block_m: int  # query rows per tile: kv group size x Q, padded to a power of two >= 16
    block_n: int  # cache slots per loop iteration
    num_warps: int = 4


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def launch_config(
    batch: int,
    kv_heads: int,
    max_len: int,
    group_rows: int,
    head_dim: int,
    itemsize: int,
    sm_count: int,
) -> LaunchConfig:
    """Split count and tile sizes for ``batch`` rows of ``group_rows`` (= Hq/Hkv x Q) queries
    of ``itemsize``-byte elements.

    Splits only when ``batch x kv_heads`` programs would leave SMs idle (decode at small batch),
    and never into more splits than the static ``max_len`` has blocks.
    """
    # fp32 has no tensor-core path here (exact fp32 dots are FMA loops): small blocks and more
    # warps keep it from spilling registers (checked in sm_90 builds); so does a smaller block
    # for wide heads.
    block_n = 16 if itemsize >= 4 else 32 if head_dim > 128 else 64
    want = -(-_WAVES * sm_count // max(1, batch * kv_heads))
    blocks = -(-max_len // block_n)
    return LaunchConfig(
        num_splits=min(_pow2_ceil(want), _pow2_floor(blocks), _MAX_SPLITS),
        block_m=max(16, _pow2_ceil(group_rows)),
        block_n=block_n,
        num_warps=8 if itemsize >= 4 else 4,
    )


def _interpreting() -> bool:
    return triton is not None and bool(triton.knobs.runtime.interpret)


def available(device: torch.device) -> bool:
    """Whether :func:`slot_attention` can run on ``device`` (CPU only under TRITON_INTERPRET)."""
    if triton is None:
        return False
    return device.type == "cuda" or (device.type == "cpu" and _interpreting())


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _INTERPRET_SMS
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


@functools.cache
def _kernels(interpret: bool) -> tuple[Any, Any]:
    """The two kernels, jitted on first use: TRITON_INTERPRET is read when ``triton.jit`` runs,
    so jitting here (keyed by the flag) lets a test turn the interpreter on without a reload."""
    del interpret  # only the cache key
    # row0 differs between captured graphs; specialising on it would only add compilations.
    return triton.jit(_split_kernel, do_not_specialize=["row0"]), triton.jit(_combine_kernel)


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    row0: int,
    q_pos: torch.Tensor,
    lo: torch.Tensor,
    out: torch.Tensor | None,
) -> None:
    """Refuse inputs the kernel does not handle; looks at metadata only (no device sync)."""
    shapes = (
        f"q {tuple(q.shape)} {q.dtype}, k_cache {tuple(k_cache.shape)} {k_cache.dtype}, "
        f"v_cache {tuple(v_cache.shape)} {v_cache.dtype}, q_pos {tuple(q_pos.shape)} "
        f"{q_pos.dtype}, lo {tuple(lo.shape)} {lo.dtype}, row0 {row0}"
    )
    problem = None
    if q.dim() != 4 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        problem = "want q [B, Hq, Q, D] and k_cache, v_cache both [R, Hkv, L, D]"
    elif q.dtype not in _DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        problem = "q, k_cache and v_cache must share one dtype of bf16, fp16, fp32"
    elif not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        problem = "k_cache and v_cache must be contiguous"
    elif q.shape[3] != k_cache.shape[3] or q.shape[3] < 16 or q.shape[3] & (q.shape[3] - 1):
        problem = "head dim must match and be a power of two >= 16"
    elif q.shape[1] % k_cache.shape[1]:
        problem = "query heads must be a multiple of kv heads"
    elif q_pos.shape != (q.shape[0], q.shape[2]) or lo.shape != q_pos.shape:
        problem = "q_pos and lo must be [B, Q]"
    elif q_pos.dtype not in _INDEX_DTYPES or lo.dtype not in _INDEX_DTYPES:
        problem = "q_pos and lo must be int32 or int64"
    elif row0 < 0 or row0 + q.shape[0] > k_cache.shape[0]:
        problem = "rows row0 .. row0 + B must lie in the cache"
    elif len({t.device for t in (q, k_cache, v_cache, q_pos, lo)}) != 1:
        problem = "all tensors must be on one device"
    elif out is not None and (
        out.shape != q.shape or out.dtype != q.dtype or out.device != q.device
    ):
        problem = f"out must be {tuple(q.shape)} {q.dtype} on {q.device}, got {tuple(out.shape)}"
    if problem is not None:
        raise ValueError(f"slot_attention: {problem} ({shapes})")


def slot_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    row0: int,
    q_pos: torch.Tensor,
    lo: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Attention of ``q`` [B, Hq, Q, D] over cache rows ``row0 .. row0 + B`` of ``k_cache``/
    ``v_cache`` [R, Hkv, L, D]: query (b, h, i) reads slots ``lo[b, i] .. q_pos[b, i]`` (both
    inclusive, [B, Q] each) of kv head ``h // (Hq // Hkv)``. Returns [B, Hq, Q, D] in q's dtype,
    written into ``out`` when given. ``config`` overrides :func:`launch_config` (tests, tuning).
    """
    if triton is None:
        raise RuntimeError("slot_attention needs Triton, which is not installed")
    _check(q, k_cache, v_cache, row0, q_pos, lo, out)
    batch, q_heads, n_q, head_dim = q.shape
    kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    cfg = config or launch_config(
        batch, kv_heads, max_len, group * n_q, head_dim, q.element_size(), _sm_count(q.device)
    )
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [B, Hq, Q, D]
    splits = cfg.num_splits
    rows = batch * q_heads * n_q
    if splits > 1:  # partial softmax state per (query, split); sized by shapes only
        part_m = torch.empty(rows * splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty(rows * splits, dtype=torch.float32, device=q.device)
        part_acc = torch.empty(rows * splits, head_dim, dtype=torch.float32, device=q.device)
    else:  # the kernel writes `out` directly and never touches these
        part_m = part_l = part_acc = out
    split_kernel, combine_kernel = _kernels(_interpreting())
    split_kernel[(batch * kv_heads, splits)](
        q, k_cache, v_cache, q_pos, lo, out, part_m, part_l, part_acc,
        row0, scale * _LOG2E,
        *q.stride(), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        *q_pos.stride(), *lo.stride(), *out.stride(),
        HQ=q_heads, HKV=kv_heads, GROUP=group, Q=n_q, D=head_dim,
        SPLITS=splits, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        # fp32 inputs stay exact fp32 rather than tf32; half inputs ignore the setting.
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps,
    )  # fmt: skip
    if splits > 1:
        combine_kernel[(rows,)](
            part_m, part_l, part_acc, out, *out.stride(),
            HQ=q_heads, Q=n_q, D=head_dim, SPLITS=splits,
        )  # fmt: skip
    return out


# The kernels call only Triton builtins, and reduce with tl.reduce and the standard combine
# functions (private names in tl.standard, Triton being pinned) instead of tl.max / tl.sum /
# tl.cdiv / tl.zeros: those are @triton.jit functions, jitted when triton is first imported, and
# the interpreter can run them only if TRITON_INTERPRET was already set then (transformers and
# vllm import triton early). The interpreter recognises these combine functions and reduces with
# numpy; compiled, this is exactly what tl.max / tl.sum do for fp32 and int32.


@no_type_check
def _split_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, lo_ptr, out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
    row0, qk_scale,
    stride_qb, stride_qh, stride_qq, stride_qd,
    stride_kr, stride_kh, stride_kl,
    stride_pb, stride_pq, stride_lb, stride_lq,
    stride_ob, stride_oh, stride_oq, stride_od,
    HQ: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, Q: tl.constexpr, D: tl.constexpr,
    SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One (batch row, kv head, split): online softmax of the group's queries over its slots."""
    b = tl.program_id(0) // HKV
    kvh = tl.program_id(0) % HKV
    split = tl.program_id(1)
    m = tl.arange(0, BLOCK_M)  # tile row m = query head (kvh * GROUP + m // Q), query m % Q
    row_ok = m < GROUP * Q  # rows past the group are padding for tl.dot
    head = kvh * GROUP + m // Q
    qi = m % Q
    d = tl.arange(0, D)
    q_off = b * stride_qb + head[:, None] * stride_qh + qi[:, None] * stride_qq
    q = tl.load(q_ptr + q_off + d[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
    # Padding rows get an empty range (pos -1), so they never widen the span or attend.
    pos = tl.load(pos_ptr + b * stride_pb + qi * stride_pq, mask=row_ok, other=-1).to(tl.int32)
    lo = tl.load(lo_ptr + b * stride_lb + qi * stride_lq, mask=row_ok, other=0).to(tl.int32)
    span_lo = tl.reduce(tl.where(row_ok, lo, 2147483647), 0, tl.standard._elementwise_min)
    span_end = tl.reduce(pos, 0, tl.standard._elementwise_max) + 1
    # Splits are whole blocks so that loads stay aligned; trailing splits may be empty.
    per_split = ((span_end - span_lo + SPLITS - 1) // SPLITS + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = span_lo + split * per_split
    end = tl.minimum(start + per_split, span_end)
    # The row's base offset in int64 (a whole cache can outgrow int32 offsets); within a row int32.
    kv_base = (b.to(tl.int64) + row0) * stride_kr + kvh * stride_kh
    k_row = k_ptr + kv_base
    v_row = v_ptr + kv_base
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (base-2 logits)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)  # running softmax denominator
    acc = tl.full([BLOCK_M, D], 0.0, tl.float32)  # running unnormalised output
    n = tl.arange(0, BLOCK_N)
    for s0 in range(start, end, BLOCK_N):  # bounds from loaded values: real length only
        s = s0 + n
        in_split = s < end
        kv_off = s[:, None] * stride_kl + d[None, :]
        k = tl.load(k_row + kv_off, mask=in_split[:, None], other=0.0)  # [BLOCK_N, D]
        v = tl.load(v_row + kv_off, mask=in_split[:, None], other=0.0)  # [BLOCK_N, D]
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, N]
        # No in_split term: splits are whole blocks, so a slot past `end` is past every q_pos.
        allowed = (s[None, :] >= lo[:, None]) & (s[None, :] <= pos[:, None])
        scores = tl.where(allowed, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(scores, 1, tl.standard._elementwise_max))
        # A row with nothing allowed yet keeps max -inf; shift by 0 so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_safe[:, None])  # [BLOCK_M, BLOCK_N]
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    if SPLITS == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding rows have l 0; never stored
        o_off = b * stride_ob + head[:, None] * stride_oh + qi[:, None] * stride_oq
        o_ptrs = out_ptr + o_off + d[None, :] * stride_od
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        part = (((b * HQ + head) * Q + qi) * SPLITS + split).to(tl.int64)  # [BLOCK_M]
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * D + d[None, :], acc, mask=row_ok[:, None])


@no_type_check
def _combine_kernel(
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    stride_ob, stride_oh, stride_oq, stride_od,
    HQ: tl.constexpr, Q: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    """One query (b, h, i): merge its splits' partial softmax states into the output."""
    row = tl.program_id(0)  # flat (b, h, i)
    sp = row.to(tl.int64) * SPLITS + tl.arange(0, SPLITS)  # [SPLITS]
    d = tl.arange(0, D)
    m_s = tl.load(part_m_ptr + sp)  # empty splits hold -inf
    l_s = tl.load(part_l_ptr + sp)
    acc = tl.load(part_acc_ptr + sp[:, None] * D + d[None, :])  # [SPLITS, D]
    # Every query has at least one slot, so some split's max is finite and this stays finite.
    w = tl.exp2(m_s - tl.reduce(m_s, 0, tl.standard._elementwise_max))  # 0 for empty splits
    total = tl.reduce(w * l_s, 0, tl.standard._sum_combine)
    o = tl.reduce(w[:, None] * acc, 0, tl.standard._sum_combine) / total  # [D]
    b = row // (HQ * Q)
    h = (row // Q) % HQ
    i = row % Q
    o_ptrs = out_ptr + b * stride_ob + h * stride_oh + i * stride_oq + d * stride_od
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty))
