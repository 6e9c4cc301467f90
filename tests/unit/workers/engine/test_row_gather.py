"""Whole tensors gathered on rank 0 from row shards (``trainer/row_gather.py``, issue #33).

Three real processes on a gloo group (this file run as a script, one per rank) gather tensors
split over them as FSDP2's ``Shard(0)`` splits them, uneven splits and a rank with no rows
included, several gathers in flight at once, a cast shard among them; rank 0 must get every
whole tensor bit for bit, the others their own rows. A shard that is not the expected rows is
refused with its shape on every rank before anything is sent.
"""

from __future__ import annotations

import datetime
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from longtail_workers.trainer.row_gather import row_split, start_row_gather

SHAPES = [(5, 3), (2, 4), (7,), (1, 2), (6, 5), (3, 1)]
"""5 rows over 3 ranks: 2/2/1; 2 rows: 1/1/0; 1 row: 1/0/0."""


def test_rows_are_split_as_torch_chunk_splits_them() -> None:
    for rows in range(0, 12):
        for world in (1, 2, 3, 4):
            chunks = torch.arange(rows).chunk(world) if rows else ()
            expected = [len(c) for c in chunks] + [0] * (world - len(chunks))
            assert row_split(rows, world) == expected, (rows, world)


def _whole(i: int, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + i)
    return torch.randn(shape, generator=gen)


def _rank_main(rank: int, port: int, out: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    try:
        try:  # a wrong shard: refused on every rank, before any operation is posted
            start_row_gather(torch.zeros(4, 3), (5, 3))
            raise AssertionError("a wrong shard was accepted")
        except RuntimeError as exc:
            assert "(4, 3)" in str(exc) and "(5, 3)" in str(exc), exc
        gathers = []
        for i, shape in enumerate(SHAPES):  # all posted before the first wait
            rows = _whole(i, shape).chunk(3)
            local = rows[rank] if rank < len(rows) else _whole(i, shape)[:0]
            if i == 4:
                local = local.to(torch.bfloat16)  # what travels is what the caller casts to
            gathers.append(start_row_gather(local, shape))
        for i, (shape, gather) in enumerate(zip(SHAPES, gathers, strict=True)):
            got = gather.wait()
            expected = _whole(i, shape)
            if i == 4:
                expected = expected.to(torch.bfloat16)
            if rank != 0:
                split = row_split(shape[0], 3)
                expected = expected[sum(split[:rank]) : sum(split[: rank + 1])]
            assert got.dtype == expected.dtype and torch.equal(got, expected), (rank, i)
            assert gather.wait() is got  # idempotent
        dist.barrier()
    finally:
        dist.destroy_process_group()
    (out / f"ok-{rank}").write_text("ok")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(120)
def test_three_ranks_gather_uneven_row_shards_on_rank_0(tmp_path: Path) -> None:
    port = _free_port()
    out = subprocess.PIPE, subprocess.STDOUT
    script = [sys.executable, __file__, str(port), str(tmp_path)]
    procs = [
        subprocess.Popen([*script, str(rank)], stdout=out[0], stderr=out[1], text=True)
        for rank in range(3)
    ]
    outputs = [p.communicate(timeout=100)[0] for p in procs]
    for rank, (proc, text) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{text[-3000:]}"
        assert (tmp_path / f"ok-{rank}").exists()


if __name__ == "__main__":
    torch.set_num_threads(1)
    _rank_main(int(sys.argv[3]), int(sys.argv[1]), Path(sys.argv[2]))
