"""The native engine's step functions: prefill, decode, and the commit every step ends with.

Called by :class:`~longtail_workers.engine.native.torch_engine.TorchEngine` (prefill, decode) and by
``specdec.py`` (whose speculative step ends in :func:`commit` too), through ``graphs.py``. A
step reads the batch from the static buffers of ``rows.py`` (rows ``[0, B)``, ``B`` the batch
bucket), samples on the device and writes its results back there. Decode and speculative steps
never synchronise with the host (no ``.item()``, no shape that depends on a value): with
``span`` equal to the cache length they can be captured once per (kind, bucket, depth) and
replayed. What the host needs is packed into one int64 tensor (:func:`pack`) that the engine
copies back once per step: the step's single host synchronisation.

Prefill is not captured (its shapes are the prompts'): a group of prompts, right-padded, is
written at slots ``0..P-1`` of its rows; a padding query sits at a slot past its row's prompt,
which the row's first decode step overwrites before anything reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from longtail_workers.engine.native.rows import RowState
from longtail_workers.engine.sampling import (
    STREAM_SAMPLE,
    counter_uniforms,
    sample_from_probs,
    sampling_probs,
    token_logprobs,
)
from longtail_workers.engine.target import TargetModel
from longtail_workers.kvcache.slots import SlotAttention


@dataclass(frozen=True)
class StepShape:
    """Host-side facts a step is specialised on (with the bucket, the key of a captured graph)."""

    span: int
    """Slots the reference attention reads: the cache length when captured, else just enough."""
    backend: str
    """Attention backend (``SlotAttention.backend``)."""
    any_top_p: bool
    """Some live row samples with top-p < 1 (``sampling_probs``)."""
    any_greedy: bool
    """Some live row is greedy."""


@dataclass
class StepOutput:
    """A step's results on the device, rows ``[0, B)`` of the step (see :func:`pack`)."""

    tokens: torch.Tensor
    """``[B, n]`` int64: the step's tokens; the first ``keep[b]`` were committed."""
    keep: torch.Tensor
    """``[B]`` int64: tokens committed per row (cut at a stop token and the budget)."""
    logprobs: torch.Tensor
    """``[B, n]`` float: the target's log-probs of ``tokens`` (``engine/interface.py``)."""
    stopped: torch.Tensor
    """``[B]`` bool: the row committed a stop token."""
    finished: torch.Tensor
    """``[B]`` bool: the row stopped or reached ``max_new_tokens``."""
    accepted: torch.Tensor | None = None
    """``[B]`` int64: drafts accepted (speculative steps)."""
    draft_logits: torch.Tensor | None = None
    """``[B, k, V]``: drafter logits, only when a draft observer asks for them (not captured)."""
    drafts: torch.Tensor | None = None
    """``[B, k]``: the proposed drafts, with ``draft_logits``."""


@dataclass
class HostStep:
    """:class:`StepOutput` copied to the host, rows ``[0, count)``."""

    tokens: np.ndarray
    keep: np.ndarray
    logprobs: np.ndarray
    stopped: np.ndarray
    finished: np.ndarray
    accepted: np.ndarray


def pack(out: StepOutput) -> torch.Tensor:
    """Everything the host reads, as one int64 tensor ``[B, 2n + 4]`` (one device->host copy).

    Log-probs travel as the bits of their float64 values."""
    accepted = out.accepted if out.accepted is not None else torch.zeros_like(out.keep)
    flags = torch.stack([out.keep, out.stopped.long(), out.finished.long(), accepted], dim=1)
    bits = out.logprobs.to(torch.float64).view(torch.int64)  # [B, n]
    return torch.cat([out.tokens, bits, flags], dim=1)


def unpack(packed: torch.Tensor, count: int) -> HostStep:
    """The host's view of :func:`pack`'s tensor, live rows ``[0, count)`` only (one sync)."""
    host = packed[:count].cpu().numpy()
    n = (host.shape[1] - 4) // 2
    return HostStep(
        tokens=host[:, :n],
        keep=host[:, 2 * n],
        logprobs=host[:, n : 2 * n].copy().view(np.float64),
        stopped=host[:, 2 * n + 1].astype(bool),
        finished=host[:, 2 * n + 2].astype(bool),
        accepted=host[:, 2 * n + 3],
    )


