"""Atomic hand-offs shared by every writer of folders (model, trainer checkpoints, weights) and
of small files (JSON results, reports, pointers).

A folder or file is written under a hidden staging name beside its target and renamed into
place, so a reader sees either the previous complete one or the new complete one, never a
half-written one.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes) -> Path:
    """Write a small file (a LATEST pointer, a blob, a JSON result) via a hidden temp file beside
    it and a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` is moved aside first and deleted after."""
    old = None
    if dst.exists():
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
        dst.rename(old)
    src.rename(dst)
    fsync_dir(dst.parent)
    if old is not None:
        shutil.rmtree(old)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """``write_atomic`` for text (UTF-8)."""
    return write_atomic(path, text.encode("utf-8"))
