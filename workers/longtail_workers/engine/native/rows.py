"""The running batch as static device buffers: per-row state, token and hidden-state stores, caches.

Owned by :class:`~longtail_workers.engine.native.torch_engine.TorchEngine`; the step functions
(``steps.py``) read and update it on the device, the engine admits and retires rows through it
on the host. Every buffer has ``capacity`` rows and is allocated once per engine shape, so a step
over rows ``[0, B)`` always touches the same addresses and can be captured (``graphs.py``).

Live rows are packed at the top: rows ``[0, n)`` are the ``n`` sequences being decoded, in
:attr:`RowState.seqs` order; admission appends below them, and retiring a row moves the last
live row into its place (one copy of that row's slots, :meth:`RowState.retire`). Free rows are
reset to an inert state (one token, no budget), so a step over a padded batch bucket computes
garbage for them that nothing reads and that changes nothing.

Per row ``b`` with ``N = n_tok[b]`` committed tokens ``x_0 .. x_{N-1}`` (prompt and output):
``tokens[b, j] = x_j``; the target's cache holds positions ``0 .. N-2`` (``x_{N-1}`` is fed by
the next step) and ``hidden[b, j] = h_j``, the target's state at position j. Pairs follow the
drafter's convention (``drafter/pairs.py``): pair j is ``(x_{j+1}, h_j)``; ``N - 1`` pairs exist
and the drafter's cache holds pairs ``P-1 .. drafter_done-1`` (its context starts at the first
response pair, never the prompt's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from longtail_workers.engine.native.batch import SequenceState
from longtail_workers.engine.sampling import stream_keys
from longtail_workers.kvcache.slots import SlotKVCache


@dataclass(frozen=True)
class RowShape:
    """What the buffers are sized for; a new shape means new buffers (and new graphs)."""

    capacity: int
    """Rows: the most sequences decoded together."""
    length: int
    """Slots per row: prompt + output + a speculative step's overhang."""
    stop_width: int
    """Stop tokens per row (shorter lists are padded with -1)."""
    hidden: bool
    """Keep every position's target hidden state (drafter input, ``return_hidden_states``)."""
    drafter: bool
    """Allocate a drafter cache."""

    def covers(self, other: RowShape) -> bool:
        return (
            self.capacity >= other.capacity
            and self.length >= other.length
            and self.stop_width >= other.stop_width
            and (self.hidden or not other.hidden)
            and (self.drafter or not other.drafter)
        )


