"""CPU quantities as numbers, and the torch thread count a role's ``resources.cpu`` gives."""

from __future__ import annotations

import pytest

from longtail_api.spec import ResourcesSpec, cpu_quantity


@pytest.mark.parametrize(
    ("value", "number", "threads"),
    [
        ("1", 1.0, 1),
        (2, 2.0, 2),
        ("500m", 0.5, 1),  # a fraction still gets one thread
        ("1.5", 1.5, 1),  # rounded down: a 1.5-CPU quota throttles two busy threads
        ("2500m", 2.5, 2),
        (".5", 0.5, 1),
        ("+3", 3.0, 3),
        ("1e1", 10.0, 10),
        ("2k", 2000.0, 2000),
    ],
)
def test_cpu_quantity_and_threads(value: int | str, number: float, threads: int) -> None:
    assert cpu_quantity(value) == pytest.approx(number)
    assert ResourcesSpec(cpu=value).cpu_threads() == threads


@pytest.mark.parametrize("value", ["two", "1.5 cores", "", "m"])
def test_a_non_quantity_is_refused_with_a_hint(value: str) -> None:
    with pytest.raises(ValueError, match="Kubernetes quantity such as 2, 500m"):
        cpu_quantity(value)
