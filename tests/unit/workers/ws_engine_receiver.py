"""A rollout worker's weights and engine as one process, for the sharded-trainer broadcast test
(``test_weight_sync_sharded_broadcast.py``): the ``builtin:tiny`` policy, a real
:class:`~longtail_workers.weights.broadcast_source.BroadcastSource`, and a torch or a vLLM
engine on the policy.

It starts the engine first and only then registers (so a broadcast never waits for an engine
start), loads every version it receives by broadcast into its model (``load_into``; a vLLM
engine then gets it pushed in buckets, ``policy_loaded``) and answers a few greedy prompts with
its engine and, under vLLM, with the torch engine on the same weights too. Each load is one
JSON line in ``OUT/NAME.jsonl``: version, how it came, sha256 of the model's state dict and the
answers' tokens (``torch``, and ``vllm`` under vLLM).

Run as ``python ws_engine_receiver.py --addr HOST:PORT --name NAME --weights-url URL --out DIR
--engine torch|vllm``; it runs until killed.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.models.loading import load_policy, resolve_model_path
from longtail_workers.weights.broadcast_source import BroadcastSource
from longtail_workers.weights.checksum import state_dict_checksum
from longtail_workers.weights.http_sync import HttpWeightClient
from longtail_workers.weights.sync import WeightSyncError

POLICY = "builtin:tiny"
PAIRS = [(12, 34), (5, 7), (123, 456), (71, 8)]


def main() -> None:
    ap = argparse.ArgumentParser()
    for flag in ("--addr", "--name", "--weights-url", "--out"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--engine", choices=("torch", "vllm"), required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.name} %(message)s")
    torch.set_num_threads(1)
    model, tok = load_policy(POLICY, dtype="float32")
    with torch.no_grad():  # start from other weights than the trainer's: every load must move
        for param in model.parameters():
            param.mul_(0.5)
    eos = int(tok.eos_token_id)
    requests = [
        GenerationRequest(list(tok(f"{a}+{b}=")["input_ids"]), 12, temperature=0.0,
                          stop_token_ids=[eos])
        for a, b in PAIRS
    ]  # fmt: skip
    vllm: Any = None
    if args.engine == "vllm":
        from longtail_workers.engine.vllm.vllm_engine import VllmEngine, VllmEngineConfig

        vllm = VllmEngine(model, resolve_model_path(POLICY), config=VllmEngineConfig(threads=1))
    http = HttpWeightClient(args.weights_url, timeout_s=30, retries=2)
    source = BroadcastSource(args.addr, args.name, http, timeout_s=30)
    log_path = Path(args.out) / f"{args.name}.jsonl"
    held = 0
    while True:
        time.sleep(0.05)
        wanted = source.received()
        if wanted is None or wanted <= held:
            continue
        line: dict[str, Any]
        try:
            held = source.load_into(model, wanted)
            line = {"version": held, "via": source.last_via}
            line["sha"] = state_dict_checksum(model.state_dict())
            line["torch"] = [r.output_token_ids for r in TorchEngine(model).generate(requests)]
            if vllm is not None:
                vllm.policy_loaded()
                line["vllm"] = [r.output_token_ids for r in vllm.generate(requests)]
        except WeightSyncError as exc:
            line = {"error": str(exc)}
        with log_path.open("a") as f:
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
