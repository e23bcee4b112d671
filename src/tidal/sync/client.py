"""The receiving end's building blocks: how a form's chunks arrive, and how a form is applied.

Chunks come over parallel HTTP range requests or inside one /pull answer, each checked against
its xxh3 as soon as its bytes arrive and kept across retries and upstreams (the puller and the
relay fetch so). A form is then applied to the base's tensors in place, chunks decoded in
parallel while each tensor's digest is taken, and undone on any failure (the puller, and a
publisher rebuilding its newest version, apply so).
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import aiohttp
import numpy as np
import xxhash

from tidal.sync.codec import SPARSE_KINDS, changes, decode_chunk
from tidal.sync.config import SyncConfig
from tidal.sync.errors import SyncError, VerificationError
from tidal.sync.manifest import ChunkEntry, WeightManifest
from tidal.sync.tensors import UINT_BY_WIDTH, TensorBits, new_hasher, torch_dtype


# ── Fetching chunks over HTTP ─────────────────────────────────────────────────────────────────────
# HTTP fetching of one form's chunks: several parallel range requests, every chunk checked
# against its xxh3 as soon as its bytes arrive, and what was verified kept across retries and
# upstreams, so a broken connection costs only the chunks not yet received.

NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, asyncio.IncompleteReadError, OSError)
"""What a broken, refused, truncated or stalled connection raises."""

ChunkKey = tuple[int, int, str]
"""(offset, length, xxh3): a verified payload is reusable wherever a manifest names the same."""


def chunk_key(c: ChunkEntry) -> ChunkKey:
    return (c.offset, c.length, c.xxh3)


class ChunkFeed(dict):
    """Verified payloads by chunk key (filled on the event loop) that another thread can wait
    for, so the puller applies each chunk while later ones are still on the wire."""

    def __init__(self):
        super().__init__()
        self._arrived = threading.Condition()
        self._error: BaseException | None = None
        self._released = False

    def __setitem__(self, key: ChunkKey, payload: bytes) -> None:
        with self._arrived:
            super().__setitem__(key, payload)
            self._arrived.notify_all()

    def wait_for(self, key: ChunkKey) -> bytes:
        """The payload once it has arrived; raises the error the feed was closed with if it has
        not arrived by then."""
        with self._arrived:
            self._arrived.wait_for(lambda: key in self or self._error is not None)
            if key in self:
                return dict.__getitem__(self, key)
            raise self._error

    def close(self, error: BaseException) -> None:
        """No more payloads will come, and the result will not be used: wake every waiter for a
        payload that is missing, and ``wait_released`` raises ``error``."""
        with self._arrived:
            self._error = error
            self._arrived.notify_all()

    def release(self) -> None:
        """The result will be used: ``wait_released`` returns."""
        with self._arrived:
            self._released = True
            self._arrived.notify_all()

    def wait_released(self) -> None:
        """Blocks until ``release`` (returns) or ``close`` (raises its error)."""
        with self._arrived:
            self._arrived.wait_for(lambda: self._released or self._error is not None)
            if not self._released:
                raise self._error


def session(cfg: SyncConfig) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(sock_connect=cfg.timeout_s, sock_read=cfg.timeout_s)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=cfg.connections * 2))


async def get_bytes(http: aiohttp.ClientSession, url: str) -> bytes:
    """A whole small answer (index, manifest, blob). A kept-alive connection that the server
    closed meanwhile (it restarted) is retried once on a new one."""
    try:
        return await _get_bytes(http, url)
    except aiohttp.ClientConnectionError:
        return await _get_bytes(http, url)


async def _get_bytes(http: aiohttp.ClientSession, url: str) -> bytes:
    async with http.get(url) as resp:
        if resp.status == 404:
            raise SyncError(f"{url} was not found (404): {(await resp.text())[:200]}")
        if resp.status != 200:
            raise SyncError(f"{url} answered HTTP {resp.status}: {(await resp.text())[:200]}")
        return await resp.read()


async def get_json(http: aiohttp.ClientSession, url: str):
    return json.loads(await get_bytes(http, url))


def range_groups(chunks: list[tuple[int, ChunkEntry]], request_bytes: int) -> list[list[tuple[int, ChunkEntry]]]:
    """Adjacent chunks grouped into requests of up to ``request_bytes`` (a chunk is never split)."""
    groups: list[list[tuple[int, ChunkEntry]]] = []
    for i, c in chunks:
        last = groups[-1] if groups else None
        if (last and last[-1][0] == i - 1
                and c.offset + c.length - last[0][1].offset <= request_bytes):
            last.append((i, c))
        else:
            groups.append([(i, c)])
    return groups


async def fetch_group(http: aiohttp.ClientSession, url: str, group, have: dict[ChunkKey, bytes],
                      received: list[int]) -> None:
    """One range request; stores each chunk that verifies; adds the bytes read to received[0]
    (also those of a response that breaks off or fails a check)."""
    first, last = group[0][1], group[-1][1]
    headers = {"Range": f"bytes={first.offset}-{last.offset + last.length - 1}"}
    async with http.get(url, headers=headers) as resp:
        if resp.status != 206:
            raise SyncError(f"{url} answered HTTP {resp.status} to a range request")
        await read_verified(resp.content, group, have, received, url)


async def read_verified(content: asyncio.StreamReader, chunks, have: dict[ChunkKey, bytes],
                        received: list[int], source: str) -> None:
    """Read ``chunks`` ((index, entry) pairs) back to back from ``content``, keeping each that
    passes its xxh3; raises at the first that breaks off or fails."""
    for i, c in chunks:
        try:
            payload = await content.readexactly(c.length)
        except asyncio.IncompleteReadError as e:
            received[0] += len(e.partial)
            raise
        received[0] += c.length
        if xxhash.xxh3_64_hexdigest(payload) != c.xxh3:
            raise VerificationError(f"chunk {i} from {source} fails its checksum")
        have[chunk_key(c)] = payload


async def fetch_chunks(http: aiohttp.ClientSession, base_url: str, manifest: WeightManifest,
                       have: dict[ChunkKey, bytes], cfg: SyncConfig, received: list[int]) -> None:
    """Fill ``have`` with every chunk of ``manifest`` from ``base_url``; the bytes read (good or
    bad) are added to ``received[0]``."""
    url = f"{base_url}/v/{manifest.version}/{manifest.kind}/data"
    limit = asyncio.Semaphore(cfg.connections)
    last_error = None

    async def one(group) -> None:
        nonlocal last_error
        async with limit:
            try:
                await fetch_group(http, url, group, have, received)
            except (*NETWORK_ERRORS, SyncError) as e:
                last_error = e

    for attempt in range(cfg.retries + 1):
        missing = [(i, c) for i, c in enumerate(manifest.chunks) if chunk_key(c) not in have]
        if not missing:
            return
        if attempt:
            await asyncio.sleep(min(0.05 * 2 ** attempt, 1.0))
        # Spread the bytes over every connection (each has its own TCP slow start on a long link).
        spread = -(-sum(c.length for _, c in missing) // cfg.connections)
        await asyncio.gather(*(one(g) for g in range_groups(missing, min(cfg.request_bytes, max(spread, 1)))))
    missing = sum(chunk_key(c) not in have for c in manifest.chunks)
    if not missing:
        return
    raise SyncError(f"{missing} chunk(s) of version {manifest.version} ({manifest.kind}) could not be "
                    f"fetched from {base_url} after {cfg.retries + 1} tries; last error: "
                    f"{type(last_error).__name__}: {last_error}")


# ── The /pull answer ──────────────────────────────────────────────────────────────────────────────
# One HTTP answer that carries a whole pull (``GET /pull``): no index, manifest and data round
# trips one after the other, so a small update costs one request (or none, for a subscriber whose
# long-poll was already waiting when the version appeared).
#
#     u32 little-endian header length | header JSON {"version": V, "forms": [{"version", "kind",
#     "manifest_bytes", "data_bytes", "inline"}]} | per form: manifest JSON, then (if inline) its
#     data file (the chunk payloads back to back, as the manifest lists them)
#
# Chunks are checked against their xxh3 as they arrive, exactly as range fetches are; whatever the
# answer did not carry (a big form, a stream that broke off or failed a check) the puller fetches
# by ranges afterwards.
#
# The origin writes it (``bundle_parts``, tidal.sync.origin); ``read_bundle`` reads it.

HEADER_LENGTH = struct.Struct("<I")


async def read_bundle(content: asyncio.StreamReader, received: list[int], timeline: dict | None = None,
                      on_first_form: Callable[[tuple, WeightManifest, ChunkFeed], None] | None = None):
    """(target version, [(form step, manifest or None, ChunkFeed {chunk key: payload})]) from a
    /pull answer. Stops at the first broken or failing chunk; what was read and verified is kept.
    ``on_first_form(step, manifest, feed)`` is called when the first form's manifest has arrived
    and its data is about to (the puller starts applying it chunk by chunk)."""
    (n,) = HEADER_LENGTH.unpack(await content.readexactly(HEADER_LENGTH.size))
    if timeline is not None:
        timeline.setdefault("first_byte", time.time())
    header = json.loads(await content.readexactly(n))
    out = []
    broken = False
    for f in header["forms"]:
        step, have = (f["version"], f["kind"]), ChunkFeed()
        out.append((step, None, have))
        if broken:
            continue
        try:
            manifest = WeightManifest.from_json(await content.readexactly(f["manifest_bytes"]))
            out[-1] = (step, manifest, have)
            if f["inline"]:
                if on_first_form is not None and len(out) == 1:
                    on_first_form(step, manifest, have)
                await read_verified(content, enumerate(manifest.chunks), have, received, "a /pull answer")
        except (*NETWORK_ERRORS, VerificationError, ValueError):
            broken = True
    if timeline is not None:
        timeline["last_byte"] = time.time()
    return header["version"], out


# ── Applying a form ───────────────────────────────────────────────────────────────────────────────
# Turn a base version's tensors plus one form's chunk payloads into the next version's tensors,
# decoding chunks in parallel and verifying every tensor's digest (the hash its manifest names,
# BLAKE3 for new versions) before anyone sees the result.
#
# A delta is applied in place on the base's arrays (a sparse chunk touches only its changed
# elements: no copy of the base, no page faults on 200 MB of fresh memory). Each chunk keeps what
# changed, so a chunk that fails to decode or a result that fails its hashes is undone and the
# base is left exactly as it was (the last good version). A sparse chunk keeps only its positions
# and differences: undoing it subtracts them again (wrapping integer arithmetic is exact), so
# applying it costs no gather of the old values.
#
# Hashing skips what cannot have changed: a tensor that no chunk modified still holds the base's
# bytes, whose digest was verified when the base was applied, so its digest is the base's; the
# check ``digest == manifest entry`` still runs for every tensor (docs/sync.md, "Verification").

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
    by as many more as its chunks are applied (StreamingDigests, below), so hashing overlaps decoding.

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


# ── Streaming digests ─────────────────────────────────────────────────────────────────────────────
# Each tensor's digest (the hash its manifest names), taken while its form is still applied.
#
# Which hash: a manifest names it (``WeightManifest.hash``). New versions use BLAKE3: a
# cryptographic hash (256-bit, a Merkle tree of 1 KiB leaves inside) that runs ~3x faster per core
# than SHA-256 on CPUs with SHA-NI (docs/sync.md) and releases the GIL. Manifests written before
# it carry no ``hash`` field and mean SHA-256, which is still verified. Re-hashing the applied
# bytes of a small update is most of its delivery time (≈214 MB for a 1.8 MB delta of workload
# a), so the cheaper hash is what makes delivery fast while every tensor's final bytes stay
# checked.
#
# Hashing must not wait for the last chunk: as soon as a tensor's leading chunks are applied their
# bytes go into that tensor's running hasher in a thread pool (hashlib and blake3 release the GIL),
# so hashing overlaps decoding and the network, on every core.
#
# What is hashed is exactly what ``TensorBits.digest`` hashes (chunks tile a tensor in element
# order), and only tensors that need it: a tensor of an in-place delta that no chunk modified keeps
# its ``known`` digest (docs/sync.md, "Verification"); once any chunk modifies it, it is hashed from
# its first chunk.

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
