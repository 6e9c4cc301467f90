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


def test_a_role_with_gpus_loads_its_model_on_cuda_and_fails_loudly_without_one() -> None:
    from longtail_workers.models.loading import resolve_device
    from longtail_workers.runtime import role_device

    assert role_device(ResourcesSpec(gpus=0)) == "cpu"
    assert role_device(ResourcesSpec(gpus=2)) == "cuda"
    if not torch.cuda.is_available():  # what a GPU pod that sees no GPU would get
        with pytest.raises(ValueError, match="no CUDA GPU is visible"):
            resolve_device(role_device(ResourcesSpec(gpus=1)))
