"""Greedy with and without speculative decoding on a job's own model: where the two first
differ, and how close the target's top two tokens were there (issue #53, sitting C).

Called by ``bench/gpu/run.sh`` (stage ``divergence`` of suite ``rl``, after the arms) on a lent
GPU, and on CPU by its ``--dry-run-cpu`` and ``tests/unit/workers/bench/test_rl_step_bench.py``.
The first GPU sitting of the RL step found the step-0 greedy eval of the two arms different on
all 4 prompts in bf16, while ``pytest -m gpu`` (float32) had SD and plain greedy identical. A
verify step scores k+1 positions in one forward, a decode step one: in bf16 the two reduce in
another order, so logits differ in their last bits and a near-tie can flip the argmax. This
tells a near-tie from a bug: for each eval prompt and dtype it runs the torch engine greedily
with SD off and with SD on from the first token (the job's drafter and strategies), finds the
first differing token and there teacher-forces the common prefix through the model in the
same dtype and in float32, recording the top-two logit margin. A flip at a margin of a few
bf16 ulps is numerics; one at a wide margin, or any difference in float32, is a bug.

    greedy_divergence.py --job FILE --out FILE.json [--items N] [--dtypes bfloat16,float32]
                         [--device cuda] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from longtail_api.manifest import validate_file
from longtail_workers.data.loader import resolve_dataset
from longtail_workers.data.prompts import format_example
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.config import EngineConfig
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.models.loading import load_policy
from longtail_workers.runtime import initial_drafter


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--items", type=int, default=8, help="eval prompts")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the job's")
    return ap


def top_two(model: Any, ids: list[int], device: str) -> dict[str, float | int]:
    """The model's two most likely next tokens after ``ids`` and their logit gap."""
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=device)).logits[0, -1].float()  # [V]
    values, tokens = logits.topk(2)
    return {"top1": int(tokens[0]), "top2": int(tokens[1]),
            "margin": float(values[0] - values[1])}  # fmt: skip


def run_dtype(spec: Any, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    """Greedy plain vs SD-from-the-first-token for every prompt in one dtype (see module text)."""
    model, tok = load_policy(spec.model.path, dtype=dtype, device=args.device)
    drafter = initial_drafter(spec, model, spec.model.path).to(model.device)
    dataset = dataclasses.replace(spec.dataset, eval_size=args.items)
    prompts = [list(tok.encode(format_example(tok, ex, spec.dataset.apply_chat_template),
                               add_special_tokens=False))
               for ex in resolve_dataset(dataset, "eval", seed=spec.algorithm.seed)]  # fmt: skip
    budget = args.max_new_tokens or spec.algorithm.max_new_tokens
    eos = [int(tok.eos_token_id)]
    always = dataclasses.replace(spec.speculative, enabled=True, batch_threshold=65536,
                                 warmup_steps=0)  # fmt: skip
    outputs = {}
    seconds = {}
    # plain twice: a difference between two plain runs would be non-determinism, not SD
    for name, sd in (("plain", None), ("plain_again", None), ("sd", always)):
        engine = TorchEngine(model, config=EngineConfig(), speculative=sd,
                             drafter=drafter if sd else None)  # fmt: skip
        reqs = [
            GenerationRequest(p, budget, temperature=0.0, stop_token_ids=eos, request_id=f"e{i}")
            for i, p in enumerate(prompts)
        ]
        t0 = time.perf_counter()
        outputs[name] = [r.output_token_ids for r in engine.generate(reqs)]
        seconds[name] = time.perf_counter() - t0
    reference = None  # a float32 copy of the model, for the margin without bf16 rounding
    items = []
    for i, (prompt, a, b) in enumerate(zip(prompts, outputs["plain"], outputs["sd"], strict=True)):
        first = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        item: dict[str, Any] = {"i": i, "plain_tokens": len(a), "sd_tokens": len(b),
                                "identical": first is None, "first_divergence": first}  # fmt: skip
        if first is not None and first < min(len(a), len(b)):
            prefix = prompt + a[:first]
            item["plain_token"], item["sd_token"] = a[first], b[first]
            item["same_dtype"] = top_two(model, prefix, args.device)
            if dtype != "float32":
                if reference is None:
                    reference = load_policy(spec.model.path, dtype="float32", device=args.device)[0]
                item["float32"] = top_two(reference, prefix, args.device)
        items.append(item)
    del model, reference
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    margins = [it["same_dtype"]["margin"] for it in items if "same_dtype" in it]
    repeatable = sum(a == b for a, b in zip(outputs["plain"], outputs["plain_again"], strict=True))
    return {
        "dtype": dtype,
        "items": items,
        "identical": sum(it["identical"] for it in items),
        "plain_repeatable": repeatable,
        "max_margin_at_divergence": max(margins, default=None),
        "seconds": seconds,
    }


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    spec = validate_file(args.job)[0].spec
    assert spec is not None
    record: dict[str, Any] = {"job": str(args.job), "device": args.device, "dtypes": {}}
    if torch.cuda.is_available() and args.device.startswith("cuda"):
        record["device_name"] = torch.cuda.get_device_name(0)
    for dtype in args.dtypes.split(","):
        result = run_dtype(spec, dtype, args)
        record["dtypes"][dtype] = result
        args.out.write_text(json.dumps(record, indent=2) + "\n")  # each dtype as it ends
        n, margin = len(result["items"]), result["max_margin_at_divergence"]
        print(f"{dtype}: {result['identical']}/{n} identical (plain vs plain: "
              f"{result['plain_repeatable']}); margin at divergence max {margin}; "
              f"{result['seconds']}")  # fmt: skip
        for it in result["items"]:
            print("  ", json.dumps(it))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
