"""The publisher: each new version becomes a delta against the previous one (and an anchor every
``anchor_every`` versions, on demand, or when the set of tensors changes), chunked and encoded in
parallel, written atomically into a VersionStore that an origin server serves."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import xxhash

from tidal.sync.apply import apply_form, layout
from tidal.sync.codec import encode_chunk
from tidal.sync.config import SyncConfig
from tidal.sync.manifest import ChunkEntry, FileEntry, TensorEntry, WeightManifest
from tidal.sync.plan import cheapest_path
from tidal.sync.store import VersionStore
from tidal.sync.tensors import TensorBits


def chunk_ranges(tensors: list[TensorBits], chunk_elements: int) -> list[tuple[int, int, int]]:
    """(tensor index, start, count) of every chunk, tensors in order, each split evenly."""
    out = []
    for i, t in enumerate(tensors):
        n = t.bits.size
        for start in range(0, n, chunk_elements):
            out.append((i, start, min(chunk_elements, n - start)))
    return out


def encode_form(tensors: list[TensorBits], base: list[TensorBits] | None, cfg: SyncConfig,
                version: int, base_version: int | None, files: list[FileEntry]) -> tuple[WeightManifest, list[bytes]]:
    """Encode every chunk (in parallel) and describe them in a manifest."""
    ranges = chunk_ranges(tensors, cfg.chunk_elements)

    def encode(r: tuple[int, int, int]) -> bytes:
        i, s, n = r
        old = None if base is None else base[i].bits[s:s + n]
        return encode_chunk(tensors[i].bits[s:s + n], old)

    with ThreadPoolExecutor(cfg.threads) as pool:
        payloads = list(pool.map(encode, ranges))
        digests = list(pool.map(lambda t: t.digest(cfg.hash), tensors))
    chunks, offset = [], 0
    for (i, s, n), p in zip(ranges, payloads):
        chunks.append(ChunkEntry(tensor=i, start=s, count=n, offset=offset, length=len(p),
                                 xxh3=xxhash.xxh3_64_hexdigest(p)))
        offset += len(p)
    entries = [TensorEntry(name=t.name, dtype=t.dtype, shape=t.shape, file=t.file, digest=d)
               for t, d in zip(tensors, digests)]
    manifest = WeightManifest(version=version, kind="delta" if base is not None else "anchor",
                              base_version=base_version, hash=cfg.hash, tensors=entries, chunks=chunks,
                              files=files, data_bytes=offset)
    return manifest, payloads


class Publisher:
    def __init__(self, root, cfg: SyncConfig | None = None):
        self.cfg = cfg or SyncConfig()
        self.store = VersionStore(root)
        self.head: list[TensorBits] | None = None
        self.head_version: int | None = self.store.latest()
        if self.head_version is not None:
            self.head = rebuild(self.store, self.head_version, self.cfg.threads)

    def publish(self, tensors: list[TensorBits], files: dict[str, bytes] | None = None,
                version: int | None = None, anchor: bool = False) -> list[WeightManifest]:
        """Publish ``tensors`` as ``version`` (default: the next one); returns the forms written."""
        if version is None:
            version = 0 if self.head_version is None else self.head_version + 1
        if self.head_version is not None and version <= self.head_version:
            raise ValueError(f"version {version} is not newer than the published {self.head_version}")
        entries = [FileEntry(name=name, sha256=self.store.write_blob(data), size=len(data))
                   for name, data in sorted((files or {}).items())]
        delta_ok = self.head is not None and layout(self.head) == layout(tensors)
        written = []
        if delta_ok:
            written.append(encode_form(tensors, self.head, self.cfg, version, self.head_version, entries))
        if not delta_ok or anchor or version % self.cfg.anchor_every == 0:
            written.append(encode_form(tensors, None, self.cfg, version, None, entries))
        for manifest, payloads in written:
            self.store.write_form(manifest, payloads)
        self.store.set_latest(version)
        self.head, self.head_version = tensors, version
        self.store.collect_garbage(self.cfg.keep_versions)
        return [m for m, _ in written]


def rebuild(store: VersionStore, version: int, threads: int = 1) -> list[TensorBits]:
    """A version's tensors from the store's own files (a publisher restarting on an old root)."""
    path, _ = cheapest_path(store.forms(), version, None)
    tensors = None
    for v, kind in path:
        m = store.manifest(v, kind)
        tensors = apply_form(m, lambda i, m=m, v=v, kind=kind: store.read_range(
            v, kind, m.chunks[i].offset, m.chunks[i].length), tensors, threads)
    return tensors
