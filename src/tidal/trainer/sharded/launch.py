"""The sharded trainer as the driver sees it: ``ShardedTrainerHandle`` has Trainer's interface.

    driver process = rank 0                         ranks 1..N-1 (followers)
    handle.step(batch) ──broadcast("step", batch)──> ShardedTrainer.step(batch)
        ShardedTrainer.step(batch)   (collectives pair up inside the step)
        gather_into(handle.model) <──all-gather, one parameter at a time──
    handle.save / load / export_hf ──broadcast──> the same collective on every rank
    handle.close() ──broadcast("stop")──> followers leave their loop and exit

``handle.model`` is a full, unsharded CausalLM (the caller's, updated in place after every step
and load), so whoever publishes or evaluates ``trainer.model`` keeps working unchanged.

Followers start by torch.multiprocessing spawn from the driver (launcher "spawn"), or are the
other ranks of a torchrun launch: ``make_trainer`` on a torchrun rank != 0 runs the follower
loop and exits the process when rank 0 closes. Commands travel on a separate gloo group whose
timeout is long: a follower may wait for the next batch as long as rollouts take.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tidal.model.config import ModelConfig
from tidal.model.qwen3 import CausalLM
from tidal.parallel.gather import gather_into, scatter_from
from tidal.parallel.group import (
    Group,
    close_group,
    free_port,
    init_group,
    torchrun_group,
)
from tidal.parallel.config import ShardingConfig
from tidal.parallel.shard import shard_model
from tidal.trainer.config import TrainerConfig
from tidal.trainer.sharded.checkpoint import (
    check_checkpoint,
    load_sharded,
    save_sharded,
)
from tidal.trainer.sharded.trainer import ShardedTrainer
from tidal.trainer.trainer import DEFAULT_NUMERICS, Trainer
from tidal.trajectory import Batch

COMMAND_TIMEOUT = datetime.timedelta(days=7)


@dataclass(frozen=True)
class Spec:
    """What every rank needs to build the same sharded trainer."""

    model: ModelConfig
    trainer: TrainerConfig
    sharding: ShardingConfig
    temperature: float
    pad_id: int
    numerics: str


def build_rank(spec: Spec, group: Group, source: CausalLM | None) -> ShardedTrainer:
    """This rank's sharded model (built on meta, materialised as shards only) and trainer; rank
    0's ``source`` weights are scattered into the shards."""
    with torch.device("meta"):
        model = CausalLM(spec.model)
    shard_model(model, spec.sharding, deterministic=spec.numerics == "deterministic")
    model.to_empty(device=group.device)
    scatter_from(model, source)
    return ShardedTrainer(model, spec.trainer, group, spec.temperature, spec.pad_id, spec.numerics)


def run(trainer: ShardedTrainer, command: tuple, mirror: CausalLM | None):
    """One command, on every rank alike (rank 0 passes its mirror, the others None)."""
    kind, *args = command
    if kind == "step":
        stats = trainer.step(args[0])
        gather_into(trainer.model, mirror)
        return stats
    if kind == "gather":
        return gather_into(trainer.model, mirror)
    if kind == "save":
        return save_sharded(trainer, args[0], args[1], mirror)
    if kind == "load":
        extra = load_sharded(trainer, args[0])
        gather_into(trainer.model, mirror)
        return extra
    if kind == "memory":
        return gather_memory(trainer)
    if kind == "off_policy":
        return trainer.use_off_policy(args[0])
    raise ValueError(f"unknown sharded-trainer command {kind!r}")


def local_state_bytes(trainer: Trainer) -> int:
    """Bytes this process stores of parameters and optimizer state (local shards: exact)."""
    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    tensors = [local(p) for p in trainer.masters]
    if trainer.separate_masters:
        tensors += [local(p) for p in trainer.params]
    tensors += [local(v) for st in trainer.optimizer.state.values() for v in st.values()
                if torch.is_tensor(v) and v.dim() > 0]
    return sum(t.numel() * t.element_size() for t in tensors)


def peak_rss_bytes() -> int:
    """This process's own peak resident memory since it started or since ``reset_peak_rss``:
    Linux's VmHWM. Not ``ru_maxrss``: a spawned rank inherits its parent's (measured: a child of
    a 513 MB parent reported 513 MB, its VmHWM 14 MB). ru_maxrss only where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024  # kB
    except (OSError, StopIteration, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_peak_rss() -> bool:
    """Start this process's peak (VmHWM) again from its current RSS (Linux: clear_refs 5);
    whether it could."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def gather_memory(trainer: Trainer) -> list[dict]:
    """Collective: each rank's {"state_bytes", "peak_rss_bytes"}, rank 0 first."""
    mine = {"state_bytes": local_state_bytes(trainer), "peak_rss_bytes": peak_rss_bytes()}
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def follow(spec: Spec, group: Group) -> None:
    """A follower rank: build, then run rank 0's commands until "stop"."""
    trainer = build_rank(spec, group, None)
    commands = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=commands)
        if box[0][0] == "stop":
            break
        try:
            run(trainer, box[0], None)
        except Exception as e:  # noqa: BLE001 - rank 0 raises the same error to its caller; keep following
            print(f"sharded trainer rank {group.rank}: {type(e).__name__}: {e}", file=sys.stderr)
    close_group()


