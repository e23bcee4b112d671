"""Turn a base version's tensors plus one form's chunk payloads into the next version's tensors,
decoding chunks in parallel and verifying every tensor's sha256 before anyone sees the result."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tidal.sync.codec import decode_chunk
from tidal.sync.errors import SyncError, VerificationError
from tidal.sync.manifest import WeightManifest
from tidal.sync.tensors import TensorBits, UINT_BY_WIDTH, torch_dtype


def layout(tensors: list[TensorBits]) -> list[tuple]:
    return [(t.name, t.dtype, tuple(t.shape)) for t in tensors]


def start_tensors(manifest: WeightManifest, base: list[TensorBits] | None) -> list[TensorBits]:
    """Fresh arrays to decode into (a delta's chunks copy their base slice in first, in the
    decode threads: the base stays untouched, so a failed pull leaves the last good version)."""
    if manifest.kind == "delta":
        if base is None:
            raise SyncError(f"version {manifest.version} is a delta on version "
                            f"{manifest.base_version}, which this side does not hold")
        if layout(base) != [(t.name, t.dtype, t.shape) for t in manifest.tensors]:
            raise SyncError(f"version {manifest.version}'s tensors differ from its base "
                            f"{manifest.base_version}'s: fetch an anchor instead")
    out = []
    for t in manifest.tensors:
        uint = UINT_BY_WIDTH[torch_dtype(t.dtype).itemsize]
        out.append(TensorBits(t.name, t.dtype, t.shape,
                              np.empty(t.numel, dtype=str(uint).removeprefix("torch.")), t.file))
    return out


def apply_form(manifest: WeightManifest, payload_of: Callable[[int], bytes],
               base: list[TensorBits] | None, threads: int = 1) -> list[TensorBits]:
    """The tensors of ``manifest.version``; ``payload_of(i)`` returns chunk i's verified payload.
    Raises VerificationError (naming the tensor) if a result does not hash to the manifest."""
    tensors = start_tensors(manifest, base)

    def decode(i: int) -> None:
        c = manifest.chunks[i]
        target = tensors[c.tensor].bits[c.start:c.start + c.count]
        if base is not None and manifest.kind == "delta":
            target[:] = base[c.tensor].bits[c.start:c.start + c.count]
        decode_chunk(payload_of(i), target)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(decode, range(len(manifest.chunks))))
    verify(manifest, tensors)
    return tensors


def verify(manifest: WeightManifest, tensors: list[TensorBits]) -> None:
    def digest(t: TensorBits) -> str:
        return t.sha256()

    with ThreadPoolExecutor(2) as pool:
        digests = list(pool.map(digest, tensors))
    for entry, got in zip(manifest.tensors, digests):
        if got != entry.sha256:
            raise VerificationError(
                f"tensor {entry.name} of version {manifest.version} ({manifest.kind}) hashes to "
                f"{got[:16]}…, the manifest says {entry.sha256[:16]}…: the weights were not applied")
