"""The typed message that describes one published version: ``WeightManifest``.

Invariants (checked by ``WeightManifest.check``):
- chunks of one tensor are in element order, cover it exactly, and lie back to back in the
  version's data file (``offset`` of each = end of the previous);
- an anchor has no base; a delta's base is an earlier version;
- ``digest`` of a tensor is the manifest's ``hash`` (BLAKE3, or SHA-256 in manifests written
  before the field existed) of its final bytes (little-endian, C order) at this version, so a
  puller verifies the result, not the transfer.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

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
