"""Resumable trainer checkpoints: the model as a Hugging Face folder plus the trainer's state.

Layout of ``run_dir/checkpoints/step_000040/``::

    config.json, model.safetensors   the policy (from_pretrained loads the folder directly)
    trainer_state.pt                 optimizer, fp32 masters, trainer version, ``extra``
    COMPLETE                         written last; a folder without it is ignored and refused

``extra`` is the caller's (the orchestrator's) state: data position, RNG states
(``capture_rng_state()``), anything a resumed run needs to continue exactly.

Atomicity: everything is written into a hidden staging folder beside the target, fsynced, renamed
into place, and only then is ``COMPLETE`` written. A failure (disk full, killed process) leaves
at worst a staging folder (removed on OSError) or a folder without ``COMPLETE``; earlier
checkpoints are never touched, so ``latest_checkpoint`` still finds the last good one.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import time
import uuid
import zipfile
from pathlib import Path

import numpy as np
import torch

from tidal.fsutil import fsync_dir, replace_dir
from tidal.model import CheckpointError, from_pretrained, save_pretrained
from tidal.trainer.trainer import Trainer

TRAINER_STATE = "trainer_state.pt"
COMPLETE = "COMPLETE"
STEP_DIR = re.compile(r"^step_(\d+)$")


class TrainerCheckpointError(CheckpointError):
    """A trainer checkpoint that cannot be resumed from; the message names the path and the fix."""


def checkpoint_path(run_dir: str | Path, version: int) -> Path:
    """Where the checkpoint of trainer version ``version`` lives: run_dir/checkpoints/step_NNNNNN."""
    return Path(run_dir) / "checkpoints" / f"step_{version:06d}"


def save_checkpoint(trainer: Trainer, path: str | Path, extra: dict | None = None,
                    tokenizer=None) -> Path:
    """Write model + trainer state + ``extra`` to ``path`` atomically (see the module docstring);
    with ``tokenizer``, its files too (a pretrained model's checkpoint then loads in transformers
    with its tokenizer and chat template).

    An existing checkpoint at ``path`` is replaced. On OSError the staging folder is removed and
    an OSError naming the checkpoint is raised; previous checkpoints stay loadable.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        inner = staging / path.name
        save_pretrained(trainer.model, inner, tokenizer)
        state = {"trainer": trainer.state_dict(), "extra": extra or {}}
        torch.save(state, inner / TRAINER_STATE)
        _fsync_tree(inner)
        replace_dir(inner, path)
        _write_marker(path, trainer.version)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise OSError(
            e.errno,
            f"could not write checkpoint {path}: {e.strerror or e}. Earlier checkpoints are intact; "
            "free disk space (or fix the folder's permissions) and save again",
        ) from e
    shutil.rmtree(staging, ignore_errors=True)
    return path


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step under run_dir/checkpoints, or None."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return None
    complete = [
        (int(m[1]), p) for p in folder.iterdir()
        if (m := STEP_DIR.match(p.name)) and (p / COMPLETE).is_file()
    ]
    return max(complete)[1] if complete else None


def load_checkpoint(path: str | Path, trainer: Trainer) -> dict:
    """Load weights, optimizer state, masters and version into ``trainer``; returns ``extra``."""
    path = Path(path)
    if not path.is_dir():
        raise TrainerCheckpointError(
            f"checkpoint {path} does not exist; pass a folder returned by latest_checkpoint(run_dir)"
        )
    if not (path / COMPLETE).is_file():
        raise TrainerCheckpointError(
            f"checkpoint {path} is incomplete (no {COMPLETE} marker: its save was interrupted); "
            "delete it and resume from latest_checkpoint(run_dir)"
        )
    load_weights(path, trainer.model)
    state = _read_state(path / TRAINER_STATE)
    try:
        trainer.load_state_dict(state["trainer"])
    except (KeyError, ValueError) as e:
        raise TrainerCheckpointError(f"checkpoint {path} does not fit this trainer: {e}") from None
    return state["extra"]


def capture_rng_state() -> dict:
    """The global RNG states a resumed run must restore: torch, numpy, python ``random``."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng_state(state: dict) -> None:
    """Inverse of capture_rng_state()."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


# ---------------------------------------------------------------- pieces


def load_weights(path: str | Path, model: torch.nn.Module) -> None:
    """Copy the checkpoint's tensors into ``model`` in place (the trainer and whoever shares the
    model keep their references); the shapes must match exactly. Also a plain Hugging Face
    folder (the guard restores the model RL began from this way)."""
    path = Path(path)
    dtype = next(model.parameters()).dtype
    saved = from_pretrained(path, dtype=dtype).state_dict()
    own = model.state_dict()
    if saved.keys() != own.keys() or any(saved[k].shape != own[k].shape for k in own):
        raise TrainerCheckpointError(
            f"checkpoint {path} holds a different model architecture (config.json: "
            f"{path / 'config.json'}); resume with the model section the run was started with"
        )
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(saved[name])


def _read_state(file: Path) -> dict:
    """torch.load the trainer state. weights_only=False: ``extra`` holds numpy RNG states (arrays),
    and the file is one this run wrote; never resume from checkpoints you do not trust."""
    if not file.is_file():
        raise TrainerCheckpointError(f"{file} is missing; the checkpoint is damaged: resume from an earlier one")
    try:
        state = torch.load(file, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
        raise TrainerCheckpointError(
            f"{file} is corrupt ({type(e).__name__}: {e}); resume from an earlier checkpoint"
        ) from None
    if not isinstance(state, dict) or "trainer" not in state or "extra" not in state:
        raise TrainerCheckpointError(f"{file} is not a tidal trainer state; resume from an earlier checkpoint")
    return state


def _fsync_tree(folder: Path) -> None:
    for f in folder.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(folder)


def _write_marker(path: Path, version: int) -> None:
    tmp = path / f".{COMPLETE}.tmp"
    with open(tmp, "w") as f:
        json.dump({"version": version, "time": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path / COMPLETE)
    fsync_dir(path)