def store_hidden(rows: RowState, r0: int, positions: torch.Tensor, hidden: torch.Tensor) -> None:
    """Keep the target states ``hidden`` ``[B, Q, H]`` at ``positions`` ``[B, Q]`` (if kept)."""
    if rows.hidden is None:
        return
    b, q, h = hidden.shape
    at = positions[..., None].expand(b, q, h)
    rows.hidden[r0 : r0 + b].scatter_(1, at, hidden.to(rows.hidden.dtype))


def commit(
    rows: RowState, r0: int, new: torch.Tensor, emitted: torch.Tensor, logprobs: torch.Tensor
) -> StepOutput:
    """Commit up to ``emitted[b]`` of ``new[b]`` ``[B, n]`` to rows ``[r0, r0 + B)``.

    The run is cut after a stop token and at ``max_new_tokens``; tokens past the cut are written
    to the token store too (slots past the row's length, overwritten before they are read)."""
    b, n = new.shape
    rs = slice(r0, r0 + b)
    n_tok, out_len, max_new = rows.n_tok[rs], rows.out_len[rs], rows.max_new[rs]  # views
    idx = torch.arange(n, device=new.device)
    is_stop = (new[..., None] == rows.stop_ids[rs][:, None, :]).any(-1)  # [B, n]
    is_stop &= idx[None, :] < emitted[:, None]
    first_stop = torch.where(is_stop, idx, n).amin(1)  # [B]; n when there is none
    keep = torch.minimum(torch.minimum(emitted, first_stop + 1), max_new - out_len)
    rows.tokens[rs].scatter_(1, (n_tok[:, None] + idx).clamp_(max=rows.length - 1), new)
    n_tok.add_(keep)
    out_len.add_(keep)
    stopped = first_stop < keep
    finished = stopped | (out_len >= max_new)
    return StepOutput(new, keep, logprobs, stopped, finished)


def sample(
    rows: RowState, r0: int, logits: torch.Tensor, shape: StepShape
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row from ``logits`` ``[B, 1, V]``: ``(tokens [B, 1], logprobs)``."""
    b = logits.shape[0]
    rs = slice(r0, r0 + b)
    temperature, top_p = rows.temperature[rs], rows.top_p[rs]
    probs = sampling_probs(
        logits, temperature, top_p, any_top_p=shape.any_top_p, any_greedy=shape.any_greedy
    )
    u = counter_uniforms(rows.stream_key[rs], rows.out_len[rs][:, None], STREAM_SAMPLE)  # [B, 1]
    tokens = sample_from_probs(probs, u)  # [B, 1]
    return tokens, token_logprobs(logits, temperature, tokens)


@torch.no_grad()
def prefill(
    target: TargetModel, rows: RowState, r0: int, prompt_lengths: list[int], shape: StepShape
) -> StepOutput:
    """Prefill rows ``[r0, r0 + g)`` (prompts already in the token store); first tokens."""
    g, width, dev = len(prompt_lengths), max(prompt_lengths), rows.device
    pos = torch.arange(width, device=dev)[None, :].expand(g, width)  # [g, W]
    step = SlotAttention(pos, torch.zeros_like(pos), span=width, row0=r0)
    hidden = target.forward(rows.tokens[r0 : r0 + g, :width], rows.kv, step)  # [g, W, H]
    store_hidden(rows, r0, pos, hidden)
    last = torch.tensor(prompt_lengths, device=dev) - 1  # [g]
    h_last = hidden[torch.arange(g, device=dev), last][:, None]  # [g, 1, H]
    tokens, logprobs = sample(rows, r0, target.logits(h_last), shape)
    ones = torch.ones(g, dtype=torch.long, device=dev)
    return commit(rows, r0, tokens, ones, logprobs)


@torch.no_grad()
def decode(target: TargetModel, rows: RowState, bucket: int, shape: StepShape) -> StepOutput:
    """One token for every row of ``[0, bucket)`` from the target (capturable)."""
    last = (rows.n_tok[:bucket] - 1)[:, None]  # [B, 1] position of each row's newest token
    step = SlotAttention(last, torch.zeros_like(last), shape.span, backend=shape.backend)
    hidden = target.forward(rows.tokens[:bucket].gather(1, last), rows.kv, step)  # [B, 1, H]
    store_hidden(rows, 0, last, hidden)
    tokens, logprobs = sample(rows, 0, target.logits(hidden), shape)
    return commit(rows, 0, tokens, torch.ones_like(last[:, 0]), logprobs)
