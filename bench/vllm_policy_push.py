"""Pushing a policy version into a live vLLM engine: one blob (before #33) against buckets.

Run by hand (``python bench/vllm_policy_push.py``); docs/vllm.md records its figures (#33
deliverable 6). For each model (``builtin:tiny``, and a random Qwen2-0.5B-shaped policy in bf16
with untied LM head, built with the tests' ``tiny_qwen2`` double and saved to a temporary
directory; nothing is downloaded) and each method it starts a real vLLM CPU engine
(``VllmEngine``) in a fresh process, pushes the engine's torch copy ``--repeat`` times after a
warm-up push, and prints one row (medians): seconds per push and the peak extra memory of the
process while the push runs (RSS growth, sampled every 5 ms).

* ``blob``: the push before #33, as ``vllm_ext.longtail_load_policy`` did it: the whole state
  dict serialised to one safetensors blob, loaded back into tensors in vLLM's worker and
  applied with one ``reload_weights`` call.
* ``buckets``: ``VllmEngine.policy_loaded(bucket_bytes=...)`` (``engine/vllm/vllm_push.py``):
  buckets of references to the torch copy's tensors inside one layerwise reload.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SHAPES = {"0.5B": dict(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14)}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def peak_growth(fn: Callable[[], None]) -> tuple[float, int]:
    """Seconds of ``fn()`` and the process's peak RSS growth meanwhile."""
    before, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    return seconds, max(peak[0], _rss()) - before


def _model(name: str, tmp: Path) -> tuple[torch.nn.Module, Path]:
    from longtail_workers.models.loading import load_policy, resolve_model_path

    if name == "tiny":
        model, _ = load_policy("builtin:tiny", dtype="float32")
        return model, resolve_model_path("builtin:tiny")
    # The random Qwen2 is the tests' double (tests/doubles/tiny_targets.py).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "doubles"))
    from tiny_targets import tiny_qwen2

    model = tiny_qwen2(
        vocab_size=151936,
        num_kv_heads=2,
        dtype=torch.bfloat16,
        **SHAPES[name],  # type: ignore[arg-type]
    )
    model.save_pretrained(tmp)
    return model, tmp


def one(name: str, method: str, repeat: int, bucket_mb: int) -> dict[str, Any]:
    """Measure one (model, method) pair in this process; returns its row."""
    from safetensors.torch import load

    from longtail_workers.engine.vllm.vllm_engine import VllmEngine, VllmEngineConfig
    from longtail_workers.weights.checksum import serialize_state_dict

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        model, path = _model(name, Path(tmp))
        config = VllmEngineConfig(threads=2, max_model_len=512)
        engine = VllmEngine(model, path, config=config)
        try:

            def blob() -> None:
                data = serialize_state_dict(model.state_dict())
                weights = iter(load(data).items())
                engine.llm.collective_rpc(
                    "reload_weights",
                    kwargs={"weights_iterator": weights, "is_checkpoint_format": True},
                )

            def buckets() -> None:
                engine.policy_loaded(bucket_bytes=bucket_mb << 20)

            push = blob if method == "blob" else buckets
            runs = [peak_growth(push) for _ in range(repeat + 1)][1:]  # first: warm-up
        finally:
            engine.close()
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {
        "model": name,
        "method": method,
        "MB": round(nbytes / 2**20),
        "bucket_MB": bucket_mb if method == "buckets" else None,
        "seconds": round(statistics.median(s for s, _ in runs), 3),
        "peak_extra_MB": round(statistics.median(m for _, m in runs) / 2**20),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,0.5B")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--methods", default="blob,buckets")
    parser.add_argument("--bucket-mb", type=int, default=1024, help="spec.weightSync.bucketMB")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one, args.repeat, args.bucket_mb)))
        return
    for name in args.models.split(","):
        for method in args.methods.split(","):
            argv = [sys.executable, __file__, "--one", name, method, "--repeat", str(args.repeat)]
            argv += ["--bucket-mb", str(args.bucket_mb)]
            out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=1800)
            print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
