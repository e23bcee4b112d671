"""Versions as folders on the puller's disk (`tidal sync pull --out DIR`):

    DIR/v00000007/  *.safetensors (tensors byte-identical to the published ones), side files
                    (config.json, ...), manifest.json, tidal_complete
    DIR/LATEST      "7"

A version folder is written under a hidden staging name and renamed into place with its
completion marker; LATEST moves after that. The newest complete folder is the base of the next
delta, re-verified against its manifest when read back.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from tidal.fsutil import replace_dir, write_atomic
from tidal.sync.apply import verify
from tidal.sync.errors import SyncError, VerificationError
from tidal.sync.manifest import WeightManifest
from tidal.sync.store import disk_full_error
from tidal.sync.tensors import TensorBits, read_safetensors_folder, write_safetensors_files

COMPLETE_MARKER = "tidal_complete"


def version_dir(out: Path, version: int) -> Path:
    return out / f"v{version:08d}"


def read_held(out: Path) -> tuple[WeightManifest, list[TensorBits], dict[str, bytes]] | None:
    """The newest complete version in ``out`` with its tensors (verified), or None if none is
    usable (absent, incomplete or locally corrupted: then the puller starts from an anchor)."""
    try:
        folder = version_dir(out, int((out / "LATEST").read_text()))
    except (FileNotFoundError, ValueError):
        return None
    if not (folder / COMPLETE_MARKER).is_file():
        return None
    manifest = WeightManifest.from_json((folder / "manifest.json").read_bytes())
    by_name = {t.name: t for t in read_safetensors_folder(folder)}
    if set(by_name) != {t.name for t in manifest.tensors}:
        return None
    tensors = [by_name[t.name] for t in manifest.tensors]
    try:
        verify(manifest, tensors)
    except VerificationError:
        return None
    files = {f.name: (folder / f.name).read_bytes() for f in manifest.files if (folder / f.name).is_file()}
    return manifest, tensors, files


def write_version(out: Path, manifest: WeightManifest, tensors: list[TensorBits],
                  files: dict[str, bytes], keep: int = 2) -> Path:
    """Write a verified version atomically; on any write failure nothing is left half-written."""
    out.mkdir(parents=True, exist_ok=True)
    final = version_dir(out, manifest.version)
    staging = out / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir()
        write_safetensors_files(tensors, staging)
        for name, data in files.items():
            (staging / name).write_bytes(data)
        (staging / "manifest.json").write_bytes(manifest.to_json())
        (staging / COMPLETE_MARKER).write_text("")
        replace_dir(staging, final)
        write_atomic(out / "LATEST", str(manifest.version).encode())
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise disk_full_error(e, out) from None
    for old in sorted(out.glob("v[0-9]*"))[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def pull_to_folder(puller, out: Path, version: int | None = None) -> Path:
    """Pull ``version`` (default newest) into ``out``, starting from what ``out`` holds."""
    held = read_held(out)
    if held is not None:
        puller.hold(*held, verified=True)
    if out.exists() and not out.is_dir():
        raise SyncError(f"--out {out} is a file; name a folder")
    puller.pull(version)
    return write_version(out, puller.manifest, puller.tensors, puller.files)
