"""The process group of a sharded trainer, from torchrun's environment or explicit arguments.

Every failure to meet is a ``RendezvousError`` within ``timeout_s``: missing environment
variables at once, an unreachable master after the timeout (the TCP store's connect timeout),
never a hang. Nothing has to divide: FSDP2 pads dim 0 of every parameter, and the batch split
pads the short ranks with untrained rows (sharded/trainer.py). A torchrun world size other than
``sharding.processes`` is a ``WorldSizeError``.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tidal.errors import UserError

ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class RendezvousError(UserError):
    """The ranks of a sharded trainer could not meet; the message names what to set."""


class WorldSizeError(UserError):
    """The number of processes does not divide what the sharded trainer splits."""


@dataclass(frozen=True)
class Group:
    """This process's place in the default process group."""

    rank: int
    world_size: int
    backend: str
    device: torch.device


def resolve_backend(backend: str) -> str:
    """auto -> nccl where CUDA is available, else gloo."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def free_port() -> int:
    """A TCP port free on this host now (for a spawned group's master)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_rendezvous() -> dict:
    """(rank, world_size, master_addr, master_port) from torchrun's environment."""
    missing = [k for k in ENV if k not in os.environ]
    if missing:
        raise RendezvousError(
            f"sharding.launcher = 'torchrun' but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set; start with `torchrun --nproc-per-node N "
            "-m tidal ...`, or use sharding.launcher = 'spawn'")
    return {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"]),
            "master_addr": os.environ["MASTER_ADDR"], "master_port": int(os.environ["MASTER_PORT"])}


def init_group(rank: int, world_size: int, master_addr: str, master_port: int,
               backend: str = "auto", timeout_s: float = 300.0) -> Group:
    """Join (rank 0: host) the default process group; a RendezvousError after ``timeout_s``."""
    if not 0 <= rank < world_size:
        raise RendezvousError(f"rank {rank} is outside [0, {world_size}); check RANK and WORLD_SIZE")
    backend = resolve_backend(backend)
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0,
                              timeout=timeout, wait_for_workers=False)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    except (RuntimeError, OSError, dist.DistError) as e:
        raise RendezvousError(
            f"rank {rank} of {world_size} could not meet the others at {master_addr}:{master_port} "
            f"within {timeout_s:g} s ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e}); "
            "check that every rank was started and MASTER_ADDR/MASTER_PORT name rank 0's host and a "
            "free port, or raise sharding.timeout_s") from None
    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return Group(rank, world_size, backend, device)


def close_group() -> None:
    """Leave the default process group (if this process is in one)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def torchrun_group(sharding) -> Group:
    """Join the group torchrun started, checking its WORLD_SIZE against
    ``sharding.processes`` (a tidal.parallel.config.ShardingConfig) first."""
    env = env_rendezvous()
    if env["world_size"] != sharding.processes:
        raise WorldSizeError(f"torchrun started {env['world_size']} processes but "
                             f"sharding.processes = {sharding.processes}; make them equal")
    return init_group(**env, backend=sharding.backend, timeout_s=sharding.timeout_s)


def global_sum(value: float | torch.Tensor) -> torch.Tensor:
    """Collective: the sum over ranks (float64 scalar)."""
    t = torch.as_tensor(value, dtype=torch.float64).detach().clone().reshape(1)
    dist.all_reduce(t)
    return t[0]


def global_max(value: float) -> float:
    """Collective: the maximum over ranks (so every rank takes the same decision)."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])
