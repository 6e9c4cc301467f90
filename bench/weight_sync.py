"""Policy weight sync over HTTP, old protocol against new, for Qwen2-shaped bf16 policies.

Run by hand (``python bench/weight_sync.py``); docs/performance.md records its figures (#33).
For each policy shape (Qwen2-0.5B and Qwen2-1.5B tensor shapes, random bf16 weights, tied
embedding and LM head as in the real models; nothing is downloaded) and each protocol it runs
``--repeat`` versions through a real :class:`WeightServer` on loopback and one rollout-side
client in the same process (both protocols alike), and prints one row (medians): seconds per
version end to end (publish on the trainer + pull, verify, deserialise and copy every tensor
into place; the copy goes into the trainer's own tensors, standing in for the rollout model's:
same bytes and cost, one fewer 3 GB buffer, which the old protocol's 1.5B row needs to fit in
this 23 GB machine), GB/s (canonical bytes per version / those seconds), the publish seconds,
the rollout pause (pull + load: the rollout worker cannot generate meanwhile) and the peak
extra trainer memory (the process's RSS growth while ``publish`` runs, sampled every 5 ms).

``old`` is today's protocol, not a re-implementation: the bench extracts
``workers/longtail_workers/weights/{sync,store,checksum,http_sync}.py`` as of ``--old-rev``
(the last commit before #33's pieces) with ``git show`` into a temporary package and imports
it from there (only the package name in their imports is rewritten); the HTTP server and
client modules they use are today's. ``new`` is the package in this tree. Each (shape,
protocol) runs in a fresh Python process so memory figures do not mix.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

OLD_REV = "d96853c"
"""The commit whose weights package is 'today's HTTP pull' (the parent of #33's first change)."""
SHAPES = {  # hidden, intermediate, layers, attention heads, kv heads, vocab
    "0.5B": (896, 4864, 24, 14, 2, 151936),
    "1.5B": (1536, 8960, 28, 12, 2, 151936),
}
MODULES = ("sync", "checksum", "pieces", "store", "http_sync")


def qwen2_state(shape: str) -> dict[str, torch.Tensor]:
    """Random bf16 tensors with the names and shapes of a Qwen2 model's state dict."""
    hidden, inter, layers, heads, kv_heads, vocab = SHAPES[shape]
    kv = hidden // heads * kv_heads
    out: dict[str, torch.Tensor] = {}

    def add(name: str, *dims: int) -> None:
        out[name] = torch.empty(dims, dtype=torch.bfloat16).uniform_(-0.05, 0.05)

    add("model.embed_tokens.weight", vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        add(p + "self_attn.q_proj.weight", hidden, hidden)
        add(p + "self_attn.q_proj.bias", hidden)
        for n in ("k", "v"):
            add(p + f"self_attn.{n}_proj.weight", kv, hidden)
            add(p + f"self_attn.{n}_proj.bias", kv)
        add(p + "self_attn.o_proj.weight", hidden, hidden)
        add(p + "mlp.gate_proj.weight", inter, hidden)
        add(p + "mlp.up_proj.weight", inter, hidden)
        add(p + "mlp.down_proj.weight", hidden, inter)
        add(p + "input_layernorm.weight", hidden)
        add(p + "post_attention_layernorm.weight", hidden)
    add("model.norm.weight", hidden)
    out["lm_head.weight"] = out["model.embed_tokens.weight"]  # tied, as in both models
    return out


def old_http_sync(rev: str, into: Path) -> ModuleType:
    """Import ``rev``'s weights package (verbatim but for its own package name) from ``into``."""
    repo = Path(__file__).resolve().parent.parent
    pkg = into / "oldweights"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in MODULES:
        spec = f"{rev}:workers/longtail_workers/weights/{name}.py"
        found = subprocess.run(["git", "show", spec], cwd=repo, capture_output=True, text=True)
        if found.returncode == 0:  # pieces.py did not exist then
            text = found.stdout.replace("longtail_workers.weights.", "oldweights.")
            (pkg / f"{name}.py").write_text(text)
    sys.path.insert(0, str(into))
    return importlib.import_module("oldweights.http_sync")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def timed_publish(server: Any, version: int, state: dict[str, torch.Tensor]) -> tuple[float, int]:
    """Seconds of ``server.publish`` and the process's peak RSS growth meanwhile."""
    before, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.perf_counter()
    server.publish(version, state)
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    return seconds, max(peak[0], _rss()) - before


def one(shape: str, protocol: str, repeat: int, old_rev: str) -> dict[str, Any]:
    """Measure one (shape, protocol) pair in this process; returns its row."""
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        if protocol == "old":
            mod = old_http_sync(old_rev, Path(tmp))
        else:
            mod = importlib.import_module("longtail_workers.weights.http_sync")
        state = qwen2_state(shape)
        totals, pauses, publishes, extras, nbytes = [], [], [], [], 0
        with mod.WeightServer(keep_last=1) as server:
            client = mod.HttpWeightClient(server.url, timeout_s=600.0)
            for version in range(1, repeat + 2):  # the first round warms up
                pub_s, extra = timed_publish(server, version, state)
                t0 = time.perf_counter()
                _, pulled = client.fetch(version)
                with torch.no_grad():
                    for k, v in pulled.items():  # the pulled values are equal to state's
                        state[k].copy_(v)
                del pulled
                pause = time.perf_counter() - t0
                nbytes = server.store.latest().manifest.size
                if version > 1:
                    totals.append(pub_s + pause)
                    pauses.append(pause)
                    publishes.append(pub_s)
                    extras.append(extra)
    med = sorted(totals)[len(totals) // 2]
    return {
        "shape": shape, "protocol": protocol, "gb": nbytes / 1e9, "s_per_version": med,
        "gb_s": nbytes / 1e9 / med, "publish_s": sorted(publishes)[len(publishes) // 2],
        "pause_s": sorted(pauses)[len(pauses) // 2], "extra_gb": max(extras) / 1e9,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--repeat", type=int, default=3, help="timed versions per row (median)")
    ap.add_argument("--old-rev", default=OLD_REV, help="commit holding today's protocol")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # "SHAPE:PROTOCOL", run in a child
    args = ap.parse_args()
    if args.one:
        shape, protocol = args.one.split(":")
        print(json.dumps(one(shape, protocol, args.repeat, args.old_rev)), flush=True)
        return
    print(
        f"{'policy':>6} {'protocol':>8} {'GB':>5} {'s/version':>9} {'GB/s':>6} "
        f"{'publish s':>9} {'pause s':>8} {'trainer +GB':>11}"
    )
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for shape in args.shapes:
        for protocol in ("old", "new"):
            cmd = [sys.executable, __file__, "--one", f"{shape}:{protocol}"]
            cmd += ["--repeat", str(args.repeat), "--old-rev", args.old_rev]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            r = rows[shape, protocol] = json.loads(out.strip().splitlines()[-1])
            print(
                f"{shape:>6} {protocol:>8} {r['gb']:5.2f} {r['s_per_version']:9.2f} "
                f"{r['gb_s']:6.2f} {r['publish_s']:9.2f} {r['pause_s']:8.2f} "
                f"{r['extra_gb']:11.2f}",
                flush=True,
            )
        speedup = rows[shape, "old"]["s_per_version"] / rows[shape, "new"]["s_per_version"]
        print(f"{shape:>6} new/old rate end to end: {speedup:.2f}x", flush=True)


if __name__ == "__main__":
    main()