def _spawned(index: int, world: int, port: int, spec: Spec, threads: int) -> None:
    torch.set_num_threads(threads)  # as many as the driver's rank 0 uses
    sharding = spec.sharding
    group = init_group(index + 1, world, "127.0.0.1", port, sharding.backend, sharding.timeout_s)
    follow(spec, group)


class ShardedTrainerHandle:
    """Rank 0 of a sharded trainer, in the driver: ``step(batch)``, ``version``, ``model`` (the
    full weights, the caller's model updated in place), ``save``/``load``/``export_hf``, ``close``.

    group: this process's group when it is already in one (torchrun rank 0); None spawns
    processes - 1 followers on this machine and hosts the rendezvous on a free local port.
    """

    def __init__(self, model: CausalLM, cfg: TrainerConfig, sharding: ShardingConfig, temperature: float = 1.0,
                 pad_id: int = 0, numerics: str = DEFAULT_NUMERICS, group: Group | None = None):
        self.model, self.cfg, self.pad_id = model, cfg, pad_id
        spec = Spec(model.config, cfg, sharding, temperature, pad_id, numerics)
        self.followers = None
        if group is None:
            port = free_port()
            n = sharding.processes
            self.followers = mp.start_processes(_spawned, args=(n, port, spec, torch.get_num_threads()), nprocs=n - 1,
                                                join=False, start_method="spawn")
            group = init_group(0, n, "127.0.0.1", port, sharding.backend, sharding.timeout_s)
        self.group = group
        self.trainer = build_rank(spec, group, model)
        self.commands = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)

    @property
    def version(self) -> int:
        return self.trainer.version

    def lr_at(self, version: int) -> float:
        return self.trainer.lr_at(version)

    def _send(self, *command, dest=None):
        dist.broadcast_object_list([command], src=0, group=self.commands)
        return run(self.trainer, command, self.model if dest is None else dest)

    def step(self, batch: Batch):
        """One optimizer step over all ranks; ``model`` holds the new weights after it."""
        return self._send("step", batch)

    def gather(self, dest=None) -> None:
        """Full weights into ``dest`` (a module or ``(name, tensor)`` callback), default ``model``."""
        self._send("gather", dest=dest)

    def use_off_policy(self, off_policy) -> None:
        """Every rank corrects the loss as ``off_policy`` says from the next step on."""
        self.cfg = self.cfg.model_copy(update={"off_policy": off_policy})
        self._send("off_policy", off_policy)

    def memory(self) -> list[dict]:
        """Each rank's parameter + optimizer bytes (its shards) and peak RSS, rank 0 first."""
        return self._send("memory")

    def save(self, path, extra: dict | None = None):
        """A resumable checkpoint (DCP shards + HF folder of ``model``) at ``path``."""
        return self._send("save", str(path), extra)

    def load(self, path) -> dict:
        """Resume from a save() of any world size; returns its ``extra``."""
        check_checkpoint(path)
        return self._send("load", str(path))

    def export_hf(self, path) -> None:
        """``model`` (current after every step) as a Hugging Face folder."""
        from tidal.model import save_pretrained

        save_pretrained(self.model, path)

    def close(self) -> None:
        """Stop the followers and leave the group."""
        if self.group is None:
            return
        dist.broadcast_object_list([("stop",)], src=0, group=self.commands)
        if self.followers is not None:
            self.followers.join()
        close_group()
        self.group = None


def make_trainer(model: CausalLM, cfg: TrainerConfig, sharding: ShardingConfig | None = None,
                 temperature: float = 1.0, pad_id: int = 0, numerics: str = DEFAULT_NUMERICS):
    """The trainer a driver uses: the in-process Trainer (no ``sharding`` or processes = 1), or
    rank 0's handle; on a torchrun rank != 0 this runs the follower loop and exits the process."""
    sharding = sharding or ShardingConfig()
    if sharding.processes == 1:
        return Trainer(model, cfg, temperature=temperature, pad_id=pad_id, numerics=numerics)
    if sharding.launcher == "spawn":
        return ShardedTrainerHandle(model, cfg, sharding, temperature, pad_id, numerics)
    group = torchrun_group(sharding)
    spec = Spec(model.config, cfg, sharding, temperature, pad_id, numerics)
    if group.rank != 0:
        follow(spec, group)
        sys.exit(0)
    return ShardedTrainerHandle(model, cfg, sharding, temperature, pad_id, numerics, group=group)
