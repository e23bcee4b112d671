"""Pretrained checkpoints cached by what made them: run mid-training once per distinct recipe.

``cache_dir/<key>/model`` holds the checkpoint, ``cache_dir/<key>/pretrain_metrics.jsonl`` its
curve and ``cache_dir/<key>/tidal_config.json`` what was hashed: the model section, the pretrain
section (minus where the cache lives and how often it logs), the seed, tidal's version, and what
the corpus is made of. That is, with ``pretrain.corpus`` set, the path, size and mtime of every
corpus file (not ``corpus_docs``, unused then, nor the environment); else the environment that
writes it: its name, its validated ``env.args`` (defaults filled in, so writing a default out
changes nothing) and its ``corpus_version``, never ``env.sandbox``. A run is built in a hidden sibling folder and renamed into
place, so a half-finished or crashed pretraining is never mistaken for a cached one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import uuid
from pathlib import Path

import tidal
from tidal.model.checkpoint import COMPLETE_MARKER
from tidal.pretrain.loop import MODEL_DIR, pretrain, pretrain_in_child
from tidal.pretrain.view import MidTrainingView

log = logging.getLogger(__name__)

NOT_HASHED = {"pretrain": {"cache_dir", "log_every"}}
"""Fields that do not change the pretrained weights, so changing them must not re-pretrain."""


def cache_key(cfg, env=None) -> str:
    """12 hex digits identifying the pretrained weights ``cfg`` would produce (``env``: the run's
    EnvironmentSpec, already built; None = built here to read its corpus_version)."""
    return _key(_hashed(MidTrainingView.of(cfg), env))


def _key(hashed: dict) -> str:
    return hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()[:12]


def cached_pretrained(cfg, progress: bool = True, child_env: dict | None = None, env=None) -> Path:
    """The pretrained model folder for ``cfg``: reused if cached, else pretrained now and cached.
    ``child_env``: pretrain in a spawned child process whose environment has these changes (a
    value None removes the variable; see loop.pretrain_in_child); None = in this process.
    ``env``: the run's EnvironmentSpec where the caller built it (see cache_key)."""
    view = MidTrainingView.of(cfg)
    hashed = _hashed(view, env)
    root = Path(view.pretrain.cache_dir) / _key(hashed)
    model_dir = root / MODEL_DIR
    if (model_dir / COMPLETE_MARKER).is_file():
        log.info("reusing pretrained model %s", model_dir)
        return model_dir
    log.info("no pretrained model cached for this config; pretraining into %s", root)
    staging = root.parent / f".{root.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        if child_env is None:
            pretrain(view, staging, progress=progress)
        else:
            pretrain_in_child(view, staging, child_env, progress=progress)
        (staging / "tidal_config.json").write_text(json.dumps(hashed, indent=2, sort_keys=True) + "\n")
        _publish(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return model_dir


def _hashed(cfg: MidTrainingView, env=None) -> dict:
    files = bool(cfg.pretrain.corpus)
    unused = {"corpus_docs"} if files else set()
    return {
        "model": cfg.model.model_dump(mode="json"),
        "pretrain": cfg.pretrain.model_dump(mode="json", exclude=NOT_HASHED["pretrain"] | unused),
        "corpus": ({"files": [_file_identity(p) for p in cfg.pretrain.corpus]} if files
                   else {"environment": environment_identity(cfg.env, env)}),
        "seed": cfg.run.seed,
        "tidal_version": tidal.__version__,
    }


def environment_identity(env_cfg, spec=None) -> dict:
    """What an environment's corpus depends on: its name, validated args and corpus_version
    (bumped by the environment whenever its corpus text changes); ``spec``: the environment
    of ``env_cfg`` where already built."""
    from tidal.env import from_config, resolved_args

    version = (spec or from_config(env_cfg)).corpus_version
    return {"name": env_cfg.name, "args": resolved_args(env_cfg), "corpus_version": version}


def _file_identity(path: str) -> list:
    p = Path(path)
    st = p.stat() if p.is_file() else None
    return [str(p.resolve()), st.st_size if st else None, st.st_mtime_ns if st else None]


def _publish(staging: Path, root: Path) -> None:
    """Rename staging to root. A complete root made meanwhile by another process wins; an
    incomplete one (a crash before this rename existed) is replaced."""
    if (root / MODEL_DIR / COMPLETE_MARKER).is_file():
        log.info("another process cached %s first; using it", root)
        return
    if root.exists():
        shutil.rmtree(root)
    staging.rename(root)
