"""FSDP2 for the policy: shard it over the trainer ranks, and gather it whole again.

``trainer/policy.py`` calls :func:`shard_policy` once per rank after loading the policy,
:func:`wire_layout` and :func:`gather_tensors` to publish a version to the rollout workers one
whole tensor at a time, and :func:`full_state_dict` when the whole state dict is needed (the
checkpoint checksum); ``trainer/checkpoint.py`` calls :func:`sharded_state` and
:func:`load_sharded_state` around DCP. At world 1 nothing is
sharded: the model stays a plain module and the same functions fall back to its own state dict,
so a lone trainer behaves exactly as before.

Sharding: ``fully_shard`` on every decoder layer, then on the root (embedding, final norm, LM
head), on a 1-D device mesh of all ranks. On GPU the mixed-precision policy computes in bf16 and
reduces gradients in fp32. FSDP averages gradients over the ranks by default; here it sums
them instead (force-sum reduction, divide factor 1), because every rank's loss is already
divided by the *global* token count (``trainer/optim.py``): the summed gradient is exactly the
world-1 gradient.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from longtail_workers.trainer.row_gather import RowGather, RowGatherer, one_ahead
from longtail_workers.trainer.world import TrainerWorld
from longtail_workers.weights.pieces import canonical_layout
from longtail_workers.weights.sync import TensorMeta

log = logging.getLogger(__name__)

StateDict = dict[str, Any]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (``model.get_decoder().layers``)."""
    get_decoder = getattr(model, "get_decoder", None)
    layers = getattr(get_decoder(), "layers", None) if callable(get_decoder) else None
    if layers is None or len(layers) == 0:
        raise ValueError(
            f"{type(model).__name__} has no decoder layers (get_decoder().layers); the sharded "
            "trainer needs a Hugging Face decoder-only causal LM such as Qwen2ForCausalLM"
        )
    return list(layers)


def shard_policy(
    model: nn.Module, world: TrainerWorld, *, activation_checkpointing: bool
) -> nn.Module:
    """``model`` ready to train on ``world``: sharded when the world has several ranks.

    ``activation_checkpointing`` (``spec.trainer.activationCheckpointing``) recomputes each
    decoder layer's activations in the backward pass (non-reentrant ``torch.utils.checkpoint``
    through the model's own hook), trading compute for the activation memory of long answers.
    """
    if activation_checkpointing:
        enable = getattr(model, "gradient_checkpointing_enable", None)
        if not callable(enable):
            raise ValueError(
                f"trainer.activationCheckpointing: {type(model).__name__} cannot checkpoint "
                "activations (no gradient_checkpointing_enable); set it to false"
            )
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not world.sharded:
        return model
    mesh = init_device_mesh(world.device.type, (world.size,))
    mixed = None
    if world.device.type == "cuda":
        mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs: dict[str, Any] = {"mesh": mesh}
    if mixed is not None:
        kwargs["mp_policy"] = mixed
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # sum, not average: see the module text
            module.set_force_sum_reduction_for_comms(True)
            module.set_gradient_divide_factor(1.0)
    log.info("policy sharded over %d ranks (FSDP2, mixed precision %s)", world.size, bool(mixed))
    return model


def full_state_dict(model: nn.Module, world: TrainerWorld) -> StateDict | None:
    """The whole policy state dict on rank 0 (CPU tensors when sharded), None on the others.

    A collective at world > 1: every rank must call it at the same point.
    """
    if not world.sharded:
        return dict(model.state_dict())
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    return dict(state) if world.leader else None


def wire_layout(model: nn.Module, wire_dtype: torch.dtype | None) -> list[TensorMeta]:
    """The policy version as it travels: every state-dict tensor with its whole (gathered)
    shape, floating ones in ``wire_dtype`` (None: their own), in canonical order
    (``weights.pieces.canonical_layout``). Metadata only: no collective, no copy."""
    metas = []
    for name, tensor in model.state_dict().items():  # DTensors' shape is the global one
        dtype = wire_dtype if wire_dtype is not None and tensor.is_floating_point() else None
        metas.append(TensorMeta(name, dtype or tensor.dtype, tuple(tensor.shape)))
    return canonical_layout(metas)[0]


def gather_tensors(
    model: nn.Module, layout: Sequence[TensorMeta], gatherer: RowGatherer | None = None
) -> Iterator[torch.Tensor]:
    """Each tensor of ``layout`` in its order, one at a time: whole on rank 0, this rank's own
    rows on the others (they only take part). A DTensor's shard is cast to the wire dtype (half
    the gather's bytes for an fp32 trainer and a bf16 engine) and sent to rank 0
    (:mod:`~longtail_workers.trainer.row_gather`: rank 0 alone receives), a collective every
    rank must run in the same order; an unsharded tensor is the model's own (no copy). The next
    tensor's gather is posted before this one is given out, so rank 0 holds at most two whole
    tensors, in ``gatherer``'s reused buffers (keep one gatherer for every pass: default a new
    one); each may be dropped once the next is asked for.

    A tied weight (one parameter under two names, e.g. a small Qwen2's embedding and LM head:
    adjacent in the layout) is gathered once and given for both names; every rank decides that
    from the module structure, so they all skip the same gather.
    """
    gatherer = gatherer or RowGatherer(max((m.nbytes for m in layout), default=0))
    return one_ahead(_gathers(model, layout, gatherer))


def _gathers(
    model: nn.Module, layout: Sequence[TensorMeta], gatherer: RowGatherer
) -> Iterator[RowGather]:
    """One posted gather per tensor of ``layout`` (a tied weight's second name: the first's)."""
    state = model.state_dict()  # views of the parameters (shards when sharded): no copy
    tied = _tied_parameters(model)
    last: tuple[int, RowGather] | None = None  # (tied parameter, its gather)
    for meta in layout:
        tensor = state[meta.name]
        key = tied.get(meta.name)
        if not isinstance(tensor, DTensor):
            current = RowGather(tensor, tensor, [])
        elif key is not None and last is not None and last[0] == key:  # same wire dtype too
            current = last[1]
        else:
            current = _start_gather(gatherer, tensor, meta)
        last = None if key is None else (key, current)
        yield current


def _start_gather(gatherer: RowGatherer, tensor: DTensor, meta: TensorMeta) -> RowGather:
    """Post ``tensor``'s gather to the mesh's first rank, cast to ``meta.dtype``."""
    if tensor.device_mesh.ndim != 1 or tuple(tensor.placements) != (Shard(0),):
        raise RuntimeError(
            f"{meta.name} is sharded as {tensor.placements} on a {tensor.device_mesh.ndim}-D "
            "mesh; a weight sync gathers FSDP2's Shard(0) on a 1-D mesh (shard_policy's) only"
        )
    local = tensor.to_local()
    if local.is_floating_point() and local.dtype != meta.dtype:
        local = local.to(meta.dtype)
    return gatherer.start(local, meta.shape, tensor.device_mesh.get_group())


def _tied_parameters(model: nn.Module) -> dict[str, int]:
    """``{name: parameter id}`` for the names that share their parameter with another name."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return {n: key for key, group in names.items() if len(group) > 1 for n in group}


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> StateDict:
    """``{"model": ..., "optim": ...}``: this rank's shards, keyed by parameter name, as DCP
    saves and loads them (a different world size reshards on load)."""
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def load_sharded_state(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, state: StateDict
) -> None:
    """Put a loaded :func:`sharded_state` back into ``model`` (and ``optimizer``)."""
    if optimizer is None:
        set_model_state_dict(model, state["model"])
        return
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
