"""Pushing a policy version from the rollout worker's torch copy into the live vLLM engine.

Called by :meth:`~longtail_workers.engine.vllm.vllm_engine.VllmEngine.policy_loaded` only (after the
worker has loaded and verified the version in its torch copy, whatever the transport). The
state dict goes to vLLM's worker in buckets of at most ``bucket_bytes`` (a tensor larger than a
bucket goes alone), one ``collective_rpc`` each, between an open and a close of vLLM's
layerwise reload (``vllm_ext``). The buckets hold references to the torch copy's tensors: the
engine core runs in this process, so nothing is serialised and the only copy is vLLM's own
into its parameters. The bucket size bounds how much one call hands over, and how many layers
vLLM holds half-loaded at once.

All or nothing: any failure (a bucket vLLM cannot load, a parameter the state dict does not
cover) unwinds the open reload and raises :class:`PolicyPushError`; the engine then refuses to
generate until a later push has completed (``VllmEngine``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from torch import Tensor

log = logging.getLogger(__name__)
Bucket = list[tuple[str, Tensor]]


class PolicyPushError(RuntimeError):
    """A policy push into vLLM failed; vLLM holds no whole version until the next push."""


def policy_buckets(state: Mapping[str, Tensor], bucket_bytes: int) -> Iterator[Bucket]:
    """``state``'s ``(name, tensor)`` pairs in order, cut into runs of at most
    ``bucket_bytes``; a tensor larger than that is a bucket of its own."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes is {bucket_bytes}: give a positive size")
    bucket: Bucket = []
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def push_policy(llm: Any, state: Mapping[str, Tensor], bucket_bytes: int) -> tuple[int, int]:
    """Push ``state`` (HF names) into ``llm`` (a ``vllm.LLM`` with ``vllm_ext``'s extension)
    in buckets; returns ``(buckets, bytes)``, or raises :class:`PolicyPushError`."""
    buckets = list(policy_buckets(state, bucket_bytes))
    nbytes = sum(t.numel() * t.element_size() for b in buckets for _, t in b)
    where = "opening the push"
    try:
        llm.collective_rpc("longtail_policy_begin")
        for k, bucket in enumerate(buckets):
            where = f"bucket {k + 1} of {len(buckets)} ({bucket[0][0]} .. {bucket[-1][0]})"
            llm.collective_rpc("longtail_policy_bucket", args=(bucket,))
        where = "closing the push"
        llm.collective_rpc("longtail_policy_finish")
    except Exception as exc:  # any failure tears the version: say where, unwind, re-raise
        _abort(llm)
        raise PolicyPushError(f"policy push into vLLM failed at {where}: {exc}") from exc
    return len(buckets), nbytes


def _abort(llm: Any) -> None:
    """Unwind the open reload so vLLM's parameters are real tensors again."""
    try:
        llm.collective_rpc("longtail_policy_abort")
    except Exception:  # the push error is the one to report; this one is logged beside it
        log.exception("unwinding the failed policy push in vLLM failed too")
