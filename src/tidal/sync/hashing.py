"""Each tensor's digest (the hash its manifest names), taken while its form is still applied.

Which hash: a manifest names it (``WeightManifest.hash``). New versions use BLAKE3: a
cryptographic hash (256-bit, a Merkle tree of 1 KiB leaves inside) that runs ~3x faster per core
than SHA-256 on CPUs with SHA-NI (docs/sync.md) and releases the GIL. Manifests written before
it carry no ``hash`` field and mean SHA-256, which is still verified. Re-hashing the applied
bytes of a small update is most of its delivery time (≈214 MB for a 1.8 MB delta of workload
a), so the cheaper hash is what makes delivery fast while every tensor's final bytes stay
checked.

Hashing must not wait for the last chunk: as soon as a tensor's leading chunks are applied their
bytes go into that tensor's running hasher in a thread pool (hashlib and blake3 release the GIL),
so hashing overlaps decoding and the network, on every core.

What is hashed is exactly what ``TensorBits.digest`` hashes (chunks tile a tensor in element
order), and only tensors that need it: a tensor of an in-place delta that no chunk modified keeps
its ``known`` digest (docs/sync.md, "Verification"); once any chunk modifies it, it is hashed from
its first chunk.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from tidal.sync.manifest import WeightManifest
from tidal.sync.tensors import TensorBits, new_hasher


class StreamingDigests:
    """Feed it ``chunk_done(i, modified)`` as chunks are applied (from any thread); ``digests()``
    once all are applied."""

    def __init__(self, manifest: WeightManifest, tensors: list[TensorBits], known: dict[int, str] | None,
                 pool: ThreadPoolExecutor):
        self.manifest, self.tensors, self.known, self.pool = manifest, tensors, known or {}, pool
        self.chunks_of: list[list[int]] = [[] for _ in tensors]
        for i, c in enumerate(manifest.chunks):
            self.chunks_of[c.tensor].append(i)
        self.applied = [False] * len(manifest.chunks)
        self.modified = [False] * len(tensors)
        self.cursor = [0] * len(tensors)
        self.hashers = [new_hasher(manifest.hash) for _ in tensors]
        self.locks = [threading.Lock() for _ in tensors]
        self.pending: list[Future] = []
        self._lock = threading.Lock()

    def needs_hash(self, t: int) -> bool:
        return self.modified[t] or t not in self.known

    def chunk_done(self, i: int, modified: bool) -> None:
        t = self.manifest.chunks[i].tensor
        self.applied[i] = True
        if modified:
            self.modified[t] = True
        if self.needs_hash(t):
            self._submit(t)

    def _submit(self, t: int) -> None:
        future = self.pool.submit(self._advance, t)
        with self._lock:
            self.pending.append(future)

    def _advance(self, t: int) -> None:
        """Hash tensor t's applied chunks that follow what is already hashed, in order."""
        with self.locks[t]:
            chunks = self.chunks_of[t]
            while self.cursor[t] < len(chunks) and self.applied[chunks[self.cursor[t]]]:
                c = self.manifest.chunks[chunks[self.cursor[t]]]
                part = np.ascontiguousarray(self.tensors[t].bits[c.start:c.start + c.count])
                self.hashers[t].update(memoryview(part).cast("B"))
                self.cursor[t] += 1

    def digests(self) -> list[str]:
        """Every tensor's digest (all chunks must have been applied): hashed, or known."""
        for t in range(len(self.tensors)):
            if self.needs_hash(t):
                self._submit(t)  # a tensor without chunks, or one whose last advance is still queued
        with self._lock:
            pending = list(self.pending)
        for future in pending:
            future.result()
        if not all(self.applied) or any(self.cursor[t] != len(self.chunks_of[t])
                                         for t in range(len(self.tensors)) if self.needs_hash(t)):
            raise RuntimeError("digests() called before every chunk was applied")
        return [self.hashers[t].hexdigest() if self.needs_hash(t) else self.known[t]
                for t in range(len(self.tensors))]
