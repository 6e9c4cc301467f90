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
the rollout pause (pull + load: the rollout worker cannot generate meanwhile), the peak extra
trainer memory (``trainer +GB``: the growth of the process's anonymous resident memory while
``publish`` runs, sampled every 5 ms) and ``spool GB``, the growth of its file-backed resident
memory meanwhile: the version copies of ``--host-copy spool`` (``spec.weightSync.hostCopy:
spool``), mapped from files in a spool directory, page cache the kernel writes back and may
reclaim; the default, ``--host-copy memory`` (the trainer's default too), keeps them in
anonymous memory.

``old`` is today's protocol, not a re-implementation: the bench extracts
``workers/longtail_workers/weights/{sync,store,checksum,http_sync}.py`` as of ``--old-rev``
(the last commit before #33's pieces) with ``git show`` into a temporary package and imports
it from there (only the package name in their imports is rewritten); the HTTP server and
client modules they use are today's. ``new`` is the package in this tree. Each (shape,
protocol) runs in a fresh Python process so memory figures do not mix.

``broadcast`` (world 1) runs the tree's store with its :class:`Broadcast` in that process and two
receivers (:class:`BroadcastSource`, each its own process, started with ``--receiver``) on real
gloo groups over loopback. The trainer's tensor stream yields views of one scratch tensor as
large as the largest tensor, in canonical order (the bytes differ from the 'old'/'new' rows'
random state, the cost per byte does not; a world-1 trainer's tensors are already whole, so the
gather is ~0), which keeps the 1.5B row within this machine's memory; likewise each receiver's
load copies every received tensor into one scratch tensor of the largest tensor's size (the
same bytes copied as into a model). ``broadcast-w2`` adds a real second trainer rank: each
tensor is split by rows over two processes (as FSDP2 shards it) and gathered on rank 0 over
their own gloo group as it is streamed, by the sharded trainer's own code
(``trainer/row_gather.py``), so its gather column is a real world-2 gather. Row columns as
above; for broadcast the publish returns once both receivers verified the version (its phases:
pack = cast + copy into buckets and their digests, wire = waiting for the buckets and the
receivers' reports), and the pause is the worker's ``fetch`` + load when asked for the version
(the broadcast is already in). ``hashed s``: how long after the broadcast publish returned its
HTTP catch-up copy was hashed and served (in the background, off the critical path; the bench
waits for it, untimed, before the next version). No row hashes the whole version: the
checkpoint's sha256 is computed only when a checkpoint asks for it. The HTTP catch-up copy (one
version, as for 'new') is in ``spool GB`` (or, with ``--host-copy memory``, in ``trainer
+GB``); on CPU the buckets are slices of it (0 buckets beyond it), on a GPU two device and two
pinned staging buckets come on top. Last, a projection for a 7B policy (15.2 GB) over 25 GbE
and 400 Gb/s InfiniBand from the measured phase rates, with its assumptions printed."""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
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


def qwen2_shapes(shape: str) -> dict[str, tuple[int, ...]]:
    """The names and shapes of a Qwen2 model's state dict (``lm_head.weight`` included)."""
    hidden, inter, layers, heads, kv_heads, vocab = SHAPES[shape]
    kv = hidden // heads * kv_heads
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = (hidden, hidden)
        out[p + "self_attn.q_proj.bias"] = (hidden,)
        for n in ("k", "v"):
            out[p + f"self_attn.{n}_proj.weight"] = (kv, hidden)
            out[p + f"self_attn.{n}_proj.bias"] = (kv,)
        out[p + "self_attn.o_proj.weight"] = (hidden, hidden)
        out[p + "mlp.gate_proj.weight"] = (inter, hidden)
        out[p + "mlp.up_proj.weight"] = (inter, hidden)
        out[p + "mlp.down_proj.weight"] = (hidden, inter)
        out[p + "input_layernorm.weight"] = (hidden,)
        out[p + "post_attention_layernorm.weight"] = (hidden,)
    out["model.norm.weight"] = (hidden,)
    out["lm_head.weight"] = (vocab, hidden)
    return out


