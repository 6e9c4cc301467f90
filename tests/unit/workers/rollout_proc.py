"""A rollout worker as its own process, for the dispatch tests that stop one with SIGSTOP
(``test_rollout_hung_worker.py``): a real :class:`RolloutServer` (the one ``longtail worker
rollout`` serves) around a tiny random Qwen2 with the real torch engine, no weight source (it
answers policy version 0, the one it holds).

Run as ``python rollout_proc.py --name NAME [--hidden N]``; it prints ``URL <base url>`` once
it serves, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "doubles"))
from tiny_targets import tiny_qwen2

from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.http import ControlConfig
from longtail_workers.rollout.service import RolloutServer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--hidden", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = tiny_qwen2(
        seed=5, vocab_size=32, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        sharpness=8.0,
    )  # fmt: skip
    worker = RolloutWorker(TorchEngine(model), target_id="tiny", name=args.name, weights=None)
    server = RolloutServer(worker, ControlConfig(port=0)).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"URL {server.url}", flush=True)
    stop.wait()
    server.stop(grace_s=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
