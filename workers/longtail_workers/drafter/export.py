"""Export a Longtail drafter in the EAGLE-1 draft-model layout that SGLang and vLLM load.

Called by ``longtail drafter export`` (the CLI routes to :func:`main`), by the vLLM rollout engine
(:func:`engine_tensors`, hot swaps) and by users directly via
:func:`export_drafter`. ``docs/drafter-export.md`` documents the targeted engines, options and
the weight-name mapping in full; in short, the output directory holds::

    config.json            HF-style config of a one-layer Llama/Qwen2 EAGLE draft model
    model.safetensors      fc.weight [fc.bias], layers.0.* (no embedding, no LM head)
    longtail_export.json   provenance, mapping, exactness and the serving command

Longtail names map as ``fc.* -> fc.*`` and ``layer.<x> -> layers.0.<x>``; the target's embedding
and LM head are shared with the target by both engines and are not written (optionally the
embedding is, as ``embed_tokens.weight``). Both engines' EAGLE-1 models drop layer 0's input
norm, and vLLM's ``fc`` has no bias, so an export is *exact* only for a drafter built with
``EagleDrafter(input_norm=False)`` (and, for vLLM, ``fc_bias=False`` or an all-zero bias).
Otherwise :func:`export_drafter` refuses, unless ``allow_approximate=True``, which drops what the
engine cannot represent and records ``"exact": false`` with the reason.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from longtail_workers.drafter.checkpoint import WEIGHTS_FILE, read_drafter_config

ENGINES = ("sglang", "vllm")
EXPORT_INFO_FILE = "longtail_export.json"
INPUT_NORM = "layer.input_layernorm.weight"
_ARCH = {  # (target architecture, engine) -> (draft architecture, model_type)
    ("Qwen2ForCausalLM", "sglang"): ("Qwen2ForCausalLMEagle", "qwen2"),
    ("LlamaForCausalLM", "sglang"): ("LlamaForCausalLMEagle", "llama"),
    ("Qwen2ForCausalLM", "vllm"): ("EagleLlamaForCausalLM", "llama"),
    ("LlamaForCausalLM", "vllm"): ("EagleLlamaForCausalLM", "llama"),
}
_COPIED = (  # target config keys the draft layer depends on
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "hidden_act", "rms_norm_eps", "max_position_embeddings", "vocab_size", "rope_theta",
    "rope_scaling", "rope_parameters", "bos_token_id", "eos_token_id", "initializer_range",
)  # fmt: skip
_CHECKED = ("hidden_size", "vocab_size", "num_attention_heads", "intermediate_size")


class ExportError(ValueError):
    """The drafter cannot be exported as asked; the message says why and what to do."""


@dataclass
class ExportReport:
    out_dir: Path
    engine: str
    architecture: str
    exact: bool
    mapping: dict[str, str | None]
    """Longtail weight name -> exported name (None: not exported)."""
    shapes: dict[str, list[int]]
    notes: list[str] = field(default_factory=list)


def export_name(name: str) -> str:
    """The exported name of a Longtail drafter weight (``layer.x`` -> ``layers.0.x``)."""
    if name.startswith("fc."):
        return name
    if name.startswith("layer."):
        return "layers.0." + name.removeprefix("layer.")
    raise ExportError(f"unexpected drafter weight {name!r}; expected fc.* or layer.*")


def longtail_name(name: str) -> str:
    """Inverse of :func:`export_name` (for round-trip checks)."""
    if name.startswith("layers.0."):
        return "layer." + name.removeprefix("layers.0.")
    return name


def read_target_config(target: str) -> dict[str, Any]:
    """``config.json`` of a model directory, ``builtin:<name>``, or a cached Hub id."""
    if target.startswith("builtin:"):
        from longtail_workers.models.loading import resolve_model_path

        target = str(resolve_model_path(target))
    path = Path(target).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ExportError(f"target {target!r} has no config.json; pass the model directory")
        return dict(json.loads((path / "config.json").read_text()))
    try:
        from transformers import AutoConfig

        return dict(AutoConfig.from_pretrained(target).to_dict())
    except OSError as exc:
        raise ExportError(
            f"cannot read the config of target {target!r} ({exc}); pass the local model "
            "directory the drafter was trained for"
        ) from exc


def _draft_config(tcfg: dict[str, Any], engine: str, dtype: str) -> tuple[str, dict[str, Any]]:
    arch = (tcfg.get("architectures") or ["?"])[0]
    if (arch, engine) not in _ARCH:
        known = sorted({a for a, _ in _ARCH})
        raise ExportError(f"target architecture {arch!r} is not supported; supported: {known}")
    draft_arch, model_type = _ARCH[(arch, engine)]
    cfg = {k: tcfg[k] for k in _COPIED if tcfg.get(k) is not None}
    rope = tcfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]  # older engine versions read the flat key
    qkv_bias = arch == "Qwen2ForCausalLM" or bool(tcfg.get("attention_bias"))
    cfg.update(
        architectures=[draft_arch],
        model_type=model_type,
        num_hidden_layers=1,
        tie_word_embeddings=False,
        torch_dtype=dtype,
    )
    if model_type == "llama":  # vLLM's Llama layer: q/k/v bias from qkv_bias, none on o_proj
        cfg.update(attention_bias=bool(tcfg.get("attention_bias")), qkv_bias=qkv_bias)
        cfg["mlp_bias"] = False
    return draft_arch, cfg


def _check_target(dcfg: dict[str, Any], tcfg: dict[str, Any]) -> None:
    info = dcfg.get("target") or {}
    diffs = [
        f"{k}: drafter {info.get(k)!r} vs target {tcfg.get(k)!r}"
        for k in _CHECKED
        if info.get(k) != tcfg.get(k)
    ]
    arch = (tcfg.get("architectures") or [None])[0]
    if info.get("architecture") != arch:
        diffs.append(f"architecture: drafter {info.get('architecture')!r} vs target {arch!r}")
    if diffs:
        raise ExportError(f"the drafter was not trained for this target ({'; '.join(diffs)})")


def _layout(
    weights: dict[str, torch.Tensor], dcfg: dict[str, Any], engine: str, approx: bool
) -> tuple[dict[str, torch.Tensor], bool, list[str]]:
    """Map weight names and reconcile layer-0 norm and fc bias with the engine's model."""
    notes, exact = [], True
    out = {export_name(k): v for k, v in weights.items() if k != INPUT_NORM}
    if INPUT_NORM in weights:
        exact = False
        notes.append(
            "layer 0's input RMSNorm was dropped: the engine's EAGLE-1 layer has none, so served "
            "drafts differ from Longtail's (train with drafterTraining.layout: eagle1 to fix)"
        )
    bias = out.get("fc.bias")
    if engine == "vllm" and bias is not None:
        del out["fc.bias"]
        if bool(bias.abs().max() > 0):
            exact = False
            notes.append(
                "fc.bias was dropped: vLLM's EAGLE fc has no bias "
                "(train with drafterTraining.layout: eagle1)"
            )
    if engine == "sglang" and bias is None:
        w = out["fc.weight"]
        out["fc.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)  # SGLang's fc has a bias
        notes.append("fc.bias written as zeros (the drafter has none; exact)")
    if not exact and not approx:
        raise ExportError(
            "this drafter cannot be represented exactly by the engine's EAGLE-1 model: "
            + "; ".join(notes)
            + ". Pass allow_approximate=True (--allow-approximate) to export it anyway"
        )
    return out, exact, notes


def engine_tensors(weights: dict[str, torch.Tensor], engine: str) -> dict[str, torch.Tensor]:
    """A drafter's own weights under ``engine``'s EAGLE-1 names, exactly or not at all
    (:class:`ExportError`): what ``VllmEngine`` hot-swaps into a running engine."""
    if engine not in ENGINES:
        raise ExportError(f"engine={engine!r}; choose one of {', '.join(ENGINES)}")
    return _layout(weights, {}, engine, approx=False)[0]


def _embedding(target: str) -> torch.Tensor:
    for f in sorted(Path(target).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for key in ("model.embed_tokens.weight", "embed_tokens.weight"):
                if key in fh.keys():  # noqa: SIM118 - safe_open handles have no __contains__
                    tensor: torch.Tensor = fh.get_tensor(key)
                    return tensor
    raise ExportError(f"no embed_tokens weight in {target}/*.safetensors; drop include_embedding")


def export_drafter(
    drafter_dir: str | Path,
    out_dir: str | Path,
    target_model_dir_or_id: str,
    *,
    engine: str = "sglang",
    allow_approximate: bool = False,
    include_embedding: bool = False,
    overwrite: bool = False,
) -> ExportReport:
    """Write the drafter in ``drafter_dir`` to ``out_dir`` for ``engine`` (see the module text)."""
    if engine not in ENGINES:
        raise ExportError(f"engine={engine!r}; choose one of {', '.join(ENGINES)}")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise ExportError(f"{out} exists; choose a new directory or pass overwrite=True")
    dcfg = read_drafter_config(drafter_dir)
    tcfg = read_target_config(target_model_dir_or_id)
    _check_target(dcfg, tcfg)
    weights = load_file(str(Path(drafter_dir) / WEIGHTS_FILE))
    tensors, exact, notes = _layout(weights, dcfg, engine, allow_approximate)
    if include_embedding:
        tensors["embed_tokens.weight"] = _embedding(target_model_dir_or_id)
    arch, config = _draft_config(tcfg, engine, str(dcfg.get("dtype", "float32")))
    mapping: dict[str, str | None] = {
        k: (None if k == INPUT_NORM or export_name(k) not in tensors else export_name(k))
        for k in weights
    }
    report = ExportReport(
        out, engine, arch, exact, mapping, {k: list(v.shape) for k, v in tensors.items()}, notes
    )
    staging = out.parent / f".{out.name}.{uuid.uuid4().hex[:8]}.tmp"
    staging.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(staging / "model.safetensors"))
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    info = _export_info(report, dcfg, drafter_dir, target_model_dir_or_id)
    (staging / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return report


def _export_info(
    report: ExportReport, dcfg: dict[str, Any], drafter_dir: str | Path, target: str
) -> dict[str, Any]:
    if report.engine == "sglang":
        usage = (
            f"python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE "
            f"--speculative-draft-model-path {report.out_dir} --speculative-num-steps 3 "
            "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
        )
    else:
        spec = json.dumps(
            {"method": "eagle", "model": str(report.out_dir), "num_speculative_tokens": 3}
        )
        usage = f"vllm serve {target} --speculative-config '{spec}'"
    return {
        "format": "eagle1-draft",
        "engine": report.engine,
        "architecture": report.architecture,
        "exact": report.exact,
        "notes": report.notes,
        "mapping": report.mapping,
        "shapes": report.shapes,
        "source": {
            "drafter_dir": str(drafter_dir),
            "drafter_version": dcfg.get("version"),
            "target": dcfg.get("target"),
        },
        "usage": usage,
        "verified": "layout and weight round trip only; not loaded in the engine by Longtail",
    }


def main(argv: list[str] | None = None) -> int:
    """``longtail drafter export DRAFTER_DIR OUT_DIR --target T [--engine E]``; 0 ok, 1 refused."""
    ap = argparse.ArgumentParser(
        prog="longtail drafter export",
        description="Write a Longtail drafter as an EAGLE-1 draft model for SGLang or vLLM.",
    )
    ap.add_argument("drafter_dir", help="a drafter directory (a published version)")
    ap.add_argument("out_dir", help="new directory to write")
    ap.add_argument("--target", required=True, help="target model directory, builtin:, or id")
    ap.add_argument("--engine", choices=ENGINES, default="sglang")
    ap.add_argument(
        "--allow-approximate",
        action="store_true",
        help="export even if the engine cannot represent the drafter exactly",
    )
    ap.add_argument(
        "--include-embedding",
        action="store_true",
        help="also write the target's embedding as embed_tokens.weight",
    )
    ap.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    args = ap.parse_args(argv)
    try:
        report = export_drafter(
            args.drafter_dir,
            args.out_dir,
            args.target,
            engine=args.engine,
            allow_approximate=args.allow_approximate,
            include_embedding=args.include_embedding,
            overwrite=args.overwrite,
        )
    except (ValueError, OSError) as exc:  # ExportError, DrafterMismatchError, missing files
        print(f"error: {exc}", file=sys.stderr)
        return 1
    kind = "exact" if report.exact else "APPROXIMATE"
    print(f"exported {report.architecture} for {report.engine} to {report.out_dir} ({kind})")
    for note in report.notes:
        print(f"  note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