def qwen2_state(shape: str) -> dict[str, torch.Tensor]:
    """Random bf16 tensors with the names and shapes of a Qwen2 model's state dict."""
    out: dict[str, torch.Tensor] = {}
    for name, dims in qwen2_shapes(shape).items():
        if name == "lm_head.weight":
            out[name] = out["model.embed_tokens.weight"]  # tied, as in both models
        else:
            out[name] = torch.empty(dims, dtype=torch.bfloat16).uniform_(-0.05, 0.05)
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


def _rss() -> tuple[int, int]:
    """This process's resident ``(anonymous, file-backed)`` bytes (``/proc/self/status``)."""
    with open("/proc/self/status") as f:
        rows = dict(line.split(":", 1) for line in f)
    return int(rows["RssAnon"].split()[0]) * 1024, int(rows["RssFile"].split()[0]) * 1024


def timed(fn: Any) -> tuple[float, tuple[int, int], Any]:
    """Seconds of ``fn()``, the process's peak growth of anonymous and of file-backed resident
    memory meanwhile, and its result."""
    before, peak, done = _rss(), list(_rss()), threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = _rss()
            peak[0], peak[1] = max(peak[0], now[0]), max(peak[1], now[1])
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    now = _rss()
    growth = max(peak[0], now[0]) - before[0], max(peak[1], now[1]) - before[1]
    return seconds, growth, result


def one(shape: str, protocol: str, repeat: int, old_rev: str, spool: bool) -> dict[str, Any]:
    """Measure one (shape, protocol) pair in this process; returns its row."""
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        if protocol == "old":
            mod = old_http_sync(old_rev, Path(tmp))
        else:
            mod = importlib.import_module("longtail_workers.weights.http_sync")
        state = qwen2_state(shape)
        totals, pauses, publishes, extras, nbytes = [], [], [], [], 0
        where = {"spool_dir": Path(tmp)} if spool and protocol != "old" else {}
        if protocol == "old":  # its server published (today's store does, with deliveries)
            server = mod.WeightServer(keep_last=1)
            publish = server.publish
        else:
            from longtail_workers.weights.store import WeightStore, publish_state_dict

            store = WeightStore(keep_last=1, **where)
            server = mod.WeightServer(store)
            publish = functools.partial(publish_state_dict, store)
        with server:
            client = mod.HttpWeightClient(server.url, timeout_s=600.0)
            for version in range(1, repeat + 2):  # the first round warms up
                pub_s, extra, _ = timed(lambda v=version: publish(v, state))
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
        "pause_s": sorted(pauses)[len(pauses) // 2], "extra_gb": max(e[0] for e in extras) / 1e9,
        "spool_gb": max(e[1] for e in extras) / 1e9,
    }  # fmt: skip


PROTOCOLS = ("old", "new", "broadcast", "broadcast-w2")


def _line(r: dict[str, Any]) -> str:
    def col(key: str, width: int) -> str:
        return f"{r[key]:{width}.2f}" if key in r else f"{'-':>{width}}"

    return (
        f"{r['shape']:>6} {r['protocol']:>12} {r['gb']:5.2f} {r['s_per_version']:9.2f} "
        f"{r['gb_s']:6.2f} {r['publish_s']:9.2f} {col('gather_s', 8)} {col('pack_s', 6)} "
        f"{col('wire_s', 6)} {r['pause_s']:8.2f} {r['extra_gb']:11.2f} {r['spool_gb']:8.2f} "
        f"{col('ready_s', 8)}"
    )


def _version_gb(shape: str) -> float:
    n = 0
    for dims in qwen2_shapes(shape).values():
        k = 1
        for d in dims:
            k *= d
        n += k
    return n * 2 / 1e9


