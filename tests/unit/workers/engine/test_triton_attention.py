"""Tests for the capture-safe Triton slot attention (``kvcache/triton_attention.py``).

They run the kernels on CPU in Triton's interpreter (``TRITON_INTERPRET=1``) against a plain
per-query torch softmax. The interpreter cannot do arithmetic on bfloat16 (it stores it as raw
``uint16`` bits, and its ``tl.dot`` multiplies those bits: triton-lang/triton#11584), so half
precision is checked in fp16 here and bf16 only by the GPU test. Cache slots the kernel must not
read hold NaN, so any stray read shows up as NaN in the output.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (the dev extra pins it on Linux)")

from longtail_workers.kvcache import triton_attention as ta

# The interpreter turns a one-element loop bound into an int the way NumPy 1.25 deprecated.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run kernels in Triton's interpreter: the module jits per flag, so no reload is needed."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    row0: int,
    q_pos: torch.Tensor,
    lo: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Query (b, h, i): softmax over slots lo..q_pos of cache row row0 + b, in float64."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    group = q.shape[1] // k_cache.shape[1]
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                first, last = int(lo[b, i]), int(q_pos[b, i])
                keys = k_cache[row0 + b, h // group, first : last + 1].double()
                values = v_cache[row0 + b, h // group, first : last + 1].double()
                weights = torch.softmax(keys @ q[b, h, i].double() * scale, dim=0)
                out[b, h, i] = weights @ values
    return out


def make_case(
    lengths: list[int],
    q_heads: int,
    kv_heads: int,
    n_q: int,
    *,
    head_dim: int = 16,
    max_len: int = 128,
    row0: int = 0,
    window: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> dict[str, Any]:
    """Inputs for rows of ``lengths`` tokens whose last ``n_q`` slots are the queries.

    Cache rows outside ``row0 .. row0 + B`` and each row's slots outside [min lo, max q_pos]
    hold NaN: the kernel must never read them.
    """
    gen = torch.Generator().manual_seed(sum(lengths) + 7 * n_q + q_heads)
    batch = len(lengths)
    shape = (row0 + batch + 1, kv_heads, max_len, head_dim)
    k = torch.full(shape, float("nan"))
    v = torch.full(shape, float("nan"))
    q_pos = torch.tensor([[max(0, n - n_q + i) for i in range(n_q)] for n in lengths])  # [B, Q]
    lo = q_pos - window + 1 if window is not None else torch.zeros_like(q_pos)
    lo = lo.clamp(min=0)  # [B, Q]
    for b in range(batch):
        first, end = int(lo[b].min()), int(q_pos[b].max()) + 1
        k[row0 + b, :, first:end] = torch.randn(kv_heads, end - first, head_dim, generator=gen)
        v[row0 + b, :, first:end] = torch.randn(kv_heads, end - first, head_dim, generator=gen)
    q = torch.randn(batch, q_heads, n_q, head_dim, generator=gen)
    return {
        "q": q.to(device, dtype),
        "k_cache": k.to(device, dtype),
        "v_cache": v.to(device, dtype),
        "row0": row0,
        "q_pos": q_pos.to(device),
        "lo": lo.to(device),
        "scale": head_dim**-0.5,
    }


CASES = {
    "decode-mha-ragged": dict(lengths=[1, 37, 128], q_heads=2, kv_heads=2, n_q=1),
    "decode-gqa-row0": dict(lengths=[20, 1, 90], q_heads=4, kv_heads=2, n_q=1, row0=2),
    "decode-gqa-window": dict(lengths=[100, 3, 64], q_heads=4, kv_heads=2, n_q=1, window=24),
    "verify-gqa-ragged": dict(lengths=[5, 61, 100], q_heads=4, kv_heads=2, n_q=5, row0=1),
    "verify-mha-window": dict(lengths=[128, 9], q_heads=2, kv_heads=2, n_q=5, window=7),
}
CONFIGS = {
    "auto": None,
    "one-split": ta.LaunchConfig(num_splits=1, block_m=32, block_n=16),
    # Eight splits of 16-slot blocks: short rows leave most splits empty.
    "eight-splits": ta.LaunchConfig(num_splits=8, block_m=32, block_n=16),
}


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_reference(case: dict[str, Any], config: ta.LaunchConfig | None) -> None:
    inputs = make_case(**case)
    out = ta.slot_attention(**inputs, config=config)
    assert out.shape == inputs["q"].shape and out.dtype == torch.float32
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), reference(**inputs), atol=1e-4, rtol=1e-4)


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_large_logits(config: ta.LaunchConfig | None) -> None:
    """Logits in the hundreds: the running and the cross-split maxima keep exp from overflowing."""
    inputs = make_case([3, 77, 120], q_heads=4, kv_heads=2, n_q=2)
    inputs["q"] = inputs["q"] * 100
    out = ta.slot_attention(**inputs, config=config)
    torch.testing.assert_close(out.double(), reference(**inputs), atol=1e-4, rtol=1e-4)


@pytest.mark.usefixtures("interpret")
def test_out_and_strided_queries() -> None:
    """``out=`` is filled and returned; queries and ``out`` may be transposed [B, Q, Hq, D]
    views (the layout the model wants back, so the caller need not copy)."""
    inputs = make_case([12, 40], q_heads=4, kv_heads=2, n_q=3, window=16)
    inputs["q"] = inputs["q"].transpose(1, 2).contiguous().transpose(1, 2)  # same values, strided
    assert not inputs["q"].is_contiguous()
    for out in (
        torch.full_like(inputs["q"], float("nan"), memory_format=torch.contiguous_format),
        torch.full((2, 3, 4, 16), float("nan")).transpose(1, 2),  # [B, Hq, Q, D] view
    ):
        got = ta.slot_attention(**inputs, out=out)
        assert got is out
        torch.testing.assert_close(out.double(), reference(**inputs), atol=1e-4, rtol=1e-4)


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_fp16(config: ta.LaunchConfig | None) -> None:
    inputs = make_case([7, 50, 128], q_heads=4, kv_heads=2, n_q=2, dtype=torch.float16)
    out = ta.slot_attention(**inputs, config=config)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double(), reference(**inputs), atol=2e-3, rtol=2e-3)


def test_launch_does_not_depend_on_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Grid, compile-time constants and scratch shapes come from shapes only, so a CUDA graph
    captured with one set of row lengths replays correctly with any other."""
    launches: list[tuple[Any, ...]] = []

    class Recorder:
        def __getitem__(self, grid: tuple[int, ...]) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args]
                launches.append((grid, shapes, sorted(kwargs.items())))

            return launch

    monkeypatch.setattr(ta, "_kernels", lambda interpret: (Recorder(), Recorder()))
    short = make_case([1, 2], q_heads=4, kv_heads=2, n_q=5)
    long = make_case([128, 100], q_heads=4, kv_heads=2, n_q=5, window=9)
    for inputs in (short, long):
        ta.slot_attention(**inputs)
    assert len(launches) == 4  # split and combine kernels, twice
    assert launches[:2] == launches[2:]