class RowState:
    """Static per-row buffers of the running batch; see the module text."""

    def __init__(
        self,
        shape: RowShape,
        target_kv: SlotKVCache,
        draft_kv: SlotKVCache | None,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        r, length, dev = shape.capacity, shape.length, device
        self.shape, self.device = shape, device
        self.kv, self.draft_kv = target_kv, draft_kv

        def ints() -> torch.Tensor:
            return torch.zeros(r, dtype=torch.long, device=dev)

        self.n_tok, self.out_len, self.max_new = ints(), ints(), ints()  # [R]
        self.prompt_len, self.stream_key, self.drafter_done = ints(), ints(), ints()  # [R]
        self.temperature = torch.ones(r, dtype=torch.float64, device=dev)  # [R]
        self.top_p = torch.ones(r, dtype=torch.float64, device=dev)  # [R]
        self.stop_ids = torch.full((r, shape.stop_width), -1, dtype=torch.long, device=dev)
        self.tokens = torch.zeros(r, length, dtype=torch.long, device=dev)  # [R, L]
        self.hidden = (
            torch.zeros(r, length, hidden_size, dtype=dtype, device=dev) if shape.hidden else None
        )  # [R, L, H]
        self.seqs: list[SequenceState] = []
        # Host mirrors of what the host decides with (never read back from the device).
        self.n_tok_h = np.ones(r, dtype=np.int64)
        self.out_len_h = np.zeros(r, dtype=np.int64)
        self.max_new_h = np.zeros(r, dtype=np.int64)
        self.drafter_done_h = np.zeros(r, dtype=np.int64)
        self._reset(0, r)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def length(self) -> int:
        return self.shape.length

    def _reset(self, lo: int, hi: int) -> None:
        """Make rows ``[lo, hi)`` inert: one token, nothing to emit, no stop."""
        if hi <= lo:
            return
        self.n_tok[lo:hi] = 1
        self.out_len[lo:hi] = 0
        self.max_new[lo:hi] = 0
        self.prompt_len[lo:hi] = 1
        self.drafter_done[lo:hi] = 0
        self.temperature[lo:hi] = 1.0
        self.top_p[lo:hi] = 1.0
        self.stop_ids[lo:hi] = -1
        self.n_tok_h[lo:hi], self.out_len_h[lo:hi] = 1, 0
        self.max_new_h[lo:hi], self.drafter_done_h[lo:hi] = 0, 0

    def remaining(self) -> np.ndarray:
        """Tokens each live row may still emit ``[n]`` (host)."""
        n = len(self.seqs)
        return self.max_new_h[:n] - self.out_len_h[:n]

    def pending_pairs(self) -> np.ndarray:
        """Pairs each live row has that the drafter has not read ``[n]`` (host)."""
        n = len(self.seqs)
        return (self.n_tok_h[:n] - 1) - self.drafter_done_h[:n]

    def admit(self, seqs: list[SequenceState]) -> int:
        """Write ``seqs``' settings and prompts into the rows below the live ones; first row."""
        r0, g = len(self.seqs), len(seqs)
        if r0 + g > self.shape.capacity:
            raise RuntimeError(f"admitting {g} rows to {r0} of {self.shape.capacity}")
        rows = slice(r0, r0 + g)
        reqs = [s.request for s in seqs]
        dev = self.device
        prompt = [len(s.prompt) for s in seqs]
        self.n_tok[rows] = torch.tensor(prompt, device=dev)
        self.prompt_len[rows] = self.n_tok[rows]
        self.drafter_done[rows] = self.n_tok[rows] - 1
        self.out_len[rows] = 0
        self.max_new[rows] = torch.tensor([r.max_new_tokens for r in reqs], device=dev)
        self.stream_key[rows] = stream_keys(torch.tensor([s.seed_bits for s in seqs], device=dev))
        f64 = torch.float64  # torch.tensor of Python floats would round them to float32
        self.temperature[rows] = torch.tensor([r.temperature for r in reqs], dtype=f64, device=dev)
        self.top_p[rows] = torch.tensor([r.top_p for r in reqs], dtype=f64, device=dev)
        stops = torch.full((g, self.shape.stop_width), -1, dtype=torch.long)
        for i, r in enumerate(reqs):
            stops[i, : len(r.stop_token_ids)] = torch.tensor(list(r.stop_token_ids))
        self.stop_ids[rows] = stops.to(dev)
        width = max(prompt)
        ids = torch.zeros(g, width, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s.prompt)] = torch.tensor(s.prompt)
        self.tokens[rows, :width] = ids.to(dev)
        self.n_tok_h[rows] = prompt
        self.out_len_h[rows] = 0
        self.max_new_h[rows] = [r.max_new_tokens for r in reqs]
        self.drafter_done_h[rows] = np.asarray(prompt) - 1
        self.seqs = self.seqs + seqs
        return r0

    def observe(self, r0: int, keep: np.ndarray) -> None:
        """Host mirrors after a step that committed ``keep[b]`` tokens to row ``r0 + b``."""
        rows = slice(r0, r0 + len(keep))
        self.n_tok_h[rows] += keep
        self.out_len_h[rows] += keep

    @property
    def nbytes(self) -> int:
        """Bytes of every buffer: KV caches, token and hidden-state stores."""
        stores = [self.tokens] + ([self.hidden] if self.hidden is not None else [])
        total = self.kv.nbytes + sum(t.numel() * t.element_size() for t in stores)
        return total + (self.draft_kv.nbytes if self.draft_kv is not None else 0)

    def caught_up(self, first: int, count: int) -> None:
        """Host mirror: live rows ``[first, first + count)`` have every pair in the drafter."""
        rows = slice(first, first + count)
        self.drafter_done_h[rows] = self.n_tok_h[rows] - 1

    def retire(self, finished: list[int]) -> None:
        """Drop live rows ``finished`` (host indices): the last live rows move into their places."""
        if not finished:
            return
        n = len(self.seqs)
        gone = set(finished)
        survivors_below = [i for i in range(n - len(gone), n) if i not in gone]
        holes = sorted(i for i in gone if i < n - len(gone))
        assert len(holes) == len(survivors_below)
        if holes:
            src = torch.tensor(survivors_below, dtype=torch.long, device=self.device)
            dst = torch.tensor(holes, dtype=torch.long, device=self.device)
            self._move(src, dst, survivors_below, holes)
            for s, d in zip(survivors_below, holes, strict=True):
                self.seqs[d] = self.seqs[s]
        self.seqs = self.seqs[: n - len(gone)]
        self._reset(len(self.seqs), n)

    def _move(
        self, src: torch.Tensor, dst: torch.Tensor, src_h: list[int], dst_h: list[int]
    ) -> None:
        used = int(self.n_tok_h[src_h].max()) + 1  # slots the moved rows use (plus the next)
        self.kv.move_rows(src, dst, used)
        if self.draft_kv is not None:
            self.draft_kv.move_rows(src, dst, used)
        per_row = (self.n_tok, self.out_len, self.max_new, self.prompt_len, self.stream_key,
                   self.drafter_done, self.temperature, self.top_p, self.stop_ids)  # fmt: skip
        for buf in per_row:
            buf[dst] = buf[src]
        self.tokens[dst, :used] = self.tokens[src, :used]
        if self.hidden is not None:
            self.hidden[dst, :used] = self.hidden[src, :used]
        for mirror in (self.n_tok_h, self.out_len_h, self.max_new_h, self.drafter_done_h):
            mirror[dst_h] = mirror[src_h]
