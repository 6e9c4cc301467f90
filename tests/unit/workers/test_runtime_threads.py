"""``torch_threads``: a worker's torch CPU threads from ``--threads`` or its role's CPUs."""

from __future__ import annotations

import os

import pytest
import torch

from longtail_api.spec import ResourcesSpec
from longtail_workers.runtime import torch_threads


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_explicit_threads_win() -> None:
    assert torch_threads(1, ResourcesSpec(cpu="8")) == 1
    assert torch.get_num_threads() == 1


def test_role_cpus_capped_at_the_cpus_this_process_may_use() -> None:
    available = len(os.sched_getaffinity(0))
    assert torch_threads(None, ResourcesSpec(cpu="500m")) == 1
    assert torch_threads(None, ResourcesSpec(cpu="64")) == min(64, available)
    assert torch.get_num_threads() == min(64, available)


def test_nonpositive_threads_are_refused() -> None:
    with pytest.raises(ValueError, match="--threads 0"):
        torch_threads(0, ResourcesSpec())
