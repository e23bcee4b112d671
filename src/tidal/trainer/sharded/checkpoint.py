"""Checkpoints of the sharded trainer (torch.distributed.checkpoint) and its full-weight exports.

Layout of a checkpoint folder (same atomic write and ``COMPLETE`` marker as
tidal.trainer.checkpoint)::

    dcp/                             model + AdamW state, one file per rank (DCP's format)
    trainer_state.pt                 version, ``extra``, the world size it was saved at
    config.json, model.safetensors   the full policy (where the caller passes its mirror)
    COMPLETE                         written last

DCP stores each tensor with its global shape and the saving ranks' pieces, and ``dcp.load`` reads
whatever pieces the loading ranks' shards need, so a checkpoint saved at 4 processes resumes at 2
(or 1 sharded rank).

Full weights move one parameter at a time (tidal.parallel.gather: ``gather_into``,
``scatter_from``).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from tidal.fsutil import replace_dir
from tidal.model import save_pretrained
from tidal.trainer.checkpoint import (
    COMPLETE,
    TRAINER_STATE,
    TrainerCheckpointError,
    _fsync_tree,
    _read_state,
    _write_marker,
)

DCP_DIR = "dcp"

def save_sharded(trainer, path: str | Path, extra: dict | None = None,
                 mirror: nn.Module | None = None) -> Path:
    """Collective: model and optimizer shards (DCP) + version + ``extra``, written atomically;
    rank 0 adds ``mirror`` (its full model, already gathered) as a Hugging Face folder."""
    path = Path(path)
    rank = dist.get_rank()
    box = [None]
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        if mirror is not None:  # first: save_pretrained writes its folder whole
            save_pretrained(mirror, staging / path.name)
        box = [str(staging)]
    dist.broadcast_object_list(box, src=0)
    staging = Path(box[0])
    inner = staging / path.name
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(inner / DCP_DIR))
    dist.barrier()
    if rank == 0:
        try:
            torch.save({"trainer": {"version": trainer.version, "world_size": dist.get_world_size()},
                        "extra": extra or {}}, inner / TRAINER_STATE)
            _fsync_tree(inner)
            replace_dir(inner, path)
            _write_marker(path, trainer.version)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    dist.barrier()
    return path


def check_checkpoint(path: str | Path) -> Path:
    """The folder, if it is a complete sharded checkpoint; else a TrainerCheckpointError."""
    path = Path(path)
    if not (path / COMPLETE).is_file():
        raise TrainerCheckpointError(
            f"checkpoint {path} does not exist or is incomplete (no {COMPLETE} marker); pass a "
            "folder returned by latest_checkpoint(run_dir)")
    if not (path / DCP_DIR).is_dir():
        raise TrainerCheckpointError(
            f"checkpoint {path} has no {DCP_DIR}/ folder: it was saved by the unsharded trainer; "
            "resume it with sharding.processes = 1")
    return path


def load_sharded(trainer, path: str | Path) -> dict:
    """Collective: restore model + optimizer shards and the version, at any world size; returns
    ``extra``."""
    path = check_checkpoint(path)
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(path / DCP_DIR))
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    saved = _read_state(path / TRAINER_STATE)
    trainer.version = int(saved["trainer"]["version"])
    return saved["extra"]
