"""A folder of published versions: what an origin serves and a relay caches (same layout).

    ROOT/v00000007/delta/manifest.json, data.bin    (delta against the manifest's base_version)
    ROOT/v00000010/anchor/manifest.json, data.bin   (full snapshot; a version may have both)
    ROOT/blobs/<sha256>                             side files (config.json, ...) by content
    ROOT/LATEST                                      newest complete version number

Each form is written into a hidden staging folder and renamed into place (manifest written last
inside it), and LATEST moves only after that, so a reader never sees half a version.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import uuid
from pathlib import Path

from tidal.fsutil import replace_dir, write_atomic
from tidal.sync.errors import SyncError
from tidal.sync.manifest import WeightManifest

KINDS = ("delta", "anchor")


def disk_full_error(err: OSError, where: Path) -> SyncError:
    """One clear message for a full disk (the most common write failure), else the OS's words."""
    if err.errno == errno.ENOSPC:
        return SyncError(f"no space left on the device holding {where}: free some space or point "
                         "the command at another folder; nothing half-written was left behind")
    return SyncError(f"cannot write under {where}: {err}")


class VersionStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self._forms: dict[tuple[str, str], dict] = {}

    def form_dir(self, version: int, kind: str) -> Path:
        return self.root / f"v{version:08d}" / kind

    def manifest_path(self, version: int, kind: str) -> Path:
        return self.form_dir(version, kind) / "manifest.json"

    def data_path(self, version: int, kind: str) -> Path:
        return self.form_dir(version, kind) / "data.bin"

    def blob_path(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise SyncError(f"{sha256!r} is not a sha256 hex digest")
        return self.root / "blobs" / sha256

    # ---------------------------------------------------------------- writing

    def write_form(self, manifest: WeightManifest, payloads) -> None:
        """Write one form of a version: ``payloads`` yields the chunk payloads in manifest order."""
        final = self.form_dir(manifest.version, manifest.kind)
        staging = final.parent / f".{manifest.kind}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            staging.mkdir(parents=True)
            with open(staging / "data.bin", "wb") as f:
                for payload in payloads:
                    f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            (staging / "manifest.json").write_bytes(manifest.to_json())
            replace_dir(staging, final)
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise disk_full_error(e, self.root) from None

    def write_blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        path = self.blob_path(sha)
        if not path.exists():
            write_atomic(path, data)
        return sha

    def set_latest(self, version: int) -> None:
        current = self.latest()
        if current is None or version > current:
            write_atomic(self.root / "LATEST", str(version).encode())

    # ---------------------------------------------------------------- reading

    def latest(self) -> int | None:
        try:
            return int((self.root / "LATEST").read_text())
        except FileNotFoundError:
            return None

    def has(self, version: int, kind: str) -> bool:
        return self.manifest_path(version, kind).is_file()

    def manifest(self, version: int, kind: str) -> WeightManifest:
        path = self.manifest_path(version, kind)
        try:
            return WeightManifest.from_json(path.read_bytes())
        except FileNotFoundError:
            raise SyncError(f"version {version} ({kind}) is not in {self.root}") from None

    def forms(self) -> list[dict]:
        """Every complete form: version, kind, base_version, data_bytes (the puller's plan input).
        A written form never changes, so each manifest is read once."""
        out = []
        for vdir in sorted(self.root.glob("v[0-9]*")):
            for kind in KINDS:
                key = (vdir.name, kind)
                if key not in self._forms and (vdir / kind / "manifest.json").is_file():
                    m = self.manifest(int(vdir.name[1:]), kind)
                    self._forms[key] = {"version": m.version, "kind": kind,
                                        "base_version": m.base_version, "data_bytes": m.data_bytes}
                if key in self._forms and (vdir / kind).is_dir():
                    out.append(self._forms[key])
        return out

    def index(self) -> dict:
        return {"latest": self.latest(), "forms": self.forms()}

    def read_range(self, version: int, kind: str, offset: int, length: int) -> bytes:
        with open(self.data_path(version, kind), "rb") as f:
            f.seek(offset)
            return f.read(length)

    # ---------------------------------------------------------------- garbage

    def collect_garbage(self, keep: int) -> None:
        """Keep the newest ``keep`` versions and the newest anchor at or before the oldest kept
        one (so every kept version stays buildable); delete older version folders."""
        versions = sorted(int(p.name[1:]) for p in self.root.glob("v[0-9]*") if p.name[1:].isdigit())
        if len(versions) <= keep:
            return
        oldest_kept = versions[-keep]
        anchors = [v for v in versions if v <= oldest_kept and self.has(v, "anchor")]
        floor = anchors[-1] if anchors else oldest_kept
        for v in versions:
            if v < floor:
                shutil.rmtree(self.root / f"v{v:08d}", ignore_errors=True)
