"""Turn a base version's tensors plus one form's chunk payloads into the next version's tensors,
decoding chunks in parallel and verifying every tensor's digest (the hash its manifest names,
BLAKE3 for new versions) before anyone sees the result.

A delta is applied in place on the base's arrays (a sparse chunk touches only its changed
elements: no copy of the base, no page faults on 200 MB of fresh memory). Each chunk keeps what
changed, so a chunk that fails to decode or a result that fails its hashes is undone and the
base is left exactly as it was (the last good version). A sparse chunk keeps only its positions
and differences: undoing it subtracts them again (wrapping integer arithmetic is exact), so
applying it costs no gather of the old values.

Hashing skips what cannot have changed: a tensor that no chunk modified still holds the base's
bytes, whose digest was verified when the base was applied, so its digest is the base's; the
check ``digest == manifest entry`` still runs for every tensor (docs/sync.md, "Verification").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tidal.sync.codec import SPARSE_KINDS, changes, decode_chunk
from tidal.sync.errors import SyncError, VerificationError
from tidal.sync.hashing import StreamingDigests
from tidal.sync.manifest import WeightManifest
from tidal.sync.tensors import TensorBits, UINT_BY_WIDTH, torch_dtype

Undo = tuple[np.ndarray, np.ndarray | None, np.ndarray]
"""(target slice, positions, the differences added there) for a sparse chunk, or (target slice,
None, the values the whole slice held before) for any other."""


def layout(tensors: list[TensorBits]) -> list[tuple]:
    return [(t.name, t.dtype, tuple(t.shape)) for t in tensors]


def start_tensors(manifest: WeightManifest, base: list[TensorBits] | None) -> list[TensorBits]:
    """The arrays to decode into: the base's own for a delta (changed in place), fresh ones for
    an anchor."""
    if manifest.kind == "delta":
        if base is None:
            raise SyncError(f"version {manifest.version} is a delta on version "
                            f"{manifest.base_version}, which this side does not hold")
        if layout(base) != [(t.name, t.dtype, t.shape) for t in manifest.tensors]:
            raise SyncError(f"version {manifest.version}'s tensors differ from its base "
                            f"{manifest.base_version}'s: fetch an anchor instead")
        return base
    out = []
    for t in manifest.tensors:
        uint = UINT_BY_WIDTH[torch_dtype(t.dtype).itemsize]
        out.append(TensorBits(t.name, t.dtype, t.shape,
                              np.empty(t.numel, dtype=str(uint).removeprefix("torch.")), t.file))
    return out


def apply_chunk(payload: bytes | memoryview, target: np.ndarray) -> Undo | None:
    """Apply one payload to ``target`` in place; returns how to undo it (None: nothing changed)."""
    if payload[0] in SPARSE_KINDS:
        positions, diffs = changes(payload, target)
        if positions.size == 0:
            return None
        target[positions] += diffs  # positions are distinct (strictly increasing)
        return (target, positions, diffs)
    undo = (target, None, target.copy())
    decode_chunk(payload, target)
    return undo


def undo_all(undos: list[Undo | None]) -> None:
    for u in reversed(undos):
        if u is not None:
            target, positions, values = u
            if positions is None:
                target[:] = values
            else:
                target[positions] -= values


def apply_form(manifest: WeightManifest, payload_of: Callable[[int], bytes],
               base: list[TensorBits] | None, threads: int = 1, base_digests: list[str] | None = None,
               timeline: dict | None = None, accept: Callable[[], None] | None = None) -> list[TensorBits]:
    """The tensors of ``manifest.version``; ``payload_of(i)`` returns chunk i's verified payload
    and may block until it has arrived (the puller applies chunks while later ones are still on
    the wire). Chunks are applied in order by ``threads`` threads; each tensor's digest is taken
    by as many more as its chunks are applied (hashing.py), so hashing overlaps decoding.

    A delta changes ``base``'s arrays in place and returns them; on any failure they are
    restored first. ``base_digests`` (the base's verified digest per tensor, by the same hash as
    ``manifest.hash``: the caller checks) lets tensors no chunk touched skip re-hashing. ``timeline`` gets "decode_done" and "hash_done" (time.time()).
    Raises VerificationError (naming the tensor) if a result does not hash to the manifest.
    ``accept()``, if given, is called once the result is verified and may block or raise; if it
    raises, the result is undone (the puller applies a form while it still arrives and decides
    to keep it only when everything else the version needs has arrived too)."""
    tensors = start_tensors(manifest, base)
    in_place = tensors is base
    undos: list[Undo | None] = [None] * len(manifest.chunks)
    known = dict(enumerate(base_digests)) if in_place and base_digests is not None else None
    try:
        with ThreadPoolExecutor(max(threads, 1)) as hash_pool:
            hashes = StreamingDigests(manifest, tensors, known, hash_pool)

            def decode(i: int) -> None:
                c = manifest.chunks[i]
                target = tensors[c.tensor].bits[c.start:c.start + c.count]
                if in_place:
                    undos[i] = apply_chunk(payload_of(i), target)
                else:
                    decode_chunk(payload_of(i), target)
                hashes.chunk_done(i, not in_place or undos[i] is not None)

            with ThreadPoolExecutor(max(threads, 1)) as pool:
                # map submits in order, raises the first failure, cancels what has not started.
                list(pool.map(decode, range(len(manifest.chunks))))
            if timeline is not None:
                timeline["decode_done"] = time.time()
            got = hashes.digests()
        check_digests(manifest, got)
        if timeline is not None:
            timeline["hash_done"] = time.time()
        if accept is not None:
            accept()
    except BaseException:
        if in_place:
            undo_all(undos)
        raise
    return tensors


def digests(tensors: list[TensorBits], known: dict[int, str] | None = None, threads: int = 2,
            hash: str = "blake3") -> list[str]:
    """``hash`` digest of every tensor, those in ``known`` taken from it; the rest hashed in
    parallel threads, largest first (hashlib and blake3 release the GIL on large buffers)."""
    known = known or {}
    todo = sorted((i for i in range(len(tensors)) if i not in known), key=lambda i: -tensors[i].bits.nbytes)
    with ThreadPoolExecutor(max(threads, 1)) as pool:
        hashed = dict(zip(todo, pool.map(lambda i: tensors[i].digest(hash), todo)))
    return [known[i] if i in known else hashed[i] for i in range(len(tensors))]


def verify(manifest: WeightManifest, tensors: list[TensorBits], known: dict[int, str] | None = None,
           threads: int = 2) -> None:
    """Every tensor's digest (hashed, or known to be unchanged since it was verified) must be
    the manifest's."""
    check_digests(manifest, digests(tensors, known, threads, manifest.hash))


def check_digests(manifest: WeightManifest, got: list[str]) -> None:
    for entry, digest in zip(manifest.tensors, got):
        if digest != entry.digest:
            raise VerificationError(
                f"tensor {entry.name} of version {manifest.version} ({manifest.kind}) hashes to "
                f"{digest[:16]}… by {manifest.hash}, the manifest says {entry.digest[:16]}…: the weights "
                f"were not applied")
