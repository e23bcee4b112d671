"""FSDP2 sharding settings ([sharding]): a section of its own because the RL trainer and
`tidal pretrain` both shard by it."""

from typing import Literal

from pydantic import Field

from tidal.config_section import Section


class ShardingConfig(Section):
    """The trainer's model sharded with PyTorch FSDP2 over ``processes`` processes (docs/scale.md).

    processes = 1 is the in-process Trainer, unchanged. Above 1, rank 0 lives in the driver and
    the others follow its commands; each rank trains 1/processes of every batch's rows, holds
    1/processes of the fp32 parameters, gradients and AdamW state, and the summed gradient is
    the single-process one (up to float reduction order).
    """

    processes: int = Field(1, ge=1)
    """Processes (ranks) the model is sharded over, >= 1 (1 = no sharding, today's in-process
    Trainer). RL batches of any row count split (short ranks train an untrained padding row);
    `tidal pretrain` needs pretrain.batch_size to be a multiple of it."""
    launcher: Literal["spawn", "torchrun"] = "spawn"
    """How ranks 1..processes-1 start: spawn = torch.multiprocessing from the driver (one
    machine); torchrun = already started by ``torchrun --nproc-per-node N``, ranks from its
    environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend: auto = nccl where CUDA is available, else gloo."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """FSDP mixed precision: the dtype parameters are gathered in for forward/backward (the
    sharded masters and AdamW state stay fp32)."""
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    """FSDP mixed precision: the dtype gradients are reduce-scattered in."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (less
    memory, about one more forward of time); needs engine.numerics = "fast" (the deterministic
    forward is one fused function, not per-layer modules)."""
    timeout_s: float = Field(300.0, gt=0)
    """Seconds a rendezvous or a collective may wait for the other ranks before failing (a
    missing rank is an error, never a hang), > 0."""
