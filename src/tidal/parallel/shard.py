"""FSDP2 over tidal's CausalLM: which modules become FSDP units, mixed precision, checkpointing.

Why the units differ with the numerics: the module forward (engine.numerics = "fast") calls every
decoder layer through ``__call__``, so each layer is its own unit (gathered just before it runs,
freed after: transient memory of one layer). The deterministic forward (fused.py) builds its
fused matrices straight from the parameters, past the layers' modules, so FSDP's per-layer hooks
would never fire; there the root is the one unit: its pre-forward hook gathers every parameter,
the fused forward reads the gathered tensors, and the post-backward hook reduce-scatters their
gradients. Parameters, gradients and AdamW state stay sharded between steps either way; only the
transient during a forward/backward is the whole model instead of one layer.

Tied embeddings: embed_tokens and lm_head belong to the root unit in both layouts, so the one
shared parameter is sharded once.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

from tidal.errors import UserError
from tidal.parallel.config import ShardingConfig


def mp_policy(cfg: ShardingConfig) -> MixedPrecisionPolicy:
    """The config's param / reduce dtypes (fp32 masters are FSDP's sharded parameters)."""
    return MixedPrecisionPolicy(param_dtype=getattr(torch, cfg.param_dtype),
                                reduce_dtype=getattr(torch, cfg.reduce_dtype))


def shard_model(model: nn.Module, cfg: ShardingConfig, deterministic: bool = False) -> nn.Module:
    """Apply fully_shard in place (per decoder layer + root, or root only for the deterministic
    forward); the parameters become fp32 DTensors sharded on dim 0 over the default group.
    The gradient divide factor is 1: each rank's loss is already normalised by the whole batch's
    units, so the reduce-scatter must sum, not average."""
    if deterministic and cfg.activation_checkpointing:
        raise UserError(
            "sharding.activation_checkpointing needs the module forward, but "
            "engine.numerics = 'deterministic' runs the fused forward; set engine.numerics = "
            "'fast' or sharding.activation_checkpointing = false")
    model.float()
    policy = mp_policy(cfg)
    if not deterministic:
        for layer in model.model.layers:
            if cfg.activation_checkpointing:
                checkpoint_layer(layer)
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    for module in model.modules():
        if hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    return model


def checkpoint_layer(layer: nn.Module) -> None:
    """Recompute ``layer``'s forward in backward (non-reentrant torch.utils.checkpoint). Replaces
    the instance's forward, not the module, so parameter names (and checkpoints) are unchanged."""
    inner = layer.forward

    def forward(*args):
        return checkpoint(inner, *args, use_reentrant=False)

    layer.forward = forward