def test_launch_config() -> None:
    """Splits fill an H100 (132 SMs) at small batch, never exceed the blocks, vanish at scale."""

    def config(batch: int, max_len: int, group_rows: int, itemsize: int = 2) -> ta.LaunchConfig:
        return ta.launch_config(batch, 2, max_len, group_rows, 128, itemsize, sm_count=132)

    one = config(1, 4096, group_rows=6)
    assert one == config(1, 4096, group_rows=6)
    assert one.num_splits > 1 and one.num_splits & (one.num_splits - 1) == 0
    assert one.num_splits <= 4096 // one.block_n and one.block_m == 16
    big = config(256, 4096, group_rows=63)
    assert big.num_splits == 1 and big.block_m == 64
    assert config(1, 16, group_rows=1).num_splits == 1
    assert config(1, 4096, group_rows=6, itemsize=4).block_n < one.block_n


TENSORS = ("q", "k_cache", "v_cache")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.update({n: c[n][..., :8].contiguous() for n in TENSORS}), "power of two"),
        (lambda c: c.update(q=c["q"][:, :3]), "multiple of kv heads"),
        (lambda c: c.update(k_cache=c["k_cache"].double()), "share one dtype"),
        (lambda c: c.update(v_cache=c["v_cache"].mT.contiguous().mT), "contiguous"),
        (lambda c: c.update(row0=3), "must lie in the cache"),
        (lambda c: c.update(lo=c["lo"][:, :1]), "q_pos and lo must be"),
    ],
)
def test_rejects_unsupported(change: Any, message: str) -> None:
    inputs = make_case([4, 9], q_heads=4, kv_heads=2, n_q=2, max_len=16)
    change(inputs)
    with pytest.raises(ValueError, match=message) as error:
        ta.slot_attention(**inputs)
    assert "q (" in str(error.value)  # names the shapes and dtypes


def test_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert ta.available(torch.device("cuda"))
    assert not ta.available(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert ta.available(torch.device("cpu"))


def test_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ta, "triton", None)
    assert not ta.available(torch.device("cuda"))
    with pytest.raises(RuntimeError, match="Triton"):
        ta.slot_attention(**make_case([3], q_heads=2, kv_heads=2, n_q=1, max_len=16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_realistic(monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2-1.5B attention shapes in bf16, compiled for the GPU (not interpreted)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    inputs = make_case(
        [2048, 1, 700, 1500], q_heads=12, kv_heads=2, n_q=1, head_dim=128, max_len=2048,
        row0=1, dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    out = ta.slot_attention(**inputs)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference(**inputs), atol=2e-2, rtol=2e-2)
    verify = make_case(
        [9, 300, 2048, 1200], q_heads=12, kv_heads=2, n_q=9, head_dim=128, max_len=2048,
        window=512, dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    torch.testing.assert_close(
        ta.slot_attention(**verify).double(), reference(**verify), atol=2e-2, rtol=2e-2
    )
