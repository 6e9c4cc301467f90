"""Drafter export: EAGLE-1 layout (files, names, shapes, config) and an exact weight round trip.

No serving engine runs here. What is checked: the files and config fields SGLang's
``Qwen2ForCausalLMEagle`` and vLLM's ``EagleLlamaForCausalLM`` read, the weight names and shapes,
that the weights map back to the same drafter, and that an independent re-implementation of the
EAGLE-1 forward those engines run (fc -> one decoder layer without input norm -> + residual, no
final norm, the target's embedding and head) reproduces Longtail's drafter from the exported
files alone.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tiny_targets import tiny_qwen2

from longtail_workers.drafter.checkpoint import load_drafter, save_drafter
from longtail_workers.drafter.export import ExportError, export_drafter, longtail_name, main
from longtail_workers.drafter.model import EagleDrafter

TID = "tiny-export"
LAYER = [
    "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
    "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", "post_attention_layernorm.weight",
]  # fmt: skip


# conftest.py's ``target`` fixture builds this policy
TARGET = dict(seed=6, vocab_size=32, hidden_size=32, intermediate_size=64, dtype=torch.float64)


@pytest.fixture
def target_dir(target, tmp_path):
    path = tmp_path / "target"
    target.save_pretrained(path)
    return path


def saved(target, tmp_path, name: str, **layout) -> tuple[EagleDrafter, object]:
    drafter = EagleDrafter(target, target_id=TID, seed=3, **layout)
    with torch.no_grad():  # non-trivial norm weights, so a dropped or misplaced norm shows
        for n, p in drafter.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.copy_(
                    torch.rand(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype)
                )
    return drafter, save_drafter(drafter, tmp_path / name, version=12)


def eagle1_reference(w: dict, cfg: dict, embed: torch.Tensor, ids, hidden, pos) -> torch.Tensor:
    """The engines' EAGLE-1 draft forward, written from the exported files only. [T, H]."""
    x = torch.cat([embed[ids], hidden], dim=-1) @ w["fc.weight"].T
    if "fc.bias" in w:
        x = x + w["fc.bias"]
    nh, nkv, hs = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    d = hs // nh

    def proj(name: str, h: torch.Tensor, heads: int) -> torch.Tensor:
        out = h @ w[f"layers.0.self_attn.{name}.weight"].T + w[f"layers.0.self_attn.{name}.bias"]
        return out.view(-1, heads, d).transpose(0, 1)  # [heads, T, d]

    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.cat([pos[:, None] * inv[None]] * 2, dim=-1)  # [T, d]

    def rope(t: torch.Tensor) -> torch.Tensor:
        rot = torch.cat([-t[..., d // 2 :], t[..., : d // 2]], dim=-1)
        return t * ang.cos() + rot * ang.sin()

    q, k, v = rope(proj("q_proj", x, nh)), rope(proj("k_proj", x, nkv)), proj("v_proj", x, nkv)
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    scores = q @ k.transpose(-1, -2) / d**0.5
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    att = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v  # [heads, T, d]
    x = x + att.transpose(0, 1).reshape(-1, hs) @ w["layers.0.self_attn.o_proj.weight"].T
    var = x.pow(2).mean(-1, keepdim=True)
    h = w["layers.0.post_attention_layernorm.weight"] * x * torch.rsqrt(var + cfg["rms_norm_eps"])
    gate, up = h @ w["layers.0.mlp.gate_proj.weight"].T, h @ w["layers.0.mlp.up_proj.weight"].T
    return x + (F.silu(gate) * up) @ w["layers.0.mlp.down_proj.weight"].T


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_exact_export_layout_and_round_trip(target, target_dir, tmp_path, engine) -> None:
    drafter, src = saved(target, tmp_path, "d", input_norm=False, fc_bias=False)
    out = tmp_path / f"out-{engine}"
    report = export_drafter(src, out, str(target_dir), engine=engine)
    assert report.exact and sorted(p.name for p in out.iterdir()) == [
        "config.json", "longtail_export.json", "model.safetensors",
    ]  # fmt: skip
    cfg = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    expected = {"fc.weight", *(f"layers.0.{n}" for n in LAYER)}
    if engine == "sglang":
        assert cfg["architectures"] == ["Qwen2ForCausalLMEagle"] and cfg["model_type"] == "qwen2"
        expected.add("fc.bias")  # SGLang's fc has a bias: written as zeros
        assert torch.all(weights["fc.bias"] == 0)
    else:
        assert cfg["architectures"] == ["EagleLlamaForCausalLM"] and cfg["model_type"] == "llama"
        assert cfg["qkv_bias"] is True and cfg["attention_bias"] is False  # Qwen2's biases
    assert set(weights) == expected  # no input norm, no embedding, no LM head
    assert cfg["num_hidden_layers"] == 1 and cfg["tie_word_embeddings"] is False
    assert (cfg["hidden_size"], cfg["vocab_size"], cfg["num_key_value_heads"]) == (32, 32, 2)
    assert cfg["rope_theta"] == 10000.0 and cfg["torch_dtype"] == "float64"
    assert weights["fc.weight"].shape == (32, 64)
    assert weights["layers.0.self_attn.k_proj.weight"].shape == (16, 32)
    info = json.loads((out / "longtail_export.json").read_text())
    assert info["exact"] and info["source"]["drafter_version"] == 12
    assert info["mapping"]["layer.self_attn.q_proj.weight"] == "layers.0.self_attn.q_proj.weight"
    assert info["mapping"]["fc.weight"] == "fc.weight" and engine in info["usage"]

    back = EagleDrafter(target, target_id=TID, seed=99, input_norm=False, fc_bias=False)
    back.load_state_dict(
        {longtail_name(k): v for k, v in weights.items() if k != "fc.bias"}, strict=True
    )
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 32, (9,), generator=gen)
    hidden = torch.randn(9, 32, generator=gen, dtype=torch.float64)
    pos = torch.arange(9) + 4
    with torch.no_grad():
        ours = drafter(ids[None], hidden[None], pos[None])[0]
        torch.testing.assert_close(back(ids[None], hidden[None], pos[None])[0], ours)
        embed = target.get_input_embeddings().weight
        ref = eagle1_reference(weights, cfg, embed, ids, hidden, pos.double())
    torch.testing.assert_close(ref, ours)


def test_serving_layout_round_trips_through_checkpoints(target, tmp_path) -> None:
    drafter, src = saved(target, tmp_path, "d", input_norm=False, fc_bias=False)
    loaded = load_drafter(src, target, target_id=TID)
    assert not loaded.input_norm and not loaded.fc_bias and loaded.fc.bias is None
    assert isinstance(loaded.layer.input_layernorm, torch.nn.Identity)
    ids, pos = torch.tensor([[1, 2, 3]]), torch.tensor([[5, 6, 7]])
    hidden = torch.randn(1, 3, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, hidden, pos), drafter(ids, hidden, pos))


def test_inexact_drafters_are_refused_unless_asked(target, target_dir, tmp_path) -> None:
    _, src = saved(target, tmp_path, "d")  # the default layout: input norm + fc bias
    with pytest.raises(ExportError, match="input RMSNorm was dropped"):
        export_drafter(src, tmp_path / "o1", str(target_dir), engine="sglang")
    report = export_drafter(
        src, tmp_path / "o2", str(target_dir), engine="vllm", allow_approximate=True
    )
    assert not report.exact and len(report.notes) == 2  # the norm and vLLM's missing fc bias
    assert report.mapping["layer.input_layernorm.weight"] is None
    assert report.mapping["fc.bias"] is None
    names = set(load_file(str(tmp_path / "o2" / "model.safetensors")))
    assert "layers.0.input_layernorm.weight" not in names and "fc.bias" not in names


def test_cli_entry_point_and_target_check(target, target_dir, tmp_path, capsys) -> None:
    _, src = saved(target, tmp_path, "d", input_norm=False)
    out = tmp_path / "cli"
    assert main([str(src), str(out), "--target", str(target_dir)]) == 0
    assert "(exact)" in capsys.readouterr().out
    assert main([str(src), str(out), "--target", str(target_dir)]) == 1  # exists
    assert "exists" in capsys.readouterr().err
    other = tmp_path / "other"
    tiny_qwen2(seed=0, vocab_size=48, hidden_size=32, intermediate_size=64).save_pretrained(other)
    with pytest.raises(ExportError, match="vocab_size"):
        export_drafter(src, tmp_path / "o3", str(other))
