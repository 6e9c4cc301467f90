"""Gather one row-sharded tensor whole on the group's first rank only, asynchronously.

``trainer/sharding.py`` (:func:`~longtail_workers.trainer.sharding.gather_tensors`) starts one
gather per FSDP2 parameter of a weight sync through a :class:`RowGatherer` (the policy keeps one)
and consumes them with :func:`one_ahead`, as ``bench/bench_broadcast.py`` does for its world-2
trainer. A weight sync needs each whole tensor on rank 0 alone (rank 0 packs and
sends; the other ranks drop what they gathered), so instead of ``DTensor.full_tensor()`` (an
all-gather: every rank receives every shard) every other rank sends its rows to rank 0 in one
batch of point-to-point operations. Rank 0 receives the same bytes as in an all-gather, the
others receive nothing: on a CPU trainer (gloo over loopback) that made the gather 2.7x faster
(docs/performance.md), and on GPUs it leaves the other ranks' links free. The operations are
asynchronous, so the caller can post the next tensor's gather before it uses this one (on a GPU
the NCCL transfer then overlaps the pack kernels).

Rows follow FSDP2's ``Shard(0)`` split (``torch.chunk``: the first ranks hold
``ceil(rows / world)`` rows, the last ones fewer, possibly none); each rank checks its own share
against it, so a layout this module does not know fails loudly instead of gathering garbage.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from longtail_workers.weights.buffers import BufferPool


def row_split(rows: int, world: int) -> list[int]:
    """Rows held by each rank of ``world`` for a tensor of ``rows`` rows (``torch.chunk``)."""
    chunk = -(-rows // world)  # ceil
    return [max(0, min(chunk, rows - r * chunk)) for r in range(world)]


class RowGather:
    """One tensor's gather in flight; :meth:`wait` gives the whole tensor on the group's first
    rank and this rank's own rows on the others."""

    def __init__(
        self, local: torch.Tensor, whole: torch.Tensor | None, works: list[dist.Work]
    ) -> None:
        self.local, self.whole, self._works = local, whole, works

    def wait(self) -> torch.Tensor:
        """Block until this rank's operations are done (idempotent)."""
        works, self._works = self._works, []
        for work in works:
            work.wait()
        return self.whole if self.whole is not None else self.local


def start_row_gather(
    local: torch.Tensor,
    shape: Sequence[int],
    group: dist.ProcessGroup | None = None,
    whole: torch.Tensor | None = None,
) -> RowGather:
    """Post the gather of a tensor of global ``shape`` whose rows are split over ``group``'s
    ranks as :func:`row_split` says; ``local`` is this rank's rows (any dtype: what travels).

    Every rank of ``group`` must call it for the same tensors in the same order. The first rank
    of the group receives every other rank's rows into ``whole`` (``shape``, ``local``'s dtype
    and device; default a new tensor).
    """
    world, me = dist.get_world_size(group), dist.get_rank(group)
    split = row_split(int(shape[0]), world)
    if tuple(local.shape) != (split[me], *shape[1:]):
        raise RuntimeError(
            f"trainer rank {me} holds rows of shape {tuple(local.shape)} of a tensor of shape "
            f"{tuple(shape)}, not the {split[me]} rows of an even row split over {world} ranks "
            "(FSDP2's Shard(0)); this layout cannot be gathered row-wise"
        )
    local = local.contiguous()
    first = dist.get_global_rank(group, 0) if group is not None else 0
    if me != 0:
        if split[me] == 0:
            return RowGather(local, None, [])
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, local, first, group)])
        return RowGather(local, None, works)
    if whole is None:
        whole = torch.empty(tuple(shape), dtype=local.dtype, device=local.device)
    whole[: split[0]].copy_(local)
    ops, start = [], split[0]
    for r in range(1, world):
        if split[r]:
            peer = dist.get_global_rank(group, r) if group is not None else r
            ops.append(dist.P2POp(dist.irecv, whole[start : start + split[r]], peer, group))
        start += split[r]
    works = dist.batch_isend_irecv(ops) if ops else []
    return RowGather(local, whole, works)


class RowGatherer:
    """Posts row gathers whose whole tensors land in reused buffers of ``capacity`` bytes (the
    largest tensor's) instead of a fresh tensor each: a fresh multi-MB CPU tensor costs its
    page faults on every sync. A buffer is reused once nothing views the tensor given out in it
    (``weights.buffers.BufferPool``), so a caller that keeps tensors gets fresh ones."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pools: dict[str, BufferPool] = {}  # by device

    def start(
        self, local: torch.Tensor, shape: Sequence[int], group: dist.ProcessGroup | None = None
    ) -> RowGather:
        """:func:`start_row_gather` into a reused buffer (on the group's first rank)."""
        whole = None
        if dist.get_rank(group) == 0:
            nbytes = local.element_size() * math.prod(shape)
            if nbytes > self.capacity:
                raise ValueError(f"a {nbytes}-byte tensor does not fit {self.capacity} bytes")
            pool = self._pools.setdefault(str(local.device), BufferPool(2, str(local.device)))
            whole = pool.take(self.capacity)[:nbytes].view(local.dtype).view(tuple(shape))
        return start_row_gather(local, shape, group, whole)


def one_ahead(gathers: Iterable[RowGather]) -> Iterator[torch.Tensor]:
    """The result of each gather of ``gathers`` (a lazy iterable that posts one when asked) in
    order, the next one posted before this one is waited for and given out: the transfer of
    tensor ``i + 1`` overlaps whatever the caller does with tensor ``i``. The caller holds at
    most two results (the one given out and the one in flight)."""
    ahead: RowGather | None = None
    for gather in gathers:
        if ahead is not None:
            yield ahead.wait()
        ahead = gather
    if ahead is not None:
        yield ahead.wait()
