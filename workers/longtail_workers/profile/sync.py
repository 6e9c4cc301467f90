"""Timed policy weight sync: publish on the trainer's server, pull and load on a rollout worker.

Called by :mod:`longtail_workers.profile.main`. Every RL step ends with the new policy version
going from the trainer to every rollout worker before their next rollout: the trainer publishes
its state dict on its :class:`~longtail_workers.weights.http_sync.WeightServer`, each worker
pulls it with :class:`~longtail_workers.weights.http_sync.HttpWeightClient` (checksummed) and
loads it into its model. :func:`weight_sync_seconds` times exactly that, over loopback with the
profiled model's own weights; the workers pull in parallel, so one pull is the step's cost when
the network is not the bottleneck (across machines it can be: say so when reading the figure).
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer


def weight_sync_seconds(policy: nn.Module, repeats: int) -> float:
    """Median seconds of publish + pull + ``load_state_dict`` of ``policy``'s weights."""
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    times = []
    with WeightServer() as server:
        client = HttpWeightClient(server.url, timeout_s=600.0)
        for version in range(1, max(1, repeats) + 2):  # the first round warms the connection
            start = time.perf_counter()
            server.publish(version, state)
            _, pulled = client.fetch(version)
            with torch.no_grad():
                policy.load_state_dict(pulled)
            if version > 1:
                times.append(time.perf_counter() - start)
    return statistics.median(times)
