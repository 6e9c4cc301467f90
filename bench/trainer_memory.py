"""Benchmark: trainer memory per rank at world 1, 2 and 4 (FSDP2 on gloo, CPU).

Run: ``.venv/bin/python bench/trainer_memory.py [--worlds 1 2 4] [--dtype float32]``. For each
world size it starts that many rank processes (``--rank`` mode of this file) on a random-init
Qwen2 of about 0.5B parameters (Qwen2.5-0.5B's shape; the model is built on the meta device,
sharded with :func:`~longtail_workers.trainer.sharding.shard_policy` and only then materialised,
so no rank ever holds the whole model), and runs one real GRPO update
(:meth:`~longtail_workers.trainer.policy.Policy.train`: micro-batched forward/backward, gradient
reduce-scatter, AdamW) on a small synthetic batch. Each rank reports the bytes of its parameter
shard, of its AdamW state, and its peak resident memory (``ru_maxrss``: activations, gathered
layers and the Python/torch runtime included). Prints a table and writes
``bench/results/trainer_memory.json``; asserts nothing about speed or memory.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "trainer_memory.json"
GIB = 1024**3
QWEN25_05B = dict(  # Qwen2.5-0.5B's architecture (random weights)
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
    tie_word_embeddings=True,
)  # fmt: skip


def local_bytes(tensors: list[Any]) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor counts its local shard only)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def rank_main(rank: int, world_size: int, port: int, dtype: str, out: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from longtail_api.rendezvous import TrainerRendezvous
    from longtail_workers.trainer.batch import GrpoBatch
    from longtail_workers.trainer.optim import TrainConfig
    from longtail_workers.trainer.policy import Policy
    from longtail_workers.trainer.sharding import shard_policy
    from longtail_workers.trainer.world import join_world

    torch.set_num_threads(1)
    rendezvous = TrainerRendezvous("127.0.0.1", port, nnodes=world_size, node_rank=rank)
    world = join_world(rendezvous, 0, "cpu", timeout_s=1800.0)
    config = Qwen2Config(**QWEN25_05B)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model = shard_policy(model, world, activation_checkpointing=False)
    model.to_empty(device="cpu")  # materialise this rank's shards only
    if not world.sharded:
        model.tie_weights()  # to_empty re-created the tied LM head as its own tensor; FSDP does not
    gen = torch.Generator().manual_seed(rank)
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.normal_(0.0, 0.02, generator=gen)
        rotary = model.model.rotary_emb  # its inv_freq buffer was on meta too: recompute it
        for name in ("inv_freq", "original_inv_freq"):
            buf = getattr(rotary, name, None)
            if isinstance(buf, torch.Tensor):
                buf.copy_(torch.tensor(_inv_freq(config), dtype=buf.dtype))
    params = list(model.parameters())
    param_bytes = local_bytes(params)
    policy = Policy(model, TrainConfig(learning_rate=1e-5, micro_batch_tokens=128), world)
    rows, width = 4, 64  # [B, T]: 4 answers of 32 prompt + 32 response tokens
    ids = torch.randint(0, config.vocab_size, (rows, width), generator=gen)
    attention = torch.ones(rows, width, dtype=torch.long)
    response = torch.zeros(rows, width, dtype=torch.long)
    response[:, 32:] = 1
    batch = GrpoBatch(ids, attention, response, -torch.rand(rows, width), torch.randn(rows))
    stats = policy.train(batch, 1)
    optim_bytes = local_bytes(
        [v for s in policy.optimizer.state.values() for v in s.values() if v.dim() > 0]
    )
    report = {
        "rank": rank,
        "world": world_size,
        "params": sum(p.numel() for p in params),
        "param_gib": param_bytes / GIB,
        "grad_gib": param_bytes / GIB,  # one gradient shard per parameter shard, same dtype
        "adamw_gib": optim_bytes / GIB,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
        "loss": stats.loss,
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(report))
    world.close()


def _inv_freq(config: Any) -> list[float]:
    dim = config.hidden_size // config.num_attention_heads
    base = float(getattr(config, "rope_theta", 10000.0))
    return [1.0 / base ** (i / dim) for i in range(0, dim, 2)]


def run_world(world_size: int, dtype: str) -> list[dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--world",
                              str(world_size), "--port", str(port), "--dtype", dtype, "--out", tmp])
            for r in range(world_size)
        ]  # fmt: skip
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"world {world_size}: rank exit codes {codes}")
        return [json.loads((Path(tmp) / f"rank-{r}.json").read_text()) for r in range(world_size)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.world, args.port, args.dtype, Path(args.out))
        return
    table = {w: run_world(w, args.dtype) for w in args.worlds}
    first = table[args.worlds[0]][0]
    print(f"Qwen2 (Qwen2.5-0.5B shape), {first['params'] / 1e6:.0f}M parameters, {args.dtype}, "
          f"CPU gloo, one GRPO update (4 x 64 tokens); per rank, worst rank shown")  # fmt: skip
    print("| world | params GiB | grads GiB | AdamW GiB | params+grads+AdamW GiB | peak RSS GiB |")
    print("|------:|-----------:|----------:|----------:|-----------------------:|-------------:|")
    for w, ranks in table.items():
        worst = max(ranks, key=lambda r: r["peak_rss_gib"])
        p, g = max(r["param_gib"] for r in ranks), max(r["grad_gib"] for r in ranks)
        a = max(r["adamw_gib"] for r in ranks)
        print(f"| {w} | {p:.2f} | {g:.2f} | {a:.2f} | {p + g + a:.2f} | "
              f"{worst['peak_rss_gib']:.2f} |")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": platform.platform(), "dtype": args.dtype,
                                   "worlds": table}, indent=2) + "\n")  # fmt: skip
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
