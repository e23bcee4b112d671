"""What describes the published versions, and the plan made from it: the typed message of one
version's form (``WeightManifest``: its tensors, chunks and side files, and the hash every tensor
is checked by), and the cheapest chain of forms from the version held to the one wanted
(``cheapest_path``), which the puller, the origin's /pull and a restarting publisher all use.
Pure data and arithmetic: pydantic, no torch, no network.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from tidal.sync.errors import SyncError


# ── WeightManifest ────────────────────────────────────────────────────────────────────────────────
# The typed message that describes one published version: ``WeightManifest``.
#
# Invariants (checked by ``WeightManifest.check``):
# - chunks of one tensor are in element order, cover it exactly, and lie back to back in the
#   version's data file (``offset`` of each = end of the previous);
# - an anchor has no base; a delta's base is an earlier version;
# - ``digest`` of a tensor is the manifest's ``hash`` (BLAKE3, or SHA-256 in manifests written
#   before the field existed) of its final bytes (little-endian, C order) at this version, so a
#   puller verifies the result, not the transfer.

FORMAT = 1
HASHES = ("blake3", "sha256")
"""Tensor hashes a manifest may name. "sha256" is what a manifest without a ``hash`` field means
(those written before BLAKE3); both are cryptographic, so a lying upstream cannot make a puller
accept bytes other than the publisher's."""
HashName = Literal["blake3", "sha256"]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorEntry(Message):
    name: str
    dtype: str
    """torch dtype name (bfloat16, float32, int64, float8_e4m3fn, ...)."""
    shape: tuple[int, ...]
    file: str = "model.safetensors"
    """safetensors file the tensor belongs to when written out."""
    digest: str = Field(validation_alias=AliasChoices("digest", "sha256"))
    """hex digest (the manifest's ``hash``) of the tensor's final bytes; older manifests call
    this field ``sha256``."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class ChunkEntry(Message):
    tensor: int
    """Index into ``WeightManifest.tensors``."""
    start: int = Field(ge=0)
    """First element of the tensor this chunk covers."""
    count: int = Field(ge=0)
    """Elements covered."""
    offset: int = Field(ge=0)
    """Byte offset of the chunk's payload in the version's data file."""
    length: int = Field(ge=0)
    """Payload bytes."""
    xxh3: str
    """hex xxh3-64 of the payload (transfer check; the tensor digest is the result check)."""


class FileEntry(Message):
    """A small side file (config.json, tokenizer) stored once by content and named here."""

    name: str
    sha256: str
    size: int


class WeightManifest(Message):
    format: int = FORMAT
    version: int = Field(ge=0)
    kind: Literal["anchor", "delta"]
    base_version: int | None = None
    """The version a delta applies to (None for an anchor)."""
    codec: str = "tidal-delta-1"
    hash: HashName = "sha256"
    """The hash of every ``TensorEntry.digest`` (the publisher's ``sync.hash``). Absent in
    manifests written before BLAKE3, which mean SHA-256 and still verify."""
    tensors: list[TensorEntry]
    chunks: list[ChunkEntry]
    files: list[FileEntry] = []
    data_bytes: int = Field(ge=0)

    @model_validator(mode="after")
    def check(self) -> "WeightManifest":
        if (self.kind == "anchor") != (self.base_version is None):
            raise ValueError("an anchor has no base_version and a delta needs one")
        if self.base_version is not None and self.base_version >= self.version:
            raise ValueError(f"base_version {self.base_version} must precede version {self.version}")
        offset, covered = 0, [0] * len(self.tensors)
        for c in self.chunks:
            if c.tensor >= len(self.tensors) or c.offset != offset or c.start != covered[c.tensor]:
                raise ValueError(f"chunk {c} is out of order or overlaps another")
            offset += c.length
            covered[c.tensor] += c.count
        if offset != self.data_bytes:
            raise ValueError(f"chunks hold {offset} bytes but data_bytes says {self.data_bytes}")
        for t, n in zip(self.tensors, covered):
            if n != t.numel:
                raise ValueError(f"chunks cover {n} of tensor {t.name}'s {t.numel} elements")
        return self

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> "WeightManifest":
        return cls.model_validate_json(data)


# ── Planning a pull ───────────────────────────────────────────────────────────────────────────────
# Which forms to fetch to reach a version: the cheapest chain in bytes.
#
# Each version may exist as a delta (from its base) and/or an anchor (from nothing). The cost of
# reaching v is min(anchor bytes of v, cost of v's base + delta bytes of v), with the version the
# puller holds costing 0; versions only point back, so one pass in version order finds it.

Step = tuple[int, str]
"""(version, "delta" | "anchor")"""


def cheapest_path(forms: list[dict], target: int, held: int | None,
                  avoid: frozenset[Step] = frozenset()) -> tuple[list[Step], int]:
    """(forms to apply in order, bytes to fetch) to go from ``held`` to ``target``; ``avoid``
    lists forms known to be bad (a lying or broken one), so a fallback route is found."""
    if held == target:
        return [], 0
    best: dict[int, tuple[int, list[Step]]] = {}
    if held is not None:
        best[held] = (0, [])
    for f in sorted(forms, key=lambda f: (f["version"], f["kind"] != "anchor")):
        v, kind = f["version"], f["kind"]
        if (v, kind) in avoid or v > target or (held is not None and v <= held):
            continue
        if kind == "anchor":
            option = (f["data_bytes"], [(v, kind)])
        elif f["base_version"] in best:
            cost, path = best[f["base_version"]]
            option = (cost + f["data_bytes"], path + [(v, kind)])
        else:
            continue
        if v not in best or option[0] < best[v][0]:
            best[v] = option
    if target not in best:
        have = sorted({f["version"] for f in forms})
        raise SyncError(f"version {target} cannot be built from what the upstream offers "
                        f"(versions {have[:3]}...{have[-3:]}, holding {held}): publish an anchor "
                        "(`tidal sync publish --anchor`) or ask for a version the upstream has")
    cost, path = best[target]
    return path, cost
