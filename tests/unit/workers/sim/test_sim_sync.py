"""The simulator's weight-sync charge: the job's transport, phase by phase, from the profile.

Hand-computed cases on round rates (``sim/sync.py``'s formulas), the notes that say where each
rate came from (measured, derived, assumed), the refusals that name the fix, the profile file's
new ``weight_sync`` section, and ``longtail simulate`` charging example 02's resolved transport.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from longtail_api.profile import EngineProfile, ProfileError, SyncCosts
from longtail_workers.sim.main import main
from longtail_workers.sim.roofline import roofline_profile
from longtail_workers.sim.sync import sync_charge

REPO = Path(__file__).parents[4]
GB = 10**9
MIB_256 = 256 * 2**20
COSTS = SyncCosts(
    version_bytes=GB,
    http_pack_bytes_per_s=1e9,  # 1 s
    http_pull_bytes_per_s=0.5e9,  # 2 s
    load_bytes_per_s=2e9,  # 0.5 s
    broadcast_pack_bytes_per_s=4e9,  # 0.25 s
    broadcast_wire_bytes_per_s=1e9,  # 1 s
    sources={"http_pull_bytes_per_s": "measured: test"},
)


def profile(costs: SyncCosts | None = COSTS) -> EngineProfile:
    return dataclasses.replace(roofline_profile("Qwen2-0.5B"), weight_sync=costs)


def charge(transport: str, costs: SyncCosts | None = COSTS, **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = dict(workers=4, trainer_world=1, bucket_bytes=MIB_256)
    args.update(kw)
    return sync_charge(profile(costs), transport, **args)  # type: ignore[arg-type]


def test_http_is_pack_then_every_worker_pulling_and_loading() -> None:
    c = charge("http")
    assert (c.gather_s, c.pack_s, c.wire_s, c.load_s) == (0.0, 1.0, 0.0, 2.5)
    assert c.pause_s == 3.5 and c.gb_per_s == pytest.approx(1 / 3.5)
    assert any("pull 0.50 GB/s (measured: test)" in n for n in c.notes)
    # Four workers pulling 1 GB each through one 8 Gb/s (1 GB/s) trainer link: 4 s, not 2.
    linked = charge("http", link_bytes_per_s=1e9)
    assert linked.load_s == 4.5 and linked.pause_s == 5.5
    assert any("bound by 4 workers sharing" in n and "assumed: --link-gbps" in n
               for n in linked.notes)  # fmt: skip


def test_broadcast_overlaps_pack_and_wire_bucket_by_bucket() -> None:
    c = charge("broadcast")
    # 1e9 bytes in 256 MiB buckets: 4; the wire (1 s) hides all but one bucket's pack (0.25/4).
    assert (c.pack_s, c.wire_s, c.load_s) == (0.25, 1.0, 0.5)
    assert c.pause_s == pytest.approx(1.0 + 0.25 / 4 + 0.5)
    assert any("4 bucket(s) of 256 MiB" in n for n in c.notes)
    capped = charge("broadcast", link_bytes_per_s=0.5e9)  # a 4 Gb/s link under the 1 GB/s
    assert capped.wire_s == 2.0 and capped.pause_s == pytest.approx(2.0 + 0.25 / 4 + 0.5)
    assert any("capped by the link 4 Gb/s" in n for n in capped.notes)
    assert charge("broadcast", bucket_bytes=2 * GB).pause_s == pytest.approx(1.25 + 0.5)


def test_a_sharded_trainers_gather_is_derived_and_said_so() -> None:
    c = charge("broadcast", trainer_world=2)  # each rank receives half: 0.5 GB at 1 GB/s
    assert c.gather_s == 0.5 and c.pause_s == pytest.approx(0.5 + 1.0625 + 0.5)
    assert any("gather 1.00 GB/s (not measured: derived" in n for n in c.notes)
    measured = dataclasses.replace(COSTS, gather_bytes_per_s=5e9)
    assert charge("http", measured, trainer_world=4).gather_s == pytest.approx(0.75 / 5)


def test_rates_not_measured_are_derived_or_refused_naming_the_fix() -> None:
    http_only = dataclasses.replace(
        COSTS, broadcast_pack_bytes_per_s=None, broadcast_wire_bytes_per_s=None
    )
    with pytest.raises(ValueError, match=r"no broadcast rate .* pass --link-gbps"):
        charge("broadcast", http_only)
    with pytest.raises(ValueError, match=r"gathers its shards.* pass --link-gbps"):
        charge("http", http_only, trainer_world=2)
    c = charge("broadcast", http_only, link_bytes_per_s=1e9)
    assert (c.pack_s, c.wire_s) == (1.0, 1.0)
    assert any("bucket pack 1.00 GB/s (not measured: derived" in n for n in c.notes)
    assert any("at the link 8 Gb/s" in n and "(not measured)" in n for n in c.notes)
    with pytest.raises(ValueError, match="take the profile again, or pass --weight-sync-s"):
        charge("http", None)
    with pytest.raises(ValueError, match="use http or broadcast"):
        charge("dist")


def test_the_profile_file_carries_the_costs_and_refuses_a_bad_rate(tmp_path: Path) -> None:
    p = profile()
    p.write(tmp_path / "p.json")
    assert EngineProfile.read(tmp_path / "p.json").weight_sync == COSTS
    data = json.loads((tmp_path / "p.json").read_text())
    data["weight_sync"]["load_bytes_per_s"] = 0
    with pytest.raises(ProfileError, match=r"weight_sync\.load_bytes_per_s=0: must be > 0"):
        EngineProfile.from_dict(data)
    del data["weight_sync"]  # a profile written before #33
    assert EngineProfile.from_dict(data).weight_sync is None


def test_simulate_charges_the_jobs_resolved_transport(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(REPO / "examples" / "02-qwen2.5-7b-gpu.yaml")  # GPU roles: auto -> broadcast
    args = [job, "--roofline", "Qwen2-7B", "--lengths", "lognormal:median=64"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "weight sync (broadcast, 15.23 GB a version)" in out
    assert "note: weight sync: broadcast wire 25.00 GB/s (assumed: NCCL" in out
    assert main([*args, "--link-gbps", "25"]) == 0  # 25 GbE: 15.2 GB / 3.125 GB/s = 4.87 s
    assert "wire 4.87 s" in capsys.readouterr().out
    assert main([*args, "--weight-sync", "http"]) == 0
    assert "weight sync (http, 15.23 GB a version)" in capsys.readouterr().out
    assert main([*args, "--weight-sync-s", "7"]) == 0
    out = capsys.readouterr().out
    assert "weight sync: 7 s a version (given: --weight-sync-s)" in out
    assert "7.00" in next(ln for ln in out.splitlines() if ln.startswith("weight sync (s)"))


def test_an_old_profile_needs_the_override(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(REPO / "examples" / "01-tiny-arith.yaml")
    old = str(REPO / "bench" / "profiles" / "cpu-2core-builtin-tiny.json")
    args = [job, "--profile", old, "--lengths", "lognormal:median=8"]
    assert main(args) == 2
    assert "no per-phase weight-sync costs" in capsys.readouterr().err
    assert main([*args, "--weight-sync-s", "0.1"]) == 0