def _available_gb() -> float:
    """MemAvailable: a broadcast row holds ~4 versions across its processes (the trainer's
    HTTP copies of the last and the new version, each receiver's buffer) plus scratch and, for
    world 2, the second rank's shards; a row that does not fit is skipped, not OOM-killed."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / 1e9
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    ap.add_argument("--repeat", type=int, default=3, help="timed versions per row (median)")
    ap.add_argument("--bucket-mb", type=int, default=256, help="broadcast bucket size (MiB)")
    ap.add_argument("--old-rev", default=OLD_REV, help="commit holding today's protocol")
    ap.add_argument(
        "--host-copy",
        default="memory",
        choices=["spool", "memory"],
        help="where the new rows' trainer keeps its version copies (spec.weightSync.hostCopy)",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)  # "SHAPE:PROTOCOL", run in a child
    ap.add_argument("--receiver", nargs=4, help=argparse.SUPPRESS)  # ADDR NAME URL SHAPE
    ap.add_argument("--rank1", nargs=3, help=argparse.SUPPRESS)  # PORT SHAPE SEED
    args = ap.parse_args()
    if args.receiver:
        from bench_broadcast import receiver  # type: ignore[import-not-found]

        receiver(*args.receiver)
        return
    if args.rank1:
        from bench_broadcast import rank1  # type: ignore[import-not-found]

        rank1(int(args.rank1[0]), args.rank1[1])
        return
    if args.one:
        shape, protocol = args.one.split(":")
        if protocol.startswith("broadcast"):
            from bench_broadcast import one_broadcast  # type: ignore[import-not-found]

            spool = args.host_copy == "spool"
            row = one_broadcast(shape, protocol, args.repeat, args.bucket_mb << 20, __file__, spool)
        else:
            row = one(shape, protocol, args.repeat, args.old_rev, args.host_copy == "spool")
        print(json.dumps(row), flush=True)
        return
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"load average {load} on {len(os.sched_getaffinity(0))} CPUs; "
          f"{_available_gb():.0f} GB available; buckets {args.bucket_mb} MiB; "
          f"host copy: {args.host_copy}")  # fmt: skip
    print(
        f"{'policy':>6} {'protocol':>12} {'GB':>5} {'s/version':>9} {'GB/s':>6} "
        f"{'publish s':>9} {'gather s':>8} {'pack s':>6} {'wire s':>6} {'pause s':>8} "
        f"{'trainer +GB':>11} {'spool GB':>8} {'hashed s':>8}"
    )
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for shape in args.shapes:
        for protocol in args.protocols:
            need = {"broadcast": 4.5, "broadcast-w2": 5.0}.get(protocol, 0.0) * _version_gb(shape)
            if need > _available_gb():
                print(f"{shape:>6} {protocol:>12} skipped: needs ~{need:.0f} GB, "
                      f"{_available_gb():.0f} GB available now")  # fmt: skip
                continue
            cmd = [sys.executable, __file__, "--one", f"{shape}:{protocol}"]
            cmd += ["--repeat", str(args.repeat), "--old-rev", args.old_rev]
            cmd += ["--bucket-mb", str(args.bucket_mb), "--host-copy", args.host_copy]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows[shape, protocol] = json.loads(out.strip().splitlines()[-1])
            print(_line(rows[shape, protocol]), flush=True)
        if (shape, "old") in rows:
            base = rows[shape, "old"]["s_per_version"]
            ratios = [
                f"{p} {base / rows[shape, p]['s_per_version']:.2f}x"
                for p in PROTOCOLS[1:]
                if (shape, p) in rows
            ]
            print(f"{shape:>6} rate end to end vs old: {', '.join(ratios)}", flush=True)
    broadcast = [r for (_, p), r in rows.items() if p == "broadcast"]
    if broadcast:
        from bench_broadcast import projection  # type: ignore[import-not-found]

        print(projection(max(broadcast, key=lambda r: r["gb"]), args.bucket_mb << 20))
    if args.host_copy == "memory" and any(p != "old" for _, p in rows):
        print(
            "trainer +GB of the new rows is the served copy of the version in the trainer's "
            "memory (spec.weightSync.hostCopy: memory); --host-copy spool maps it from files "
            "instead (page cache), leaving the buckets as the only trainer memory a sync adds"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
